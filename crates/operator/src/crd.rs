//! The CustomResourceDefinition, generated from the Rust types, and the check that it is
//! installed before the controller starts.

use kube::api::ListParams;
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;

/// The CRD as YAML, exactly what `memcached-operator crd` prints.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&Memcached::crd())
}

/// Why the operator cannot start against a cluster, in one line a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(
        "the Memcached CRD (memcacheds.memcached.cache.example.com) is not installed in this cluster: install it with `memcached-operator crd | kubectl apply --server-side -f -` (or `make install`)"
    )]
    CrdMissing,
    #[error("cannot reach the Kubernetes API server: {0}")]
    Unreachable(String),
    #[error("the Kubernetes API server refused to list Memcacheds: {0}")]
    Refused(String),
}

/// Checks that the API server answers and serves the Memcached kind.
pub async fn check_installed(client: &Client, namespace: Option<&str>) -> Result<(), StartupError> {
    let api: Api<Memcached> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(StartupError::CrdMissing),
        Err(kube::Error::Api(status)) => Err(StartupError::Refused(format!(
            "{} ({})",
            status.message, status.code
        ))),
        Err(other) => Err(StartupError::Unreachable(other.to_string())),
    }
}
