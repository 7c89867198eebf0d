//! Helpers shared by the operator's integration tests and the generator's
//! (`crates/gen/tests` include this directory with `#[path]`).
#![allow(dead_code)] // each test binary uses a different subset

pub mod bad_inputs;
pub mod cluster;
pub mod foreign_crds;
pub mod process;
pub mod real_node;
pub mod tls;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
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

/// Waits until `events` lists an event of `reason`, and returns the first one listed.
pub async fn event_with_reason(events: &Api<Event>, reason: &str) -> Event {
    wait_for(&format!("a {reason} event"), || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

/// Polls `probe` every 10 ms until it returns `Some`, failing the test after `timeout`.
pub async fn wait_for_within<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_every(what, timeout, Duration::from_millis(10), probe).await
}

/// Polls `probe` every `interval` until it returns `Some`, failing the test after `timeout`.
pub async fn wait_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> T
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
        tokio::time::sleep(interval).await;
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

/// A value of `len` bytes that names item `i` and differs from item to item, so that a value
/// read back can be told from another's.
pub fn big_value(i: usize, len: usize) -> Vec<u8> {
    let mut value = format!("item {i:08} ").into_bytes();
    value.extend((value.len()..len).map(|j| b'a' + ((i * 31 + j * 7) % 26) as u8));
    value
}

/// What the kubelet counts as a volume's use (`DiskUsage` in pkg/volume/util/fs): the
/// 512-byte blocks of every entry under `dir`, `dir` itself included.
pub fn volume_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = std::fs::symlink_metadata(dir).map_or(0, |m| m.blocks() * 512);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        total += match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => volume_bytes(&path),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        };
    }
    total
}

/// Standard base64 (RFC 4648, padded), as the AdmissionReview's `patch` is encoded.
pub fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(value(c)) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}
