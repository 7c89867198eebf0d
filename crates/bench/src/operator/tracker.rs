//! The convergence tracker: which `bench-*` Memcacheds have their children and an
//! up-to-date status, and which have all pods ready, and when all got there; read from the
//! in-memory server's change feed, or from watches of a real cluster's namespaces (the
//! phase's, each watched on its own, as the operator watches them). The names are unique
//! across a phase's namespaces, so progress is kept by name.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders::{LABEL_MANAGED_BY, MANAGED_BY};

use super::PREFIX;
use super::env::Env;
use super::process::Operator;
use crate::Result;

/// Convergence as seen through watches: which `bench-*` Memcacheds have their children and
/// an up-to-date status, and which report all their pods ready.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) deployments: HashSet<String>,
    pub(super) services: HashSet<String>,
    /// name → (generation == observedGeneration, all pods ready in status)
    pub(super) statuses: HashMap<String, (bool, bool)>,
    pub(super) children_and_status: HashSet<String>,
    pub(super) pods_ready: HashSet<String>,
    pub(super) children_and_status_at: Option<Instant>,
    pub(super) pods_ready_at: Option<Instant>,
    /// When the first Deployment was seen (the operator's first write, when it runs).
    pub(super) first_child_at: Option<Instant>,
}

impl Progress {
    pub(super) fn update(&mut self, name: &str, n: usize) {
        let (current, ready) = self.statuses.get(name).copied().unwrap_or_default();
        let children = self.deployments.contains(name) && self.services.contains(name);
        if children && current {
            self.children_and_status.insert(name.to_string());
        } else {
            self.children_and_status.remove(name);
        }
        if children && current && ready {
            self.pods_ready.insert(name.to_string());
        } else {
            self.pods_ready.remove(name);
        }
        if self.children_and_status.len() == n && self.children_and_status_at.is_none() {
            self.children_and_status_at = Some(Instant::now());
        }
        if self.pods_ready.len() == n && self.pods_ready_at.is_none() {
            self.pods_ready_at = Some(Instant::now());
        }
    }
}

pub(super) enum Seen {
    /// name, status describes the current generation, status shows every pod ready
    Memcached(String, bool, bool),
    Deployment(String),
    Service(String),
}

pub(super) fn applied<K: Clone>(event: watcher::Event<K>) -> Option<K> {
    match event {
        watcher::Event::Apply(k) | watcher::Event::InitApply(k) => Some(k),
        _ => None,
    }
}

pub(super) fn summary(mc: &Memcached) -> Seen {
    let status = mc.status.clone().unwrap_or_default();
    let current = status.observed_generation.is_some()
        && status.observed_generation == mc.metadata.generation;
    let ready =
        status.nodes.len() == mc.spec.size as usize && status.ready_replicas == mc.spec.size;
    Seen::Memcached(mc.name_any(), current, ready)
}

/// Records when all `n` Memcacheds got there: from the in-memory server's own change feed,
/// or by watching the namespaces of a cluster.
pub(super) fn track(env: &Env, n: usize) -> (Arc<Mutex<Progress>>, tokio::task::JoinHandle<()>) {
    let progress = Arc::new(Mutex::new(Progress::default()));
    let mut all = match &env.server {
        Some(server) => store_changes(server, &env.namespaces),
        None => watched_changes(env),
    };
    let shared = progress.clone();
    let task = tokio::spawn(async move {
        while let Some(seen) = all.next().await {
            let mut p = shared.lock().unwrap_or_else(|e| e.into_inner());
            let name = match seen {
                Seen::Memcached(name, current, ready) => {
                    p.statuses.insert(name.clone(), (current, ready));
                    name
                }
                Seen::Deployment(name) => {
                    p.deployments.insert(name.clone());
                    p.first_child_at.get_or_insert_with(Instant::now);
                    name
                }
                Seen::Service(name) => {
                    p.services.insert(name.clone());
                    name
                }
            };
            if name.starts_with(PREFIX) {
                p.update(&name, n);
            }
        }
    });
    (progress, task)
}

/// Progress as the in-memory server's store records it, read in-process. The tracker then
/// adds nothing to the server's work: watches would have the server serialize and send
/// every Deployment, Service and Memcached change to the bench while the operator is
/// measured, and the raw-write bound (no tracker) pays nothing like it.
pub(super) fn store_changes(
    server: &apisim::ApiServer,
    namespaces: &[String],
) -> BoxStream<'static, Seen> {
    let (server, namespaces) = (server.clone(), namespaces.to_vec());
    // Subscribed first, then the store is read whole (`None`), so nothing falls in between.
    let changes = futures::stream::unfold(server.changes(), |mut changes| async move {
        changes.recv().await.map(|change| (Some(change), changes))
    });
    futures::stream::once(async { None })
        .chain(changes)
        .flat_map(move |change| {
            let seen = if change.as_ref().is_none_or(|c| c.event_type() == "LAGGED") {
                // at the start, or changes were missed: read every tracked object
                read_store(&server, &namespaces)
            } else if let Some(change) = change.filter(|c| c.event_type() != "DELETED") {
                seen_in_store(change.kind_plural(), change.object(), &namespaces)
                    .into_iter()
                    .collect()
            } else {
                Vec::new()
            };
            futures::stream::iter(seen)
        })
        .boxed()
}

/// What the tracker learns from every Memcached, Deployment and Service of `namespaces` in
/// the store.
pub(super) fn read_store(server: &apisim::ApiServer, namespaces: &[String]) -> Vec<Seen> {
    fn kind<K: kube::Resource<DynamicType = ()>>() -> (String, String) {
        (
            K::api_version(&()).into_owned(),
            K::plural(&()).into_owned(),
        )
    }
    [kind::<Memcached>(), kind::<Deployment>(), kind::<Service>()]
        .into_iter()
        .flat_map(|(api_version, plural)| {
            namespaces.iter().flat_map(move |namespace| {
                let plural = plural.clone();
                server
                    .list_objects(&api_version, &plural, Some(namespace))
                    .into_iter()
                    .filter_map(move |o| seen_in_store(&plural, &o, namespaces))
            })
        })
        .collect()
}

/// What a stored object of one of `namespaces` tells the tracker, read from its JSON (what
/// [`summary`] reads of a typed Memcached).
pub(super) fn seen_in_store(
    plural: &str,
    obj: &serde_json::Value,
    namespaces: &[String],
) -> Option<Seen> {
    let meta = &obj["metadata"];
    let namespace = meta["namespace"].as_str()?;
    if !namespaces.iter().any(|ns| ns == namespace) {
        return None;
    }
    let name = meta["name"].as_str()?.to_string();
    let owned = || meta["labels"][LABEL_MANAGED_BY].as_str() == Some(MANAGED_BY);
    match plural {
        "memcacheds" => {
            let status = &obj["status"];
            let observed = status["observedGeneration"].as_i64();
            let current = observed.is_some() && observed == meta["generation"].as_i64();
            let size = obj["spec"]["size"].as_i64().unwrap_or(0);
            let nodes = status["nodes"].as_array().map_or(0, Vec::len) as i64;
            let ready = nodes == size && status["readyReplicas"].as_i64().unwrap_or(0) == size;
            Some(Seen::Memcached(name, current, ready))
        }
        "deployments" if owned() => Some(Seen::Deployment(name)),
        "services" if owned() => Some(Seen::Service(name)),
        _ => None,
    }
}

/// The names of `K`s of ours in `namespace` as they are applied, as `seen`.
fn owned_names<K>(
    env: &Env,
    namespace: &str,
    owned: watcher::Config,
    seen: fn(String) -> Seen,
) -> BoxStream<'static, Seen>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(
        Api::<PartialObjectMeta<K>>::namespaced(env.client.clone(), namespace),
        owned,
    )
    .filter_map(move |e| async move { e.ok().and_then(applied).map(|o| seen(o.name_any())) })
    .boxed()
}

/// Progress from watches of the namespaces (a real cluster): three per namespace.
pub(super) fn watched_changes(env: &Env) -> BoxStream<'static, Seen> {
    let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let mut all = Vec::new();
    for namespace in &env.namespaces {
        let mcs = watcher(env.memcacheds(namespace), watcher::Config::default())
            .filter_map(|e| async move { e.ok().and_then(applied).map(|mc| summary(&mc)) })
            .boxed();
        // Children are watched metadata-only: the tracker needs their names.
        let deployments =
            owned_names::<Deployment>(env, namespace, owned.clone(), Seen::Deployment);
        let services = owned_names::<Service>(env, namespace, owned.clone(), Seen::Service);
        all.extend([mcs, deployments, services]);
    }
    futures::stream::select_all(all).boxed()
}

pub(super) async fn wait_progress(
    progress: &Arc<Mutex<Progress>>,
    op: &mut Operator,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Progress) -> Option<Instant>,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let p = progress.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = done(&p) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what}: timed out after {timeout:?} ({} with children and status, {} with pods ready)",
                    p.children_and_status.len(),
                    p.pods_ready.len()
                )
                .into());
            }
        }
        op.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::memcached;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::PostParams;
    use memcached_operator::builders::{self, BuildSettings};
    use serde_json::json;

    fn names(namespaces: &[&str]) -> Vec<String> {
        namespaces.iter().map(|ns| ns.to_string()).collect()
    }

    /// The tracker's whole-store read (at its start and after a gap in the change feed)
    /// finds every kind it tracks, in each of the phase's namespaces: the Memcacheds under
    /// their own API group, and the operator's Deployments and Services.
    #[tokio::test]
    async fn the_store_read_finds_memcacheds_and_children() {
        let server = apisim::ApiServer::new();
        let client = server.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &Memcached::crd())
            .await
            .unwrap();
        let pp = PostParams::default();
        for (ns, name) in [("default", "mc-1"), ("second", "mc-2"), ("third", "mc-3")] {
            crate::create_namespace(&client, ns).await.unwrap();
            let mc = Api::<Memcached>::namespaced(client.clone(), ns)
                .create(&pp, &memcached(name, 3).unwrap())
                .await
                .unwrap();
            Api::<Deployment>::namespaced(client.clone(), ns)
                .create(
                    &pp,
                    &builders::desired_deployment(&mc, &BuildSettings::default()).unwrap(),
                )
                .await
                .unwrap();
            Api::<Service>::namespaced(client.clone(), ns)
                .create(&pp, &builders::desired_service(&mc).unwrap())
                .await
                .unwrap();
        }
        let seen = |namespaces: &[&str]| {
            let mut seen: Vec<String> = read_store(&server, &names(namespaces))
                .into_iter()
                .map(|s| match s {
                    Seen::Memcached(name, ..) => format!("memcached {name}"),
                    Seen::Deployment(name) => format!("deployment {name}"),
                    Seen::Service(name) => format!("service {name}"),
                })
                .collect();
            seen.sort();
            seen
        };
        assert_eq!(
            seen(&["default"]),
            ["deployment mc-1", "memcached mc-1", "service mc-1"]
        );
        // several namespaces: theirs, and nothing of another one (`third`)
        assert_eq!(
            seen(&["default", "second"]),
            [
                "deployment mc-1",
                "deployment mc-2",
                "memcached mc-1",
                "memcached mc-2",
                "service mc-1",
                "service mc-2"
            ]
        );
        assert!(seen(&["other"]).is_empty());
    }

    #[test]
    fn stored_objects_are_read_as_the_typed_tracker_reads_them() {
        let mc = |status: serde_json::Value| {
            json!({"apiVersion": "cache.example.com/v1", "kind": "Memcached",
                "metadata": {"name": "mc-1", "namespace": "b", "generation": 2},
                "spec": {"size": 2}, "status": status})
        };
        let parts = |seen: Option<Seen>| match seen {
            Some(Seen::Memcached(name, current, ready)) => Some((name, current, ready)),
            _ => None,
        };
        let yes = |current, ready| Some(("mc-1".to_string(), current, ready));
        for (status, want) in [
            (json!(null), yes(false, false)),
            (json!({"observedGeneration": 1}), yes(false, false)),
            (
                json!({"observedGeneration": 2, "nodes": ["p"], "readyReplicas": 1}),
                yes(true, false),
            ),
            (
                json!({"observedGeneration": 2, "nodes": ["p", "q"], "readyReplicas": 2}),
                yes(true, true),
            ),
        ] {
            let obj = mc(status);
            let typed: Memcached = serde_json::from_value(obj.clone()).unwrap();
            assert_eq!(parts(Some(summary(&typed))), want, "typed: {obj}");
            assert_eq!(
                parts(seen_in_store("memcacheds", &obj, &names(&["b"]))),
                want,
                "stored: {obj}"
            );
        }
        // another namespace's objects, and children the operator does not manage, are not
        // counted; an object of any of the phase's namespaces is
        assert!(seen_in_store("memcacheds", &mc(json!(null)), &names(&["other"])).is_none());
        assert!(seen_in_store("memcacheds", &mc(json!(null)), &names(&["a", "b"])).is_some());
        let b = names(&["b"]);
        let child = |labels: serde_json::Value| json!({"metadata": {"name": "mc-1", "namespace": "b", "labels": labels}});
        let owned = child(json!({LABEL_MANAGED_BY: MANAGED_BY}));
        assert!(
            matches!(seen_in_store("deployments", &owned, &b), Some(Seen::Deployment(n)) if n == "mc-1")
        );
        assert!(
            matches!(seen_in_store("services", &owned, &b), Some(Seen::Service(n)) if n == "mc-1")
        );
        assert!(seen_in_store("deployments", &child(json!({})), &b).is_none());
        assert!(seen_in_store("pods", &owned, &b).is_none());
    }
}
