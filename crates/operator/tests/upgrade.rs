//! An upgrade of the operator restarts no pod whose spec did not change.
//!
//! The operator of the last release (hack/previous-release/COMMIT, built by `make
//! previous-release`) converges a matrix of pools on the real control plane: plain, TLS
//! reloaded in place, SASL, the exporter, the proxy and extstore. Then it is replaced by
//! this build, with the TLS reload agent's image moved (as a release moves it), then the
//! exporter's: the API server shows no pod template changed and no pod deleted. Last, the
//! default memcached image moves: the pools roll, never more than the budget at once, the
//! others waiting with `WaitingForRolloutSlot`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envtest::{ControlPlane, Kube};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use serde_json::{Value, json};

mod common;
use common::cluster::apply_crd;
use common::process::{Operator, TempDir, previous_release};
use common::wait_for_within;

/// How long convergence may take on two busy cores (a pool's pods come up through the
/// scheduler and kwok; six pools at once).
const CONVERGED: Duration = Duration::from_secs(180);

/// The images every operator here is started with, until one of them moves.
const MEMCACHED_IMAGE: &str = "memcached:1.6.38-alpine";
const EXPORTER_IMAGE: &str = "quay.io/prometheus/memcached-exporter:v0.15.2";
/// The last release ran the agent from the operator's own image.
const OLD_AGENT_IMAGE: &str = "example.com/memcached-operator:0.1.0";

/// The pools of the matrix, by name: one per feature an upgrade could disturb.
fn pools() -> Vec<(&'static str, Value)> {
    let fast = json!({"minReadySeconds": 0});
    vec![
        ("plain", json!({"size": 2, "rollout": fast})),
        (
            "tls",
            json!({"size": 2, "rollout": fast, "tls": {"secretName": "certs"}}),
        ),
        (
            "sasl",
            json!({"size": 2, "rollout": fast, "sasl": {"secretName": "auth"}}),
        ),
        (
            "exporter",
            json!({"size": 2, "rollout": fast, "exporter": {"enabled": true}}),
        ),
        (
            "proxy",
            json!({"size": 2, "rollout": fast, "proxy": {"enabled": true}}),
        ),
        (
            "extstore",
            json!({"size": 2, "rollout": fast,
                            "extstore": {"enabled": true, "size": "256Mi"}}),
        ),
    ]
}

async fn secrets(client: &Client, ns: &str) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["cache.example".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let data = |pairs: &[(&str, String)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.clone().into_bytes())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    for (name, data) in [
        (
            "certs",
            data(&[("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())]),
        ),
        ("auth", data(&[("sasl-pwdb", "app:secret\n".to_string())])),
    ] {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            data,
            ..Secret::default()
        };
        api.create(&PostParams::default(), &secret)
            .await
            .expect("Secret");
    }
}

/// What an upgrade must not move: each Deployment's pod template (its generation may move:
/// kube-apiserver counts a new annotation of the Deployment as a new generation, which
/// rolls nothing), its ReplicaSets, and the pods (by uid).
#[derive(Debug, PartialEq)]
struct Fleet {
    deployments: BTreeMap<String, Value>,
    replica_sets: BTreeSet<String>,
    pods: BTreeSet<String>,
    /// Each Service's uid, cluster IP and version: an earlier release's client Services are
    /// kept as they are (their cluster IP too), untouched.
    services: BTreeMap<String, (String, String, String)>,
}

async fn fleet(client: &Client, ns: &str) -> Fleet {
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=memcached-operator");
    // Whole, as the server holds them (a typed Deployment drops fields its version of the
    // API does not know).
    let resource = kube::api::ApiResource::erase::<Deployment>(&());
    let deployments =
        Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, &resource)
            .list(&lp)
            .await
            .expect("Deployments")
            .into_iter()
            .map(|d| (d.name_any(), d.data["spec"]["template"].clone()))
            .collect();
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("ReplicaSets")
        .into_iter()
        .map(|rs| rs.name_any())
        .collect();
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("pods")
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid)
        .collect();
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("Services")
        .into_iter()
        .map(|s| {
            let ip = s
                .spec
                .as_ref()
                .and_then(|s| s.cluster_ip.clone())
                .unwrap_or_default();
            (
                s.name_any(),
                (
                    s.uid().unwrap_or_default(),
                    ip,
                    s.resource_version().unwrap_or_default(),
                ),
            )
        })
        .collect();
    Fleet {
        deployments,
        replica_sets,
        pods,
        services,
    }
}

/// Where two JSON trees differ, as `path: before -> after` lines.
fn differences(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
                let (x, y) = (&a.get(key), &b.get(key));
                let sub = format!("{path}/{key}");
                match (x, y) {
                    (Some(x), Some(y)) => differences(x, y, &sub, out),
                    _ => out.push(format!("{sub}: {x:?} -> {y:?}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}/{i}"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: {a} -> {b}")),
        _ => {}
    }
}

/// What changed between two fleets, readable.
fn changes(before: &Fleet, after: &Fleet) -> String {
    let mut out = Vec::new();
    for (name, template) in &before.deployments {
        match after.deployments.get(name) {
            Some(t) => differences(template, t, name, &mut out),
            None => out.push(format!("{name}: gone")),
        }
    }
    if before.replica_sets != after.replica_sets {
        out.push(format!(
            "ReplicaSets {:?} -> {:?}",
            before.replica_sets, after.replica_sets
        ));
    }
    let deleted = before.pods.difference(&after.pods).count();
    if deleted > 0 {
        out.push(format!("{deleted} pods deleted"));
    }
    out.join("\n")
}

/// Waits until every pool of the matrix is Available, done rolling, and its status is of
/// its latest spec.
async fn converged(client: &Client, ns: &str) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + CONVERGED;
    loop {
        let list = api.list(&ListParams::default()).await.expect("Memcacheds");
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|mc| {
                let is = |t: &str, s: &str| mc.condition(t).is_some_and(|c| c.status == s);
                !(is(condition::AVAILABLE, "True")
                    && is(condition::PROGRESSING, "False")
                    && mc.status.as_ref().and_then(|s| s.observed_generation)
                        == mc.metadata.generation)
            })
            .map(|mc| {
                let conditions = mc.status.iter().flat_map(|s| &s.conditions);
                let said: Vec<String> = conditions
                    .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                    .collect();
                format!("{}: {}", mc.name_any(), said.join("; "))
            })
            .collect();
        if list.items.len() >= pools().len() && pending.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not converged within {CONVERGED:?}:\n{}",
            pending.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts `program` as the operator of `ns` with the images given.
fn operator(
    cp: &ControlPlane,
    dir: &TempDir,
    name: &str,
    program: PathBuf,
    ns: &str,
    images: [&str; 3],
    extra: &[&str],
) -> Operator {
    let [memcached, exporter, agent] = images;
    let mut args = vec![
        format!("--namespace={ns}"),
        "--metrics-bind-address=0".to_string(),
        "--health-probe-bind-address=0".to_string(),
        format!("--memcached-image={memcached}"),
        format!("--exporter-image={exporter}"),
        format!("--tls-agent-image={agent}"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Operator::spawn_program(
        &program,
        cp.kubeconfig(),
        dir.path(),
        name,
        &args,
        &[("RUST_LOG", "info,memcached_operator::controller=debug")],
    )
}

/// Waits until `op` has reconciled every pool of the matrix in `ns` at least once.
async fn reconciled_all(op: &mut Operator, ns: &str) {
    for (pool, _) in pools() {
        op.wait_log(&format!("/{pool}.{ns}"), CONVERGED).await;
    }
}

/// The pools' Deployments moving through a rollout, from a watch: at each change, how many
/// pools were rolling (their latest spec not yet rolled out with every pod Ready).
fn rolling_at_once(
    client: &Client,
    ns: &str,
    most_at_once: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let pools: BTreeSet<String> = pools().iter().map(|(p, _)| p.to_string()).collect();
        let mut rolling = BTreeSet::new();
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(d)) = stream.next().await {
            let name = d.name_any();
            if !pools.contains(&name) {
                continue;
            }
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let s = d.status.clone().unwrap_or_default();
            let done = s.observed_generation >= d.metadata.generation
                && s.updated_replicas.unwrap_or(0) >= want
                && s.replicas.unwrap_or(0) == want
                && s.ready_replicas.unwrap_or(0) >= want;
            if done {
                rolling.remove(&name);
            } else {
                rolling.insert(name);
            }
            most_at_once.fetch_max(rolling.len(), Ordering::Relaxed);
        }
    })
}

on_both_versions! {
async fn an_upgrade_from_the_last_release_restarts_no_pod_whose_spec_did_not_change(kube: Kube) {
    let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let ns = cp.namespace("upgrade").await.unwrap_or_else(|e| panic!("namespace: {e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    apply_crd(&client, &Memcached::crd()).await;
    apply_crd(&client, &common::service_monitor_crd()).await;
    secrets(&client, &ns).await;
    let dir = TempDir::new("upgrade");

    // The last release converges the matrix.
    let mut old = operator(
        cp, &dir, "previous-release", previous_release(), &ns,
        [MEMCACHED_IMAGE, EXPORTER_IMAGE, OLD_AGENT_IMAGE], &[],
    );
    let api: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    for (name, spec) in pools() {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": name}, "spec": spec,
        });
        api.patch(name, &PatchParams::apply("test").force(), &Patch::Apply(&mc))
            .await
            .expect("a pool");
    }
    converged(&client, &ns).await;
    assert!(old.exited().is_none(), "the last release exited:\n{}", old.logs());
    old.signal(libc::SIGTERM);
    old.wait_exit(Duration::from_secs(60)).await;
    let before = fleet(&client, &ns).await;
    assert_eq!(before.pods.len(), 2 * pools().len() + 2, "the pools' and the proxy's pods");

    // This build, with the agent in its own image (as a release moves it).
    let new_agent = "example.com/memcached-tls-agent:0.1.0";
    let mut new = operator(
        cp, &dir, "upgraded", common::process::bin(), &ns,
        [MEMCACHED_IMAGE, EXPORTER_IMAGE, new_agent], &[],
    );
    reconciled_all(&mut new, &ns).await;
    converged(&client, &ns).await;
    let after = fleet(&client, &ns).await;
    assert!(after == before, "the upgrade changed pods:\n{}", changes(&before, &after));
    new.signal(libc::SIGTERM);
    new.wait_exit(Duration::from_secs(60)).await;

    // Only the exporter's image moves.
    let mut moved = operator(
        cp, &dir, "new-exporter", common::process::bin(), &ns,
        [MEMCACHED_IMAGE, "quay.io/prometheus/memcached-exporter:v0.15.3", new_agent], &[],
    );
    reconciled_all(&mut moved, &ns).await;
    converged(&client, &ns).await;
    let after = fleet(&client, &ns).await;
    assert!(after == before, "a new exporter image restarted pods:\n{}", changes(&before, &after));
    moved.signal(libc::SIGTERM);
    moved.wait_exit(Duration::from_secs(60)).await;

    // The default memcached image moves: every pool rolls, one at a time.
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let rolling = rolling_at_once(&client, &ns, most_at_once.clone());
    let waiting = std::sync::Mutex::new(BTreeSet::new());
    let _rolled = operator(
        cp, &dir, "new-memcached", common::process::bin(), &ns,
        ["memcached:1.6.39-alpine", EXPORTER_IMAGE, new_agent],
        &["--max-concurrent-pool-rollouts=1"],
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait_for_within("every pool on the new image", Duration::from_secs(600), || async {
        for mc in api.list(&ListParams::default()).await.ok()?.items {
            if mc.condition(condition::PROGRESSING).is_some_and(|c| c.reason == "WaitingForRolloutSlot") {
                waiting.lock().expect("lock").insert(mc.name_any());
            }
        }
        let mut all = true;
        for (pool, _) in pools() {
            let d = deployments.get(pool).await.ok()?;
            let image = d.spec?.template.spec?.containers.first()?.image.clone();
            all &= image.as_deref() == Some("memcached:1.6.39-alpine");
        }
        all.then_some(())
    })
    .await;
    converged(&client, &ns).await;
    rolling.abort();
    let most = most_at_once.load(Ordering::Relaxed);
    assert!(most >= 1, "the watch saw the pools roll");
    assert!(most <= 1, "{most} pools rolled at once; the budget was 1");
    let waiting = waiting.into_inner().expect("lock");
    assert!(
        waiting.len() >= 2,
        "pools waiting for a slot were shown as waiting: {waiting:?}"
    );

    // The client Services. The last release's pools kept their ClusterIP `NAME` and
    // `NAME-headless` (the fleet compared above); a new pool gets one Service, headless.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let earlier = before.services.clone();
    assert!(
        earlier.get("plain").is_some_and(|(_, ip, _)| !ip.is_empty() && ip != "None")
            && earlier.contains_key("plain-headless"),
        "the last release's Services: {earlier:?}"
    );
    let fresh = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "fresh"}, "spec": {"size": 2},
    });
    api.patch("fresh", &PatchParams::apply("test").force(), &Patch::Apply(&fresh))
        .await
        .expect("a new pool");
    let ip = |s: &Service| s.spec.as_ref().and_then(|s| s.cluster_ip.clone());
    let service = wait_for_within("the new pool's Service", Duration::from_secs(60), || async {
        services.get_opt("fresh").await.ok().flatten()
    })
    .await;
    assert_eq!(ip(&service).as_deref(), Some("None"), "a new pool's Service is headless");
    converged(&client, &ns).await;
    assert_eq!(services.get_opt("fresh-headless").await.expect("read"), None);

    // Deleting an earlier release's `NAME` is how a pool moves to one headless Service: it
    // comes back headless, and its `NAME-headless` is kept (clients may resolve it).
    services.delete("plain", &Default::default()).await.expect("delete");
    let plain = wait_for_within("plain's Service, headless", Duration::from_secs(60), || async {
        services.get_opt("plain").await.ok().flatten().filter(|s| ip(s).as_deref() == Some("None"))
    })
    .await;
    assert_ne!(plain.uid().as_deref(), Some(earlier["plain"].0.as_str()));
    converged(&client, &ns).await;
    let kept = services.get("plain-headless").await.expect("plain-headless is kept");
    assert_eq!(kept.uid().as_deref(), Some(earlier["plain-headless"].0.as_str()));
}
}
