//! The operator never adopts or changes an object it did not create. Objects that already
//! exist under a child's name (another application's Service `NAME`, its budget, a
//! ConfigMap `NAME-proxy`, a ServiceMonitor `NAME`, none of them labelled or owned by the
//! Memcached) survive the Memcached's creation and its deletion byte for byte, and the
//! Memcached is `Degraded` naming each of them, while the children nobody else holds are
//! created as usual.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, ControllerConfig};
use serde_json::{Value, json};

mod common;
use common::cluster::{Cluster, Server};
use common::{wait_for, wait_for_within};

fn service_monitors(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "servicemonitors"),
    )
}

/// Creates another application's objects under the names a Memcached `shop` needs.
async fn foreign_objects(cluster: &Cluster) {
    let pp = PostParams::default();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "shop"},
        "spec": {"selector": {"app": "shop-frontend"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .expect("Service");
    cluster
        .api::<Service>()
        .create(&pp, &service)
        .await
        .expect("the shop's Service");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "shop"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "shop-frontend"}}},
    }))
    .expect("PDB");
    cluster
        .api::<PodDisruptionBudget>()
        .create(&pp, &pdb)
        .await
        .expect("the shop's budget");
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "shop-proxy"},
        "data": {"upstream": "http://shop-frontend"},
    }))
    .expect("ConfigMap");
    cluster
        .api::<ConfigMap>()
        .create(&pp, &config_map)
        .await
        .expect("the shop's ConfigMap");
    let monitor: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "shop-frontend"}},
                 "endpoints": [{"port": "http"}]},
    }))
    .expect("ServiceMonitor");
    service_monitors(&cluster.client, &cluster.ns)
        .create(&pp, &monitor)
        .await
        .expect("the shop's ServiceMonitor");
}

fn whole<T: serde::Serialize>(object: T) -> Value {
    serde_json::to_value(object).expect("json")
}

/// The four objects as the API server stores them, whole.
async fn snapshot(cluster: &Cluster) -> Vec<Value> {
    vec![
        whole(cluster.api::<Service>().get("shop").await.expect("Service")),
        whole(
            cluster
                .api::<PodDisruptionBudget>()
                .get("shop")
                .await
                .expect("PDB"),
        ),
        whole(
            cluster
                .api::<ConfigMap>()
                .get("shop-proxy")
                .await
                .expect("ConfigMap"),
        ),
        whole(
            service_monitors(&cluster.client, &cluster.ns)
                .get("shop")
                .await
                .expect("ServiceMonitor"),
        ),
    ]
}

on_every_server! {
async fn objects_of_a_childs_name_that_it_did_not_create_are_never_touched(server: Server) {
    let cluster = Cluster::start(
        server,
        "objects_of_a_childs_name",
        |b| b.pod_ready_delay(Duration::from_millis(20)),
        true,
    )
    .await;
    foreign_objects(&cluster).await;
    let before = snapshot(&cluster).await;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ControllerConfig {
        namespace: cluster.watch_namespace(),
        ..ControllerConfig::default()
    };
    tokio::spawn(controller::run(cluster.client.clone(), config, async {
        let _ = stopped.await;
    }));
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "shop"},
        "spec": {"size": 2, "exporter": {"enabled": true}, "proxy": {"enabled": true}},
    });
    let memcacheds = cluster.api::<Memcached>();
    memcacheds
        .patch("shop", &PatchParams::apply("test").force(), &Patch::Apply(&mc))
        .await
        .expect("the Memcached");

    // Degraded, naming each object it will not take over ...
    let message = wait_for("shop Degraded over the objects it did not create", || async {
        let mc = memcacheds.get("shop").await.ok()?;
        let degraded = mc.condition(condition::DEGRADED)?;
        (degraded.status == "True" && degraded.reason == "ChildConflict")
            .then(|| degraded.message.clone())
    })
    .await;
    let ns = &cluster.ns;
    for object in [
        format!("Service {ns}/shop "),
        format!("PodDisruptionBudget {ns}/shop "),
        format!("ServiceMonitor {ns}/shop "),
        format!("ConfigMap {ns}/shop-proxy "),
    ] {
        assert!(message.contains(&object), "{object:?} not named in: {message}");
    }
    // ... while what nobody else holds is created, but for the proxy's Deployment: its
    // pods would mount the ConfigMap `shop-proxy`, which is not ours.
    let deployments = cluster.api::<Deployment>();
    wait_for("the pool's Deployment", || async {
        deployments.get_opt("shop").await.ok().flatten()
    })
    .await;
    wait_for("the proxy's Service", || async {
        cluster.api::<Service>().get_opt("shop-proxy").await.ok().flatten()
    })
    .await;
    assert_eq!(
        deployments.get_opt("shop-proxy").await.expect("read"),
        None,
        "no proxy pods on a configuration the operator did not write"
    );
    // A pool has one client Service, `shop`, and that one is not ours: no other is made.
    assert_eq!(cluster.api::<Service>().get_opt("shop-headless").await.expect("read"), None);
    assert_eq!(snapshot(&cluster).await, before, "untouched while the Memcached lives");

    // Deleting the Memcached garbage-collects its children, and only them.
    memcacheds
        .delete("shop", &DeleteParams::foreground())
        .await
        .expect("delete");
    // kube-controller-manager's garbage collector learns of a new kind from discovery,
    // refreshed every 30 s.
    wait_for_within("the Memcached and its children gone", common::DEADLINE, || async {
        let gone = memcacheds.get_opt("shop").await.ok()?.is_none()
            && deployments.get_opt("shop").await.ok()?.is_none()
            && cluster.api::<Service>().get_opt("shop-proxy").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    assert_eq!(snapshot(&cluster).await, before, "untouched after the Memcached is gone");
    let _ = stop.send(());
}
}

on_every_server! {
/// A pod wearing a pool's labels that the pool's ReplicaSet did not make (a debugging copy,
/// another tool's) is not one of its pods: not counted in the status, never annotated with
/// the proxy's slots, never deleted, while the pool's own pods are.
async fn a_pod_with_a_pools_labels_is_not_the_pools(server: Server) {
    use k8s_openapi::api::core::v1::Pod;
    use memcached_operator::builders;
    let cluster = Cluster::start(server, "a_pod_with_a_pools_labels", |b| b, false).await;
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(
        cluster.client.clone(),
        ControllerConfig {
            namespace: cluster.watch_namespace(),
            ..ControllerConfig::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    let pods = cluster.api::<Pod>();
    let impostor: Pod = serde_json::from_value(json!({
        "metadata": {"name": "impostor", "labels": builders::labels("cache")},
        "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6.38"}]},
    }))
    .expect("Pod");
    pods.create(&PostParams::default(), &impostor).await.expect("the impostor");
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {"size": 2, "proxy": {"enabled": true}},
    });
    cluster
        .api::<Memcached>()
        .patch("cache", &PatchParams::apply("test").force(), &Patch::Apply(&mc))
        .await
        .expect("apply");
    let deadline = Duration::from_secs(120);
    // The pool's own pods get their proxy slots (deletion costs): the pass that writes them
    // went over every pod the operator counts as the pool's.
    let members = wait_for_within("the pool's pods annotated with their slots", deadline, || async {
        let list = pods.list(&Default::default()).await.ok()?;
        let members: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.name.as_deref() != Some("impostor"))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get(builders::LABEL_INSTANCE)).map(String::as_str) == Some("cache"))
            .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get(builders::LABEL_NAME)).map(String::as_str) == Some("memcached"))
            .collect();
        (members.len() == 2
            && members.iter().all(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("controller.kubernetes.io/pod-deletion-cost"))
            }))
        .then_some(members)
    })
    .await;
    let status = wait_for_within("the pool's status names its two pods", deadline, || async {
        let mc = cluster.api::<Memcached>().get("cache").await.ok()?;
        let nodes = mc.status?.nodes;
        (nodes.len() == 2).then_some(nodes)
    })
    .await;
    for member in &members {
        let name = member.metadata.name.clone().unwrap_or_default();
        assert!(status.contains(&name), "{name} missing from {status:?}");
    }
    assert!(!status.contains(&"impostor".to_string()), "{status:?}");
    let impostor = pods.get("impostor").await.expect("the impostor is still there");
    assert!(impostor.metadata.deletion_timestamp.is_none());
    assert!(
        !impostor
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("controller.kubernetes.io/pod-deletion-cost")),
        "the impostor got a proxy slot"
    );
    let writers: Vec<_> = impostor
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(
        !writers.iter().any(|m| m == "memcached-operator"),
        "the operator wrote to the impostor: {writers:?}"
    );
}
}
