//! Least privilege: the generated roles have no wildcard, every request the operator makes
//! in an integration scenario is allowed by them, and every verb they grant is either used
//! in that scenario or needed without a request of its own (listed below with the reason).
//!
//! The operator gets its own `kube::Client` whose requests go through a recording layer to
//! the in-memory API server, so the test driver's own calls (creating the CR, breaking
//! things) and the server's workload simulator are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use apisim::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, CustomResourceExt};
use manager::leader::{self, LeaderElectionConfig};
use manager::metrics_server::{CachingAuthorizer, Decision, KubeAuthorizer};
use memcached_api::Memcached;
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::proxy;
use memcached_operator::samples::SEED_SAMPLE;
use memcached_operator::{crd, rbac};
use memcached_operator_gen::manifests;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod common;
use common::wait_for;

/// The namespace config/default deploys the operator (and its Lease) to.
const OPERATOR_NAMESPACE: &str = manifests::NAMESPACE;

/// One request as the API server's authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    verb: String,
    group: String,
    /// `plural` or `plural/subresource`.
    resource: String,
    /// Empty for cluster-scoped requests and cluster-wide lists/watches.
    namespace: String,
    /// HTTP status of the response.
    status: u16,
}

/// Parses a Kubernetes API request path into (group, resource, namespace, has name).
fn is_discovery(path: &str) -> bool {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(
        segs.as_slice(),
        ["api"] | ["apis"] | ["api", _] | ["apis", _, _]
    )
}

fn parse_path(path: &str) -> Option<(String, String, String, bool)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    match rest {
        [plural] => Some((group, plural.to_string(), namespace, false)),
        [plural, _name] => Some((group, plural.to_string(), namespace, true)),
        [plural, _name, sub] => Some((group, format!("{plural}/{sub}"), namespace, true)),
        _ => None,
    }
}

fn verb(method: &http::Method, query: &str, has_name: bool) -> &'static str {
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if has_name => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if has_name => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

/// A tower layer in front of the API server that records every request.
#[derive(Clone)]
struct Recording<S> {
    inner: S,
    log: Arc<Mutex<Vec<Request>>>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Recording<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let log = self.log.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            // API discovery (`GET /apis/<group>/<version>`, asked before using the optional
            // ServiceMonitor kind) is granted to every authenticated user by the built-in
            // `system:discovery` ClusterRole; the operator's roles need not grant it.
            if method == http::Method::GET && is_discovery(&path) {
                return Ok(resp);
            }
            let (group, resource, namespace, has_name) = parse_path(&path)
                .unwrap_or_else(|| panic!("the operator called a non-resource path: {path}"));
            log.lock().expect("log").push(Request {
                verb: verb(&method, &query, has_name).to_string(),
                group,
                resource,
                namespace,
                status: resp.status().as_u16(),
            });
            Ok(resp)
        })
    }
}

/// The rules the generated config/rbac files grant: (ClusterRole rules, leader-election
/// Role rules in the operator's namespace), parsed back from the rendered YAML.
fn generated_rules() -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    let files = manifests::render().expect("manifests render");
    let file = |name: &str| -> String {
        files
            .iter()
            .find(|f| f.path.to_str() == Some(name))
            .unwrap_or_else(|| panic!("{name} is generated"))
            .content
            .clone()
    };
    let mut cluster = vec![];
    for name in [
        "rbac/role.yaml",
        "rbac/metrics_auth_role.yaml",
        "rbac/crd_reader_role.yaml",
    ] {
        let role: ClusterRole = serde_yaml::from_str(&file(name)).expect("a ClusterRole");
        cluster.extend(role.rules.unwrap_or_default());
    }
    let role: Role = serde_yaml::from_str(&file("rbac/leader_election_role.yaml")).expect("a Role");
    (cluster, role.rules.unwrap_or_default())
}

/// Whether the API server's RBAC authorizer would allow `req` for the operator's
/// ServiceAccount with the generated roles.
fn allowed(req: &Request, verb: &str, cluster: &[PolicyRule], namespaced: &[PolicyRule]) -> bool {
    rbac::allows(cluster, verb, &req.group, &req.resource)
        || (req.namespace == OPERATOR_NAMESPACE
            && rbac::allows(namespaced, verb, &req.group, &req.resource))
}

/// The verbs the API server's authorizer checks for `req`: a server-side apply that
/// creates its object (201) is authorized as `patch` and as `create`.
fn checked_verbs(req: &Request) -> Vec<&str> {
    if req.verb == "patch" && req.status == 201 {
        vec!["patch", "create"]
    } else {
        vec![req.verb.as_str()]
    }
}

#[test]
fn generated_roles_have_no_wildcards() {
    for file in manifests::render().expect("manifests render") {
        if !file.path.starts_with("rbac") {
            continue;
        }
        for doc in serde_yaml::Deserializer::from_str(&file.content) {
            let v: Value = serde::Deserialize::deserialize(doc).expect("yaml");
            for rule in v["rules"].as_array().into_iter().flatten() {
                for field in [
                    "apiGroups",
                    "resources",
                    "verbs",
                    "resourceNames",
                    "nonResourceURLs",
                ] {
                    for item in rule[field].as_array().into_iter().flatten() {
                        let s = item.as_str().unwrap_or("");
                        assert!(
                            !s.contains('*'),
                            "{}: wildcard {s:?} in {field}",
                            file.path.display()
                        );
                    }
                }
            }
        }
    }
}

/// Drives the operator through the seed's story with the driver's (unrecorded) client.
async fn scenario(driver: &Client) {
    let memcacheds: Api<Memcached> = Api::default_namespaced(driver.clone());
    let deployments: Api<Deployment> = Api::default_namespaced(driver.clone());
    let services: Api<Service> = Api::default_namespaced(driver.clone());
    let apply = |size: i32| {
        let yaml = SEED_SAMPLE.replace("size: 3", &format!("size: {size}"));
        let mc: Memcached = serde_yaml::from_str(&yaml).expect("sample parses");
        let memcacheds = memcacheds.clone();
        async move {
            memcacheds
                .patch(
                    "memcached-sample",
                    &PatchParams::apply("kubectl"),
                    &Patch::Apply(&mc),
                )
                .await
                .expect("sample applies");
        }
    };
    let converged = |size: usize| {
        let memcacheds = memcacheds.clone();
        async move {
            wait_for(&format!("converged at {size}"), || async {
                let mc = memcacheds.get_opt("memcached-sample").await.ok()??;
                let status = mc.status.as_ref()?;
                (status.nodes.len() == size
                    && status.ready_replicas as usize == size
                    && status.observed_generation == mc.metadata.generation)
                    .then_some(())
            })
            .await
        }
    };

    // Create the seed sample; scale it.
    apply(3).await;
    converged(3).await;
    apply(5).await;
    converged(5).await;

    // Drift: someone scales the Deployment by hand; the operator puts it back.
    deployments
        .patch(
            "memcached-sample",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("drift applied");
    wait_for("drift repaired", || async {
        let d = deployments.get("memcached-sample").await.ok()?;
        (d.spec?.replicas == Some(5)).then_some(())
    })
    .await;

    // The Service is deleted; the operator recreates it.
    let uid = services
        .get("memcached-sample")
        .await
        .expect("Service exists")
        .metadata
        .uid;
    services
        .delete("memcached-sample", &DeleteParams::default())
        .await
        .expect("Service deleted");
    wait_for("Service recreated", || async {
        let s = services.get_opt("memcached-sample").await.ok()??;
        (s.metadata.uid != uid).then_some(())
    })
    .await;

    // Scaled below two pods, the PodDisruptionBudget is deleted.
    apply(1).await;
    converged(1).await;
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(driver.clone());
    wait_for("PodDisruptionBudget deleted", || async {
        pdbs.get_opt("memcached-sample")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    // SASL from a Secret: the operator reads it.
    let secrets: Api<Secret> = Api::default_namespaced(driver.clone());
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "memcached-auth"},
        "stringData": {"sasl-pwdb": "app:secret\n"}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret created");
    let secured: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "secured"},
        "spec": {"size": 1, "sasl": {"secretName": "memcached-auth"}}
    }))
    .expect("secured");
    memcacheds
        .patch(
            "secured",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&secured),
        )
        .await
        .expect("secured applies");
    wait_for("secured Deployment", || async {
        deployments.get_opt("secured").await.ok()??;
        Some(())
    })
    .await;

    // The exporter with the Prometheus Operator installed: a ServiceMonitor, removed again
    // when the exporter is switched off.
    let monitors: Api<DynamicObject> = Api::default_namespaced_with(
        driver.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
            "servicemonitors",
        ),
    );
    for enabled in [true, false] {
        let metered: Memcached = serde_json::from_value(json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "metered"},
            "spec": {"size": 1, "exporter": {"enabled": enabled}}
        }))
        .expect("metered");
        memcacheds
            .patch(
                "metered",
                &PatchParams::apply("kubectl"),
                &Patch::Apply(&metered),
            )
            .await
            .expect("metered applies");
        wait_for("ServiceMonitor follows the exporter", || async {
            let present = monitors.get_opt("metered").await.ok()?.is_some();
            (present == enabled).then_some(())
        })
        .await;
    }

    // The proxy switched on (its Deployment, Service, budget and ConfigMap, and the
    // deletion costs of the pool's pods) and off again (all four deleted).
    let config_maps: Api<ConfigMap> = Api::default_namespaced(driver.clone());
    let pool_pods: Api<Pod> = Api::default_namespaced(driver.clone());
    for enabled in [true, false] {
        let proxied: Memcached = serde_json::from_value(json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "proxied"},
            "spec": {"size": 2, "proxy": {"enabled": enabled}}
        }))
        .expect("proxied");
        memcacheds
            .patch(
                "proxied",
                &PatchParams::apply("kubectl"),
                &Patch::Apply(&proxied),
            )
            .await
            .expect("proxied applies");
        wait_for("the proxy's objects follow spec.proxy.enabled", || async {
            let d = deployments.get_opt("proxied-proxy").await.ok()?.is_some();
            let c = config_maps.get_opt("proxied-proxy").await.ok()?.is_some();
            let s = services.get_opt("proxied-proxy").await.ok()?.is_some();
            (d == enabled && c == enabled && s == enabled).then_some(())
        })
        .await;
        if enabled {
            wait_for("the pool's pods carry their deletion cost", || async {
                let pods = pool_pods
                    .list(&ListParams::default().labels("app.kubernetes.io/instance=proxied"))
                    .await
                    .ok()?;
                let costs = pods
                    .items
                    .iter()
                    .filter_map(|p| p.metadata.annotations.as_ref())
                    .filter(|a| a.contains_key(proxy::DELETION_COST_ANNOTATION))
                    .count();
                (costs == 2).then_some(())
            })
            .await;
        }
    }

    // A pod whose TLS reload agent reports a refused certificate is restarted (deleted).
    let secrets: Api<Secret> = Api::default_namespaced(driver.clone());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "certs"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "cert", "tls.key": "key"},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret created");
    let tls_pool: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "tls-pool"},
        "spec": {"size": 2, "tls": {"secretName": "certs"}, "rollout": {"minReadySeconds": 0}}
    }))
    .expect("tls-pool");
    memcacheds
        .patch(
            "tls-pool",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&tls_pool),
        )
        .await
        .expect("tls-pool applies");
    let pods: Api<Pod> = Api::default_namespaced(driver.clone());
    let victim = wait_for("the TLS pool ready", || async {
        let mc = memcacheds.get_opt("tls-pool").await.ok()??;
        let status = mc.status?;
        (status.ready_replicas == 2).then(|| status.nodes.first().cloned())?
    })
    .await;
    let refused = json!({"status": {"initContainerStatuses": [{
        "name": "tls-reload-agent", "ready": true, "restartCount": 1, "image": "x", "imageID": "",
        "lastState": {"terminated": {"exitCode": 3, "message": "refused"}},
    }]}});
    pods.patch_status(&victim, &PatchParams::default(), &Patch::Merge(&refused))
        .await
        .expect("pod status patched");
    wait_for("the pod with the refused reload restarted", || async {
        pods.get_opt(&victim).await.ok()?.is_none().then_some(())
    })
    .await;

    // The CR is deleted; its children go with it.
    memcacheds
        .delete("memcached-sample", &DeleteParams::default())
        .await
        .expect("CR deleted");
    wait_for("children garbage-collected", || async {
        deployments
            .get_opt("memcached-sample")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn every_request_of_the_operator_is_allowed_by_the_generated_roles() {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .build();
    let driver = server.client();
    Api::<CustomResourceDefinition>::all(driver.clone())
        .create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("CRD installs");
    // The Prometheus Operator's ServiceMonitor kind, so the exporter path is exercised.
    Api::<CustomResourceDefinition>::all(driver.clone())
        .create(&PostParams::default(), &common::service_monitor_crd())
        .await
        .expect("ServiceMonitor CRD installs");
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}})).expect("ns");
    Api::<Namespace>::all(driver.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    server.allow_token(
        "scraper-token",
        "system:serviceaccount:monitoring:prometheus",
        &["system:serviceaccounts"],
    );

    let log = Arc::new(Mutex::new(Vec::new()));
    let operator = Client::new(
        Recording {
            inner: server.service(),
            log: log.clone(),
        },
        OPERATOR_NAMESPACE,
    );

    // What `memcached-operator run --leader-elect` does with the API: check the CRD...
    crd::check_installed(&operator, None)
        .await
        .expect("CRD installed");
    // ... authenticate and authorize a metrics scrape (TokenReview, SubjectAccessReview) ...
    let auth = CachingAuthorizer::new(
        Arc::new(KubeAuthorizer::new(operator.clone())),
        Duration::from_secs(60),
    );
    let decision = auth
        .check("scraper-token", "get", "/metrics")
        .await
        .expect("reviews succeed");
    assert!(
        matches!(
            decision,
            Decision::Allowed | Decision::Forbidden(_) | Decision::Unauthenticated
        ),
        "{decision:?}"
    );
    // ... and run the controller while holding the Lease.
    let shutdown = CancellationToken::new();
    let election = LeaderElectionConfig {
        identity: "memcached-operator-test".into(),
        ..LeaderElectionConfig::new("memcached-operator.cache.example.com", OPERATOR_NAMESPACE)
    };
    let metrics = manager::Metrics::new();
    let task = {
        let (operator, shutdown) = (operator.clone(), shutdown.clone());
        tokio::spawn(async move {
            leader::run_as_leader(
                operator.clone(),
                Some(election),
                &metrics,
                shutdown,
                |leading: CancellationToken| async move {
                    controller::run(
                        operator,
                        ControllerConfig {
                            instance: Some("memcached-operator-test".into()),
                            ..ControllerConfig::default()
                        },
                        leading.cancelled_owned(),
                    )
                    .await;
                    Ok::<(), Infallible>(())
                },
            )
            .await
        })
    };

    scenario(&driver).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("operator stops")
        .expect("operator task")
        .expect("leader election ends cleanly");

    let requests: Vec<Request> = log.lock().expect("log").clone();
    let (cluster, namespaced) = generated_rules();

    // Every request, by (verb, group, resource, namespace).
    let mut seen: BTreeMap<(String, String, String, String), u64> = BTreeMap::new();
    let mut denied = BTreeSet::new();
    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    for req in &requests {
        for verb in checked_verbs(req) {
            *seen
                .entry((
                    verb.to_string(),
                    req.group.clone(),
                    req.resource.clone(),
                    req.namespace.clone(),
                ))
                .or_default() += 1;
            used.insert((verb.to_string(), req.group.clone(), req.resource.clone()));
            if !allowed(req, verb, &cluster, &namespaced) {
                denied.insert(format!(
                    "{verb} {}/{} in {:?}",
                    if req.group.is_empty() {
                        "core"
                    } else {
                        &req.group
                    },
                    req.resource,
                    req.namespace
                ));
            }
        }
    }
    let table: String = seen
        .iter()
        .map(|((v, g, r, ns), n)| format!("  {v:<8} {g:<32} {r:<22} {ns:<28} {n}\n"))
        .collect();
    println!("requests of the operator (verb, group, resource, namespace, count):\n{table}");
    assert!(
        denied.is_empty(),
        "the generated roles (crates/operator/src/rbac.rs) do not allow:\n  {}\nall requests:\n{table}",
        denied.into_iter().collect::<Vec<_>>().join("\n  ")
    );

    // The scenario exercised what it is meant to (else the check above proves little).
    for (verb, group, resource) in [
        ("list", memcached_api::GROUP, "memcacheds"),
        ("watch", memcached_api::GROUP, "memcacheds"),
        ("patch", memcached_api::GROUP, "memcacheds/status"),
        ("create", "apps", "deployments"),
        ("patch", "apps", "deployments"),
        ("create", "", "services"),
        ("watch", "", "pods"),
        ("delete", "", "pods"),
        ("create", "events.k8s.io", "events"),
        ("update", "coordination.k8s.io", "leases"),
        ("create", "authentication.k8s.io", "tokenreviews"),
        ("create", "authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(
            used.contains(&(verb.into(), group.into(), resource.into())),
            "the scenario never did {verb} {group}/{resource}:\n{table}"
        );
    }

    // Least privilege the other way: every verb the controller's ClusterRole grants was
    // used, or is needed without a request of its own.
    let needed_without_request: &[(&str, &str, &str, &str)] = &[
        (
            "update",
            memcached_api::GROUP,
            "memcacheds/finalizers",
            "OwnerReferencesPermissionEnforcement checks it for blockOwnerDeletion",
        ),
        (
            "patch",
            "events.k8s.io",
            "events",
            "a warning that repeats within 6 minutes is a series: a patch of the first event",
        ),
    ];
    let mut unused = vec![];
    for rule in rbac::manager_rules() {
        for group in rule.api_groups {
            for resource in rule.resources {
                for verb in rule.verbs {
                    let key = (verb.to_string(), group.to_string(), resource.to_string());
                    let excused = needed_without_request
                        .iter()
                        .any(|(v, g, r, _)| (*v, *g, *r) == (*verb, *group, *resource));
                    if !used.contains(&key) && !excused {
                        unused.push(format!("{verb} {group}/{resource}"));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "manager_rules() grant verbs the operator never used (remove them, or say why they are needed):\n  {}\n{table}",
        unused.join("\n  ")
    );
}
