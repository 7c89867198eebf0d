//! A converged Memcached costs the API server no writes: once every child matches the
//! desired state, resyncs write nothing and record no event, and neither does a restarted
//! operator (which may only ask the server, with dry runs, what it would store). Run on
//! apisim and on the real kube-apiserver at both pinned versions, for the feature matrix:
//! the seed's sample, resources written in a non-canonical form, empty maps and lists, the
//! exporter with its ServiceMonitor, TLS and SASL with their Secrets, a PodDisruptionBudget,
//! the proxy (its ConfigMap of routes, and the deletion costs of the pool's pods).
//!
//! The writes are counted by the server: on a real one by its own `apiserver_request_total`
//! (which tells dry runs apart), with its audit log naming what the operator wrote; on apisim
//! by its request counts (which cannot tell a dry run from a write: any counts). The events
//! are the ones the server holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::builders::MANAGED_BY;
use memcached_operator::controller::{self, Backoff, ControllerConfig, ReconcileCounters};
use serde_json::{Value, json};

mod common;
use common::cluster::{Cluster, Server};
use common::{wait_for, wait_for_within};

/// How often the controller looks at a converged Memcached again.
const RESYNC: Duration = Duration::from_secs(1);
/// How long the proxies are reported as loading a new configuration (the kubelet's
/// propagation of a ConfigMap, which no pod here waits for).
const PROXY_PROPAGATION: Duration = Duration::from_secs(3);
/// Resyncs of every Memcached counted in each phase.
const RESYNCS: u64 = 5;
/// The operator's `User-Agent` on a real server, to find its requests in the audit log.
const OPERATOR_AGENT: &str = "memcached-operator/steady-state-test";

/// The feature matrix: (name, size, spec).
fn matrix() -> Vec<(&'static str, usize, Value)> {
    vec![
        // The seed's sample.
        ("plain", 3, json!({"size": 3})),
        // Resources as users write them (the server stores `500m` and `1Gi`), empty maps
        // and lists (which the server drops), the exporter (a ServiceMonitor).
        (
            "shaped",
            3,
            json!({
                "size": 3,
                "resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                              "limits": {"memory": "1024Mi"}},
                "podAnnotations": {},
                "podLabels": {},
                "nodeSelector": {},
                "tolerations": [],
                "exporter": {"enabled": true},
            }),
        ),
        // The proxy: its routes, and the deletion cost of each pod by its slot.
        ("proxied", 3, json!({"size": 3, "proxy": {"enabled": true}})),
        // extstore: its volume, kept as it runs.
        (
            "extstored",
            2,
            json!({"size": 2, "extstore": {"enabled": true, "size": "256Mi"}}),
        ),
        // TLS and SASL with their Secrets mounted (the exporter can use neither).
        (
            "secured",
            2,
            json!({
                "size": 2,
                "tls": {"secretName": "secured-tls"},
                "sasl": {"secretName": "secured-sasl"},
            }),
        ),
    ]
}

/// Children per Memcached of the matrix: Deployment, two Services, budget (size ≥ 2), the
/// ServiceMonitor when the exporter runs, and the proxy's Deployment, Service, budget and
/// ConfigMap when it runs.
fn children() -> usize {
    matrix()
        .iter()
        .map(|(_, _, spec)| {
            4 + usize::from(spec["exporter"]["enabled"] == json!(true))
                + 4 * usize::from(spec["proxy"]["enabled"] == json!(true))
        })
        .sum()
}

async fn create_secrets(api: &Api<Secret>) {
    for secret in [
        json!({"metadata": {"name": "secured-tls"},
               // base64 of "not a real certificate" and "nor a key"
               "data": {"tls.crt": "bm90IGEgcmVhbCBjZXJ0aWZpY2F0ZQ==", "tls.key": "bm9yIGEga2V5"}}),
        json!({"metadata": {"name": "secured-sasl"},
               // base64 of "user:password\n"
               "data": {"sasl-pwdb": "dXNlcjpwYXNzd29yZAo="}}),
    ] {
        let secret: Secret = serde_json::from_value(secret).expect("a Secret");
        api.create(&PostParams::default(), &secret)
            .await
            .expect("Secret created");
    }
}

async fn apply_memcached(api: &Api<Memcached>, name: &str, spec: &Value) {
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": spec,
    });
    api.patch(name, &PatchParams::apply("kubectl"), &Patch::Apply(&mc))
        .await
        .unwrap_or_else(|e| panic!("Memcached {name} applies: {e}"));
}

/// Waits until `name` reports `size` ready pods, named in `status.nodes`, for its current
/// generation, Available and no longer Progressing; with the proxy, `ProxyReady` too (past
/// the window in which the proxies load a new configuration, so its end writes no status
/// in the steady phase).
async fn converged(api: &Api<Memcached>, name: &str, size: usize) {
    let window = PROXY_PROPAGATION;
    wait_for_within(
        &format!("{name} converged at {size}"),
        Duration::from_secs(90) + window,
        || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            if let Some(invalid) = mc
                .condition(condition::DEGRADED)
                .filter(|c| c.reason == "InvalidSpec")
            {
                panic!("{name} is invalid: {}", invalid.message);
            }
            let status = mc.status.as_ref()?;
            let available = mc.condition(condition::AVAILABLE)?.status == "True";
            let settled = mc.condition(condition::PROGRESSING)?.status == "False";
            let proxy_ready = mc.spec.proxy_enabled().is_none()
                || mc.condition(condition::PROXY_READY)?.status == "True";
            (status.nodes.len() == size
                && status.ready_replicas as usize == size
                && available
                && settled
                && proxy_ready
                && status.observed_generation == mc.metadata.generation)
                .then_some(())
        },
    )
    .await;
}

/// One running controller.
struct Operator {
    counters: Arc<ReconcileCounters>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    fn start(client: Client, namespace: Option<String>) -> Operator {
        let config = ControllerConfig {
            namespace,
            resync: RESYNC,
            proxy_propagation: PROXY_PROPAGATION,
            secret_recheck: Duration::from_millis(200),
            // Events published as soon as they are made, never held for a free slot, so
            // that the wait in `counted_since` covers them.
            event_max_hold: Duration::ZERO,
            backoff: Backoff {
                base: Duration::from_millis(20),
                cap: Duration::from_millis(500),
            },
            ..ControllerConfig::default()
        };
        let counters = config.counters.clone();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run(client, config, async {
            let _ = rx.await;
        }));
        Operator {
            counters,
            stop,
            task,
        }
    }

    /// Waits for `RESYNCS` reconciles of each of `memcacheds` (and at least as many resync
    /// periods), counted from now.
    async fn resyncs(&self, memcacheds: usize) {
        let target = self.counters.reconciles() + RESYNCS * memcacheds as u64;
        let until = Instant::now() + RESYNC * RESYNCS as u32;
        wait_for_within("resync reconciles", Duration::from_secs(60), || async {
            (self.counters.reconciles() >= target).then_some(())
        })
        .await;
        tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
        assert_eq!(self.counters.failures(), 0, "no reconcile fails");
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// The operator's client, with a `User-Agent` of its own (its requests are told apart in
/// the server's audit log).
async fn operator_client(cluster: &Cluster) -> (Client, Option<apisim::ServeHandle>) {
    let (kubeconfig, served) = match (cluster.real, cluster.sim.as_ref()) {
        (Some(cp), _) => (
            Kubeconfig::read_from(cp.kubeconfig()).expect("kubeconfig"),
            None,
        ),
        // Over HTTP, so that its requests carry their own User-Agent too.
        (None, Some(sim)) => {
            let served = sim.serve().await.expect("apisim over HTTP");
            let kubeconfig = Kubeconfig::from_yaml(&served.kubeconfig_yaml()).expect("kubeconfig");
            (kubeconfig, Some(served))
        }
        (None, None) => unreachable!("a cluster is real or simulated"),
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("client config");
    config.headers.push((
        http::header::USER_AGENT,
        HeaderValue::from_static(OPERATOR_AGENT),
    ));
    (Client::try_from(config).expect("client"), served)
}

/// The resources of the operator's writes: its children and the Memcacheds (status).
fn ours(resource: &str, subresource: &str) -> bool {
    match resource {
        "services" | "servicemonitors" | "memcacheds" => true,
        // kube-controller-manager writes these objects' status.
        "deployments" | "poddisruptionbudgets" => subresource.is_empty(),
        _ => false,
    }
}

/// `apiserver_request_total` of writes to the operator's resources, by
/// `(dry run, verb, resource/subresource)`.
fn request_totals(metrics: &str) -> BTreeMap<(bool, String, String), u64> {
    let mut totals = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let labels: BTreeMap<&str, &str> = labels
            .split("\",")
            .filter_map(|pair| {
                let (k, v) = pair.split_once("=\"")?;
                Some((k, v.trim_end_matches('"')))
            })
            .collect();
        let label = |k: &str| labels.get(k).copied().unwrap_or_default();
        let verb = label("verb");
        let write = matches!(
            verb,
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        );
        if !write || !ours(label("resource"), label("subresource")) {
            continue;
        }
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        let what = match label("subresource") {
            "" => label("resource").to_string(),
            sub => format!("{}/{sub}", label("resource")),
        };
        *totals
            .entry((!label("dry_run").is_empty(), verb.to_string(), what))
            .or_default() += count;
    }
    totals
}

/// What the server counted in one phase.
#[derive(Debug, Default)]
struct Counted {
    /// Writes (dry runs apart on a real server), by `verb resource`.
    writes: BTreeMap<String, u64>,
    /// Dry runs (a real server only).
    dry_runs: BTreeMap<String, u64>,
    /// The operator's writes as the audit log names them (a real server only).
    audited: Vec<String>,
    /// The operator's other requests (gets, lists, discovery), but for the watches its
    /// informers hold open and renew, by `verb resource`.
    reads: BTreeMap<String, u64>,
    /// Events the operator recorded, as `reason: note`.
    events: Vec<String>,
}

impl Counted {
    fn writes(&self) -> u64 {
        self.writes.values().sum()
    }
    fn dry_runs(&self) -> u64 {
        self.dry_runs.values().sum()
    }
}

/// A starting point of the server's counts.
struct Mark {
    totals: BTreeMap<(bool, String, String), u64>,
    audit_len: usize,
    events: Vec<String>,
}

/// The operator's requests in `audit` but its writes and its watches, by `verb resource`.
fn reads<'a>(audit: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> BTreeMap<String, u64> {
    let mut reads = BTreeMap::new();
    for (user_agent, verb, resource) in audit {
        let write = matches!(
            verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        );
        if user_agent == OPERATOR_AGENT && !write && verb != "watch" {
            *reads.entry(format!("{verb} {resource}")).or_default() += 1;
        }
    }
    reads
}

/// The operator's events in the namespace, by name, as `name reason: note`.
async fn our_events(cluster: &Cluster) -> Vec<String> {
    let events: Api<Event> = cluster.api();
    let mut list: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(MANAGED_BY))
        .map(|e| {
            format!(
                "{} {}: {}",
                e.name_any(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect();
    list.sort();
    list
}

async fn mark(cluster: &Cluster) -> Mark {
    let (totals, audit_len) = match (cluster.real, cluster.sim.as_ref()) {
        (Some(cp), _) => (
            request_totals(&cp.metrics().await.expect("metrics")),
            cp.audit().expect("audit log").len(),
        ),
        (None, Some(sim)) => {
            sim.reset_request_counts();
            (BTreeMap::new(), sim.audit_events().len())
        }
        (None, None) => unreachable!("a cluster is real or simulated"),
    };
    Mark {
        totals,
        audit_len,
        events: our_events(cluster).await,
    }
}

async fn counted_since(cluster: &Cluster, mark: Mark) -> Counted {
    // Events are published off the reconcile's path, at once (`event_max_hold` is zero):
    // one made in the counted window is sent within this wait, which is many times a
    // request's round trip on a loaded machine.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut counted = Counted::default();
    match (cluster.real, cluster.sim.as_ref()) {
        (Some(cp), _) => {
            let now = request_totals(&cp.metrics().await.expect("metrics"));
            for ((dry, verb, what), n) in now {
                let before = mark
                    .totals
                    .get(&(dry, verb.clone(), what.clone()))
                    .copied()
                    .unwrap_or(0);
                if n > before {
                    let into = if dry {
                        &mut counted.dry_runs
                    } else {
                        &mut counted.writes
                    };
                    into.insert(format!("{verb} {what}"), n - before);
                }
            }
            let audit = cp.audit().expect("audit log");
            let since = audit.iter().skip(mark.audit_len);
            counted.reads =
                reads(since.map(|r| (r.user_agent.as_str(), r.verb.as_str(), r.resource.as_str())));
            counted.audited = audit
                .into_iter()
                .skip(mark.audit_len)
                .filter(|r| r.user_agent == OPERATOR_AGENT && r.namespace == cluster.ns)
                .filter(|r| r.is_write())
                .map(|r| {
                    format!(
                        "{} {}{} {}",
                        r.verb,
                        r.resource,
                        if r.subresource.is_empty() {
                            String::new()
                        } else {
                            format!("/{}", r.subresource)
                        },
                        r.name
                    )
                })
                .collect();
        }
        (None, Some(sim)) => {
            let audit = sim.audit_events();
            counted.reads = reads(
                audit
                    .iter()
                    .skip(mark.audit_len)
                    .map(|r| (r.user_agent.as_str(), r.verb.as_str(), r.resource.as_str())),
            );
            let counts = sim.request_counts();
            for ((verb, resource), n) in counts.iter() {
                if matches!(
                    verb,
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                ) && n > 0
                {
                    counted.writes.insert(format!("{verb} {resource}"), n);
                }
            }
        }
        (None, None) => unreachable!("a cluster is real or simulated"),
    }
    counted.events = our_events(cluster)
        .await
        .into_iter()
        .filter(|e| !mark.events.contains(e))
        .collect();
    counted
}

on_every_server! {
/// Converged Memcacheds of the whole feature matrix: several resyncs, then a restart of the
/// operator and several more, cost no write and no event.
async fn converged_memcacheds_cost_no_writes_on_resync_or_restart(server: Server) {
    let cluster = Cluster::start(
        server,
        "steady-state",
        |b| b.pod_ready_delay(Duration::from_millis(50)).audit_log(true),
        true,
    )
    .await;
    create_secrets(&cluster.api()).await;
    let (client, _served) = operator_client(&cluster).await;
    let operator = Operator::start(client.clone(), cluster.watch_namespace());
    let memcacheds: Api<Memcached> = cluster.api();
    let matrix = matrix();
    for (name, _, spec) in &matrix {
        apply_memcached(&memcacheds, name, spec).await;
    }
    for (name, size, _) in &matrix {
        converged(&memcacheds, name, *size).await;
    }
    // Past the status batching window, so the last status write is behind us.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let steady = mark(&cluster).await;
    operator.resyncs(matrix.len()).await;
    let steady = counted_since(&cluster, steady).await;

    operator.stop().await;
    let restart = mark(&cluster).await;
    let operator = Operator::start(client, cluster.watch_namespace());
    // Its first reconciles find everything converged, and so do the resyncs after them.
    wait_for("the restarted operator's first reconciles", || async {
        (operator.counters.reconciles() >= matrix.len() as u64).then_some(())
    })
    .await;
    operator.resyncs(matrix.len()).await;
    let restarted = counted_since(&cluster, restart).await;
    operator.stop().await;

    let report = format!(
        "on {server:?}, over {RESYNCS} resyncs of {} converged Memcacheds:\n{steady:#?}\n\
         after a restart and {RESYNCS} resyncs:\n{restarted:#?}",
        matrix.len()
    );
    eprintln!("{report}");
    assert_eq!(
        (steady.writes(), steady.audited.len(), steady.events.len()),
        (0, 0, 0),
        "writes or events at steady state {report}"
    );
    assert_eq!(steady.dry_runs(), 0, "a known child needs no question {report}");
    assert!(
        steady.reads.is_empty(),
        "requests at steady state (gets, lists, discovery) {report}"
    );
    assert_eq!(
        (restarted.writes(), restarted.audited.len(), restarted.events.len()),
        (0, 0, 0),
        "writes or events after a restart {report}"
    );
    assert!(
        restarted.dry_runs() <= children() as u64,
        "at most one dry run per child after a restart {report}"
    );
}
}
