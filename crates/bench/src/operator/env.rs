//! Where a phase of `bench operator` runs ([`Env`]): a fresh in-memory API server served
//! over HTTP, or fresh namespaces of a real cluster; and the API requests counted there
//! (the in-memory server's counts, or the real server's audit log).
//!
//! A phase's pools go into `--namespaces` namespaces, round-robin (pool i into namespace
//! i mod K). One namespace (the default) is the run as it always was; several keep each
//! namespace's share small, as real clusters do: kube-controller-manager's disruption and
//! endpoint controllers do work in proportion to a namespace's objects for every pod
//! event, so N pools in one namespace would measure a control plane that is O(N²).

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

/// Where a phase runs: a fresh in-memory server, or fresh namespaces of a real cluster.
pub(super) struct Env {
    pub(super) client: Client,
    /// The phase's namespaces (at least one); pool i goes into `namespaces[i % K]`.
    pub(super) namespaces: Vec<String>,
    pub(super) kubeconfig: PathBuf,
    /// The in-memory server (None on a real cluster).
    pub(super) server: Option<apisim::ApiServer>,
    pub(super) _handle: Option<apisim::ServeHandle>,
    pub(super) cluster: bool,
    /// The real API server's audit log, when given.
    pub(super) audit: Option<PathBuf>,
    /// How long [`Env::cleanup`] waits for the phase's namespaces to go.
    pub(super) cleanup_wait: Duration,
}

/// How long a phase's namespaces are waited for after it. With `--cluster-wide` the next
/// phase's operator would watch what is left of them (and reconcile those pools too), so
/// the wait is then as long as a phase may take.
fn cleanup_wait(args: &BenchArgs) -> Duration {
    let usual = Duration::from_secs(600);
    if args.cluster_wide {
        args.timeout.max(usual)
    } else {
        usual
    }
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
            let base = format!(
                "mc-bench-{tag}-{}",
                jiff::Timestamp::now().as_second() % 1_000_000
            );
            let namespaces = namespace_names(&base, args.namespaces);
            for namespace in &namespaces {
                create_namespace(&client, namespace).await?;
            }
            return Ok(Env {
                client,
                namespaces,
                kubeconfig: path.clone(),
                server: None,
                _handle: None,
                cluster: true,
                audit: args.audit_log.clone(),
                cleanup_wait: cleanup_wait(args),
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
        let namespaces = namespace_names("bench", args.namespaces);
        for namespace in &namespaces {
            create_namespace(&client, namespace).await?;
        }
        Ok(Env {
            client,
            namespaces,
            kubeconfig,
            server: Some(server),
            _handle: Some(handle),
            cluster: false,
            audit: None,
            cleanup_wait: cleanup_wait(args),
        })
    }

    /// The namespace of pool `i`: the phase's namespaces in turn.
    pub(super) fn namespace_of(&self, i: usize) -> &str {
        &self.namespaces[i % self.namespaces.len()]
    }

    /// The namespace of the `latency` Memcached: the first one.
    pub(super) fn latency_namespace(&self) -> &str {
        self.namespace_of(0)
    }

    pub(super) fn memcacheds(&self, namespace: &str) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), namespace)
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
    /// real one with an audit log (told by its User-Agent, in whichever namespace), unknown
    /// otherwise.
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
            // All deleted first, so that the garbage collector works on them together.
            let mut deleted = Vec::new();
            for namespace in &self.namespaces {
                match namespaces
                    .delete(namespace, &DeleteParams::background())
                    .await
                {
                    Ok(_) => deleted.push(namespace),
                    Err(e) => log(format!("could not delete namespace {namespace}: {e}")),
                }
            }
            // The next phase runs on the same server: wait until the garbage collector has
            // removed this one's objects (thousands of pods at large N), so that it does not
            // compete with what is measured next. One namespace is asked after at a time.
            let started = Instant::now();
            let mut waiting = deleted.into_iter().peekable();
            while started.elapsed() < self.cleanup_wait {
                let Some(namespace) = waiting.peek() else {
                    break;
                };
                match namespaces.get_opt(namespace).await {
                    Ok(None) => {
                        log(format!(
                            "namespace {namespace} gone after {}",
                            secs(started.elapsed())
                        ));
                        waiting.next();
                    }
                    Ok(Some(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            for namespace in waiting {
                log(format!(
                    "namespace {namespace} still terminating after {}; going on",
                    secs(self.cleanup_wait)
                ));
            }
        }
    }
}

/// The phase's `k` namespace names: `base` itself for one (as the bench always named it),
/// `base-0` … `base-{k-1}` for more.
pub(super) fn namespace_names(base: &str, k: u16) -> Vec<String> {
    if k <= 1 {
        vec![base.to_string()]
    } else {
        (0..k).map(|j| format!("{base}-{j}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_namespace_keeps_its_name_and_more_are_numbered() {
        assert_eq!(namespace_names("mc-bench-op-1", 1), ["mc-bench-op-1"]);
        assert_eq!(
            namespace_names("bench", 3),
            ["bench-0", "bench-1", "bench-2"]
        );
    }
}
