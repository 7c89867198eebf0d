//! The Memcached controller end to end, through the real kube-runtime `Controller`, against
//! the in-memory API server with its workload simulator (Deployment → ReplicaSet → Pods).

use std::sync::Arc;
use std::time::Duration;

use apisim::{ApiServer, Fault};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::builders::{
    APPLIED_HASH_ANNOTATION, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY,
};
use memcached_operator::controller::{self, Backoff, ControllerConfig, ReconcileCounters};
use memcached_operator::samples::SEED_SAMPLE;
use serde_json::json;

mod common;
use common::cluster::{Cluster, Server, apply_crd};
use common::{wait_for, wait_for_within};

struct Env {
    cluster: Cluster,
    client: Client,
    counters: Arc<ReconcileCounters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Waits until no reconcile has started for two status batch windows and a second: a
/// batched wake-up runs one window after the change that queued it (held longer only while
/// every reconcile slot is taken, which a handful of objects never does).
async fn quiet(counters: &ReconcileCounters) {
    let calm_for = ControllerConfig::default().status_batch * 2 + Duration::from_secs(1);
    let deadline = std::time::Instant::now() + common::DEADLINE;
    loop {
        let seen = counters.reconciles();
        tokio::time::sleep(calm_for).await;
        if counters.reconciles() == seen {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller never went {calm_for:?} without a reconcile"
        );
    }
}

fn sim_server() -> ApiServer {
    ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .build()
}

impl Env {
    async fn start() -> Env {
        Self::start_with(ControllerConfig::default(), |_| {}).await
    }

    /// The controller against `server`, in a namespace of its own on a real one.
    async fn on(server: Server, test: &str) -> Env {
        let cluster = Cluster::start(
            server,
            test,
            |b| b.pod_ready_delay(Duration::from_millis(50)),
            false,
        )
        .await;
        Self::run(cluster, ControllerConfig::default(), |_| {}).await
    }

    async fn start_with(config: ControllerConfig, before: impl FnOnce(&ApiServer)) -> Env {
        Self::start_on(sim_server(), config, before).await
    }

    async fn start_on(
        server: ApiServer,
        config: ControllerConfig,
        before: impl FnOnce(&ApiServer),
    ) -> Env {
        let client = server.client();
        let cluster = Cluster {
            client,
            ns: "default".to_string(),
            sim: Some(server),
            real: None,
        };
        apply_crd(&cluster.client, &Memcached::crd()).await;
        Self::run(cluster, config, before).await
    }

    async fn run(
        cluster: Cluster,
        config: ControllerConfig,
        before: impl FnOnce(&ApiServer),
    ) -> Env {
        if let Some(sim) = cluster.sim.as_ref() {
            before(sim);
        }
        let config = ControllerConfig {
            namespace: cluster.watch_namespace(),
            backoff: Backoff {
                base: Duration::from_millis(20),
                cap: Duration::from_millis(500),
            },
            ..config
        };
        let counters = config.counters.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let client = cluster.client.clone();
        let task = tokio::spawn(controller::run(client.clone(), config, async {
            let _ = rx.await;
        }));
        Env {
            cluster,
            client,
            counters,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// The in-memory server (scenarios that count its requests or inject its faults).
    fn server(&self) -> &ApiServer {
        self.cluster
            .sim
            .as_ref()
            .expect("this scenario needs the in-memory server")
    }

    fn memcacheds(&self) -> Api<Memcached> {
        self.cluster.api()
    }
    fn deployments(&self) -> Api<Deployment> {
        self.cluster.api()
    }
    fn services(&self) -> Api<Service> {
        self.cluster.api()
    }
    fn pods(&self) -> Api<Pod> {
        self.cluster.api()
    }
    fn events(&self) -> Api<Event> {
        self.cluster.api()
    }

    async fn apply_sample(&self, name: &str, size: i32) {
        let yaml = SEED_SAMPLE
            .replace("memcached-sample", name)
            .replace("size: 3", &format!("size: {size}"));
        let mc: Memcached = serde_yaml::from_str(&yaml).expect("sample parses");
        self.memcacheds()
            .patch(name, &PatchParams::apply("kubectl"), &Patch::Apply(&mc))
            .await
            .expect("sample applies");
    }

    /// Sets `spec.size` by a merge patch, as `kubectl patch` would.
    async fn resize(&self, name: &str, size: i32) {
        self.memcacheds()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": size}})),
            )
            .await
            .expect("spec.size patched");
    }

    /// Waits until `name` reports `size` ready pods, all of them named in `status.nodes`,
    /// for its current generation.
    async fn converged(&self, name: &str, size: usize) -> Memcached {
        let api = self.memcacheds();
        wait_for(&format!("{name} converged at {size}"), || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            let status = mc.status.as_ref()?;
            let available = mc.condition(condition::AVAILABLE)?.status == "True";
            let settled = mc.condition(condition::PROGRESSING)?.status == "False";
            (status.nodes.len() == size
                && status.ready_replicas as usize == size
                && available
                && settled
                && status.observed_generation == mc.metadata.generation)
                .then_some(mc)
        })
        .await
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn sorted_pod_names(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    names.sort();
    names
}

async fn live_pods(env: &Env, name: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    env.pods()
        .list(&lp)
        .await
        .expect("pods list")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

on_every_server! {
async fn seed_sample_gets_a_deployment_a_service_and_three_pod_names(server: Server) {
    let env = Env::on(server, "seed_sample_gets_a_deployment_").await;
    env.apply_sample("memcached-sample", 3).await;
    let mc = env.converged("memcached-sample", 3).await;

    let d = env
        .deployments()
        .get("memcached-sample")
        .await
        .expect("Deployment exists");
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let c = &spec.template.spec.as_ref().expect("pod spec").containers[0];
    assert_eq!(c.name, "memcached");
    assert_eq!(c.image.as_deref(), Some(memcached_api::DEFAULT_IMAGE));
    assert_eq!(c.command.as_ref().expect("command")[0], "memcached");
    let port = &c.ports.as_ref().expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("memcached"), 11211)
    );
    let owner = &d.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        (
            "Memcached",
            "memcached-sample",
            mc.uid().expect("uid").as_str()
        )
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );

    let s = env
        .services()
        .get("memcached-sample")
        .await
        .expect("Service exists");
    assert_eq!(
        s.spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .expect("ports")[0]
            .port,
        11211
    );
    assert_eq!(s.owner_references()[0].uid, mc.uid().expect("uid"));

    let pods = live_pods(&env, "memcached-sample").await;
    let status = mc.status.expect("status");
    assert_eq!(status.nodes, sorted_pod_names(&pods));
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.starts_with("memcached-sample-"))
    );
    assert_eq!(status.replicas, 3);
    assert_eq!(mc.metadata.generation, status.observed_generation);
    env.stop().await;
}
}

on_every_server! {
async fn scaling_to_five_and_to_zero_follows_spec_size(server: Server) {
    let env = Env::on(server, "scaling_to_five_and_to_zero_fo").await;
    env.apply_sample("scaled", 3).await;
    env.converged("scaled", 3).await;

    // `kubectl scale memcached/scaled --replicas=5` goes through the scale subresource: the
    // pinned kubectl itself on a real server, the same request by hand on the in-memory one.
    if let Some(cp) = env.cluster.real {
        let out = cp
            .kubectl()
            .args(["scale", "memcached/scaled", "--replicas=5", "-n", &env.cluster.ns])
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl scale: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        env.memcacheds()
            .patch_scale(
                "scaled",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .expect("scale subresource accepts");
    }
    let mc = env.converged("scaled", 5).await;
    assert_eq!(
        mc.status.expect("status").nodes,
        sorted_pod_names(&live_pods(&env, "scaled").await)
    );

    // The scale above made another field manager own spec.size, so edit it as kubectl
    // patch would (a re-apply without --force-conflicts would rightly conflict).
    env.resize("scaled", 0).await;
    let mc = env.converged("scaled", 0).await;
    assert!(mc.status.expect("status").nodes.is_empty());
    let d = env
        .deployments()
        .get("scaled")
        .await
        .expect("Deployment kept");
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(0));
    assert!(
        env.services()
            .get_opt("scaled")
            .await
            .expect("get")
            .is_some(),
        "Service kept at size 0"
    );
    env.stop().await;
}
}

on_every_server! {
async fn manual_replica_edit_is_repaired_and_deleted_service_recreated(server: Server) {
    let env = Env::on(server, "manual_replica_edit_is_repaire").await;
    env.apply_sample("drift", 3).await;
    env.converged("drift", 3).await;

    env.deployments()
        .patch(
            "drift",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("edit");
    wait_for("replicas repaired to 3", || async {
        let d = env.deployments().get("drift").await.ok()?;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;

    let old_uid = env.services().get("drift").await.expect("Service").uid();
    env.services()
        .delete("drift", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("Service recreated", || async {
        let s = env.services().get_opt("drift").await.ok().flatten()?;
        (s.uid() != old_uid && s.metadata.deletion_timestamp.is_none()).then_some(())
    })
    .await;
    env.converged("drift", 3).await;
    env.stop().await;
}
}

on_every_server! {
/// Labels and annotations are cached as text (`cached::MetaText`), not typed: an edit of
/// them alone (no generation change, so only the metadata hash can notice) is still drift,
/// repaired at once; the default resync (5 min) is far beyond this test's deadline.
async fn a_metadata_only_edit_of_a_child_is_repaired(server: Server) {
    let env = Env::on(server, "a_metadata_only_edit_of_a_chil").await;
    env.apply_sample("relabel", 1).await;
    env.converged("relabel", 1).await;
    let ours = |meta: &ObjectMeta| {
        let label = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_COMPONENT))
            .cloned();
        let hash = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_HASH_ANNOTATION))
            .cloned();
        (label, hash)
    };
    let before = ours(
        &env.services()
            .get("relabel")
            .await
            .expect("Service")
            .metadata,
    );
    assert!(before.0.is_some() && before.1.is_some(), "{before:?}");
    env.services()
        .patch(
            "relabel",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {LABEL_COMPONENT: "hijacked"},
                "annotations": {APPLIED_HASH_ANNOTATION: null},
            }})),
        )
        .await
        .expect("edit");
    let before_deployment = env.deployments().get("relabel").await.expect("Deployment");
    env.deployments()
        .patch(
            "relabel",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL_COMPONENT: "x"}}})),
        )
        .await
        .expect("edit");
    wait_for("labels and annotation restored", || async {
        let s = env.services().get("relabel").await.ok()?;
        let d = env.deployments().get("relabel").await.ok()?;
        (ours(&s.metadata) == before && ours(&d.metadata) == ours(&before_deployment.metadata))
            .then_some(())
    })
    .await;
    env.stop().await;
}
}

on_every_server! {
async fn deleting_the_memcached_leaves_nothing_behind(server: Server) {
    let env = Env::on(server, "deleting_the_memcached_leaves_").await;
    env.apply_sample("gone", 2).await;
    env.converged("gone", 2).await;
    env.memcacheds()
        .delete("gone", &DeleteParams::default())
        .await
        .expect("delete");
    // kube-controller-manager's garbage collector learns of a new resource kind from
    // discovery, which it refreshes every 30 s: right after the CRD is installed, the
    // Memcached's dependents may wait that long.
    wait_for_within("children garbage-collected", Duration::from_secs(90), || async {
        let d = env.deployments().get_opt("gone").await.ok()?;
        let s = env.services().get_opt("gone").await.ok()?;
        let pods = live_pods(&env, "gone").await;
        (d.is_none() && s.is_none() && pods.is_empty()).then_some(())
    })
    .await;
    env.stop().await;
}
}

on_every_server! {
async fn a_deleted_pod_is_replaced_and_status_nodes_follow(server: Server) {
    let env = Env::on(server, "a_deleted_pod_is_replaced_and_").await;
    env.apply_sample("podchurn", 2).await;
    let before = env
        .converged("podchurn", 2)
        .await
        .status
        .expect("status")
        .nodes;
    env.pods()
        .delete(&before[0], &DeleteParams::default())
        .await
        .expect("delete pod");
    let api = env.memcacheds();
    let after = wait_for("nodes list the replacement pod", || async {
        let mc = api.get("podchurn").await.ok()?;
        let nodes = mc.status?.nodes;
        (nodes.len() == 2 && !nodes.contains(&before[0])).then_some(nodes)
    })
    .await;
    assert_eq!(after, sorted_pod_names(&live_pods(&env, "podchurn").await));
    env.stop().await;
}
}

/// What a new Memcached costs the API server: each child applied once, one event for the
/// whole creation, and a status written when the children are made plus (batched) once as
/// the pods come up, instead of once per pod change.
#[tokio::test]
async fn a_new_memcached_costs_each_child_once_one_event_and_few_status_writes() {
    let env = Env::start().await;
    env.server().reset_request_counts();
    env.apply_sample("thrifty", 3).await;
    env.converged("thrifty", 3).await;
    // The batched status reconcile is counted too: the counts are read once the controller
    // has gone two batch windows and a second without starting a reconcile, so whatever
    // the pods' last changes queued has run.
    quiet(&env.counters).await;
    let counts = env.server().request_counts();
    for (resource, applies) in [
        ("deployments", 1),
        ("services", 1),
        ("poddisruptionbudgets", 1),
    ] {
        assert_eq!(
            counts.get("patch", resource),
            applies,
            "{resource} applied more than needed:\n{counts}"
        );
    }
    assert_eq!(counts.get("create", "events"), 1, "{counts}");
    assert_eq!(counts.get("patch", "events"), 0, "{counts}");
    let status_writes = counts.get("patch", "memcacheds/status");
    assert!(
        (1..=3).contains(&status_writes),
        "{status_writes} status writes for one new Memcached:\n{counts}"
    );
    let events = env.events();
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(
        notes,
        [
            "Created Deployment thrifty with 3 replicas; Created Service thrifty; \
          Created PodDisruptionBudget thrifty"
        ],
    );
    env.stop().await;
}

/// The move that completes a pool (its Deployment rolled out) reconciles it at once: the
/// status says Available without waiting for the batch window the pods' moves fall in.
#[tokio::test]
async fn a_pool_is_reported_available_as_soon_as_its_deployment_completes() {
    let window = Duration::from_secs(30);
    let config = ControllerConfig {
        status_batch: window,
        ..ControllerConfig::default()
    };
    let env = Env::start_with(config, |_| {}).await;
    let start = std::time::Instant::now();
    env.apply_sample("prompt", 3).await;
    env.converged("prompt", 3).await;
    let took = start.elapsed();
    assert!(
        took < window,
        "Available after {took:?}: the completing move waited for the batch window"
    );
    env.stop().await;
}

/// A status change that only adds to what was written (here a pod listed in
/// `status.nodes`) waits until the pool's progress interval after its last write, and is
/// written then even though nothing else happens: held, never lost.
#[tokio::test]
async fn progress_waits_for_the_interval_after_the_last_write_and_is_then_written() {
    let interval = Duration::from_secs(6);
    let config = ControllerConfig {
        status_progress_interval: interval,
        ..ControllerConfig::default()
    };
    let env = Env::start_with(config, |_| {}).await;
    env.apply_sample("paced", 3).await;
    env.converged("paced", 3).await;
    quiet(&env.counters).await;
    // Pods of the pool as the operator counts them (a ReplicaSet `paced-<hash>` controls
    // them), outside the Deployment's selector so that its ReplicaSet does not take them:
    // each only adds a name to `status.nodes`.
    let extra = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                LABEL_INSTANCE: "paced",
                LABEL_MANAGED_BY: MANAGED_BY,
                "pod-template-hash": "extra",
            }, "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "paced-extra",
                "uid": "6f1c9d3e-0000-4000-8000-000000000001", "controller": true,
            }]},
            "spec": {"containers": [{"name": "c", "image": "memcached"}]},
        }))
        .expect("a pod")
    };
    let listed = |pod: &'static str| {
        let api = env.memcacheds();
        async move {
            wait_for(&format!("{pod} in status.nodes"), || async {
                let mc = api.get_opt("paced").await.ok().flatten()?;
                mc.status?.nodes.iter().any(|n| n == pod).then_some(())
            })
            .await
        }
    };
    let pods = env.pods();
    pods.create(&PostParams::default(), &extra("paced-extra-a"))
        .await
        .expect("pod a");
    // The pool's last write was while it converged, longer ago than the interval or not:
    // once a is listed, the last write is that one.
    listed("paced-extra-a").await;
    let written = std::time::Instant::now();
    pods.create(&PostParams::default(), &extra("paced-extra-b"))
        .await
        .expect("pod b");
    listed("paced-extra-b").await;
    let waited = written.elapsed();
    assert!(
        waited >= interval / 2,
        "b was written {waited:?} after a: progress is held for the interval ({interval:?})"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_backlog_gets_its_children_before_any_event_and_no_event_is_lost() {
    // Sixty Memcacheds exist before the operator starts, every request takes 20 ms and only
    // two reconciles run at once: the backlog lasts longer than a status batching window.
    const N: usize = 60;
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .build();
    let client = server.client();
    common::install_crds(&client, false).await;
    let memcacheds: Api<Memcached> = Api::default_namespaced(client.clone());
    let names: Vec<String> = (0..N).map(|i| format!("backlog-{i}")).collect();
    for name in &names {
        let yaml = SEED_SAMPLE
            .replace("memcached-sample", name)
            .replace("size: 3", "size: 1");
        let mc: Memcached = serde_yaml::from_str(&yaml).expect("sample parses");
        memcacheds
            .create(&PostParams::default(), &mc)
            .await
            .expect("Memcached created");
    }
    server.set_latency(Duration::from_millis(20));
    // Events wait for a free slot at most 10 s by default, which a debug build's backlog
    // can outlast on a loaded machine; the order is what is asserted, so they may wait for
    // as long as the backlog takes.
    let config = ControllerConfig {
        concurrency: 2,
        event_max_hold: common::DEADLINE,
        ..ControllerConfig::default()
    };
    let env = Env::start_on(server, config, |_| {}).await;
    for name in &names {
        env.converged(name, 1).await;
    }

    let events = env.events();
    let created = wait_for("one creation event per Memcached", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let created: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("Created Deployment backlog-"))
            })
            .collect();
        (created.len() >= N).then_some(created)
    })
    .await;
    let mut about: Vec<String> = created
        .iter()
        .filter_map(|e| e.regarding.as_ref()?.name.clone())
        .collect();
    about.sort();
    about.dedup();
    assert_eq!((created.len(), about.len()), (N, N), "one event each");

    // Events wait while every reconcile slot is taken: the last child of the backlog was
    // written before the first event (resourceVersions are one global, increasing count).
    let rv = |meta: &ObjectMeta| meta.resource_version.as_deref()?.parse::<u64>().ok();
    let last_service = env
        .services()
        .list(&ListParams::default())
        .await
        .expect("services")
        .items
        .iter()
        .filter_map(|s| rv(&s.metadata))
        .max();
    let first_event = created.iter().filter_map(|e| rv(&e.metadata)).min();
    assert!(
        matches!((last_service, first_event), (Some(s), Some(e)) if s < e),
        "last Service at {last_service:?}, first event at {first_event:?}"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_scale_change_overtakes_a_backlog_of_new_pools() {
    // One pool converged, then sixty new ones at once, two reconciles at a time and every
    // request taking 20 ms: a backlog of seconds. A scale change of the first pool is
    // reconciled as soon as a slot frees up, ahead of the new pools (the work queue's
    // lanes), not after a random share of them.
    const N: usize = 60;
    let counters = Arc::new(ReconcileCounters::per_object());
    let config = ControllerConfig {
        concurrency: 2,
        counters: counters.clone(),
        event_max_hold: common::DEADLINE,
        ..ControllerConfig::default()
    };
    let env = Env::start_with(config, |_| {}).await;
    env.apply_sample("edited", 1).await;
    env.converged("edited", 1).await;
    quiet(&counters).await;
    let names: Vec<String> = (0..N).map(|i| format!("new-{i}")).collect();
    env.server().set_latency(Duration::from_millis(20));
    futures::future::join_all(names.iter().map(|name| env.apply_sample(name, 1))).await;
    let keys: Vec<_> = names
        .iter()
        .map(|n| kube::runtime::reflector::ObjectRef::<Memcached>::new(n).within("default"))
        .collect();
    let edited = kube::runtime::reflector::ObjectRef::<Memcached>::new("edited").within("default");
    let not_started = || keys.iter().filter(|k| counters.started_for(k) == 0).count();
    let before = counters.started_for(&edited);
    let backlog = not_started();
    env.resize("edited", 2).await;
    let left = wait_for("the scale change reconciled", || async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        (counters.started_for(&edited) > before).then(not_started)
    })
    .await;
    assert!(
        backlog >= N / 2,
        "the backlog had gone before the change: {backlog} of {N} not started"
    );
    assert!(
        left + 6 >= backlog,
        "the change waited for {} of the {backlog} new pools queued before it",
        backlog - left
    );
    env.converged("edited", 2).await;
    for name in &names {
        env.converged(name, 1).await;
    }
    env.stop().await;
}

#[tokio::test]
async fn two_scalings_in_a_row_are_two_events_each_with_its_own_note() {
    let env = Env::start().await;
    env.apply_sample("twice", 2).await;
    env.converged("twice", 2).await;
    for size in [3, 4] {
        env.resize("twice", size).await;
        env.converged("twice", size as usize).await;
    }
    let events = env.events();
    let mut notes = wait_for("both scaling events", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let notes: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Scaled"))
            .filter_map(|e| e.note)
            .collect();
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    notes.sort();
    assert_eq!(
        notes,
        [
            "Scaled Deployment twice from 2 to 3 replicas",
            "Scaled Deployment twice from 3 to 4 replicas",
        ],
        "not one event counted twice under the first change's note"
    );
    env.stop().await;
}

#[tokio::test]
async fn converged_objects_cost_zero_writes_on_resync() {
    let config = ControllerConfig {
        resync: Duration::from_millis(100),
        ..ControllerConfig::default()
    };
    let env = Env::start_with(config, |_| {}).await;
    env.apply_sample("quiet-a", 3).await;
    env.apply_sample("quiet-b", 1).await;
    env.converged("quiet-a", 3).await;
    env.converged("quiet-b", 1).await;
    // Settled: a stretch of two batch windows and a second without a write, so the
    // convergence's last batched status write is behind us (resyncs reconcile all along).
    let settle_for = ControllerConfig::default().status_batch * 2 + Duration::from_secs(1);
    wait_for("a stretch without writes", || async {
        env.server().reset_request_counts();
        tokio::time::sleep(settle_for).await;
        (env.server().request_counts().writes() == 0).then_some(())
    })
    .await;

    env.server().reset_request_counts();
    let reconciles_before = env.counters.reconciles();
    // At least several resync periods for both objects.
    wait_for("ten resync reconciles", || async {
        (env.counters.reconciles() >= reconciles_before + 10).then_some(())
    })
    .await;
    let counts = env.server().request_counts();
    assert_eq!(counts.writes(), 0, "writes during resync:\n{counts}");
    assert_eq!(env.counters.failures(), 0);
    env.stop().await;
}

/// A resync of children that did not change costs no JSON comparison: each version of a
/// child is compared with its desired state once, and drift (a new version) is compared
/// again and repaired.
#[tokio::test]
async fn a_resync_compares_each_child_version_once() {
    let config = ControllerConfig {
        resync: Duration::from_millis(100),
        ..ControllerConfig::default()
    };
    let env = Env::start_with(config, |_| {}).await;
    env.apply_sample("once", 3).await;
    env.converged("once", 3).await;
    let counters = env.counters.clone();
    let resyncs = |n: u64| {
        let (counters, target) = (counters.clone(), counters.reconciles() + n);
        wait_for("resync reconciles", move || {
            let done = counters.reconciles() >= target;
            async move { done.then_some(()) }
        })
    };
    // Every child's current version gets compared once in the first resyncs.
    resyncs(3).await;
    let checks = env.counters.drift_checks();
    resyncs(10).await;
    assert_eq!(
        env.counters.drift_checks(),
        checks,
        "children compared again though nothing changed"
    );

    // A hand edit is a new version: compared, found drifted, repaired.
    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    services
        .patch(
            "once",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {LABEL_INSTANCE: "other"}}})),
        )
        .await
        .unwrap();
    wait_for("the Service repaired", || async {
        let svc = services.get("once").await.ok()?;
        let selector = svc.spec?.selector.unwrap_or_default();
        (selector.get(LABEL_INSTANCE).map(String::as_str) == Some("once")).then_some(())
    })
    .await;
    assert!(env.counters.drift_checks() > checks);
    assert_eq!(env.counters.failures(), 0);
    env.stop().await;
}

#[tokio::test]
async fn injected_server_errors_and_conflicts_still_converge() {
    let env = Env::start_with(ControllerConfig::default(), |server| {
        server.inject(
            Fault::new()
                .verb("patch")
                .resource("deployments")
                .status(500)
                .times(3),
        );
        server.inject(
            Fault::new()
                .verb("patch")
                .resource("services")
                .status(409)
                .times(2),
        );
        server.inject(
            Fault::new()
                .verb("patch")
                .resource("memcacheds")
                .subresource("status")
                .status(500)
                .times(2),
        );
    })
    .await;
    env.apply_sample("flaky", 3).await;
    env.converged("flaky", 3).await;
    assert!(env.counters.failures() >= 3, "the injected faults were hit");
    // The failures were recorded as Degraded while they lasted; once a reconcile succeeds
    // (after its backoff) the condition clears.
    let api = env.memcacheds();
    wait_for("Degraded to clear", || async {
        let mc = api.get_opt("flaky").await.ok().flatten()?;
        (mc.condition(condition::DEGRADED)?.status == "False").then_some(())
    })
    .await;
    env.stop().await;
}

/// A child deleted while the operator's watch was down (so its Delete event is never seen,
/// only its absence from the re-list) is still recreated at once, not at the next resync.
#[tokio::test]
async fn a_child_deleted_during_a_watch_gap_is_recreated_after_the_relist() {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .watch_history(20)
        .build();
    // The default resync (5 min) is far beyond this test's deadline.
    let env = Env::start_on(server, ControllerConfig::default(), |_| {}).await;
    env.apply_sample("gapped", 1).await;
    env.converged("gapped", 1).await;

    // The Service watch goes down and stays down while the Service is deleted and enough
    // other changes happen for its resume point to fall out of the server's history.
    env.server()
        .inject(Fault::new().verb("watch").resource("services").status(500));
    env.server().cut_watches();
    tokio::time::sleep(Duration::from_millis(200)).await;
    env.services()
        .delete("gapped", &DeleteParams::default())
        .await
        .expect("delete Service");
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::default_namespaced(env.client.clone());
    for i in 0..30 {
        let cm = serde_json::from_value(json!({"metadata": {"name": format!("filler-{i}")}}))
            .expect("a ConfigMap");
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .expect("create ConfigMap");
    }
    env.server().clear_faults();

    // The watch resumes with 410 Gone, re-lists, and finds the Service missing.
    wait_for("the Service recreated after the re-list", || async {
        env.services().get_opt("gapped").await.ok().flatten()
    })
    .await;
    env.stop().await;
}

/// Memcacheds created while the operator's Memcached watch is down, more than one list page
/// of them (kube-runtime lists 500 at a time), come back in the re-list that follows the
/// watch's 410 Gone, and every one of them is reconciled without anyone editing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcacheds_created_during_a_watch_gap_all_converge_after_the_relist() {
    const COUNT: usize = 600;
    // No workload simulator: children and status are the point, and 600 pools of pods would
    // only slow the test down.
    let server = ApiServer::builder().watch_history(100).build();
    let env = Env::start_on(server, ControllerConfig::default(), |_| {}).await;
    env.apply_sample("before-the-gap", 1).await;
    let api = env.memcacheds();
    wait_for("the controller to write a status", || async {
        let mc = api.get_opt("before-the-gap").await.ok().flatten()?;
        (mc.status?.observed_generation == mc.metadata.generation).then_some(())
    })
    .await;

    // The Memcached watch ends and its next request gets no answer (a partition), while
    // more Memcacheds are created than the server keeps history for.
    env.server()
        .inject(Fault::new().verb("watch").resource("memcacheds").hang());
    env.server().cut_watches();
    let names: Vec<String> = (0..COUNT).map(|i| format!("gap-{i:03}")).collect();
    use futures::StreamExt;
    futures::stream::iter(names.iter().cloned())
        .for_each_concurrent(8, |name| {
            let api = api.clone();
            async move {
                let mc: Memcached = serde_json::from_value(json!({
                    "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                    "metadata": {"name": name}, "spec": {"size": 1}
                }))
                .expect("a Memcached");
                api.create(&PostParams::default(), &mc)
                    .await
                    .expect("create Memcached");
            }
        })
        .await;
    // The watch resumes from a resourceVersion the server no longer has: 410 Gone, re-list.
    env.server().clear_faults();

    let server = env.server();
    let exists = |plural: &str, api_version: &str, name: &str| {
        server
            .get_object(api_version, plural, Some("default"), name)
            .is_some()
    };
    let unconverged = || -> Vec<&String> {
        names
            .iter()
            .filter(|name| {
                let converged = server
                    .get_object(
                        "memcached.cache.example.com/v1",
                        "memcacheds",
                        Some("default"),
                        name,
                    )
                    .is_some_and(|mc| {
                        mc["status"]["observedGeneration"] == mc["metadata"]["generation"]
                    });
                !(converged
                    && exists("deployments", "apps/v1", name)
                    && exists("services", "v1", name))
            })
            .collect()
    };
    // Counted, not timed: every one converges, and the test fails only when the count of
    // those left stops going down for a generous while (a debug build on a loaded machine
    // is slow, a lost re-list makes no progress at all).
    let stall = common::DEADLINE;
    let mut fewest = usize::MAX;
    let mut progressed_at = std::time::Instant::now();
    loop {
        let left = unconverged();
        if left.is_empty() {
            break;
        }
        if left.len() < fewest {
            fewest = left.len();
            progressed_at = std::time::Instant::now();
        }
        assert!(
            progressed_at.elapsed() < stall,
            "{} of {COUNT} Memcacheds created during the watch gap stopped converging \
             (children and status) for {stall:?}, e.g. {:?}",
            left.len(),
            &left[..left.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.stop().await;
}

#[tokio::test]
async fn a_name_too_long_for_child_objects_is_degraded_and_others_still_converge() {
    let env = Env::start().await;
    let long = format!("m{}", "x".repeat(59)); // a valid object name, too long for children
    env.apply_sample(&long, 2).await;
    env.apply_sample("neighbour", 2).await;

    let api = env.memcacheds();
    let mc = wait_for("Degraded condition on the long name", || async {
        let mc = api.get(&long).await.ok()?;
        (mc.condition(condition::DEGRADED)?.status == "True").then_some(mc)
    })
    .await;
    let degraded = mc.condition(condition::DEGRADED).expect("condition");
    assert_eq!(degraded.reason, "InvalidSpec");
    assert!(
        degraded.message.contains("metadata.name"),
        "{}",
        degraded.message
    );
    env.converged("neighbour", 2).await;
    assert!(
        env.deployments()
            .get_opt(&long)
            .await
            .expect("get")
            .is_none(),
        "no child for an invalid CR"
    );
    assert!(env.services().get_opt(&long).await.expect("get").is_none());

    let events = env.events();
    let warned = wait_for("InvalidSpec event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("InvalidSpec")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(long.as_str())
        })
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    env.stop().await;
}

on_every_server! {
async fn creation_and_scaling_are_recorded_as_events(server: Server) {
    let env = Env::on(server, "creation_and_scaling_are_recor").await;
    env.apply_sample("evented", 1).await;
    env.converged("evented", 1).await;
    env.apply_sample("evented", 2).await;
    env.converged("evented", 2).await;
    let events = env.events();
    let reasons = wait_for("Created and Scaled events", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("evented"))
            .filter_map(|e| e.note.clone())
            .collect();
        (reasons.iter().any(|n| n.contains("Created Deployment"))
            && reasons
                .iter()
                .any(|n| n.contains("Scaled Deployment evented from 1 to 2")))
        .then_some(reasons)
    })
    .await;
    assert!(
        reasons.iter().any(|n| n.contains("Created Service")),
        "{reasons:?}"
    );
    env.stop().await;
}
}

/// A child the operator wrote is not read back while the watch of its kind trails behind
/// (as on a busy operator): the answer to the write stands in for it until the watch
/// delivers it, so reconciles in between send no GET. The first read (for an object of that
/// name the operator did not create) is still made, once.
#[tokio::test]
async fn a_child_just_written_is_not_read_back_while_its_watch_trails() {
    let config = ControllerConfig {
        resync: Duration::from_millis(100),
        ..ControllerConfig::default()
    };
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .audit_log(true)
        .build();
    let env = Env::start_on(server, config, |_| {}).await;
    // The Deployments' watch delivers nothing more: cut, and held when it comes back.
    env.server()
        .inject(Fault::new().verb("watch").resource("deployments").hang());
    env.server().cut_watches();
    let before = env.counters.reconciles();
    env.apply_sample("trailing", 2).await;
    let counters = env.counters.clone();
    wait_for("twenty reconciles with the Deployment written", || {
        let done = counters.reconciles() >= before + 20;
        async move { done.then_some(()) }
    })
    .await;
    let reads = |events: &[apisim::AuditEvent], verb: &str| {
        events
            .iter()
            .filter(|e| e.verb == verb && e.resource == "deployments" && e.name == "trailing")
            .count()
    };
    let events = env.server().audit_events();
    assert_eq!(
        (reads(&events, "get"), reads(&events, "patch")),
        (1, 1),
        "the Deployment read before it was created, then written; never read back"
    );
    // The watch delivers again: the pool converges as usual.
    env.server().clear_faults();
    env.server().cut_watches();
    env.converged("trailing", 2).await;
    env.stop().await;
}
