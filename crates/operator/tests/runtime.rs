//! Controller-runtime behaviours asserted, not just configured: namespace scoping, what the
//! cache holds, bounded concurrency with one reconcile per object at a time, and predicates
//! that keep status and metadata churn from causing reconciles.

use std::sync::Arc;
use std::time::Duration;

use apisim::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, Caches, ControllerConfig, ReconcileCounters};
use serde_json::json;

mod common;
use common::wait_for;

async fn cluster(namespaces: &[&str]) -> (ApiServer, Client) {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(20))
        .build();
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("CRD");
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let mut n = Namespace::default();
        n.metadata.name = Some(ns.to_string());
        nss.create(&PostParams::default(), &n)
            .await
            .expect("namespace");
    }
    (server, client)
}

async fn apply(client: &Client, ns: &str, name: &str, size: i32) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": {"size": size}
    });
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&mc),
    )
    .await
    .expect("apply");
}

async fn converged(client: &Client, ns: &str, name: &str, size: usize) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("{ns}/{name} converged"), || async {
        let mc = api.get_opt(name).await.ok().flatten()?;
        let available = mc.condition(condition::AVAILABLE)?.status == "True";
        let status = mc.status?;
        (available
            && status.nodes.len() == size
            && status.observed_generation == mc.metadata.generation)
            .then_some(())
    })
    .await;
}

fn spawn(client: &Client, config: ControllerConfig) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(client.clone(), config, async {
        let _ = rx.await;
    }));
    tx
}

#[tokio::test]
async fn a_namespaced_operator_leaves_other_namespaces_alone() {
    let (_server, client) = cluster(&["team-a", "team-b"]).await;
    let counters = Arc::new(ReconcileCounters::per_object());
    let _stop = spawn(
        &client,
        ControllerConfig {
            namespace: Some("team-a".into()),
            counters: counters.clone(),
            ..ControllerConfig::default()
        },
    );
    apply(&client, "team-b", "theirs", 1).await;
    apply(&client, "team-a", "ours", 2).await;
    converged(&client, "team-a", "ours", 2).await;
    // A controller that saw "theirs" would have queued it at once when it was created,
    // before "ours"; "ours" reporting its pods took at least one status batch window after
    // that, so a reconcile of "theirs" would have started by now.
    assert!(counters.started_for(&key("team-a", "ours")) > 0);
    assert_eq!(
        counters.started_for(&key("team-b", "theirs")),
        0,
        "no reconcile outside the scope"
    );
    let theirs: Api<Memcached> = Api::namespaced(client.clone(), "team-b");
    assert!(
        theirs.get("theirs").await.expect("get").status.is_none(),
        "no status written outside the scope"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "team-b");
    assert!(
        deployments.get_opt("theirs").await.expect("get").is_none(),
        "no Deployment outside the scope"
    );
}

#[tokio::test]
async fn the_cache_holds_only_our_objects_and_no_pod_specs() {
    let (_server, client) = cluster(&[]).await;
    let foreign: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "someone-elses", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))
    .expect("deployment");
    Api::<Deployment>::default_namespaced(client.clone())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create");
    let _stop = spawn(&client, ControllerConfig::default());
    apply(&client, "default", "cached", 2).await;
    converged(&client, "default", "cached", 2).await;

    let caches = Caches::start(&client, None);
    caches.wait_synced().await;
    assert_eq!(
        caches.deployments.names(),
        ["cached"],
        "unlabelled Deployments are not cached"
    );
    let mut services = caches.services.names();
    services.sort();
    assert_eq!(services, ["cached"]);
    let pods = caches.pods.store().state();
    assert_eq!(pods.len(), 2, "only the memcached pods");
    assert!(
        pods.iter()
            .all(|p| p.managed_fields().is_empty() && p.annotations().is_empty())
    );
    assert!(pods.iter().all(|p| p.name_any().starts_with("cached-")));
}

#[tokio::test]
async fn concurrency_is_bounded_and_one_object_never_reconciles_twice_at_once() {
    let (server, client) = cluster(&[]).await;
    // Slow API calls keep reconciles in flight long enough to overlap.
    server.set_latency(Duration::from_millis(15));
    let counters = Arc::new(ReconcileCounters::default());
    let _stop = spawn(
        &client,
        ControllerConfig {
            concurrency: 3,
            counters: counters.clone(),
            ..ControllerConfig::default()
        },
    );
    for i in 0..12 {
        apply(&client, "default", &format!("c{i}"), 1).await;
    }
    // Hammer one object with spec changes while the others are being reconciled.
    for size in [2, 3, 2, 3, 2] {
        apply(&client, "default", "c0", size).await;
    }
    for i in 1..12 {
        converged(&client, "default", &format!("c{i}"), 1).await;
    }
    converged(&client, "default", "c0", 2).await;
    assert!(
        counters.max_in_flight() <= 3,
        "max in flight {}",
        counters.max_in_flight()
    );
    assert!(
        counters.max_in_flight() >= 2,
        "reconciles did overlap: {}",
        counters.max_in_flight()
    );
    assert_eq!(counters.same_object_overlaps(), 0);
}

/// The window over which the controller batches status-only changes of a Memcached's
/// children into one reconcile (`--status-batch-window`, 1 s by default).
fn batch_window() -> Duration {
    ControllerConfig::default().status_batch
}

fn key(ns: &str, name: &str) -> ObjectRef<Memcached> {
    ObjectRef::new(name).within(ns)
}

/// Waits until no reconcile of `name` has started for two batch windows and a second: a
/// batched wake-up is released one window after the change that caused it (the controller
/// is never busy here, so it is not held longer), so whatever the convergence left in
/// flight has run by then, and a reconcile counted after this was caused by what the test
/// did next.
async fn quiet(counters: &ReconcileCounters, name: &str) {
    let calm_for = batch_window() * 2 + Duration::from_secs(1);
    let deadline = std::time::Instant::now() + common::DEADLINE;
    loop {
        let seen = counters.started_for(&key("default", name));
        tokio::time::sleep(calm_for).await;
        if counters.started_for(&key("default", name)) == seen {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never went {calm_for:?} without a reconcile"
        );
    }
}

/// A controller counting its reconciles per object, with the `(name, size)` Memcacheds
/// converged and quiet.
async fn settled(
    memcacheds: &[(&str, usize)],
) -> (
    ApiServer,
    Client,
    Arc<ReconcileCounters>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (server, client) = cluster(&[]).await;
    let counters = Arc::new(ReconcileCounters::per_object());
    let stop = spawn(
        &client,
        ControllerConfig {
            counters: counters.clone(),
            ..ControllerConfig::default()
        },
    );
    for (name, size) in memcacheds {
        apply(&client, "default", name, *size as i32).await;
    }
    for (name, size) in memcacheds {
        converged(&client, "default", name, *size).await;
    }
    for (name, _) in memcacheds {
        quiet(&counters, name).await;
    }
    (server, client, counters, stop)
}

/// Waits until `name` in the default namespace reports the status of its generation.
async fn observed(client: &Client, name: &str) {
    let api: Api<Memcached> = Api::default_namespaced(client.clone());
    wait_for(
        &format!("{name}'s status of its last generation"),
        || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            (mc.status?.observed_generation == mc.metadata.generation).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn status_and_metadata_churn_do_not_trigger_reconciles() {
    let (_server, client, counters, _stop) = settled(&[("calm", 1), ("marker", 1)]).await;
    let calm = key("default", "calm");
    let before = counters.started_for(&calm);

    let api: Api<Memcached> = Api::default_namespaced(client.clone());
    api.patch(
        "calm",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"team": "cache"}, "labels": {"tier": "gold"}}}),
        ),
    )
    .await
    .expect("metadata edit");
    api.patch_status(
        "calm",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodes": ["x"]}})),
    )
    .await
    .ok();
    // The mechanism ruled out: a Memcached's watch event that passes the filter is queued
    // at once (no window). A spec change of another Memcached comes later through the same
    // watch and is queued the same way, so once its reconcile has written its status, a
    // reconcile of "calm" queued for the edits above would have started too.
    let marker_before = counters.started_for(&key("default", "marker"));
    apply(&client, "default", "marker", 2).await;
    observed(&client, "marker").await;
    assert!(counters.started_for(&key("default", "marker")) > marker_before);
    assert_eq!(
        counters.started_for(&calm),
        before,
        "metadata and status edits of the Memcached are filtered"
    );

    apply(&client, "default", "calm", 2).await;
    converged(&client, "default", "calm", 2).await;
    assert!(
        counters.started_for(&calm) > before,
        "a spec change reconciles"
    );
}

#[tokio::test]
async fn status_churn_of_owned_objects_that_cannot_change_the_outcome_is_filtered() {
    let (_server, client, counters, _stop) = settled(&[("churned", 2), ("marker", 1)]).await;
    let churned = key("default", "churned");
    let before = counters.started_for(&churned);

    use k8s_openapi::api::core::v1::{Pod, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let services: Api<Service> = Api::default_namespaced(client.clone());
    services
        .patch_status(
            "churned",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await
        .expect("Service status");
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    pdbs.patch_status(
        "churned",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"disruptionsAllowed": 0, "currentHealthy": 1,
            "desiredHealthy": 1, "expectedPods": 2}}),
        ),
    )
    .await
    .expect("PDB status");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod_of = |instance: &str| {
        let pods = pods.clone();
        let selector = format!("app.kubernetes.io/instance={instance}");
        async move {
            pods.list(&kube::api::ListParams::default().labels(&selector))
                .await
                .expect("pods")
                .items
                .remove(0)
        }
    };
    let pod = pod_of("churned").await;
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"containerStatuses": [{"name": "memcached", "image": "x",
            "imageID": "", "ready": true, "restartCount": 3, "state": {"running": {}}}]}}),
        ),
    )
    .await
    .expect("pod status");
    let churned_at = std::time::Instant::now();

    // The mechanism ruled out: a status change of a child is batched, and its reconcile
    // runs one window after the controller saw it. A status change the controller does
    // read (a new pod IP) of another Memcached's pod comes after the churn through the pods'
    // watch and is batched the same way; once its reconcile has started, a batched
    // reconcile of "churned" would have started too. The Service's and the budget's events
    // come through watches of their own, so the wait also lasts two windows and a second
    // after the churn, longer than any batch of it could be held.
    let marker = key("default", "marker");
    let marker_before = counters.started_for(&marker);
    let marker_pod = pod_of("marker").await;
    pods.patch_status(
        &marker_pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": "10.99.0.1", "podIPs": [{"ip": "10.99.0.1"}]}})),
    )
    .await
    .expect("marker pod status");
    wait_for("the marker's batched reconcile", || async {
        (counters.started_for(&marker) > marker_before).then_some(())
    })
    .await;
    let covered = batch_window() * 2 + Duration::from_secs(1);
    tokio::time::sleep(covered.saturating_sub(churned_at.elapsed())).await;
    assert_eq!(
        counters.started_for(&churned),
        before,
        "status the reconciler never reads does not trigger it"
    );

    // A change it does read: a pod deleted (and replaced) changes status.nodes.
    pods.delete(&pod.name_any(), &Default::default())
        .await
        .expect("delete pod");
    wait_for("a reconcile for the deleted pod", || async {
        (counters.started_for(&churned) > before).then_some(())
    })
    .await;
}
