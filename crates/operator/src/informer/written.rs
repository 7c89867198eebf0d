//! Read-your-writes: an informer's cache together with the objects this process wrote that
//! the watch has not delivered yet.
//!
//! A reconcile that runs between our write of a child and the watch's event for it would
//! find the cache without the child (or with the version before the write), and would
//! either read it from the API server again (a child not in the cache may be someone
//! else's object of that name) or compare the desired state with an outdated version. On
//! a busy operator the watch can trail by many seconds: at 1,000 pools over 100 namespaces
//! each Deployment was read back up to ten times before the cache had it. A [`Cache`]
//! answers with the newer of the two: the cached object, or the answer to our own write
//! until the watch delivers that version or a later one.
//!
//! An entry goes when the watch delivers that version or a later one, when it delivers the
//! object's deletion, at a re-list, or after [`WRITTEN_TTL`] (whatever the watch did). A
//! deletion the watch delivered before our answer came back is remembered for as long, so
//! that the answer does not bring the deleted object back.
//! Versions are compared as numbers (the API server's are etcd revisions); an object whose
//! version is not a number is never held here.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::{Store, place};

/// How long a written object answers for the cache at most.
pub const WRITTEN_TTL: Duration = Duration::from_secs(120);

/// The version of `obj` as a number, if it is one.
fn version<K: Resource>(obj: &K) -> Option<u64> {
    obj.resource_version()?.parse().ok()
}

struct Entry<K> {
    version: u64,
    at: Instant,
    object: Arc<K>,
}

/// The entries are filed under a hash of the object's namespace and name ([`State::key`]),
/// not under an `ObjectRef` (a copy of its name, namespace, version and uid, twice per
/// write while thousands of pools are created): an entry answers only for the object it
/// holds ([`State::held`]), so another object of the same hash (by a hasher seeded per
/// process) only finds nothing.
struct State<K: Resource<DynamicType = ()>> {
    by_ref: HashMap<u64, Entry<K>>,
    /// Deletions the watch delivered: the version deleted, and when.
    deleted: HashMap<u64, (u64, Instant)>,
    /// When each entry and deletion was made, oldest first (one already gone, or made
    /// again since, is skipped when its turn comes).
    order: VecDeque<(Instant, u64)>,
    hasher: RandomState,
}

/// The objects this process wrote that the watch has not delivered yet (a cheap handle).
pub struct Written<K: Resource<DynamicType = ()>> {
    state: Arc<Mutex<State<K>>>,
    /// Whether a [`Cache`] reads through these (the kinds we write): the watch's events of
    /// the other kinds (pods, Secrets) cost one load here and nothing else.
    used: Arc<AtomicBool>,
}

impl<K: Resource<DynamicType = ()>> Clone for Written<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            used: self.used.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> Default for Written<K> {
    fn default() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                by_ref: HashMap::new(),
                deleted: HashMap::new(),
                order: VecDeque::new(),
                hasher: RandomState::new(),
            })),
            used: Arc::default(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> State<K> {
    fn key(&self, namespace: Option<&str>, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    fn key_of(&self, obj: &K) -> u64 {
        let (namespace, name) = place(obj);
        self.key(namespace, name)
    }

    /// The key `namespace`/`name` is filed under, and its entry if one holds that object.
    fn held(&self, namespace: Option<&str>, name: &str) -> (u64, Option<&Entry<K>>) {
        let key = self.key(namespace, name);
        let entry = self.by_ref.get(&key).filter(|e| {
            let meta = e.object.meta();
            meta.name.as_deref() == Some(name) && meta.namespace.as_deref() == namespace
        });
        (key, entry)
    }

    /// The entry `obj` would be filed under, if one holds that object.
    fn held_of(&self, obj: &K) -> (u64, Option<&Entry<K>>) {
        let meta = obj.meta();
        self.held(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    /// Drops what is past its time at `now` (oldest first: each is looked at once).
    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front()
            && now.duration_since(*at) >= WRITTEN_TTL
        {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.by_ref.get(&key).is_some_and(|e| e.at == at) {
                self.by_ref.remove(&key);
            }
            if self.deleted.get(&key).is_some_and(|(_, when)| *when == at) {
                self.deleted.remove(&key);
            }
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone> Written<K> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// Records `obj` as the server stored it in answer to our write, at `now`.
    pub fn record(&self, obj: Arc<K>, now: Instant) {
        let Some(version) = version(obj.as_ref()) else {
            return;
        };
        let mut state = self.state();
        let key = state.key_of(obj.as_ref());
        state.expire(now);
        // A write older than one already held (answers can come back out of order) leaves
        // it; one the watch has already delivered the deletion of is not brought back.
        if state.by_ref.get(&key).is_some_and(|e| e.version > version)
            || state.deleted.get(&key).is_some_and(|(v, _)| *v >= version)
        {
            return;
        }
        state.order.push_back((now, key));
        state.by_ref.insert(
            key,
            Entry {
                version,
                at: now,
                object: obj,
            },
        );
    }

    /// The watch delivered `obj`: a written version it reaches is no longer needed.
    pub fn seen(&self, obj: &K) {
        if !self.used() {
            return;
        }
        let mut state = self.state();
        if state.by_ref.is_empty() {
            return;
        }
        let (key, entry) = state.held_of(obj);
        if entry.is_some_and(|e| version(obj).is_none_or(|v| v >= e.version)) {
            state.by_ref.remove(&key);
        }
    }

    /// The watch delivered the deletion of `obj`, at `now`.
    pub fn deleted(&self, obj: &K, now: Instant) {
        if !self.used() {
            return;
        }
        let mut state = self.state();
        let (key, entry) = state.held_of(obj);
        if entry.is_some() {
            state.by_ref.remove(&key);
        }
        state.expire(now);
        if let Some(version) = version(obj) {
            state.order.push_back((now, key));
            state.deleted.insert(key, (version, now));
        }
    }

    /// The watch re-listed: the cache holds the server's state.
    pub fn clear(&self) {
        let mut state = self.state();
        state.by_ref.clear();
        state.deleted.clear();
        state.order.clear();
    }

    /// The newer of `cached` and our write of `key`, at `now`.
    fn newer(&self, key: &ObjectRef<K>, cached: Option<Arc<K>>, now: Instant) -> Option<Arc<K>> {
        let mut state = self.state();
        let (hash, entry) = state.held(key.namespace.as_deref(), &key.name);
        let Some(entry) = entry else {
            return cached;
        };
        let caught_up = cached
            .as_ref()
            .is_some_and(|c| version(c.as_ref()).is_none_or(|v| v >= entry.version));
        if caught_up || now.duration_since(entry.at) >= WRITTEN_TTL {
            state.by_ref.remove(&hash);
            return cached;
        }
        Some(entry.object.clone())
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.state().by_ref.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An informer's cache as this process's reconciles read it: the store, with our own
/// writes the watch has not delivered yet (a cheap handle).
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    written: Written<K>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            written: self.written.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Cache<K> {
    /// `store`, with the writes `written` holds (from now on, the watch's events of this
    /// kind are checked against them).
    pub fn new(store: Store<K>, written: Written<K>) -> Self {
        written.used.store(true, Ordering::Relaxed);
        Self { store, written }
    }

    /// `store` alone, for an informer that keeps no writes (a write is held only as long
    /// as this handle, which the caller drops after one apply).
    pub fn of_store(store: Store<K>) -> Self {
        Self::new(store, Written::default())
    }

    /// The object `key`: the cached one, or our write of it when that is newer.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.written.newer(key, self.store.get(key), Instant::now())
    }

    /// Records our write of an object (the server's answer).
    pub fn wrote(&self, obj: K) {
        self.written.record(Arc::new(obj), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    use crate::informer::Writer;

    fn cm(name: &str, version: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..Default::default()
        }
    }

    /// A cache reading through `written`, and the store's writer (the watch's side).
    fn cache() -> (Cache<ConfigMap>, Written<ConfigMap>, Writer<ConfigMap>) {
        let (store, writer) = Store::<ConfigMap>::new();
        let written = Written::default();
        (Cache::new(store, written.clone()), written, writer)
    }

    fn key(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    fn data(obj: Option<Arc<ConfigMap>>) -> Option<String> {
        obj.and_then(|o| o.data.as_ref()?.get("k").cloned())
    }

    #[test]
    fn a_write_answers_until_the_watch_delivers_it() {
        let (cache, written, mut writer) = cache();
        // Created by us; the watch has not delivered it.
        cache.wrote(cm("a", "10", "new"));
        assert_eq!(data(cache.get(&key("a"))).as_deref(), Some("new"));
        // The watch delivers an older version first: ours is still the newer.
        writer.apply(Event::Apply(cm("a", "9", "old")));
        written.seen(&cm("a", "9", "old"));
        assert_eq!(data(cache.get(&key("a"))).as_deref(), Some("new"));
        // Then ours: the cache answers, and nothing is held any more.
        writer.apply(Event::Apply(cm("a", "10", "new")));
        written.seen(&cm("a", "10", "new"));
        assert!(written.is_empty());
        assert_eq!(data(cache.get(&key("a"))).as_deref(), Some("new"));
    }

    #[test]
    fn a_cache_that_caught_up_on_its_own_wins() {
        let (cache, written, mut writer) = cache();
        cache.wrote(cm("a", "10", "ours"));
        // A later change by someone else reached the cache before its event was seen here.
        writer.apply(Event::Apply(cm("a", "12", "theirs")));
        assert_eq!(data(cache.get(&key("a"))).as_deref(), Some("theirs"));
        assert!(written.is_empty());
    }

    #[test]
    fn a_deletion_or_a_relist_drops_what_was_written() {
        let (cache, written, _writer) = cache();
        cache.wrote(cm("a", "10", "ours"));
        cache.wrote(cm("b", "11", "ours"));
        written.deleted(&cm("a", "12", "ours"), Instant::now());
        assert_eq!(cache.get(&key("a")), None);
        assert!(cache.get(&key("b")).is_some());
        written.clear();
        assert_eq!(cache.get(&key("b")), None);
    }

    #[test]
    fn an_answer_that_comes_back_after_the_deletion_does_not_revive_it() {
        let (_cache, written, _writer) = cache();
        let t0 = Instant::now();
        // The watch delivered the creation and the deletion before our answer came back.
        written.deleted(&cm("a", "11", "ours"), t0);
        written.record(Arc::new(cm("a", "10", "ours")), t0);
        assert_eq!(written.newer(&key("a"), None, t0), None);
        // A later write (the object created again) is held.
        written.record(Arc::new(cm("a", "13", "again")), t0);
        assert_eq!(
            data(written.newer(&key("a"), None, t0)).as_deref(),
            Some("again")
        );
        // The deletion is forgotten in time.
        written.record(Arc::new(cm("b", "20", "x")), t0 + WRITTEN_TTL);
        assert!(written.state().deleted.is_empty());
        // A kind no cache writes through (pods) keeps nothing of its deletions.
        let unwritten = Written::<ConfigMap>::default();
        unwritten.deleted(&cm("x", "5", ""), t0);
        assert!(unwritten.state().deleted.is_empty());
    }

    #[test]
    fn a_write_answers_for_a_limited_time_and_never_goes_back() {
        let written = Written::<ConfigMap>::default();
        let t0 = Instant::now();
        written.record(Arc::new(cm("a", "10", "ten")), t0);
        // An answer that comes back late, for an older write, leaves the newer one.
        written.record(Arc::new(cm("a", "9", "nine")), t0);
        assert_eq!(
            data(written.newer(&key("a"), None, t0)).as_deref(),
            Some("ten")
        );
        assert_eq!(written.newer(&key("a"), None, t0 + WRITTEN_TTL), None);
        // Entries past their time go as others are recorded.
        written.record(Arc::new(cm("b", "1", "x")), t0);
        written.record(Arc::new(cm("c", "2", "y")), t0 + WRITTEN_TTL);
        assert_eq!(written.len(), 1);
        // A version that is not a number is never held.
        written.record(Arc::new(cm("d", "v1", "z")), t0 + WRITTEN_TTL);
        assert_eq!(written.len(), 1);
    }

    /// An entry answers only for the object it holds: another object filed under the same
    /// hash (forced here) finds nothing, and the watch's events of it leave the entry.
    #[test]
    fn an_entry_answers_only_for_its_own_object() {
        let written = Written::<ConfigMap>::default();
        let t0 = Instant::now();
        {
            let mut state = written.state();
            let b = state.key(Some("ns"), "b");
            state.by_ref.insert(
                b,
                Entry {
                    version: 10,
                    at: t0,
                    object: Arc::new(cm("a", "10", "a's")),
                },
            );
        }
        written.used.store(true, Ordering::Relaxed);
        assert_eq!(written.newer(&key("b"), None, t0), None);
        written.seen(&cm("b", "11", "b's"));
        written.deleted(&cm("b", "12", "b's"), t0);
        assert_eq!(written.len(), 1, "b's events leave the entry holding a");
    }
}
