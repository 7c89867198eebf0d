//! End to end against a real cluster, run only when asked:
//!
//! ```sh
//! E2E_KUBECONFIG=$HOME/.kube/config cargo test -p memcached-operator --test e2e -- --ignored --nocapture
//! ```
//!
//! Installs (or updates) the CRD, starts the operator binary against the cluster, applies the
//! seed sample in a fresh namespace and checks the Deployment, Service, ownerReferences,
//! conditions and drift repair; when the cluster runs pods (set `E2E_EXPECT_PODS=false` on a
//! cluster without nodes), also the pod names in `status.nodes`. The namespace is deleted at
//! the end. The tests are ignored unless asked for; asked for without `E2E_KUBECONFIG`, they
//! fail saying so.

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::samples::SEED_SAMPLE;
use serde_json::json;

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn client_from(path: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("E2E_KUBECONFIG is a readable kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig has a usable context");
    Client::try_from(config).expect("client from kubeconfig")
}

async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
#[ignore = "needs a real cluster: set E2E_KUBECONFIG and pass --ignored"]
async fn seed_sample_on_a_real_cluster() {
    let path = std::env::var("E2E_KUBECONFIG")
        .expect("E2E_KUBECONFIG names the kubeconfig of the disposable cluster to test");
    let expect_pods = std::env::var("E2E_EXPECT_PODS")
        .map(|v| v != "false")
        .unwrap_or(true);
    let client = client_from(&path).await;

    // Install the CRD as `make install` does.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "memcacheds.memcached.cache.example.com",
        &PatchParams::apply("memcached-operator-e2e").force(),
        &Patch::Apply(Memcached::crd()),
    )
    .await
    .expect("CRD applies");
    wait_for("CRD established", Duration::from_secs(120), || async {
        let crd = crds
            .get("memcacheds.memcached.cache.example.com")
            .await
            .ok()?;
        crd.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;

    let ns = format!("memcached-e2e-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.clone());
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");

    let _operator = Operator(
        Command::new(env!("CARGO_BIN_EXE_memcached-operator"))
            .args(["run", "--namespace", &ns])
            .env("KUBECONFIG", &path)
            // Outside the cluster the API server cannot call our webhooks (as `make run`).
            .env("ENABLE_WEBHOOKS", "false")
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("operator binary starts"),
    );

    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sample: Memcached = serde_yaml::from_str(SEED_SAMPLE).expect("sample parses");
    memcacheds
        .patch(
            "memcached-sample",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&sample),
        )
        .await
        .expect("sample applies");
    let mc = wait_for("status written", Duration::from_secs(120), || async {
        let mc = memcacheds.get("memcached-sample").await.ok()?;
        (mc.condition(condition::DEGRADED)?.status == "False").then_some(mc)
    })
    .await;
    let uid = mc.uid().expect("uid");

    let d = deployments
        .get("memcached-sample")
        .await
        .expect("Deployment created");
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(d.owner_references()[0].uid, uid);
    let s = services
        .get("memcached-sample")
        .await
        .expect("Service created");
    assert_eq!(
        s.spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .expect("ports")[0]
            .port,
        11211
    );
    assert_eq!(s.owner_references()[0].uid, uid);

    deployments
        .patch(
            "memcached-sample",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("manual edit");
    wait_for("drift repaired", Duration::from_secs(120), || async {
        let d = deployments.get("memcached-sample").await.ok()?;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;

    if expect_pods {
        let mc = wait_for(
            "3 ready pods named in status.nodes",
            Duration::from_secs(300),
            || async {
                let mc = memcacheds.get("memcached-sample").await.ok()?;
                let available = mc.condition(condition::AVAILABLE)?.status == "True";
                (available && mc.status.as_ref()?.nodes.len() == 3).then_some(mc)
            },
        )
        .await;
        let lp = ListParams::default().labels("app.kubernetes.io/instance=memcached-sample");
        let mut names: Vec<String> = pods
            .list(&lp)
            .await
            .expect("pods")
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        names.sort();
        assert_eq!(mc.status.expect("status").nodes, names);
    }

    memcacheds
        .delete("memcached-sample", &DeleteParams::foreground())
        .await
        .expect("delete sample");
    wait_for(
        "owned objects garbage-collected",
        Duration::from_secs(120),
        || async {
            let d = deployments.get_opt("memcached-sample").await.ok()?;
            let s = services.get_opt("memcached-sample").await.ok()?;
            (d.is_none() && s.is_none()).then_some(())
        },
    )
    .await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
