//! The workload simulator: Deployments → ReplicaSets → Pods.

mod common;
use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

fn deploy(name: &str, replicas: i32, image: &str) -> Deployment {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": image}]}}
        }
    }))
}

async fn ready_pods(pods: &Api<Pod>, sel: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(sel))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}

async fn converged(
    api: &Api<Deployment>,
    pods: &Api<Pod>,
    name: &str,
    n: i32,
    image: &str,
) -> Option<()> {
    let d = api.get(name).await.ok()?;
    let st = d.status?;
    let all = pods
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .ok()?
        .items;
    let ok = st.observed_generation == d.metadata.generation
        && st.replicas == Some(n)
        && st.updated_replicas == Some(n)
        && st.available_replicas.unwrap_or(0) == n
        && all.len() == n as usize
        && all
            .iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(image))
        && ready_pods(pods, &format!("app={name}")).await.len() == n as usize;
    ok.then_some(())
}

#[tokio::test]
async fn deployment_scale_and_rollout() {
    let s = apisim::ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .build();
    let c = s.client();
    let api: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let rss: Api<ReplicaSet> = Api::namespaced(c.clone(), "default");
    api.create(&PostParams::default(), &deploy("web", 3, "img:1"))
        .await
        .unwrap();
    eventually(10, "3 ready pods", || {
        converged(&api, &pods, "web", 3, "img:1")
    })
    .await;
    let p = &pods.list(&ListParams::default()).await.unwrap().items[0];
    let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert!(ip.starts_with("10.244."));
    let rs = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs.len(), 1);
    let rs_name = rs[0].metadata.name.clone().unwrap();
    let hash = rs[0].metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    assert_eq!(rs_name, format!("web-{hash}"));
    assert!(
        p.metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with(&format!("{rs_name}-"))
    );
    let d = api.get("web").await.unwrap();
    let conds = d.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    );
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Progressing"
                && c.reason.as_deref() == Some("NewReplicaSetAvailable"))
    );

    // scale to 5 and to 0
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    eventually(10, "5 ready pods", || {
        converged(&api, &pods, "web", 5, "img:1")
    })
    .await;
    api.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    eventually(10, "0 pods", || converged(&api, &pods, "web", 0, "img:1")).await;
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    eventually(10, "3 again", || converged(&api, &pods, "web", 3, "img:1")).await;

    // a pod deleted by hand is recreated
    let victim = pods.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    eventually(10, "pod replaced", || async {
        let names: Vec<String> = ready_pods(&pods, "app=web")
            .await
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        (names.len() == 3 && !names.contains(&victim)).then_some(())
    })
    .await;

    // template change rolls to a new ReplicaSet, never below 3 available (maxUnavailable 0 with 3 replicas)
    let p = Patch::Strategic(
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img:2"}]}}}}),
    );
    api.patch("web", &PatchParams::default(), &p).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "rollout timed out");
        let ready = ready_pods(&pods, "app=web").await.len();
        assert!(
            ready >= 3,
            "availability dropped to {ready} during the rollout"
        );
        if converged(&api, &pods, "web", 3, "img:2").await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rs = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs.len(), 2);
    assert!(
        rs.iter()
            .any(|r| r.spec.as_ref().unwrap().replicas == Some(0))
    );

    // deleting the deployment cascades
    api.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(10, "cascade", || async {
        let n = pods.list(&ListParams::default()).await.unwrap().items.len()
            + rss.list(&ListParams::default()).await.unwrap().items.len();
        (n == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_deployments_converge() {
    let s = apisim::ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(20))
        .build();
    let c = s.client();
    let api: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let t = std::time::Instant::now();
    for i in 0..50 {
        api.create(
            &PostParams::default(),
            &deploy(&format!("d{i}"), 4, "img:1"),
        )
        .await
        .unwrap();
    }
    eventually(20, "200 ready pods", || async {
        let ds = api.list(&ListParams::default()).await.unwrap().items;
        let ready: i32 = ds
            .iter()
            .filter_map(|d| d.status.as_ref()?.ready_replicas)
            .sum();
        (ready == 200).then_some(())
    })
    .await;
    eprintln!("50 deployments x 4 pods ready in {:?}", t.elapsed());
    assert_eq!(s.list_objects("v1", "pods", Some("default")).len(), 200);
}

#[tokio::test]
async fn recreate_strategy_and_bare_pods() {
    let s = apisim::ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(30))
        .build();
    let c = s.client();
    let api: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mut d = deploy("rc", 2, "img:1");
    d.spec.as_mut().unwrap().strategy = Some(from_json(json!({"type": "Recreate"})));
    api.create(&PostParams::default(), &d).await.unwrap();
    eventually(10, "2 ready", || converged(&api, &pods, "rc", 2, "img:1")).await;
    let p = Patch::Merge(
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img:2"}]}}}}),
    );
    api.patch("rc", &PatchParams::default(), &p).await.unwrap();
    // Recreate: never old and new pods at the same time
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "rollout timed out");
        let all = pods
            .list(&ListParams::default().labels("app=rc"))
            .await
            .unwrap()
            .items;
        let images: std::collections::HashSet<String> = all
            .iter()
            .filter_map(|p| p.spec.as_ref()?.containers[0].image.clone())
            .collect();
        assert!(images.len() <= 1, "old and new pods together: {images:?}");
        if converged(&api, &pods, "rc", 2, "img:2").await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // a bare pod (no owner) becomes Running too, and is not touched otherwise
    let bare: Pod = from_json(
        json!({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    );
    pods.create(&PostParams::default(), &bare).await.unwrap();
    eventually(5, "bare pod running", || async {
        let p = pods.get("bare").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn pod_disruption_budget_status() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let s = apisim::ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(20))
        .build();
    let c = s.client();
    let api: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), "default");
    let node = s
        .get_object("v1", "nodes", None, "apisim-node")
        .expect("simulated node");
    assert_eq!(node["status"]["conditions"][0]["type"], "Ready");
    api.create(&PostParams::default(), &deploy("p", 3, "img:1"))
        .await
        .unwrap();
    let pdb: PodDisruptionBudget = from_json(
        json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "p"}}}}),
    );
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually(10, "pdb status", || async {
        let st = pdbs.get("p").await.ok()?.status?;
        (st.current_healthy == 3
            && st.expected_pods == 3
            && st.desired_healthy == 2
            && st.disruptions_allowed == 1)
            .then_some(())
    })
    .await;
}
