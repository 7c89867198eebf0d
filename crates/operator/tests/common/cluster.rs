//! One scenario, every server: the in-memory API server (with its workload simulator) and
//! the real control plane at the oldest and newest pinned Kubernetes versions
//! (`crates/envtest`: kube-apiserver, kube-controller-manager, kube-scheduler, kwok nodes).
//!
//! On a real server the tests of one binary share its control plane, so each test works in a
//! namespace of its own and its controller watches only that namespace.

use std::time::Duration;

use apisim::ApiServer;
use envtest::{ControlPlane, Kube};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;

/// Which API server a scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// `crates/apisim`, in-process.
    Sim,
    /// The real control plane at the oldest pinned Kubernetes version (our floor).
    Oldest,
    /// The real control plane at the newest pinned Kubernetes version.
    Newest,
}

impl Server {
    pub fn kube(self) -> Option<Kube> {
        match self {
            Server::Sim => None,
            Server::Oldest => Some(Kube::Oldest),
            Server::Newest => Some(Kube::Newest),
        }
    }
}

/// A client and the namespace a scenario works in.
pub struct Cluster {
    pub client: Client,
    pub ns: String,
    pub sim: Option<ApiServer>,
    pub real: Option<&'static ControlPlane>,
}

impl Cluster {
    /// The in-memory server (built as `sim` says, workload simulator on) or a namespace
    /// named after `test` on the shared real control plane; the CRDs installed either way.
    pub async fn start(
        server: Server,
        test: &str,
        sim: impl FnOnce(apisim::ApiServerBuilder) -> apisim::ApiServerBuilder,
        with_service_monitor: bool,
    ) -> Cluster {
        let cluster = match server.kube() {
            None => {
                let s = sim(ApiServer::builder().workload_simulator(true)).build();
                Cluster {
                    client: s.client(),
                    ns: "default".to_string(),
                    sim: Some(s),
                    real: None,
                }
            }
            Some(kube) => {
                let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
                let ns = cp
                    .namespace(&test.replace('_', "-").chars().take(40).collect::<String>())
                    .await
                    .unwrap_or_else(|e| panic!("namespace: {e}"));
                Cluster {
                    client: cp.client().await.unwrap_or_else(|e| panic!("{e}")),
                    ns,
                    sim: None,
                    real: Some(cp),
                }
            }
        };
        apply_crd(&cluster.client, &Memcached::crd()).await;
        if with_service_monitor {
            apply_crd(&cluster.client, &super::service_monitor_crd()).await;
        }
        cluster
    }

    pub fn is_real(&self) -> bool {
        self.real.is_some()
    }

    /// The namespace to scope a controller to (all namespaces on the in-memory server).
    pub fn watch_namespace(&self) -> Option<String> {
        self.real.map(|_| self.ns.clone())
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// A one-hour token of the ServiceAccount `sa` in `ns`, from the TokenRequest API (what a
/// pod running as that account mounts).
pub async fn service_account_token(client: &Client, ns: &str, sa: &str) -> String {
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(
            sa,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                },
                ..TokenRequest::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"))
        .status
        .map(|s| s.token)
        .unwrap_or_else(|| panic!("TokenRequest for {ns}/{sa}: no status"))
}

/// Installs (or updates) a CRD by server-side apply, as `make install` does, and waits
/// until the server serves it; safe to run from tests at once.
pub async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply("memcached-operator-tests").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("CRD {name} installs: {e}"));
    super::wait_for_within(
        &format!("CRD {name} established"),
        Duration::from_secs(30),
        || async {
            let c = crds.get(&name).await.ok()?;
            c.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// Runs one scenario against every server: `NAME::apisim`, `NAME::kube_oldest`,
/// `NAME::kube_newest` (filter with `cargo test kube_` for the real ones).
#[macro_export]
macro_rules! on_every_server {
    ($(#[$meta:meta])* async fn $name:ident($server:ident: Server) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn scenario($server: Server) $body
            #[tokio::test]
            async fn apisim() {
                scenario(Server::Sim).await
            }
            #[tokio::test]
            async fn kube_oldest() {
                scenario(Server::Oldest).await
            }
            #[tokio::test]
            async fn kube_newest() {
                scenario(Server::Newest).await
            }
        }
    };
}

/// Runs one scenario on the real control plane only, at both pinned versions:
/// `NAME::kube_oldest` and `NAME::kube_newest` (for what the in-memory server cannot
/// show: RBAC, admission webhooks called by the API server, the server's own validation).
#[macro_export]
macro_rules! on_both_versions {
    ($(#[$meta:meta])* async fn $name:ident($kube:ident: Kube) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn scenario($kube: Kube) $body
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kube_oldest() {
                scenario(Kube::Oldest).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kube_newest() {
                scenario(Kube::Newest).await
            }
        }
    };
}
