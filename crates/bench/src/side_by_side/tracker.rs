//! The side-by-side tracker: per Memcached, from watches of the namespace, its Deployment's
//! replicas, its Ready pods (by either operator's labels) and its `status.nodes`; *done*
//! when they agree on 3 pods.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders;

use super::{PREFIX, SIZE};
use crate::Result;

/// What the tracker sees: per Memcached, its Deployment's replicas, its Ready pods and its
/// `status.nodes`.
#[derive(Default)]
pub(super) struct Track {
    pub(super) replicas: HashMap<String, i32>,
    pub(super) nodes: HashMap<String, BTreeSet<String>>,
    /// pod → (Memcached, Ready)
    pub(super) pods: HashMap<String, (String, bool)>,
    pub(super) ready: HashMap<String, BTreeSet<String>>,
    pub(super) done: BTreeSet<String>,
    pub(super) synced: usize,
}

impl Track {
    pub(super) fn recompute(&mut self, mc: &str) {
        let ready = self.ready.get(mc);
        let ok = self.replicas.get(mc) == Some(&(SIZE as i32))
            && ready.is_some_and(|r| r.len() == SIZE)
            && ready == self.nodes.get(mc);
        if ok && mc.starts_with(PREFIX) {
            self.done.insert(mc.to_string());
        } else {
            self.done.remove(mc);
        }
    }

    pub(super) fn set_pod(&mut self, pod: &str, owner: Option<String>, is_ready: bool) {
        if let Some((old, _)) = self.pods.remove(pod) {
            if let Some(r) = self.ready.get_mut(&old) {
                r.remove(pod);
            }
            self.recompute(&old);
        }
        if let Some(owner) = owner {
            if is_ready {
                self.ready
                    .entry(owner.clone())
                    .or_default()
                    .insert(pod.to_string());
            }
            self.pods.insert(pod.to_string(), (owner.clone(), is_ready));
            self.recompute(&owner);
        }
    }
}

/// The Memcached a pod belongs to, by either operator's labels.
pub(super) fn pod_owner(pod: &Pod) -> Option<String> {
    let labels = pod.metadata.labels.as_ref()?;
    labels
        .get(builders::LABEL_INSTANCE)
        .or_else(|| labels.get("memcached_cr"))
        .cloned()
}

pub(super) fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(super) enum Seen {
    Memcached(String, Option<BTreeSet<String>>),
    Deployment(String, Option<i32>),
    Pod(String, Option<(String, bool)>),
    Synced,
}

pub(super) fn events<K>(
    api: Api<K>,
    f: fn(watcher::Event<K>) -> Vec<Seen>,
) -> futures::stream::BoxStream<'static, Seen>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, watcher::Config::default())
        .filter_map(|e| async move { e.ok() })
        .flat_map(move |e| futures::stream::iter(f(e)))
        .boxed()
}

/// Watches the namespace and keeps a [`Track`].
pub(super) fn track(client: &Client, ns: &str) -> (Arc<Mutex<Track>>, tokio::task::JoinHandle<()>) {
    let track = Arc::new(Mutex::new(Track::default()));
    let mcs = events(
        Api::<Memcached>::namespaced(client.clone(), ns),
        |e| match e {
            watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                let nodes = m.status.as_ref().map(|s| s.nodes.iter().cloned().collect());
                vec![Seen::Memcached(m.name_any(), nodes)]
            }
            watcher::Event::Delete(m) => vec![Seen::Memcached(m.name_any(), None)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        },
    );
    let deployments = events(
        Api::<Deployment>::namespaced(client.clone(), ns),
        |e| match e {
            watcher::Event::Apply(d) | watcher::Event::InitApply(d) => {
                let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                vec![Seen::Deployment(d.name_any(), replicas)]
            }
            watcher::Event::Delete(d) => vec![Seen::Deployment(d.name_any(), None)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        },
    );
    let pods = events(Api::<Pod>::namespaced(client.clone(), ns), |e| match e {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let owner = pod_owner(&p).map(|o| (o, pod_ready(&p)));
            vec![Seen::Pod(p.name_any(), owner)]
        }
        watcher::Event::Delete(p) => vec![Seen::Pod(p.name_any(), None)],
        watcher::Event::InitDone => vec![Seen::Synced],
        watcher::Event::Init => vec![],
    });
    let mut all = futures::stream::select_all([mcs, deployments, pods]);
    let shared = track.clone();
    let task = tokio::spawn(async move {
        while let Some(seen) = all.next().await {
            let mut t = shared.lock().unwrap_or_else(|e| e.into_inner());
            match seen {
                Seen::Memcached(name, nodes) => {
                    match nodes {
                        Some(nodes) => t.nodes.insert(name.clone(), nodes),
                        None => t.nodes.remove(&name),
                    };
                    t.recompute(&name);
                }
                Seen::Deployment(name, replicas) => {
                    match replicas {
                        Some(r) => t.replicas.insert(name.clone(), r),
                        None => t.replicas.remove(&name),
                    };
                    t.recompute(&name);
                }
                Seen::Pod(name, owner) => {
                    let (owner, ready) = match owner {
                        Some((o, r)) => (Some(o), r),
                        None => (None, false),
                    };
                    t.set_pod(&name, owner, ready);
                }
                Seen::Synced => t.synced += 1,
            }
        }
    });
    (track, task)
}

pub(super) fn lock(track: &Mutex<Track>) -> std::sync::MutexGuard<'_, Track> {
    track.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::side_by_side::LATENCY_CR;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A Memcached is done only with its Deployment at 3 replicas, 3 Ready pods, and
    /// `status.nodes` naming exactly those pods; a pod turning unready undoes it.
    #[test]
    fn done_means_replicas_ready_pods_and_nodes_agree() {
        let mc = "sbs-00001";
        let mut t = Track::default();
        t.replicas.insert(mc.into(), 3);
        for pod in ["a", "b", "c"] {
            t.set_pod(pod, Some(mc.into()), true);
        }
        assert!(t.done.is_empty(), "no status yet");
        t.nodes.insert(mc.into(), names(&["a", "b"]));
        t.recompute(mc);
        assert!(t.done.is_empty(), "status names two of three");
        t.nodes.insert(mc.into(), names(&["a", "b", "c"]));
        t.recompute(mc);
        assert!(t.done.contains(mc));
        t.set_pod("c", Some(mc.into()), false);
        assert!(!t.done.contains(mc), "a pod turned unready");
        t.set_pod("c", Some(mc.into()), true);
        assert!(t.done.contains(mc));
        t.replicas.insert(mc.into(), 4);
        t.recompute(mc);
        assert!(!t.done.contains(mc), "scaled, not yet followed");
        // Objects outside the benchmark's set never count.
        t.replicas.insert(LATENCY_CR.into(), 3);
        t.nodes.insert(LATENCY_CR.into(), names(&["x", "y", "z"]));
        for pod in ["x", "y", "z"] {
            t.set_pod(pod, Some(LATENCY_CR.into()), true);
        }
        assert!(!t.done.contains(LATENCY_CR));
    }
}
