//! What the controller watches, and what a change to it wakes: one informer per kind the
//! reconciler reads ([`Caches`], label-selected so that they hold only ours), and for each,
//! which changes matter to which Memcached and how soon ([`child_triggers`]).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use memcached_api::Memcached;

use super::queue::Lane;
use crate::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use crate::cached::{
    CacheForm, CachedConfigMap, CachedDeployment, CachedHpa, CachedNetworkPolicy, CachedPdb,
    CachedPod, CachedService, CachedServiceMonitor, SpecOnly,
};
use crate::children::SERVICE_MONITOR_CRD;
use crate::informer::{Index, Informer, WhileServed};
use crate::triggers::{Classifier, Urgency};

/// Index key of a pod: the Memcached it belongs to, as `namespace/instance`.
pub(super) fn pod_index_key(pod: &CachedPod) -> Option<String> {
    Some(format!(
        "{}/{}",
        pod.metadata.namespace.as_deref()?,
        pod.instance.as_deref()?
    ))
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Maps one of our pods to the Memcached that owns it (by its instance label).
fn pod_owner(pod: &CachedPod) -> Option<ObjectRef<Memcached>> {
    let instance = pod.instance.as_deref()?;
    Some(ObjectRef::new(instance).within(pod.metadata.namespace.as_deref()?))
}

/// Maps an owned child to the Memcached named in its controller ownerReference.
fn controller_owner<K: CacheForm>(child: &K) -> Option<ObjectRef<Memcached>> {
    let owner = child
        .owners()
        .into_iter()
        .find(|o| o.controller == Some(true) && o.kind == "Memcached")?;
    if owner.api_version != Memcached::api_version(&()) {
        return None;
    }
    Some(ObjectRef::new(&owner.name).within(child.namespace().as_deref()?))
}

/// A Secret as the controller watches it: metadata only.
pub type SecretMeta = PartialObjectMeta<Secret>;

/// Keeps of a Secret only what says which it is and which version: its labels and
/// annotations are dropped (`kubectl apply` copies the whole Secret, data included, into
/// an annotation).
fn slim_secret(secret: &mut SecretMeta) {
    let meta = std::mem::take(&mut secret.metadata);
    secret.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        ..ObjectMeta::default()
    };
}

/// Drops what the reconciler never reads, to keep the caches small.
fn slim<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// Hash of what the reconciler reads of an owned object's metadata: labels and
/// annotations (the drift check) and ownership. Deletion is seen by the classifier itself.
fn metadata_outcome<K: CacheForm>(obj: &K, hasher: &mut DefaultHasher) {
    obj.meta_text().hash(hasher);
}

/// A Deployment's or budget's metadata and spec (through its generation): a change is
/// drift.
fn spec_by_generation<K: CacheForm>(obj: &K) -> u64 {
    let mut h = DefaultHasher::new();
    metadata_outcome(obj, &mut h);
    obj.meta().generation.hash(&mut h);
    h.finish()
}

/// The Deployment status fields the Memcached's status is computed from.
fn deployment_status(d: &CachedDeployment) -> u64 {
    let mut h = DefaultHasher::new();
    if let Some(s) = &d.status {
        (
            s.observed_generation,
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
        )
            .hash(&mut h);
        // The conditions' types and reasons (the status and the rollout slots read whether
        // the rollout is stuck past its deadline), not their timestamps.
        for c in s.conditions.iter().flatten() {
            (&c.type_, &c.reason).hash(&mut h);
        }
    }
    h.finish()
}

/// A pod's move that leaves it Ready is urgent: it may be the one that makes the pool
/// Available (the status counts Ready pods from the cache, see `status::desired_status`),
/// and a pool that serves is reported at once. The status write itself is paced when the
/// move only adds a pod ([`super::pacing`]).
fn ready(p: &CachedPod) -> bool {
    p.ready
}

/// Whether the Deployment controller has seen the Deployment's spec and every pod it asks
/// for is updated and Ready, with no other pod left: the pool is complete (its status turns
/// Available and no longer Progressing).
fn rolled_out(d: &CachedDeployment) -> bool {
    let Some(s) = &d.status else {
        return false;
    };
    let want = d.replicas.unwrap_or(1);
    s.observed_generation >= d.metadata.generation
        && s.replicas.unwrap_or(0) == want
        && s.updated_replicas.unwrap_or(0) == want
        && s.ready_replicas.unwrap_or(0) == want
}

/// A Service's metadata and spec, or a ConfigMap's metadata and data (neither kind has a
/// generation).
fn service_spec<K>(s: &SpecOnly<K>) -> u64
where
    SpecOnly<K>: CacheForm,
{
    let mut h = DefaultHasher::new();
    metadata_outcome(s, &mut h);
    // The shared text: the name it leaves out is the object's own, which never changes.
    s.spec_shared().hash(&mut h);
    h.finish()
}

/// Status the reconciler never reads (a Service's load balancer, a budget's disruption
/// counts): no change to it triggers anything.
fn unread_status<K>(_: &K) -> u64 {
    0
}

/// A pod's instance label decides which Memcached it counts for.
fn pod_spec(p: &CachedPod) -> u64 {
    let mut h = DefaultHasher::new();
    p.instance.hash(&mut h);
    h.finish()
}

/// What `status.nodes` and `status.endpoints` are made of besides the name: the pod's IP
/// and readiness (not restarts, container states or other conditions), and a reload the TLS
/// agent reported as refused; whether it has ended (it then leaves the proxy's rings,
/// Ready or not) and its deletion cost (which the proxy's slot sets).
fn pod_status(p: &CachedPod) -> u64 {
    let mut h = DefaultHasher::new();
    (
        &p.ip,
        p.ready,
        p.ended,
        &p.deletion_cost,
        &p.tls_reload_failure,
    )
        .hash(&mut h);
    h.finish()
}

/// The owners to wake for changes in `children`, with how soon (see [`crate::triggers`]).
fn owner_triggers<K>(
    children: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    mut classifier: Classifier<K>,
    owner: fn(&K) -> Option<ObjectRef<Memcached>>,
) -> BoxStream<'static, (ObjectRef<Memcached>, Urgency)>
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    children
        .filter_map(move |child| {
            let trigger = child.ok().and_then(|child| {
                let urgency = classifier.classify(&child)?;
                Some((owner(&child)?, urgency))
            });
            futures::future::ready(trigger)
        })
        .boxed()
}

/// The informers the controller reads from, for one scope (a namespace or the cluster).
/// They run whether or not this process leads, so a standby takes over with a warm cache.
pub struct Caches {
    pub memcacheds: Informer<Memcached>,
    /// The Memcacheds' cache as kube-runtime's `Controller` reads it (the same objects).
    pub memcacheds_for_controller: reflector::Store<Memcached>,
    pub deployments: Informer<CachedDeployment>,
    pub services: Informer<CachedService>,
    pub pdbs: Informer<CachedPdb>,
    pub network_policies: Informer<CachedNetworkPolicy>,
    pub hpas: Informer<CachedHpa>,
    pub config_maps: Informer<CachedConfigMap>,
    pub pods: Informer<CachedPod>,
    /// The pod cache by `namespace/instance` (the pods of one Memcached).
    pub pod_index: Index<CachedPod>,
    /// Every Secret's name and resourceVersion (no data): which exist, and when one
    /// changed (see [`super::secrets`]).
    pub secrets: Informer<SecretMeta>,
    /// Our ServiceMonitors, while the Prometheus Operator's definition of them exists.
    pub service_monitors: Arc<WhileServed<CachedServiceMonitor>>,
}

impl Caches {
    /// Starts watching `namespace` (`None`: all namespaces). Owned kinds are label-selected
    /// (`app.kubernetes.io/managed-by=memcached-operator`), so the cache holds only ours.
    pub fn start(client: &Client, namespace: Option<&str>) -> Self {
        let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
        let (pods, pod_index) = Informer::start_indexed(
            scoped(client, namespace),
            owned.clone(),
            slim,
            pod_index_key,
        );
        let (memcacheds, memcacheds_for_controller) = Informer::start_for_controller(
            scoped(client, namespace),
            watcher::Config::default(),
            slim,
        );
        Self {
            memcacheds,
            memcacheds_for_controller,
            deployments: Informer::start(scoped(client, namespace), owned.clone(), slim),
            services: Informer::start(scoped(client, namespace), owned.clone(), slim),
            pdbs: Informer::start(scoped(client, namespace), owned.clone(), slim),
            network_policies: Informer::start(scoped(client, namespace), owned.clone(), slim),
            hpas: Informer::start(scoped(client, namespace), owned.clone(), slim),
            config_maps: Informer::start(scoped(client, namespace), owned.clone(), slim),
            pods,
            pod_index,
            secrets: Informer::start(
                scoped(client, namespace),
                watcher::Config::default(),
                slim_secret,
            ),
            service_monitors: {
                let (client, namespace) = (client.clone(), namespace.map(str::to_string));
                Arc::new(WhileServed::start(
                    client.clone(),
                    SERVICE_MONITOR_CRD,
                    move || {
                        Informer::start(scoped(&client, namespace.as_deref()), owned.clone(), slim)
                    },
                ))
            },
        }
    }

    /// Waits until every informer has cached its first full list.
    pub async fn wait_synced(&self) {
        futures::join!(
            self.memcacheds.wait_synced(),
            self.deployments.wait_synced(),
            self.services.wait_synced(),
            self.pdbs.wait_synced(),
            self.network_policies.wait_synced(),
            self.hpas.wait_synced(),
            self.config_maps.wait_synced(),
            self.pods.wait_synced(),
            self.secrets.wait_synced(),
            self.service_monitors.wait_synced()
        );
    }
}

/// The Memcacheds to wake when a Secret they mount appears, changes or goes: at once (a
/// new password, a renewed certificate).
pub(super) fn secret_triggers(
    caches: &Caches,
) -> BoxStream<'static, (ObjectRef<Memcached>, Urgency)> {
    let memcacheds = caches.memcacheds.store();
    let mut versions = Classifier::<SecretMeta>::new(secret_version, |_| 0);
    caches
        .secrets
        .subscribe()
        .filter_map(move |secret| {
            // A Secret seen for the first time (the informer's first list, or created) is
            // batched; a new version of one is a change to act on at once.
            let woken: Vec<_> = secret
                .ok()
                .and_then(|s| Some((versions.classify(&s)?, s)))
                .map(|(urgency, s)| {
                    let (namespace, name) = (s.namespace(), s.name_any());
                    memcacheds
                        .state()
                        .iter()
                        .filter(|mc| mc.namespace() == namespace)
                        .filter(|mc| {
                            super::secrets::referenced(mc)
                                .iter()
                                .any(|(_, secret, _)| *secret == Some(name.as_str()))
                        })
                        .map(|mc| (ObjectRef::from_obj(mc.as_ref()), urgency))
                        .collect()
                })
                .unwrap_or_default();
            futures::future::ready(Some(futures::stream::iter(woken)))
        })
        .flatten()
        .boxed()
}

/// The Memcacheds with the exporter, woken when the ServiceMonitor kind comes or goes (the
/// Prometheus Operator installed after the pools: their ServiceMonitors are created then,
/// not at the next change of the pool).
pub(super) fn served_triggers(
    caches: &Caches,
) -> BoxStream<'static, (ObjectRef<Memcached>, Urgency)> {
    let memcacheds = caches.memcacheds.store();
    let served = caches.service_monitors.served();
    futures::stream::unfold(served, |mut served| async move {
        served.changed().await.ok()?;
        Some(((), served))
    })
    .flat_map(move |()| {
        let woken: Vec<_> = memcacheds
            .state()
            .iter()
            .filter(|mc| mc.spec.exporter_enabled())
            .map(|mc| (ObjectRef::from_obj(mc.as_ref()), Urgency::Now))
            .collect();
        futures::stream::iter(woken)
    })
    .boxed()
}

/// A Secret's version: any change of its data moves it.
fn secret_version(s: &SecretMeta) -> u64 {
    let mut h = DefaultHasher::new();
    s.metadata.resource_version.hash(&mut h);
    h.finish()
}

/// The Memcacheds to wake for changes of their children and pods in `caches`, with how
/// soon. Only what the reconciler reads counts (status churn it never reads, such as a
/// Service's load balancer status or a budget's disruption counts, is filtered); edits
/// and deletions are urgent, status moves can be batched.
pub(super) fn child_triggers(
    caches: &Caches,
) -> BoxStream<'static, (ObjectRef<Memcached>, Urgency)> {
    futures::stream::select_all([
        owner_triggers(
            caches.deployments.subscribe(),
            Classifier::new(spec_by_generation, deployment_status).urgent_when(rolled_out),
            controller_owner,
        ),
        owner_triggers(
            caches.services.subscribe(),
            Classifier::new(service_spec, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.pdbs.subscribe(),
            Classifier::new(spec_by_generation, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.network_policies.subscribe(),
            Classifier::new(spec_by_generation, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.hpas.subscribe(),
            Classifier::new(spec_by_generation, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.config_maps.subscribe(),
            Classifier::new(service_spec, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.service_monitors.subscribe(),
            Classifier::new(service_spec, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.pods.subscribe(),
            Classifier::new(pod_spec, pod_status).urgent_when(ready),
            pod_owner,
        ),
    ])
    .boxed()
}

/// A Memcached's own changes that wake it, with their lane: only a move of its generation
/// (status writes, ours included, and metadata-only edits do not change the outcome). The
/// first sighting of a Memcached (created, or listed when the operator starts) goes in
/// [`Lane::First`]; a later generation (an edit of its spec) or its deletion in
/// [`Lane::Change`]. A relist that brings an unchanged object again wakes nothing (the
/// resync is the safety net). Known by uid, so a Memcached deleted and created again under
/// its name is new; each entry is two integers.
pub(super) fn memcached_lanes<S>(memcacheds: S) -> impl Stream<Item = (ObjectRef<Memcached>, Lane)>
where
    S: Stream<Item = Result<Memcached, watcher::Error>> + Send,
{
    let mut generations: HashMap<u64, Option<i64>> = HashMap::new();
    memcacheds.filter_map(move |mc| {
        let woken = mc.ok().and_then(|mc| {
            let mut h = DefaultHasher::new();
            mc.metadata.uid.hash(&mut h);
            let uid = h.finish();
            let lane = if mc.metadata.deletion_timestamp.is_some() {
                generations.remove(&uid);
                Lane::Change
            } else {
                match generations.insert(uid, mc.metadata.generation) {
                    None => Lane::First,
                    Some(before) if before != mc.metadata.generation => Lane::Change,
                    Some(_) => return None,
                }
            };
            Some((ObjectRef::from_obj(&mc), lane))
        });
        futures::future::ready(woken)
    })
}

/// The lane of a child's (or Secret's) wake-up: drift is a change someone made; a status
/// move is the pool's progress.
pub(super) fn lane_of(urgency: Urgency) -> Lane {
    match urgency {
        Urgency::Now => Lane::Change,
        Urgency::Soon | Urgency::Batched => Lane::Progress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(
        generation: i64,
        seen: i64,
        replicas: i32,
        updated: i32,
        ready: i32,
    ) -> CachedDeployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d", "namespace": "ns", "generation": generation},
            "spec": {"replicas": 3},
            "status": {
                "observedGeneration": seen,
                "replicas": replicas,
                "updatedReplicas": updated,
                "readyReplicas": ready,
            },
        }))
        .unwrap_or_default()
    }

    fn memcached(name: &str, uid: &str, generation: i64, deleting: bool) -> Memcached {
        let mut mc: Memcached = serde_json::from_value(serde_json::json!({
            "apiVersion": "memcached.cache.example.com/v1",
            "kind": "Memcached",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": generation},
            "spec": {"size": 1},
        }))
        .unwrap_or_else(|e| panic!("a Memcached: {e}"));
        if deleting {
            mc.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            );
        }
        mc
    }

    #[tokio::test]
    async fn a_memcached_is_first_once_then_a_change_per_generation_and_a_relist_wakes_nothing() {
        let seen = [
            memcached("a", "1", 1, false),
            memcached("a", "1", 1, false),
            memcached("b", "2", 1, false),
            memcached("a", "1", 2, false),
            memcached("a", "1", 2, false),
            memcached("a", "1", 2, true),
            memcached("a", "3", 1, false),
        ];
        let lanes: Vec<(String, Lane)> =
            memcached_lanes(futures::stream::iter(seen.into_iter().map(Ok)))
                .map(|(key, lane)| (key.name, lane))
                .collect()
                .await;
        assert_eq!(
            lanes,
            [
                ("a".to_string(), Lane::First),
                ("b".to_string(), Lane::First),
                ("a".to_string(), Lane::Change),
                ("a".to_string(), Lane::Change),
                ("a".to_string(), Lane::First),
            ],
            "the same generation again (a relist) wakes nothing; deleted and created again is new"
        );
    }

    #[test]
    fn a_deployment_is_rolled_out_once_seen_with_every_pod_updated_and_ready() {
        assert!(rolled_out(&deployment(2, 2, 3, 3, 3)));
        assert!(!rolled_out(&deployment(2, 1, 3, 3, 3)), "spec not yet seen");
        assert!(!rolled_out(&deployment(2, 2, 3, 3, 2)), "a pod not Ready");
        assert!(!rolled_out(&deployment(2, 2, 4, 3, 3)), "an old pod left");
        assert!(!rolled_out(&deployment(2, 2, 3, 2, 3)), "an old pod Ready");
        assert!(!rolled_out(&CachedDeployment::default()), "no status");
    }
}
