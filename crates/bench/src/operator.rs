//! `bench operator`: how fast the operator converges compared with the fewest API
//! writes that could do the same job, what it costs at rest, how quickly it reacts and how
//! much memory it holds. Not part of the test suite; see BENCHMARKS.md for results.
//!
//! For each N it runs, on a fresh in-memory API server served over HTTP (workload simulator
//! on: 3 pods per Memcached) or, with `--kubeconfig`, in fresh namespaces of a real cluster:
//! 1. the raw-write bound (measured with 3.): a bare client creates N Memcacheds (untimed),
//!    then creates their Deployments and Services (the operator's own builders) and patches
//!    their statuses (the operator's own status function), C requests in flight;
//! 2. the operator as a separate process (this binary's `run`), so its resident memory can
//!    be read from `/proc/PID/status`: idle memory, event→reconcile latency at idle, N
//!    Memcacheds created at once (convergence time and latency under that load), memory
//!    when converged and with every pod cached, then API requests during a resync window;
//! 3. the catch-up: N Memcacheds created first, then the operator started (the bound's own
//!    starting point). Bound and catch-up are measured `--pairs` times, back to back, and
//!    the ratio is the median of the paired ratios.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::Memcached;
use serde_json::json;

use memcached_operator::builders::{self, BuildSettings, LABEL_MANAGED_BY, MANAGED_BY};
use memcached_operator::cmd::parse_duration;
use memcached_operator::status::{self, Observed};

/// Flags of `bench operator`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Numbers of Memcacheds to run with (comma-separated), one full run each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    pub n: Vec<usize>,
    /// Requests in flight of the raw-write client (and of the client creating the CRs).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The operator's `--max-concurrent-reconciles` (comma-separated: one operator run each).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub max_concurrent_reconciles: Vec<u16>,
    /// Run against this cluster (a namespace per run, deleted afterwards) instead of the
    /// in-memory API server. The CRD must be installed.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// With `--kubeconfig`: the API server's audit log (metadata level, one JSON event per
    /// line, as `make dev-cluster` writes it). The operator's requests (its `User-Agent` is
    /// `memcached-operator/…`) are counted from it, as the server saw them.
    #[arg(long, requires = "kubeconfig")]
    pub audit_log: Option<PathBuf>,
    /// The operator binary to run (default: this one).
    #[arg(long)]
    pub operator_bin: Option<PathBuf>,
    /// Extra flag for the operator's `run` (repeatable), e.g. `--operator-arg=--foo=1`.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    pub operator_args: Vec<String>,
    /// The operator's `--resync-period` (short, so the steady-state window sees resyncs).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub resync_period: Duration,
    /// How long API requests are counted once everything has converged.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub steady_window: Duration,
    /// Spec changes timed for the event→reconcile latency (at idle; at most as many under load).
    #[arg(long, default_value_t = 50)]
    pub latency_samples: usize,
    /// How long simulated pods stay Pending (in-memory server only).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub pod_ready_delay: Duration,
    /// Skip the raw-write bound (for sweeps of the operator alone).
    #[arg(long)]
    pub skip_bound: bool,
    /// How many times the raw-write bound and the catch-up are measured, back to back on
    /// fresh servers. The table gives the median and the range, and the ratio is the median
    /// of the paired ratios: on a shared machine one pair can land in a slow spell.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub pairs: u16,
    /// Longest wait for any one phase.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T, E = BoxError> = std::result::Result<T, E>;

const SIZE: i32 = 3;
const LATENCY_CR: &str = "latency";
const PREFIX: &str = "bench-";

pub(crate) fn log(msg: impl AsRef<str>) {
    eprintln!(
        "[bench {}] {}",
        jiff::Timestamp::now().strftime("%H:%M:%S"),
        msg.as_ref()
    );
}

/// Where a phase runs: a fresh in-memory server, or a fresh namespace of a real cluster.
struct Env {
    client: Client,
    namespace: String,
    kubeconfig: PathBuf,
    /// The in-memory server (None on a real cluster).
    server: Option<apisim::ApiServer>,
    _handle: Option<apisim::ServeHandle>,
    cluster: bool,
    /// The real API server's audit log, when given.
    audit: Option<PathBuf>,
}

/// Where request counting started: the in-memory server resets its counts; an audit log is
/// read on from the byte it had reached.
struct Mark(u64);

/// The operator's requests in an audit log after byte `from`, by verb (dry runs are not
/// writes).
fn audit_requests(path: &Path, from: u64) -> Result<Requests> {
    let (by_verb, writes) =
        crate::side_by_side::audit_requests(path, from, memcached_operator::cmd::USER_AGENT)?;
    Ok(Requests { by_verb, writes })
}

impl Env {
    async fn new(args: &BenchArgs, dir: &Path, tag: &str) -> Result<Env> {
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

    fn memcacheds(&self) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Starts counting requests from here.
    fn mark(&self) -> Mark {
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
    fn requests_since(&self, mark: &Mark) -> Option<Requests> {
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

    async fn cleanup(&self) {
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

pub(crate) async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn memcached(name: &str, size: i32) -> Result<Memcached> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name},
        "spec": {"size": size},
    }))?)
}

fn cr_name(i: usize) -> String {
    format!("{PREFIX}{i:05}")
}

/// Creates `names` as Memcacheds of size 3, `concurrency` at a time.
async fn create_crs(
    api: &Api<Memcached>,
    names: Vec<String>,
    concurrency: usize,
) -> Result<Vec<Memcached>> {
    futures::stream::iter(names)
        .map(|name| async move {
            let mc = memcached(&name, SIZE)?;
            Ok::<_, BoxError>(api.create(&PostParams::default(), &mc).await?)
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await
}

/// The raw-write bound: for each of `n` Memcacheds, a create of every child the operator
/// creates for it (Deployment, Service, headless Service and, from size 2, the
/// PodDisruptionBudget, all from the operator's own builders) and one status patch (the
/// operator's own status function).
/// Returns the time taken and the CPU time this process (server and client) used.
async fn raw_write_bound(env: &Env, n: usize, concurrency: usize) -> Result<(Duration, Duration)> {
    let api = env.memcacheds();
    let crs = create_crs(&api, (0..n).map(cr_name).collect(), concurrency).await?;
    let settings = BuildSettings::default();
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.namespace);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    let cpu_before = cpu_time(std::process::id());
    let started = Instant::now();
    futures::stream::iter(crs)
        .map(|mc| {
            let (api, deployments, services, pdbs, settings) =
                (&api, &deployments, &services, &pdbs, &settings);
            async move {
                let pp = PostParams::default();
                let deployment = deployments
                    .create(&pp, &builders::desired_deployment(&mc, settings)?)
                    .await?;
                services
                    .create(&pp, &builders::desired_service(&mc)?)
                    .await?;
                services
                    .create(&pp, &builders::desired_headless_service(&mc)?)
                    .await?;
                if let Some(pdb) = builders::desired_pdb(&mc)? {
                    pdbs.create(&pp, &pdb).await?;
                }
                let observed = Observed {
                    deployment: Some(&deployment),
                    pods: Vec::new(),
                    problem: None,
                    proxy: None,
                    reload_failures: Vec::new(),
                    rollout_waiting: None,
                };
                let status = status::desired_status(&mc, &observed, jiff::Timestamp::now());
                api.patch_status(
                    &mc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok((
        started.elapsed(),
        cpu_time(std::process::id()).saturating_sub(cpu_before),
    ))
}

/// Resident and peak memory of a process, in KiB, from `/proc/PID/status`.
pub(crate) fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system) of a process so far.
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may contain spaces) start at state, field 3.
    let after = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The operator as a child process, killed on drop.
struct Operator {
    child: Child,
    log: PathBuf,
}

impl Operator {
    async fn start(args: &BenchArgs, env: &Env, dir: &Path, reconciles: u16) -> Result<Operator> {
        let bin = match &args.operator_bin {
            Some(bin) => bin.clone(),
            None => crate::sibling_binary("memcached-operator")?,
        };
        let log = dir.join(format!(
            "operator-{}.log",
            jiff::Timestamp::now().as_millisecond()
        ));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--metrics-bind-address=0")
            .arg("--health-probe-bind-address=0")
            .arg(format!(
                "--resync-period={}ms",
                args.resync_period.as_millis()
            ))
            .arg(format!("--max-concurrent-reconciles={reconciles}"))
            .args(&args.operator_args)
            .env("KUBECONFIG", &env.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OPERATOR_LOG")
                    .unwrap_or_else(|_| "warn,memcached_operator::cmd=info".into()),
            )
            // Out of a cluster there is no serving certificate; the webhooks are not measured.
            .env("ENABLE_WEBHOOKS", "false")
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            // The operator logs to stdout, its start-up errors go to stderr.
            .stdout(file.try_clone()?)
            .stderr(file);
        if env.cluster {
            cmd.arg(format!("--namespace={}", env.namespace));
        }
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("caches synced") {
                break;
            }
            if let Some(status) = child.try_wait()? {
                return Err(format!(
                    "the operator exited ({status}) before its caches synced:\n{text}"
                )
                .into());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(
                    format!("the operator's caches did not sync within 20s:\n{text}").into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Operator { child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn memory(&self) -> (u64, u64) {
        memory_kib(self.pid())
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("the operator exited ({status}):\n{text}").into());
        }
        Ok(())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Convergence as seen through watches: which `bench-*` Memcacheds have their children and
/// an up-to-date status, and which report all their pods ready.
#[derive(Default)]
struct Progress {
    deployments: HashSet<String>,
    services: HashSet<String>,
    /// name → (generation == observedGeneration, all pods ready in status)
    statuses: HashMap<String, (bool, bool)>,
    children_and_status: HashSet<String>,
    pods_ready: HashSet<String>,
    children_and_status_at: Option<Instant>,
    pods_ready_at: Option<Instant>,
    /// When the first Deployment was seen (the operator's first write, when it runs).
    first_child_at: Option<Instant>,
}

impl Progress {
    fn update(&mut self, name: &str, n: usize) {
        let (current, ready) = self.statuses.get(name).copied().unwrap_or_default();
        let children = self.deployments.contains(name) && self.services.contains(name);
        if children && current {
            self.children_and_status.insert(name.to_string());
        } else {
            self.children_and_status.remove(name);
        }
        if children && current && ready {
            self.pods_ready.insert(name.to_string());
        } else {
            self.pods_ready.remove(name);
        }
        if self.children_and_status.len() == n && self.children_and_status_at.is_none() {
            self.children_and_status_at = Some(Instant::now());
        }
        if self.pods_ready.len() == n && self.pods_ready_at.is_none() {
            self.pods_ready_at = Some(Instant::now());
        }
    }
}

enum Seen {
    /// name, status describes the current generation, status shows every pod ready
    Memcached(String, bool, bool),
    Deployment(String),
    Service(String),
}

fn applied<K: Clone>(event: watcher::Event<K>) -> Option<K> {
    match event {
        watcher::Event::Apply(k) | watcher::Event::InitApply(k) => Some(k),
        _ => None,
    }
}

fn summary(mc: &Memcached) -> Seen {
    let status = mc.status.clone().unwrap_or_default();
    let current = status.observed_generation.is_some()
        && status.observed_generation == mc.metadata.generation;
    let ready =
        status.nodes.len() == mc.spec.size as usize && status.ready_replicas == mc.spec.size;
    Seen::Memcached(mc.name_any(), current, ready)
}

/// Records when all `n` Memcacheds got there: from the in-memory server's own change feed,
/// or by watching the namespace of a cluster.
fn track(env: &Env, n: usize) -> (Arc<Mutex<Progress>>, tokio::task::JoinHandle<()>) {
    let progress = Arc::new(Mutex::new(Progress::default()));
    let mut all = match &env.server {
        Some(server) => store_changes(server, &env.namespace),
        None => watched_changes(env),
    };
    let shared = progress.clone();
    let task = tokio::spawn(async move {
        while let Some(seen) = all.next().await {
            let mut p = shared.lock().unwrap_or_else(|e| e.into_inner());
            let name = match seen {
                Seen::Memcached(name, current, ready) => {
                    p.statuses.insert(name.clone(), (current, ready));
                    name
                }
                Seen::Deployment(name) => {
                    p.deployments.insert(name.clone());
                    p.first_child_at.get_or_insert_with(Instant::now);
                    name
                }
                Seen::Service(name) => {
                    p.services.insert(name.clone());
                    name
                }
            };
            if name.starts_with(PREFIX) {
                p.update(&name, n);
            }
        }
    });
    (progress, task)
}

/// Progress as the in-memory server's store records it, read in-process. The tracker then
/// adds nothing to the server's work: watches would have the server serialize and send
/// every Deployment, Service and Memcached change to the bench while the operator is
/// measured, and the raw-write bound (no tracker) pays nothing like it.
fn store_changes(server: &apisim::ApiServer, namespace: &str) -> BoxStream<'static, Seen> {
    let (server, namespace) = (server.clone(), namespace.to_string());
    // Subscribed first, then the store is read whole (`None`), so nothing falls in between.
    let changes = futures::stream::unfold(server.changes(), |mut changes| async move {
        changes.recv().await.map(|change| (Some(change), changes))
    });
    futures::stream::once(async { None })
        .chain(changes)
        .flat_map(move |change| {
            let seen = if change.as_ref().is_none_or(|c| c.event_type() == "LAGGED") {
                // at the start, or changes were missed: read every tracked object
                read_store(&server, &namespace)
            } else if let Some(change) = change.filter(|c| c.event_type() != "DELETED") {
                seen_in_store(change.kind_plural(), change.object(), &namespace)
                    .into_iter()
                    .collect()
            } else {
                Vec::new()
            };
            futures::stream::iter(seen)
        })
        .boxed()
}

/// What the tracker learns from every Memcached, Deployment and Service in the store.
fn read_store(server: &apisim::ApiServer, namespace: &str) -> Vec<Seen> {
    fn kind<K: kube::Resource<DynamicType = ()>>() -> (String, String) {
        (
            K::api_version(&()).into_owned(),
            K::plural(&()).into_owned(),
        )
    }
    [kind::<Memcached>(), kind::<Deployment>(), kind::<Service>()]
        .into_iter()
        .flat_map(|(api_version, plural)| {
            server
                .list_objects(&api_version, &plural, Some(namespace))
                .into_iter()
                .filter_map(move |o| seen_in_store(&plural, &o, namespace))
        })
        .collect()
}

/// What a stored object tells the tracker, read from its JSON (what [`summary`] reads of a
/// typed Memcached).
fn seen_in_store(plural: &str, obj: &serde_json::Value, namespace: &str) -> Option<Seen> {
    let meta = &obj["metadata"];
    if meta["namespace"].as_str() != Some(namespace) {
        return None;
    }
    let name = meta["name"].as_str()?.to_string();
    let owned = || meta["labels"][LABEL_MANAGED_BY].as_str() == Some(MANAGED_BY);
    match plural {
        "memcacheds" => {
            let status = &obj["status"];
            let observed = status["observedGeneration"].as_i64();
            let current = observed.is_some() && observed == meta["generation"].as_i64();
            let size = obj["spec"]["size"].as_i64().unwrap_or(0);
            let nodes = status["nodes"].as_array().map_or(0, Vec::len) as i64;
            let ready = nodes == size && status["readyReplicas"].as_i64().unwrap_or(0) == size;
            Some(Seen::Memcached(name, current, ready))
        }
        "deployments" if owned() => Some(Seen::Deployment(name)),
        "services" if owned() => Some(Seen::Service(name)),
        _ => None,
    }
}

/// Progress from watches of the namespace (a real cluster).
fn watched_changes(env: &Env) -> BoxStream<'static, Seen> {
    let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let mcs = watcher(env.memcacheds(), watcher::Config::default())
        .filter_map(|e| async move { e.ok().and_then(applied).map(|mc| summary(&mc)) })
        .boxed();
    // Children are watched metadata-only: the tracker needs their names.
    let deployments = watcher(
        Api::<PartialObjectMeta<Deployment>>::namespaced(env.client.clone(), &env.namespace),
        owned.clone(),
    )
    .filter_map(|e| async move {
        e.ok()
            .and_then(applied)
            .map(|d| Seen::Deployment(d.name_any()))
    })
    .boxed();
    let services = watcher(
        Api::<PartialObjectMeta<Service>>::namespaced(env.client.clone(), &env.namespace),
        owned,
    )
    .filter_map(|e| async move {
        e.ok()
            .and_then(applied)
            .map(|s| Seen::Service(s.name_any()))
    })
    .boxed();
    futures::stream::select_all([mcs, deployments, services]).boxed()
}

/// Latency percentiles of a set of samples.
#[derive(Clone, Debug, Default)]
struct Latency {
    samples: Vec<Duration>,
}

impl Latency {
    fn percentile(&self, p: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v = self.samples.clone();
        v.sort();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }

    fn show(&self) -> String {
        match (self.percentile(50.0), self.percentile(99.0)) {
            (Some(p50), Some(p99)) => {
                format!("{} / {} (n={})", ms(p50), ms(p99), self.samples.len())
            }
            _ => "no samples".into(),
        }
    }
}

/// Waits until the `latency` Deployment has `replicas`; returns false on timeout.
async fn deployment_reaches(env: &Env, replicas: i64, timeout: Duration) -> Result<bool> {
    if let Some(server) = &env.server {
        // Poll the store directly from a thread: sub-millisecond resolution, no HTTP.
        let (server, ns) = (server.clone(), env.namespace.clone());
        return Ok(tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                let live = server.get_object("apps/v1", "deployments", Some(&ns), LATENCY_CR);
                if live.as_ref().and_then(|d| d["spec"]["replicas"].as_i64()) == Some(replicas) {
                    return true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            false
        })
        .await?);
    }
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let cond = move |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
            .map(i64::from)
            == Some(replicas)
    };
    Ok(tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api, LATENCY_CR, cond),
    )
    .await
    .is_ok())
}

/// Times `samples` spec changes of the `latency` Memcached (size 3 ↔ 4) until its Deployment
/// shows them, pausing between changes; stops early when `stop` says so.
async fn measure_latency(
    env: &Env,
    samples: usize,
    timeout: Duration,
    stop: impl Fn() -> bool,
) -> Result<Latency> {
    let api = env.memcacheds();
    let mut latency = Latency::default();
    for i in 0..samples {
        if stop() {
            break;
        }
        let size = if i % 2 == 0 { SIZE + 1 } else { SIZE };
        let started = Instant::now();
        api.patch(
            LATENCY_CR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": size}})),
        )
        .await?;
        if !deployment_reaches(env, i64::from(size), timeout).await? {
            return Err(format!(
                "the latency Deployment did not reach {size} replicas in {timeout:?}"
            )
            .into());
        }
        latency.samples.push(started.elapsed());
        // Pauses of 50–150 ms, not in step with anything periodic.
        tokio::time::sleep(Duration::from_millis(50 + (i as u64 * 37) % 100)).await;
    }
    Ok(latency)
}

/// API requests by verb (in-memory server only).
#[derive(Clone, Debug, Default)]
struct Requests {
    by_verb: BTreeMap<String, u64>,
    writes: u64,
}

impl Requests {
    fn of(counts: &apisim::RequestCounts) -> Self {
        Self {
            by_verb: counts.by_verb(),
            writes: counts.writes(),
        }
    }

    fn show(&self) -> String {
        if self.by_verb.is_empty() {
            return "none".into();
        }
        self.by_verb
            .iter()
            .map(|(v, c)| format!("{v} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Everything measured for one N and one `--max-concurrent-reconciles`.
#[derive(Clone, Debug, Default)]
struct Row {
    n: usize,
    reconciles: u16,
    /// The raw-write bound and the catch-up, measured `--pairs` times.
    pairs: Vec<Pair>,
    create_crs: Duration,
    children_and_status: Duration,
    pods_ready: Duration,
    steady: Option<Requests>,
    /// Requests from the start of the creation until children + status (every client).
    converging: Option<Requests>,
    steady_cpu: Duration,
    /// CPU time while converging: the operator, and this process (the in-memory API server,
    /// its simulator and the bench's clients).
    converging_cpu: (Duration, Duration),
    latency_idle: Latency,
    latency_load: Latency,
    rss_idle: u64,
    rss_converged: u64,
    rss_pods: u64,
    rss_peak: u64,
    wall: Duration,
}

async fn wait_progress(
    progress: &Arc<Mutex<Progress>>,
    op: &mut Operator,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Progress) -> Option<Instant>,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let p = progress.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = done(&p) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what}: timed out after {timeout:?} ({} with children and status, {} with pods ready)",
                    p.children_and_status.len(),
                    p.pods_ready.len()
                )
                .into());
            }
        }
        op.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One raw-write bound and one catch-up, measured back to back.
#[derive(Clone, Debug, Default)]
struct Pair {
    /// None with `--skip-bound`.
    bound: Option<Duration>,
    /// CPU time of this process (API server, simulator, client) during the bound.
    bound_cpu: Duration,
    /// The N Memcacheds created before the operator starts: from its start to children +
    /// status for all (start-up and cache sync included).
    catch_up: Duration,
    /// Of `catch_up`, from starting the process to its first child written.
    startup: Option<Duration>,
    /// Every request during the catch-up (in-memory server only).
    requests: Option<Requests>,
    /// CPU time during the catch-up: the operator, and this process.
    cpu: (Duration, Duration),
}

impl Pair {
    fn ratio(&self) -> Option<f64> {
        let bound = self.bound?.as_secs_f64();
        (bound > 0.0).then(|| self.catch_up.as_secs_f64() / bound)
    }
}

async fn operator_run(
    args: &BenchArgs,
    dir: &Path,
    n: usize,
    reconciles: u16,
    row: &mut Row,
) -> Result<()> {
    let env = Env::new(args, dir, "op").await?;
    let result = operator_phases(args, &env, dir, n, reconciles, row).await;
    env.cleanup().await;
    drop(env);
    result?;
    for i in 1..=args.pairs {
        let (bound, bound_cpu) = if args.skip_bound {
            (None, Duration::ZERO)
        } else {
            let env = Env::new(args, dir, "raw").await?;
            let bound = raw_write_bound(&env, n, args.concurrency).await;
            env.cleanup().await;
            drop(env);
            let (bound, cpu) = bound?;
            log(format!(
                "N={n} pair {i}/{}: raw-write bound {} ({} in flight)",
                args.pairs,
                secs(bound),
                args.concurrency
            ));
            (Some(bound), cpu)
        };
        let env = Env::new(args, dir, "catchup").await?;
        let result = catch_up(args, &env, dir, n, reconciles).await;
        env.cleanup().await;
        drop(env);
        let pair = Pair {
            bound,
            bound_cpu,
            ..result?
        };
        log(format!(
            "N={n} pair {i}/{}: operator started after the CRs existed: children and status in {} ({})",
            args.pairs,
            secs(pair.catch_up),
            pair.ratio()
                .map(|r| format!("{r:.2}× the bound"))
                .unwrap_or_else(|| "no bound".into())
        ));
        row.pairs.push(pair);
    }
    Ok(())
}

/// The same work as the raw-write bound starts from: N Memcacheds that already exist. The
/// operator is started after they are created; timed from its start (process start-up and
/// the caches' first list included) until every one has its children and status.
async fn catch_up(
    args: &BenchArgs,
    env: &Env,
    dir: &Path,
    n: usize,
    reconciles: u16,
) -> Result<Pair> {
    create_crs(
        &env.memcacheds(),
        (0..n).map(cr_name).collect(),
        args.concurrency,
    )
    .await?;
    let (progress, tracker) = track(env, n);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mark = env.mark();
    let bench_cpu = cpu_time(std::process::id());
    let started = Instant::now();
    let mut op = Operator::start(args, env, dir, reconciles).await?;
    let at = wait_progress(&progress, &mut op, args.timeout, "catch-up", |p| {
        p.children_and_status_at
    })
    .await?;
    let pair = Pair {
        catch_up: at - started,
        startup: progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first_child_at
            .map(|first| first.saturating_duration_since(started)),
        cpu: (
            cpu_time(op.pid()),
            cpu_time(std::process::id()).saturating_sub(bench_cpu),
        ),
        requests: env.requests_since(&mark),
        ..Pair::default()
    };
    tracker.abort();
    let _ = tracker.await;
    Ok(pair)
}

async fn operator_phases(
    args: &BenchArgs,
    env: &Env,
    dir: &Path,
    n: usize,
    reconciles: u16,
    row: &mut Row,
) -> Result<()> {
    let mut op = Operator::start(args, env, dir, reconciles).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    row.rss_idle = op.memory().0;
    log(format!(
        "operator idle: {} (pid {})",
        mib(row.rss_idle),
        op.pid()
    ));

    // Idle latency, on a Memcached of its own.
    let api = env.memcacheds();
    api.create(&PostParams::default(), &memcached(LATENCY_CR, SIZE)?)
        .await?;
    if !deployment_reaches(env, i64::from(SIZE), Duration::from_secs(60)).await? {
        return Err("the latency Memcached got no Deployment within 60s".into());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    row.latency_idle =
        measure_latency(env, args.latency_samples, Duration::from_secs(60), || false).await?;
    log(format!(
        "latency at idle p50/p99: {}",
        row.latency_idle.show()
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // N at once, with latency measured while they are being reconciled.
    let (progress, tracker) = track(env, n);
    // Let the watches list before the clock starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mark = env.mark();
    let started = Instant::now();
    let cpu_before = (cpu_time(op.pid()), cpu_time(std::process::id()));
    let create = async {
        let created = create_crs(&api, (0..n).map(cr_name).collect(), args.concurrency).await;
        (created, started.elapsed())
    };
    let converged = || {
        progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .children_and_status_at
            .is_some()
    };
    // Under load a change waits behind the backlog: as long as the whole phase, if need be.
    let under_load = measure_latency(env, args.latency_samples, args.timeout, converged);
    let ((created, create_time), latency_load) = futures::join!(create, under_load);
    created?;
    row.create_crs = create_time;
    row.latency_load = latency_load?;
    let at = wait_progress(
        &progress,
        &mut op,
        args.timeout,
        "children and status",
        |p| p.children_and_status_at,
    )
    .await?;
    row.children_and_status = at - started;
    row.converging_cpu = (
        cpu_time(op.pid()).saturating_sub(cpu_before.0),
        cpu_time(std::process::id()).saturating_sub(cpu_before.1),
    );
    if let Some(server) = &env.server {
        let counts = server.request_counts();
        log(format!(
            "N={n}: requests while converging (all clients):\n{counts}"
        ));
    }
    row.converging = env.requests_since(&mark);
    row.rss_converged = op.memory().0;
    log(format!(
        "N={n}: CRs created in {}, children and status in {}, {}",
        secs(row.create_crs),
        secs(row.children_and_status),
        mib(row.rss_converged)
    ));
    let at = wait_progress(&progress, &mut op, args.timeout, "pods ready", |p| {
        p.pods_ready_at
    })
    .await?;
    row.pods_ready = at - started;
    tracker.abort();
    let _ = tracker.await;
    // Let the last status writes and events settle, then count a resync window.
    tokio::time::sleep(args.resync_period + Duration::from_secs(1)).await;
    row.rss_pods = op.memory().0;
    log(format!(
        "N={n}: pods ready in {}, {}",
        secs(row.pods_ready),
        mib(row.rss_pods)
    ));
    let mark = env.mark();
    let cpu_before = cpu_time(op.pid());
    tokio::time::sleep(args.steady_window).await;
    row.steady_cpu = cpu_time(op.pid()).saturating_sub(cpu_before);
    row.steady = env.requests_since(&mark);
    if row.steady.is_some() {
        log(format!(
            "N={n}: requests in {}: {} (operator CPU {})",
            secs(args.steady_window),
            row.steady.as_ref().map(Requests::show).unwrap_or_default(),
            secs(row.steady_cpu)
        ));
    }
    let (rss, peak) = op.memory();
    row.rss_pods = row.rss_pods.max(rss);
    row.rss_peak = peak;
    op.check_alive()?;
    Ok(())
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn ratio(a: Duration, b: Option<Duration>) -> String {
    match b {
        Some(b) if !b.is_zero() => format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64()),
        _ => "–".into(),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        len if len % 2 == 1 => Some(values[mid]),
        _ => Some((values[mid - 1] + values[mid]) / 2.0),
    }
}

fn median_duration(values: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    median(values.into_iter().map(|d| d.as_secs_f64()).collect()).map(Duration::from_secs_f64)
}

/// `values` as "median (min–max)" with two decimals and `unit`; one value alone; "–" for none.
pub(crate) fn spread(values: Vec<f64>, unit: &str) -> String {
    let (Some(min), Some(max)) = (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) else {
        return "–".into();
    };
    let count = values.len();
    let mid = median(values).unwrap_or(min);
    if count == 1 {
        format!("{mid:.2}{unit}")
    } else {
        format!("{mid:.2}{unit} ({min:.2}–{max:.2}{unit}, {count} runs)")
    }
}

impl Row {
    fn bounds(&self) -> Vec<Duration> {
        self.pairs.iter().filter_map(|p| p.bound).collect()
    }

    /// The pair whose catch-up is the median one (the lower middle for an even count).
    fn median_pair(&self) -> Option<&Pair> {
        let mut pairs: Vec<&Pair> = self.pairs.iter().collect();
        pairs.sort_by_key(|p| p.catch_up);
        pairs.get(pairs.len().saturating_sub(1) / 2).copied()
    }
}

/// The results as one Markdown table, a column per run.
fn table(args: &BenchArgs, rows: &[Row]) -> String {
    let mut out = String::new();
    let header: Vec<String> = rows
        .iter()
        .map(|r| {
            if args.max_concurrent_reconciles.len() > 1 {
                format!("N={} (reconciles {})", r.n, r.reconciles)
            } else {
                format!("N={}", r.n)
            }
        })
        .collect();
    let _ = writeln!(out, "| | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(rows.len()));
    // On a real cluster the API server is another process: the CPU beside the operator's
    // is the bench's own client, and requests are the operator's, read from the audit log.
    let real = args.kubeconfig.is_some();
    let others = if real {
        "bench client"
    } else {
        "API server + simulator + clients"
    };
    let whose = if real {
        "the operator's (audit log)"
    } else {
        "all clients"
    };
    let mut line = |label: &str, cell: &dyn Fn(&Row) -> String| {
        let cells: Vec<String> = rows.iter().map(cell).collect();
        let _ = writeln!(out, "| {label} | {} |", cells.join(" | "));
    };
    line(
        &format!(
            "raw-write bound (creates of Deployment, 2 Services, PDB + status patch; {} in flight)",
            args.concurrency
        ),
        &|r| spread(r.bounds().iter().map(Duration::as_secs_f64).collect(), " s"),
    );
    line(
        &format!(
            "  CPU: {}",
            if real {
                "bench client"
            } else {
                "API server + simulator + client"
            }
        ),
        &|r| {
            let cpu = r
                .pairs
                .iter()
                .filter(|p| p.bound.is_some())
                .map(|p| p.bound_cpu);
            median_duration(cpu).map(secs).unwrap_or_else(|| "–".into())
        },
    );
    line("creating the N Memcacheds (client)", &|r| {
        secs(r.create_crs)
    });
    line("convergence: children + status", &|r| {
        secs(r.children_and_status)
    });
    line("  ratio to the bound (median)", &|r| {
        ratio(r.children_and_status, median_duration(r.bounds()))
    });
    line(&format!("requests until then, {whose} (writes)"), &|r| {
        r.converging
            .as_ref()
            .map(|s| format!("{} ({})", s.show(), s.writes))
            .unwrap_or_else(|| "n/a".into())
    });
    line(
        &format!("CPU while converging: operator / {others}"),
        &|r| {
            format!(
                "{} / {}",
                secs(r.converging_cpu.0),
                secs(r.converging_cpu.1)
            )
        },
    );
    line(
        "catch-up: CRs created first, operator started → children + status",
        &|r| {
            spread(
                r.pairs.iter().map(|p| p.catch_up.as_secs_f64()).collect(),
                " s",
            )
        },
    );
    line("  ratio to the bound (median of the paired ratios)", &|r| {
        spread(r.pairs.iter().filter_map(Pair::ratio).collect(), "×")
    });
    line(
        "  of which start-up (process start → first child written)",
        &|r| {
            median_duration(r.pairs.iter().filter_map(|p| p.startup))
                .map(secs)
                .unwrap_or_else(|| "–".into())
        },
    );
    line(
        &format!("  requests (writes), the median catch-up's, {whose}"),
        &|r| {
            r.median_pair()
                .and_then(|p| p.requests.as_ref())
                .map(|s| format!("{} ({})", s.show(), s.writes))
                .unwrap_or_else(|| "n/a".into())
        },
    );
    line(&format!("  CPU: operator / {others} (medians)"), &|r| {
        let operator = median_duration(r.pairs.iter().map(|p| p.cpu.0));
        let rest = median_duration(r.pairs.iter().map(|p| p.cpu.1));
        match (operator, rest) {
            (Some(operator), Some(rest)) => format!("{} / {}", secs(operator), secs(rest)),
            _ => "–".into(),
        }
    });
    line("convergence: all pods ready in status", &|r| {
        secs(r.pods_ready)
    });
    line(
        &format!(
            "steady state: writes in {} (resync {})",
            secs(args.steady_window),
            secs(args.resync_period)
        ),
        &|r| {
            r.steady
                .as_ref()
                .map(|s| s.writes.to_string())
                .unwrap_or_else(|| "n/a".into())
        },
    );
    line(&format!("steady state: requests by verb, {whose}"), &|r| {
        r.steady
            .as_ref()
            .map(Requests::show)
            .unwrap_or_else(|| "n/a".into())
    });
    line("steady state: operator CPU in the window", &|r| {
        secs(r.steady_cpu)
    });
    line("event→reconcile p50 / p99, idle", &|r| {
        r.latency_idle.show()
    });
    line(
        "event→reconcile p50 / p99, under the N-object load",
        &|r| r.latency_load.show(),
    );
    line("operator RSS idle (caches synced, no CRs)", &|r| {
        mib(r.rss_idle)
    });
    line("operator RSS, N converged", &|r| mib(r.rss_converged));
    line("operator RSS, N converged + 3N pods cached", &|r| {
        mib(r.rss_pods)
    });
    line("operator peak RSS (VmHWM)", &|r| mib(r.rss_peak));
    line("wall time of this column", &|r| secs(r.wall));
    out
}

/// Runs the benchmark and prints the table to stdout (progress goes to stderr).
pub async fn run(args: BenchArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("mc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result?;
    println!("{}", table(&args, &rows));
    Ok(())
}

async fn run_in(args: &BenchArgs, dir: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in &args.n {
        for &reconciles in &args.max_concurrent_reconciles {
            let started = Instant::now();
            let mut row = Row {
                n,
                reconciles,
                ..Row::default()
            };
            operator_run(args, dir, n, reconciles, &mut row).await?;
            row.wall = started.elapsed();
            log(format!(
                "N={n} reconciles={reconciles}: done in {}",
                secs(row.wall)
            ));
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latency {
            samples: (1..=100).map(Duration::from_millis).collect(),
        };
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(Latency::default().percentile(50.0), None);
    }

    #[test]
    fn the_ratio_is_the_median_of_the_paired_ratios() {
        let pair = |bound: u64, catch_up: u64| Pair {
            bound: Some(Duration::from_millis(bound)),
            catch_up: Duration::from_millis(catch_up),
            ..Pair::default()
        };
        // One pair in a slow spell (a fast bound, a slow catch-up) does not decide the result;
        // the median catch-up over the median bound would say 1.95 / 1.3 = 1.5×.
        let row = Row {
            pairs: vec![
                pair(1000, 1100),
                pair(2000, 2400),
                pair(1600, 1900),
                pair(1000, 2000),
            ],
            ..Row::default()
        };
        let ratios: Vec<f64> = row.pairs.iter().filter_map(Pair::ratio).collect();
        let mid = median(ratios.clone()).unwrap_or_default();
        assert!((mid - (1.1875 + 1.2) / 2.0).abs() < 1e-9, "{mid}");
        assert_eq!(spread(ratios, "×"), "1.19× (1.10–2.00×, 4 runs)");
        assert_eq!(
            row.median_pair().map(|p| p.catch_up.as_millis()),
            Some(1900)
        );
        assert_eq!(spread(vec![1.5], " s"), "1.50 s");
        assert_eq!(spread(Vec::new(), " s"), "–");
        let skipped = Pair {
            bound: None,
            ..pair(0, 1000)
        };
        assert_eq!(skipped.ratio(), None);
    }

    /// The tracker's whole-store read (at its start and after a gap in the change feed)
    /// finds every kind it tracks: the Memcacheds under their own API group, and the
    /// operator's Deployments and Services.
    #[tokio::test]
    async fn the_store_read_finds_memcacheds_and_children() {
        let server = apisim::ApiServer::new();
        let client = server.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &Memcached::crd())
            .await
            .unwrap();
        let pp = PostParams::default();
        let mc = Api::<Memcached>::namespaced(client.clone(), "default")
            .create(&pp, &memcached("mc-1", 3).unwrap())
            .await
            .unwrap();
        Api::<Deployment>::namespaced(client.clone(), "default")
            .create(
                &pp,
                &builders::desired_deployment(&mc, &BuildSettings::default()).unwrap(),
            )
            .await
            .unwrap();
        Api::<Service>::namespaced(client, "default")
            .create(&pp, &builders::desired_service(&mc).unwrap())
            .await
            .unwrap();
        let mut seen: Vec<String> = read_store(&server, "default")
            .into_iter()
            .map(|s| match s {
                Seen::Memcached(name, ..) => format!("memcached {name}"),
                Seen::Deployment(name) => format!("deployment {name}"),
                Seen::Service(name) => format!("service {name}"),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, ["deployment mc-1", "memcached mc-1", "service mc-1"]);
        assert!(read_store(&server, "other").is_empty());
    }

    #[test]
    fn stored_objects_are_read_as_the_typed_tracker_reads_them() {
        let mc = |status: serde_json::Value| {
            json!({"apiVersion": "cache.example.com/v1", "kind": "Memcached",
                "metadata": {"name": "mc-1", "namespace": "b", "generation": 2},
                "spec": {"size": 2}, "status": status})
        };
        let parts = |seen: Option<Seen>| match seen {
            Some(Seen::Memcached(name, current, ready)) => Some((name, current, ready)),
            _ => None,
        };
        let yes = |current, ready| Some(("mc-1".to_string(), current, ready));
        for (status, want) in [
            (json!(null), yes(false, false)),
            (json!({"observedGeneration": 1}), yes(false, false)),
            (
                json!({"observedGeneration": 2, "nodes": ["p"], "readyReplicas": 1}),
                yes(true, false),
            ),
            (
                json!({"observedGeneration": 2, "nodes": ["p", "q"], "readyReplicas": 2}),
                yes(true, true),
            ),
        ] {
            let obj = mc(status);
            let typed: Memcached = serde_json::from_value(obj.clone()).unwrap();
            assert_eq!(parts(Some(summary(&typed))), want, "typed: {obj}");
            assert_eq!(
                parts(seen_in_store("memcacheds", &obj, "b")),
                want,
                "stored: {obj}"
            );
        }
        // another namespace's objects, and children the operator does not manage, are not counted
        assert!(seen_in_store("memcacheds", &mc(json!(null)), "other").is_none());
        let child = |labels: serde_json::Value| json!({"metadata": {"name": "mc-1", "namespace": "b", "labels": labels}});
        let owned = child(json!({LABEL_MANAGED_BY: MANAGED_BY}));
        assert!(
            matches!(seen_in_store("deployments", &owned, "b"), Some(Seen::Deployment(n)) if n == "mc-1")
        );
        assert!(
            matches!(seen_in_store("services", &owned, "b"), Some(Seen::Service(n)) if n == "mc-1")
        );
        assert!(seen_in_store("deployments", &child(json!({})), "b").is_none());
        assert!(seen_in_store("pods", &owned, "b").is_none());
    }
}
