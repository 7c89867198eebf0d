//! An informer's cache: the objects of one kind in one scope, by namespace and name.
//!
//! kube-runtime's reflector store files each object under an `ObjectRef`: a copy of its
//! name, namespace, resourceVersion and uid (four strings, 96 bytes inline) in a table of
//! 104-byte slots. For the children and pods of 10,000 pools that is some 60,000 keys, the
//! largest part of the cache after the objects themselves. The store here keeps only the
//! objects: a table of `Arc`s (8 bytes a slot) found by a hash of the namespace and name
//! they carry, compared with the object's own on every lookup, so two objects of one hash
//! never stand for each other.
//!
//! It behaves as kube-runtime's: an event is applied before anyone hears of it; a re-list
//! fills a buffer swapped in whole when it ends (a reader sees the old list or the new one,
//! never half); the store is ready after its first list. The Memcacheds' cache stays
//! kube-runtime's own ([`Store::kube`]), since kube-runtime's `Controller` reads its
//! objects from that type.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, RwLock};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use tokio::sync::watch;

use super::place;

/// A read-only handle on an informer's cache (a cheap clone).
pub struct Store<K: Resource<DynamicType = ()> + Clone + 'static> {
    backing: Backing<K>,
}

enum Backing<K: Resource<DynamicType = ()> + Clone + 'static> {
    Own(Arc<Shared<K>>),
    Kube(reflector::Store<K>),
}

struct Shared<K> {
    objects: RwLock<HashTable<Arc<K>>>,
    hasher: RandomState,
    ready: watch::Receiver<bool>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for Store<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("len", &self.len()).finish()
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            backing: match &self.backing {
                Backing::Own(shared) => Backing::Own(shared.clone()),
                Backing::Kube(store) => Backing::Kube(store.clone()),
            },
        }
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn hash(&self, at: (Option<&str>, &str)) -> u64 {
        self.hasher.hash_one(at)
    }

    fn find(&self, objects: &HashTable<Arc<K>>, at: (Option<&str>, &str)) -> Option<Arc<K>> {
        objects
            .find(self.hash(at), |o| place(o.as_ref()) == at)
            .cloned()
    }

    fn insert(&self, objects: &mut HashTable<Arc<K>>, obj: Arc<K>) {
        let probe = obj.clone();
        let at = place(probe.as_ref());
        let entry = objects.entry(
            self.hash(at),
            |o| place(o.as_ref()) == at,
            |o| self.hash(place(o.as_ref())),
        );
        match entry {
            Entry::Occupied(mut held) => *held.get_mut() = obj,
            Entry::Vacant(room) => {
                room.insert(obj);
            }
        }
    }

    fn remove(&self, objects: &mut HashTable<Arc<K>>, obj: &K) {
        let at = place(obj);
        if let Ok(held) = objects.find_entry(self.hash(at), |o| place(o.as_ref()) == at) {
            held.remove();
        }
    }
}

impl<K> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// A store of our own and the writer that fills it.
    pub fn new() -> (Self, Writer<K>) {
        let (ready_tx, ready) = watch::channel(false);
        let shared = Arc::new(Shared {
            objects: RwLock::new(HashTable::new()),
            hasher: RandomState::new(),
            ready,
        });
        let writer = Writer {
            backing: WriterBacking::Own {
                shared: shared.clone(),
                buffer: None,
                ready: Some(ready_tx),
            },
        };
        (
            Self {
                backing: Backing::Own(shared),
            },
            writer,
        )
    }

    /// A store on kube-runtime's own, the writer that fills it, and kube-runtime's handle
    /// on it (for the kind a kube-runtime `Controller` reconciles: it reads from that type).
    pub fn kube() -> (Self, Writer<K>, reflector::Store<K>) {
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        (
            Self {
                backing: Backing::Kube(store.clone()),
            },
            Writer {
                backing: WriterBacking::Kube(writer),
            },
            store,
        )
    }

    /// The object `key` names, if cached.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        match &self.backing {
            Backing::Own(shared) => {
                let objects = shared.objects.read().unwrap_or_else(|e| e.into_inner());
                shared.find(&objects, (key.namespace.as_deref(), key.name.as_str()))
            }
            Backing::Kube(store) => store.get(key),
        }
    }

    /// The cached object of `obj`'s namespace and name.
    pub fn get_like(&self, obj: &K) -> Option<Arc<K>> {
        match &self.backing {
            Backing::Own(shared) => {
                let objects = shared.objects.read().unwrap_or_else(|e| e.into_inner());
                shared.find(&objects, place(obj))
            }
            Backing::Kube(store) => store.get(&ObjectRef::from_obj(obj)),
        }
    }

    /// Every cached object, in no particular order.
    pub fn state(&self) -> Vec<Arc<K>> {
        match &self.backing {
            Backing::Own(shared) => {
                let objects = shared.objects.read().unwrap_or_else(|e| e.into_inner());
                objects.iter().cloned().collect()
            }
            Backing::Kube(store) => store.state(),
        }
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        match &self.backing {
            Backing::Own(shared) => shared
                .objects
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .len(),
            Backing::Kube(store) => store.len(),
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the first full list is cached (at once if the writer is gone: nothing
    /// more will come).
    pub async fn wait_until_ready(&self) {
        match &self.backing {
            Backing::Own(shared) => {
                let mut ready = shared.ready.clone();
                let _ = ready.wait_for(|r| *r).await;
            }
            Backing::Kube(store) => {
                let _ = store.wait_until_ready().await;
            }
        }
    }
}

/// Fills a [`Store`] from a watch's events.
pub struct Writer<K: Resource<DynamicType = ()> + Clone + 'static> {
    backing: WriterBacking<K>,
}

enum WriterBacking<K: Resource<DynamicType = ()> + Clone + 'static> {
    Own {
        shared: Arc<Shared<K>>,
        /// A re-list in progress, swapped in when it ends.
        buffer: Option<HashTable<Arc<K>>>,
        /// Told once, at the end of the first list.
        ready: Option<watch::Sender<bool>>,
    },
    Kube(reflector::store::Writer<K>),
}

impl<K> Writer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies `event` to the store, and hands it on with the object as the store holds it
    /// (one `Arc` for the store and its readers; a deleted object as the watch last saw it).
    pub fn apply(&mut self, event: watcher::Event<K>) -> watcher::Event<Arc<K>> {
        match &mut self.backing {
            WriterBacking::Kube(writer) => {
                writer.apply_watcher_event(&event);
                match event {
                    watcher::Event::Apply(obj) => watcher::Event::Apply(Arc::new(obj)),
                    watcher::Event::Delete(obj) => watcher::Event::Delete(Arc::new(obj)),
                    watcher::Event::Init => watcher::Event::Init,
                    watcher::Event::InitApply(obj) => watcher::Event::InitApply(Arc::new(obj)),
                    watcher::Event::InitDone => watcher::Event::InitDone,
                }
            }
            WriterBacking::Own {
                shared,
                buffer,
                ready,
            } => match event {
                watcher::Event::Apply(obj) => {
                    let obj = Arc::new(obj);
                    let mut objects = shared.objects.write().unwrap_or_else(|e| e.into_inner());
                    shared.insert(&mut objects, obj.clone());
                    watcher::Event::Apply(obj)
                }
                watcher::Event::Delete(obj) => {
                    let mut objects = shared.objects.write().unwrap_or_else(|e| e.into_inner());
                    shared.remove(&mut objects, &obj);
                    watcher::Event::Delete(Arc::new(obj))
                }
                watcher::Event::Init => {
                    *buffer = Some(HashTable::new());
                    watcher::Event::Init
                }
                watcher::Event::InitApply(obj) => {
                    let obj = Arc::new(obj);
                    shared.insert(buffer.get_or_insert_with(HashTable::new), obj.clone());
                    watcher::Event::InitApply(obj)
                }
                watcher::Event::InitDone => {
                    let listed = buffer.take().unwrap_or_default();
                    let old = {
                        let mut objects = shared.objects.write().unwrap_or_else(|e| e.into_inner());
                        std::mem::replace(&mut *objects, listed)
                    };
                    // The previous list is freed outside the lock.
                    drop(old);
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(true);
                    }
                    watcher::Event::InitDone
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;

    fn cm(namespace: &str, name: &str, data: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace}, "data": {"k": data}
        }))
        .expect("valid ConfigMap")
    }

    fn data(obj: Option<Arc<ConfigMap>>) -> Option<String> {
        obj.and_then(|o| o.data.as_ref()?.get("k").cloned())
    }

    fn key(namespace: &str, name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within(namespace)
    }

    fn names(store: &Store<ConfigMap>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn objects_are_found_by_namespace_and_name_and_replaced_in_place() {
        let (store, mut writer) = Store::new();
        writer.apply(watcher::Event::Apply(cm("a", "x", "1")));
        writer.apply(watcher::Event::Apply(cm("b", "x", "2")));
        writer.apply(watcher::Event::Apply(cm("a", "x", "3")));
        assert_eq!(store.len(), 2);
        assert_eq!(data(store.get(&key("a", "x"))).as_deref(), Some("3"));
        assert_eq!(data(store.get(&key("b", "x"))).as_deref(), Some("2"));
        assert_eq!(store.get(&key("a", "y")), None);
        assert_eq!(
            data(store.get_like(&cm("b", "x", ""))).as_deref(),
            Some("2")
        );
        writer.apply(watcher::Event::Delete(cm("a", "x", "3")));
        assert_eq!(names(&store), ["b/x"]);
    }

    #[test]
    fn a_relist_is_seen_whole_once_it_ends() {
        let (store, mut writer) = Store::new();
        writer.apply(watcher::Event::Apply(cm("a", "old", "1")));
        writer.apply(watcher::Event::Init);
        writer.apply(watcher::Event::InitApply(cm("a", "new", "2")));
        // The re-list in progress is not seen yet.
        assert_eq!(names(&store), ["a/old"]);
        writer.apply(watcher::Event::InitDone);
        assert_eq!(names(&store), ["a/new"]);
    }

    #[tokio::test]
    async fn ready_after_the_first_list_or_once_the_writer_is_gone() {
        let (store, mut writer) = Store::<ConfigMap>::new();
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        writer.apply(watcher::Event::Init);
        writer.apply(watcher::Event::InitApply(cm("a", "x", "1")));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        writer.apply(watcher::Event::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("ready after the first list")
            .expect("the waiting task");

        let (store, writer) = Store::<ConfigMap>::new();
        drop(writer);
        tokio::time::timeout(std::time::Duration::from_secs(10), store.wait_until_ready())
            .await
            .expect("nothing more to wait for");
    }
}
