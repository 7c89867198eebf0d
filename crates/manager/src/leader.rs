//! Leader election on a `coordination.k8s.io/v1` Lease, with controller-runtime's
//! defaults and guarantees: controllers run only while this process holds the Lease,
//! stop before it can expire, and the Lease is released on graceful shutdown.
//!
//! # Algorithm (client-go's `leaderelection` with a `LeaseLock`)
//!
//! Every `retry_period` (jittered ×1.2 while waiting) a candidate reads the Lease. It
//! may take it when it is unheld, already its own, or when the holder's record has not
//! changed for `leaseDurationSeconds` measured on the *local* monotonic clock since the
//! candidate first observed that record (so clock skew between nodes does not matter).
//! Takes and renewals are `update`s (PUT) carrying the read `resourceVersion`, so two
//! candidates can never both succeed: the API server's optimistic concurrency decides.
//!
//! # Stopping before the Lease can expire
//!
//! The leader records the local time at which it *sent* each successful renewal
//! (`last_renew`, never later than the `renewTime` the others observe). If no renewal
//! succeeds by `last_renew + renew_deadline` — including when a request hangs, since
//! every attempt races the deadline — it cancels `leader_token` at once. Standbys cannot
//! take over before `observed + lease_duration >= last_renew + lease_duration`, and
//! `renew_deadline < lease_duration` leaves `lease_duration - renew_deadline` (5s by
//! default) for the controllers to stop writing. They get the first half of it to stop by
//! themselves; whatever still runs then (a reconcile waiting on a request that never
//! returns) is dropped, which cancels its requests, and `run_as_leader` returns
//! [`Error::LeadershipLost`], leaving the second half for the process to exit. Like
//! controller-runtime, the binary must then exit non-zero at once (its other tasks, which
//! may still hold writes, end with it) and be restarted as a fresh candidate.
//!
//! The Lease deleted under its holder (404 on renewal), or held by another, is lost too,
//! and the controllers are dropped at once: the Lease is not re-created by its last holder,
//! since a standby may have done so already. A standby that saw a valid holder does not
//! create a deleted Lease before that holder's record would have expired, so a deletion
//! never lets two candidates lead at once.
//!
//! # Why not kube-lease-manager
//!
//! `kube-lease-manager` 0.13 was evaluated: its durations are whole seconds, it has no
//! renew deadline and does not report individual renewals, a standby sleeps until the
//! previous expiry (so a released Lease is taken only after up to `lease_duration`),
//! and it locks through server-side-apply field ownership conflicts. The ~200 lines
//! here follow client-go exactly instead (resourceVersion-guarded updates, retry
//! period, renew deadline, release on cancel).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// controller-runtime's default lease duration.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// controller-runtime's default renew deadline.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// controller-runtime's default retry period.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// client-go's jitter factor: `renew_deadline` must exceed `retry_period` × this.
const JITTER_FACTOR: f64 = 1.2;

/// Errors of leader election, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The durations violate `lease_duration > renew_deadline > 1.2 × retry_period > 0`.
    #[error("invalid leader election config: {0}")]
    InvalidConfig(String),
    /// The Lease could not be renewed within `renew_deadline`, was deleted, or is held by
    /// another candidate; controllers were stopped.
    #[error("leader election lost by {identity}: lease {namespace}/{name} {reason}")]
    LeadershipLost {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// This candidate's identity.
        identity: String,
        /// What happened to the Lease.
        reason: String,
    },
    /// The controllers (`run`) returned an error.
    #[error("controllers failed: {0}")]
    Run(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Where the Lease is and how the election is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Lease name (controller-runtime: `--leader-election-id`).
    pub lease_name: String,
    /// Lease namespace (usually the operator's own namespace).
    pub lease_namespace: String,
    /// This candidate's identity, unique per process.
    pub identity: String,
    /// How long a Lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// The leader stops if it could not renew for this long.
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// Config with controller-runtime's defaults (15s / 10s / 2s) and
    /// [`default_identity`].
    pub fn new(lease_name: impl Into<String>, lease_namespace: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            lease_namespace: lease_namespace.into(),
            identity: default_identity(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Checks client-go's constraints.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.lease_name.is_empty() || self.lease_namespace.is_empty() || self.identity.is_empty()
        {
            return bad("lease name, namespace and identity must not be empty".into());
        }
        if self.retry_period.is_zero() {
            return bad("retry period must be greater than zero".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return bad(format!(
                "lease duration ({:?}) must be greater than renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return bad(format!(
                "renew deadline ({:?}) must be greater than {JITTER_FACTOR} × retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs_f64().ceil() as i64)
            .unwrap_or(i32::MAX)
            .max(1)
    }
}

/// `<hostname>_<random uuid>`, as controller-runtime builds it.
pub fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

/// One candidate's view of the Lease: the client-go `LeaderElector` state machine,
/// without timers. [`run_as_leader`] drives it; exposed for tests and custom loops.
pub struct LeaseLock {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    /// Last Lease read or written, with the local time its spec was first seen.
    observed: Option<(Lease, Instant)>,
    /// Whether this candidate took or renewed the Lease last time and has not seen it lost
    /// or released since.
    holding: bool,
}

impl LeaseLock {
    /// A candidate for `config`'s Lease.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        let api = Api::namespaced(client, &config.lease_namespace);
        Self {
            api,
            config,
            observed: None,
            holding: false,
        }
    }

    /// Whether the last observed record names this candidate as holder.
    pub fn is_leader(&self) -> bool {
        self.holder().as_deref() == Some(self.config.identity.as_str())
    }

    /// Holder in the last observed record (`None` when unheld).
    pub fn holder(&self) -> Option<String> {
        self.observed
            .as_ref()
            .and_then(|(l, _)| l.spec.as_ref()?.holder_identity.clone())
            .filter(|h| !h.is_empty())
    }

    fn observe(&mut self, lease: Lease) {
        let unchanged = self
            .observed
            .as_ref()
            .is_some_and(|(old, _)| old.spec == lease.spec);
        let at = match (&self.observed, unchanged) {
            (Some((_, at)), true) => *at,
            _ => Instant::now(),
        };
        self.observed = Some((lease, at));
    }

    /// Until when the last observed record keeps another holder's claim valid, measured on
    /// the local clock from when it was first seen (`None`: unheld or held by this one).
    fn other_holder_valid_until(&self) -> Option<Instant> {
        let (lease, observed_at) = self.observed.as_ref()?;
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
        if holder == self.config.identity {
            return None;
        }
        let valid_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.config.lease_duration);
        Some(*observed_at + valid_for)
    }

    /// Tries to take or renew the Lease once. `Ok(true)`: this candidate holds it now.
    /// `Ok(false)`: someone else validly holds it, or another candidate won a race.
    ///
    /// A Lease deleted while this candidate held it is an `Err` with code 404 (leadership
    /// is lost; it is not re-created, since a standby may already have). A deleted Lease
    /// whose last observed holder was another candidate is created only once that holder's
    /// record would have expired.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let result = self.attempt().await;
        self.holding = match &result {
            Ok(true) => true,
            // A write conflict leaves the holder unknown until the next read.
            Ok(false) => self.holding && self.holder().is_none(),
            // A failed renewal keeps the claim until the caller's deadline, except a 404.
            Err(e) => self.holding && !is_status(e, 404),
        };
        result
    }

    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let me = self.config.identity.clone();
        let duration = self.config.lease_duration_seconds();

        // Fast path (client-go does the same): the leader updates its cached copy.
        let current = match (&self.observed, self.is_leader()) {
            (Some((lease, _)), true) => lease.clone(),
            _ => match self.api.get(&self.config.lease_name).await {
                Ok(lease) => {
                    self.observe(lease.clone());
                    lease
                }
                Err(e) if is_status(&e, 404) && self.holding => return Err(e),
                Err(e) if is_status(&e, 404) => {
                    if self
                        .other_holder_valid_until()
                        .is_some_and(|until| until > Instant::now())
                    {
                        return Ok(false);
                    }
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.config.lease_name.clone()),
                            namespace: Some(self.config.lease_namespace.clone()),
                            ..Default::default()
                        },
                        spec: Some(LeaseSpec {
                            holder_identity: Some(me),
                            lease_duration_seconds: Some(duration),
                            acquire_time: Some(now.clone()),
                            renew_time: Some(now),
                            lease_transitions: Some(0),
                            ..Default::default()
                        }),
                    };
                    return match self.api.create(&PostParams::default(), &lease).await {
                        Ok(created) => {
                            self.observe(created);
                            Ok(true)
                        }
                        Err(e) if is_status(&e, 409) => Ok(false),
                        Err(e) => Err(e),
                    };
                }
                Err(e) => return Err(e),
            },
        };

        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if self
            .other_holder_valid_until()
            .is_some_and(|until| until > Instant::now())
        {
            return Ok(false);
        }

        let renewing = holder.as_deref() == Some(me.as_str());
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(me);
        new_spec.lease_duration_seconds = Some(duration);
        new_spec.renew_time = Some(now.clone());
        if !renewing {
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        let mut update = current;
        update.spec = Some(new_spec);
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &update)
            .await
        {
            Ok(written) => {
                self.observe(written);
                Ok(true)
            }
            Err(e) if is_status(&e, 409) => {
                // Someone else wrote in between: forget the cache, re-read next time.
                self.observed = None;
                Ok(false)
            }
            Err(e) => {
                if self.is_leader() {
                    // Re-read on the next attempt rather than trusting the cache.
                    self.observed = None;
                }
                Err(e)
            }
        }
    }

    /// Gives the Lease up if this candidate holds it (holder cleared, duration 1s), so a
    /// standby takes over at its next retry. Returns whether a release was written.
    pub async fn release(&mut self) -> Result<bool, kube::Error> {
        let lease = self.api.get(&self.config.lease_name).await?;
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        let mut update = lease;
        update.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: spec.lease_transitions,
            ..Default::default()
        });
        let written = self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &update)
            .await?;
        self.observe(written);
        self.holding = false;
        Ok(true)
    }
}

/// A random duration in `[d, d × (1 + JITTER_FACTOR))`, like client-go's `wait.Jitter`.
fn jitter(d: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 10_000) as f64 / 10_000.0;
    d.mul_f64(1.0 + JITTER_FACTOR * r)
}

/// Runs the controllers while this process is the leader.
///
/// * `config: None` (leader election disabled): `run` is called at once with a child
///   of `shutdown`.
/// * Otherwise waits (standby) until the Lease is acquired, sets
///   `leader_election_master_status{name}` to 1, and calls `run(leader_token)`.
///   - Renewal failing for `renew_deadline`: `leader_token` is cancelled and `run`'s
///     future gets until half-way between the deadline and the earliest moment another
///     candidate can take the Lease to finish; then it is dropped (its requests in flight
///     cancelled) and [`Error::LeadershipLost`] is returned.
///   - The Lease deleted (404) or held by another: the same, without the wait.
///   - `shutdown` cancelled: `leader_token` is cancelled (it is a child of
///     `shutdown`), `run` is awaited while the Lease keeps being renewed, then the
///     Lease is released and `run`'s result returned (`Ok(())` normally).
///   - `run` ending by itself: the Lease is released and its result returned.
///
/// After [`Error::LeadershipLost`] the process must exit at once: tasks the controllers
/// spawned are not theirs to stop here, and only the exit ends their writes in time.
///
/// `shutdown` cancelled while on standby returns `Ok(())` without calling `run`.
pub async fn run_as_leader<F, Fut, E>(
    client: kube::Client,
    config: Option<LeaderElectionConfig>,
    metrics: &Metrics,
    shutdown: CancellationToken,
    run: F,
) -> Result<(), Error>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(config) = config else {
        tracing::info!("leader election disabled, starting controllers");
        return run(shutdown.child_token())
            .await
            .map_err(|e| Error::Run(e.into()));
    };
    config.validate()?;
    let name = config.lease_name.clone();
    let mut lock = LeaseLock::new(client, config.clone());
    metrics.set_leader(&name, false);

    // Standby: try to acquire every retry period (jittered).
    tracing::info!(lease = %name, namespace = %config.lease_namespace, identity = %config.identity, "attempting to acquire leader lease");
    let mut last_renew;
    loop {
        let attempt_start = Instant::now();
        let acquired = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = lock.try_acquire_or_renew() => r,
        };
        match acquired {
            Ok(true) => {
                last_renew = attempt_start;
                break;
            }
            Ok(false) => {
                tracing::debug!(holder = ?lock.holder(), "lease held by another candidate")
            }
            Err(err) => tracing::warn!(%err, "error acquiring leader lease"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(jitter(config.retry_period)) => {}
        }
    }

    tracing::info!(lease = %name, identity = %config.identity, "successfully acquired lease, starting controllers");
    metrics.set_leader(&name, true);
    let leader_token = shutdown.child_token();
    let controllers = run(leader_token.clone());
    tokio::pin!(controllers);

    // Leading: renew every retry period; give up at last_renew + renew_deadline.
    // Renewal goes on while the controllers stop after `shutdown` (as controller-runtime
    // does), so slow-stopping controllers never run without the Lease. The deadline is
    // checked before the controllers are polled: past it, they start nothing new.
    enum End<R> {
        Lost(Loss),
        RunEnded(R),
    }
    let mut stopping = false;
    let mut next_attempt = Instant::now() + config.retry_period;
    let end = loop {
        let deadline = last_renew + config.renew_deadline;
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline) => break End::Lost(Loss::Deadline),
            _ = shutdown.cancelled(), if !stopping => {
                tracing::info!("shutdown requested, stopping controllers");
                stopping = true;
                leader_token.cancel();
                continue;
            }
            r = &mut controllers => break End::RunEnded(r),
            _ = tokio::time::sleep_until(next_attempt) => {}
        }
        // One attempt, racing the deadline (a hung request must not delay the stop).
        let attempt_start = Instant::now();
        let outcome = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline) => break End::Lost(Loss::Deadline),
            _ = shutdown.cancelled(), if !stopping => {
                stopping = true;
                leader_token.cancel();
                continue;
            }
            r = &mut controllers => break End::RunEnded(r),
            r = lock.try_acquire_or_renew() => r,
        };
        match outcome {
            Ok(true) => last_renew = attempt_start,
            Ok(false) => match lock.holder() {
                Some(holder) if holder != config.identity => {
                    break End::Lost(Loss::TakenBy(holder));
                }
                // A write conflict: re-read and retry until the deadline.
                _ => tracing::debug!("lease renewal conflicted, retrying"),
            },
            Err(err) if is_status(&err, 404) => break End::Lost(Loss::Deleted),
            Err(err) => tracing::warn!(%err, "failed to renew leader lease, retrying"),
        }
        next_attempt = Instant::now() + config.retry_period;
    };

    match end {
        End::Lost(loss) => {
            metrics.set_leader(&name, false);
            tracing::error!(lease = %name, identity = %config.identity, reason = %loss, "leader election lost, stopping controllers");
            leader_token.cancel();
            // The earliest another candidate can lead: a lease duration after the record
            // of our last renewal, which it saw no earlier than we sent it; or now, when
            // the Lease is gone or taken.
            let takeover = match loss {
                Loss::Deadline => last_renew + config.lease_duration,
                Loss::Deleted | Loss::TakenBy(_) => Instant::now(),
            };
            // Half of what is left before then is for the controllers to stop by themselves,
            // the other half for the process to exit.
            let stop_by = takeover - (takeover.saturating_duration_since(Instant::now()) / 2);
            // The time limit first: past it, the controllers are not polled again (a poll
            // could send a new request).
            let stopped = stop_by > Instant::now()
                && tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(stop_by) => false,
                    r = &mut controllers => {
                        if let Err(err) = r.map_err(Into::into) {
                            tracing::error!(%err, "controllers failed while stopping");
                        }
                        true
                    }
                };
            if !stopped {
                tracing::error!(
                    "controllers dropped before they stopped: their requests in flight are cancelled"
                );
            }
            Err(Error::LeadershipLost {
                namespace: config.lease_namespace.clone(),
                name,
                identity: config.identity.clone(),
                reason: loss.to_string(),
            })
        }
        End::RunEnded(result) => {
            leader_token.cancel();
            release(&mut lock, &config).await;
            metrics.set_leader(&name, false);
            result.map_err(|e| Error::Run(e.into()))
        }
    }
}

/// Why a leader stopped leading.
enum Loss {
    /// No renewal succeeded within the renew deadline.
    Deadline,
    /// The Lease was deleted.
    Deleted,
    /// Another candidate holds the Lease.
    TakenBy(String),
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loss::Deadline => f.write_str("not renewed within the renew deadline"),
            Loss::Deleted => f.write_str("the lease was deleted"),
            Loss::TakenBy(holder) => write!(f, "the lease is held by {holder}"),
        }
    }
}

/// Releases the Lease (bounded by the renew deadline); failures are only logged since
/// the Lease then simply expires.
async fn release(lock: &mut LeaseLock, config: &LeaderElectionConfig) {
    match tokio::time::timeout(config.renew_deadline, lock.release()).await {
        Ok(Ok(true)) => tracing::info!(lease = %config.lease_name, "released leader lease"),
        Ok(Ok(false)) => {
            tracing::info!(lease = %config.lease_name, "lease no longer ours, nothing to release")
        }
        Ok(Err(err)) => tracing::warn!(%err, "failed to release leader lease; it will expire"),
        Err(_) => tracing::warn!("releasing leader lease timed out; it will expire"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LeaderElectionConfig {
        LeaderElectionConfig::new("lock", "default")
    }

    #[test]
    fn defaults_are_controller_runtime_s() {
        let c = cfg();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert!(c.validate().is_ok());
        let (host, suffix) = c.identity.rsplit_once('_').unwrap();
        assert!(!host.is_empty() && suffix.len() == 36, "{}", c.identity);
        assert_ne!(c.identity, cfg().identity);
    }

    #[test]
    fn rejects_inconsistent_durations() {
        let mut c = cfg();
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.retry_period = Duration::from_secs(9);
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.retry_period = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.lease_duration = Duration::from_secs(2);
        c.renew_deadline = Duration::from_millis(1400);
        c.retry_period = Duration::from_millis(200);
        assert!(c.validate().is_ok());
        assert_eq!(c.lease_duration_seconds(), 2);
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            let j = jitter(Duration::from_secs(1));
            assert!(j >= Duration::from_secs(1) && j < Duration::from_millis(2200));
        }
    }
}
