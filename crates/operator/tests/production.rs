//! What a team running memcached in production needs, end to end through the real
//! controller on the in-memory API server: disruption budgets, the headless Service and
//! endpoints, spreading, rollouts shown in status, Secrets reported rather than crashed on,
//! and the exporter with its ServiceMonitor only when asked.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::proxy;
use serde_json::{Value, json};

mod common;
use common::cluster::{Cluster, Server};
use common::wait_for;
use envtest::Kube;

struct Env {
    cluster: Cluster,
    client: Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(
    server: Server,
    test: &str,
    pod_ready_delay: Duration,
    with_service_monitor_crd: bool,
) -> Env {
    start_with(
        server,
        test,
        pod_ready_delay,
        with_service_monitor_crd,
        ControllerConfig::default(),
    )
    .await
}

async fn start_with(
    server: Server,
    test: &str,
    pod_ready_delay: Duration,
    with_service_monitor_crd: bool,
    config: ControllerConfig,
) -> Env {
    let cluster = Cluster::start(
        server,
        test,
        |b| b.pod_ready_delay(pod_ready_delay),
        with_service_monitor_crd,
    )
    .await;
    let client = cluster.client.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = ControllerConfig {
        namespace: cluster.watch_namespace(),
        secret_recheck: Duration::from_millis(100),
        ..config
    };
    tokio::spawn(controller::run(client.clone(), config, async {
        let _ = rx.await;
    }));
    Env {
        cluster,
        client,
        _stop: tx,
    }
}

impl Env {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        self.cluster.api()
    }

    async fn apply(&self, name: &str, spec: Value) {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": name}, "spec": spec
        });
        self.api::<Memcached>()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .expect("apply");
    }

    async fn converged(&self, name: &str, size: usize) -> Memcached {
        let api = self.api::<Memcached>();
        wait_for(&format!("{name} converged at {size}"), || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            let available = mc.condition(condition::AVAILABLE)?.status == "True";
            let settled = mc.condition(condition::PROGRESSING)?.status == "False";
            let status = mc.status.as_ref()?;
            (available
                && settled
                && status.nodes.len() == size
                && status.observed_generation == mc.metadata.generation)
                .then_some(mc)
        })
        .await
    }
}

on_every_server! {
async fn a_disruption_budget_exists_from_two_pods_and_goes_below(server: Server) {
    let env = start(server, "a_disruption_budget_exists_fro", Duration::from_millis(20), false).await;
    let pdbs = env.api::<PodDisruptionBudget>();
    env.apply("budget", json!({"size": 1})).await;
    env.converged("budget", 1).await;
    assert!(
        pdbs.get_opt("budget").await.expect("get").is_none(),
        "no budget for one pod"
    );

    env.apply("budget", json!({"size": 2})).await;
    env.converged("budget", 2).await;
    let pdb = wait_for("budget created", || async {
        pdbs.get_opt("budget").await.ok().flatten()
    })
    .await;
    let spec = pdb.spec.expect("spec");
    assert_eq!(
        spec.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );

    env.apply("budget", json!({"size": 1})).await;
    env.converged("budget", 1).await;
    wait_for("budget deleted", || async {
        pdbs.get_opt("budget").await.ok()?.is_none().then_some(())
    })
    .await;
}
}

on_every_server! {
async fn the_headless_service_and_status_endpoints_list_the_ready_pods(server: Server) {
    let env = start(server, "the_headless_service_and_statu", Duration::from_millis(20), false).await;
    env.apply("hashed", json!({"size": 3, "containerPort": 11311}))
        .await;
    let mc = env.converged("hashed", 3).await;
    // One client Service, `NAME`, headless: DNS names every ready pod.
    let headless = env.api::<Service>().get("hashed").await.expect("Service");
    let spec = headless.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.ports.expect("ports")[0].port, 11311);
    assert_eq!(
        env.api::<Service>().get_opt("hashed-headless").await.expect("read"),
        None,
        "no second Service for the same pods"
    );

    let status = mc.status.expect("status");
    let pods = env
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/instance=hashed"))
        .await
        .expect("pods");
    let mut want: Vec<(String, String)> = pods
        .items
        .iter()
        .map(|p| {
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .expect("pod IP");
            (
                p.metadata.name.clone().expect("name"),
                format!("{ip}:11311"),
            )
        })
        .collect();
    want.sort();
    assert_eq!(
        status.endpoints,
        want.into_iter().map(|(_, e)| e).collect::<Vec<_>>()
    );
}
}

on_every_server! {
async fn pods_are_spread_over_nodes_and_zones_by_default(server: Server) {
    let env = start(server, "pods_are_spread_over_nodes_and", Duration::from_millis(20), false).await;
    env.apply("spread", json!({"size": 2})).await;
    env.apply("strict", json!({"size": 2, "topologySpread": "Required"}))
        .await;
    env.apply("packed", json!({"size": 2, "topologySpread": "Disabled"}))
        .await;
    // (hostname rule, zone rule)
    for (name, want) in [
        ("spread", Some(("ScheduleAnyway", "ScheduleAnyway"))),
        ("strict", Some(("DoNotSchedule", "ScheduleAnyway"))),
        ("packed", None),
    ] {
        env.converged(name, 2).await;
        let d = env.api::<Deployment>().get(name).await.expect("Deployment");
        let constraints = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.topology_spread_constraints);
        match want {
            None => assert!(constraints.is_none(), "{name}"),
            Some((nodes, zones)) => {
                let c = constraints.expect("constraints");
                let by_key = |key: &str| {
                    c.iter()
                        .find(|c| c.topology_key == key)
                        .map(|c| c.when_unsatisfiable.clone())
                };
                assert_eq!(c.len(), 2, "{name}: hostname and zone");
                assert_eq!(by_key("kubernetes.io/hostname").as_deref(), Some(nodes), "{name}");
                assert_eq!(by_key("topology.kubernetes.io/zone").as_deref(), Some(zones), "{name}");
            }
        }
    }
    if let Some(cp) = env.cluster.real {
        where_the_scheduler_puts_them(&env, cp).await;
    }
}
}

/// The real kube-scheduler's placement (the oracle for what the constraints mean): a pool
/// that requires spreading lands on as many nodes as it has pods, even when its own
/// affinity pulls every pod to one node; the default (preferred) spreading puts a pool of
/// three on more than one node.
async fn where_the_scheduler_puts_them(env: &Env, cp: &envtest::ControlPlane) {
    use k8s_openapi::api::core::v1::Node;
    let client = cp.client().await.expect("client");
    let mut nodes: Vec<String> = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    nodes.sort();
    assert_eq!(
        nodes.len(),
        3,
        "the shared control plane has three nodes: {nodes:?}"
    );
    // Everything that would pack the pool's pods: a preferred node and each other.
    let pull_to = |node: &str| {
        json!({
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "preference": {"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": [node]
                }]}
            }]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {
                        memcached_operator::builders::LABEL_INSTANCE: "pulled"
                    }}
                }
            }]}
        })
    };
    env.apply(
        "pulled",
        json!({"size": 3, "topologySpread": "Required", "affinity": pull_to(&nodes[0])}),
    )
    .await;
    env.apply("spread", json!({"size": 3})).await;
    for (name, at_least) in [("pulled", 3), ("spread", 2)] {
        env.converged(name, 3).await;
        let pods = env
            .api::<Pod>()
            .list(&ListParams::default().labels(&format!(
                "{}={name}",
                memcached_operator::builders::LABEL_INSTANCE
            )))
            .await
            .expect("pods");
        let placed: std::collections::BTreeSet<String> = pods
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
            .collect();
        assert!(
            placed.len() >= at_least,
            "{name}: the scheduler put 3 pods on {placed:?} (at least {at_least} nodes wanted)"
        );
    }
}

on_every_server! {
async fn an_image_change_rolls_the_pods_and_shows_progress_until_done(server: Server) {
    // Slow readiness so the rollout is long enough to watch.
    let env = start(server, "an_image_change_rolls_the_pods", Duration::from_millis(300), false).await;
    // Each new pod Ready 3 s before the next old one goes (the default 30 s would make
    // the test wait a minute on a real server).
    env.apply(
        "rolling",
        json!({"size": 2, "image": "memcached:1.6.38-alpine", "rollout": {"minReadySeconds": 3}}),
    )
    .await;
    env.converged("rolling", 2).await;

    env.apply(
        "rolling",
        json!({"size": 2, "image": "memcached:1.6.39-alpine", "rollout": {"minReadySeconds": 3}}),
    )
    .await;
    let api = env.api::<Memcached>();
    let mut reasons: Vec<String> = Vec::new();
    let mut messages: Vec<String> = Vec::new();
    let deadline = Instant::now() + common::DEADLINE;
    let done = loop {
        let mc = api.get("rolling").await.expect("get");
        if let Some(progressing) = mc.condition(condition::PROGRESSING).cloned() {
            if reasons.last() != Some(&progressing.reason) {
                reasons.push(progressing.reason.clone());
            }
            if messages.last() != Some(&progressing.message) {
                messages.push(progressing.message.clone());
            }
            let observed = mc.status.as_ref().and_then(|s| s.observed_generation);
            if progressing.status == "False" && observed == mc.metadata.generation {
                break mc;
            }
        }
        assert!(
            Instant::now() < deadline,
            "rollout did not complete: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        reasons.iter().any(|r| r == "RollingUpdate"
            || r == "WaitingForReadyPods"
            || r == "DeploymentUpdated"),
        "Progressing was shown during the rollout: {reasons:?}"
    );
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("RolloutComplete"),
        "{reasons:?}"
    );
    // The pace is shown while the rollout waits.
    assert!(
        messages
            .iter()
            .any(|m| m.contains("each new pod must stay Ready 3s before the next old one is replaced")),
        "{messages:?}"
    );
    assert_eq!(
        done.condition(condition::AVAILABLE)
            .map(|c| c.status.as_str()),
        Some("True")
    );
    let pods = env
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/instance=rolling"))
        .await
        .expect("pods");
    let images: Vec<String> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
        .collect();
    assert_eq!(
        images,
        ["memcached:1.6.39-alpine", "memcached:1.6.39-alpine"]
    );
}
}

/// The names of the live (not deleting) pods of pool `name`.
async fn live_pods(env: &Env, name: &str) -> std::collections::BTreeSet<String> {
    env.api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

on_every_server! {
/// `spec.rollout.restartedAt`: a new value replaces every pod once, one at a time, and
/// `status.restartedAt` says so when done; the same value again restarts nothing.
async fn a_restart_on_demand_replaces_every_pod_once_and_says_when_done(server: Server) {
    let env = start(server, "a_restart_on_demand", Duration::from_millis(50), false).await;
    let fast = json!({"minReadySeconds": 0});
    env.apply("restarted", json!({"size": 2, "rollout": fast})).await;
    let before_restart = env.converged("restarted", 2).await;
    assert_eq!(before_restart.status.as_ref().and_then(|s| s.restarted_at.clone()), None);
    let before = live_pods(&env, "restarted").await;

    let at = "2026-11-27T16:00:00Z";
    env.apply(
        "restarted",
        json!({"size": 2, "rollout": {"minReadySeconds": 0, "restartedAt": at}}),
    )
    .await;
    let api = env.api::<Memcached>();
    let done = wait_for("the restart reported done", || async {
        let mc = api.get("restarted").await.ok()?;
        (mc.status.as_ref()?.restarted_at.as_deref() == Some(at)).then_some(mc)
    })
    .await;
    // Reported only when every pod is a new one.
    let after = live_pods(&env, "restarted").await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.is_disjoint(&before), "every pod replaced: {before:?} -> {after:?}");
    assert_eq!(
        done.condition(condition::AVAILABLE).map(|c| c.status.as_str()),
        Some("True")
    );
    let converged = env.converged("restarted", 2).await;
    assert_eq!(converged.status.as_ref().and_then(|s| s.restarted_at.as_deref()), Some(at));

    // The same request again, with a change that is not the pods' (the Services' labels):
    // nothing restarts.
    env.apply(
        "restarted",
        json!({"size": 2, "service": {"labels": {"team": "cache"}},
               "rollout": {"minReadySeconds": 0, "restartedAt": at}}),
    )
    .await;
    let relabelled = env.converged("restarted", 2).await;
    assert!(relabelled.metadata.generation > converged.metadata.generation);
    wait_for("the Service relabelled", || async {
        let service = env.api::<Service>().get("restarted").await.ok()?;
        (service.metadata.labels?.get("team").map(String::as_str) == Some("cache")).then_some(())
    })
    .await;
    assert_eq!(live_pods(&env, "restarted").await, after, "no pod restarted");
    let deployment = env.api::<Deployment>().get("restarted").await.expect("Deployment");
    let template = deployment.spec.and_then(|s| s.template.metadata).unwrap_or_default();
    assert_eq!(
        template.annotations.unwrap_or_default().get("memcached.cache.example.com/restartedAt").map(String::as_str),
        Some(at)
    );
}
}

on_every_server! {
/// `spec.networkPolicy`: the pool's and the proxy's NetworkPolicies, owned by the
/// Memcached, follow the spec (clients and the proxy to memcached's port) and go when it
/// is switched off.
async fn network_policies_follow_the_spec_and_go_when_switched_off(server: Server) {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let env = start(server, "network_policies_follow_the_spec", Duration::from_millis(50), false).await;
    let from = json!([{"podSelector": {"matchLabels": {"app": "web"}}}]);
    env.apply(
        "fenced",
        json!({"size": 1, "proxy": {"enabled": true, "replicas": 1},
               "networkPolicy": {"enabled": true, "from": from}}),
    )
    .await;
    let policies = env.api::<NetworkPolicy>();
    let (pool, proxy) = wait_for("both NetworkPolicies", || async {
        Some((
            policies.get_opt("fenced").await.ok().flatten()?,
            policies.get_opt("fenced-proxy").await.ok().flatten()?,
        ))
    })
    .await;
    for policy in [&pool, &proxy] {
        let owner = policy.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owner.first().map(|o| o.name.as_str()), Some("fenced"));
        assert_eq!(owner.first().and_then(|o| o.controller), Some(true));
    }
    let peers = |policy: &NetworkPolicy| -> Vec<Value> {
        policy
            .spec
            .iter()
            .flat_map(|s| s.ingress.iter().flatten())
            .flat_map(|r| r.from.iter().flatten())
            .map(|p| serde_json::to_value(p).expect("JSON"))
            .collect()
    };
    assert_eq!(
        peers(&pool),
        [
            json!({"podSelector": {"matchLabels": {"app": "web"}}}),
            json!({"podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": "fenced", "app.kubernetes.io/name": "memcached-proxy"}}}),
        ]
    );
    assert_eq!(peers(&proxy), [json!({"podSelector": {"matchLabels": {"app": "web"}}})]);

    env.apply(
        "fenced",
        json!({"size": 1, "proxy": {"enabled": true, "replicas": 1},
               "networkPolicy": {"enabled": false, "from": from}}),
    )
    .await;
    wait_for("both NetworkPolicies gone", || async {
        let pool = policies.get_opt("fenced").await.ok()?;
        let proxy = policies.get_opt("fenced-proxy").await.ok()?;
        (pool.is_none() && proxy.is_none()).then_some(())
    })
    .await;
}
}

on_every_server! {
/// `spec.autoscaling`: an HPA owned by the Memcached, aimed at its scale subresource, the
/// status naming it as what sizes the pool; gone, with the status cleared, when it is off.
async fn the_autoscaler_follows_the_spec_and_goes_when_switched_off(server: Server) {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let env = start(server, "the_autoscaler_follows_the_spec", Duration::from_millis(50), false).await;
    let autoscaling = json!({"minReplicas": 2, "maxReplicas": 5, "targetCPUUtilizationPercentage": 70});
    env.apply("scaled", json!({"size": 2, "autoscaling": autoscaling})).await;
    let hpas = env.api::<HorizontalPodAutoscaler>();
    let hpa = wait_for("the HorizontalPodAutoscaler", || async {
        hpas.get_opt("scaled").await.ok().flatten()
    })
    .await;
    let owner = hpa.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(
        owner.first().map(|o| (o.name.as_str(), o.controller)),
        Some(("scaled", Some(true)))
    );
    let spec = hpa.spec.expect("spec");
    assert_eq!(
        (spec.scale_target_ref.kind.as_str(), spec.min_replicas, spec.max_replicas),
        ("Memcached", Some(2), 5)
    );
    let mc = env.converged("scaled", 2).await;
    assert_eq!(
        mc.status.and_then(|s| s.size_managed_by).as_deref(),
        Some("HorizontalPodAutoscaler/scaled")
    );

    env.apply("scaled", json!({"size": 2})).await;
    wait_for("the HorizontalPodAutoscaler gone", || async {
        hpas.get_opt("scaled").await.ok()?.is_none().then_some(())
    })
    .await;
    let api = env.api::<Memcached>();
    wait_for("status.sizeManagedBy cleared", || async {
        let status = api.get("scaled").await.ok()?.status?;
        status.size_managed_by.is_none().then_some(())
    })
    .await;
}
}

on_every_server! {
/// `spec.flush` where no memcached answers (the pods of the in-memory server and of kwok's
/// nodes have addresses and no process): each attempt is reported as a `FlushFailed` event
/// naming the pod, nothing is counted as flushed, the flush is not done. (Real flushes:
/// `real_node_day2.rs`.)
async fn a_flush_that_cannot_reach_a_pod_says_so_and_completes_nothing(server: Server) {
    let env = start(server, "a_flush_that_cannot_reach", Duration::from_millis(50), false).await;
    env.apply("unflushed", json!({"size": 1})).await;
    let mc = env.converged("unflushed", 1).await;
    let pod = mc.status.as_ref().map(|s| s.nodes.clone()).unwrap_or_default();
    env.apply(
        "unflushed",
        json!({"size": 1, "flush": {"requestedAt": "first", "pauseSeconds": 0}}),
    )
    .await;
    let events = env.api::<k8s_openapi::api::events::v1::Event>();
    let note = common::event_with_reason(&events, "FlushFailed")
        .await
        .note
        .unwrap_or_default();
    assert!(note.contains(&pod[0]), "{note} names {pod:?}");
    let api = env.api::<Memcached>();
    let flush = wait_for("status.flush for the request", || async {
        api.get("unflushed").await.ok()?.status?.flush
    })
    .await;
    assert_eq!(
        (flush.requested_at.as_str(), flush.flushed.len(), flush.completion_time),
        ("first", 0, None)
    );
}
}

on_every_server! {
async fn a_missing_secret_is_a_degraded_condition_naming_it_then_recovers(server: Server) {
    let env = start(server, "a_missing_secret_is_a_degraded", Duration::from_millis(20), false).await;
    env.apply(
        "locked",
        json!({"size": 1, "sasl": {"secretName": "memcached-auth"}}),
    )
    .await;
    let api = env.api::<Memcached>();
    let mc = wait_for("Degraded for the missing Secret", || async {
        let mc = api.get("locked").await.ok()?;
        (mc.condition(condition::DEGRADED)?.status == "True").then_some(mc)
    })
    .await;
    let degraded = mc.condition(condition::DEGRADED).expect("condition");
    assert_eq!(degraded.reason, "SecretNotFound");
    assert!(
        degraded.message.contains("memcached-auth")
            && degraded.message.contains("spec.sasl.secretName")
    );
    assert!(
        env.api::<Deployment>()
            .get_opt("locked")
            .await
            .expect("get")
            .is_none(),
        "no pods that cannot start"
    );

    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "memcached-auth"},
        "stringData": {"sasl-pwdb": "app:secret\n"}
    }))
    .expect("secret");
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");
    let mc = env.converged("locked", 1).await;
    assert_eq!(
        mc.condition(condition::DEGRADED).map(|c| c.status.as_str()),
        Some("False")
    );
    let d = env
        .api::<Deployment>()
        .get("locked")
        .await
        .expect("Deployment");
    let container = &d
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec")
        .containers[0];
    assert!(
        container
            .command
            .as_ref()
            .expect("command")
            .contains(&"-S".to_string())
    );
}
}

on_every_server! {
async fn the_exporter_and_its_service_monitor_appear_only_when_asked(server: Server) {
    let env = start(server, "the_exporter_and_its_service_m", Duration::from_millis(20), true).await;
    let monitors: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.cluster.ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
            "servicemonitors",
        ),
    );
    // minReadySeconds 0: switching the exporter rolls the pod, and its pace is not the point.
    env.apply("watched", json!({"size": 1, "rollout": {"minReadySeconds": 0}})).await;
    env.converged("watched", 1).await;
    let containers = |d: Deployment| {
        d.spec
            .and_then(|s| s.template.spec)
            .map(|p| p.containers.len())
    };
    assert_eq!(
        containers(env.api::<Deployment>().get("watched").await.expect("d")),
        Some(1)
    );
    assert!(monitors.get_opt("watched").await.expect("get").is_none());

    env.apply("watched", json!({"size": 1, "exporter": {"enabled": true}, "rollout": {"minReadySeconds": 0}}))
        .await;
    env.converged("watched", 1).await;
    let monitor = wait_for("ServiceMonitor", || async {
        monitors.get_opt("watched").await.ok().flatten()
    })
    .await;
    assert_eq!(monitor.data["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(
        containers(env.api::<Deployment>().get("watched").await.expect("d")),
        Some(2)
    );
    let ports = env
        .api::<Service>()
        .get("watched")
        .await
        .expect("svc")
        .spec
        .and_then(|s| s.ports)
        .expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p.name.as_deref() == Some("metrics") && p.port == 9150)
    );

    env.apply(
        "watched",
        json!({"size": 1, "exporter": {"enabled": false}, "rollout": {"minReadySeconds": 0}}),
    )
    .await;
    wait_for("ServiceMonitor removed", || async {
        monitors
            .get_opt("watched")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    wait_for("sidecar removed", || async {
        (containers(env.api::<Deployment>().get("watched").await.ok()?) == Some(1)).then_some(())
    })
    .await;
}
}

on_every_server! {
async fn the_seed_sample_still_means_three_pods_named_in_status(server: Server) {
    let env = start(server, "the_seed_sample_still_means_th", Duration::from_millis(20), false).await;
    let sample: Memcached =
        serde_yaml::from_str(memcached_operator::samples::SEED_SAMPLE).expect("sample");
    env.api::<Memcached>()
        .patch(
            "memcached-sample",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&sample),
        )
        .await
        .expect("apply");
    let mc = env.converged("memcached-sample", 3).await;
    let status = mc.status.expect("status");
    assert_eq!(status.nodes.len(), 3);
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.starts_with("memcached-sample-"))
    );
    let stored = env
        .api::<Memcached>()
        .get("memcached-sample")
        .await
        .expect("get");
    assert_eq!(
        stored.spec.config, None,
        "nothing added to the seed's spec but the port default"
    );
    assert_eq!(stored.spec.container_port, 11211);
}
}

on_every_server! {
/// An evicted pod (phase `Failed`, as the kubelet leaves it) stays until garbage-collected,
/// but serves nothing: it leaves `status.nodes` and `status.endpoints`, and the ReplicaSet's
/// replacement takes its place.
async fn an_evicted_pod_leaves_status_and_is_replaced(server: Server) {
    let env = start(server, "an_evicted_pod_leaves_status", Duration::from_millis(20), false).await;
    env.apply("evicted", json!({"size": 2})).await;
    let before = env.converged("evicted", 2).await.status.expect("status").nodes;
    let victim = before[0].clone();
    env.api::<Pod>()
        .patch_status(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Failed", "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "conditions": [{"type": "Ready", "status": "False"}],
            }})),
        )
        .await
        .expect("the pod's status is patched");
    let api = env.api::<Memcached>();
    let mc = wait_for("the evicted pod replaced in status.nodes", || async {
        let mc = api.get("evicted").await.ok()?;
        let s = mc.status.as_ref()?;
        (s.nodes.len() == 2 && !s.nodes.contains(&victim) && s.endpoints.len() == 2)
            .then_some(mc)
    })
    .await;
    let failed = env.api::<Pod>().get(&victim).await.expect("the evicted pod is still there");
    assert_eq!(
        failed.status.and_then(|s| s.phase).as_deref(),
        Some("Failed")
    );
    assert_eq!(mc.status.expect("status").ready_replicas, 2);
}
}

on_every_server! {
/// A Secret's contents, not its version, roll the pods: relabelling the SASL Secret (a new
/// `resourceVersion`, same data) changes nothing, rotating its password database rolls them
/// once. The Deployment's ReplicaSets, one per pod template the server saw, are the record.
/// Both are seen at once, through the watch of the Secrets' metadata: the resync here is
/// longer than the test.
async fn only_a_secrets_contents_roll_the_pods(server: Server) {
    let config = ControllerConfig {
        resync: Duration::from_secs(3600),
        ..ControllerConfig::default()
    };
    let counters = config.counters.clone();
    let env = start_with(server, "only_a_secrets_contents_roll", Duration::from_millis(20), false, config).await;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "auth"},
        "stringData": {"sasl-pwdb": "app:one\n"}
    }))
    .expect("secret");
    let secrets = env.api::<Secret>();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");
    // minReadySeconds 0: a roll here is the outcome, not its pace.
    env.apply("rotated", json!({"size": 1, "sasl": {"secretName": "auth"}, "rollout": {"minReadySeconds": 0}}))
        .await;
    env.converged("rotated", 1).await;
    let template_hash = || async {
        let d = env.api::<Deployment>().get("rotated").await.ok()?;
        d.spec?.template.metadata?.annotations?.get(memcached_operator::builders::CONFIG_HASH_ANNOTATION).cloned()
    };
    let first = template_hash().await.expect("hash");

    secrets
        .patch(
            "auth",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "cache"}}})),
        )
        .await
        .expect("relabel");
    // The relabel (a new resourceVersion) wakes the pool, which reads the Secret again.
    let seen = counters.reconciles();
    wait_for("a reconcile after the relabel", || async {
        (counters.reconciles() > seen).then_some(())
    })
    .await;
    assert_eq!(template_hash().await.as_deref(), Some(first.as_str()), "a relabel rolls nothing");

    secrets
        .patch(
            "auth",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"sasl-pwdb": "app:two\n"}})),
        )
        .await
        .expect("rotate");
    wait_for("the rotation rolls the pods", || async {
        (template_hash().await? != first).then_some(())
    })
    .await;
    env.converged("rotated", 1).await;
    let d = env.api::<Deployment>().get("rotated").await.expect("Deployment");
    let uid = d.metadata.uid.clone().expect("uid");
    let replica_sets = env
        .api::<k8s_openapi::api::apps::v1::ReplicaSet>()
        .list(&ListParams::default().labels("app.kubernetes.io/instance=rotated"))
        .await
        .expect("ReplicaSets");
    let templates = replica_sets
        .items
        .iter()
        .filter(|rs| rs.metadata.owner_references.iter().flatten().any(|o| o.uid == uid))
        .count();
    assert_eq!(templates, 2, "the first pods and the rotation's, nothing between");
}
}

on_every_server! {
/// A child of the name a Memcached needs, controlled by another pool, is not taken over: a
/// field manager's apply would move its ownerReference and selector from one pool to the
/// other on every reconcile. The Memcached is Degraded, naming the object and its owner.
async fn a_child_another_pool_controls_is_not_taken_over(server: Server) {
    let env = start(server, "a_child_another_pool_controls", Duration::from_millis(20), false).await;
    env.apply("owner", json!({"size": 1})).await;
    let owner = env.converged("owner", 1).await;
    let uid = owner.metadata.uid.clone().expect("uid");
    let foreign: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": "victim",
            "labels": {"app.kubernetes.io/managed-by": "memcached-operator",
                       "app.kubernetes.io/instance": "owner"},
            "ownerReferences": [{"apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                "name": "owner", "uid": uid, "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"clusterIP": "None", "selector": {"pool": "owner"},
                 "ports": [{"name": "memcached", "port": 11211}]},
    }))
    .expect("Service");
    env.api::<Service>()
        .create(&PostParams::default(), &foreign)
        .await
        .expect("the other pool's Service");
    env.apply("victim", json!({"size": 1})).await;
    let api = env.api::<Memcached>();
    let mc = wait_for("victim Degraded over the Service", || async {
        let mc = api.get("victim").await.ok()?;
        (mc.condition(condition::DEGRADED)?.status == "True").then_some(mc)
    })
    .await;
    let message = mc.condition(condition::DEGRADED).expect("Degraded").message.clone();
    assert!(
        message.contains("Service") && message.contains("/victim") && message.contains("owner") && message.contains(&uid),
        "{message}"
    );
    let svc = env.api::<Service>().get("victim").await.expect("still there");
    let controller = svc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone());
    assert_eq!(controller, Some(uid), "still the other pool's");
    assert_eq!(
        svc.spec.and_then(|s| s.selector).and_then(|s| s.get("pool").cloned()).as_deref(),
        Some("owner"),
        "its selector untouched"
    );
}
}

/// The pool's Ready pods as `(pod, ip:port)`, sorted by pod.
async fn ready_pool_pods(env: &Env, name: &str, port: u16) -> Vec<(String, String)> {
    let pods = env
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/name=memcached,app.kubernetes.io/instance={name}"
        )))
        .await
        .expect("pods");
    let mut ready: Vec<(String, String)> = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| {
            let ip = p.status?.pod_ip?;
            Some((p.metadata.name?, format!("{ip}:{port}")))
        })
        .collect();
    ready.sort();
    ready
}

/// Waits until the proxy's ConfigMap and `status.proxy` route to exactly the pool's
/// Ready pods (as the API server lists them), and returns the configuration.
async fn proxy_routes_to_the_ready_pods(env: &Env, name: &str, size: usize) -> String {
    let config_maps = env.api::<ConfigMap>();
    let api = env.api::<Memcached>();
    wait_for(
        &format!("{name}-proxy routes to the {size} Ready pods"),
        || async {
            let ready = ready_pool_pods(env, name, 11211).await;
            if ready.len() != size {
                return None;
            }
            let cm = config_maps.get_opt(&format!("{name}-proxy")).await.ok()??;
            let config = cm.data?.get("config.lua")?.clone();
            let mc = api.get(name).await.ok()?;
            let status = mc.status?.proxy?;
            let mut listed: Vec<(String, String)> = status
                .backends
                .iter()
                .map(|b| (b.pod.clone(), b.address.clone()))
                .collect();
            listed.sort();
            let in_config = ready.iter().all(|(pod, address)| {
                let ip = address.trim_end_matches(":11211");
                config.contains(&format!("label = \"{pod}\", host = \"{ip}\""))
            });
            let entries = config.matches("label = ").count();
            (listed == ready
                && in_config
                && entries == size
                && config.starts_with(&format!("-- version {}", status.config_version)))
            .then_some(config)
        },
    )
    .await
}

/// `status.proxy`'s backends as `(slot, pod)` (one copy), and the configuration's version.
async fn proxy_slots(env: &Env, name: &str) -> Option<(Vec<(i32, String)>, String)> {
    let proxy = env.api::<Memcached>().get(name).await.ok()?.status?.proxy?;
    let slots = proxy
        .backends
        .iter()
        .map(|b| (b.slot, b.pod.clone()))
        .collect();
    Some((slots, proxy.config_version))
}

/// Sets a pod's `Ready` condition, as its kubelet would after its probe.
async fn set_ready(env: &Env, pod: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    env.api::<Pod>()
        .patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": status}]}})),
        )
        .await
        .expect("the pod's status is patched");
}

on_every_server! {
/// The proxy's routes follow the pods' lives, not their readiness. A pod that is not Ready
/// for a while keeps its slot and the configuration does not change; a replacement takes
/// the slot of the pod it replaces; a scale-down removes the pod of the last slot, which
/// carries the lowest deletion cost. The pods of a pool without the proxy carry none.
async fn the_proxys_slots_follow_the_pods_lives(server: Server) {
    let env = start(server, "the_proxys_slots_follow_the_p", Duration::from_millis(20), false).await;
    env.apply("plain", json!({"size": 2})).await;
    env.converged("plain", 2).await;
    env.apply("slotted", json!({"size": 3, "proxy": {"enabled": true}})).await;
    env.converged("slotted", 3).await;
    proxy_routes_to_the_ready_pods(&env, "slotted", 3).await;
    let pods = env.api::<Pod>();
    let cost_of = |pod: Pod| {
        pod.metadata
            .annotations
            .and_then(|a| a.get(proxy::DELETION_COST_ANNOTATION).cloned())
    };
    let slots = wait_for("each pod's deletion cost by its slot", || async {
        let (slots, _) = proxy_slots(&env, "slotted").await?;
        for (slot, pod) in &slots {
            let cost = cost_of(pods.get(pod).await.ok()?)?;
            if cost != (1000 - slot).to_string() {
                return None;
            }
        }
        Some(slots)
    })
    .await;
    assert_eq!(slots.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [0, 1, 2]);
    let plain = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=plain"))
        .await
        .expect("pods");
    assert_eq!(plain.items.len(), 2);
    assert!(
        plain.items.into_iter().all(|p| cost_of(p).is_none()),
        "no deletion cost without the proxy"
    );

    // Not Ready for a while: seen by the operator, and still in its slot; the configuration
    // has not changed, so the proxies have nothing new to load.
    let before = env.api::<Memcached>().get("slotted").await.expect("get");
    let changed_at = before.status.as_ref().and_then(|s| s.proxy.as_ref()?.config_changed_at.clone());
    let (_, version) = proxy_slots(&env, "slotted").await.expect("status.proxy");
    let flapping = slots[1].1.clone();
    set_ready(&env, &flapping, false).await;
    let api = env.api::<Memcached>();
    let seen = wait_for("the operator sees the pod not Ready", || async {
        let mc = api.get("slotted").await.ok()?;
        (mc.status.as_ref()?.endpoints.len() == 2).then_some(mc)
    })
    .await;
    let proxy = seen.status.as_ref().and_then(|s| s.proxy.clone()).expect("status.proxy");
    let during: Vec<(i32, String)> = proxy.backends.iter().map(|b| (b.slot, b.pod.clone())).collect();
    assert_eq!(
        (during, proxy.config_version, proxy.config_changed_at),
        (slots.clone(), version, changed_at),
        "the routes did not change"
    );
    let ready = seen.condition(condition::PROXY_READY).expect("ProxyReady");
    assert_ne!(ready.reason, "NoBackends", "{}", ready.message);
    set_ready(&env, &flapping, true).await;
    env.converged("slotted", 3).await;

    // Replaced: the new pod takes the slot, the others keep theirs.
    let replaced = slots[0].1.clone();
    pods.delete(&replaced, &Default::default()).await.expect("delete pod");
    let after = wait_for("a new pod in slot 0", || async {
        let (s, _) = proxy_slots(&env, "slotted").await?;
        (s.len() == 3 && s[0].1 != replaced && s[1..] == slots[1..]).then_some(s)
    })
    .await;

    // Scaled down: the pod of the last slot goes, the ring loses that slot only.
    env.apply("slotted", json!({"size": 2, "proxy": {"enabled": true}})).await;
    env.converged("slotted", 2).await;
    wait_for("two slots, the last one gone", || async {
        let (s, _) = proxy_slots(&env, "slotted").await?;
        (s == after[..2]).then_some(())
    })
    .await;
    let last = pods.get_opt(&after[2].1).await.expect("get");
    assert!(
        last.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the last slot's pod was the one removed"
    );
}
}

on_every_server! {
/// With `spec.proxy.warmUp`, a replaced pod's slot warms up from it while it stops: the
/// replacement takes the slot, `status.proxy` names the stopping pod as the slot's
/// `warmFrom`, and the routes read the slot's misses from it; once it has gone, the slot is
/// the replacement's alone. The proxy runs the warm-up route from the ConfigMap.
async fn a_replaced_pods_slot_warms_up_from_it_while_it_stops(server: Server) {
    let env = start(server, "a_replaced_pods_slot_warms_up", Duration::from_millis(20), false).await;
    let spec = json!({
        "size": 3,
        "gracefulShutdown": {"preStopDelaySeconds": 160},
        "proxy": {"enabled": true, "image": "memcached:1.6.38", "warmUp": {"enabled": true}},
    });
    env.apply("warm", spec).await;
    env.converged("warm", 3).await;
    proxy_routes_to_the_ready_pods(&env, "warm", 3).await;
    let command = env
        .api::<Deployment>()
        .get("warm-proxy")
        .await
        .expect("proxy Deployment")
        .spec
        .and_then(|s| s.template.spec?.containers.first()?.command.clone())
        .unwrap_or_default();
    assert!(
        command.iter().any(|a| a.contains("proxy_config=routelib:/etc/memcached/proxy/warm.lua,")),
        "{command:?}"
    );
    let config_maps = env.api::<ConfigMap>();
    let data = config_maps.get("warm-proxy").await.expect("ConfigMap").data.unwrap_or_default();
    assert_eq!(data.get(proxy::WARM_KEY).map(String::as_str), Some(proxy::WARM_ROUTE));
    let (slots, _) = proxy_slots(&env, "warm").await.expect("status.proxy");

    // The pod of slot 1 is deleted and stops (a finalizer holds it, as its preStop delay
    // would).
    let pods = env.api::<Pod>();
    let old = slots[1].1.clone();
    pods.patch(
        &old,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/stopping"]}})),
    )
    .await
    .expect("finalizer added");
    pods.delete(&old, &Default::default()).await.expect("delete pod");
    let api = env.api::<Memcached>();
    let warming = wait_for("the replacement in slot 1, warming from the stopping pod", || async {
        let proxy = api.get("warm").await.ok()?.status?.proxy?;
        let b = proxy.backends.iter().find(|b| b.slot == 1)?;
        (b.pod != old && b.warm_from.as_ref()?.pod == old).then(|| b.clone())
    })
    .await;
    let old_ip = pods.get(&old).await.ok().and_then(|p| p.status?.pod_ip).expect("stopping pod's IP");
    assert_eq!(warming.warm_from.map(|w| w.address), Some(format!("{old_ip}:11211")));
    let (others, _) = proxy_slots(&env, "warm").await.expect("status.proxy");
    assert_eq!((others[0].clone(), others[2].clone()), (slots[0].clone(), slots[2].clone()));
    wait_for("the routes read slot 1's misses from the stopping pod", || async {
        let config = config_maps.get("warm-proxy").await.ok()?.data?.get("config.lua")?.clone();
        (config.contains("route_warm{")
            && config.contains(&format!("label = \"{old}\", host = \"{old_ip}\""))
            && config.contains(&format!("label = \"{}\"", warming.pod)))
        .then_some(())
    })
    .await;

    // It has gone: the slot is the replacement's alone, the routes plain again.
    pods.patch(
        &old,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("finalizer removed");
    wait_for("slot 1 the replacement's alone", || async {
        let proxy = api.get("warm").await.ok()?.status?.proxy?;
        let config = config_maps.get("warm-proxy").await.ok()?.data?.get("config.lua")?.clone();
        (proxy.backends.iter().all(|b| b.warm_from.is_none())
            && proxy.backends.iter().any(|b| b.slot == 1 && b.pod == warming.pod)
            && !config.contains("route_warm{")
            && !config.contains(&format!("\"{old}\"")))
        .then_some(())
    })
    .await;
}
}

on_every_server! {
/// With `spec.proxy.warmUp`, the slot a scale-out adds warms up from the ring before it:
/// `status.proxy` and the recorded rings mark it `grownFrom` the 2 slots before, the
/// routes read and write its moved keys through the warm-up routes, and once the window is
/// over (here 1 s of propagation and 15 s more) the routes are plain again. No pod is
/// replaced for any of it.
async fn a_scale_out_warms_the_new_slot_from_the_ring_before(server: Server) {
    let config = ControllerConfig {
        proxy_propagation: Duration::from_secs(1),
        proxy_warm_growth: Duration::from_secs(15),
        ..ControllerConfig::default()
    };
    let env = start_with(server, "a_scale_out_warms_the_new_slot", Duration::from_millis(20), false, config).await;
    let spec = |size: i32| {
        json!({
            "size": size,
            "gracefulShutdown": {"preStopDelaySeconds": 160},
            "proxy": {"enabled": true, "image": "memcached:1.6.38", "warmUp": {"enabled": true}},
        })
    };
    env.apply("grown", spec(2)).await;
    env.converged("grown", 2).await;
    proxy_routes_to_the_ready_pods(&env, "grown", 2).await;
    // The pool's pods joined one by one as it was created: no warm-up for that. Once the
    // proxies have loaded the last change (1 s), a new pod is a scale-out's.
    let api = env.api::<Memcached>();
    wait_for("the proxies past loading the pool's creation", || async {
        let mc = api.get("grown").await.ok()?;
        let c = mc.condition(condition::PROXY_READY)?;
        (c.status == "True" && !c.message.contains("scale-out")).then_some(())
    })
    .await;
    let (before, _) = proxy_slots(&env, "grown").await.expect("status.proxy");
    let config_maps = env.api::<ConfigMap>();
    let config = || async {
        config_maps.get("grown-proxy").await.ok()?.data?.get(proxy::CONFIG_KEY).cloned()
    };
    assert!(!config().await.unwrap_or_default().contains("route_warm"));

    env.apply("grown", spec(3)).await;
    let grown = wait_for("slot 2 warming from the ring of 2", || async {
        let mc = api.get("grown").await.ok()?;
        let proxy = mc.status.clone()?.proxy?;
        let b = proxy.backends.iter().find(|b| b.slot == 2)?.clone();
        let message = mc.condition(condition::PROXY_READY)?.message.clone();
        (b.grown_from.as_ref()?.slots == 2 && message.contains("1 slots added by a scale-out warming up"))
            .then_some(proxy)
    })
    .await;
    assert!(
        grown.backends.iter().filter(|b| b.slot < 2).all(|b| b.grown_from.is_none()),
        "{:?}",
        grown.backends
    );
    let (slots, _) = proxy_slots(&env, "grown").await.expect("status.proxy");
    assert_eq!(slots[..2], before[..], "the first slots keep their pods");
    // Recorded with the rings, for a restarted operator.
    let recorded = config_maps
        .get("grown-proxy")
        .await
        .ok()
        .and_then(|c| c.data?.get(proxy::BACKENDS_KEY).cloned())
        .unwrap_or_default();
    assert!(recorded.contains("\"grownFrom\":{\"slots\":2,"), "{recorded}");
    let warming = config().await.unwrap_or_default();
    assert!(
        warming.contains("child_unmoved = \"unmoved\"") && warming.contains("route_warm_write{"),
        "{warming}"
    );
    wait_for("the routes plain again after the window", || async {
        let proxy = api.get("grown").await.ok()?.status?.proxy?;
        let config = config().await?;
        (proxy.backends.len() == 3
            && proxy.backends.iter().all(|b| b.grown_from.is_none())
            && !config.contains("route_warm"))
        .then_some(())
    })
    .await;
    env.converged("grown", 3).await;
}
}

on_every_server! {
/// `spec.proxy.gutter`: the server fills in its defaults; the proxy pods get the gutter's
/// memory (`-m`, and their default resources grow by as much) and the routes send a failed
/// pod's requests on to the proxy's own cache with the gutter's TTL. Turned off again, the
/// proxy is as before. The pool's pods are never replaced for it.
async fn a_gutter_is_the_proxys_own_cache_and_leaves_the_pool_alone(server: Server) {
    let env = start(server, "a_gutter_is_the_proxys_own_cac", Duration::from_millis(20), false).await;
    env.apply("gutter", json!({"size": 2, "proxy": {"enabled": true}})).await;
    env.converged("gutter", 2).await;
    proxy_routes_to_the_ready_pods(&env, "gutter", 2).await;
    let pods = env.api::<Pod>();
    let pool_pods = || async {
        let mut uids: Vec<String> = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=memcached,app.kubernetes.io/instance=gutter"))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        uids.sort();
        uids
    };
    let before = pool_pods().await;
    assert_eq!(before.len(), 2);
    let deployments = env.api::<Deployment>();
    let config_maps = env.api::<ConfigMap>();
    let proxy_container = || async {
        deployments
            .get("gutter-proxy")
            .await
            .ok()
            .and_then(|d| d.spec?.template.spec?.containers.first().cloned())
    };

    env.apply("gutter", json!({"size": 2, "proxy": {"enabled": true, "gutter": {"enabled": true}}})).await;
    let stored = env.api::<Memcached>().get("gutter").await.expect("get");
    let gutter = stored.spec.proxy.as_ref().and_then(|p| p.gutter.clone()).expect("spec.proxy.gutter");
    assert_eq!((gutter.memory_mib, gutter.ttl_seconds), (32, 10), "the server's defaults");
    wait_for("the proxy with a 32 MiB gutter", || async {
        let c = proxy_container().await?;
        let command = c.command.unwrap_or_default();
        let limit = c.resources?.limits?.get("memory")?.0.clone();
        (command.windows(2).any(|w| w == ["-m", "32"])
            && command.iter().any(|a| a.contains("proxy_config=routelib:/etc/memcached/proxy/gutter.lua,"))
            && limit == "160Mi")
        .then_some(())
    })
    .await;
    wait_for("routes with the gutter", || async {
        let data = config_maps.get("gutter-proxy").await.ok()?.data?;
        let config = data.get(proxy::CONFIG_KEY)?;
        (config.contains("mode = \"store\", ttl = 10 }")
            && data.get(proxy::GUTTER_KEY).map(String::as_str) == Some(proxy::GUTTER_ROUTE))
        .then_some(())
    })
    .await;
    env.converged("gutter", 2).await;

    env.apply("gutter", json!({"size": 2, "proxy": {"enabled": true}})).await;
    wait_for("the proxy without a gutter", || async {
        let c = proxy_container().await?;
        let data = config_maps.get("gutter-proxy").await.ok()?.data?;
        (c.command?.windows(2).any(|w| w == ["-m", "8"])
            && !data.get(proxy::CONFIG_KEY)?.contains("route_gutter")
            && !data.contains_key(proxy::GUTTER_KEY))
        .then_some(())
    })
    .await;
    env.converged("gutter", 2).await;
    assert_eq!(pool_pods().await, before, "the pool's pods were not replaced");
}
}

on_every_server! {
async fn the_proxy_routes_to_the_ready_pods_and_goes_when_switched_off(server: Server) {
    let env = start(server, "the_proxy_routes_to_the_ready_", Duration::from_millis(20), false).await;
    env.apply("pooled", json!({"size": 3, "proxy": {"enabled": true}})).await;
    let mc = env.converged("pooled", 3).await;
    let uid = mc.metadata.uid.clone().expect("uid");
    proxy_routes_to_the_ready_pods(&env, "pooled", 3).await;

    // The proxy's objects, owned by the Memcached; its pods are no members of the pool.
    let owned_by_pool = |refs: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
        refs.unwrap_or_default()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true))
    };
    let deployments = env.api::<Deployment>();
    let proxy = wait_for("2 proxy pods ready", || async {
        let d = deployments.get_opt("pooled-proxy").await.ok()??;
        (d.status.as_ref()?.ready_replicas? == 2).then_some(d)
    })
    .await;
    assert!(owned_by_pool(proxy.metadata.owner_references.clone()));
    let service = env.api::<Service>().get("pooled-proxy").await.expect("proxy Service");
    assert!(owned_by_pool(service.metadata.owner_references.clone()));
    assert_eq!(
        service.spec.and_then(|s| s.selector).and_then(|s| s.get("app.kubernetes.io/name").cloned()).as_deref(),
        Some("memcached-proxy")
    );
    let client_service = env.api::<Service>().get("pooled").await.expect("client Service");
    assert_eq!(
        client_service.spec.and_then(|s| s.selector).and_then(|s| s.get("app.kubernetes.io/name").cloned()).as_deref(),
        Some("memcached"),
        "the client Service still selects the pool"
    );
    let pdb = env.api::<PodDisruptionBudget>().get("pooled-proxy").await.expect("proxy budget");
    assert!(owned_by_pool(pdb.metadata.owner_references.clone()));
    let cm = env.api::<ConfigMap>().get("pooled-proxy").await.expect("ConfigMap");
    assert!(owned_by_pool(cm.metadata.owner_references.clone()));
    let mc = env.api::<Memcached>().get("pooled").await.expect("get");
    assert_eq!(mc.status.expect("status").nodes.len(), 3, "proxy pods are not pool members");

    // Scale: the configuration follows, the proxy pods are not replaced.
    let template_before = proxy.spec.clone().expect("spec").template;
    env.apply("pooled", json!({"size": 4, "proxy": {"enabled": true}})).await;
    env.converged("pooled", 4).await;
    proxy_routes_to_the_ready_pods(&env, "pooled", 4).await;
    let after = deployments.get("pooled-proxy").await.expect("proxy Deployment");
    assert_eq!(after.spec.expect("spec").template, template_before, "no proxy rollout for a new backend");

    // A pool pod replaced: the configuration drops it and lists its successor, in its slot.
    let gone = ready_pool_pods(&env, "pooled", 11211).await[0].0.clone();
    let (slots, _) = proxy_slots(&env, "pooled").await.expect("status.proxy");
    let slot = slots.iter().find(|(_, pod)| *pod == gone).map(|(slot, _)| *slot);
    env.api::<Pod>().delete(&gone, &Default::default()).await.expect("delete pod");
    let config = wait_for("the deleted pod leaves the configuration", || async {
        let config = proxy_routes_to_the_ready_pods(&env, "pooled", 4).await;
        (!config.contains(&format!("\"{gone}\""))).then_some(config)
    })
    .await;
    assert_eq!(config.matches("label = ").count(), 4);
    let (after, _) = proxy_slots(&env, "pooled").await.expect("status.proxy");
    let others = |slots: &[(i32, String)]| -> Vec<(i32, String)> {
        slots.iter().filter(|(s, _)| Some(*s) != slot).cloned().collect()
    };
    assert_eq!(others(&after), others(&slots), "the other pods kept their slots");

    // Off again: the proxy's objects go, the pool stays.
    env.apply("pooled", json!({"size": 4, "proxy": {"enabled": false}})).await;
    wait_for("the proxy's objects deleted", || async {
        let d = deployments.get_opt("pooled-proxy").await.ok()?;
        let s = env.api::<Service>().get_opt("pooled-proxy").await.ok()?;
        let b = env.api::<PodDisruptionBudget>().get_opt("pooled-proxy").await.ok()?;
        let c = env.api::<ConfigMap>().get_opt("pooled-proxy").await.ok()?;
        (d.is_none() && s.is_none() && b.is_none() && c.is_none()).then_some(())
    })
    .await;
    let mc = env.converged("pooled", 4).await;
    let status = mc.status.expect("status");
    assert!(status.proxy.is_none(), "{:?}", status.proxy);
    assert!(status.conditions.iter().all(|c| c.type_ != condition::PROXY_READY));

    // Bad values are refused by the schema, naming the field.
    for (proxy, field) in [
        (json!({"enabled": true, "replicas": 0}), "spec.proxy.replicas"),
        (json!({"enabled": true, "copies": 4}), "spec.proxy.copies"),
        (json!({"enabled": true, "image": "Not An Image"}), "spec.proxy.image"),
    ] {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "badproxy"}, "spec": {"size": 1, "proxy": proxy}
        });
        let err = env
            .api::<Memcached>()
            .patch("badproxy", &PatchParams::apply("test").force(), &Patch::Apply(&mc))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
}
}

/// `topologySpread: Required` on a cluster whose nodes carry no zone label (bare metal, most
/// small clusters): the real scheduler places every pod, one per node. A strict zone rule
/// would leave them all Pending, since a node without the rule's key takes no pod under it.
#[tokio::test]
async fn required_spreading_schedules_on_a_cluster_without_zones() {
    let cp = envtest::ControlPlane::start(envtest::Options {
        zones: false,
        ..envtest::Options::new(envtest::Kube::Newest)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    common::cluster::apply_crd(&client, &<Memcached as kube::CustomResourceExt>::crd()).await;
    let ns = cp
        .namespace("no-zones")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(
        client.clone(),
        ControllerConfig {
            namespace: Some(ns.clone()),
            ..ControllerConfig::default()
        },
        async {
            let _ = rx.await;
        },
    ));
    let api: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "strict"}, "spec": {"size": 3, "topologySpread": "Required"},
    }))
    .expect("Memcached");
    api.create(&PostParams::default(), &mc)
        .await
        .expect("create");
    let mc = wait_for("3 pods Running on 3 nodes without zones", || async {
        let mc = api.get("strict").await.ok()?;
        (mc.status.as_ref()?.ready_replicas == 3).then_some(mc)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let mut nodes: Vec<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=strict"))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|p| p.spec?.node_name)
        .collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one pod per node: {nodes:?}");
    assert_eq!(mc.status.expect("status").nodes.len(), 3);
}

/// The Prometheus Operator installed after the pools: the pools with the exporter get their
/// ServiceMonitors when its CRD appears, without any change to them, and get them again
/// when it is removed and installed once more.
async fn service_monitors_follow_their_crd(client: Client, ns: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    common::cluster::apply_crd(&client, &<Memcached as kube::CustomResourceExt>::crd()).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(
        client.clone(),
        ControllerConfig {
            namespace: Some(ns.to_string()),
            status_batch: Duration::from_millis(10),
            ..ControllerConfig::default()
        },
        async {
            let _ = rx.await;
        },
    ));
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), ns);
    for (name, exporter) in [("exported", true), ("plain", false)] {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": name}, "spec": {"size": 1, "exporter": {"enabled": exporter}}
        });
        mcs.patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&mc),
        )
        .await
        .expect("apply");
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for name in ["exported", "plain"] {
        common::wait_for_within(
            &format!("{name}'s Deployment"),
            Duration::from_secs(120),
            || async { deployments.get_opt(name).await.ok().flatten() },
        )
        .await;
        common::wait_for_within(
            &format!("{name}'s status"),
            Duration::from_secs(120),
            || async {
                let mc = mcs.get_opt(name).await.ok().flatten()?;
                (mc.status.as_ref()?.observed_generation == mc.metadata.generation).then_some(())
            },
        )
        .await;
    }
    // No pod runs here (no workloads), so nothing moves after the pools' own creation;
    // its last reconciles (a 10 ms batch each) are over well within 3 s. Then only the
    // CRD's arrival can wake the exporter's pool.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let monitors: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
            "servicemonitors",
        ),
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for round in ["installed", "installed again"] {
        common::cluster::apply_crd(&client, &common::service_monitor_crd()).await;
        common::wait_for_within(
            &format!("the exporter pool's ServiceMonitor once its CRD is {round}"),
            Duration::from_secs(120),
            || async { monitors.get_opt("exported").await.ok().flatten() },
        )
        .await;
        assert!(
            monitors.get_opt("plain").await.expect("get").is_none(),
            "a pool without the exporter has no ServiceMonitor"
        );
        crds.delete(
            "servicemonitors.monitoring.coreos.com",
            &kube::api::DeleteParams::default(),
        )
        .await
        .expect("delete the CRD");
        common::wait_for_within("the CRD gone", Duration::from_secs(120), || async {
            crds.get_opt("servicemonitors.monitoring.coreos.com")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_monitors_follow_their_crd_apisim() {
    let server = apisim::ApiServer::builder().build();
    service_monitors_follow_their_crd(server.client(), "default").await;
}

/// On a control plane of its own (the shared one's ServiceMonitor CRD is installed by other
/// tests), API server and etcd only: no pod is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_monitors_follow_their_crd_kube_newest() {
    let cp = envtest::ControlPlane::start(envtest::Options {
        workloads: false,
        nodes: 0,
        ..envtest::Options::new(envtest::Kube::Newest)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    // No kube-controller-manager: the namespace is created here, without its default
    // ServiceAccount (the controller runs in process, no pod is made).
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "late-monitors"}})).expect("ns");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    service_monitors_follow_their_crd(client, "late-monitors").await;
}

/// `spec.flush` on the in-memory server, its pods given loopback addresses where real
/// memcached processes listen (one per pod, on the pool's port): each is flushed once, in
/// the order of the pods' names, `status.flush` lists them and says when it was done, and
/// the pods are the same ones. (The real kubelet's pods: `real_node_day2.rs`.)
#[tokio::test]
async fn a_flush_on_the_in_memory_server_empties_each_pods_memcached_once() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    let env = start(Server::Sim, "flush", Duration::from_millis(50), false).await;
    let port = common::process::free_port();
    env.apply(
        "flushed",
        json!({"size": 2, "containerPort": port, "rollout": {"minReadySeconds": 0}}),
    )
    .await;
    let mc = env.converged("flushed", 2).await;
    let names = mc.status.map(|s| s.nodes).unwrap_or_default();
    let pods = env.api::<Pod>();
    // One memcached per pod, at 127.0.0.2, 127.0.0.3, … (all loopback on Linux).
    let mut servers = Vec::new();
    let mut addresses = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let ip = format!("127.0.0.{}", i + 2);
        let mut args = vec![
            "-l".to_string(),
            ip.clone(),
            "-p".into(),
            port.to_string(),
            "-U".into(),
            "0".into(),
        ];
        if unsafe { libc::geteuid() } == 0 {
            args.extend(["-u".to_string(), "nobody".to_string()]);
        }
        let child = std::process::Command::new(common::process::memcached_binary())
            .args(&args)
            .spawn()
            .expect("memcached");
        servers.push(KillOnDrop(child));
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})),
        )
        .await
        .expect("the pod's address");
        addresses.push(format!("{ip}:{port}"));
    }
    let talk = |address: &str, command: &str| -> Option<String> {
        let mut stream = TcpStream::connect(address).ok()?;
        stream.write_all(command.as_bytes()).ok()?;
        let mut reader = BufReader::new(stream);
        let mut out = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            out.push_str(&line);
            if matches!(line.as_str(), "END\r\n" | "STORED\r\n" | "") {
                return Some(out);
            }
        }
    };
    for address in &addresses {
        wait_for("memcached listening", || async {
            talk(address, "set k 0 0 1\r\nv\r\n").filter(|a| a == "STORED\r\n")
        })
        .await;
    }
    let api = env.api::<Memcached>();
    wait_for("the pods' new addresses in status.endpoints", || async {
        let endpoints = api.get("flushed").await.ok()?.status?.endpoints;
        (endpoints == addresses).then_some(())
    })
    .await;

    env.apply(
        "flushed",
        json!({"size": 2, "containerPort": port, "rollout": {"minReadySeconds": 0},
               "flush": {"requestedAt": "2026-11-27", "pauseSeconds": 1}}),
    )
    .await;
    let flush = wait_for("the flush done", || async {
        let flush = api.get("flushed").await.ok()?.status?.flush?;
        flush.completion_time.is_some().then_some(flush)
    })
    .await;
    assert_eq!(flush.flushed, names);
    for address in &addresses {
        let stats = talk(address, "stats\r\n").expect("stats");
        assert!(stats.contains("STAT cmd_flush 1\r\n"), "{address}: {stats}");
        assert_eq!(
            talk(address, "get k\r\n").as_deref(),
            Some("END\r\n"),
            "{address}"
        );
    }
    let now: Vec<String> = api
        .get("flushed")
        .await
        .expect("pool")
        .status
        .map(|s| s.nodes)
        .unwrap_or_default();
    assert_eq!(now, names, "the same pods");
}

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The routes in the ConfigMap of the Memcached `zoned`.
async fn zoned_routes(env: &Env) -> String {
    env.api::<ConfigMap>()
        .get("zoned-proxy")
        .await
        .expect("the proxy's ConfigMap")
        .data
        .and_then(|d| d.get(proxy::CONFIG_KEY).cloned())
        .unwrap_or_default()
}

on_both_versions! {
/// `spec.proxy.zones` on a real control plane whose (fake) nodes are in zone-a, zone-b
/// and zone-c: the server copies each pod's zone from its node when it schedules it, the
/// pool's pods are spread 2, 2, 2 over the zones, each copy's ring holds its own zone's
/// pods only (in `status.proxy` and the routes), the proxy pods get their zone through the
/// downward API, and the proxy Service prefers close endpoints. (The in-memory server
/// schedules no pod, so it is not among the servers here.) Before Kubernetes 1.35 the
/// server copies no zone label: the pods wait, and `ProxyReady` says why.
async fn zone_copies_hold_their_own_zones_pods(kube: Kube) {
    let server = match kube {
        Kube::Oldest => Server::Oldest,
        Kube::Newest => Server::Newest,
    };
    let env = start(server, "zone_copies_hold_their_own_zone", Duration::from_millis(20), false).await;
    let zones = ["zone-a", "zone-b", "zone-c"];
    env.apply(
        "zoned",
        json!({"size": 6, "proxy": {"enabled": true, "copies": 3, "replicas": 3, "zones": zones}}),
    )
    .await;
    env.converged("zoned", 6).await;
    // What the server accepts at every version: the proxy pods' zone from the downward
    // API, and the Service's traffic distribution.
    let deployment = env.api::<Deployment>().get("zoned-proxy").await.expect("the proxy");
    let env_var = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.first().cloned())
        .and_then(|c| c.env)
        .and_then(|e| e.into_iter().find(|e| e.name == proxy::ZONE_ENV))
        .and_then(|e| e.value_from?.field_ref)
        .map(|f| f.field_path);
    assert_eq!(
        env_var.as_deref(),
        Some("metadata.labels['topology.kubernetes.io/zone']")
    );
    let service = env.api::<Service>().get("zoned-proxy").await.expect("the proxy Service");
    assert_eq!(
        service.spec.and_then(|s| s.traffic_distribution).as_deref(),
        Some("PreferClose")
    );
    let copies_labels = env
        .cluster
        .real
        .is_some_and(|cp| (cp.version().major, cp.version().minor) >= (1, 35));
    if !copies_labels {
        // Kubernetes 1.33 and 1.34 do not copy the node's zone label onto the pod: the
        // pods wait outside the rings, and ProxyReady says why.
        let reason = wait_for("ProxyReady naming the missing zone label", || async {
            let mc = env.api::<Memcached>().get("zoned").await.ok()?;
            let c = mc.condition(condition::PROXY_READY)?.clone();
            (c.status == "False"
                && c.message.contains("6 Ready pods wait outside the rings: their topology.kubernetes.io/zone label is missing"))
            .then_some(mc)
        })
        .await;
        assert!(reason.status.and_then(|s| s.proxy).is_none_or(|p| p.backends.is_empty()));
        return;
    }
    let pods = env.api::<Pod>();
    let zone_of = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(memcached_api::ZONE_LABEL).cloned())
    };
    let backends = wait_for("6 pods in their zones' rings", || async {
        let mc = env.api::<Memcached>().get("zoned").await.ok()?;
        let backends = mc.status?.proxy?.backends;
        (backends.len() == 6).then_some(backends)
    })
    .await;
    let pool: Vec<Pod> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=memcached,app.kubernetes.io/instance=zoned"))
        .await
        .expect("pods")
        .items;
    let mut per_zone = std::collections::BTreeMap::new();
    for p in &pool {
        let zone = zone_of(p).unwrap_or_else(|| panic!("pod {:?} has no zone label", p.metadata.name));
        *per_zone.entry(zone).or_insert(0) += 1;
    }
    assert_eq!(
        per_zone.into_iter().collect::<Vec<_>>(),
        zones.iter().map(|z| (z.to_string(), 2)).collect::<Vec<_>>(),
        "the pool spread evenly over the zones"
    );
    for b in &backends {
        let zone = zones[(b.copy - 1) as usize];
        assert_eq!(b.zone.as_deref(), Some(zone), "{b:?}");
        let pod = pool
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(b.pod.as_str()))
            .unwrap_or_else(|| panic!("{b:?} is a pod of the pool"));
        assert_eq!(zone_of(pod).as_deref(), Some(zone), "{b:?} is in its copy's zone");
    }
    let config = zoned_routes(&env).await;
    for zone in zones {
        assert!(config.contains(&format!("[\"{zone}\"] = {{")), "{config}");
    }
    assert!(config.contains("local_zone = zone"), "{config}");

    let proxy_pods = wait_for("3 proxy pods scheduled", || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=memcached-proxy,app.kubernetes.io/instance=zoned"))
            .await
            .ok()?
            .items;
        (list.len() == 3 && list.iter().all(|p| zone_of(p).is_some())).then_some(list)
    })
    .await;
    assert_eq!(proxy_pods.len(), 3, "every proxy pod carries its zone");

    // Scaled down to 3: the ReplicaSet removes the last slot of every zone (the deletion
    // costs), so each zone keeps one pod in slot 0 of its copy and no slot is vacant.
    env.apply(
        "zoned",
        json!({"size": 3, "proxy": {"enabled": true, "copies": 3, "replicas": 3, "zones": zones}}),
    )
    .await;
    env.converged("zoned", 3).await;
    let kept = wait_for("one pod per zone, in slot 0", || async {
        let mc = env.api::<Memcached>().get("zoned").await.ok()?;
        let mut kept: Vec<(i32, i32, Option<String>)> = mc
            .status?
            .proxy?
            .backends
            .iter()
            .map(|b| (b.copy, b.slot, b.zone.clone()))
            .collect();
        kept.sort();
        (kept.len() == 3).then_some(kept)
    })
    .await;
    assert_eq!(
        kept,
        (1..=3)
            .map(|c| (c, 0, Some(zones[(c - 1) as usize].to_string())))
            .collect::<Vec<_>>()
    );
    let config = zoned_routes(&env).await;
    assert!(!config.contains("vacant"), "{config}");
}
}
