//! Informers: a kube-runtime `watcher` feeding a `reflector` store, run independently of any
//! controller so the cache stays warm on a standby and is shared by everything that reads it.
//! A controller subscribes when it starts (on taking the lease) and gets every cached object
//! once, then every change, deletions included.
//!
//! kube-runtime's own shared streams (`Writer::subscribe`) do not pass deletions on, and a
//! deleted child must trigger its owner at once, so the fan-out here is ours; the watching,
//! backoff and caching are kube-runtime's.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::warn;

type Subscribers<K> = Arc<Mutex<Vec<mpsc::UnboundedSender<K>>>>;

/// A running watch + cache of one kind, in one scope (a namespace or the cluster).
pub struct Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
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
        let (store, writer) = reflector::store::<K>();
        let subscribers: Subscribers<K> = Arc::default();
        let fan_out = subscribers.clone();
        let kind = K::kind(&()).into_owned();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .modify(slim)
                .reflect(writer)
                .boxed();
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => obj,
                    // A deleted object is passed on marked as being deleted, so predicates
                    // that look at the deletion state let it through (a deleted child must
                    // trigger its owner, to be recreated).
                    Ok(watcher::Event::Delete(mut obj)) => {
                        obj.meta_mut()
                            .deletion_timestamp
                            .get_or_insert_with(|| Time(jiff::Timestamp::now()));
                        obj
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                    Err(e) => {
                        warn!(kind, error = %e, "watch failed; retrying with backoff");
                        continue;
                    }
                };
                let mut subs = fan_out.lock().unwrap_or_else(|e| e.into_inner());
                subs.retain(|tx| tx.send(obj.clone()).is_ok());
            }
        });
        Self {
            store,
            subscribers,
            task,
        }
    }

    /// The cache (read-only view).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Waits until the first full list has been cached.
    pub async fn wait_synced(&self) {
        // The writer lives as long as the task; if the task ended, there is nothing to wait for.
        let _ = self.store.wait_until_ready().await;
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
            .chain(tokio_stream_from(rx))
            .map(Ok)
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.store.state().len()
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

fn tokio_stream_from<K: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<K>,
) -> impl Stream<Item = K> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

impl<K> Drop for Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}
