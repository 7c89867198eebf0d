//! The flush on demand (`spec.flush`): each new `requestedAt` empties every pod's cache
//! once, one pod at a time, with `pauseSeconds` between two pods, and restarts nothing.
//!
//! A poisoned cache (values written by a bad deploy of a client, say) is usually flushed by
//! hand, pod by pod, with a pause so the backend refills one pod's share of the keys before
//! the next pod's misses start. The operator does the same: it sends memcached's
//! `flush_all` over the text protocol to each Ready pod's IP and port in turn, by pod name,
//! and keeps the progress in `status.flush` (the pods flushed, when the last was, when all
//! were), with an event per pod. The progress is also remembered in the process, so a
//! reconcile that runs on a cached Memcached whose status is older than the last flush
//! never flushes a pod twice nor shortens a pause. After a restart of the operator the
//! status is where it resumes.
//!
//! [`next_step`] decides (pure); [`step`] does what it says (one connection at most).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use memcached_api::{FlushSpec, FlushStatus, Memcached};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tracing::{info, warn};

use super::context::Context;
use crate::status::ObservedPod;

/// How long one pod's connection, `flush_all` and answer may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a failed flush of a pod is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// The progress of each pool's flush as this process last left it, by owner key.
#[derive(Debug, Default)]
pub struct Flushes(Mutex<HashMap<u64, FlushStatus>>);

impl Flushes {
    fn get(&self, owner: u64) -> Option<FlushStatus> {
        self.lock().get(&owner).cloned()
    }

    fn set(&self, owner: u64, progress: Option<FlushStatus>) {
        let mut map = self.lock();
        match progress {
            Some(p) => map.insert(owner, p),
            None => map.remove(&owner),
        };
    }

    /// Forgets a deleted pool's flush.
    pub fn forget(&self, owner: u64) {
        self.set(owner, None);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, FlushStatus>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a reconcile does about the flush.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing asked, or the flush asked is done: the progress as it is.
    Idle(Option<FlushStatus>),
    /// The pause after the last pod is not over: look again after it.
    Wait(FlushStatus, Duration),
    /// Flush this pod (name, `ip:port`), then record it in the progress.
    Flush(FlushStatus, String, String),
    /// Every Ready pod is flushed: the progress with its completion time.
    Complete(FlushStatus),
}

/// The next step of `spec`'s flush, from what is known of its progress (this process's
/// memory, else the status) and the pool's pods now.
pub fn next_step(
    spec: Option<&FlushSpec>,
    remembered: Option<FlushStatus>,
    status: Option<&FlushStatus>,
    pods: &[ObservedPod],
    port: i32,
    now: jiff::Timestamp,
) -> Step {
    let Some(spec) = spec else {
        return Step::Idle(status.cloned());
    };
    let progress = remembered
        .filter(|p| p.requested_at == spec.requested_at)
        .or_else(|| {
            status
                .filter(|p| p.requested_at == spec.requested_at)
                .cloned()
        })
        .unwrap_or_else(|| FlushStatus {
            requested_at: spec.requested_at.clone(),
            ..FlushStatus::default()
        });
    if progress.completion_time.is_some() {
        return Step::Idle(Some(progress));
    }
    if let Some(last) = &progress.last_flush_time {
        let next = last.0 + Duration::from_secs(u64::try_from(spec.pause_seconds).unwrap_or(0));
        if let Ok(left) = Duration::try_from(next.duration_since(now))
            && !left.is_zero()
        {
            return Step::Wait(progress, left);
        }
    }
    let mut waiting: Vec<_> = pods
        .iter()
        .filter(|p| p.ready && !progress.flushed.contains(&p.name))
        .filter_map(|p| Some((p.name.clone(), p.ip.clone()?)))
        .collect();
    waiting.sort();
    match waiting.into_iter().next() {
        Some((pod, ip)) => {
            let address = if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            };
            Step::Flush(progress, pod, address)
        }
        None => Step::Complete(FlushStatus {
            completion_time: Some(Time(now)),
            ..progress
        }),
    }
}

/// Takes the next step of `mc`'s flush: at most one pod flushed. Returns the progress for
/// the status and when to look again.
pub async fn step(
    ctx: &Context,
    mc: &Memcached,
    owner: u64,
    pods: &[ObservedPod],
) -> (Option<FlushStatus>, Option<Duration>) {
    let now = jiff::Timestamp::now();
    let status = mc.status.as_ref().and_then(|s| s.flush.as_ref());
    let step = next_step(
        mc.spec.flush.as_ref(),
        ctx.flushes.get(owner),
        status,
        pods,
        mc.spec.container_port,
        now,
    );
    let (progress, recheck) = match step {
        Step::Idle(progress) => (progress, None),
        Step::Wait(progress, left) => (Some(progress), Some(left)),
        Step::Complete(progress) => {
            let note = format!(
                "Flushed every Ready pod for {} ({} pods)",
                progress.requested_at,
                progress.flushed.len()
            );
            ctx.events
                .publish(mc, EventType::Normal, "FlushCompleted", "Flush", note);
            (Some(progress), None)
        }
        Step::Flush(mut progress, pod, address) => match flush_all(&address).await {
            Ok(()) => {
                info!(
                    pod,
                    address,
                    requested_at = progress.requested_at,
                    "flushed"
                );
                progress.flushed.push(pod.clone());
                progress.last_flush_time = Some(Time(jiff::Timestamp::now()));
                let note = format!(
                    "Flushed pod {pod} for {} ({} so far)",
                    progress.requested_at,
                    progress.flushed.len()
                );
                ctx.events
                    .publish(mc, EventType::Normal, "Flushed", "Flush", note);
                let pause = mc.spec.flush.as_ref().map_or(0, |f| f.pause_seconds);
                let pause = Duration::from_secs(u64::try_from(pause).unwrap_or(0));
                // The next pod (or the completion) at the end of the pause.
                (Some(progress), Some(pause.max(Duration::from_millis(100))))
            }
            Err(e) => {
                warn!(pod, address, error = %e, "flush failed");
                let note = format!("Could not flush pod {pod} at {address}: {e}; trying again");
                ctx.events
                    .publish(mc, EventType::Warning, "FlushFailed", "Flush", note);
                (Some(progress), Some(RETRY))
            }
        },
    };
    let remembered = mc.spec.flush.as_ref().and(progress.clone());
    ctx.flushes.set(owner, remembered);
    (progress, recheck)
}

/// Sends `flush_all` to memcached at `address` and reads its `OK`.
async fn flush_all(address: &str) -> Result<(), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        stream
            .write_all(b"flush_all\r\n")
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let mut line = String::new();
        BufReader::new(&mut stream)
            .read_line(&mut line)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        let _ = stream.write_all(b"quit\r\n").await;
        match line.trim_end() {
            "OK" => Ok(()),
            other => Err(format!("memcached answered {other:?}")),
        }
    };
    tokio::time::timeout(FLUSH_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {FLUSH_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> ObservedPod {
        ObservedPod {
            zone: None,
            created: None,
            name: name.into(),
            ip: Some(format!("10.0.0.{}", name.len())),
            ready,
        }
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + seconds).expect("a time")
    }

    fn spec(requested_at: &str, pause_seconds: i32) -> FlushSpec {
        FlushSpec {
            requested_at: requested_at.into(),
            pause_seconds,
        }
    }

    /// Ready pods by name, one per step, the pause between them, then done; a new request
    /// starts again from the first pod; nothing is flushed without one.
    #[test]
    fn pods_are_flushed_one_at_a_time_by_name_with_the_pause_between() {
        let pods = [pod("b", true), pod("aa", true), pod("ccc", false)];
        let s = spec("t1", 30);
        let first = next_step(Some(&s), None, None, &pods, 11211, at(0));
        let Step::Flush(progress, name, address) = first else {
            panic!("{first:?}")
        };
        assert_eq!((name.as_str(), address.as_str()), ("aa", "10.0.0.2:11211"));
        let progress = FlushStatus {
            flushed: vec![name],
            last_flush_time: Some(Time(at(0))),
            ..progress
        };
        assert_eq!(
            next_step(Some(&s), Some(progress.clone()), None, &pods, 11211, at(10)),
            Step::Wait(progress.clone(), Duration::from_secs(20))
        );
        let Step::Flush(progress, name, _) =
            next_step(Some(&s), Some(progress), None, &pods, 11211, at(30))
        else {
            panic!("the second pod after the pause")
        };
        assert_eq!(name, "b");
        let progress = FlushStatus {
            flushed: vec!["aa".into(), name],
            last_flush_time: Some(Time(at(30))),
            ..progress
        };
        // The pod that is not Ready is not waited for.
        let done = next_step(Some(&s), Some(progress.clone()), None, &pods, 11211, at(60));
        let Step::Complete(done) = done else {
            panic!("{done:?}")
        };
        assert_eq!(done.completion_time, Some(Time(at(60))));
        assert_eq!(
            next_step(Some(&s), Some(done.clone()), None, &pods, 11211, at(90)),
            Step::Idle(Some(done.clone()))
        );
        // The status alone (after a restart of the operator) says the same.
        assert_eq!(
            next_step(Some(&s), None, Some(&done), &pods, 11211, at(90)),
            Step::Idle(Some(done.clone()))
        );
        // A new request starts again.
        let again = next_step(
            Some(&spec("t2", 30)),
            None,
            Some(&done),
            &pods,
            11211,
            at(90),
        );
        assert!(
            matches!(&again, Step::Flush(p, name, _) if name == "aa" && p.flushed.is_empty()),
            "{again:?}"
        );
        // No request: nothing, whatever the status says.
        assert_eq!(
            next_step(None, None, Some(&done), &pods, 11211, at(90)),
            Step::Idle(Some(done))
        );
    }

    /// What this process remembers wins over an older status (a reconcile on a cached
    /// object that does not show the last flush yet).
    #[test]
    fn the_remembered_progress_wins_over_an_older_status() {
        let pods = [pod("aa", true), pod("b", true)];
        let s = spec("t1", 30);
        let remembered = FlushStatus {
            requested_at: "t1".into(),
            flushed: vec!["aa".into()],
            last_flush_time: Some(Time(at(0))),
            completion_time: None,
        };
        let older = FlushStatus {
            requested_at: "t1".into(),
            ..FlushStatus::default()
        };
        assert_eq!(
            next_step(
                Some(&s),
                Some(remembered.clone()),
                Some(&older),
                &pods,
                11211,
                at(5)
            ),
            Step::Wait(remembered, Duration::from_secs(25))
        );
    }
}
