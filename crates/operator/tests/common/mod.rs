//! Helpers shared by the operator's integration tests and the generator's
//! (`crates/gen/tests` include this directory with `#[path]`).
#![allow(dead_code)] // each test binary uses a different subset

pub mod bad_inputs;
pub mod cluster;
pub mod foreign_crds;
pub mod process;

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;

/// How long any one expected outcome may take before the test fails: generous, since the
/// real servers converge slowly on a loaded 2-core machine (only a failing test waits it out).
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Polls `probe` until it returns `Some`, failing the test after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_within(what, DEADLINE, probe).await
}

/// Polls `probe` every 10 ms until it returns `Some`, failing the test after `timeout`.
pub async fn wait_for_within<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
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
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A minimal CRD for the Prometheus Operator's ServiceMonitor (the in-memory API server
/// does not serve it), so the exporter's ServiceMonitor path runs.
pub fn service_monitor_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                      "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
        }
    }))
    .expect("ServiceMonitor CRD")
}

/// Installs the Memcached CRD (and, if asked, the ServiceMonitor CRD).
pub async fn install_crds(client: &Client, with_service_monitor: bool) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("Memcached CRD installs");
    if with_service_monitor {
        crds.create(&PostParams::default(), &service_monitor_crd())
            .await
            .expect("ServiceMonitor CRD installs");
    }
}
