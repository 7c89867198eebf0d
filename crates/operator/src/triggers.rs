//! How changes to a Memcached's children wake the Memcached, at two speeds.
//!
//! A child that was edited (its spec, labels, annotations or ownership) or deleted is drift
//! the reconciler must repair, so it triggers a reconcile **now**. A child whose status moved
//! (a pod got its IP or turned Ready, the Deployment counted another ready replica) or that
//! just appeared (usually because the reconciler itself created it) only changes what the
//! Memcached's status reports; those wake-ups are **batched**: the first one for a Memcached
//! starts a window, later ones inside it are absorbed, and one reconcile runs when it ends.
//!
//! A new Memcached of size 3 sees about a dozen such changes in its first second (four
//! children appear, three pods are created, get IPs and turn Ready, the Deployment counts
//! them). Reconciling on each wrote its status three to four times; with a window of a
//! second it is written about twice, and the status is never more than a window behind.
//! controller-runtime offers the same trade through a rate-limited queue per source; here it
//! is a stream adaptor in front of kube-runtime's `Controller::reconcile_on`, whose
//! scheduler still deduplicates and serialises reconciles of one object.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio_util::time::{DelayQueue, delay_queue};

/// How soon a change should reconcile the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// Drift to repair: reconcile at once.
    Now,
    /// Status only: reconcile within the batching window.
    Batched,
}

/// Hash of the part of an object whose change is drift (spec, metadata).
pub type SpecHash<K> = fn(&K) -> u64;
/// Hash of the part of an object whose change only moves the owner's status.
pub type StatusHash<K> = fn(&K) -> u64;

/// Remembers, per object, the two hashes last seen, and classifies each new sighting.
pub struct Classifier<K: Resource<DynamicType = ()>> {
    seen: HashMap<ObjectRef<K>, (u64, u64)>,
    spec: SpecHash<K>,
    status: StatusHash<K>,
}

impl<K: Resource<DynamicType = ()>> Classifier<K> {
    pub fn new(spec: SpecHash<K>, status: StatusHash<K>) -> Self {
        Self {
            seen: HashMap::new(),
            spec,
            status,
        }
    }

    /// `None` when nothing the reconciler reads changed. An object being deleted (or gone:
    /// the informer passes deletions on marked as being deleted) is always urgent, and is
    /// forgotten so that its final removal is urgent too.
    pub fn classify(&mut self, obj: &K) -> Option<Urgency> {
        let key = ObjectRef::new(&obj.name_any()).within(obj.namespace().as_deref()?);
        if obj.meta().deletion_timestamp.is_some() {
            self.seen.remove(&key);
            return Some(Urgency::Now);
        }
        let now = ((self.spec)(obj), (self.status)(obj));
        match self.seen.insert(key, now) {
            None => Some(Urgency::Batched),
            Some(before) if before.0 != now.0 => Some(Urgency::Now),
            Some(before) if before.1 != now.1 => Some(Urgency::Batched),
            Some(_) => None,
        }
    }

    /// Whether no object is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Passes `Now` keys through at once and releases each `Batched` key once, `window` after
/// the first of a burst. A `Now` for a key with a pending batch replaces the batch.
pub struct Batch<T, S> {
    input: Option<S>,
    window: Duration,
    queue: DelayQueue<T>,
    pending: HashMap<T, delay_queue::Key>,
}

/// See [`Batch`]. With a zero `window`, every key passes through at once.
pub fn batch<T, S>(input: S, window: Duration) -> Batch<T, S>
where
    T: Clone + Eq + std::hash::Hash + Unpin,
    S: Stream<Item = (T, Urgency)> + Unpin,
{
    Batch {
        input: Some(input),
        window,
        queue: DelayQueue::new(),
        pending: HashMap::new(),
    }
}

impl<T, S> Stream for Batch<T, S>
where
    T: Clone + Eq + std::hash::Hash + Unpin,
    S: Stream<Item = (T, Urgency)> + Unpin,
{
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        while let Some(input) = this.input.as_mut() {
            match input.poll_next_unpin(cx) {
                Poll::Ready(Some((key, urgency))) => {
                    if urgency == Urgency::Now || this.window.is_zero() {
                        if let Some(pending) = this.pending.remove(&key) {
                            this.queue.remove(&pending);
                        }
                        return Poll::Ready(Some(key));
                    }
                    if !this.pending.contains_key(&key) {
                        let pending = this.queue.insert(key.clone(), this.window);
                        this.pending.insert(key, pending);
                    }
                }
                Poll::Ready(None) => this.input = None,
                Poll::Pending => break,
            }
        }
        match this.queue.poll_expired(cx) {
            Poll::Ready(Some(expired)) => {
                let key = expired.into_inner();
                this.pending.remove(&key);
                Poll::Ready(Some(key))
            }
            // An empty queue: done only when the input is.
            Poll::Ready(None) if this.input.is_none() => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::hash::{DefaultHasher, Hash, Hasher};
    use tokio::time::Instant;

    fn pod(name: &str, label: &str, ip: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"l": label}},
            "status": {"podIP": ip},
        }))
        .unwrap_or_default()
    }

    fn labels(p: &Pod) -> u64 {
        let mut h = DefaultHasher::new();
        p.metadata.labels.hash(&mut h);
        h.finish()
    }

    fn ip(p: &Pod) -> u64 {
        let mut h = DefaultHasher::new();
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.as_ref())
            .hash(&mut h);
        h.finish()
    }

    #[test]
    fn edits_and_deletions_are_urgent_status_and_new_objects_are_batched() {
        let mut c = Classifier::new(labels, ip);
        assert_eq!(c.classify(&pod("a", "x", None)), Some(Urgency::Batched));
        assert_eq!(c.classify(&pod("a", "x", None)), None, "nothing changed");
        assert_eq!(
            c.classify(&pod("a", "x", Some("10.0.0.1"))),
            Some(Urgency::Batched)
        );
        assert_eq!(
            c.classify(&pod("a", "y", Some("10.0.0.1"))),
            Some(Urgency::Now)
        );
        let mut deleting = pod("a", "y", Some("10.0.0.1"));
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(c.classify(&deleting), Some(Urgency::Now));
        assert!(c.is_empty(), "a deleted object is forgotten");
        assert_eq!(
            c.classify(&deleting),
            Some(Urgency::Now),
            "its final removal after a graceful deletion is urgent too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_one_reconcile_after_the_window_and_urgent_keys_skip_it() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(&str, Urgency)>();
        let input = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let window = Duration::from_secs(1);
        let mut out = batch(input, window);
        let start = Instant::now();

        for _ in 0..5 {
            tx.send(("a", Urgency::Batched)).ok();
        }
        tx.send(("b", Urgency::Now)).ok();
        assert_eq!(out.next().await, Some("b"), "urgent keys are not held");
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(out.next().await, Some("a"), "five changes, one reconcile");
        assert_eq!(start.elapsed(), window, "released when the window ends");

        // A burst for "c" is pending when an urgent change for it comes: the urgent one
        // goes through at once and the batch is dropped.
        tx.send(("c", Urgency::Batched)).ok();
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.send(("c", Urgency::Now)).ok();
        tx.send(("d", Urgency::Batched)).ok();
        assert_eq!(out.next().await, Some("c"));
        assert_eq!(out.next().await, Some("d"));
        assert_eq!(
            start.elapsed(),
            window + Duration::from_millis(300) + window
        );

        drop(tx);
        assert_eq!(out.next().await, None, "ends with its input");
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_window_passes_everything_through() {
        let input = futures::stream::iter([("a", Urgency::Batched), ("a", Urgency::Batched)]);
        let out: Vec<&str> = batch(input, Duration::ZERO).collect().await;
        assert_eq!(out, ["a", "a"]);
    }
}
