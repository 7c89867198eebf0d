//! Controller-runtime behaviours asserted, not just configured: namespace scoping, what the
//! cache holds, bounded concurrency with one reconcile per object at a time, and predicates
//! that keep status and metadata churn from causing reconciles.

use std::sync::Arc;
use std::time::Duration;

use apisim::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, Caches, ControllerConfig, ReconcileCounters};
use serde_json::json;

mod common;
use common::wait_for;

async fn cluster(namespaces: &[&str]) -> (ApiServer, Client) {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(20))
        .build();
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("CRD");
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.to_string());
        nss.create(&PostParams::default(), &n)
            .await
            .expect("namespace");
    }
    (server, client)
}

async fn apply(client: &Client, ns: &str, name: &str, size: i32) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": {"size": size}
    });
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&mc),
    )
    .await
    .expect("apply");
}

async fn converged(client: &Client, ns: &str, name: &str, size: usize) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("{ns}/{name} converged"), || async {
        let mc = api.get_opt(name).await.ok().flatten()?;
        let available = mc.condition(condition::AVAILABLE)?.status == "True";
        let status = mc.status?;
        (available
            && status.nodes.len() == size
            && status.observed_generation == mc.metadata.generation)
            .then_some(())
    })
    .await;
}

fn spawn(client: &Client, config: ControllerConfig) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(client.clone(), config, async {
        let _ = rx.await;
    }));
    tx
}

#[tokio::test]
async fn a_namespaced_operator_leaves_other_namespaces_alone() {
    let (_server, client) = cluster(&["team-a", "team-b"]).await;
    let _stop = spawn(
        &client,
        ControllerConfig {
            namespace: Some("team-a".into()),
            ..ControllerConfig::default()
        },
    );
    apply(&client, "team-b", "theirs", 1).await;
    apply(&client, "team-a", "ours", 2).await;
    converged(&client, "team-a", "ours", 2).await;
    // "ours" converged after "theirs" was created; give the controller one more beat.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let theirs: Api<Memcached> = Api::namespaced(client.clone(), "team-b");
    assert!(
        theirs.get("theirs").await.expect("get").status.is_none(),
        "no status written outside the scope"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "team-b");
    assert!(
        deployments.get_opt("theirs").await.expect("get").is_none(),
        "no Deployment outside the scope"
    );
}

#[tokio::test]
async fn the_cache_holds_only_our_objects_and_no_pod_specs() {
    let (_server, client) = cluster(&[]).await;
    let foreign: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "someone-elses", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))
    .expect("deployment");
    Api::<Deployment>::default_namespaced(client.clone())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create");
    let _stop = spawn(&client, ControllerConfig::default());
    apply(&client, "default", "cached", 2).await;
    converged(&client, "default", "cached", 2).await;

    let caches = Caches::start(&client, None);
    caches.wait_synced().await;
    assert_eq!(
        caches.deployments.names(),
        ["cached"],
        "unlabelled Deployments are not cached"
    );
    let mut services = caches.services.names();
    services.sort();
    assert_eq!(services, ["cached", "cached-headless"]);
    let pods = caches.pods.store().state();
    assert_eq!(pods.len(), 2, "only the memcached pods");
    assert!(
        pods.iter()
            .all(|p| p.managed_fields().is_empty() && p.annotations().is_empty())
    );
    assert!(pods.iter().all(|p| p.name_any().starts_with("cached-")));
}

#[tokio::test]
async fn concurrency_is_bounded_and_one_object_never_reconciles_twice_at_once() {
    let (server, client) = cluster(&[]).await;
    // Slow API calls keep reconciles in flight long enough to overlap.
    server.set_latency(Duration::from_millis(15));
    let counters = Arc::new(ReconcileCounters::default());
    let _stop = spawn(
        &client,
        ControllerConfig {
            concurrency: 3,
            counters: counters.clone(),
            ..ControllerConfig::default()
        },
    );
    for i in 0..12 {
        apply(&client, "default", &format!("c{i}"), 1).await;
    }
    // Hammer one object with spec changes while the others are being reconciled.
    for size in [2, 3, 2, 3, 2] {
        apply(&client, "default", "c0", size).await;
    }
    for i in 1..12 {
        converged(&client, "default", &format!("c{i}"), 1).await;
    }
    converged(&client, "default", "c0", 2).await;
    assert!(
        counters.max_in_flight() <= 3,
        "max in flight {}",
        counters.max_in_flight()
    );
    assert!(
        counters.max_in_flight() >= 2,
        "reconciles did overlap: {}",
        counters.max_in_flight()
    );
    assert_eq!(counters.same_object_overlaps(), 0);
}

/// A controller counting its reconciles, with one Memcached converged and quiet.
async fn settled(
    name: &str,
    size: usize,
) -> (
    ApiServer,
    Client,
    Arc<ReconcileCounters>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (server, client) = cluster(&[]).await;
    let counters = Arc::new(ReconcileCounters::default());
    let stop = spawn(
        &client,
        ControllerConfig {
            counters: counters.clone(),
            ..ControllerConfig::default()
        },
    );
    apply(&client, "default", name, size as i32).await;
    converged(&client, "default", name, size).await;
    // Let the last status write's watch event and anything it triggers settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (server, client, counters, stop)
}

#[tokio::test]
async fn status_and_metadata_churn_do_not_trigger_reconciles() {
    let (_server, client, counters, _stop) = settled("calm", 1).await;
    let before = counters.reconciles();

    let api: Api<Memcached> = Api::default_namespaced(client.clone());
    api.patch(
        "calm",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"team": "cache"}, "labels": {"tier": "gold"}}}),
        ),
    )
    .await
    .expect("metadata edit");
    api.patch_status(
        "calm",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodes": ["x"]}})),
    )
    .await
    .ok();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        counters.reconciles(),
        before,
        "metadata and status edits of the Memcached are filtered"
    );

    apply(&client, "default", "calm", 2).await;
    converged(&client, "default", "calm", 2).await;
    assert!(counters.reconciles() > before, "a spec change reconciles");
}

#[tokio::test]
async fn status_churn_of_owned_objects_that_cannot_change_the_outcome_is_filtered() {
    let (_server, client, counters, _stop) = settled("churned", 2).await;
    let before = counters.reconciles();

    use k8s_openapi::api::core::v1::{Pod, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let services: Api<Service> = Api::default_namespaced(client.clone());
    services
        .patch_status(
            "churned",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await
        .expect("Service status");
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    pdbs.patch_status(
        "churned",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"disruptionsAllowed": 0, "currentHealthy": 1,
            "desiredHealthy": 1, "expectedPods": 2}}),
        ),
    )
    .await
    .expect("PDB status");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=churned"))
        .await
        .expect("pods")
        .items
        .remove(0);
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"containerStatuses": [{"name": "memcached", "image": "x",
            "imageID": "", "ready": true, "restartCount": 3, "state": {"running": {}}}]}}),
        ),
    )
    .await
    .expect("pod status");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        counters.reconciles(),
        before,
        "status the reconciler never reads does not trigger it"
    );

    // A change it does read: a pod deleted (and replaced) changes status.nodes.
    pods.delete(&pod.name_any(), &Default::default())
        .await
        .expect("delete pod");
    wait_for("a reconcile for the deleted pod", || async {
        (counters.reconciles() > before).then_some(())
    })
    .await;
}
