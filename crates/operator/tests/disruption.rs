//! Deletion and disruption on the real control plane, at both pinned Kubernetes versions:
//! what kube-apiserver, the garbage collector, the scheduler and the node controllers do
//! around a running operator, and that the operator neither fights them nor loses its pools.
//!
//! - Foreground deletion: the Memcached stays Terminating until the garbage collector has
//!   removed its children, and the operator recreates none of them meanwhile.
//! - A foreign finalizer holds a deleted Memcached: a child deleted meanwhile is not
//!   recreated, the finalizer is not touched, and once it is removed nothing is left.
//! - Orphan, then recreate: the new Memcached re-adopts the children the operator created
//!   for the old one, without restarting a pod.
//!
//! The operator runs in-process, scoped to the test's namespace, under an identity of its
//! own (impersonated), so that the API server's audit log tells its requests apart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use envtest::{ControlPlane, Kube};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt, Resource, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, ControllerConfig, ReconcileCounters};
use serde_json::{Value, json};

mod common;
use common::cluster::apply_crd;
use common::wait_for_within;

/// How long the real controllers (scheduler, garbage collector, kwok) may take on the
/// shared, loaded machine. The garbage collector learns of the Memcached kind from
/// discovery, refreshed every 30 s.
const CONVERGE: Duration = Duration::from_secs(180);
const INSTANCE: &str = "app.kubernetes.io/instance";
/// The resources of a Memcached's children, as the audit log names them.
const CHILD_RESOURCES: [&str; 5] = [
    "deployments",
    "services",
    "poddisruptionbudgets",
    "configmaps",
    "servicemonitors",
];

/// One test's namespace on the shared control plane, with the operator running in it.
struct Env {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    /// The operator's identity, as the audit log shows it.
    operator: String,
    counters: Arc<ReconcileCounters>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Env {
    async fn start(kube: Kube, test: &str) -> Env {
        let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
        let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
        let ns = cp
            .namespace(test)
            .await
            .unwrap_or_else(|e| panic!("namespace: {e}"));
        apply_crd(&client, &Memcached::crd()).await;
        println!("{test}: Kubernetes {} namespace {ns}", cp.version());
        let operator = format!("memcached-operator-{ns}");
        let as_operator = cp
            .client_as(&operator, &["system:masters"])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let counters = Arc::new(ReconcileCounters::default());
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            counters: counters.clone(),
            ..ControllerConfig::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(controller::run(as_operator, config, async {
            let _ = stopped.await;
        }));
        Env {
            cp,
            client,
            ns,
            operator,
            counters,
            _stop: stop,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Applies a Memcached as a user would (server-side apply, admin).
    async fn apply(&self, name: &str, metadata: Value, spec: Value) {
        let mut meta = json!({"name": name});
        if let (Some(meta), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
            meta.extend(extra.clone());
        }
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": meta, "spec": spec,
        });
        self.api::<Memcached>()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .unwrap_or_else(|e| panic!("applying Memcached {name}: {e}"));
    }

    /// Waits until `name` is Available, settled at `size` pods, not Degraded, for its
    /// current generation.
    async fn converged(&self, name: &str, size: usize) -> Memcached {
        let api = self.api::<Memcached>();
        wait_for_within(&format!("{name} converged at {size}"), CONVERGE, || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            let available = mc.condition(condition::AVAILABLE)?.status == "True";
            let settled = mc.condition(condition::PROGRESSING)?.status == "False";
            let healthy = mc
                .condition(condition::DEGRADED)
                .is_none_or(|d| d.status != "True");
            let status = mc.status.as_ref()?;
            (available
                && settled
                && healthy
                && status.nodes.len() == size
                && status.observed_generation == mc.metadata.generation)
                .then_some(mc)
        })
        .await
    }

    /// A barrier: a Memcached of one pod created and converged. Its children's events come
    /// through the operator's watches after every earlier event of their kinds, and its
    /// status is written only once the operator has seen its Deployment Ready: so when it
    /// has converged, the operator has received (and queued) everything that happened to
    /// the children of the namespace before it was created.
    async fn barrier(&self, name: &str) {
        self.apply(name, json!({}), json!({"size": 1})).await;
        self.converged(name, 1).await;
    }

    /// The children of the Memcached `name` (by its instance label): `Kind/name` → uid.
    async fn children(&self, name: &str) -> BTreeMap<String, String> {
        let lp = ListParams::default().labels(&format!("{INSTANCE}={name}"));
        let mut out = BTreeMap::new();
        let mut add = |kind: &str, items: Vec<(String, String)>| {
            for (n, uid) in items {
                out.insert(format!("{kind}/{n}"), uid);
            }
        };
        add(
            "Deployment",
            names(self.api::<Deployment>().list(&lp).await),
        );
        add("Service", names(self.api::<Service>().list(&lp).await));
        add(
            "PodDisruptionBudget",
            names(self.api::<PodDisruptionBudget>().list(&lp).await),
        );
        out
    }

    /// The pods of the Memcached `name`: name → uid.
    async fn pods(&self, name: &str) -> BTreeMap<String, String> {
        let lp = ListParams::default().labels(&format!("{INSTANCE}={name}"));
        names(self.api::<Pod>().list(&lp).await)
            .into_iter()
            .collect()
    }

    /// The ReplicaSets of the Memcached `name`: name → uid.
    async fn replica_sets(&self, name: &str) -> BTreeMap<String, String> {
        let lp = ListParams::default().labels(&format!("{INSTANCE}={name}"));
        names(self.api::<ReplicaSet>().list(&lp).await)
            .into_iter()
            .collect()
    }

    /// The writes the operator made to `children` (`Kind/name`, as [`Env::children`] lists
    /// them) after the request that deleted the Memcached `name`, as the audit log shows
    /// them: `verb resource/name`.
    fn child_writes_after_delete(
        &self,
        name: &str,
        children: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let names: Vec<&str> = children
            .keys()
            .filter_map(|k| k.split_once('/').map(|(_, n)| n))
            .collect();
        let log = self.cp.audit().unwrap_or_else(|e| panic!("audit log: {e}"));
        let deleted = log
            .iter()
            .position(|r| {
                r.verb == "delete"
                    && r.resource == "memcacheds"
                    && r.namespace == self.ns
                    && r.name == name
            })
            .unwrap_or_else(|| panic!("the deletion of {name} is not in the audit log"));
        log[deleted..]
            .iter()
            .filter(|r| {
                r.username == self.operator
                    && r.namespace == self.ns
                    && r.is_write()
                    && CHILD_RESOURCES.contains(&r.resource.as_str())
                    && names.contains(&r.name.as_str())
            })
            .map(|r| format!("{} {}/{}", r.verb, r.resource, r.name))
            .collect()
    }

    /// The operator's writes of the Memcached `name` itself other than its status.
    fn memcached_writes(&self, name: &str) -> Vec<String> {
        let log = self.cp.audit().unwrap_or_else(|e| panic!("audit log: {e}"));
        log.iter()
            .filter(|r| {
                r.username == self.operator
                    && r.namespace == self.ns
                    && r.resource == "memcacheds"
                    && r.name == name
                    && r.subresource.is_empty()
                    && r.is_write()
            })
            .map(|r| format!("{} {}", r.verb, r.request_uri))
            .collect()
    }
}

fn names<K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug>(
    list: kube::Result<kube::core::ObjectList<K>>,
) -> Vec<(String, String)> {
    list.unwrap_or_else(|e| panic!("list: {e}"))
        .items
        .iter()
        .map(|o| (o.name_any(), o.uid().unwrap_or_default()))
        .collect()
}

/// Fails with the first few of `writes` (the audit log's) unless there are none.
fn no_writes(writes: &[String]) {
    assert!(
        writes.is_empty(),
        "the operator wrote {} times, first: {:?}",
        writes.len(),
        &writes[..writes.len().min(8)]
    );
}

fn deletion_waits_for(mc: &Memcached, finalizer: &str) -> bool {
    mc.metadata.deletion_timestamp.is_some() && mc.finalizers().iter().any(|f| f == finalizer)
}

on_both_versions! {
async fn orphaned_children_are_readopted_by_a_recreated_memcached_without_a_restart(kube: Kube) {
    let env = Env::start(kube, "orphan-then-recreate").await;
    let spec = json!({"size": 2});
    env.apply("warm", json!({}), spec.clone()).await;
    env.converged("warm", 2).await;
    let deployments = env.api::<Deployment>();
    // The Deployment as its controller has finished with it: its ReplicaSets are all there.
    let settled = |deployment: Deployment| {
        let status = deployment.status.as_ref()?;
        (status.observed_generation == deployment.metadata.generation
            && status.updated_replicas == Some(2)
            && status.ready_replicas == Some(2))
        .then_some(deployment)
    };
    let before = wait_for_within("warm's Deployment settled", CONVERGE, || async {
        settled(deployments.get("warm").await.ok()?)
    })
    .await;
    let template = serde_json::to_value(&before.spec.as_ref().expect("spec").template)
        .expect("template");
    let children = env.children("warm").await;
    for child in ["Deployment/warm", "Service/warm", "PodDisruptionBudget/warm"] {
        assert!(children.contains_key(child), "{child} in {children:?}");
    }
    let pods = env.pods("warm").await;
    assert_eq!(pods.len(), 2, "{pods:?}");
    let replica_sets = env.replica_sets("warm").await;

    // Deleted, its children orphaned: the garbage collector takes its ownerReferences off
    // them before the Memcached goes, and keeps them running.
    let memcacheds = env.api::<Memcached>();
    memcacheds
        .delete("warm", &DeleteParams::orphan())
        .await
        .expect("delete with propagationPolicy Orphan");
    wait_for_within("warm gone", CONVERGE, || async {
        memcacheds.get_opt("warm").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(env.children("warm").await, children, "the children stay");
    let orphan = deployments.get("warm").await.expect("the Deployment");
    assert!(
        orphan.owner_references().is_empty(),
        "orphaned: {:?}",
        orphan.owner_references()
    );

    // Recreated with the same spec: the operator takes its children back as they are.
    env.apply("warm", json!({}), spec).await;
    let mc = env.converged("warm", 2).await;
    let uid = mc.uid().expect("uid");
    wait_for_within("every child controlled by the new warm", CONVERGE, || async {
        let lp = ListParams::default().labels(&format!("{INSTANCE}=warm"));
        let controlled = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter().any(|o| o.controller == Some(true) && o.uid == uid)
        };
        let d = deployments.list(&lp).await.ok()?.items;
        let s = env.api::<Service>().list(&lp).await.ok()?.items;
        let p = env.api::<PodDisruptionBudget>().list(&lp).await.ok()?.items;
        (d.iter().all(|o| controlled(o.owner_references()))
            && s.iter().all(|o| controlled(o.owner_references()))
            && p.iter().all(|o| controlled(o.owner_references())))
        .then_some(())
    })
    .await;
    let after = wait_for_within("warm's Deployment settled again", CONVERGE, || async {
        settled(deployments.get("warm").await.ok()?)
    })
    .await;
    assert_eq!(env.children("warm").await, children, "the same objects, re-adopted");
    assert_eq!(
        serde_json::to_value(&after.spec.as_ref().expect("spec").template).expect("template"),
        template,
        "the pod template is unchanged"
    );
    assert_eq!(env.replica_sets("warm").await, replica_sets, "no new ReplicaSet");
    assert_eq!(env.pods("warm").await, pods, "no pod restarted");
}
}

on_both_versions! {
async fn foreground_deletion_waits_for_the_garbage_collector_and_nothing_is_recreated(kube: Kube) {
    let env = Env::start(kube, "foreground-deletion").await;
    env.apply("fg", json!({}), json!({"size": 2})).await;
    env.converged("fg", 2).await;
    let children = env.children("fg").await;
    assert!(children.contains_key("PodDisruptionBudget/fg"), "{children:?}");
    let reconciles = env.counters.reconciles();

    let memcacheds = env.api::<Memcached>();
    memcacheds
        .delete("fg", &DeleteParams::foreground())
        .await
        .expect("delete with propagationPolicy Foreground");
    // While any child is left, the Memcached stays, Terminating, held by the garbage
    // collector's finalizer; once it is gone, so are they.
    let seen_terminating = std::cell::Cell::new(0);
    wait_for_within("fg and its children gone", CONVERGE, || {
        let memcacheds = memcacheds.clone();
        let env = &env;
        let seen = &seen_terminating;
        async move {
            match memcacheds.get_opt("fg").await.ok()? {
                Some(mc) => {
                    assert!(
                        deletion_waits_for(&mc, "foregroundDeletion"),
                        "fg is not held by foregroundDeletion: {:?}",
                        mc.metadata
                    );
                    seen.set(seen.get() + 1);
                    None
                }
                None => {
                    let left = env.children("fg").await;
                    assert!(left.is_empty(), "fg went before its children: {left:?}");
                    Some(())
                }
            }
        }
    })
    .await;
    assert!(seen_terminating.get() > 0, "fg was never seen Terminating");
    assert!(env.pods("fg").await.is_empty(), "fg's pods are gone too");

    // The operator saw all of it (the barrier) and wrote none of fg's children meanwhile.
    env.barrier("after-fg").await;
    assert!(
        env.counters.reconciles() > reconciles,
        "the operator reconciled the Terminating fg"
    );
    no_writes(&env.child_writes_after_delete("fg", &children));
    assert!(env.children("fg").await.is_empty(), "nothing recreated");
}
}

on_both_versions! {
async fn a_foreign_finalizer_holds_a_deleted_memcached_and_its_children_are_not_recreated(kube: Kube) {
    const HOLD: &str = "example.com/hold";
    let env = Env::start(kube, "foreign-finalizer").await;
    env.apply("held", json!({"finalizers": [HOLD]}), json!({"size": 2})).await;
    env.converged("held", 2).await;
    let children = env.children("held").await;
    assert!(children.contains_key("PodDisruptionBudget/held"), "{children:?}");

    let memcacheds = env.api::<Memcached>();
    memcacheds
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let mc = memcacheds.get("held").await.expect("held is Terminating");
    assert!(deletion_waits_for(&mc, HOLD), "{:?}", mc.metadata);

    // A child deleted by hand while the Memcached is Terminating: the operator is woken
    // by its deletion, and leaves it deleted.
    let reconciles = env.counters.reconciles();
    env.api::<Deployment>()
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete the Deployment");
    env.api::<Service>()
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete the Service");
    wait_for_within("held's Deployment and Service gone", CONVERGE, || async {
        let d = env.api::<Deployment>().get_opt("held").await.ok()?;
        let s = env.api::<Service>().get_opt("held").await.ok()?;
        (d.is_none() && s.is_none()).then_some(())
    })
    .await;
    env.barrier("after-held").await;
    assert!(
        env.counters.reconciles() > reconciles,
        "the operator reconciled the Terminating held"
    );
    no_writes(&env.child_writes_after_delete("held", &children));
    assert!(env.api::<Deployment>().get_opt("held").await.expect("get").is_none());
    assert!(env.api::<Service>().get_opt("held").await.expect("get").is_none());
    // The finalizer is not the operator's to remove: it holds the Memcached still.
    let mc = memcacheds.get("held").await.expect("held is still Terminating");
    assert!(deletion_waits_for(&mc, HOLD), "{:?}", mc.metadata);
    no_writes(&env.memcached_writes("held"));
    // ... and the rest of its children stay while it does.
    let left = env.children("held").await;
    assert!(left.contains_key("PodDisruptionBudget/held"), "{left:?}");

    // The finalizer removed: the Memcached goes, and the garbage collector takes the rest.
    memcacheds
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the finalizer");
    wait_for_within("held and everything of it gone", CONVERGE, || async {
        let gone = memcacheds.get_opt("held").await.ok()?.is_none()
            && env.children("held").await.is_empty()
            && env.replica_sets("held").await.is_empty()
            && env.pods("held").await.is_empty();
        gone.then_some(())
    })
    .await;
}
}
