//! `bench side-by-side`: the operator and the seeds' Go operator (`bench/peer`: the
//! Kubebuilder Memcached controller on controller-runtime) doing the same job on the same
//! real control plane (`make dev-cluster`: kube-apiserver with kwok nodes, pods turn Ready).
//!
//! For each N and run, every contender gets a fresh namespace holding the same N size-3
//! Memcacheds, created before it starts (untimed); then it is started and timed until every
//! Memcached is *done*: its Deployment asks for 3 replicas, 3 of its pods are Ready, and its
//! `status.nodes` names exactly those pods. Contenders:
//! - `bound` / `peer-bound`: the raw-write bound of each operator's own writes, by a bare
//!   client: create the children that operator creates (ours: Deployment, Service,
//!   headless Service, PDB, from our builders; the peer's: Deployment and Service as the
//!   seed builds them), then, once a Memcached's pods are Ready, one status write naming
//!   them. `C` requests in flight.
//! - `peer`: the peer as generated (controller-runtime defaults: one worker, no client-side
//!   rate limit in current controller-runtime).
//! - `peer-tuned`: `--max-concurrent-reconciles=16 --kube-api-qps=1000 --kube-api-burst=2000`.
//! - `ours`: `memcached-operator run` (16 reconciles, its defaults otherwise).
//!
//! Per process contender: the API requests it made by verb, as the API server's audit log
//! records them under its User-Agent (`apiserver_request_total` has no client label); its
//! CPU seconds and peak RSS (`/proc`); requests in a steady window of two resync periods
//! (both given the same resync period); and the event→reconcile latency of a scale change
//! (spec.size of a separate Memcached changed 3 ↔ 4 until its Deployment follows) while
//! the N converge (under load, at most one change a second) and after (idle).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders::{self, BuildSettings};
use memcached_operator::cmd::parse_duration;
use serde_json::{Value, json};

use crate::measure::{audit_requests, cpu_time, median, memory_kib, mib, ms, secs, spread};
use crate::{BoxError, Result, create_namespace, log};

const SIZE: usize = 3;
const PREFIX: &str = "sbs-";
const LATENCY_CR: &str = "latency";

/// Flags of `bench side-by-side`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Run every contender in a namespace of this cluster (its namespaces are deleted
    /// and waited for between runs) instead of on a fresh control plane each (the default:
    /// the pinned newest Kubernetes with kwok nodes, started in about 3 s; `make
    /// controlplane` builds it). The CRD must be installed.
    #[arg(long, requires = "audit_log")]
    pub kubeconfig: Option<PathBuf>,
    /// With `--kubeconfig`: the API server's audit log (metadata level, as `make
    /// dev-cluster` writes `bin/dev-cluster.audit.log`).
    #[arg(long, requires = "kubeconfig")]
    pub audit_log: Option<PathBuf>,
    /// Numbers of Memcacheds (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub n: Vec<usize>,
    /// Runs per N; the contenders' order rotates from run to run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub runs: u16,
    /// Contenders (comma-separated): bound, peer-bound, peer, peer-tuned, ours.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bound,peer-bound,peer,peer-tuned,ours"
    )]
    pub contenders: Vec<String>,
    /// Requests in flight of the bounds' client and of the client creating the Memcacheds.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// `memcached-operator` (default: next to this binary).
    #[arg(long)]
    pub operator_bin: Option<PathBuf>,
    /// The peer (default: bench/peer/bin/memcached-peer; `bench/peer/build.sh` builds it).
    #[arg(long)]
    pub peer_bin: Option<PathBuf>,
    /// Resync period given to both operators, so the steady window sees resyncs.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub resync_period: Duration,
    /// Scale changes timed at idle.
    #[arg(long, default_value_t = 20)]
    pub latency_samples: usize,
    /// Longest wait for a contender to converge.
    #[arg(long, default_value = "20m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Contender {
    Bound,
    PeerBound,
    Peer,
    PeerTuned,
    Ours,
}

impl Contender {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "bound" => Self::Bound,
            "peer-bound" => Self::PeerBound,
            "peer" => Self::Peer,
            "peer-tuned" => Self::PeerTuned,
            "ours" => Self::Ours,
            other => return Err(format!("unknown contender {other:?}").into()),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bound => "bound (ours' writes)",
            Self::PeerBound => "bound (peer's writes)",
            Self::Peer => "peer as generated",
            Self::PeerTuned => "peer tuned",
            Self::Ours => "memcached-operator",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Bound => "bound",
            Self::PeerBound => "pbound",
            Self::Peer => "peer",
            Self::PeerTuned => "ptuned",
            Self::Ours => "ours",
        }
    }

    /// The bound of this contender's own writes.
    fn bound(self) -> Option<Self> {
        match self {
            Self::Peer | Self::PeerTuned => Some(Self::PeerBound),
            Self::Ours => Some(Self::Bound),
            _ => None,
        }
    }

    /// The User-Agent its requests carry.
    fn user_agent(self) -> Option<&'static str> {
        match self {
            Self::Peer => Some("memcached-peer/generated"),
            Self::PeerTuned => Some("memcached-peer/tuned"),
            Self::Ours => Some("memcached-operator/"),
            _ => None,
        }
    }
}

/// What one contender measured in one run.
#[derive(Clone, Debug, Default)]
struct Measured {
    converged: Duration,
    cpu: Option<Duration>,
    peak_rss_kib: Option<u64>,
    requests: BTreeMap<String, u64>,
    writes: u64,
    steady: Option<(u64, u64)>,
    latency_load: Vec<Duration>,
    latency_idle: Vec<Duration>,
    /// Writes by every client (the contender, kube-controller-manager, the scheduler,
    /// kwok, …) from the start until done: the work the contender set off in the cluster.
    cluster_writes: u64,
    /// CPU of each control-plane component from the start until done.
    cluster_cpu: BTreeMap<String, Duration>,
}

/// What the tracker sees: per Memcached, its Deployment's replicas, its Ready pods and its
/// `status.nodes`.
#[derive(Default)]
struct Track {
    replicas: HashMap<String, i32>,
    nodes: HashMap<String, BTreeSet<String>>,
    /// pod → (Memcached, Ready)
    pods: HashMap<String, (String, bool)>,
    ready: HashMap<String, BTreeSet<String>>,
    done: BTreeSet<String>,
    synced: usize,
}

impl Track {
    fn recompute(&mut self, mc: &str) {
        let ready = self.ready.get(mc);
        let ok = self.replicas.get(mc) == Some(&(SIZE as i32))
            && ready.is_some_and(|r| r.len() == SIZE)
            && ready == self.nodes.get(mc);
        if ok && mc.starts_with(PREFIX) {
            self.done.insert(mc.to_string());
        } else {
            self.done.remove(mc);
        }
    }

    fn set_pod(&mut self, pod: &str, owner: Option<String>, is_ready: bool) {
        if let Some((old, _)) = self.pods.remove(pod) {
            if let Some(r) = self.ready.get_mut(&old) {
                r.remove(pod);
            }
            self.recompute(&old);
        }
        if let Some(owner) = owner {
            if is_ready {
                self.ready
                    .entry(owner.clone())
                    .or_default()
                    .insert(pod.to_string());
            }
            self.pods.insert(pod.to_string(), (owner.clone(), is_ready));
            self.recompute(&owner);
        }
    }
}

/// The Memcached a pod belongs to, by either operator's labels.
fn pod_owner(pod: &Pod) -> Option<String> {
    let labels = pod.metadata.labels.as_ref()?;
    labels
        .get(builders::LABEL_INSTANCE)
        .or_else(|| labels.get("memcached_cr"))
        .cloned()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

enum Seen {
    Memcached(String, Option<BTreeSet<String>>),
    Deployment(String, Option<i32>),
    Pod(String, Option<(String, bool)>),
    Synced,
}

fn events<K>(
    api: Api<K>,
    f: fn(watcher::Event<K>) -> Vec<Seen>,
) -> futures::stream::BoxStream<'static, Seen>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, watcher::Config::default())
        .filter_map(|e| async move { e.ok() })
        .flat_map(move |e| futures::stream::iter(f(e)))
        .boxed()
}

/// Watches the namespace and keeps a [`Track`].
fn track(client: &Client, ns: &str) -> (Arc<Mutex<Track>>, tokio::task::JoinHandle<()>) {
    let track = Arc::new(Mutex::new(Track::default()));
    let mcs = events(
        Api::<Memcached>::namespaced(client.clone(), ns),
        |e| match e {
            watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                let nodes = m.status.as_ref().map(|s| s.nodes.iter().cloned().collect());
                vec![Seen::Memcached(m.name_any(), nodes)]
            }
            watcher::Event::Delete(m) => vec![Seen::Memcached(m.name_any(), None)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        },
    );
    let deployments = events(
        Api::<Deployment>::namespaced(client.clone(), ns),
        |e| match e {
            watcher::Event::Apply(d) | watcher::Event::InitApply(d) => {
                let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                vec![Seen::Deployment(d.name_any(), replicas)]
            }
            watcher::Event::Delete(d) => vec![Seen::Deployment(d.name_any(), None)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        },
    );
    let pods = events(Api::<Pod>::namespaced(client.clone(), ns), |e| match e {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let owner = pod_owner(&p).map(|o| (o, pod_ready(&p)));
            vec![Seen::Pod(p.name_any(), owner)]
        }
        watcher::Event::Delete(p) => vec![Seen::Pod(p.name_any(), None)],
        watcher::Event::InitDone => vec![Seen::Synced],
        watcher::Event::Init => vec![],
    });
    let mut all = futures::stream::select_all([mcs, deployments, pods]);
    let shared = track.clone();
    let task = tokio::spawn(async move {
        while let Some(seen) = all.next().await {
            let mut t = shared.lock().unwrap_or_else(|e| e.into_inner());
            match seen {
                Seen::Memcached(name, nodes) => {
                    match nodes {
                        Some(nodes) => t.nodes.insert(name.clone(), nodes),
                        None => t.nodes.remove(&name),
                    };
                    t.recompute(&name);
                }
                Seen::Deployment(name, replicas) => {
                    match replicas {
                        Some(r) => t.replicas.insert(name.clone(), r),
                        None => t.replicas.remove(&name),
                    };
                    t.recompute(&name);
                }
                Seen::Pod(name, owner) => {
                    let (owner, ready) = match owner {
                        Some((o, r)) => (Some(o), r),
                        None => (None, false),
                    };
                    t.set_pod(&name, owner, ready);
                }
                Seen::Synced => t.synced += 1,
            }
        }
    });
    (track, task)
}

fn lock(track: &Mutex<Track>) -> std::sync::MutexGuard<'_, Track> {
    track.lock().unwrap_or_else(|e| e.into_inner())
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A contender's process, killed on drop.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(
        args: &Args,
        target: &Target,
        who: Contender,
        ns: &str,
        dir: &Path,
    ) -> Result<Process> {
        let log = dir.join(format!("{}-{ns}.log", who.tag()));
        let file = std::fs::File::create(&log)?;
        let resync = format!("{}ms", args.resync_period.as_millis());
        let mut cmd = match who {
            Contender::Ours => {
                let bin = match &args.operator_bin {
                    Some(b) => b.clone(),
                    None => crate::sibling_binary("memcached-operator")?,
                };
                let mut cmd = Command::new(bin);
                cmd.arg("run")
                    .arg("--metrics-bind-address=0")
                    .arg("--health-probe-bind-address=0")
                    .arg(format!("--namespace={ns}"))
                    .arg(format!("--resync-period={resync}"))
                    .env("ENABLE_WEBHOOKS", "false")
                    .env("RUST_LOG", "warn");
                cmd
            }
            Contender::Peer | Contender::PeerTuned => {
                let bin = match &args.peer_bin {
                    Some(b) => b.clone(),
                    None => memcached_operator_root().join("bench/peer/bin/memcached-peer"),
                };
                if !bin.exists() {
                    return Err(format!(
                        "{} is missing: build it with bench/peer/build.sh",
                        bin.display()
                    )
                    .into());
                }
                let mut cmd = Command::new(bin);
                cmd.arg(format!("--namespace={ns}"))
                    .arg(format!("--sync-period={resync}"))
                    .arg("--zap-log-level=error");
                if who == Contender::PeerTuned {
                    cmd.args([
                        "--max-concurrent-reconciles=16",
                        "--kube-api-qps=1000",
                        "--kube-api-burst=2000",
                        "--user-agent=tuned",
                    ]);
                } else {
                    cmd.arg("--user-agent=generated");
                }
                cmd
            }
            _ => return Err("a bound is not a process".into()),
        };
        cmd.env("KUBECONFIG", &target.kubeconfig)
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .stdout(file.try_clone()?)
            .stderr(file);
        Ok(Process {
            child: cmd.spawn()?,
            log,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("the contender exited ({status}):\n{text}").into());
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The repository (this crate is `crates/bench`).
fn memcached_operator_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn audit_offset(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn memcached(name: &str, size: usize) -> Result<Memcached> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name},
        "spec": {"size": size},
    }))?)
}

/// The peer's Deployment and Service for `mc`, as the seed builds them.
fn peer_children(mc: &Memcached) -> Result<Vec<(ApiResource, Value)>> {
    let name = mc.name_any();
    let owner = json!([{
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "name": name, "uid": mc.uid().unwrap_or_default(),
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let labels = json!({"app": "memcached", "memcached_cr": name});
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "ownerReferences": owner},
        "spec": {
            "replicas": mc.spec.size,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "memcached", "image": "memcached:1.4.36-alpine",
                "command": ["memcached", "-m=64", "-o", "modern", "-v"],
                "ports": [{"containerPort": 11211, "name": "memcached"}],
            }]}},
        },
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "ownerReferences": owner},
        "spec": {"selector": labels, "ports": [{"port": 11211, "name": name}]},
    });
    Ok(vec![
        (ApiResource::erase::<Deployment>(&()), deployment),
        (
            ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            service,
        ),
    ])
}

/// Our children for `mc`, from the operator's builders.
fn our_children(mc: &Memcached) -> Result<Vec<(ApiResource, Value)>> {
    let settings = BuildSettings::default();
    let service = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let mut children = vec![
        (
            ApiResource::erase::<Deployment>(&()),
            serde_json::to_value(builders::desired_deployment(mc, &settings)?)?,
        ),
        (
            service.clone(),
            serde_json::to_value(builders::desired_service(mc)?)?,
        ),
        (
            service,
            serde_json::to_value(builders::desired_headless_service(mc)?)?,
        ),
    ];
    if let Some(pdb) = builders::desired_pdb(mc)? {
        children.push((
            ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&()),
            serde_json::to_value(pdb)?,
        ));
    }
    Ok(children)
}

/// The raw-write bound: children of every Memcached, then a status write per Memcached as
/// soon as its pods are Ready.
async fn bound(
    client: &Client,
    ns: &str,
    crs: &[Memcached],
    who: Contender,
    track: &Arc<Mutex<Track>>,
    concurrency: usize,
    timeout: Duration,
) -> Result<u64> {
    let pp = PostParams::default();
    let writes = std::sync::atomic::AtomicU64::new(0);
    futures::stream::iter(crs)
        .map(|mc| {
            let (pp, writes) = (&pp, &writes);
            async move {
                let children = if who == Contender::PeerBound {
                    peer_children(mc)?
                } else {
                    our_children(mc)?
                };
                for (resource, object) in children {
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(client.clone(), ns, &resource);
                    api.create(pp, &serde_json::from_value(object)?).await?;
                    writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let mut pending: BTreeSet<String> = crs.iter().map(|m| m.name_any()).collect();
    let deadline = Instant::now() + timeout;
    while !pending.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("{} Memcacheds' pods not Ready in time", pending.len()).into());
        }
        let ready: Vec<(String, Vec<String>)> = {
            let t = lock(track);
            pending
                .iter()
                .filter_map(|name| {
                    let pods = t.ready.get(name)?;
                    (pods.len() == SIZE).then(|| (name.clone(), pods.iter().cloned().collect()))
                })
                .collect()
        };
        if ready.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        futures::stream::iter(&ready)
            .map(|(name, pods)| {
                let (api, writes) = (&api, &writes);
                async move {
                    api.patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"nodes": pods}})),
                    )
                    .await?;
                    writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok::<_, BoxError>(())
                }
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        for (name, _) in ready {
            pending.remove(&name);
        }
    }
    Ok(writes.into_inner())
}

/// Times one scale change of the latency Memcached until its Deployment follows.
async fn scale_latency(
    client: &Client,
    ns: &str,
    track: &Arc<Mutex<Track>>,
    size: i32,
) -> Result<Duration> {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    api.patch(
        LATENCY_CR,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": size}})),
    )
    .await?;
    wait_until("the latency Deployment", Duration::from_secs(120), || {
        lock(track).replicas.get(LATENCY_CR) == Some(&size)
    })
    .await?;
    Ok(started.elapsed())
}

/// Where one contender runs: a fresh control plane (dropped, so stopped, afterwards) or a
/// namespace of a given cluster.
struct Target {
    client: Client,
    kubeconfig: PathBuf,
    audit: PathBuf,
    ns: String,
    control_plane: Option<envtest::ControlPlane>,
}

impl Target {
    async fn new(args: &Args, who: Contender, n: usize, run: u16) -> Result<Target> {
        if let (Some(kubeconfig), Some(audit)) = (&args.kubeconfig, &args.audit_log) {
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(kubeconfig)?,
                &Default::default(),
            )
            .await?;
            let client = Client::try_from(config)?;
            memcached_operator::crd::check_installed(&client, None).await?;
            let ns = format!(
                "{PREFIX}{}-{n}-{run}-{}",
                who.tag(),
                jiff::Timestamp::now().as_second() % 100_000
            );
            create_namespace(&client, &ns).await?;
            return Ok(Target {
                client,
                kubeconfig: kubeconfig.clone(),
                audit: audit.clone(),
                ns,
                control_plane: None,
            });
        }
        let cp = envtest::ControlPlane::start(envtest::Options::new(envtest::Kube::Newest)).await?;
        let client = cp.client().await?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.patch(
            "memcacheds.memcached.cache.example.com",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&Memcached::crd()),
        )
        .await?;
        kube::runtime::wait::await_condition(
            crds,
            "memcacheds.memcached.cache.example.com",
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await?;
        let ns = cp.namespace(&format!("{PREFIX}{}", who.tag())).await?;
        Ok(Target {
            client,
            kubeconfig: cp.kubeconfig().to_path_buf(),
            audit: cp.audit_log(),
            ns,
            control_plane: Some(cp),
        })
    }

    async fn finish(self) {
        if self.control_plane.is_none() {
            delete_namespace(&self.client, &self.ns).await;
        }
    }
}

/// One contender, one run, in a fresh namespace or on a fresh control plane.
async fn run_one(args: &Args, dir: &Path, who: Contender, n: usize, run: u16) -> Result<Measured> {
    let target = Target::new(args, who, n, run).await?;
    let result = measure(args, dir, &target, who, n).await;
    target.finish().await;
    result
}

async fn measure(
    args: &Args,
    dir: &Path,
    target: &Target,
    who: Contender,
    n: usize,
) -> Result<Measured> {
    let (client, ns) = (&target.client, target.ns.clone());
    let api: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..n).map(|i| format!("{PREFIX}{i:05}")).collect();
    let crs: Vec<Memcached> = futures::stream::iter(names)
        .map(|name| {
            let api = &api;
            async move {
                Ok::<_, BoxError>(
                    api.create(&PostParams::default(), &memcached(&name, SIZE)?)
                        .await?,
                )
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect()
        .await?;
    let process_contender = who.user_agent().is_some();
    if process_contender {
        api.create(&PostParams::default(), &memcached(LATENCY_CR, SIZE)?)
            .await?;
    }
    let (track, tracker) = track(client, &ns);
    wait_until("the tracker's watches", Duration::from_secs(60), || {
        lock(&track).synced >= 3
    })
    .await?;
    let mark = audit_offset(&target.audit);
    let mut measured = Measured::default();
    let components = target
        .control_plane
        .as_ref()
        .map(|cp| cp.component_pids())
        .unwrap_or_default();
    let cpu_before: Vec<Duration> = components.iter().map(|(_, pid)| cpu_time(*pid)).collect();
    let started = Instant::now();
    let result: Result<()> = async {
        match who {
            Contender::Bound | Contender::PeerBound => {
                measured.writes = bound(
                    client,
                    &ns,
                    &crs,
                    who,
                    &track,
                    args.concurrency,
                    args.timeout,
                )
                .await?;
                wait_until("every Memcached done", args.timeout, || {
                    lock(&track).done.len() == n
                })
                .await?;
                measured.converged = started.elapsed();
                account_cluster(&mut measured, target, mark, &components, &cpu_before).await?;
            }
            _ => {
                let mut process = Process::spawn(args, target, who, &ns, dir)?;
                // Scale changes of the latency Memcached (3 ↔ 4, so no PDB comes and goes)
                // while the N converge, at most one a second so the probe adds little load.
                let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let probe = {
                    let (client, ns, track, stop) =
                        (client.clone(), ns.clone(), track.clone(), stop.clone());
                    tokio::spawn(async move {
                        let mut samples = Vec::new();
                        let mut size = SIZE as i32;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            if lock(&track).replicas.get(LATENCY_CR) != Some(&size) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                            let began = Instant::now();
                            size = 2 * SIZE as i32 + 1 - size;
                            match scale_latency(&client, &ns, &track, size).await {
                                Ok(d) => samples.push(d),
                                Err(_) => break,
                            }
                            tokio::time::sleep(
                                Duration::from_secs(1).saturating_sub(began.elapsed()),
                            )
                            .await;
                        }
                        (samples, size)
                    })
                };
                let mut converged = None;
                while converged.is_none() {
                    process.check_alive()?;
                    if started.elapsed() > args.timeout {
                        return Err(format!(
                            "{} did not converge in {:?} ({} of {n} done)",
                            who.name(),
                            args.timeout,
                            lock(&track).done.len()
                        )
                        .into());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if lock(&track).done.len() == n {
                        converged = Some(started.elapsed());
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let (samples, mut size) = probe.await?;
                measured.latency_load = samples;
                measured.converged = converged.unwrap_or_default();
                measured.cpu = Some(cpu_time(process.pid()));
                account_cluster(&mut measured, target, mark, &components, &cpu_before).await?;
                let agent = who.user_agent().unwrap_or_default();
                // Give the audit log a moment to be written through.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let (by_verb, writes) = audit_requests(&target.audit, mark, agent)?;
                measured.requests = by_verb;
                measured.writes = writes;
                // Steady state: two resync periods with nothing changing.
                tokio::time::sleep(Duration::from_secs(2)).await;
                let steady_mark = audit_offset(&target.audit);
                tokio::time::sleep(args.resync_period * 2).await;
                let (steady, steady_writes) = audit_requests(&target.audit, steady_mark, agent)?;
                measured.steady = Some((steady.values().sum::<u64>() / 2, steady_writes / 2));
                for _ in 0..args.latency_samples {
                    size = 2 * SIZE as i32 + 1 - size;
                    measured
                        .latency_idle
                        .push(scale_latency(client, &ns, &track, size).await?);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                process.check_alive()?;
                measured.peak_rss_kib = Some(memory_kib(process.pid()).1);
            }
        }
        Ok(())
    }
    .await;
    tracker.abort();
    result.map(|()| measured)
}

/// Records the cluster's work from the start until now: every client's writes in the audit
/// log, and each control-plane component's CPU.
async fn account_cluster(
    measured: &mut Measured,
    target: &Target,
    mark: u64,
    components: &[(String, u32)],
    cpu_before: &[Duration],
) -> Result<()> {
    for ((name, pid), before) in components.iter().zip(cpu_before) {
        measured
            .cluster_cpu
            .insert(name.clone(), cpu_time(*pid).saturating_sub(*before));
    }
    // The audit log is written a moment after each request completes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    measured.cluster_writes = audit_requests(&target.audit, mark, "")?.1;
    Ok(())
}

async fn delete_namespace(client: &Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = namespaces.delete(ns, &DeleteParams::background()).await {
        log(format!("could not delete namespace {ns}: {e}"));
        return;
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if let Ok(None) = namespaces.get_opt(ns).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    log(format!(
        "namespace {ns} still terminating after 10 min; going on"
    ));
}

fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

pub async fn run(args: Args) -> Result<()> {
    let contenders: Vec<Contender> = args
        .contenders
        .iter()
        .map(|c| Contender::parse(c))
        .collect::<Result<_>>()?;
    let dir = std::env::temp_dir().join(format!("mc-sbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut report = String::new();
    for &n in &args.n {
        // results[contender] = one Measured per run
        let mut results: BTreeMap<Contender, Vec<Measured>> = BTreeMap::new();
        for run in 0..args.runs {
            let k = contenders.len();
            for i in 0..k {
                let who = contenders[(i + run as usize) % k];
                log(format!("N={n} run {}: {}", run + 1, who.name()));
                let m = run_one(&args, &dir, who, n, run).await?;
                log(format!(
                    "N={n} run {}: {} converged in {} ({} writes)",
                    run + 1,
                    who.name(),
                    secs(m.converged),
                    m.writes
                ));
                results.entry(who).or_default().push(m);
            }
        }
        report.push_str(&table(n, &contenders, &results));
        println!("{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{report}");
    Ok(())
}

/// Median and range of counts: `7955 (7947–8091)`.
fn count_cell(v: Vec<u64>) -> String {
    let mid = median(v.iter().map(|&w| w as f64).collect()).unwrap_or(0.0);
    format!(
        "{mid:.0} ({}–{})",
        v.iter().min().unwrap_or(&0),
        v.iter().max().unwrap_or(&0)
    )
}

/// The side-by-side table for one N; ratios are taken within a run (contender over its own
/// bound, ours over the peers).
fn table(
    n: usize,
    contenders: &[Contender],
    results: &BTreeMap<Contender, Vec<Measured>>,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### N = {n} (size 3 each; medians, range over runs)\n"
    );
    let _ = writeln!(
        out,
        "| | {} |",
        contenders
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(out, "|---|{}", "---|".repeat(contenders.len()));
    let row = |label: &str, f: &dyn Fn(Contender, &[Measured]) -> String| {
        let cells: Vec<String> = contenders
            .iter()
            .map(|&c| {
                results
                    .get(&c)
                    .map(|m| f(c, m))
                    .unwrap_or_else(|| "–".into())
            })
            .collect();
        format!("| {label} | {} |\n", cells.join(" | "))
    };
    out.push_str(&row("every Memcached done", &|_, m| {
        spread(m.iter().map(|m| m.converged.as_secs_f64()).collect(), " s")
    }));
    out.push_str(&row("over its own bound (per run)", &|c, m| match c
        .bound()
        .and_then(|b| results.get(&b))
    {
        Some(b) => spread(
            m.iter()
                .zip(b)
                .map(|(m, b)| m.converged.as_secs_f64() / b.converged.as_secs_f64().max(1e-9))
                .collect(),
            "×",
        ),
        None => "–".into(),
    }));
    out.push_str(&row(
        "peer's time over ours (per run)",
        &|c, m| match results.get(&Contender::Ours) {
            Some(ours) if c != Contender::Ours => spread(
                m.iter()
                    .zip(ours)
                    .map(|(m, o)| m.converged.as_secs_f64() / o.converged.as_secs_f64().max(1e-9))
                    .collect(),
                "×",
            ),
            _ => "–".into(),
        },
    ));
    out.push_str(&row("writes", &|_, m| {
        count_cell(m.iter().map(|m| m.writes).collect())
    }));
    out.push_str(&row("writes by all clients until done", &|_, m| {
        count_cell(m.iter().map(|m| m.cluster_writes).collect())
    }));
    out.push_str(&row(
        "control-plane CPU until done (median run)",
        &|_, m| {
            let mut all: Vec<&Measured> = m.iter().collect();
            all.sort_by_key(|m| m.converged);
            match all.get(all.len() / 2) {
                Some(m) if !m.cluster_cpu.is_empty() => {
                    let total: f64 = m.cluster_cpu.values().map(Duration::as_secs_f64).sum();
                    let parts: Vec<String> = m
                        .cluster_cpu
                        .iter()
                        .map(|(name, cpu)| format!("{name} {:.0}", cpu.as_secs_f64()))
                        .collect();
                    format!("{total:.0} s: {}", parts.join(", "))
                }
                _ => "–".into(),
            }
        },
    ));
    out.push_str(&row("requests by verb (median run)", &|_, m| {
        let mut all: Vec<&Measured> = m.iter().collect();
        all.sort_by_key(|m| m.converged);
        match all.get(all.len() / 2) {
            Some(m) if !m.requests.is_empty() => m
                .requests
                .iter()
                .map(|(v, c)| format!("{v} {c}"))
                .collect::<Vec<_>>()
                .join(", "),
            _ => "–".into(),
        }
    }));
    out.push_str(&row("CPU until done", &|_, m| {
        let v: Vec<f64> = m
            .iter()
            .filter_map(|m| m.cpu)
            .map(|d| d.as_secs_f64())
            .collect();
        if v.is_empty() {
            "–".into()
        } else {
            spread(v, " s")
        }
    }));
    out.push_str(&row("peak RSS", &|_, m| {
        let v: Vec<u64> = m.iter().filter_map(|m| m.peak_rss_kib).collect();
        match median(v.iter().map(|&k| k as f64).collect()) {
            Some(mid) => format!(
                "{} ({}–{})",
                mib(mid as u64),
                mib(v.iter().copied().min().unwrap_or(0)),
                mib(v.iter().copied().max().unwrap_or(0))
            ),
            None => "–".into(),
        }
    }));
    out.push_str(&row("requests / writes per resync", &|_, m| {
        let v: Vec<(u64, u64)> = m.iter().filter_map(|m| m.steady).collect();
        if v.is_empty() {
            return "–".into();
        }
        format!(
            "{} / {}",
            median(v.iter().map(|s| s.0 as f64).collect()).unwrap_or(0.0),
            median(v.iter().map(|s| s.1 as f64).collect()).unwrap_or(0.0)
        )
    }));
    let lat = |samples: Vec<Duration>| -> String {
        match (percentile(&samples, 50.0), percentile(&samples, 99.0)) {
            (Some(p50), Some(p99)) => format!("{} / {} (n={})", ms(p50), ms(p99), samples.len()),
            _ => "–".into(),
        }
    };
    out.push_str(&row("scale latency p50 / p99, under load", &|_, m| {
        lat(m.iter().flat_map(|m| m.latency_load.clone()).collect())
    }));
    out.push_str(&row("scale latency p50 / p99, idle", &|_, m| {
        lat(m.iter().flat_map(|m| m.latency_idle.clone()).collect())
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A Memcached is done only with its Deployment at 3 replicas, 3 Ready pods, and
    /// `status.nodes` naming exactly those pods; a pod turning unready undoes it.
    #[test]
    fn done_means_replicas_ready_pods_and_nodes_agree() {
        let mc = "sbs-00001";
        let mut t = Track::default();
        t.replicas.insert(mc.into(), 3);
        for pod in ["a", "b", "c"] {
            t.set_pod(pod, Some(mc.into()), true);
        }
        assert!(t.done.is_empty(), "no status yet");
        t.nodes.insert(mc.into(), names(&["a", "b"]));
        t.recompute(mc);
        assert!(t.done.is_empty(), "status names two of three");
        t.nodes.insert(mc.into(), names(&["a", "b", "c"]));
        t.recompute(mc);
        assert!(t.done.contains(mc));
        t.set_pod("c", Some(mc.into()), false);
        assert!(!t.done.contains(mc), "a pod turned unready");
        t.set_pod("c", Some(mc.into()), true);
        assert!(t.done.contains(mc));
        t.replicas.insert(mc.into(), 4);
        t.recompute(mc);
        assert!(!t.done.contains(mc), "scaled, not yet followed");
        // Objects outside the benchmark's set never count.
        t.replicas.insert(LATENCY_CR.into(), 3);
        t.nodes.insert(LATENCY_CR.into(), names(&["x", "y", "z"]));
        for pod in ["x", "y", "z"] {
            t.set_pod(pod, Some(LATENCY_CR.into()), true);
        }
        assert!(!t.done.contains(LATENCY_CR));
    }
}
