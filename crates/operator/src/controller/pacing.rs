//! How often a pool's status is written while it only makes progress.
//!
//! A new pool of three moves its status five times or so on its way up (its pods appear,
//! the Deployment counts them, each turns Ready); under load those moves come seconds
//! apart, each in its own batch window ([`crate::triggers`]), and writing each cost about
//! five status writes per new pool at 1,000 pools (BENCHMARKS.md). A reader needs few of
//! them: what a status change means (a condition turning, a problem, a pod leaving the
//! endpoints, a new generation observed) is written at once, and the rest, which only adds
//! to what was written (pods listed, counts, messages), at most once per interval per pool.
//! The last such write is always made: a held write looks again when its interval ends.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use memcached_api::MemcachedStatus;
use tokio::time::Instant;

use crate::status;

/// When each pool's status was last written, and how long progress waits after that.
#[derive(Debug)]
pub struct StatusPacing {
    interval: Duration,
    /// By owner key (see `apply::owner_key`); pruned of writes older than the interval.
    last: Mutex<HashMap<u64, Instant>>,
}

/// The map is pruned of writes older than the interval whenever its size reaches a power of
/// two from this one on, so it holds about the pools written within one interval.
const PRUNE_AT: usize = 64;

impl StatusPacing {
    /// Progress is written at most once per `interval` per pool (zero: at once).
    pub fn new(interval: Duration) -> Self {
        StatusPacing {
            interval,
            last: Mutex::default(),
        }
    }

    /// How long the write of `want` over `live` waits, or `None` when it is made now (or
    /// there is nothing to write): when it changes more than progress, or the pool's status
    /// was not written within the interval (nor ever, by this process).
    pub fn hold(
        &self,
        owner: u64,
        live: Option<&MemcachedStatus>,
        want: &MemcachedStatus,
        now: Instant,
    ) -> Option<Duration> {
        let live = live?;
        // Nothing to write: no look again is needed either.
        if self.interval.is_zero() || live == want || !status::progress_only(live, want) {
            return None;
        }
        let last = self.lock().get(&owner).copied()?;
        (last + self.interval)
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// Records a write of `owner`'s status at `now`.
    pub fn written(&self, owner: u64, now: Instant) {
        if self.interval.is_zero() {
            return;
        }
        let mut last = self.lock();
        last.insert(owner, now);
        if last.len() >= PRUNE_AT && last.len().is_power_of_two() {
            last.retain(|_, at| now.duration_since(*at) < self.interval);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use memcached_api::condition;

    fn cond(type_: &str, status: bool, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    /// A pool of 3 on its way up with `ready` pods Ready.
    fn rising(ready: usize) -> MemcachedStatus {
        let pods = ["a", "b", "c"];
        MemcachedStatus {
            nodes: pods.iter().map(|p| p.to_string()).collect(),
            replicas: 3,
            ready_replicas: ready as i32,
            observed_generation: Some(1),
            endpoints: pods[..ready].iter().map(|p| format!("{p}:11211")).collect(),
            conditions: vec![
                cond(condition::AVAILABLE, ready == 3, "x"),
                cond(condition::PROGRESSING, ready < 3, &format!("{ready} ready")),
                cond(condition::DEGRADED, false, "AsExpected"),
            ],
            ..MemcachedStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn progress_waits_for_the_interval_and_what_it_means_does_not() {
        let pacing = StatusPacing::new(Duration::from_secs(5));
        let start = Instant::now();
        let (zero, one, two, three) = (rising(0), rising(1), rising(2), rising(3));
        assert_eq!(
            pacing.hold(1, Some(&zero), &one, start),
            None,
            "never written by this process: at once"
        );
        pacing.written(1, start);
        let later = start + Duration::from_secs(2);
        assert_eq!(
            pacing.hold(1, Some(&one), &two, later),
            Some(Duration::from_secs(3)),
            "a pod more is progress: held until the interval ends"
        );
        assert_eq!(
            pacing.hold(2, Some(&one), &two, later),
            None,
            "another pool"
        );
        assert_eq!(
            pacing.hold(1, Some(&two), &three, later),
            None,
            "the pool turning Available is written at once"
        );
        assert_eq!(pacing.hold(1, None, &one, later), None, "a first status");
        assert_eq!(
            pacing.hold(1, Some(&two), &two, later),
            None,
            "nothing to write: no look again"
        );
        assert_eq!(
            pacing.hold(1, Some(&two), &one, later),
            None,
            "a pod leaving the endpoints is written at once"
        );
        assert_eq!(
            pacing.hold(1, Some(&one), &two, start + Duration::from_secs(5)),
            None,
            "the interval is over"
        );
        let off = StatusPacing::new(Duration::ZERO);
        off.written(1, start);
        assert_eq!(
            off.hold(1, Some(&one), &two, later),
            None,
            "zero: never held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_map_keeps_only_recent_writes() {
        let pacing = StatusPacing::new(Duration::from_secs(5));
        let start = Instant::now();
        for owner in 0..(PRUNE_AT as u64 - 1) {
            pacing.written(owner, start);
        }
        pacing.written(1000, start + Duration::from_secs(6));
        assert_eq!(pacing.lock().len(), 1, "the older writes are pruned");
    }
}
