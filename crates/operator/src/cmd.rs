//! `memcached-operator run`: the controller manager. Wires the Memcached controller into the
//! runtime pieces of `crates/manager` the way controller-runtime's `main.go` does: logging,
//! signals, health probes, secured metrics, informers started before leader election (so a
//! standby's cache is warm), controllers only while leading, bounded graceful shutdown; and
//! the admission webhooks on a thread of their own, away from the Lease's renewals.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use manager::leader::{self, LeaderElectionConfig};
use manager::metrics_server::{MetricsServer, MetricsServerConfig, parse_bind_address};
use manager::{Health, LogFormat, Metrics};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::builders::BuildSettings;
use crate::controller::{self, Caches, ControllerConfig, Telemetry};
use crate::crd;
use crate::webhook::dry_run::{ChildrenCheck, FailurePolicy};
use crate::webhook::{self, WebhookConfig, WebhookServer};

/// Flags of `memcached-operator run`; names and defaults follow controller-runtime's
/// scaffolded `main.go` where it has one.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Namespace to watch (repeatable, or comma-separated); all namespaces when absent.
    #[arg(long = "namespace", env = "WATCH_NAMESPACE", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Image for Memcacheds that do not name one.
    #[arg(long, env = "MEMCACHED_IMAGE", default_value = memcached_api::DEFAULT_IMAGE)]
    pub memcached_image: String,
    /// Image of the memcached exporter sidecar for Memcacheds that enable it without naming one.
    #[arg(long, env = "EXPORTER_IMAGE", default_value = memcached_api::DEFAULT_EXPORTER_IMAGE)]
    pub exporter_image: String,
    /// Image of the TLS reload agent added to pools whose certificate is reloaded in place:
    /// the agent's own image (tls-agent.Dockerfile; config/ and the chart name the release's).
    /// A new one reaches running pools with their next rollout, never by itself.
    #[arg(long, env = "TLS_AGENT_IMAGE", default_value = crate::builders::DEFAULT_TLS_AGENT_IMAGE)]
    pub tls_agent_image: String,
    /// Pools rolling at once to a new `--memcached-image` (pools that name no image): a
    /// rolled pool restarts cold, so an operator upgrade that moves the default image rolls
    /// the fleet a few pools at a time; the others show `Progressing` with reason
    /// `WaitingForRolloutSlot`. Rollouts a pool's own spec asks for do not wait.
    #[arg(long, default_value_t = controller::DEFAULT_MAX_CONCURRENT_POOL_ROLLOUTS)]
    pub max_concurrent_pool_rollouts: usize,
    /// Reconciles running at once over every watched namespace (never two for the same
    /// object). 16: reconciles wait on the
    /// API server, and convergence of 1,000 Memcacheds fell from 20.4 s at 1 to 7.4 s at 16
    /// with no gain beyond (BENCHMARKS.md); idle cost is nil.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// Threads running the operator's tasks besides the main thread; 0 (the default): the
    /// main thread runs them all. The work waits on the API server, and one thread does it
    /// with the least CPU: catching up with 1,000 Memcacheds took 24 % less CPU on the main
    /// thread alone than with a thread per core (BENCHMARKS.md §24). The manifests' CPU
    /// limit (500m) leaves no room for more anyway.
    #[arg(long, env = "TOKIO_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: u16,
    /// How long a Memcached's status may lag its pods: changes that only move the status
    /// (a pod turned Ready, got an IP) are batched per Memcached over this window, so a new
    /// Memcached's status is written about twice instead of once per pod change. Edits and
    /// deletions of its children are repaired at once regardless. `0s` disables batching.
    #[arg(long, default_value = "1s", value_parser = parse_batch_window)]
    pub status_batch_window: Duration,
    /// How often a Memcached's status is written while its pods only come up: what changes
    /// its meaning (a condition turns, a problem, a pod leaving `status.endpoints`, a new
    /// generation observed) is written at once; pods listed and counts that only add to the
    /// last status wait until this long after it. `0s` writes them at once.
    #[arg(long, default_value = "5s", value_parser = parse_batch_window)]
    pub status_progress_interval: Duration,
    /// How often converged objects are checked again (they cost no writes).
    #[arg(long, default_value = "5m", value_parser = parse_resync_period)]
    pub resync_period: Duration,

    /// Run active/standby: only the holder of the Lease reconciles.
    #[arg(long, default_value_t = false)]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "memcached-operator.cache.example.com")]
    pub leader_election_id: String,
    /// Namespace of the Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// How long a Lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// The leader stops reconciling if it could not renew for this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Interval between attempts to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Address of the metrics endpoint (`:8443`), or `0` to disable it.
    #[arg(long, default_value = ":8443")]
    pub metrics_bind_address: String,
    /// Serve metrics over TLS to authenticated, authorized callers only
    /// (`--metrics-secure=false` for plain HTTP).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_secure: bool,
    /// Directory with the metrics server's `tls.crt` and `tls.key` (reloaded on change);
    /// a self-signed certificate is generated when absent.
    #[arg(long)]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Address of `/healthz` and `/readyz`, or `0` to disable them.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Serve the defaulting and validating admission webhooks (`ENABLE_WEBHOOKS=false`
    /// to run outside a cluster, as `make run` does).
    #[arg(long, env = "ENABLE_WEBHOOKS", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_webhooks: bool,
    /// Port of the webhook server.
    #[arg(long, default_value_t = webhook::DEFAULT_PORT)]
    pub webhook_port: u16,
    /// Directory with the webhook server's `tls.crt` and `tls.key` (cert-manager mounts its
    /// Secret here; reloaded when they change).
    #[arg(long, default_value = webhook::DEFAULT_CERT_DIR)]
    pub webhook_cert_dir: PathBuf,
    /// Have the validating webhook ask the API server for a server-side dry run of the
    /// Deployment, Services, PDB and ServiceMonitor a Memcached would get, and refuse it
    /// when Kubernetes would refuse one of them (naming the Memcached's field).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub webhook_dry_run_children: bool,
    /// What the validating webhook answers when that dry run cannot be done (the API
    /// server does not answer in time, or forbids it): `Fail` refuses the Memcached and asks
    /// to retry, `Ignore` admits it with a warning.
    #[arg(long, value_enum, default_value_t = FailurePolicy::Fail)]
    pub webhook_dry_run_failure_policy: FailurePolicy,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Run even on a Kubernetes older than the oldest supported one (which `run` otherwise
    /// refuses at start-up, naming both versions).
    #[arg(long, default_value_t = false)]
    pub allow_unsupported_kubernetes: bool,

    /// Longest wait for in-flight reconciles after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub graceful_shutdown_timeout: Duration,
}

/// Why `run` stopped with an error; each is one line a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot load a kubeconfig or in-cluster config: {0}")]
    Config(String),
    #[error(transparent)]
    Startup(#[from] crd::StartupError),
    #[error("invalid --{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    #[error("metrics server: {0}")]
    Metrics(#[from] manager::metrics_server::Error),
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
    #[error("health probes: {0}")]
    Probes(String),
    #[error("leader election: {0}")]
    Leader(#[from] leader::Error),
    #[error("graceful shutdown did not finish within {0:?}")]
    ShutdownTimeout(Duration),
}

/// Parses `500ms`, `2s`, `1.5s`, `5m`, `1h` (controller-runtime flags use Go durations).
/// A status batching window: a duration of at most a minute (a longer one would leave
/// `status` stale for that long, and the timer wheel behind it has an upper limit).
pub fn parse_batch_window(s: &str) -> Result<Duration, String> {
    let window = parse_duration(s)?;
    if window > Duration::from_secs(60) {
        return Err(format!(
            "{s:?} is longer than 1m: status would lag the pods that long"
        ));
    }
    Ok(window)
}

/// A resync period: at least a second (a shorter one re-checks every object in a loop).
pub fn parse_resync_period(s: &str) -> Result<Duration, String> {
    let period = parse_duration(s)?;
    if period < Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is shorter than 1s: every object would be re-checked in a busy loop"
        ));
    }
    Ok(period)
}

/// Go-style durations (`500ms`, `2s`, `5m`, `1h`), as the agent's flags take them too: one
/// parser, the agent's (which depends on nothing of the operator's).
pub use memcached_tls_agent::parse_duration;

fn lease_namespace(flag: Option<&str>) -> String {
    if let Some(ns) = flag.filter(|ns| !ns.is_empty()) {
        return ns.to_string();
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

fn bind_address(flag: &'static str, value: &str) -> Result<Option<SocketAddr>, RunError> {
    parse_bind_address(value).map_err(|e| RunError::Flag {
        flag,
        message: e.to_string(),
    })
}

/// What the operator calls itself in every request's `User-Agent` (as controller-runtime
/// managers do), so the API server's audit log and metrics can tell its requests apart.
pub const USER_AGENT: &str = concat!("memcached-operator/", env!("CARGO_PKG_VERSION"));

/// Longest wait for a connection to the API server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence from the API server on a connection in use, counted from the last byte
/// sent or received: above kube-apiserver's own 60 s limit on a request
/// (`--request-timeout`) and the minute between its bookmarks on an idle watch, so only a
/// dead connection reaches it. A request on one fails then instead of waiting forever.
const READ_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for a request to be written out.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The kubeconfig or the in-cluster config, naming itself [`USER_AGENT`], with time limits
/// on connecting, writing and reading.
async fn config_from_environment() -> Result<kube::Config, RunError> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Config(e.to_string()))?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    // Counted from the request, not from when its pooled connection last went quiet.
    config.reset_reader_on_write = true;
    config.write_timeout = Some(WRITE_TIMEOUT);
    Ok(config)
}

/// Runs the operator until SIGTERM/SIGINT (or, with leader election, until leadership is
/// lost, which is an error: the process should restart as a fresh candidate).
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    manager::logging::init(args.log_format, "info");
    let shutdown = manager::signal_token();
    run_until(args, shutdown).await
}

/// [`run`] with an explicit shutdown token (for embedding and tests).
pub async fn run_until(args: RunArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let probe_addr = bind_address("health-probe-bind-address", &args.health_probe_bind_address)?;
    let metrics_config = MetricsServerConfig {
        bind: bind_address("metrics-bind-address", &args.metrics_bind_address)?,
        secure: args.metrics_secure,
        cert_dir: args.metrics_cert_dir.clone(),
    };
    let leader_config = if args.leader_elect {
        let mut config = LeaderElectionConfig {
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
            ..LeaderElectionConfig::new(
                args.leader_election_id.clone(),
                lease_namespace(args.leader_election_namespace.as_deref()),
            )
        };
        // In a cluster the pod name says which replica leads (`kubectl get lease`); the
        // random suffix keeps a restarted pod from taking over its own old record.
        if let Ok(pod) = std::env::var("POD_NAME")
            && let Some((_, suffix)) = config.identity.rsplit_once('_')
        {
            config.identity = format!("{pod}_{suffix}");
        }
        config.validate()?;
        Some(config)
    } else {
        None
    };

    // Refuse to start, saying why, rather than serve webhooks the API server cannot call.
    if args.enable_webhooks {
        webhook::check_certificate(&args.webhook_cert_dir)?;
    }

    let kube_config = config_from_environment().await?;
    let client =
        crate::client::client(kube_config.clone()).map_err(|e| RunError::Config(e.to_string()))?;
    let scopes = watch_scopes(&args.namespaces);
    crd::check_version(&client, args.allow_unsupported_kubernetes).await?;
    for scope in &scopes {
        crd::check_installed(&client, scope.as_deref()).await?;
    }

    let metrics = Metrics::new();
    let telemetry = Telemetry::register(&metrics);
    let health = Health::new();
    health.set_healthy("ping", true);
    health.set_ready("informers-synced", false);
    let mut servers = Vec::new();
    if let Some(addr) = probe_addr {
        let listener = manager::serve::bind(addr)
            .map_err(|e| RunError::Probes(format!("cannot listen on {addr}: {e}")))?;
        let (health, shutdown) = (health.clone(), shutdown.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = manager::health::serve_probes_on(listener, health, shutdown).await {
                error!(error = %e, "health probe server stopped");
            }
        }));
    }
    if let Some(server) =
        MetricsServer::bind(&metrics_config, Some(client.clone()), &shutdown).await?
    {
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        if let Ok(addr) = server.local_addr() {
            info!(%addr, secure = metrics_config.secure, "serving metrics");
        }
        servers.push(tokio::spawn(async move {
            if let Err(e) = server.run(metrics, shutdown).await {
                error!(error = %e, "metrics server stopped");
            }
        }));
    }

    let mut webhooks = None;
    if args.enable_webhooks {
        // Every replica serves the webhooks, leader or not (as controller-runtime does), on
        // a thread and runtime of their own, so that no flood of the webhook port delays the
        // renewal of the Lease on this one.
        let config = WebhookConfig {
            bind: manager::serve::any_address(args.webhook_port),
            cert_dir: args.webhook_cert_dir.clone(),
            default_image: args.memcached_image.clone(),
        };
        let dry_run = args.webhook_dry_run_children.then(|| {
            let settings = BuildSettings {
                default_image: args.memcached_image.clone(),
                default_exporter_image: args.exporter_image.clone(),
                tls_agent_image: args.tls_agent_image.clone(),
            };
            (
                kube_config.clone(),
                settings,
                args.webhook_dry_run_failure_policy,
            )
        });
        let check = match dry_run {
            None => None,
            Some((config, settings, policy)) => Some(
                ChildrenCheck::on_own_thread(config, settings, shutdown.clone())
                    .await
                    .map_err(webhook::WebhookError::Client)?
                    .with_policy(policy),
            ),
        };
        let setup = move |server: WebhookServer| {
            Ok(match check {
                None => server,
                Some(check) => server.with_children_check(check),
            })
        };
        let thread = WebhookServer::spawn(config, setup, shutdown.clone()).await?;
        info!(addr = %thread.local_addr(), "serving admission webhooks");
        health.set_ready("webhook-started", true);
        webhooks = Some(thread);
    }

    // Informers start before the election, so a standby takes over with a warm cache. Each
    // group of namespaces watches over one connection of its own (HTTP/2 where offered).
    let mut caches: Vec<(Option<String>, Caches)> = Vec::with_capacity(scopes.len());
    for group in scopes.chunks(crate::client::SCOPES_PER_WATCH_CONNECTION) {
        let watches = crate::client::watch_client(kube_config.clone())
            .map_err(|e| RunError::Config(e.to_string()))?;
        // One request first, so that the group's watches find its connection up and share
        // it rather than each dialling one. A failure here is the informers' to retry.
        if let Err(e) = watches.apiserver_version().await {
            debug!(error = %e, "first request of a watch connection");
        }
        for scope in group {
            caches.push((scope.clone(), Caches::start(&watches, scope.as_deref())));
        }
    }
    tokio::select! {
        _ = futures::future::join_all(caches.iter().map(|(_, c)| c.wait_synced())) => {}
        _ = shutdown.cancelled() => return Ok(()),
    }
    info!(scopes = caches.len(), "caches synced");
    health.set_ready("informers-synced", true);

    let config = ControllerConfig {
        build: BuildSettings {
            default_image: args.memcached_image.clone(),
            default_exporter_image: args.exporter_image.clone(),
            tls_agent_image: args.tls_agent_image.clone(),
        },
        concurrency: args.max_concurrent_reconciles,
        // One set of slots for every watched namespace's controller.
        slots: Some(controller::Slots::new(usize::from(
            args.max_concurrent_reconciles,
        ))),
        resync: args.resync_period,
        status_batch: args.status_batch_window,
        status_progress_interval: args.status_progress_interval,
        instance: std::env::var("POD_NAME").ok(),
        telemetry: Some(telemetry),
        rollout_slots: std::sync::Arc::new(controller::RolloutSlots::new(
            args.max_concurrent_pool_rollouts,
        )),
        ..ControllerConfig::default()
    };
    let controllers = |leader_token: CancellationToken| {
        let health = health.clone();
        let runs = caches.iter().map(|(scope, c)| {
            let config = ControllerConfig {
                namespace: scope.clone(),
                ..config.clone()
            };
            info!(
                namespace = scope.as_deref().unwrap_or("<all>"),
                "starting controller"
            );
            controller::run_controller(
                client.clone(),
                c,
                config,
                leader_token.clone().cancelled_owned(),
            )
        });
        let all = futures::future::join_all(runs);
        async move {
            health.set_ready("controllers-started", true);
            all.await;
            Ok::<(), Infallible>(())
        }
    };
    if leader_config.is_some() {
        // A leader is ready only once its controllers run; a standby once its caches sync.
        health.set_ready("controllers-started", true);
    }
    let elected = leader::run_as_leader(
        client.clone(),
        leader_config,
        &metrics,
        shutdown.clone(),
        controllers,
    );
    let grace = args.graceful_shutdown_timeout;
    let result = tokio::select! {
        r = elected => r.map_err(RunError::from),
        _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            warn!(timeout = ?grace, "in-flight reconciles did not finish in time");
            Err(RunError::ShutdownTimeout(grace))
        }
    };
    shutdown.cancel();
    // A lost Lease: another replica may lead in moments, and tasks of ours may still hold
    // writes; the process exits now (the caller returns at once), without waiting on the
    // servers' connections.
    let lost = matches!(
        result,
        Err(RunError::Leader(leader::Error::LeadershipLost { .. }))
    );
    if !lost {
        for server in servers {
            let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        }
        if let Some(webhooks) = webhooks {
            let _ = tokio::time::timeout(Duration::from_secs(2), webhooks.stopped()).await;
        }
    }
    info!("stopped");
    result
}

/// The scopes the caches watch: one per `--namespace` / `WATCH_NAMESPACE` name, or the
/// whole cluster (`None`) when there is none. OLM sets WATCH_NAMESPACE from its
/// `olm.targetNamespaces` annotation, which is empty in AllNamespaces mode: empty names
/// mean all namespaces, and a name given twice is watched once.
pub fn watch_scopes(namespaces: &[String]) -> Vec<Option<String>> {
    let mut names: Vec<String> = namespaces
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        vec![None]
    } else {
        names.into_iter().map(Some).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("15 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_batch_window("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_batch_window("1m"), Ok(Duration::from_secs(60)));
        let too_long = parse_batch_window("1000h").unwrap_err();
        assert!(too_long.contains("longer than 1m"), "{too_long}");
    }

    /// What OLM's `olm.targetNamespaces` becomes: empty in AllNamespaces mode, one name in
    /// OwnNamespace and SingleNamespace, comma-separated names in MultiNamespace.
    #[test]
    fn watch_namespace_as_olm_sets_it() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let scopes = |flags: &[&str]| {
            let cli = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("memcached-operator").chain(flags.iter().copied()),
            )
            .map_err(|e| e.to_string());
            cli.map(|c| watch_scopes(&c.run.namespaces))
        };
        assert_eq!(scopes(&["--namespace="]), Ok(vec![None]));
        assert_eq!(scopes(&[]), Ok(vec![None]));
        assert_eq!(
            scopes(&["--namespace=team-a"]),
            Ok(vec![Some("team-a".to_string())])
        );
        assert_eq!(
            scopes(&["--namespace=team-b,team-a", "--namespace", "team-b"]),
            Ok(vec![Some("team-a".to_string()), Some("team-b".to_string())])
        );
        assert_eq!(
            scopes(&["--namespace=team-a,"]),
            Ok(vec![Some("team-a".to_string())])
        );
    }
}
