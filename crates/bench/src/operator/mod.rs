//! `bench operator`: how fast the operator converges compared with the fewest API
//! writes that could do the same job, what it costs at rest, how quickly it reacts and how
//! much memory it holds. Not part of the test suite; see BENCHMARKS.md for results.
//!
//! For each N it runs, on a fresh in-memory API server served over HTTP (workload simulator
//! on: 3 pods per Memcached) or, with `--kubeconfig`, in fresh namespaces of a real cluster
//! (`--namespaces K`: each phase's N Memcacheds spread round-robin over K of them, see `env`):
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
//!
//! This file holds the flags and the phases; `env` where a phase runs, `process` the
//! operator's process, `tracker` convergence, `latency` the probes, `report` the table.

mod env;
mod latency;
mod process;
mod report;
mod tracker;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_api::Memcached;
use serde_json::json;

use memcached_operator::builders::{self, BuildSettings};
use memcached_operator::cmd::parse_duration;
use memcached_operator::status::{self, Observed};

use crate::measure::{cpu_time, mib, secs};
use crate::{BoxError, Result, log};
use env::Env;
use latency::{deployment_reaches, measure_latency};
use process::Operator;
use report::{Pair, Requests, Row, table};
use tracker::{track, wait_progress};

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
    /// Run against this cluster (fresh namespaces per phase, deleted afterwards) instead
    /// of the in-memory API server. The CRD must be installed.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces each phase spreads its N Memcacheds over, round-robin (Memcached i in
    /// the (i mod K)-th); on a cluster the operator watches exactly these. One namespace
    /// holding thousands of pools makes kube-controller-manager's per-namespace work
    /// O(N²). The in-memory server runs no such controllers; it takes K all the same.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub namespaces: u16,
    /// With `--kubeconfig`: run the operator as its default install does, watching every
    /// namespace (one informer per kind), instead of exactly the phase's namespaces (one
    /// informer per kind and namespace). The pools are spread over `--namespaces` all the
    /// same.
    #[arg(long, requires = "kubeconfig")]
    pub cluster_wide: bool,
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

const SIZE: i32 = 3;
const LATENCY_CR: &str = "latency";
const PREFIX: &str = "bench-";

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

/// Creates the `n` Memcacheds `bench-00000` … of size 3, each in its namespace
/// ([`Env::namespace_of`]), `concurrency` at a time; returns each with its number.
async fn create_crs(env: &Env, n: usize, concurrency: usize) -> Result<Vec<(usize, Memcached)>> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let mc = memcached(&cr_name(i), SIZE)?;
            let api = env.memcacheds(env.namespace_of(i));
            Ok::<_, BoxError>((i, api.create(&PostParams::default(), &mc).await?))
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await
}

/// The raw-write bound: for each of `n` Memcacheds, a create of every child the operator
/// creates for it (Deployment, headless Service and, from size 2, the
/// PodDisruptionBudget, all from the operator's own builders) and one status patch (the
/// operator's own status function).
/// Returns the time taken and the CPU time this process (server and client) used.
async fn raw_write_bound(env: &Env, n: usize, concurrency: usize) -> Result<(Duration, Duration)> {
    let crs = create_crs(env, n, concurrency).await?;
    let settings = BuildSettings::default();
    // The clients of each namespace, built before the clock starts: `apis[i % K]` serves
    // Memcached i's namespace (`Env::namespace_of`).
    let apis: Vec<_> = env
        .namespaces
        .iter()
        .map(|ns| {
            (
                env.memcacheds(ns),
                Api::<Deployment>::namespaced(env.client.clone(), ns),
                Api::<Service>::namespaced(env.client.clone(), ns),
                Api::<PodDisruptionBudget>::namespaced(env.client.clone(), ns),
            )
        })
        .collect();
    let cpu_before = cpu_time(std::process::id());
    let started = Instant::now();
    futures::stream::iter(crs)
        .map(|(i, mc)| {
            let (api, deployments, services, pdbs) = &apis[i % apis.len()];
            let settings = &settings;
            async move {
                let pp = PostParams::default();
                let deployment = deployments
                    .create(&pp, &builders::desired_deployment(&mc, settings)?)
                    .await?;
                services
                    .create(&pp, &builders::desired_service(&mc)?)
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
                    flush: None,
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
    create_crs(env, n, args.concurrency).await?;
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
    // The operator connects to nothing but the API server.
    row.connections_idle = envtest::established_connections(op.pid(), None);
    log(format!(
        "operator idle: {}, {} connections (pid {})",
        mib(row.rss_idle),
        row.connections_idle,
        op.pid()
    ));

    // Idle latency, on a Memcached of its own.
    let api = env.memcacheds(env.latency_namespace());
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
        let created = create_crs(env, n, args.concurrency).await;
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
    row.connections_converged = envtest::established_connections(op.pid(), None);
    log(format!(
        "N={n}: CRs created in {}, children and status in {}, {}, {} connections",
        secs(row.create_crs),
        secs(row.children_and_status),
        mib(row.rss_converged),
        row.connections_converged
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
