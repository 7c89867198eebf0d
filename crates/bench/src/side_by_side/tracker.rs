//! The side-by-side tracker: per Memcached, from watches of the namespace, its Deployment's
//! replicas, its Ready pods (by either operator's labels) and its `status.nodes`; *done*
//! when they agree on 3 pods. On a bare control plane (`--bare`: no controllers, so no pod
//! ever exists) it watches the children instead of the pods: *done* when every child the
//! operator plans for the Memcached exists (by kind and name) and its status describes its
//! generation.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders;
use memcached_operator::children::Kind;

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
    /// How many watches it runs (each reports `synced` once listed).
    pub(super) watches: usize,
    /// On a bare control plane: done by children and status (see [`Track::recompute`]).
    pub(super) bare: bool,
    /// Bare: per Memcached, the children the operator plans for it (kind, name).
    pub(super) wanted: HashMap<String, BTreeSet<(Kind, String)>>,
    /// Bare: each planned child's Memcached.
    pub(super) wanted_by: HashMap<(Kind, String), String>,
    /// Bare: per Memcached, whether its status describes its generation.
    pub(super) current: HashMap<String, bool>,
    /// Bare: the children that exist (kind, name).
    pub(super) children: HashSet<(Kind, String)>,
}

impl Track {
    /// Whether `mc` is done: with pods, its Deployment asks for 3, 3 of its pods are Ready
    /// and its `status.nodes` names exactly those; bare, every child planned for it exists
    /// and its `status.observedGeneration` is its generation.
    pub(super) fn recompute(&mut self, mc: &str) {
        let ok = if self.bare {
            self.current.get(mc) == Some(&true)
                && self.wanted.get(mc).is_some_and(|wanted| {
                    !wanted.is_empty() && wanted.iter().all(|c| self.children.contains(c))
                })
        } else {
            let ready = self.ready.get(mc);
            self.replicas.get(mc) == Some(&(SIZE as i32))
                && ready.is_some_and(|r| r.len() == SIZE)
                && ready == self.nodes.get(mc)
        };
        if ok && mc.starts_with(PREFIX) {
            self.done.insert(mc.to_string());
        } else {
            self.done.remove(mc);
        }
    }

    /// Bare: what a Memcached's watch event says (`None`: deleted).
    pub(super) fn set_pool(&mut self, mc: &str, pool: Option<Pool>) {
        for child in self.wanted.remove(mc).unwrap_or_default() {
            self.wanted_by.remove(&child);
        }
        self.current.remove(mc);
        if let Some(pool) = pool {
            for child in &pool.wanted {
                self.wanted_by.insert(child.clone(), mc.to_string());
            }
            self.wanted.insert(mc.to_string(), pool.wanted);
            self.current.insert(mc.to_string(), pool.current);
        }
        self.recompute(mc);
    }

    /// Bare: a child exists, or no longer does.
    pub(super) fn set_child(&mut self, kind: Kind, name: &str, exists: bool) {
        let key = (kind, name.to_string());
        if exists {
            self.children.insert(key.clone());
        } else {
            self.children.remove(&key);
        }
        if let Some(mc) = self.wanted_by.get(&key).cloned() {
            self.recompute(&mc);
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

/// Bare: what the tracker keeps of a Memcached.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Pool {
    /// The children the operator plans for it (kind, name); none when it cannot be built.
    pub(super) wanted: BTreeSet<(Kind, String)>,
    /// `status.observedGeneration` is `metadata.generation`.
    pub(super) current: bool,
}

impl Pool {
    pub(super) fn of(mc: &Memcached) -> Pool {
        let wanted = super::bare::planned(mc)
            .map(|planned| planned.into_iter().map(|(k, n, _)| (k, n)).collect())
            .unwrap_or_default();
        let observed = mc.status.as_ref().and_then(|s| s.observed_generation);
        Pool {
            wanted,
            current: observed.is_some() && observed == mc.metadata.generation,
        }
    }
}

pub(super) enum Seen {
    Memcached(String, Option<BTreeSet<String>>),
    Pool(String, Option<Pool>),
    Deployment(String, Option<i32>),
    Pod(String, Option<(String, bool)>),
    Child(Kind, String, bool),
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

/// Bare: the children of kind `K` (`kind`), watched by their metadata alone (an
/// `Api<PartialObjectMeta<K>>` asks for metadata only).
fn child_events<K>(
    client: &Client,
    ns: &str,
    kind: Kind,
) -> futures::stream::BoxStream<'static, Seen>
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(
        Api::<PartialObjectMeta<K>>::namespaced(client.clone(), ns),
        watcher::Config::default(),
    )
    .filter_map(|e| async move { e.ok() })
    .flat_map(move |e| {
        futures::stream::iter(match e {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                vec![Seen::Child(kind, o.name_any(), true)]
            }
            watcher::Event::Delete(o) => vec![Seen::Child(kind, o.name_any(), false)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        })
    })
    .boxed()
}

/// Watches the namespace and keeps a [`Track`]: Memcacheds, Deployments and pods; bare,
/// Memcacheds (with their planned children), Deployments, Services and
/// PodDisruptionBudgets (the kinds a pool has; none of the others is planned for one).
pub(super) fn track(
    client: &Client,
    ns: &str,
    bare: bool,
) -> (Arc<Mutex<Track>>, tokio::task::JoinHandle<()>) {
    let mcs = events(
        Api::<Memcached>::namespaced(client.clone(), ns),
        if bare {
            |e| match e {
                watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                    vec![Seen::Pool(m.name_any(), Some(Pool::of(&m)))]
                }
                watcher::Event::Delete(m) => vec![Seen::Pool(m.name_any(), None)],
                watcher::Event::InitDone => vec![Seen::Synced],
                watcher::Event::Init => vec![],
            }
        } else {
            |e| match e {
                watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                    let nodes = m.status.as_ref().map(|s| s.nodes.iter().cloned().collect());
                    vec![Seen::Memcached(m.name_any(), nodes)]
                }
                watcher::Event::Delete(m) => vec![Seen::Memcached(m.name_any(), None)],
                watcher::Event::InitDone => vec![Seen::Synced],
                watcher::Event::Init => vec![],
            }
        },
    );
    let deployments = events(
        Api::<Deployment>::namespaced(client.clone(), ns),
        |e| match e {
            watcher::Event::Apply(d) | watcher::Event::InitApply(d) => {
                let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                vec![
                    Seen::Deployment(d.name_any(), replicas),
                    Seen::Child(Kind::Deployment, d.name_any(), true),
                ]
            }
            watcher::Event::Delete(d) => vec![
                Seen::Deployment(d.name_any(), None),
                Seen::Child(Kind::Deployment, d.name_any(), false),
            ],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        },
    );
    let watches = if bare {
        vec![
            mcs,
            deployments,
            child_events::<Service>(client, ns, Kind::Service),
            child_events::<PodDisruptionBudget>(client, ns, Kind::PodDisruptionBudget),
        ]
    } else {
        let pods = events(Api::<Pod>::namespaced(client.clone(), ns), |e| match e {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                let owner = pod_owner(&p).map(|o| (o, pod_ready(&p)));
                vec![Seen::Pod(p.name_any(), owner)]
            }
            watcher::Event::Delete(p) => vec![Seen::Pod(p.name_any(), None)],
            watcher::Event::InitDone => vec![Seen::Synced],
            watcher::Event::Init => vec![],
        });
        vec![mcs, deployments, pods]
    };
    let track = Arc::new(Mutex::new(Track {
        watches: watches.len(),
        bare,
        ..Track::default()
    }));
    let mut all = futures::stream::select_all(watches);
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
                Seen::Pool(name, pool) => t.set_pool(&name, pool),
                Seen::Deployment(name, replicas) => {
                    match replicas {
                        Some(r) => t.replicas.insert(name.clone(), r),
                        None => t.replicas.remove(&name),
                    };
                    t.recompute(&name);
                }
                Seen::Child(kind, name, exists) => t.set_child(kind, &name, exists),
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

    /// Bare, a Memcached is done once every child the operator plans for it exists (by kind
    /// and name, whoever made it) and its status describes its generation; a child deleted,
    /// or a spec change not yet observed, undoes it.
    #[test]
    fn bare_done_means_every_planned_child_and_a_current_status() {
        let mc = "sbs-00001";
        let mut t = Track {
            bare: true,
            ..Track::default()
        };
        let mut pool = crate::side_by_side::bare::pool(mc, 3);
        t.set_pool(mc, Some(Pool::of(&pool)));
        assert_eq!(
            t.wanted
                .get(mc)
                .map(|w| w.iter().map(|(k, _)| *k).collect::<Vec<_>>()),
            Some(vec![
                Kind::Deployment,
                Kind::Service,
                Kind::PodDisruptionBudget
            ])
        );
        for kind in [Kind::Deployment, Kind::Service] {
            t.set_child(kind, mc, true);
        }
        // Another pool's budget does not count for this one.
        t.set_child(Kind::PodDisruptionBudget, "sbs-00002", true);
        assert!(t.done.is_empty(), "no budget, no status");
        t.set_child(Kind::PodDisruptionBudget, mc, true);
        assert!(t.done.is_empty(), "no status yet");
        pool.status = Some(memcached_api::MemcachedStatus {
            observed_generation: Some(1),
            ..Default::default()
        });
        t.set_pool(mc, Some(Pool::of(&pool)));
        assert!(t.done.contains(mc));
        t.set_child(Kind::Service, mc, false);
        assert!(!t.done.contains(mc), "a child was deleted");
        t.set_child(Kind::Service, mc, true);
        assert!(t.done.contains(mc));
        pool.metadata.generation = Some(2);
        t.set_pool(mc, Some(Pool::of(&pool)));
        assert!(!t.done.contains(mc), "a spec change not yet observed");
        t.set_pool(mc, None);
        assert!(!t.done.contains(mc) && t.wanted_by.is_empty(), "deleted");
        // Pods and `status.nodes` do not matter; objects outside the set never count.
        let latency = crate::side_by_side::bare::pool(LATENCY_CR, 3);
        let mut current = latency.clone();
        current.status = pool.status.clone();
        current.metadata.generation = Some(1);
        t.set_pool(LATENCY_CR, Some(Pool::of(&current)));
        for kind in [Kind::Deployment, Kind::Service, Kind::PodDisruptionBudget] {
            t.set_child(kind, LATENCY_CR, true);
        }
        assert!(!t.done.contains(LATENCY_CR));
    }

    /// A Memcached whose children cannot be planned (never from the API server: no uid) is
    /// never done, rather than done with no children.
    #[test]
    fn bare_a_pool_without_a_plan_is_never_done() {
        let mut t = Track {
            bare: true,
            ..Track::default()
        };
        let mut pool = crate::side_by_side::bare::pool("sbs-00003", 3);
        pool.metadata.uid = None;
        pool.status = Some(memcached_api::MemcachedStatus {
            observed_generation: Some(1),
            ..Default::default()
        });
        t.set_pool("sbs-00003", Some(Pool::of(&pool)));
        assert!(t.done.is_empty());
    }
}
