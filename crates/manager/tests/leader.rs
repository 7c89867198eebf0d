//! Leader election against the in-memory API server (apisim).
//!
//! Every test runs on Tokio's paused clock, which is the clock the election times itself by
//! (retry period, renew deadline, lease validity): time moves only when every task waits,
//! so the durations asserted below are those of the algorithm, exact however busy the
//! machine is, and no wait is a wall-clock window.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use manager::Metrics;
use manager::leader::{Error, LeaderElectionConfig, run_as_leader};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "memcached-operator-lock";

fn config(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_name: LEASE.into(),
        lease_namespace: "default".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1400),
        retry_period: Duration::from_millis(200),
    }
}

fn holder(server: &apisim::ApiServer) -> Option<String> {
    let lease = server.get_object("coordination.k8s.io/v1", "leases", Some("default"), LEASE)?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

fn renew_time(server: &apisim::ApiServer) -> Option<String> {
    let lease = server.get_object("coordination.k8s.io/v1", "leases", Some("default"), LEASE)?;
    lease["spec"]["renewTime"].as_str().map(str::to_string)
}

/// Waits for the holder's next renewal and returns when it happened: the paused clock
/// stands still while the renewal is written, and is looked at every millisecond.
async fn next_renewal(server: &apisim::ApiServer) -> Instant {
    let before = renew_time(server);
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if renew_time(server) != before {
            return Instant::now();
        }
        assert!(Instant::now() < give_up, "the leader does not renew");
    }
}

fn leader_status(metrics: &Metrics) -> Option<String> {
    let text = metrics.encode();
    let series = format!("leader_election_master_status{{name=\"{LEASE}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(str::to_string)
}

/// What a candidate's controllers report.
#[derive(Debug)]
enum Event {
    Started(&'static str, Instant),
    /// Controllers saw leader_token cancelled; holder of the Lease at that moment.
    Stopping(&'static str, Option<String>),
}

/// Counts one candidate's controllers as running while it lives.
struct Leading(Arc<AtomicUsize>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Candidate {
    shutdown: CancellationToken,
    metrics: Metrics,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

fn spawn_candidate(
    server: &Arc<apisim::ApiServer>,
    identity: &'static str,
    leading: Arc<AtomicUsize>,
    events: mpsc::UnboundedSender<Event>,
) -> Candidate {
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new();
    let client = server.client();
    let s = server.clone();
    let (sd, m) = (shutdown.clone(), metrics.clone());
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            Some(config(identity)),
            &m,
            sd,
            move |leader_token| async move {
                let now_leading = leading.fetch_add(1, Ordering::SeqCst) + 1;
                // Leading until the controllers end or are dropped.
                let _leading = Leading(leading);
                assert_eq!(now_leading, 1, "two leaders at once");
                let _ = events.send(Event::Started(identity, Instant::now()));
                leader_token.cancelled().await;
                let _ = events.send(Event::Stopping(identity, holder(&s)));
                // Stopping takes a moment; the Lease must not be released meanwhile.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<(), std::io::Error>(())
            },
        )
        .await
    });
    Candidate {
        shutdown,
        metrics,
        task,
    }
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Event>, within: Duration) -> Event {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("no event in time")
        .expect("channel closed")
}

#[tokio::test(start_paused = true)]
async fn one_leader_and_fast_handover_on_shutdown() {
    let server = Arc::new(apisim::ApiServer::new());
    let leading = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = spawn_candidate(&server, "a", leading.clone(), tx.clone());
    let b = spawn_candidate(&server, "b", leading.clone(), tx.clone());

    let Event::Started(first, _) = next(&mut rx, Duration::from_secs(5)).await else {
        panic!("expected a start");
    };
    // Several lease durations pass: still exactly one leader, the same one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        rx.try_recv().is_err(),
        "leadership changed without a reason"
    );
    assert_eq!(leading.load(Ordering::SeqCst), 1);
    assert_eq!(holder(&server).as_deref(), Some(first));
    let (leader, standby) = if first == "a" { (a, b) } else { (b, a) };
    assert_eq!(leader_status(&leader.metrics).as_deref(), Some("1"));
    assert_eq!(leader_status(&standby.metrics).as_deref(), Some("0"));

    // Graceful shutdown of the leader: controllers stop while the Lease is still held,
    // then it is released and the standby takes over in well under a lease duration.
    let t0 = Instant::now();
    leader.shutdown.cancel();
    let Event::Stopping(who, held_by) = next(&mut rx, Duration::from_secs(2)).await else {
        panic!("expected the leader to stop");
    };
    assert_eq!(who, first);
    assert_eq!(
        held_by.as_deref(),
        Some(first),
        "lease released before controllers stopped"
    );
    let Event::Started(second, at) = next(&mut rx, Duration::from_secs(3)).await else {
        panic!("expected the standby to start");
    };
    assert_ne!(second, first);
    assert!(
        at - t0 < Duration::from_secs(2),
        "handover took {:?}",
        at - t0
    );
    tokio::time::timeout(Duration::from_secs(5), leader.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(leader_status(&leader.metrics).as_deref(), Some("0"));
    assert_eq!(holder(&server).as_deref(), Some(second));

    standby.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), standby.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(holder(&server), None, "lease released on shutdown");
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_stop_controllers_before_the_lease_expires() {
    let server = Arc::new(apisim::ApiServer::new());
    let leading = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = spawn_candidate(&server, "a", leading.clone(), tx.clone());
    let Event::Started(..) = next(&mut rx, Duration::from_secs(5)).await else {
        panic!("expected a start");
    };
    // Let a few renewals succeed, then make every Lease update after the last fail.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let last_renew = next_renewal(&server).await;
    server.inject(
        apisim::Fault::new()
            .verb("update")
            .resource("leases")
            .status(500),
    );

    // Long enough to see a stop that came too late (on the paused clock, waiting costs nothing).
    let stopping = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    let Ok(Some(Event::Stopping(..))) = stopping else {
        panic!(
            "the controllers were not told to stop (dropped unasked, or left running): {stopping:?}"
        );
    };
    let since_renew = Instant::now() - last_renew;
    let lease_duration = Duration::from_secs(2);
    let renew_deadline = Duration::from_millis(1400);
    assert!(
        since_renew < lease_duration,
        "controllers stopped {since_renew:?} after the last renewal, not before the lease expired"
    );
    // The renewal was seen within a millisecond of being written.
    assert!(
        since_renew >= renew_deadline - Duration::from_millis(1),
        "gave up too early: {since_renew:?}"
    );
    let r = tokio::time::timeout(Duration::from_secs(5), a.task)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(r, Err(Error::LeadershipLost { .. })), "{r:?}");
    assert_eq!(leader_status(&a.metrics).as_deref(), Some("0"));
    assert_eq!(leading.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn transient_renewal_failures_are_tolerated() {
    let server = Arc::new(apisim::ApiServer::new());
    let leading = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = spawn_candidate(&server, "a", leading.clone(), tx.clone());
    let Event::Started(..) = next(&mut rx, Duration::from_secs(5)).await else {
        panic!("expected a start");
    };
    // Two failed renewals (~400ms) stay well within the renew deadline.
    server.inject(
        apisim::Fault::new()
            .verb("update")
            .resource("leases")
            .status(500)
            .times(2),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        rx.try_recv().is_err(),
        "leadership lost on transient errors"
    );
    assert_eq!(holder(&server).as_deref(), Some("a"));
    a.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn standby_never_runs_and_shutdown_returns() {
    let server = Arc::new(apisim::ApiServer::new());
    let leading = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = spawn_candidate(&server, "a", leading.clone(), tx.clone());
    next(&mut rx, Duration::from_secs(5)).await;
    let b = spawn_candidate(&server, "b", leading.clone(), tx.clone());
    tokio::time::sleep(Duration::from_millis(600)).await;
    b.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(2), b.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(rx.try_recv().is_err());
    assert_eq!(holder(&server).as_deref(), Some("a"));
    a.shutdown.cancel();
    let _ = a.task.await;
}

#[tokio::test(start_paused = true)]
async fn disabled_election_runs_at_once_and_stops_on_shutdown() {
    let server = apisim::ApiServer::new();
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new();
    let sd = shutdown.clone();
    let task = tokio::spawn(async move {
        run_as_leader(server.client(), None, &metrics, sd, |token| async move {
            token.cancelled().await;
            Ok::<(), std::io::Error>(())
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn controller_error_is_returned_and_lease_released() {
    let server = Arc::new(apisim::ApiServer::new());
    let r = run_as_leader(
        server.client(),
        Some(config("a")),
        &Metrics::new(),
        CancellationToken::new(),
        |_token| async { Err::<(), _>(std::io::Error::other("reconciler exploded")) },
    )
    .await;
    assert!(
        matches!(&r, Err(Error::Run(e)) if e.to_string().contains("exploded")),
        "{r:?}"
    );
    assert_eq!(holder(&server), None);
}

#[tokio::test(start_paused = true)]
async fn lease_is_kept_while_controllers_stop_slowly() {
    let server = Arc::new(apisim::ApiServer::new());
    let started_b = Arc::new(AtomicUsize::new(0));
    let slow_shutdown = CancellationToken::new();
    let s = server.clone();
    let (sd, m) = (slow_shutdown.clone(), Metrics::new());
    let slow = tokio::spawn(async move {
        run_as_leader(
            s.client(),
            Some(config("slow")),
            &m,
            sd,
            |token| async move {
                token.cancelled().await;
                // Stopping takes longer than the lease duration.
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<(), std::io::Error>(())
            },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holder(&server).as_deref(), Some("slow"));

    let other_shutdown = CancellationToken::new();
    let (sd, m, s, b) = (
        other_shutdown.clone(),
        Metrics::new(),
        server.clone(),
        started_b.clone(),
    );
    let other = tokio::spawn(async move {
        run_as_leader(
            s.client(),
            Some(config("other")),
            &m,
            sd,
            |token| async move {
                b.fetch_add(1, Ordering::SeqCst);
                token.cancelled().await;
                Ok::<(), std::io::Error>(())
            },
        )
        .await
    });

    slow_shutdown.cancel();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2800) {
        assert_eq!(
            started_b.load(Ordering::SeqCst),
            0,
            "took over while controllers still ran"
        );
        assert_eq!(holder(&server).as_deref(), Some("slow"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::timeout(Duration::from_secs(3), slow)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let t1 = Instant::now();
    while started_b.load(Ordering::SeqCst) == 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "no hand-over after release"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other_shutdown.cancel();
    let _ = other.await;
}

/// Sends when dropped: tells a test that a future was dropped (cancelled), and when.
struct DropSignal(Option<tokio::sync::oneshot::Sender<Instant>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Instant::now());
        }
    }
}

/// Controllers that do not stop when told (a reconcile stuck on a request that never
/// returns) are dropped, cancelling whatever they had in flight, before another candidate
/// could take the Lease: the leader's last renewal plus the lease duration.
#[tokio::test(start_paused = true)]
async fn controllers_that_do_not_stop_are_dropped_before_the_lease_can_expire() {
    let server = Arc::new(apisim::ApiServer::new());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<Instant>();
    let client = server.client();
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            Some(config("stuck")),
            &Metrics::new(),
            CancellationToken::new(),
            move |_leader_token| async move {
                let _guard = DropSignal(Some(dropped_tx));
                let _ = started_tx.send(());
                // Never looks at the token, never finishes.
                std::future::pending::<()>().await;
                Ok::<(), std::io::Error>(())
            },
        )
        .await
    });
    tokio::time::timeout(Duration::from_secs(5), started_rx)
        .await
        .expect("leads")
        .expect("started");
    let last_renew = next_renewal(&server).await;
    server.inject(
        apisim::Fault::new()
            .verb("update")
            .resource("leases")
            .hang(),
    );
    let result = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run_as_leader returns although the controllers never stop")
        .unwrap();
    assert!(
        matches!(result, Err(Error::LeadershipLost { .. })),
        "{result:?}"
    );
    let dropped = dropped_rx.await.expect("the controllers were dropped");
    let since_renew = dropped - last_renew;
    assert!(
        since_renew < Duration::from_secs(2),
        "controllers dropped {since_renew:?} after the last renewal: not before the lease (2s) expired"
    );
    assert!(
        since_renew >= Duration::from_millis(1400),
        "controllers dropped {since_renew:?} after the last renewal, before the renew deadline (1.4s)"
    );
    server.clear_faults();
}

/// A Lease deleted under its holder is lost: the leader stops at once (rather than creating
/// a new Lease, which a standby may have done already), and a standby that saw it held does
/// not create a new one before the old record would have expired, so the two never overlap.
#[tokio::test(start_paused = true)]
async fn a_deleted_lease_is_lost_and_never_held_by_two() {
    let server = Arc::new(apisim::ApiServer::new());
    let leading = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = spawn_candidate(&server, "a", leading.clone(), tx.clone());
    let Event::Started("a", _) = next(&mut rx, Duration::from_secs(5)).await else {
        panic!("expected a to lead");
    };
    let b = spawn_candidate(&server, "b", leading.clone(), tx.clone());
    // b sees a's record (it retries every 200ms, jittered).
    tokio::time::sleep(Duration::from_millis(600)).await;

    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(server.client(), "default");
    leases.delete(LEASE, &Default::default()).await.unwrap();
    let deleted = Instant::now();

    let r = tokio::time::timeout(Duration::from_secs(3), a.task)
        .await
        .expect("a stops")
        .unwrap();
    let stopped = deleted.elapsed();
    assert!(matches!(r, Err(Error::LeadershipLost { .. })), "{r:?}");
    assert!(
        stopped < Duration::from_secs(1),
        "a stopped {stopped:?} after its Lease was deleted"
    );
    assert_eq!(
        leading.load(Ordering::SeqCst),
        0,
        "a's controllers still run"
    );
    let Event::Started("b", _) = next(&mut rx, Duration::from_secs(5)).await else {
        panic!("expected b to take over");
    };
    assert_eq!(holder(&server).as_deref(), Some("b"));
    b.shutdown.cancel();
    let _ = b.task.await;
}
