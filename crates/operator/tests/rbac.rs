//! Least privilege, as the real API server decides it (kube-apiserver's RBAC authorizer at
//! the oldest and the newest pinned Kubernetes versions): the committed `config/rbac` roles
//! have no wildcard; the operator binary, run with nothing but the generated
//! ServiceAccount's token, converges every feature at once (the seed's sample, TLS, SASL,
//! the exporter with its ServiceMonitor, the proxy, extstore), repairs a hand-scaled
//! Deployment and a deleted Service, scales down, switches the exporter and the proxy off
//! (their children deleted) and restarts (deletes) a pod whose TLS reload failed; its
//! validating webhook, registered in the API server, dry-runs every Memcached's children
//! with that token, and its metrics endpoint reviews scrapers' tokens with it; the
//! server's audit log holds no refusal of that identity (by the user the server
//! authenticated) but the one request outside its roles this test makes on purpose; and
//! every verb the roles grant shows up in that log as a request of the binary (or is
//! listed below with the reason it is needed without a request of its own).
//!
//! (An earlier version of this test recorded the operator's requests to the in-memory API
//! server and judged them with the operator's own `rbac::allows`, which ignores
//! `resourceNames` and non-resource URLs, on a server that authorizes nothing. Both
//! directions are now judged by the real server: its authorizer for "allowed", its audit
//! log for "used".)

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envtest::{ControlPlane, Kube};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::cmd::USER_AGENT as OPERATOR_USER_AGENT;
use memcached_operator::proxy;
use memcached_operator::samples::SEED_SAMPLE;
use serde_json::{Value, json};

mod common;
use common::cluster::{apply_crd, service_account_token};
use common::process::{Operator, TempDir, free_port};
use common::{service_monitor_crd, wait_for_within};

/// How long pods may take to be scheduled and turn Ready on the shared, loaded machine.
const CONVERGE: Duration = Duration::from_secs(120);
/// The seed's sample's name (`memcached_operator::samples::SEED_SAMPLE`).
const SEED: &str = "memcached-sample";
/// The validating webhook's name in `config/webhook/manifests.yaml`, as the API server
/// quotes it when the webhook refuses.
const VALIDATING_WEBHOOK: &str = "vmemcached-v1.kb.io";

fn config_dir() -> PathBuf {
    envtest::repo_root().join("config")
}

/// Every YAML document of `path`, as JSON.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The committed `config/rbac` files, in their kustomization's order.
fn rbac_files() -> Vec<PathBuf> {
    let dir = config_dir().join("rbac");
    let kustomization = yaml_docs(&dir.join("kustomization.yaml"));
    kustomization[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|f| dir.join(f.as_str().expect("file name")))
        .collect()
}

#[test]
fn generated_roles_have_no_wildcards() {
    let mut rules = 0;
    for file in rbac_files() {
        for doc in yaml_docs(&file) {
            for rule in doc["rules"].as_array().into_iter().flatten() {
                rules += 1;
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
                            file.display()
                        );
                    }
                }
            }
        }
    }
    assert!(rules > 10, "config/rbac holds {rules} rules");
}

/// The objects of `config/rbac`, made this test's own: the `system` namespace becomes
/// `ns`, and cluster-scoped names (and references to them) get `ns` as a prefix so tests
/// and versions never share them.
fn generated_rbac(ns: &str) -> Vec<Value> {
    let mut out = vec![];
    for file in rbac_files() {
        for mut obj in yaml_docs(&file) {
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            if obj["metadata"]["namespace"] == "system" {
                obj["metadata"]["namespace"] = json!(ns);
            }
            if kind.starts_with("Cluster") {
                let name = obj["metadata"]["name"].as_str().expect("name").to_string();
                obj["metadata"]["name"] = json!(format!("{ns}-{name}"));
            }
            if obj["roleRef"]["kind"] == "ClusterRole" {
                let name = obj["roleRef"]["name"].as_str().expect("name").to_string();
                obj["roleRef"]["name"] = json!(format!("{ns}-{name}"));
            }
            for subject in obj["subjects"].as_array_mut().into_iter().flatten() {
                if subject["namespace"] == "system" {
                    subject["namespace"] = json!(ns);
                }
            }
            out.push(obj);
        }
    }
    out
}

async fn create_typed<K>(api: Api<K>, obj: &Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(obj.clone())
        .unwrap_or_else(|e| panic!("{}: {e}", obj["metadata"]["name"]));
    api.create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("creating {} {}: {e}", obj["kind"], obj["metadata"]["name"]));
}

async fn create_object(client: &Client, ns: &str, obj: &Value) {
    let c = client.clone();
    match obj["kind"].as_str().unwrap_or_default() {
        "ServiceAccount" => create_typed::<ServiceAccount>(Api::namespaced(c, ns), obj).await,
        "Role" => create_typed::<Role>(Api::namespaced(c, ns), obj).await,
        "RoleBinding" => create_typed::<RoleBinding>(Api::namespaced(c, ns), obj).await,
        "ClusterRole" => create_typed::<ClusterRole>(Api::all(c), obj).await,
        "ClusterRoleBinding" => create_typed::<ClusterRoleBinding>(Api::all(c), obj).await,
        "Secret" => create_typed::<Secret>(Api::namespaced(c, ns), obj).await,
        other => panic!("config/rbac has a {other}, which this test does not know"),
    }
}

async fn delete_cluster_scoped(client: &Client, objects: &[Value]) {
    for obj in objects {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let dp = DeleteParams::default();
        let _ = match obj["kind"].as_str().unwrap_or_default() {
            "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                .delete(name, &dp)
                .await
                .map(|_| ()),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                .delete(name, &dp)
                .await
                .map(|_| ()),
            _ => Ok(()),
        };
    }
}

/// Whether the API server allows `user` (in `groups`) `verb` on `resource` (`plural` or
/// `plural/subresource`) of `group` in `ns` (`name` as `resourceNames` sees it), asked by
/// the admin, so that the question is not itself a request of that user.
async fn allowed(
    admin: &Client,
    user: &str,
    groups: &[String],
    (verb, group, resource, ns, name): (&str, &str, &str, &str, &str),
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource,
                namespace: (!ns.is_empty()).then(|| ns.to_string()),
                name: (!name.is_empty()).then(|| name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

/// One request of the audit log.
#[derive(Clone, Debug)]
struct Logged {
    verb: String,
    group: String,
    /// `plural` or `plural/subresource`.
    resource: String,
    namespace: String,
    name: String,
    code: u16,
    user_agent: String,
    dry_run: bool,
}

impl Logged {
    /// Whether the operator binary made it (its `User-Agent`), rather than the test with
    /// the operator's token.
    fn by_operator(&self) -> bool {
        self.user_agent == OPERATOR_USER_AGENT
    }

    fn describe(&self) -> String {
        format!(
            "{} {}/{} {}/{} -> {} ({})",
            self.verb,
            if self.group.is_empty() {
                "core"
            } else {
                &self.group
            },
            self.resource,
            self.namespace,
            self.name,
            self.code,
            self.user_agent
        )
    }
}

/// Every request the API server logged for the user it authenticated as `username`
/// (whatever program made it), with the resource as its authorizer saw it.
fn audit_of(cp: &ControlPlane, username: &str) -> Vec<Logged> {
    cp.audit()
        .unwrap_or_else(|e| panic!("the audit log: {e}"))
        .into_iter()
        .filter(|r| r.username == username)
        .map(|r| {
            let resource = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            Logged {
                dry_run: r.is_dry_run(),
                verb: r.verb,
                group: r.api_group,
                resource,
                namespace: r.namespace,
                name: r.name,
                code: r.code,
                user_agent: r.user_agent,
            }
        })
        .collect()
}

/// The verbs the API server's authorizer checked for a logged request: a server-side
/// apply that creates its object (201) is authorized as `patch` and as `create`.
fn checked_verbs(r: &Logged) -> Vec<&str> {
    if r.verb == "patch" && r.code == 201 {
        vec!["patch", "create"]
    } else {
        vec![r.verb.as_str()]
    }
}

/// Grants that no request of the operator's shows, with why they are needed anyway.
const NEEDED_WITHOUT_A_REQUEST: &[(&str, &str, &str, &str)] = &[
    (
        "update",
        memcached_api::GROUP,
        "memcacheds/finalizers",
        "the API server's OwnerReferencesPermissionEnforcement checks it when a child is \
         created with blockOwnerDeletion",
    ),
    (
        "patch",
        "events.k8s.io",
        "events",
        "a warning that repeats within 6 minutes is a series: a patch of the first event",
    ),
];

/// What a grant is limited to: its role's name and kind, and the rule's first
/// `resourceNames` entry (empty when the rule names none).
#[derive(Clone, Debug)]
struct Grant {
    role: String,
    namespaced: bool,
    resource_name: String,
}

/// (verb, group, resource) each role of `rbac` grants, resource rules only.
fn grants(rbac: &[Value]) -> BTreeMap<(String, String, String), Grant> {
    let mut out = BTreeMap::new();
    for obj in rbac {
        let kind = obj["kind"].as_str().unwrap_or_default();
        if kind != "ClusterRole" && kind != "Role" {
            continue;
        }
        let role = obj["metadata"]["name"].as_str().unwrap_or_default();
        for rule in obj["rules"].as_array().into_iter().flatten() {
            let strings = |field: &str| -> Vec<String> {
                rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            };
            let grant = Grant {
                role: role.to_string(),
                namespaced: kind == "Role",
                resource_name: strings("resourceNames")
                    .into_iter()
                    .next()
                    .unwrap_or_default(),
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        out.insert((verb, group.clone(), resource.clone()), grant.clone());
                    }
                }
            }
        }
    }
    out
}

/// The operator's roles (those bound to its ServiceAccount) from `rbac`.
fn bound_to(rbac: &[Value], ns: &str, sa: &str) -> Vec<Value> {
    let bound: BTreeSet<(String, String)> =
        rbac.iter()
            .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
            .filter(|o| {
                o["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns
                })
            })
            .map(|o| {
                (
                    o["roleRef"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    o["roleRef"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
    rbac.iter()
        .filter(|o| {
            bound.contains(&(
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ))
        })
        .cloned()
        .collect()
}

/// A Memcached named `name` with `spec`.
fn memcached(name: &str, spec: Value) -> Memcached {
    serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The test's control plane, namespace and admin client, and the operator's identity.
struct Env {
    cp: &'static ControlPlane,
    admin: Client,
    ns: String,
    /// The operator's ServiceAccount as the API server names it.
    username: String,
}

impl Env {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    fn service_monitors(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            &self.ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
                "servicemonitors",
            ),
        )
    }

    /// The requests of the operator's identity the API server refused (401 or 403), from
    /// its audit log.
    fn refusals(&self) -> Vec<Logged> {
        audit_of(self.cp, &self.username)
            .into_iter()
            .filter(|r| r.code == 401 || r.code == 403)
            .collect()
    }

    /// Waits for `probe` as [`wait_for_within`] does, and fails at once, naming them, when
    /// the API server has refused the operator's identity anything (read from the audit
    /// log about once a second): a missing grant shows as what it is, not as a timeout.
    async fn until<T, F, Fut>(&self, what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let mut polls = 0u32;
        wait_for_within(what, CONVERGE, || {
            polls += 1;
            let look = polls.is_multiple_of(100);
            let next = probe();
            async move {
                if look {
                    let refused = self.refusals();
                    assert!(
                        refused.is_empty(),
                        "waiting for {what}: the API server refused the operator:\n  {}",
                        refused
                            .iter()
                            .map(Logged::describe)
                            .collect::<Vec<_>>()
                            .join("\n  ")
                    );
                }
                next.await
            }
        })
        .await
    }

    /// Applies the Memcached of `yaml` as `kubectl apply --server-side` would (admin).
    async fn apply_yaml(&self, yaml: &str) {
        let mc: Memcached = serde_yaml::from_str(yaml).expect("a Memcached");
        let name = mc.name_any();
        self.api::<Memcached>()
            .patch(
                &name,
                &PatchParams::apply("rbac-test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    /// Applies a Memcached as a user would (server-side apply, admin).
    async fn apply(&self, name: &str, spec: Value) {
        self.api::<Memcached>()
            .patch(
                name,
                &PatchParams::apply("rbac-test").force(),
                &Patch::Apply(&memcached(name, spec)),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    /// The ready pods named in `status.nodes` of `name` once it is Available with `size`
    /// of them at its current generation.
    async fn ready(&self, name: &str, size: usize) -> Option<Vec<String>> {
        let mc = self.api::<Memcached>().get_opt(name).await.ok().flatten()?;
        let available = mc.condition(condition::AVAILABLE)?.status == "True";
        let status = mc.status.as_ref()?;
        (available
            && status.ready_replicas as usize == size
            && status.nodes.len() == size
            && status.observed_generation == mc.metadata.generation)
            .then(|| status.nodes.clone())
    }

    /// Waits until `name` is Available with `size` ready pods named in `status.nodes`, at
    /// its current generation; returns those pods.
    async fn converged(&self, name: &str, size: usize) -> Vec<String> {
        self.until(&format!("{name} Available with {size} ready pods"), || {
            self.ready(name, size)
        })
        .await
    }

    async fn gone<K>(&self, what: &str, api: &Api<K>, name: &str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        self.until(&format!("{what} {name} deleted"), || async {
            api.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
}

/// The kubelet's record of the TLS reload agent's last run, as a pod status patch (see
/// `tls_reload.rs`): exit code 3 is memcached refusing the renewed certificate.
fn agent_ended(code: i32, message: &str) -> Value {
    json!({"status": {"initContainerStatuses": [{
        "name": "tls-reload-agent", "ready": true, "restartCount": 1, "started": true,
        "image": "tls-agent:latest", "imageID": "",
        "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}},
        "lastState": {"terminated": {"exitCode": code, "reason": "Error",
            "message": message,
            "startedAt": "2026-11-25T00:00:00Z", "finishedAt": "2026-11-25T00:00:01Z"}},
    }]}})
}

/// The feature matrix beside the seed's sample, converged by the operator: (name, size,
/// spec).
fn matrix() -> Vec<(&'static str, usize, Value)> {
    let fast = json!({"minReadySeconds": 0});
    vec![
        (
            "tls-pool",
            2,
            json!({"size": 2, "tls": {"secretName": "certs"}, "rollout": fast}),
        ),
        (
            "secured",
            1,
            json!({"size": 1, "sasl": {"secretName": "auth"}, "rollout": fast}),
        ),
        (
            "metered",
            1,
            json!({"size": 1, "exporter": {"enabled": true}, "rollout": fast}),
        ),
        (
            "proxied",
            2,
            json!({"size": 2, "proxy": {"enabled": true}, "rollout": fast}),
        ),
        (
            "extstored",
            1,
            json!({"size": 1, "extstore": {"enabled": true, "size": "256Mi"}, "rollout": fast}),
        ),
        (
            "fenced",
            1,
            json!({"size": 1, "rollout": fast,
                   "networkPolicy": {"enabled": true, "from": [{"namespaceSelector": {}}]}}),
        ),
        (
            "autoscaled",
            1,
            json!({"size": 1, "rollout": fast,
                   "autoscaling": {"maxReplicas": 3, "targetCPUUtilizationPercentage": 80}}),
        ),
    ]
}

/// `config/webhook`'s webhook configurations for the operator's webhook server on
/// 127.0.0.1:`port` (signed by the control plane's CA, as cert-manager's injection would
/// have it), named after and limited to the namespace `ns`.
fn webhook_configurations(
    ns: &str,
    port: u16,
    ca_pem: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let docs = yaml_docs(&config_dir().join("webhook/manifests.yaml"));
    let adapt = |kind: &str| -> Value {
        let mut doc = docs
            .iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in config/webhook/manifests.yaml"))
            .clone();
        let name = doc["metadata"]["name"].as_str().expect("name").to_string();
        doc["metadata"]["name"] = json!(format!("{ns}-{name}"));
        if let Some(meta) = doc["metadata"].as_object_mut() {
            meta.remove("annotations");
        }
        for hook in doc["webhooks"].as_array_mut().expect("webhooks") {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("service path")
                .to_string();
            hook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
            });
            hook["namespaceSelector"] = json!({
                "matchLabels": {"kubernetes.io/metadata.name": ns}
            });
        }
        doc
    };
    (
        serde_json::from_value(adapt("MutatingWebhookConfiguration")).expect("mutating"),
        serde_json::from_value(adapt("ValidatingWebhookConfiguration")).expect("validating"),
    )
}

/// `GET path` on the HTTPS server at `addr` (its self-signed certificate accepted) with a
/// bearer `token`: the status code and the body.
async fn https_get(addr: SocketAddr, path: &str, token: Option<String>) -> (u16, String) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert))
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("tls client");
        let sock = TcpStream::connect(addr).expect("connect");
        let mut stream = rustls::StreamOwned::new(conn, sock);
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
        )
        .expect("write request");
        let mut response = Vec::new();
        // A peer closing without close_notify shows as an error after the data.
        let _ = stream.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response).to_string();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (code, body)
    })
    .await
    .expect("the HTTPS request")
}

#[derive(Debug)]
struct AcceptAnyCert;

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

on_both_versions! {
/// The operator with nothing but the generated RBAC, across the feature matrix, judged by
/// the real API server: its authorizer refused that identity nothing but the one request
/// outside the roles made on purpose (403, named), and its audit log shows every verb the
/// roles grant in use.
async fn the_generated_rbac_is_all_the_operator_needs_across_the_feature_matrix(kube: Kube) {
    let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let admin = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    let ns = cp.namespace("rbac").await.unwrap_or_else(|e| panic!("namespace: {e}"));
    println!("{kube:?}: Kubernetes {} namespace {ns}", cp.version());
    apply_crd(&admin, &Memcached::crd()).await;
    apply_crd(&admin, &service_monitor_crd()).await;

    let dir = TempDir::new("rbac");

    // The generated RBAC, bound as config/rbac binds it.
    let rbac = generated_rbac(&ns);
    for obj in &rbac {
        create_object(&admin, &ns, obj).await;
    }
    let sa = rbac
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("config/rbac has the operator's ServiceAccount")
        .to_string();
    let username = format!("system:serviceaccount:{ns}:{sa}");
    let env = Env {
        cp,
        admin: admin.clone(),
        ns: ns.clone(),
        username: username.clone(),
    };
    let sa_groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_string(),
    ];
    let roles = bound_to(&rbac, &ns, &sa);
    let granted = grants(&roles);
    assert!(
        granted.contains_key(&("list".into(), memcached_api::GROUP.into(), "memcacheds".into())),
        "the roles bound to {sa}: {granted:?}"
    );
    // RBAC reaches the API server's authorizer through its informers: wait until it grants
    // every rule, so that no refusal below is one of propagation.
    wait_for_within("the API server grants the generated roles", CONVERGE, || async {
        for ((verb, group, resource), grant) in &granted {
            let scope = if grant.namespaced { ns.as_str() } else { "" };
            let name = grant.resource_name.as_str();
            if !allowed(&admin, &username, &sa_groups, (verb, group, resource, scope, name)).await {
                return None;
            }
        }
        Some(())
    })
    .await;

    let token = service_account_token(&admin, &ns, &sa).await;
    let kubeconfig = cp
        .kubeconfig_for_token(&format!("{ns}-operator"), &token)
        .expect("token kubeconfig");
    let sa_client = envtest::client_from_kubeconfig(&kubeconfig)
        .await
        .expect("client from the token kubeconfig");
    let whoami = Api::<SelfSubjectReview>::all(sa_client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    assert_eq!(
        whoami.status.and_then(|s| s.user_info).and_then(|u| u.username),
        Some(username.clone()),
        "the token is the ServiceAccount, as the API server sees it"
    );

    // The Secrets TLS and SASL name (the operator reads them; it may not write them).
    for secret in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "certs"},
               "type": "kubernetes.io/tls",
               "stringData": {"tls.crt": "not a certificate", "tls.key": "nor a key"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "auth"},
               "stringData": {"sasl-pwdb": "app:secret\n"}}),
    ] {
        create_object(&admin, &ns, &secret).await;
    }

    // The operator binary with that token only: the controller under leader election, the
    // admission webhooks (their children dry run on) and the secured metrics endpoint.
    let (cert, key) = cp
        .serving_cert(&["127.0.0.1", "localhost"])
        .expect("serving certificate");
    let cert_dir = dir.path().join("certs");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    std::fs::write(cert_dir.join("tls.crt"), cert).expect("write tls.crt");
    std::fs::write(cert_dir.join("tls.key"), key).expect("write tls.key");
    let webhook_port = free_port();
    let metrics_port = free_port();
    let mut op = Operator::spawn(
        &kubeconfig,
        dir.path(),
        "op-rbac",
        &[
            format!("--namespace={ns}"),
            "--leader-elect".into(),
            format!("--leader-election-namespace={ns}"),
            format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
            "--health-probe-bind-address=0".into(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
        ],
        &[("ENABLE_WEBHOOKS", "true")],
    );
    env.until("the operator leading", || {
        let leads = op.logs().contains("successfully acquired lease");
        async move { leads.then_some(()) }
    })
    .await;
    for port in [webhook_port, metrics_port] {
        let deadline = std::time::Instant::now() + CONVERGE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(op.exited().is_none(), "the operator exited:\n{}", op.logs());
            assert!(
                std::time::Instant::now() < deadline,
                "the operator does not listen on {port}:\n{}",
                op.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // The webhooks registered in the API server for this namespace, as config/webhook
    // registers them: every Memcached below is admitted by the validating webhook only
    // after the dry run of its children, which the webhook makes with the operator's
    // token (failure policy Fail: a dry run the API server refused would refuse it).
    let (mutating, validating) = webhook_configurations(&ns, webhook_port, cp.ca_pem());
    let webhook_names = [
        mutating.metadata.name.clone().expect("name"),
        validating.metadata.name.clone().expect("name"),
    ];
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .expect("the MutatingWebhookConfiguration");
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &validating)
        .await
        .expect("the ValidatingWebhookConfiguration");
    // The dry run finds what only Kubernetes' rules for the Deployment refuse.
    let bogus = memcached(
        "bogus",
        json!({"size": 1, "tolerations": [{"key": "k", "operator": "Bogus", "value": "v"}]}),
    );
    let refusal = env
        .until("the validating webhook's children dry run refuses a bogus toleration", || async {
            let dry = PostParams { dry_run: true, ..PostParams::default() };
            match env.api::<Memcached>().create(&dry, &bogus).await {
                Err(kube::Error::Api(status)) if status.message.contains(VALIDATING_WEBHOOK) => {
                    Some(status.message)
                }
                _ => None,
            }
        })
        .await;
    assert!(
        refusal.contains("spec.tolerations[0].operator") && refusal.contains("Bogus"),
        "{refusal}"
    );

    // Every feature converges, in one namespace at once.
    env.apply_yaml(SEED_SAMPLE).await;
    for (name, _, spec) in matrix() {
        env.apply(name, spec).await;
    }
    let mut pods = BTreeMap::new();
    pods.insert(SEED, env.converged(SEED, 3).await);
    for (name, size, _) in matrix() {
        pods.insert(name, env.converged(name, size).await);
    }
    env.until("the ServiceMonitor of the exporter", || async {
        env.service_monitors().get_opt("metered").await.ok()?.map(|_| ())
    })
    .await;
    let pool_pods = env.api::<Pod>();
    env.until("the proxy's objects and the pool's deletion costs", || async {
        env.api::<Deployment>().get_opt("proxied-proxy").await.ok()??;
        env.api::<ConfigMap>().get_opt("proxied-proxy").await.ok()??;
        env.api::<Service>().get_opt("proxied-proxy").await.ok()??;
        let costs = pool_pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=proxied"))
            .await
            .ok()?
            .items
            .iter()
            .filter(|p| p.annotations().contains_key(proxy::DELETION_COST_ANNOTATION))
            .count();
        (costs == 2).then_some(())
    })
    .await;

    // Day 2. A hand-scaled Deployment is put back.
    env.api::<Deployment>()
        .patch(SEED, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}})))
        .await
        .expect("drift applied");
    env.until("the Deployment's replicas repaired", || async {
        let d = env.api::<Deployment>().get(SEED).await.ok()?;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;
    // A deleted Service is recreated.
    let services = env.api::<Service>();
    let uid = services.get(SEED).await.expect("Service").uid();
    services.delete(SEED, &DeleteParams::default()).await.expect("Service deleted");
    env.until("the Service recreated", || async {
        let s = services.get_opt(SEED).await.ok()??;
        (s.uid() != uid).then_some(())
    })
    .await;
    // Scaled to one pod, the budget goes.
    env.apply_yaml(&SEED_SAMPLE.replace("size: 3", "size: 1")).await;
    env.converged(SEED, 1).await;
    env.gone("the budget", &env.api::<PodDisruptionBudget>(), SEED).await;
    // The exporter switched off: its ServiceMonitor goes.
    env.apply("metered", json!({"size": 1, "exporter": {"enabled": false}, "rollout": {"minReadySeconds": 0}}))
        .await;
    env.gone("the ServiceMonitor", &env.service_monitors(), "metered").await;
    // The proxy switched off: its Deployment, Service, budget and ConfigMap go.
    env.apply("proxied", json!({"size": 2, "proxy": {"enabled": false}, "rollout": {"minReadySeconds": 0}}))
        .await;
    env.gone("the proxy's Deployment", &env.api::<Deployment>(), "proxied-proxy").await;
    env.gone("the proxy's Service", &env.api::<Service>(), "proxied-proxy").await;
    env.gone("the proxy's budget", &env.api::<PodDisruptionBudget>(), "proxied-proxy").await;
    env.gone("the proxy's ConfigMap", &env.api::<ConfigMap>(), "proxied-proxy").await;
    // The NetworkPolicy switched off: it goes.
    env.apply("fenced", json!({"size": 1, "rollout": {"minReadySeconds": 0}})).await;
    env.gone(
        "the NetworkPolicy",
        &env.api::<k8s_openapi::api::networking::v1::NetworkPolicy>(),
        "fenced",
    )
    .await;
    // The autoscaled pool: its HPA targets the Memcached; an update that sizes it by hand
    // is refused by the webhook (which sees the old object through the API server); with
    // the autoscaler switched off the HPA goes and the size is the spec's again.
    type Hpa = k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let hpa = env
        .until("the HorizontalPodAutoscaler", || async {
            env.api::<Hpa>().get_opt("autoscaled").await.ok()?
        })
        .await;
    assert_eq!(
        hpa.spec.map(|s| s.scale_target_ref.kind),
        Some("Memcached".to_string())
    );
    let by_hand = env
        .api::<Memcached>()
        .patch(
            "autoscaled",
            &PatchParams::apply("rbac-test").force(),
            &Patch::Apply(&memcached(
                "autoscaled",
                json!({"size": 2, "rollout": {"minReadySeconds": 0},
                       "autoscaling": {"maxReplicas": 3, "targetCPUUtilizationPercentage": 80}}),
            )),
        )
        .await
        .expect_err("a size by hand under the autoscaler");
    assert!(by_hand.to_string().contains("spec.size"), "{by_hand}");
    env.apply("autoscaled", json!({"size": 2, "rollout": {"minReadySeconds": 0}})).await;
    env.gone("the HorizontalPodAutoscaler", &env.api::<Hpa>(), "autoscaled").await;
    env.converged("autoscaled", 2).await;
    // memcached refused a renewed certificate (the TLS reload agent's exit code 3, written
    // by the kubelet into the pod's status; here by the test, as in tls_reload.rs): the
    // operator restarts that pod, that is deletes it, and its Deployment replaces it.
    let victim = pods["tls-pool"][0].clone();
    let victim_uid = pool_pods.get(&victim).await.expect("the TLS pool's pod").uid();
    pool_pods
        .patch_status(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(&agent_ended(3, "memcached refused the certificate: key values mismatch")),
        )
        .await
        .expect("pod status patched");
    env.until("the pod with the refused reload deleted", || async {
        match pool_pods.get_opt(&victim).await.ok()? {
            None => Some(()),
            Some(p) => (p.uid() != victim_uid || p.metadata.deletion_timestamp.is_some())
                .then_some(()),
        }
    })
    .await;
    env.until("the TLS pool's replacement pod ready", || async {
        let nodes = env.ready("tls-pool", 2).await?;
        (!nodes.contains(&victim)).then_some(())
    })
    .await;

    // The metrics endpoint's TokenReview and SubjectAccessReview, made by the operator with
    // its token: a scraper bound to the generated metrics-reader role reads /metrics,
    // another account is refused, and a made-up token is nobody.
    for name in ["scraper", "nosy"] {
        create_object(&admin, &ns, &json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name}})).await;
    }
    let reader = rbac
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == format!("{ns}-metrics-reader"))
        .expect("config/rbac has the metrics-reader role");
    let scraper_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{ns}-metrics-scraper")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": reader["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}],
    });
    create_object(&admin, &ns, &scraper_binding).await;
    let scraper = format!("system:serviceaccount:{ns}:scraper");
    wait_for_within("the API server lets the scraper read /metrics", CONVERGE, || async {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(scraper.clone()),
                groups: Some(vec!["system:authenticated".into()]),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let r = Api::<SubjectAccessReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await
            .ok()?;
        r.status?.allowed.then_some(())
    })
    .await;
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let scraper_token = service_account_token(&admin, &ns, "scraper").await;
    let nosy_token = service_account_token(&admin, &ns, "nosy").await;
    let (code, body) = https_get(metrics, "/metrics", Some(scraper_token)).await;
    assert_eq!(code, 200, "the scraper reads /metrics: {body}");
    assert!(body.contains("controller_runtime_reconcile_total"), "{body}");
    let (code, body) = https_get(metrics, "/metrics", Some(nosy_token)).await;
    assert_eq!(code, 403, "an account without the metrics-reader role: {body}");
    let (code, body) = https_get(metrics, "/metrics", Some("made-up-token".into())).await;
    assert_eq!(code, 401, "a made-up token: {body}");

    // The CR deleted: its children go (kube-controller-manager's garbage collector).
    env.api::<Memcached>()
        .delete(SEED, &DeleteParams::default())
        .await
        .expect("CR deleted");
    env.gone("the Deployment", &env.api::<Deployment>(), SEED).await;

    assert!(op.exited().is_none(), "the operator exited:\n{}", op.logs());
    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());
    assert!(op.logs().contains("released leader lease"), "{}", op.logs());

    // One request outside the roles, with the operator's token: the API server refuses it,
    // naming it.
    let planted: Secret =
        serde_json::from_value(json!({"metadata": {"name": "planted"}})).expect("a Secret");
    let refused = Api::<Secret>::namespaced(sa_client.clone(), &ns)
        .create(&PostParams::default(), &planted)
        .await;
    let message = match refused {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            status.message
        }
        other => panic!("creating a Secret as the operator: expected 403, got {other:?}"),
    };
    assert!(
        message.contains(&format!("User \"{username}\" cannot create resource \"secrets\"")),
        "{message}"
    );

    // The audit log, by the user the API server authenticated: that refusal, and no other.
    let log = wait_for_within("the refused request in the audit log", CONVERGE, || async {
        let log = audit_of(cp, &username);
        log.iter()
            .any(|r| r.code == 403 && r.resource == "secrets" && r.verb == "create")
            .then_some(log)
    })
    .await;
    let mut table: BTreeMap<String, usize> = BTreeMap::new();
    for r in &log {
        let key = format!(
            "{:<8} {:<28} {:<26} {:<4} {}{}",
            r.verb,
            r.group,
            r.resource,
            r.code,
            if r.by_operator() { "operator" } else { "test's client" },
            if r.dry_run { " (dry run)" } else { "" }
        );
        *table.entry(key).or_default() += 1;
    }
    let table: String = table.iter().map(|(k, n)| format!("  {k} x{n}\n")).collect();
    println!("{kube:?}: requests of {username}:\n{table}");
    let refusals: Vec<String> = log
        .iter()
        .filter(|r| r.code == 401 || r.code == 403)
        .map(|r| {
            let planted = !r.by_operator()
                && r.verb == "create"
                && r.group.is_empty()
                && r.resource == "secrets"
                && r.name.is_empty();
            if planted {
                format!("create core/secrets {}/ -> {} (the planted request)", r.namespace, r.code)
            } else {
                r.describe()
            }
        })
        .collect();
    assert_eq!(
        refusals,
        [format!("create core/secrets {ns}/ -> 403 (the planted request)")],
        "the API server refused the operator's identity more than the planted request:\n{table}"
    );
    // A token the API server did not take has no user: the binary's requests without one.
    let unauthenticated: Vec<String> = cp
        .audit()
        .unwrap_or_else(|e| panic!("the audit log: {e}"))
        .into_iter()
        .filter(|r| r.code == 401 && r.user_agent.starts_with(OPERATOR_USER_AGENT))
        .map(|r| format!("{} {} {}", r.verb, r.request_uri, r.code))
        .collect();
    assert!(unauthenticated.is_empty(), "the operator's token was refused: {unauthenticated:?}");
    let by_operator = |verb: &str, group: &str, resource: &str, dry_run: bool| {
        log.iter().any(|r| {
            r.by_operator()
                && r.verb == verb
                && r.group == group
                && r.resource == resource
                && r.dry_run == dry_run
                && r.code < 300
        })
    };
    // The binary made them itself: the webhook's dry runs of every kind of child, and the
    // metrics endpoint's reviews.
    for (group, resource) in [
        ("apps", "deployments"),
        ("", "services"),
        ("policy", "poddisruptionbudgets"),
        ("", "configmaps"),
        ("monitoring.coreos.com", "servicemonitors"),
    ] {
        assert!(
            by_operator("patch", group, resource, true),
            "no dry run of {group}/{resource} by the webhook:\n{table}"
        );
    }
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(
            by_operator("create", group, resource, false),
            "no {group}/{resource} by the metrics endpoint:\n{table}"
        );
    }

    // Least privilege the other way: every verb the roles grant was used by the operator
    // binary (not counting dry runs), or is needed without a request of its own.
    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in log.iter().filter(|r| r.by_operator() && !r.dry_run && r.code != 403) {
        for verb in checked_verbs(r) {
            used.insert((verb.to_string(), r.group.clone(), r.resource.clone()));
        }
    }
    let unused: Vec<String> = granted
        .iter()
        .filter(|(key, _)| !used.contains(*key))
        .filter(|((verb, group, resource), _)| {
            !NEEDED_WITHOUT_A_REQUEST
                .iter()
                .any(|(v, g, r, _)| (*v, *g, *r) == (verb.as_str(), group.as_str(), resource.as_str()))
        })
        .map(|((verb, group, resource), grant)| {
            format!("{verb} {group}/{resource} ({})", grant.role)
        })
        .collect();
    assert!(
        unused.is_empty(),
        "the roles grant verbs the operator never used (remove them from rbac.rs, or say why \
         they are needed):\n  {}\n{table}",
        unused.join("\n  ")
    );
    // And the excuses still excuse something granted.
    for (verb, group, resource, why) in NEEDED_WITHOUT_A_REQUEST {
        let key = (verb.to_string(), group.to_string(), resource.to_string());
        assert!(
            granted.contains_key(&key),
            "{verb} {group}/{resource} is excused ({why}) but no longer granted"
        );
    }

    let mut cluster_scoped = rbac.clone();
    cluster_scoped.push(scraper_binding);
    delete_cluster_scoped(&admin, &cluster_scoped).await;
    let _ = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .delete(&webhook_names[0], &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .delete(&webhook_names[1], &DeleteParams::default())
        .await;
}
}
