//! Informers: a kube-runtime `watcher` feeding a [`Store`], run independently of any
//! controller so the cache stays warm on a standby and is shared by everything that reads it.
//! A controller subscribes when it starts (on taking the lease) and gets every cached object
//! once, then every change, deletions included.
//!
//! kube-runtime's own shared streams (`Writer::subscribe`) do not pass deletions on, and a
//! deleted child must trigger its owner at once, so the fan-out here is ours. The watching
//! and its backoff are kube-runtime's; the store behaves as its reflector's, in less memory
//! (see [`store`]). Objects deleted while the watch was down (and so missing from the
//! re-list, with no Delete event) are passed on as deletions too. A re-list is passed on
//! only once the store has swapped it in (at `InitDone`), so an object a subscriber hears
//! of is in the store when the reconcile it triggers looks for it.
//!
//! An informer can also keep an [`Index`]: the cached objects grouped by a key (the pods of
//! one Memcached), so a reader finds its few objects without scanning the whole cache.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::warn;

mod store;
mod while_served;
mod written;

pub use store::{Store, Writer};
pub use while_served::WhileServed;
pub use written::{Cache, Written};

/// The subscribers' channels. They carry `Arc`s, not objects: a tokio channel allocates
/// its slots 32 at a time, and with 10 kinds watched per namespace and a `Memcached` of
/// 2.6 KB (a pod of 0.5 KB) inline, slots of objects cost 16 to 84 KB per channel before a
/// single change: 17 of an idle operator's 49.5 MiB over 100 namespaces (BENCHMARKS.md,
/// "What the idle operator held").
type Subscribers<K> = Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<K>>>>>;

/// The key an object is indexed under (`None`: not indexed).
pub type IndexKey<K> = fn(&K) -> Option<String>;

/// A 64-bit hash of `parts`: the index remembers objects and keys by these instead of by
/// their strings (see [`Index`]).
fn hash_of(parts: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// Where an object is in its kind: its namespace and name. The caches, the index and our
/// held writes all file objects under this (hashed), never under a copy of it.
pub(crate) fn place<K: Resource>(obj: &K) -> (Option<&str>, &str) {
    let meta = obj.meta();
    (
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// An object's identity in its kind and scope: its [`place`], hashed.
pub(crate) fn identity<K: Resource>(obj: &K) -> u64 {
    hash_of(place(obj))
}

struct IndexState<K> {
    /// The store's own `Arc`s (no copies), by the hash of their key.
    by_key: HashMap<u64, Vec<Arc<K>>>,
    /// Each indexed object's identity → the hash of its key, to move or drop it.
    key_of: HashMap<u64, u64>,
}

impl<K: Resource> IndexState<K> {
    fn remove(&mut self, id: u64) {
        if let Some(old) = self.key_of.remove(&id)
            && let Some(objects) = self.by_key.get_mut(&old)
        {
            objects.retain(|o| identity(o.as_ref()) != id);
            if objects.is_empty() {
                self.by_key.remove(&old);
            }
        }
    }

    fn insert(&mut self, obj: Arc<K>, key: Option<&str>) {
        let id = identity(obj.as_ref());
        self.remove(id);
        if let Some(key) = key {
            let key = hash_of(key);
            self.by_key.entry(key).or_default().push(obj);
            self.key_of.insert(id, key);
        }
    }
}

/// The cached objects of an informer grouped by a key; a cheap handle (clone it freely).
/// Lookups cost the size of the group, not of the cache.
///
/// The index holds the same `Arc`s as the store, and remembers keys and objects by 64-bit
/// hashes: with 900 pods `heaptrack` counts ~0.04 MB, against 0.41 MB when it kept every
/// pod's `ObjectRef` twice (each with name, namespace, uid and resourceVersion) and every key
/// as a string. A lookup checks each object's key itself, so colliding hashes cannot mix groups.
pub struct Index<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    key: IndexKey<K>,
    state: Arc<RwLock<IndexState<K>>>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Index<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            key: self.key,
            state: self.state.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Index<K> {
    fn new(store: Store<K>, key: IndexKey<K>) -> Self {
        Self {
            store,
            key,
            state: Arc::new(RwLock::new(IndexState {
                by_key: HashMap::new(),
                key_of: HashMap::new(),
            })),
        }
    }

    /// The cached objects under `key`, in no particular order.
    pub fn get(&self, key: &str) -> Vec<Arc<K>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state
            .by_key
            .get(&hash_of(key))
            .map(|objects| {
                objects
                    .iter()
                    .filter(|o| (self.key)(o).as_deref() == Some(key))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Number of keys with at least one object.
    pub fn keys(&self) -> usize {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.by_key.len()
    }

    /// Follows `event`, which the store has already applied (its objects as the store
    /// holds them).
    fn apply(&self, event: &watcher::Event<Arc<K>>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(obj) => {
                let key = (self.key)(obj);
                state.insert(obj.clone(), key.as_deref());
            }
            watcher::Event::Delete(obj) => state.remove(identity(obj.as_ref())),
            // A re-list fills a buffer that the store swaps in when it ends; the index is
            // rebuilt from the store then, so it never holds objects the store does not.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                state.by_key.clear();
                state.key_of.clear();
                for obj in self.store.state() {
                    let key = (self.key)(&obj);
                    state.insert(obj, key.as_deref());
                }
            }
        }
    }
}

/// A running watch + cache of one kind, in one scope (a namespace or the cluster).
pub struct Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    /// Our writes the watch has not delivered yet (see [`Cache`]).
    written: Written<K>,
    subscribers: Subscribers<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching `api` with `config`; `slim` trims each object before it is cached
    /// (drop what no reader needs, to keep memory small).
    pub fn start(api: Api<K>, config: watcher::Config, slim: fn(&mut K)) -> Self {
        let (store, writer) = Store::new();
        Self::spawn(watcher(api, config), slim, store, writer, None)
    }

    /// [`Informer::start`] on kube-runtime's own store, for the kind a kube-runtime
    /// `Controller` reconciles: it reads its objects from that type, returned too.
    pub fn start_for_controller(
        api: Api<K>,
        config: watcher::Config,
        slim: fn(&mut K),
    ) -> (Self, reflector::Store<K>) {
        let (store, writer, kube_store) = Store::kube();
        (
            Self::spawn(watcher(api, config), slim, store, writer, None),
            kube_store,
        )
    }

    /// [`Informer::start`], also keeping an [`Index`] of the cache by `key`.
    pub fn start_indexed(
        api: Api<K>,
        config: watcher::Config,
        slim: fn(&mut K),
        key: IndexKey<K>,
    ) -> (Self, Index<K>) {
        let (store, writer) = Store::new();
        let index = Index::new(store.clone(), key);
        let informer = Self::spawn(
            watcher(api, config),
            slim,
            store,
            writer,
            Some(index.clone()),
        );
        (informer, index)
    }

    fn spawn(
        watch: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
        slim: fn(&mut K),
        store: Store<K>,
        mut writer: Writer<K>,
        indexer: Option<Index<K>>,
    ) -> Self {
        let subscribers: Subscribers<K> = Arc::default();
        let fan_out = subscribers.clone();
        let written: Written<K> = Written::default();
        let seen = written.clone();
        let kind = K::kind(&()).into_owned();
        let store_for_task = store.clone();
        let task = tokio::spawn(async move {
            let mut events = watch.default_backoff().modify(slim).boxed();
            // The cache as it was when a re-list started (the store swaps at its end).
            let mut before_relist: Vec<Arc<K>> = Vec::new();
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => writer.apply(event),
                    Err(e) => {
                        warn!(kind, error = %e, "watch failed; retrying with backoff");
                        continue;
                    }
                };
                // The store has the change already; the index follows before anyone is
                // told, so a reconcile it triggers sees both.
                if let Some(index) = &indexer {
                    index.apply(&event);
                }
                // Our writes: not needed once the watch delivers them (or a deletion).
                match &event {
                    watcher::Event::Apply(obj) => seen.seen(obj.as_ref()),
                    watcher::Event::Delete(obj) => seen.deleted(obj.as_ref(), Instant::now()),
                    watcher::Event::InitDone => seen.clear(),
                    _ => {}
                }
                let changed = match event {
                    watcher::Event::Apply(obj) => vec![obj],
                    // A deleted object is passed on marked as being deleted, so predicates
                    // that look at the deletion state let it through (a deleted child must
                    // trigger its owner, to be recreated).
                    watcher::Event::Delete(obj) => {
                        vec![Arc::new(marked_deleted(Arc::unwrap_or_clone(obj)))]
                    }
                    watcher::Event::Init => {
                        before_relist = store_for_task.state();
                        continue;
                    }
                    // A re-listed object goes to a buffer the store swaps in at InitDone, and
                    // a reconcile finds its object in the store or not at all (kube-runtime
                    // drops it then, without a requeue): the re-list is passed on once the
                    // store holds it.
                    watcher::Event::InitApply(_) => continue,
                    // The store now holds exactly the re-list: every object in it, then the
                    // objects deleted while the watch was down (gone from the new list
                    // without a Delete event), passed on as deletions.
                    watcher::Event::InitDone => {
                        let before = std::mem::take(&mut before_relist);
                        // Nobody to tell (a standby, or the first list): no copies made. A
                        // subscriber arriving later starts from the store.
                        if fan_out.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                            continue;
                        }
                        relisted(&store_for_task, before)
                    }
                };
                let mut subs = fan_out.lock().unwrap_or_else(|e| e.into_inner());
                for obj in changed {
                    // One object shared (with the store, too); each subscriber takes it out
                    // when it reads it.
                    subs.retain(|tx| tx.send(obj.clone()).is_ok());
                }
            }
        });
        Self {
            store,
            written,
            subscribers,
            task,
        }
    }

    /// The cache (read-only view).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The cache with our writes the watch has not delivered yet (see [`Cache`]).
    pub fn cache(&self) -> Cache<K> {
        Cache::new(self.store.clone(), self.written.clone())
    }

    /// Waits until the first full list has been cached.
    pub async fn wait_synced(&self) {
        // The writer lives as long as the task; if the task ended, there is nothing to wait for.
        self.store.wait_until_ready().await;
    }

    /// A stream of every cached object once, then every changed or deleted object, for as
    /// long as the stream is held. Shaped as a watcher stream so it plugs into kube-runtime's
    /// `Controller::for_stream` / `owns_stream` / `watches_stream`.
    pub fn subscribe(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        // Register first, then snapshot: an object changing in between is delivered twice,
        // never lost.
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        let snapshot: Vec<K> = self.store.state().iter().map(|o| (**o).clone()).collect();
        futures::stream::iter(snapshot)
            .chain(tokio_stream_from(rx).map(Arc::unwrap_or_clone))
            .map(Ok)
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names of cached objects (for logs and tests).
    pub fn names(&self) -> Vec<String> {
        self.store.state().iter().map(|o| o.name_any()).collect()
    }
}

/// `obj` marked as being deleted (if it was not already).
fn marked_deleted<K: Resource>(mut obj: K) -> K {
    obj.meta_mut()
        .deletion_timestamp
        .get_or_insert_with(|| Time(jiff::Timestamp::now()));
    obj
}

/// After a re-list: every object `now` holds, then those of `before` it no longer holds,
/// marked as being deleted.
fn relisted<K>(now: &Store<K>, before: Vec<Arc<K>>) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut changed = now.state();
    changed.extend(vanished(before, now).into_iter().map(Arc::new));
    changed
}

/// The objects of `before` that `now` no longer holds, marked as being deleted.
fn vanished<K>(before: Vec<Arc<K>>, now: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    before
        .into_iter()
        .filter(|obj| now.get_like(obj).is_none())
        .map(|obj| marked_deleted(Arc::unwrap_or_clone(obj)))
        .collect()
}

fn tokio_stream_from<K: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<K>,
) -> impl Stream<Item = K> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

impl<K> Drop for Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str, instance: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"instance": instance}}
        }))
        .expect("valid pod")
    }

    fn key(p: &Pod) -> Option<String> {
        p.labels().get("instance").cloned()
    }

    fn names(index: &Index<Pod>, key: &str) -> Vec<String> {
        let mut names: Vec<String> = index.get(key).iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_change() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let server = apisim::ApiServer::builder().build();
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
        let informer = Informer::start(api.clone(), watcher::Config::default(), |_| {});
        informer.wait_synced().await;
        let streams = [
            informer.subscribe(),
            informer.subscribe(),
            informer.subscribe(),
        ];
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shared"}, "data": {"k": "v"}
        }))
        .expect("valid ConfigMap");
        api.create(&Default::default(), &cm).await.expect("created");
        for mut stream in streams {
            let seen = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
                .await
                .ok()
                .flatten()
                .and_then(Result::ok);
            assert_eq!(seen.map(|c| c.name_any()).as_deref(), Some("shared"));
        }
    }

    #[test]
    fn objects_missing_from_a_relist_are_reported_deleted() {
        let (store, mut writer) = Store::<Pod>::new();
        for name in ["a", "b", "c"] {
            writer.apply(watcher::Event::Apply(pod(name, "x")));
        }
        let before = store.state();
        writer.apply(watcher::Event::Init);
        writer.apply(watcher::Event::InitApply(pod("b", "x")));
        writer.apply(watcher::Event::InitDone);
        let mut gone: Vec<Pod> = vanished(before, &store);
        gone.sort_by_key(|p| p.name_any());
        assert_eq!(
            gone.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert!(gone.iter().all(|p| p.metadata.deletion_timestamp.is_some()));
    }

    #[test]
    fn index_follows_changes_deletions_and_relists() {
        let (store, mut writer) = Store::<Pod>::new();
        let index = Index::new(store, key);
        let mut apply = |event: watcher::Event<Pod>| {
            let event = writer.apply(event);
            index.apply(&event);
        };
        apply(watcher::Event::Apply(pod("a", "x")));
        apply(watcher::Event::Apply(pod("b", "x")));
        apply(watcher::Event::Apply(pod("c", "y")));
        assert_eq!(names(&index, "x"), ["a", "b"]);
        assert_eq!(names(&index, "y"), ["c"]);

        // Relabelled: moves to its new key.
        apply(watcher::Event::Apply(pod("a", "y")));
        assert_eq!(names(&index, "x"), ["b"]);
        assert_eq!(names(&index, "y"), ["a", "c"]);

        apply(watcher::Event::Delete(pod("b", "x")));
        assert!(index.get("x").is_empty());
        assert_eq!(index.keys(), 1);

        // A re-list replaces everything once it is complete, as the store does.
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(pod("d", "z")));
        assert_eq!(names(&index, "y"), ["a", "c"]);
        apply(watcher::Event::InitDone);
        assert!(index.get("y").is_empty());
        assert_eq!(names(&index, "z"), ["d"]);
        assert_eq!(index.keys(), 1);
    }
}
