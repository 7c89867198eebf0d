//! An informer of a kind only some clusters serve (a custom resource of another project:
//! the Prometheus Operator's ServiceMonitor), running while its CustomResourceDefinition
//! exists. A metadata-only watch of that one definition says when it comes and goes, so
//! nothing polls discovery: a converged operator sends no request either way.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{Informer, Store, Subscribers, tokio_stream_from};

/// The informer while it runs, and the task passing its changes on.
struct Running<K: Resource<DynamicType = ()> + Clone + 'static> {
    informer: Informer<K>,
    forward: tokio::task::JoinHandle<()>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for Running<K> {
    fn drop(&mut self) {
        self.forward.abort();
    }
}

/// An [`Informer`] of `K` started when the definition `crd` appears and stopped when it goes.
pub struct WhileServed<K: Resource<DynamicType = ()> + Clone + 'static> {
    running: Arc<RwLock<Option<Running<K>>>>,
    subscribers: Subscribers<K>,
    /// Whether the definition's watch has listed it once (`true`), and whether it exists.
    known: watch::Receiver<bool>,
    /// Whether the kind is served now (moves when the definition comes or goes).
    served: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a refused watch of the definition waits before it is tried again (a cluster
/// admin may grant the read later; the retry is one request per period, not a poll of
/// discovery).
const REFUSED_RETRY: Duration = Duration::from_secs(300);

/// How long [`WhileServed::wait_synced`] waits for the kind's first list before the
/// operator goes on without it (a role that may read the definition but not list the kind
/// must not hold every other cache's readiness).
const SYNC_BOUND: Duration = Duration::from_secs(60);

impl<K> WhileServed<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    /// Watches the definition named `crd` through `client`, running `start()` while it
    /// exists. When the definition may not be watched (the operator's role lacks it, as a
    /// namespaced install's may), the kind is taken as not served, said in the log, and the
    /// watch is tried again every [`REFUSED_RETRY`].
    pub fn start(
        client: Client,
        crd: &str,
        start: impl Fn() -> Informer<K> + Send + Sync + 'static,
    ) -> Self {
        let running: Arc<RwLock<Option<Running<K>>>> = Arc::default();
        let subscribers: Subscribers<K> = Arc::default();
        let (known_tx, known) = watch::channel(false);
        let (served_tx, served) = watch::channel(false);
        let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={crd}"));
        let (run, fan_out, name) = (running.clone(), subscribers.clone(), crd.to_string());
        let task = tokio::spawn(async move {
            let mut exists = false;
            loop {
                let mut events = watcher(crds.clone(), config.clone()).boxed();
                let mut listed = false;
                let mut refused = false;
                while let Some(event) = events.next().await {
                    let now = match event {
                        Ok(watcher::Event::Init) => {
                            listed = false;
                            continue;
                        }
                        Ok(watcher::Event::InitApply(_)) => {
                            listed = true;
                            continue;
                        }
                        Ok(watcher::Event::InitDone) => listed,
                        Ok(watcher::Event::Apply(_)) => true,
                        Ok(watcher::Event::Delete(_)) => false,
                        Err(watcher::Error::InitialListFailed(kube::Error::Api(e)))
                        | Err(watcher::Error::WatchStartFailed(kube::Error::Api(e)))
                            if e.code == 403 =>
                        {
                            warn!(crd = name, error = %e.message, retry_in = ?REFUSED_RETRY, "may not watch this CustomResourceDefinition: its kind is taken as not served");
                            refused = true;
                            false
                        }
                        Err(e) => {
                            warn!(crd = name, error = %e, "watch of a CustomResourceDefinition failed; retrying");
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            continue;
                        }
                    };
                    if now != exists {
                        exists = now;
                        info!(
                            crd = name,
                            served = now,
                            "a kind the operator may manage came or went"
                        );
                        let mut slot = run.write().unwrap_or_else(|e| e.into_inner());
                        *slot = now.then(|| Self::run(&start, &fan_out));
                        drop(slot);
                        let _ = served_tx.send(now);
                    }
                    let _ = known_tx.send(true);
                    if refused {
                        break;
                    }
                }
                tokio::time::sleep(REFUSED_RETRY).await;
            }
        });
        Self {
            running,
            subscribers,
            known,
            served,
            task,
        }
    }

    /// Starts the kind's informer, its changes passed on to the subscribers.
    fn run(start: &impl Fn() -> Informer<K>, fan_out: &Subscribers<K>) -> Running<K> {
        let informer = start();
        let changes = informer.subscribe();
        let fan_out = fan_out.clone();
        let forward = tokio::spawn(async move {
            let mut changes = std::pin::pin!(changes);
            while let Some(Ok(obj)) = changes.next().await {
                let obj = Arc::new(obj);
                let mut subs = fan_out.lock().unwrap_or_else(|e| e.into_inner());
                subs.retain(|tx| tx.send(obj.clone()).is_ok());
            }
        });
        Running { informer, forward }
    }

    /// Whether the kind is served, now and as it comes and goes.
    pub fn served(&self) -> watch::Receiver<bool> {
        self.served.clone()
    }

    /// The cache while the kind is served.
    pub fn store(&self) -> Option<Store<K>> {
        let running = self.running.read().unwrap_or_else(|e| e.into_inner());
        running.as_ref().map(|r| r.informer.store())
    }

    /// Waits until it is known whether the kind is served, and if it is, until its cache
    /// holds its first list, for [`SYNC_BOUND`] at most (then the operator goes on: the
    /// children of that kind are read from the API server until the cache has them).
    pub async fn wait_synced(&self) {
        let mut known = self.known.clone();
        let _ = known.wait_for(|k| *k).await;
        let store = self.store();
        if let Some(store) = store
            && tokio::time::timeout(SYNC_BOUND, store.wait_until_ready())
                .await
                .is_err()
        {
            warn!(bound = ?SYNC_BOUND, "a served kind's cache did not list in time; going on without it");
        }
    }

    /// Every change of the kind's objects while it is served, for as long as the stream is
    /// held (the objects cached when it is taken first).
    pub fn subscribe(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        let snapshot: Vec<K> = self
            .store()
            .map(|s| s.state().iter().map(|o| (**o).clone()).collect())
            .unwrap_or_default();
        futures::stream::iter(snapshot)
            .chain(tokio_stream_from(rx).map(Arc::unwrap_or_clone))
            .map(Ok)
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for WhileServed<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
