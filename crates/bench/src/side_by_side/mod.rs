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
//!
//! With `--bare`, on a control plane with no controllers (etcd and kube-apiserver only: no
//! pod ever exists), the operator against two bounds of a bare client measured in the same
//! run, each contender on a fresh control plane (`bare`): `minimal-creates` (the cheapest
//! creates of a pool's objects and a status write), `ssa-bound` (our own children applied
//! server-side and our own status) and `ours`. *Done* is then: every child the operator
//! plans for the Memcached exists and its status describes its generation. The scale
//! changes are timed only after the N are done (none under load), on a Memcached created
//! then, so each contender handles exactly the N while timed.
//!
//! This file holds the flags, the contenders and one run's measurement; `target` where a
//! contender runs, `process` its process, `bound` the raw-write bounds, `bare` the bare
//! control plane's bounds, `tracker` what is done, `report` the table.

mod bare;
mod bound;
mod process;
mod report;
mod target;
mod tracker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use memcached_api::Memcached;
use memcached_operator::cmd::parse_duration;
use serde_json::json;

use crate::measure::{audit_requests, cpu_time, memory_kib, secs};
use crate::{BoxError, Result, log};
use bound::bound;
use process::Process;
use report::table;
use target::Target;
use tracker::{Track, lock, track, wait_until};

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
    #[arg(long, requires = "audit_log", conflicts_with = "bare")]
    pub kubeconfig: Option<PathBuf>,
    /// A bare control plane each (etcd and kube-apiserver, no controllers: no pod ever
    /// exists): done when every child the operator plans for a Memcached exists and its
    /// status describes its generation. Contenders: minimal-creates, ssa-bound, ours.
    #[arg(long)]
    pub bare: bool,
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
    /// Contenders (comma-separated): bound, peer-bound, peer, peer-tuned, ours (default:
    /// all of them); with `--bare`: minimal-creates, ssa-bound, ours (default: all three).
    #[arg(long, value_delimiter = ',')]
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
    /// Which of our children the bound writes per Memcached (comma-separated): deployment,
    /// service (headless `NAME`, as the operator builds it), cluster-ip-service and
    /// headless-service (the two Services of a pool an earlier release created), pdb.
    /// Running the bound with one object more or less measures that object's cost.
    #[arg(long, value_delimiter = ',', default_value = "deployment,service,pdb")]
    pub bound_objects: Vec<String>,
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
    /// Bare: the cheapest creates of a pool's objects, and a status write.
    MinimalCreates,
    /// Bare: our children applied server-side, and our status.
    SsaBound,
}

/// The contenders when none are named.
const DEFAULT_CONTENDERS: &[Contender] = &[
    Contender::Bound,
    Contender::PeerBound,
    Contender::Peer,
    Contender::PeerTuned,
    Contender::Ours,
];
const DEFAULT_BARE_CONTENDERS: &[Contender] = &[
    Contender::MinimalCreates,
    Contender::SsaBound,
    Contender::Ours,
];

impl Contender {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "bound" => Self::Bound,
            "peer-bound" => Self::PeerBound,
            "peer" => Self::Peer,
            "peer-tuned" => Self::PeerTuned,
            "ours" => Self::Ours,
            "minimal-creates" => Self::MinimalCreates,
            "ssa-bound" => Self::SsaBound,
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
            Self::MinimalCreates => "minimal creates",
            Self::SsaBound => "SSA bound (ours' children)",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Bound => "bound",
            Self::PeerBound => "pbound",
            Self::Peer => "peer",
            Self::PeerTuned => "ptuned",
            Self::Ours => "ours",
            Self::MinimalCreates => "minimal",
            Self::SsaBound => "ssa",
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

    /// Whether it runs on a bare control plane (and only there): the bare bounds, and ours.
    fn runs_bare(self) -> bool {
        matches!(self, Self::MinimalCreates | Self::SsaBound | Self::Ours)
    }

    /// Whether it runs on a control plane with workloads: all but the bare bounds.
    fn runs_with_pods(self) -> bool {
        !matches!(self, Self::MinimalCreates | Self::SsaBound)
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
    /// `cluster_writes` by writer and resource.
    cluster_writes_by: BTreeMap<String, u64>,
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
    // Bare, the latency Memcached comes once the N are done: the contender handles
    // exactly the N while timed, as the bounds do.
    if process_contender && !args.bare {
        api.create(&PostParams::default(), &memcached(LATENCY_CR, SIZE)?)
            .await?;
    }
    let (track, tracker) = track(client, &ns, args.bare);
    wait_until("the tracker's watches", Duration::from_secs(60), || {
        let t = lock(&track);
        t.synced >= t.watches
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
                measured.writes = bound(client, &ns, &crs, who, &track, args).await?;
                wait_until("every Memcached done", args.timeout, || {
                    lock(&track).done.len() == n
                })
                .await?;
                measured.converged = started.elapsed();
                account_cluster(&mut measured, target, mark, &components, &cpu_before).await?;
            }
            Contender::MinimalCreates | Contender::SsaBound => {
                measured.writes = bare::bound(client, &ns, &crs, who, args.concurrency).await?;
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
                let probe = (!args.bare).then(|| {
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
                });
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
                let mut size = SIZE as i32;
                if let Some(probe) = probe {
                    let samples;
                    (samples, size) = probe.await?;
                    measured.latency_load = samples;
                }
                measured.converged = converged.unwrap_or_default();
                measured.cpu = Some(cpu_time(process.pid()));
                account_cluster(&mut measured, target, mark, &components, &cpu_before).await?;
                let agent = who.user_agent().unwrap_or_default();
                // Give the audit log a moment to be written through.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let (by_verb, writes) = audit_requests(&target.audit, mark, agent)?;
                measured.requests = by_verb;
                measured.writes = writes;
                if args.bare {
                    api.create(&PostParams::default(), &memcached(LATENCY_CR, SIZE)?)
                        .await?;
                    wait_until("the latency Deployment", Duration::from_secs(60), || {
                        lock(&track).replicas.get(LATENCY_CR) == Some(&size)
                    })
                    .await?;
                }
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
    measured.cluster_writes_by = crate::measure::audit_writes_by(&target.audit, mark)?;
    Ok(())
}

/// The contenders named (or the default ones), each one that runs where `--bare` says.
fn contenders(args: &Args) -> Result<Vec<Contender>> {
    let contenders: Vec<Contender> = match args.contenders.as_slice() {
        [] if args.bare => DEFAULT_BARE_CONTENDERS.to_vec(),
        [] => DEFAULT_CONTENDERS.to_vec(),
        named => named
            .iter()
            .map(|c| Contender::parse(c))
            .collect::<Result<_>>()?,
    };
    if let Some(c) = contenders.iter().find(|c| {
        if args.bare {
            !c.runs_bare()
        } else {
            !c.runs_with_pods()
        }
    }) {
        return Err(if args.bare {
            format!("{} does not run with --bare (it waits for pods)", c.name())
        } else {
            format!("{} runs only with --bare", c.name())
        }
        .into());
    }
    Ok(contenders)
}

pub async fn run(args: Args) -> Result<()> {
    let contenders = contenders(&args)?;
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
        if args.bare {
            report.push_str(
                "\nbare control plane (etcd, kube-apiserver; no pods): done = every child \
                 planned for a size-3 pool (Deployment, Service, PodDisruptionBudget) exists \
                 and status.observedGeneration = generation\n",
            );
        } else {
            report.push_str(&format!(
                "\nbound (ours' writes): {} per Memcached\n",
                args.bound_objects.join(", ")
            ));
        }
        println!("{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{report}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied())).map(|c| c.args)
    }

    fn chosen(flags: &[&str]) -> Result<Vec<Contender>> {
        contenders(&parse(flags)?)
    }

    /// `--bare` runs the bare bounds and ours (by default, all three); the contenders that
    /// wait for pods do not run there, and the bare bounds run nowhere else.
    #[test]
    fn bare_runs_its_own_contenders_only() {
        use Contender::*;
        assert_eq!(
            chosen(&["--bare"]).expect("default"),
            [MinimalCreates, SsaBound, Ours]
        );
        assert_eq!(
            chosen(&["--bare", "--contenders", "ours,ssa-bound"]).expect("named"),
            [Ours, SsaBound]
        );
        assert_eq!(
            chosen(&[]).expect("default"),
            [Bound, PeerBound, Peer, PeerTuned, Ours]
        );
        assert!(chosen(&["--bare", "--contenders", "bound,ours"]).is_err());
        assert!(chosen(&["--bare", "--contenders", "peer"]).is_err());
        assert!(chosen(&["--contenders", "minimal-creates,ours"]).is_err());
        assert!(chosen(&["--contenders", "bogus"]).is_err());
        // A given cluster has controllers: never bare.
        assert!(parse(&["--bare", "--kubeconfig", "k", "--audit-log", "a"]).is_err());
    }
}
