//! An informer of a kind only some clusters serve (a custom resource of another project:
//! the Prometheus Operator's ServiceMonitor), running while its CustomResourceDefinition
//! exists. A metadata-only watch of that one definition says when it comes and goes, so
//! nothing polls discovery: a converged operator sends no request either way.

use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{Informer, Subscribers, tokio_stream_from};

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
    task: tokio::task::JoinHandle<()>,
}

impl<K> WhileServed<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    /// Watches the definition named `crd` through `client`, running `start()` while it
    /// exists. When the definition may not be watched (the operator's role lacks it, as a
    /// namespaced install's may), the kind is taken as not served, said once in the log.
    pub fn start(
        client: Client,
        crd: &str,
        start: impl Fn() -> Informer<K> + Send + Sync + 'static,
    ) -> Self {
        let running: Arc<RwLock<Option<Running<K>>>> = Arc::default();
        let subscribers: Subscribers<K> = Arc::default();
        let (known_tx, known) = watch::channel(false);
        let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={crd}"));
        let (run, fan_out, name) = (running.clone(), subscribers.clone(), crd.to_string());
        let task = tokio::spawn(async move {
            let mut events = watcher(crds, config).boxed();
            let mut listed = false;
            let mut exists = false;
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
                        warn!(crd = name, error = %e.message, "may not watch this CustomResourceDefinition: its kind is taken as not served");
                        let _ = known_tx.send(true);
                        return;
                    }
                    Err(e) => {
                        warn!(crd = name, error = %e, "watch of a CustomResourceDefinition failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
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
                    *slot = now.then(|| {
                        let informer = start();
                        let changes = informer.subscribe();
                        let fan_out = fan_out.clone();
                        let forward = tokio::spawn(async move {
                            let mut changes = std::pin::pin!(changes);
                            while let Some(Ok(obj)) = changes.next().await {
                                let mut subs = fan_out.lock().unwrap_or_else(|e| e.into_inner());
                                subs.retain(|tx| tx.send(obj.clone()).is_ok());
                            }
                        });
                        Running { informer, forward }
                    });
                }
                let _ = known_tx.send(true);
            }
        });
        Self {
            running,
            subscribers,
            known,
            task,
        }
    }

    /// The cache while the kind is served.
    pub fn store(&self) -> Option<Store<K>> {
        let running = self.running.read().unwrap_or_else(|e| e.into_inner());
        running.as_ref().map(|r| r.informer.store())
    }

    /// Waits until it is known whether the kind is served, and if it is, until its cache
    /// holds its first list.
    pub async fn wait_synced(&self) {
        let mut known = self.known.clone();
        let _ = known.wait_for(|k| *k).await;
        let store = self.store();
        if let Some(store) = store {
            let _ = store.wait_until_ready().await;
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
            .chain(tokio_stream_from(rx))
            .map(Ok)
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for WhileServed<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
