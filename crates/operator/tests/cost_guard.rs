//! A guard on what a pool costs, run in CI: a change that makes pools markedly dearer fails
//! here, by counts rather than by wall time.
//!
//! [`POOLS`] pools of [`SIZE`] on the real control plane (the newest pinned version, kwok
//! nodes), converged by the operator binary as users run it. Measured:
//! - the requests it sent per pool, every verb, as the API server's audit log shows them
//!   (by its `User-Agent`), and the writes among them;
//! - the CPU it used per pool (its `utime + stime` from /proc, a count of the process's
//!   own time, which a busy machine changes far less than wall time) and its peak RSS;
//! - and, after a restart with a resync every second, no write at all and no request once
//!   its caches are filled: the cost of a resync is counted in requests there, and kept
//!   out of the CPU figure (a resync every second would make it a measure of wall time).
//!
//! Each is compared with the figures committed in `cost_guard.json` (measured with this
//! test, a debug build as `cargo test` builds it): requests and writes may grow by
//! [`REQUEST_MARGIN`], CPU and memory by [`CPU_MARGIN`] and [`RSS_MARGIN`] (generous, for
//! a loaded CI machine). A change that lowers them should lower the figures too: the test
//! prints what it measured, and says when the figures are far above it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube, Options};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use memcached_api::{Memcached, MemcachedSpec};
use serde_json::Value;

mod common;
use common::cluster::apply_crd;
use common::process::{Operator, TempDir};
use common::wait_for_within;

/// Pools converged in one run.
const POOLS: usize = 200;
/// Pods per pool: more than one, so that status writes while pods turn Ready count.
const SIZE: i32 = 2;
/// How much requests and writes per pool may grow over the figures.
const REQUEST_MARGIN: f64 = 1.5;
/// How much CPU per pool may grow (the process's own time, on a machine shared with the
/// control plane).
const CPU_MARGIN: f64 = 1.8;
/// How much the peak RSS may grow.
const RSS_MARGIN: f64 = 1.5;
/// Convergence of every pool, on two busy cores.
const CONVERGED: Duration = Duration::from_secs(600);
/// How long the converged operator may take to fall quiet (a busy loop of requests fails
/// here).
const SETTLED: Duration = Duration::from_secs(120);
/// How long the restarted operator is watched for requests (with a resync every second).
const AT_REST: Duration = Duration::from_secs(15);
/// The resync while converging: longer than the test, so that the CPU figure is the work
/// of converging the pools and not of how long the machine took to do it.
const CONVERGING_RESYNC: &str = "--resync-period=1h";
/// The restarted operator's resync: every pool re-checked each second at rest.
const RESTING_RESYNC: &str = "--resync-period=1s";

/// The committed figures.
const FIGURES: &str = include_str!("cost_guard.json");

/// The operator's own time (user and system) in milliseconds, and its peak RSS in KiB.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmHWM");
    (ticks * 1000.0 / per_second, hwm)
}

/// Whether every pool reports `SIZE` ready pods.
async fn all_converged(api: &Api<Memcached>) -> bool {
    let Ok(list) = api.list(&ListParams::default()).await else {
        return false;
    };
    list.items.len() == POOLS
        && list.items.iter().all(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == SIZE && s.nodes.len() == SIZE as usize)
        })
}

/// The operator's requests in the audit log so far.
fn operator_requests(cp: &ControlPlane) -> Vec<envtest::audit::Request> {
    cp.audit()
        .expect("audit log")
        .into_iter()
        .filter(|r| r.user_agent.starts_with("memcached-operator/"))
        .collect()
}

/// Waits until the operator (`who`) has sent no request for 5 s.
async fn quiet(cp: &ControlPlane, who: &str) {
    let mut seen = operator_requests(cp).len();
    let mut quiet_since = Instant::now();
    wait_for_within(&format!("{who} quiet for 5 s"), SETTLED, || {
        let now = operator_requests(cp).len();
        if now != seen {
            seen = now;
            quiet_since = Instant::now();
        }
        let quiet = quiet_since.elapsed() >= Duration::from_secs(5);
        async move { quiet.then_some(()) }
    })
    .await;
}

fn figure(figures: &Value, key: &str) -> f64 {
    figures[key]
        .as_f64()
        .unwrap_or_else(|| panic!("cost_guard.json has no number {key:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_costs_no_more_than_the_committed_figures() {
    let figures: Value = serde_json::from_str(FIGURES).expect("cost_guard.json");
    assert_eq!(
        (figure(&figures, "pools"), figure(&figures, "size")),
        (POOLS as f64, f64::from(SIZE)),
        "cost_guard.json was measured with other pools"
    );
    let cp = ControlPlane::start(Options::new(Kube::Newest))
        .await
        .unwrap_or_else(|e| panic!("control plane (make controlplane): {e}"));
    let client: Client = cp.client().await.expect("client");
    apply_crd(&client, &<Memcached as kube::CustomResourceExt>::crd()).await;
    let ns = cp.namespace("cost").await.expect("namespace");
    let api: Api<Memcached> = Api::namespaced(client.clone(), &ns);

    let dir = TempDir::new("cost-guard");
    let spawn = |name: &str, resync: &str| {
        Operator::spawn(
            cp.kubeconfig(),
            dir.path(),
            name,
            &[
                format!("--namespace={ns}"),
                "--metrics-bind-address=0".into(),
                "--health-probe-bind-address=0".into(),
                resync.into(),
            ],
            &[],
        )
    };
    let mut op = spawn("cost-guard", CONVERGING_RESYNC);
    op.wait_log("caches synced", Duration::from_secs(120)).await;
    for i in 0..POOLS {
        let pool = Memcached::new(&format!("pool-{i:03}"), MemcachedSpec::with_size(SIZE));
        api.create(&PostParams::default(), &pool)
            .await
            .expect("create a Memcached");
    }
    let started = Instant::now();
    wait_for_within("every pool converged and reported", CONVERGED, || async {
        all_converged(&api).await.then_some(())
    })
    .await;
    let converged_in = started.elapsed();

    // Settled: the last status writes of the pods turning Ready are in.
    quiet(&cp, "the operator").await;
    let requests = operator_requests(&cp);
    let (cpu_ms, rss_kib) = usage(op.pid());

    assert!(op.exited().is_none(), "the operator exited:\n{}", op.logs());
    op.signal(libc::SIGTERM);
    op.wait_exit(Duration::from_secs(60)).await;

    // Restarted with a resync every second: it fills its caches (lists and watches), finds
    // every pool as it left it and writes nothing; once quiet, not one request more.
    let before_restart = operator_requests(&cp).len();
    let mut restarted = spawn("cost-guard-restarted", RESTING_RESYNC);
    restarted
        .wait_log("caches synced", Duration::from_secs(120))
        .await;
    quiet(&cp, "the restarted operator").await;
    let after_restart = operator_requests(&cp);
    let restart_requests = &after_restart[before_restart..];
    let restart_writes: Vec<_> = restart_requests.iter().filter(|r| r.is_write()).collect();
    assert!(
        restart_writes.is_empty(),
        "the restarted operator wrote: {restart_writes:?}"
    );
    tokio::time::sleep(AT_REST).await;
    let later = operator_requests(&cp);
    assert_eq!(
        later.len(),
        after_restart.len(),
        "requests at rest: {:?}",
        &later[after_restart.len()..]
    );
    assert!(
        restarted.exited().is_none(),
        "the restarted operator exited:\n{}",
        restarted.logs()
    );

    let n = POOLS as f64;
    let writes = requests.iter().filter(|r| r.is_write()).count();
    let mut by_kind = BTreeMap::<String, usize>::new();
    for r in &requests {
        let what = if r.subresource.is_empty() {
            format!("{} {}", r.verb, r.resource)
        } else {
            format!("{} {}/{}", r.verb, r.resource, r.subresource)
        };
        *by_kind.entry(what).or_default() += 1;
    }
    let measured = [
        (
            "requests_per_pool",
            requests.len() as f64 / n,
            REQUEST_MARGIN,
        ),
        ("writes_per_pool", writes as f64 / n, REQUEST_MARGIN),
        ("cpu_ms_per_pool", cpu_ms / n, CPU_MARGIN),
        ("peak_rss_kib", rss_kib as f64, RSS_MARGIN),
    ];
    eprintln!(
        "{POOLS} pools of {SIZE} converged in {converged_in:?}; measured: {}; requests by kind: {by_kind:?}",
        measured
            .iter()
            .map(|(k, v, _)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut over = Vec::new();
    for (key, value, margin) in measured {
        let committed = figure(&figures, key);
        if value > committed * margin {
            over.push(format!(
                "{key}: {value:.2} > {committed} × {margin} (committed in cost_guard.json)"
            ));
        } else if value * 2.0 < committed {
            eprintln!(
                "{key}: {value:.2} is less than half the committed {committed}: lower it in cost_guard.json"
            );
        }
    }
    assert!(
        over.is_empty(),
        "a pool costs more than it did: {over:?}; requests by kind: {by_kind:?}"
    );
}
