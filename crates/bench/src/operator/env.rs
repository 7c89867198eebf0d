//! Where a phase of `bench operator` runs ([`Env`]): a fresh in-memory API server served
//! over HTTP, or a fresh namespace of a real cluster; and the API requests counted there
//! (the in-memory server's counts, or the real server's audit log).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;

use super::BenchArgs;
use super::report::Requests;
use crate::measure::secs;
use crate::{Result, create_namespace, log};

/// Where a phase runs: a fresh in-memory server, or a fresh namespace of a real cluster.
pub(super) struct Env {
    pub(super) client: Client,
    pub(super) namespace: String,
    pub(super) kubeconfig: PathBuf,
    /// The in-memory server (None on a real cluster).
    pub(super) server: Option<apisim::ApiServer>,
    pub(super) _handle: Option<apisim::ServeHandle>,
    pub(super) cluster: bool,
    /// The real API server's audit log, when given.
    pub(super) audit: Option<PathBuf>,
}

/// Where request counting started: the in-memory server resets its counts; an audit log is
/// read on from the byte it had reached.
pub(super) struct Mark(u64);

/// The operator's requests in an audit log after byte `from`, by verb (dry runs are not
/// writes).
pub(super) fn audit_requests(path: &Path, from: u64) -> Result<Requests> {
    let (by_verb, writes) =
        crate::measure::audit_requests(path, from, memcached_operator::cmd::USER_AGENT)?;
    Ok(Requests { by_verb, writes })
}

impl Env {
    pub(super) async fn new(args: &BenchArgs, dir: &Path, tag: &str) -> Result<Env> {
        if let Some(path) = &args.kubeconfig {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            let client = Client::try_from(config)?;
            memcached_operator::crd::check_installed(&client, None).await?;
            let namespace = format!(
                "mc-bench-{tag}-{}",
                jiff::Timestamp::now().as_second() % 1_000_000
            );
            create_namespace(&client, &namespace).await?;
            return Ok(Env {
                client,
                namespace,
                kubeconfig: path.clone(),
                server: None,
                _handle: None,
                cluster: true,
                audit: args.audit_log.clone(),
            });
        }
        let server = apisim::ApiServer::builder()
            .workload_simulator(true)
            .pod_ready_delay(args.pod_ready_delay)
            .build();
        let handle = server.serve().await?;
        let kubeconfig = dir.join(format!("kubeconfig-{tag}"));
        handle.write_kubeconfig(&kubeconfig)?;
        let client = Client::try_from(kube::Config::new(handle.url().parse()?))?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &Memcached::crd())
            .await?;
        let namespace = "bench".to_string();
        create_namespace(&client, &namespace).await?;
        Ok(Env {
            client,
            namespace,
            kubeconfig,
            server: Some(server),
            _handle: Some(handle),
            cluster: false,
            audit: None,
        })
    }

    pub(super) fn memcacheds(&self) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Starts counting requests from here.
    pub(super) fn mark(&self) -> Mark {
        if let Some(server) = &self.server {
            server.reset_request_counts();
        }
        let offset = self
            .audit
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .unwrap_or(0);
        Mark(offset)
    }

    /// Requests since `mark`: every client's on the in-memory server, the operator's on a
    /// real one with an audit log, unknown otherwise.
    pub(super) fn requests_since(&self, mark: &Mark) -> Option<Requests> {
        if let Some(server) = &self.server {
            return Some(Requests::of(&server.request_counts()));
        }
        let path = self.audit.as_ref()?;
        match audit_requests(path, mark.0) {
            Ok(r) => Some(r),
            Err(e) => {
                log(format!("cannot read the audit log {}: {e}", path.display()));
                None
            }
        }
    }

    pub(super) async fn cleanup(&self) {
        if self.cluster {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            if let Err(e) = namespaces
                .delete(&self.namespace, &DeleteParams::background())
                .await
            {
                log(format!(
                    "could not delete namespace {}: {e}",
                    self.namespace
                ));
                return;
            }
            // The next phase runs on the same server: wait until the garbage collector has
            // removed this one's objects (thousands of pods at large N), so that it does not
            // compete with what is measured next.
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(600) {
                match namespaces.get_opt(&self.namespace).await {
                    Ok(None) => {
                        log(format!(
                            "namespace {} gone after {}",
                            self.namespace,
                            secs(started.elapsed())
                        ));
                        return;
                    }
                    Ok(Some(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            log(format!(
                "namespace {} still terminating after 10 min; going on",
                self.namespace
            ));
        }
    }
}
