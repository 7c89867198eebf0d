//! The validating webhook refuses every Memcached whose children Kubernetes would refuse:
//! it builds the Deployment, Services, PDB and ServiceMonitor the reconciler would apply
//! and asks the API server for a server-side dry run of each (`webhook::dry_run`). The real
//! kube-apiserver is the oracle for what is refused; these tests check that each refusal
//! reaches the user on the Memcached's own field, that nothing is stored, that good objects
//! still pass, and what the webhook answers when the API server cannot be asked.
//!
//! Through the API server with the webhooks registered: `real_cluster.rs`. The reconciler's
//! `Degraded` path for objects admitted while the webhook was off: below.

use std::time::{Duration, Instant};

use axum::Router;
use envtest::{ControlPlane, Kube};
use http::Request;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ResourceQuota, Service};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::builders::BuildSettings;
use memcached_operator::controller::{self, Backoff, ControllerConfig};
use memcached_operator::webhook::dry_run::{ChildrenCheck, FailurePolicy};
use memcached_operator::webhook::{self, VALIDATE_PATH};
use serde_json::{Value, json};
use tower::ServiceExt;

mod common;
use common::bad_inputs::{children_refused, memcached};
use common::cluster::apply_crd;
use common::{base64_decode, wait_for, wait_for_within};

fn review(operation: &str, ns: &str, object: &Value, old: Option<&Value>) -> Value {
    let mut object = object.clone();
    object["metadata"]["namespace"] = json!(ns);
    object["metadata"]["uid"] = json!("6a0e4bd1-0000-4000-8000-000000000001");
    let name = object["metadata"]["name"].clone();
    let mut request = json!({
        "uid": "review-1",
        "kind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
        "resource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
        "operation": operation,
        "namespace": ns,
        "name": name,
        "userInfo": {"username": "someone"},
        "object": object,
    });
    if let Some(old) = old {
        let mut old = old.clone();
        old["metadata"]["namespace"] = json!(ns);
        request["oldObject"] = old;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// POSTs `review` to the validating webhook's route, as the API server does, and returns
/// the AdmissionReview's `response`.
async fn call(app: &Router, review: &Value) -> Value {
    let request = Request::post(VALIDATE_PATH)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("answered");
    assert_eq!(
        response.status(),
        200,
        "HTTP status of the webhook's answer"
    );
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    answer["response"].clone()
}

fn router(check: ChildrenCheck) -> Router {
    webhook::router_with(memcached_api::DEFAULT_IMAGE, Some(check))
}

async fn setup(kube: Kube, test: &str) -> (&'static ControlPlane, Client, String) {
    let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let ns = cp
        .namespace(test)
        .await
        .unwrap_or_else(|e| panic!("namespace: {e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    apply_crd(&client, &Memcached::crd()).await;
    (cp, client, ns)
}

on_both_versions! {
/// The table of pass-through fields Kubernetes refuses in a Deployment: each is refused by
/// the webhook with code 422, on the Memcached's field path, in the API server's words; a
/// Memcached using every one of those fields correctly is admitted; nothing is stored.
async fn the_webhook_refuses_what_kubernetes_would_refuse_in_the_children(kube: Kube) {
    let (_cp, client, ns) = setup(kube, "children-table").await;
    let app = router(ChildrenCheck::new(client.clone(), BuildSettings::default()));
    for (name, spec, field, words) in children_refused() {
        let object = memcached(name, spec);
        let response = call(&app, &review("CREATE", &ns, &object, None)).await;
        println!("{kube:?} {name}: {}", response["status"]["message"]);
        assert_eq!(response["allowed"], false, "{name}: {response}");
        assert_eq!(response["status"]["code"], 422, "{name}: {response}");
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("Memcached.memcached.cache.example.com \"{name}\" is invalid: ")),
            "{name}: {message}"
        );
        let causes = response["status"]["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            causes.iter().any(|c| c["field"].as_str().is_some_and(|f| f.starts_with(field))
                && c["message"].as_str().is_some_and(|m| m.contains(words))),
            "{name}: no cause on {field} saying {words:?}: {causes:?}"
        );
        assert!(
            message.contains(field) && message.contains(words),
            "{name}: {message}"
        );
    }

    // Every pass-through field, well used, with the exporter (so the ServiceMonitor, not
    // served on this cluster, is skipped as the reconciler skips it) and a PDB (size 3).
    let good = memcached("good", json!({
        "size": 3,
        "resources": {"requests": {"memory": "200Mi", "cpu": "250m"}, "limits": {"memory": "200Mi"}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "cache", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-b"]}]}]}}},
        "priorityClassName": "high-priority",
        "podLabels": {"team": "cache"},
        "podAnnotations": {"example.com/owner": "cache team"},
        "exporter": {"enabled": true},
        "service": {"labels": {"team": "cache"}, "annotations": {"example.com/lb": "internal"}},
        "gracefulShutdown": {"preStopDelaySeconds": 10, "terminationGracePeriodSeconds": 20},
        "podSecurityContext": {"runAsUser": 1_000_680_000, "fsGroup": 1_000_680_000},
        "containerSecurityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}},
        "networkPolicy": {"enabled": true,
            "from": [{"namespaceSelector": {"matchLabels": {"team": "cache"}}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
    }));
    let response = call(&app, &review("CREATE", &ns, &good, None)).await;
    assert_eq!(response["allowed"], true, "{response}");
    // Client authentication with a CA of its own: a projected volume the server accepts.
    let mutual = memcached("mutual", json!({
        "size": 2,
        "tls": {"secretName": "certs", "clientAuth": {"caSecretName": "client-ca", "verify": "Optional"}},
    }));
    let response = call(&app, &review("CREATE", &ns, &mutual, None)).await;
    assert_eq!(response["allowed"], true, "{response}");

    // Dry runs store nothing.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default();
    assert!(deployments.list(&lp).await.expect("list").items.is_empty());
    assert!(services.list(&lp).await.expect("list").items.is_empty());

    // An update that breaks the pods is refused; one that leaves the spec as it was is
    // not checked again (a Memcached admitted while the webhook was off can still have its
    // labels or finalizers edited).
    let (_, bad_spec, field, _) = children_refused()
        .into_iter()
        .find(|(name, ..)| *name == "toleration-bogus")
        .expect("in the table");
    let bad = memcached("good", bad_spec);
    let response = call(&app, &review("UPDATE", &ns, &bad, Some(&good))).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(response["status"]["message"].as_str().unwrap_or_default().contains(field));
    let mut relabelled = bad.clone();
    relabelled["metadata"]["labels"] = json!({"team": "cache"});
    let response = call(&app, &review("UPDATE", &ns, &relabelled, Some(&bad))).await;
    assert_eq!(response["allowed"], true, "{response}");
}
}

on_both_versions! {
/// A pool an earlier release created keeps its ClusterIP Service (a Service keeps its
/// cluster IP for life, and the API server refuses a headless form in its place): the
/// webhook dry-runs that form for it, so an update of such a pool is admitted, while a
/// new pool's Service is dry-run headless.
async fn an_update_of_a_pool_an_earlier_release_created_is_admitted(kube: Kube) {
    let (_cp, client, ns) = setup(kube, "children-earlier").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mut old = memcached("earlier", json!({"size": 2}));
    old["metadata"]["namespace"] = json!(ns);
    let typed: Memcached = serde_json::from_value(old.clone()).expect("decodes");
    let stored = mcs.create(&PostParams::default(), &typed).await.expect("the Memcached");
    // As the earlier release applied it: server-side, under the operator's field manager.
    let service = memcached_operator::builders::desired_cluster_ip_service(&stored).expect("builds");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let apply = PatchParams::apply(memcached_operator::builders::FIELD_MANAGER).force();
    let live = services.patch("earlier", &apply, &Patch::Apply(&service)).await.expect("its Service");
    let ip = live.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    assert!(!ip.is_empty() && ip != "None", "a cluster IP: {ip:?}");

    let app = router(ChildrenCheck::new(client.clone(), BuildSettings::default()));
    let new = memcached("earlier", json!({"size": 3, "containerPort": 11311}));
    let mut update = review("UPDATE", &ns, &new, Some(&old));
    update["request"]["object"]["metadata"]["uid"] = json!(stored.metadata.uid);
    let response = call(&app, &update).await;
    assert_eq!(response["allowed"], true, "{response}");
    let fresh = memcached("fresh", json!({"size": 3}));
    let response = call(&app, &review("CREATE", &ns, &fresh, None)).await;
    assert_eq!(response["allowed"], true, "{response}");
}
}

on_both_versions! {
/// When the dry run cannot be done, the answer follows the failure policy and comes
/// within the API server's wait: an API server that never answers, and an identity that
/// may not patch Deployments, are refused under `Fail` with the reason (HTTP 503 in the
/// answer, so the user retries) and admitted with a warning under `Ignore`.
async fn without_an_answer_from_the_api_server_the_failure_policy_decides(kube: Kube) {
    let (cp, client, ns) = setup(kube, "children-unchecked").await;
    let object = memcached("cache", json!({"size": 2}));
    let create = review("CREATE", &ns, &object, None);

    // A server that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let config = kube::Config::new(url.parse().expect("url"));
    let hanging = Client::try_from(config).expect("client");
    let budget = Duration::from_millis(500);
    let check = ChildrenCheck::new(hanging, BuildSettings::default()).with_budget(budget);

    let started = Instant::now();
    let response = call(&router(check.clone()), &create).await;
    let took = started.elapsed();
    println!("{kube:?} silent server, Fail: {took:?}: {response}");
    assert!(
        took < Duration::from_secs(webhook::TIMEOUT_SECONDS as u64),
        "answered within the API server's wait: {took:?}"
    );
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 503, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("could not be checked") && message.contains("retry"), "{message}");
    assert!(message.contains("within 500 ms"), "{message}");

    let response = call(&router(check.with_policy(FailurePolicy::Ignore)), &create).await;
    assert_eq!(response["allowed"], true, "{response}");
    let warnings = response["warnings"].to_string();
    assert!(warnings.contains("were not checked"), "{warnings}");
    held.abort();

    // An identity without RBAC for the dry run: the API server's 403, named.
    let nobody = cp
        .client_as("system:serviceaccount:default:nobody", &[])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let check = ChildrenCheck::new(nobody, BuildSettings::default());
    let response = call(&router(check.clone()), &create).await;
    println!("{kube:?} forbidden, Fail: {response}");
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("forbidden") && message.contains("config/rbac"), "{message}");
    let response = call(&router(check.with_policy(FailurePolicy::Ignore)), &create).await;
    assert_eq!(response["allowed"], true, "{response}");

    // A 403 that is not RBAC's is the cluster's policy refusing the child, which no retry
    // changes: a ResourceQuota allowing no Deployment refuses the Memcached, with the
    // quota's words, under either policy.
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-deployments"},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }))
    .expect("quota");
    Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
    let check = ChildrenCheck::new(client.clone(), BuildSettings::default())
        .with_policy(FailurePolicy::Ignore);
    let response = wait_for("the quota enforced", || async {
        let response = call(&router(check.clone()), &create).await;
        (response["allowed"] == false).then_some(response)
    })
    .await;
    println!("{kube:?} quota: {response}");
    assert_eq!(response["status"]["code"], 422, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("exceeded quota") && !message.contains("retry"), "{message}");
}
}

on_both_versions! {
/// What the webhook now refuses, created while it is off (or before it was installed):
/// the reconciler reports `Degraded` on the Memcached's own field, with the API server's
/// words, and keeps converging the valid pool beside it.
async fn admitted_while_the_webhook_was_off_the_reconciler_reports_degraded(kube: Kube) {
    let (_cp, client, ns) = setup(kube, "children-degraded").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<Memcached>(&()));
    let table = children_refused();
    let chosen: Vec<_> = table
        .iter()
        .filter(|(name, ..)| ["toleration-bogus", "node-selector-value", "cpu-over-limit"].contains(name))
        .collect();
    let mut objects: Vec<Value> = chosen.iter().map(|(name, spec, ..)| memcached(name, spec.clone())).collect();
    objects.push(memcached("good", json!({"size": 2})));
    for object in &objects {
        let mut object = object.clone();
        object["metadata"]["namespace"] = json!(ns);
        let obj: DynamicObject = serde_json::from_value(object).expect("object");
        api.create(&PostParams::default(), &obj).await.expect("no webhook: created");
    }
    let config = ControllerConfig {
        namespace: Some(ns.clone()),
        backoff: Backoff { base: Duration::from_millis(200), cap: Duration::from_secs(2) },
        ..ControllerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller::run(client.clone(), config, async {
        let _ = stopped.await;
    }));
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    for (name, _, field, words) in &chosen {
        let mc = wait_for_within(&format!("Degraded on {name}"), common::DEADLINE, || async {
            let mc = memcacheds.get(name).await.ok()?;
            (mc.condition(condition::DEGRADED)?.status == "True").then_some(mc)
        })
        .await;
        let degraded = mc.condition(condition::DEGRADED).expect("condition");
        println!("{kube:?} {name}: {} {}", degraded.reason, degraded.message);
        assert_eq!(degraded.reason, "InvalidSpec", "{name}: {}", degraded.message);
        assert!(
            degraded.message.contains(field) && degraded.message.contains(words),
            "{name}: {field} / {words:?} not in {:?}",
            degraded.message
        );
    }
    wait_for_within("good converges", common::DEADLINE, || async {
        let mc = memcacheds.get("good").await.ok()?;
        (mc.status.as_ref()?.nodes.len() == 2 && mc.condition(condition::AVAILABLE)?.status == "True")
            .then_some(())
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controller stops")
        .expect("no panic");
}
}

on_both_versions! {
/// The quantity grammar the CRD schema and the webhook apply to `spec.resources` refuses
/// everything the API server cannot parse: for each string, the server converts a
/// Deployment whose memory request it is (the dry run answers anything but its 500
/// "unable to convert") whenever `is_quantity` accepts it. The grammar is stricter on
/// purpose in one way, and only there: a number without digits (`Mi`, `.`, `-`, `.e3`), which
/// the server reads as 0, is refused as the typo it almost certainly is.
async fn the_quantity_grammar_is_the_api_servers(kube: Kube) {
    let (_cp, client, ns) = setup(kube, "quantities").await;
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<Deployment>(&()));
    let params = kube::api::PatchParams::apply("quantity-test").dry_run();
    for quantity in [
        "1", "0", "128Mi", "1.5Gi", "100m", "1e3", "1E3", "+1", "-1", ".5", "1.", "1e-3",
        "2Ki", "3k", "1.5e1", "1e1.5", "1e+3", "1E-2", "1e", "1.5.e3", "1n", "1u", "5Ei", "abc", "1GiB", "1 Gi", "1ki", "--1", "1e", "0x10", "", "1.2.3",
        "Mi", "1m1", "9223372036854775807", "1Pi", "1Ei", ".", "-", "+Ki", ".e3", "-.5", "5.Mi",
    ] {
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "q"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "memcached",
                    "resources": {"requests": {"memory": quantity}}}]}}},
        });
        let answer = deployments.patch("q", &params, &kube::api::Patch::Apply(&deployment)).await;
        let parsed = match &answer {
            Err(kube::Error::Api(s)) => !s.message.contains("unable to convert"),
            _ => true,
        };
        let ours = memcached_api::validation::is_quantity(quantity);
        let number = quantity.split(|c| "eEinumkKMGTP".contains(c)).next().unwrap_or("");
        let digitless = !number.chars().any(|c| c.is_ascii_digit());
        println!("{kube:?} {quantity:?}: server parses {parsed}, ours {ours}");
        if digitless && parsed {
            assert!(!ours, "{quantity:?}: a quantity without digits is refused");
        } else {
            assert_eq!(ours, parsed, "{quantity:?}: the server says {answer:?}");
        }
    }
}
}

/// Random Memcached specs over the fields users write most (sizes, ports, images, memcached
/// settings, resources, tolerations, node selectors, priority classes, pod labels, the
/// exporter), with valid values weighted up so that both outcomes come often.
fn arb_spec() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    use proptest::sample::select;
    let opt = |s: BoxedStrategy<Value>| prop::option::weighted(0.5, s).boxed();
    let image = select(vec![
        "memcached:1.6.38",
        "memcached:1.6.38-alpine",
        "registry.local:5000/cache/memcached:1.6",
        "memcached:1.6.38",
        "memcached:1.6.38",
        "memcached:1.6.38",
        "Bad Image",
    ])
    .prop_map(Value::from)
    .boxed();
    let config = (
        select(vec![64, 64, 64, 128, 1024, 1024, 8, 0]),
        select(vec![1, 4, 4, 4, 4, 2, 8, 0]),
        select(vec!["1m", "1m", "1m", "512k", "512k", "1m", "2m", "abc"]),
    )
        .prop_map(|(memory, threads, item)| {
            json!({"memoryMib": memory, "threads": threads, "maxItemSize": item})
        })
        .boxed();
    let quantity = || {
        select(vec![
            "256Mi", "256Mi", "1Gi", "1Gi", "2Gi", "2Gi", "64Mi", "abc",
        ])
    };
    let resources = (quantity(), quantity(), select(vec!["100m", "1", "2", "250m", "1", "100m", "2", "x"]))
        .prop_map(|(request, limit, cpu)| {
            json!({"requests": {"memory": request, "cpu": cpu}, "limits": {"memory": limit}})
        })
        .boxed();
    let tolerations = (
        select(vec!["Equal", "Exists", "Equal", "Exists", "Equal", "Bogus"]),
        select(vec![
            "dedicated",
            "dedicated",
            "dedicated",
            "dedicated",
            "bad key!",
        ]),
        select(vec![
            "NoSchedule",
            "NoExecute",
            "NoSchedule",
            "NoExecute",
            "Sometimes",
        ]),
    )
        .prop_map(|(operator, key, effect)| {
            let value = if operator == "Exists" {
                json!(null)
            } else {
                json!("cache")
            };
            json!([{"key": key, "operator": operator, "value": value, "effect": effect}])
        })
        .boxed();
    let node_selector = (
        select(vec![
            "kubernetes.io/os",
            "kubernetes.io/os",
            "kubernetes.io/os",
            "kubernetes.io/os",
            "bad key!",
        ]),
        select(vec!["linux", "linux", "linux", "linux", "bad value!"]),
    )
        .prop_map(|(k, v)| json!({ k: v }))
        .boxed();
    let priority = select(vec![
        "high-priority",
        "high-priority",
        "high-priority",
        "high-priority",
        "Bad_Name",
    ])
    .prop_map(Value::from)
    .boxed();
    let pod_labels = (
        select(vec![
            "team",
            "team",
            "example.com/team",
            "example.com/team",
            "-bad",
        ]),
        select(vec!["cache", "cache", "cache", "cache", "bad value!"]),
    )
        .prop_map(|(k, v)| json!({ k: v }))
        .boxed();
    let exporter = any::<bool>().prop_map(|on| json!({"enabled": on})).boxed();
    (
        select(vec![0, 1, 2, 3, 3, 2, 1, -1]),
        prop::option::weighted(0.3, select(vec![11211, 11211, 80, 8080, 65536])),
        (opt(image), opt(config), opt(resources), opt(tolerations)),
        (
            opt(node_selector),
            opt(priority),
            opt(pod_labels),
            opt(exporter),
        ),
    )
        .prop_map(
            |(
                size,
                port,
                (image, config, resources, tolerations),
                (nodes, priority, labels, exporter),
            )| {
                let mut spec = json!({"size": size});
                let mut set = |key: &str, v: Option<Value>| {
                    if let Some(v) = v {
                        spec[key] = v;
                    }
                };
                set("containerPort", port.map(Value::from));
                set("image", image);
                set("config", config);
                set("resources", resources);
                set("tolerations", tolerations);
                set("nodeSelector", nodes);
                set("priorityClassName", priority);
                set("podLabels", labels);
                set("exporter", exporter);
                spec
            },
        )
}

on_both_versions! {
/// What the webhooks admit, the real API server stores, and it accepts every child the
/// reconciler would apply for it (server-side dry runs of the builders' output, made by the
/// test, not by the webhook's own check). The oracle is the API server; the counts show
/// that both outcomes were reached often enough for the property to mean something.
async fn what_the_webhooks_admit_the_real_api_server_accepts(kube: Kube) {
    use memcached_operator::builders::SecretVersions;
    use memcached_operator::children::{self, CHILDREN, Inputs, Kind, LiveServices};
    use proptest::strategy::{Strategy, ValueTree};

    const CASES: usize = 300;
    let (_cp, client, ns) = setup(kube, "admit-oracle").await;
    let app = webhook::router_with(
        memcached_api::DEFAULT_IMAGE,
        Some(ChildrenCheck::new(client.clone(), BuildSettings::default())),
    );
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = arb_spec();
    let (mut admitted, mut refused) = (0, 0);
    for case in 0..CASES {
        let spec = strategy.new_tree(&mut runner).expect("generate").current();
        let name = format!("fuzz-{case}");
        let object = memcached(&name, spec.clone());
        // The mutating webhook first (the defaults it fills), then the validating one.
        let mutated = call_endpoint(&app, webhook::MUTATE_PATH, &review("CREATE", &ns, &object, None)).await;
        let mut object = object.clone();
        if let Some(patch) = mutated["patch"].as_str() {
            let patch = base64_decode(patch);
            let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("JSON patch");
            json_patch::patch(&mut object, &patch).expect("the patch applies");
        }
        if mutated["allowed"] != true {
            refused += 1;
            continue;
        }
        let response = call(&app, &review("CREATE", &ns, &object, None)).await;
        if response["allowed"] != true {
            refused += 1;
            continue;
        }
        admitted += 1;
        object["metadata"]["namespace"] = json!(ns);
        let typed: Memcached = serde_json::from_value(object.clone()).expect("an admitted object decodes");
        let stored = mcs
            .create(&PostParams::default(), &typed)
            .await
            .unwrap_or_else(|e| panic!("admitted {spec}, but the API server refuses it: {e}"));
        let settings = BuildSettings::default();
        // Both forms of the client Services: a new pool's, and an earlier release's.
        let earlier = LiveServices { cluster_ip: true, headless: true };
        let planned = [LiveServices::default(), earlier].into_iter().flat_map(|services| {
            let inputs = Inputs { settings: &settings, secrets: &SecretVersions::default(), backends: &[], services };
            children::plan(CHILDREN, &stored, &inputs)
                .unwrap_or_else(|e| panic!("admitted {spec}, but its children cannot be built: {e:?}"))
        });
        for p in planned {
            let Some(desired) = p.desired else { continue };
            // Not served on this cluster (the reconciler skips it the same way).
            if desired.kind() == Kind::ServiceMonitor {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &ns, &desired.kind().api_resource());
            let obj: DynamicObject = serde_json::from_value(desired.to_json().expect("JSON")).expect("object");
            api.create(&PostParams { dry_run: true, ..PostParams::default() }, &obj)
                .await
                .unwrap_or_else(|e| panic!("admitted {spec}, but the API server refuses its {}: {e}", p.child.role));
        }
    }
    println!("{kube:?}: {CASES} random Memcacheds, {admitted} admitted (stored, children accepted), {refused} refused");
    assert!(admitted >= CASES / 10, "only {admitted} of {CASES} admitted: the property was hardly exercised");
    assert!(refused >= CASES / 10, "only {refused} of {CASES} refused: the generator is too tame");
}
}

/// POSTs `review` to one of the webhooks' routes and returns the AdmissionReview's
/// `response`.
async fn call_endpoint(app: &Router, path: &str, review: &Value) -> Value {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("answered");
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    answer["response"].clone()
}

/// The pod-level and container-level overrides of a row of the Pod Security table, and
/// whether the operator refuses them.
fn security_rows() -> Vec<(&'static str, Value)> {
    vec![
        ("none", json!({})),
        (
            "OpenShift UID",
            json!({"podSecurityContext": {"runAsUser": 1_000_680_000, "fsGroup": 1_000_680_000}}),
        ),
        (
            "pod root UID",
            json!({"podSecurityContext": {"runAsUser": 0}}),
        ),
        (
            "pod may be root",
            json!({"podSecurityContext": {"runAsNonRoot": false}}),
        ),
        (
            "pod root group",
            json!({"podSecurityContext": {"runAsGroup": 0, "supplementalGroups": [0]}}),
        ),
        (
            "pod unconfined seccomp",
            json!({"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        ),
        (
            "pod localhost seccomp",
            json!({"podSecurityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "memcached.json"}}}),
        ),
        (
            "pod SELinux level",
            json!({"podSecurityContext": {"seLinuxOptions": {"level": "s0:c26,c5", "type": "container_t"}}}),
        ),
        (
            "pod SELinux spc_t",
            json!({"podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}}}),
        ),
        (
            "pod SELinux user",
            json!({"podSecurityContext": {"seLinuxOptions": {"user": "system_u"}}}),
        ),
        (
            "safe sysctl",
            json!({"podSecurityContext": {"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}}),
        ),
        (
            "unsafe sysctl",
            json!({"podSecurityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "4096"}]}}),
        ),
        (
            "pod AppArmor unconfined",
            json!({"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
        ),
        (
            "pod AppArmor default",
            json!({"podSecurityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}),
        ),
        (
            "escalation",
            json!({"containerSecurityContext": {"allowPrivilegeEscalation": true}}),
        ),
        (
            "privileged",
            json!({"containerSecurityContext": {"privileged": true, "allowPrivilegeEscalation": true}}),
        ),
        (
            "low ports",
            json!({"containerSecurityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}),
        ),
        (
            "SYS_ADMIN",
            json!({"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}}),
        ),
        (
            "drops nothing",
            json!({"containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}}),
        ),
        (
            "container root UID",
            json!({"containerSecurityContext": {"runAsUser": 0}}),
        ),
        (
            "container may be root",
            json!({"containerSecurityContext": {"runAsNonRoot": false}}),
        ),
        (
            "writable root",
            json!({"containerSecurityContext": {"readOnlyRootFilesystem": false}}),
        ),
        (
            "container unconfined seccomp",
            json!({"containerSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        ),
    ]
}

on_both_versions! {
/// What `spec.podSecurityContext` and `spec.containerSecurityContext` may say is decided by
/// the API server's PodSecurity admission at `restricted`: for every row of the table, the
/// operator refuses the override exactly when the API server refuses a pod of the pool (and
/// of its proxy) built with it in a namespace that enforces `restricted`, and the pods of
/// the operator's own settings are admitted there.
async fn the_security_overrides_allowed_are_what_pod_security_admits(kube: Kube) {
    use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
    let (_cp, client, ns) = setup(kube, "pod-security").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let enforce = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    namespaces
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&enforce))
        .await
        .expect("label the namespace");
    // Pods are admitted only once their ServiceAccount exists.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    wait_for("the default ServiceAccount", || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let settings = BuildSettings::default();
    let mut refused_rows = 0;
    for (row, overrides) in security_rows() {
        let mut spec = json!({"size": 2, "proxy": {"enabled": true}});
        for (key, value) in overrides.as_object().into_iter().flatten() {
            spec[key] = value.clone();
        }
        let mut mc: Memcached =
            serde_json::from_value(memcached("pss", spec)).expect("a Memcached");
        mc.metadata.namespace = Some(ns.clone());
        mc.metadata.uid = Some("6a0e4bd1-0000-4000-8000-000000000002".into());
        let ours = memcached_api::validation::validate(&mc).err();
        let templates = [
            memcached_operator::builders::desired_deployment(&mc, &settings),
            memcached_operator::proxy::desired_proxy_deployment(&mc, &settings)
                .map(|d| d.expect("the proxy runs")),
        ];
        for template in templates {
            let template = template.expect("builds").spec.expect("spec").template;
            let pod = Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some("pss-probe".into()),
                    labels: template.metadata.and_then(|m| m.labels),
                    ..Default::default()
                },
                spec: template.spec,
                status: None,
            };
            let theirs = pods
                .create(&PostParams { dry_run: true, ..PostParams::default() }, &pod)
                .await
                .err();
            println!("{kube:?} {row}: ours {ours:?}; the API server's {theirs:?}");
            if let Some(kube::Error::Api(status)) = &theirs {
                assert!(
                    status.code == 403 && status.message.contains("violates PodSecurity"),
                    "{row}: refused for another reason than Pod Security, so the row decides nothing: {status:?}"
                );
            }
            assert_eq!(
                ours.is_some(),
                theirs.is_some(),
                "{row}: the operator {} it, the API server's PodSecurity {} it ({ours:?}; {theirs:?})",
                if ours.is_some() { "refuses" } else { "admits" },
                if theirs.is_some() { "refuses" } else { "admits" },
            );
            refused_rows += usize::from(theirs.is_some());
        }
    }
    assert!(refused_rows >= 10, "the table hardly exercises the refusals: {refused_rows}");
}
}
