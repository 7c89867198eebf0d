//! The work queue: which Memcached is reconciled next, in lanes by what woke it.
//!
//! kube-runtime's `Controller` starts what its scheduler releases, at most `concurrency` at
//! once; keys that come due while every slot is taken wait in a set and are taken from it
//! in no particular order. Under a backlog (thousands of pools coming up, each looked at
//! again as its pods turn Ready, and their resyncs) a user's edit waited behind all of it:
//! at 10,000 pools a scale change took 302 s (p99) to reach its Deployment.
//!
//! So the backlog is kept here, in lanes, and a key is released to kube-runtime only while
//! a reconcile slot is free; kube-runtime's runner (unbounded, since this queue bounds it)
//! starts each released key at once, and still never runs two reconciles of one object at
//! once. The lanes, first to last:
//! 1. [`Lane::Change`]: a Memcached edited (a scale change) or deleted, a child edited or
//!    deleted (drift to repair), a Secret its pods mount changed: what someone did.
//! 2. [`Lane::First`]: a Memcached seen for the first time (created, or listed when the
//!    operator starts): its children are created, which gives the cluster work to do.
//! 3. [`Lane::Progress`]: a child's status moved (batched by [`crate::triggers`]), a timed
//!    look again (a paced status write, a rollout slot, a warm-up's end), a retry.
//! 4. [`Lane::Resync`]: the periodic look at a converged pool, a safety net only.
//!
//! The slots are shared by the queues of every watched scope ([`Slots`]; one controller per
//! namespace when the operator watches a list of them): `--max-concurrent-reconciles` bounds
//! the reconciles of the whole operator, and a queue releases a key only when no other
//! queue holds one of a higher lane, so an edit in one namespace does not wait behind
//! another namespace's backlog.
//!
//! Within a lane, first in, first out; the lanes are strict (no ageing): while pools are
//! created faster than they are reconciled, status progress and resyncs wait, as the
//! statuses of pools not yet looked at would. A key is queued once, in the highest lane anything
//! asked for; a key asked for while it is being reconciled is queued again when that
//! reconcile ends (controller-runtime's workqueue keeps such keys "dirty" the same way, and
//! its priority queue orders by priority the same way). Each reconcile says when it wants
//! to be looked at again ([`Next`]); the earliest such look per key is kept, and a
//! reconcile for any other reason replaces it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::triggers::Busy;

/// Why a key is queued, which says how soon it is reconciled: the lanes in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    Change = 0,
    First = 1,
    Progress = 2,
    Resync = 3,
}

const LANES: usize = 4;

/// The longest a look again is put off (a resync period of years, meant as "never", would
/// overflow the timer wheel; kube-runtime clamps the same way).
const LONGEST_WAIT: Duration = Duration::from_secs(180 * 24 * 3600);

/// When a reconciled Memcached wants to be looked at again if nothing wakes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when something changes (an invalid spec, a Memcached being deleted).
    OnChange,
    /// After this long: something it waits for (a Secret, a rollout slot, the end of a
    /// warm-up, a paced status write). In [`Lane::Progress`].
    Recheck(Duration),
    /// After the resync period: the safety net. In [`Lane::Resync`].
    Resync(Duration),
}

/// The reconcile slots of the whole operator, shared by the work queue of every watched
/// scope: at most `limit` reconciles run at once over all of them, and a queue releases a
/// key only when no queue holds one of a higher lane.
pub struct Slots {
    limit: usize,
    busy: Busy,
    census: Mutex<Census>,
}

#[derive(Default)]
struct Census {
    running: usize,
    /// Keys queued, per lane, over every queue.
    waiting: [usize; LANES],
    /// Queues waiting for a slot, or for a higher lane elsewhere to go first.
    waiters: Vec<Waker>,
}

impl Census {
    fn best_waiting(&self) -> Option<usize> {
        self.waiting.iter().position(|n| *n > 0)
    }

    fn wake_all(&mut self) {
        for w in self.waiters.drain(..) {
            w.wake();
        }
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots").field("limit", &self.limit).finish()
    }
}

impl Slots {
    /// Slots for at most `limit` reconciles at once (at least one).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            busy: Busy::new(limit.max(1)),
            census: Mutex::default(),
        })
    }

    /// The running reconciles' count that low-priority work yields to (batched status
    /// refreshes, events): shared like the slots.
    pub fn busy(&self) -> &Busy {
        &self.busy
    }

    fn lock(&self) -> MutexGuard<'_, Census> {
        self.census.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct State<T> {
    slots: Arc<Slots>,
    lanes: [VecDeque<T>; LANES],
    /// The lane each queued key is in (an entry of another lane for the key is stale).
    queued: HashMap<T, Lane>,
    /// Released and not yet done.
    running: HashSet<T>,
    /// Asked for while running: queued in this lane when it is done.
    again: HashMap<T, Lane>,
    timers: DelayQueue<(T, Lane)>,
    timer_of: HashMap<T, (delay_queue::Key, Instant)>,
    waker: Option<Waker>,
}

impl<T: Clone + Eq + Hash> State<T> {
    fn push(&mut self, key: T, lane: Lane) {
        if self.running.contains(&key) {
            self.again
                .entry(key)
                .and_modify(|l| *l = (*l).min(lane))
                .or_insert(lane);
            return;
        }
        let before = self.queued.get(&key).copied();
        if before.is_some_and(|l| l <= lane) {
            return;
        }
        let mut census = self.slots.lock();
        if let Some(l) = before {
            census.waiting[l as usize] -= 1;
        }
        census.waiting[lane as usize] += 1;
        drop(census);
        self.queued.insert(key.clone(), lane);
        self.lanes[lane as usize].push_back(key);
    }

    /// The lane of the first key to go, dropping stale entries in front of it.
    fn head(&mut self) -> Option<usize> {
        for lane in 0..LANES {
            while let Some(key) = self.lanes[lane].front() {
                if self.queued.get(key).is_some_and(|l| *l as usize == lane) {
                    return Some(lane);
                }
                self.lanes[lane].pop_front();
            }
        }
        None
    }

    /// Takes the first key to go if a slot is free and no queue holds a higher lane; else
    /// waits (`cx`) for a slot or for that queue.
    fn release(&mut self, cx: &Context<'_>) -> Option<T> {
        let lane = self.head()?;
        let slots = self.slots.clone();
        let mut census = slots.lock();
        let best = census.best_waiting().unwrap_or(lane);
        if census.running >= slots.limit || best < lane {
            if !census.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                census.waiters.push(cx.waker().clone());
            }
            return None;
        }
        let key = self.lanes[lane].pop_front()?;
        self.queued.remove(&key);
        census.waiting[lane] -= 1;
        census.running += 1;
        if census.running < slots.limit && census.best_waiting().is_some() {
            // Slots are left: other queues may take one.
            census.wake_all();
        }
        Some(key)
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    fn len(&self) -> usize {
        self.queued.len()
    }
}

impl<T> Drop for State<T> {
    /// A queue that stops (its controller stopped) gives back its slots and its place.
    fn drop(&mut self) {
        let mut census = self.slots.lock();
        census.running = census.running.saturating_sub(self.running.len());
        for lane in self.queued.values() {
            census.waiting[*lane as usize] = census.waiting[*lane as usize].saturating_sub(1);
        }
        census.wake_all();
    }
}

/// The queue's handle: shared by the stream that releases keys ([`WorkQueue::release`])
/// and the reconciler, which reports each key done ([`WorkQueue::done`]).
pub struct WorkQueue<T> {
    state: Arc<Mutex<State<T>>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
        }
    }
}

impl<T: Clone + Eq + Hash + Unpin> WorkQueue<T> {
    /// A queue whose keys run in `slots` (shared with other queues, or its own).
    pub fn new(slots: Arc<Slots>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                slots,
                lanes: Default::default(),
                queued: HashMap::new(),
                running: HashSet::new(),
                again: HashMap::new(),
                timers: DelayQueue::new(),
                timer_of: HashMap::new(),
                waker: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` in `lane` (or keeps it where it is, if that is a higher lane).
    pub fn push(&self, key: T, lane: Lane) {
        let mut state = self.lock();
        state.push(key, lane);
        state.wake();
    }

    /// Reports `key`'s reconcile ended (or never started: its object was gone), wanting to
    /// be looked at again as `next` says. Called once per released key.
    pub fn done(&self, key: &T, next: Next) {
        let mut state = self.lock();
        let after = match next {
            Next::OnChange => None,
            Next::Recheck(d) => Some((d, Lane::Progress)),
            Next::Resync(d) => Some((d, Lane::Resync)),
        };
        if let Some((delay, lane)) = after {
            let at = Instant::now() + delay.min(LONGEST_WAIT);
            let earlier = state.timer_of.get(key).is_some_and(|(_, when)| *when <= at);
            if !earlier {
                if let Some((old, _)) = state.timer_of.remove(key) {
                    state.timers.remove(&old);
                }
                let timer = state.timers.insert_at((key.clone(), lane), at);
                state.timer_of.insert(key.clone(), (timer, at));
            }
        }
        if state.running.remove(key) {
            let mut census = state.slots.lock();
            census.running = census.running.saturating_sub(1);
            census.wake_all();
        }
        if let Some(lane) = state.again.remove(key) {
            state.push(key.clone(), lane);
        }
        state.wake();
    }

    /// How many keys wait to be released.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys to reconcile, highest lane first, each released only while a slot is free
    /// and no other queue sharing the slots holds a key of a higher lane; `input` is everything that wakes a key, with its lane. Ends
    /// when `input` has ended and nothing is queued, running or timed.
    pub fn release<S>(&self, input: S) -> Release<T, S>
    where
        S: Stream<Item = (T, Lane)> + Unpin,
    {
        Release {
            queue: self.clone(),
            input: Some(input),
        }
    }
}

/// See [`WorkQueue::release`].
pub struct Release<T, S> {
    queue: WorkQueue<T>,
    input: Option<S>,
}

impl<T, S> Stream for Release<T, S>
where
    T: Clone + Eq + Hash + Unpin,
    S: Stream<Item = (T, Lane)> + Unpin,
{
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        let mut state = this.queue.lock();
        while let Some(input) = this.input.as_mut() {
            match input.poll_next_unpin(cx) {
                Poll::Ready(Some((key, lane))) => state.push(key, lane),
                Poll::Ready(None) => this.input = None,
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(expired)) = state.timers.poll_expired(cx) {
            let (key, lane) = expired.into_inner();
            state.timer_of.remove(&key);
            state.push(key, lane);
        }
        if let Some(key) = state.release(cx) {
            // A reconcile for any reason replaces the timed look; it says when to look next.
            if let Some((timer, _)) = state.timer_of.remove(&key) {
                state.timers.remove(&timer);
            }
            state.running.insert(key.clone());
            return Poll::Ready(Some(key));
        }
        if this.input.is_none()
            && state.queued.is_empty()
            && state.running.is_empty()
            && state.timer_of.is_empty()
        {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Input = futures::stream::BoxStream<'static, (&'static str, Lane)>;
    type Sender = tokio::sync::mpsc::UnboundedSender<(&'static str, Lane)>;

    fn queue_of(
        slots: usize,
    ) -> (
        WorkQueue<&'static str>,
        Sender,
        Release<&'static str, Input>,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let input: Input = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed();
        let queue = WorkQueue::new(Slots::new(slots));
        let out = queue.release(input);
        (queue, tx, out)
    }

    /// Takes what is released now, without waiting.
    async fn released_now<S: Stream<Item = &'static str> + Unpin>(
        out: &mut S,
    ) -> Vec<&'static str> {
        let mut got = Vec::new();
        tokio::task::yield_now().await;
        while let Some(Some(key)) = out.next().now_or_never() {
            got.push(key);
        }
        got
    }

    use futures::FutureExt;

    #[tokio::test(start_paused = true)]
    async fn an_edit_overtakes_the_backlog_and_slots_bound_what_runs() {
        let (queue, tx, mut out) = queue_of(2);
        for key in ["r1", "r2", "r3"] {
            tx.send((key, Lane::Resync)).ok();
        }
        for key in ["p1", "p2"] {
            tx.send((key, Lane::Progress)).ok();
        }
        tx.send(("f1", Lane::First)).ok();
        tx.send(("edit", Lane::Change)).ok();
        assert_eq!(released_now(&mut out).await, ["edit", "f1"], "two slots");
        assert_eq!(queue.len(), 5);
        tx.send(("edit2", Lane::Change)).ok();
        queue.done(&"f1", Next::OnChange);
        assert_eq!(
            released_now(&mut out).await,
            ["edit2"],
            "a slot freed: the later edit goes before the backlog"
        );
        queue.done(&"edit", Next::OnChange);
        queue.done(&"edit2", Next::OnChange);
        assert_eq!(released_now(&mut out).await, ["p1", "p2"]);
        queue.done(&"p1", Next::OnChange);
        queue.done(&"p2", Next::OnChange);
        assert_eq!(released_now(&mut out).await, ["r1", "r2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn queues_sharing_slots_take_turns_by_lane_across_them() {
        // Two namespaces' queues, one slot between them.
        let slots = Slots::new(1);
        let (a, b) = (WorkQueue::new(slots.clone()), WorkQueue::new(slots.clone()));
        let (mut out_a, mut out_b) = (
            a.release(futures::stream::pending::<(&str, Lane)>()),
            b.release(futures::stream::pending::<(&str, Lane)>()),
        );
        a.push("a-new", Lane::First);
        assert_eq!(released_now(&mut out_a).await, ["a-new"]);
        a.push("a-progress", Lane::Progress);
        b.push("b-resync", Lane::Resync);
        assert_eq!(
            released_now(&mut out_b).await,
            Vec::<&str>::new(),
            "no slot"
        );
        b.push("b-edit", Lane::Change);
        a.done(&"a-new", Next::OnChange);
        assert_eq!(
            released_now(&mut out_a).await,
            Vec::<&str>::new(),
            "the other queue's edit goes first"
        );
        assert_eq!(released_now(&mut out_b).await, ["b-edit"]);
        assert_eq!(
            released_now(&mut out_a).await,
            Vec::<&str>::new(),
            "one slot"
        );
        b.done(&"b-edit", Next::OnChange);
        assert_eq!(released_now(&mut out_b).await, Vec::<&str>::new());
        assert_eq!(released_now(&mut out_a).await, ["a-progress"]);
        a.done(&"a-progress", Next::OnChange);
        a.push("a-left", Lane::Change);
        assert_eq!(released_now(&mut out_b).await, Vec::<&str>::new());
        drop((out_a, a));
        assert_eq!(
            released_now(&mut out_b).await,
            ["b-resync"],
            "a stopped queue leaves nothing behind in the slots"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_queued_once_in_its_highest_lane() {
        let (queue, tx, mut out) = queue_of(1);
        tx.send(("a", Lane::Resync)).ok();
        tx.send(("b", Lane::Progress)).ok();
        tx.send(("a", Lane::Change)).ok();
        tx.send(("a", Lane::Progress)).ok();
        tx.send(("b", Lane::Resync)).ok();
        assert_eq!(released_now(&mut out).await, ["a"]);
        assert_eq!(queue.len(), 1, "b once");
        queue.done(&"a", Next::OnChange);
        assert_eq!(released_now(&mut out).await, ["b"]);
        queue.done(&"b", Next::OnChange);
        assert_eq!(
            released_now(&mut out).await,
            Vec::<&str>::new(),
            "a's stale entry is skipped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_woken_while_running_runs_again_after_not_beside_itself() {
        let (queue, tx, mut out) = queue_of(4);
        tx.send(("a", Lane::First)).ok();
        assert_eq!(released_now(&mut out).await, ["a"]);
        tx.send(("a", Lane::Progress)).ok();
        tx.send(("a", Lane::Change)).ok();
        tx.send(("b", Lane::Progress)).ok();
        assert_eq!(released_now(&mut out).await, ["b"], "never two of one key");
        tx.send(("c", Lane::Progress)).ok();
        queue.done(&"a", Next::OnChange);
        assert_eq!(
            released_now(&mut out).await,
            ["a", "c"],
            "queued again when done, in the highest lane it was asked for"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_asks_when_to_look_again_and_any_other_wake_replaces_it() {
        let (queue, tx, mut out) = queue_of(1);
        let start = Instant::now();
        tx.send(("a", Lane::First)).ok();
        assert_eq!(out.next().await, Some("a"));
        queue.done(&"a", Next::Resync(Duration::from_secs(300)));
        queue.done(&"a", Next::Recheck(Duration::from_secs(5)));
        // The earlier of two looks again is kept.
        assert_eq!(out.next().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        queue.done(&"a", Next::Resync(Duration::from_secs(300)));

        tokio::time::sleep(Duration::from_secs(10)).await;
        tx.send(("a", Lane::Progress)).ok();
        assert_eq!(out.next().await, Some("a"), "woken by a change");
        queue.done(&"a", Next::OnChange);
        assert_eq!(
            released_now(&mut out).await,
            Vec::<&str>::new(),
            "the resync timed before it went with it"
        );
        drop(tx);
        assert_eq!(
            out.next().await,
            None,
            "ends with its input once nothing is left"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_look_waits_in_its_lane_behind_edits() {
        let (queue, tx, mut out) = queue_of(1);
        tx.send(("busy", Lane::First)).ok();
        assert_eq!(out.next().await, Some("busy"));
        queue.push("resynced", Lane::First);
        // "resynced" is released later; first it is timed.
        let mut taken = Vec::new();
        queue.done(&"busy", Next::OnChange);
        taken.push(out.next().await);
        queue.done(&"resynced", Next::Resync(Duration::from_secs(2)));
        tx.send(("busy", Lane::First)).ok();
        taken.push(out.next().await);
        tokio::time::sleep(Duration::from_secs(3)).await;
        tx.send(("edit", Lane::Change)).ok();
        queue.done(&"busy", Next::OnChange);
        taken.push(out.next().await);
        queue.done(&"edit", Next::OnChange);
        taken.push(out.next().await);
        assert_eq!(
            taken,
            [
                Some("resynced"),
                Some("busy"),
                Some("edit"),
                Some("resynced")
            ]
        );
    }
}
