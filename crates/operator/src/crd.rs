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
    #[error(
        "Kubernetes {found} is older than this operator supports (v{}.{} and newer): its API server would refuse the objects the operator writes; upgrade the cluster, or pass --allow-unsupported-kubernetes to try anyway",
        OLDEST_SUPPORTED_KUBERNETES.0,
        OLDEST_SUPPORTED_KUBERNETES.1
    )]
    UnsupportedKubernetes { found: String },
}

/// The oldest Kubernetes (major, minor) the operator supports: the version of the API types
/// it is built with (k8s-openapi's feature) and the oldest version its tests run on
/// (`hack/controlplane`); tests hold the three together.
pub const OLDEST_SUPPORTED_KUBERNETES: (u32, u32) = (1, 33);

/// The API server's version, as `/version` reports it (`major`, `minor` may carry a
/// provider's suffix, as in `"33+"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
    pub git_version: String,
}

impl ServerVersion {
    pub fn parse(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<ServerVersion> {
        let number = |s: &str| -> Option<u32> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        Some(ServerVersion {
            major: number(&info.major)?,
            minor: number(&info.minor)?,
            git_version: info.git_version.clone(),
        })
    }

    pub fn is_supported(&self) -> bool {
        (self.major, self.minor) >= OLDEST_SUPPORTED_KUBERNETES
    }
}

/// Asks the API server its version (`/version`) and refuses one older than
/// [`OLDEST_SUPPORTED_KUBERNETES`], once, instead of failing on every object later; a
/// version that cannot be read is logged and let through.
pub async fn check_version(client: &Client, allow_unsupported: bool) -> Result<(), StartupError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| StartupError::Unreachable(e.to_string()))?;
    match ServerVersion::parse(&info) {
        Some(v) if v.is_supported() => {
            tracing::info!(version = %v.git_version, "Kubernetes API server");
            Ok(())
        }
        Some(v) if allow_unsupported => {
            tracing::warn!(
                version = %v.git_version,
                oldest_supported = %format!("v{}.{}", OLDEST_SUPPORTED_KUBERNETES.0, OLDEST_SUPPORTED_KUBERNETES.1),
                "Kubernetes is older than this operator supports; going on as --allow-unsupported-kubernetes asks"
            );
            Ok(())
        }
        Some(v) => Err(StartupError::UnsupportedKubernetes {
            found: if v.git_version.is_empty() {
                format!("v{}.{}", v.major, v.minor)
            } else {
                v.git_version
            },
        }),
        None => {
            tracing::warn!(major = %info.major, minor = %info.minor, "cannot read the API server's version; assuming it is supported");
            Ok(())
        }
    }
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
