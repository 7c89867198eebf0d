//! The committed `config/` tree is exactly what `memcached-operator-gen manifests` writes,
//! and what `kubectl kustomize` builds from it is accepted by the (in-memory) API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use memcached_operator::webhook;
use memcached_operator_gen::manifests;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[path = "../../operator/tests/common/foreign_crds.rs"]
mod foreign_crds;

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config")
}

/// Every file under `dir`, by path relative to `dir`.
fn read_tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root").to_path_buf();
                out.insert(rel, std::fs::read(&path).expect("readable"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "memcached-operator-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn committed_config_is_what_manifests_writes() {
    let tmp = TempDir::new("manifests");
    manifests::write(&tmp.0).expect("manifests writes");
    let generated = read_tree(&tmp.0);
    let committed = read_tree(&config_dir());
    let mut problems = vec![];
    for (path, content) in &generated {
        match committed.get(path) {
            None => problems.push(format!("config/{} is missing", path.display())),
            Some(c) if c != content => {
                problems.push(format!("config/{} differs from the code", path.display()))
            }
            Some(_) => {}
        }
    }
    for path in committed.keys() {
        if !generated.contains_key(path) {
            problems.push(format!(
                "config/{} is not generated (delete it, or generate it in manifests.rs)",
                path.display()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "config/ is out of date with the code; run `make manifests` and commit the result:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn writing_twice_changes_nothing() {
    let tmp = TempDir::new("manifests-twice");
    assert!(!manifests::write(&tmp.0).expect("writes").is_empty());
    assert!(manifests::write(&tmp.0).expect("writes").is_empty());
}

/// `kubectl kustomize <dir>` as JSON objects, with the pinned kubectl (`make controlplane`).
fn kustomize(dir: &str) -> Vec<Value> {
    kustomize_path(&config_dir().join(dir))
}

fn kustomize_path(path: &std::path::Path) -> Vec<Value> {
    let dir = path.display();
    let kubectl = envtest::kubectl_path().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("utf-8");
    let mut objects = vec![];
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("kustomize output is YAML");
        if !v.is_null() {
            objects.push(v);
        }
    }
    objects
}

/// The manager's image and the one it gives the TLS reload agent (`TLS_AGENT_IMAGE`).
fn manager_and_agent_images(objects: &[Value]) -> (Value, Option<Value>) {
    let deployment = find(
        objects,
        "Deployment",
        "memcached-operator-controller-manager",
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "TLS_AGENT_IMAGE"))
        .map(|e| e["value"].clone());
    (container["image"].clone(), env)
}

/// The TLS reload agent has a kustomize image of its own (`tls-agent`, the operator's
/// default `--tls-agent-image`): the README's overlay of config/default (GitOps) sets it
/// and the manager's apart with `images:` (the pinned kubectl's kustomize).
#[test]
fn the_reload_agent_has_an_image_of_its_own() {
    let (image, agent) = manager_and_agent_images(&kustomize("default"));
    assert_eq!(image, manifests::IMAGE_PLACEHOLDER);
    assert_eq!(agent, Some(json!(manifests::TLS_AGENT_IMAGE_PLACEHOLDER)));
    assert_eq!(
        manifests::TLS_AGENT_IMAGE_PLACEHOLDER,
        memcached_operator::builders::DEFAULT_TLS_AGENT_IMAGE
    );

    let readme = std::fs::read_to_string(config_dir().join("../README.md")).expect("README.md");
    let overlay_yaml = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(yaml, _)| yaml.to_string()))
        .find(|yaml| yaml.contains("name: tls-agent"))
        .expect("README.md shows an overlay setting the tls-agent image")
        .replace("<registry>", "registry.example.com:5000/team");
    let overlay_value: Value = serde_yaml::from_str(&overlay_yaml).expect("YAML");
    let wanted = |name: &str| {
        overlay_value["images"]
            .as_array()
            .and_then(|images| images.iter().find(|i| i["name"] == name))
            .map(|i| {
                format!(
                    "{}:{}",
                    i["newName"].as_str().unwrap_or(""),
                    i["newTag"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_else(|| panic!("the README's overlay sets no {name} image"))
    };
    let tmp = TempDir::new("agent-image");
    manifests::write(&tmp.0.join("config")).expect("writes");
    let overlay = tmp.0.join("overlay");
    std::fs::create_dir_all(&overlay).expect("mkdir");
    std::fs::write(overlay.join("kustomization.yaml"), &overlay_yaml).expect("write");
    let (image, agent) = manager_and_agent_images(&kustomize_path(&overlay));
    assert_eq!(image, json!(wanted("controller")));
    assert_eq!(agent, Some(json!(wanted("tls-agent"))));
    assert!(wanted("tls-agent").starts_with("registry.example.com:5000/team/"));
}

/// `make deploy IMG=... TLS_AGENT_IMG=...` applies config/default with the operator's image
/// and the agent's, each where it belongs (kubectl's `apply` replaced by a script that keeps
/// what it was given; `kustomize` is the pinned kubectl's).
#[test]
fn make_deploy_sets_the_managers_and_the_agents_images() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("make-deploy");
    let kubectl = envtest::kubectl_path().unwrap_or_else(|e| panic!("{e}"));
    let applied = tmp.0.join("applied.yaml");
    let script = tmp.0.join("kubectl");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$1\" = kustomize ]; then exec '{}' \"$@\"; fi\ncat > '{}'\n",
            kubectl.display(),
            applied.display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new("make")
        .current_dir(config_dir().join(".."))
        // config/ is the committed tree (committed_config_is_what_manifests_writes).
        .args(["-s", "-o", "manifests", "deploy"])
        .arg("IMG=registry.example.com/memcached-operator:v1.2.3")
        .arg("TLS_AGENT_IMG=registry.example.com/memcached-operator-tls-agent:0.4.0")
        .arg(format!("KUBECTL={}", script.display()))
        .output()
        .unwrap_or_else(|e| panic!("make (apt-get install make): {e}"));
    assert!(
        out.status.success(),
        "make deploy failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(&applied).expect("make deploy applied nothing");
    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect();
    assert!(
        objects
            .iter()
            .any(|o| o["kind"] == "CustomResourceDefinition"),
        "make deploy applies the whole of config/default"
    );
    let (image, agent) = manager_and_agent_images(&objects);
    assert_eq!(image, "registry.example.com/memcached-operator:v1.2.3");
    assert_eq!(
        agent,
        Some(json!(
            "registry.example.com/memcached-operator-tls-agent:0.4.0"
        ))
    );
}

/// Deserializes into the k8s-openapi type and back: a field the type does not know (a typo
/// in the generator, or in a patch) would be lost and fail the comparison.
fn round_trips<T: DeserializeOwned + Serialize>(obj: &Value) {
    let typed: T = serde_json::from_value(obj.clone())
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", describe(obj)));
    let back = serde_json::to_value(&typed).expect("serializes");
    if let Some(path) = first_difference(obj, &back, String::new()) {
        panic!(
            "{}: `{path}` does not survive the k8s-openapi round trip (unknown field?)",
            describe(obj)
        );
    }
}

/// Where `a` and `b` first differ (numbers compared by value: YAML's `1` is JSON's `1.0`).
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => (x.as_f64() != y.as_f64()).then_some(path),
        (Value::Object(x), Value::Object(y)) => {
            // Each key once: visiting shared keys from both sides would double the work at
            // every level (exponential in the depth of the CRD schema).
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    format!("{path}.{k}"),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, format!("{path}[{i}]"))),
        _ => (a != b).then_some(path),
    }
}

fn check_schema(obj: &Value) {
    match obj["kind"].as_str().unwrap_or("") {
        "Namespace" => round_trips::<Namespace>(obj),
        "CustomResourceDefinition" => round_trips::<CustomResourceDefinition>(obj),
        "ServiceAccount" => round_trips::<ServiceAccount>(obj),
        "Role" => round_trips::<Role>(obj),
        "ClusterRole" => round_trips::<ClusterRole>(obj),
        "RoleBinding" => round_trips::<RoleBinding>(obj),
        "ClusterRoleBinding" => round_trips::<ClusterRoleBinding>(obj),
        "Service" => round_trips::<Service>(obj),
        "Deployment" => round_trips::<Deployment>(obj),
        "NetworkPolicy" => round_trips::<NetworkPolicy>(obj),
        "MutatingWebhookConfiguration" => round_trips::<MutatingWebhookConfiguration>(obj),
        "ValidatingWebhookConfiguration" => round_trips::<ValidatingWebhookConfiguration>(obj),
        _ => {}
    }
}

fn describe(obj: &Value) -> String {
    format!(
        "{} {}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Kinds in the manifests that apisim does not serve, as minimal CRDs: cert-manager's
/// Issuer and Certificate and the Prometheus Operator's ServiceMonitor (NetworkPolicy is
/// one of apisim's built-in kinds, as of a real cluster's).
fn extra_crds() -> Vec<Value> {
    foreign_crds::cert_manager_and_prometheus()
}

async fn resource(client: &Client, obj: &Value) -> (ApiResource, bool) {
    let (group, version) = match obj["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .split_once('/')
    {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            obj["apiVersion"].as_str().unwrap_or("").to_string(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, obj["kind"].as_str().expect("kind"));
    let (ar, caps) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the API server does not serve {gvk:?}: {e}"));
    (ar, caps.scope == Scope::Namespaced)
}

/// Creates `obj` (server-side dry run first, then for real) and reads it back.
async fn create(client: &Client, obj: &Value) {
    let (ar, namespaced) = resource(client, obj).await;
    let api: Api<DynamicObject> = if namespaced {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_else(|| panic!("{} has no namespace", describe(obj)));
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        assert!(
            obj["metadata"]["namespace"].is_null(),
            "{} is cluster-scoped but has a namespace",
            describe(obj)
        );
        Api::all_with(client.clone(), &ar)
    };
    let dynamic: DynamicObject = serde_json::from_value(obj.clone()).expect("object");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry_run, &dynamic)
        .await
        .unwrap_or_else(|e| panic!("dry run of {} rejected: {e}", describe(obj)));
    api.create(&PostParams::default(), &dynamic)
        .await
        .unwrap_or_else(|e| panic!("{} rejected: {e}", describe(obj)));
    let name = obj["metadata"]["name"].as_str().expect("name");
    api.get(name)
        .await
        .unwrap_or_else(|e| panic!("{} not readable after create: {e}", describe(obj)));
}

/// Creates the objects in the order `kubectl apply` needs: Namespaces and CRDs first.
async fn create_all(client: &Client, objects: &[Value]) {
    let rank = |o: &Value| match o["kind"].as_str() {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        _ => 2,
    };
    let mut sorted: Vec<&Value> = objects.iter().collect();
    sorted.sort_by_key(|o| rank(o));
    for obj in sorted {
        check_schema(obj);
        create(client, obj).await;
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("kustomize output has no {kind} {name}"))
}

#[tokio::test]
async fn config_default_builds_and_the_api_server_accepts_every_object() {
    let default = kustomize("default");
    let (prometheus, grafana, network_policy, samples) = (
        kustomize("prometheus"),
        kustomize("grafana"),
        kustomize("network-policy"),
        kustomize("samples"),
    );
    // The dashboards: one ConfigMap each, labelled for Grafana's sidecar, holding the JSON.
    assert_eq!(grafana.len(), 3, "{grafana:?}");
    for cm in &grafana {
        assert_eq!(cm["kind"], "ConfigMap");
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
        let data = cm["data"].as_object().expect("data");
        for json in data.values() {
            let model: Value = serde_json::from_str(json.as_str().expect("text")).expect("JSON");
            assert!(model["panels"].as_array().is_some_and(|p| !p.is_empty()));
        }
    }

    // What a fresh Kubebuilder project's `make deploy` yields, by kind.
    let mut kinds: Vec<&str> = default.iter().filter_map(|o| o["kind"].as_str()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "Certificate",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Issuer",
            "MutatingWebhookConfiguration",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingWebhookConfiguration",
        ]
    );
    for obj in &default {
        let name = obj["metadata"]["name"].as_str().unwrap_or("");
        match obj["kind"].as_str() {
            Some("Namespace") => assert_eq!(name, manifests::NAMESPACE),
            Some("CustomResourceDefinition") => {}
            _ => assert!(name.starts_with("memcached-operator-"), "{}", describe(obj)),
        }
        if !obj["metadata"]["namespace"].is_null() {
            assert_eq!(obj["metadata"]["namespace"], manifests::NAMESPACE);
        }
    }
    let deployment = find(
        &default,
        "Deployment",
        "memcached-operator-controller-manager",
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "controller:latest");
    assert_eq!(
        pod["serviceAccountName"],
        "memcached-operator-controller-manager"
    );
    assert_eq!(
        container["volumeMounts"][0]["mountPath"],
        "/tmp/k8s-webhook-server/serving-certs"
    );
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "webhook-server-cert"
    );
    let certificate = find(&default, "Certificate", "memcached-operator-serving-cert");
    assert_eq!(
        certificate["spec"]["dnsNames"],
        json!([
            "memcached-operator-webhook-service.memcached-operator-system.svc",
            "memcached-operator-webhook-service.memcached-operator-system.svc.cluster.local",
        ])
    );
    assert_eq!(
        certificate["spec"]["issuerRef"]["name"],
        "memcached-operator-selfsigned-issuer"
    );
    // The names the webhook module expects once deployed (namePrefix included).
    for (kind, name, path) in [
        (
            "MutatingWebhookConfiguration",
            webhook::MUTATING_CONFIGURATION_NAME,
            webhook::MUTATE_PATH,
        ),
        (
            "ValidatingWebhookConfiguration",
            webhook::VALIDATING_CONFIGURATION_NAME,
            webhook::VALIDATE_PATH,
        ),
    ] {
        let config = find(&default, kind, name);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "memcached-operator-system/memcached-operator-serving-cert"
        );
        assert_eq!(
            config["webhooks"][0]["clientConfig"]["service"],
            json!({
                "name": "memcached-operator-webhook-service",
                "namespace": "memcached-operator-system",
                "path": path,
                "port": 443,
            })
        );
    }
    let binding = find(
        &default,
        "ClusterRoleBinding",
        "memcached-operator-manager-rolebinding",
    );
    assert_eq!(
        binding["roleRef"]["name"],
        "memcached-operator-manager-role"
    );
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "memcached-operator-controller-manager", "namespace": "memcached-operator-system"})
    );

    let server = apisim::ApiServer::new();
    let client = server.client();
    create_all(&client, &extra_crds()).await;
    create_all(&client, &default).await;
    // The optional overlays, as config/default would yield them with the same namespace.
    let in_namespace = |objects: Vec<Value>| {
        objects
            .into_iter()
            .map(|mut o| {
                o["metadata"]["namespace"] = json!(manifests::NAMESPACE);
                o
            })
            .collect::<Vec<_>>()
    };
    create_all(&client, &in_namespace(prometheus)).await;
    create_all(&client, &in_namespace(grafana)).await;
    create_all(&client, &in_namespace(network_policy)).await;
    create_all(&client, &in_namespace(samples)).await;
    let sample = server
        .get_object(
            "memcached.cache.example.com/v1",
            "memcacheds",
            Some(manifests::NAMESPACE),
            "memcached-sample",
        )
        .expect("the sample is stored");
    assert_eq!(sample["spec"]["size"], 3);
    // The CRD's default applied by the API server.
    assert_eq!(sample["spec"]["containerPort"], 11211);
}

/// The manager Deployment's args are accepted by `memcached-operator run` and mean what
/// the manifests assume (ports of the probes, the metrics Service and the NetworkPolicy).
#[test]
fn manager_args_parse_as_the_run_command() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Run(Box<memcached_operator::cmd::RunArgs>),
    }
    let deployment = manifests::manager_deployment().expect("renders");
    let container = &deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec")
        .containers[0];
    let args = container.args.clone().expect("args");
    assert_eq!(args, manifests::manager_args());
    let cli = Cli::try_parse_from(std::iter::once("memcached-operator".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the Deployment's args do not parse: {e}"));
    let Sub::Run(run) = cli.command;
    assert!(run.leader_elect);
    assert_eq!(
        run.metrics_bind_address,
        format!(":{}", manifests::METRICS_PORT)
    );
    assert!(run.metrics_secure);
    assert_eq!(
        run.health_probe_bind_address,
        format!(":{}", manifests::HEALTH_PORT)
    );
}

/// The kubelet kills the manager `terminationGracePeriodSeconds` after SIGTERM; the
/// committed Deployment gives it longer than the `--graceful-shutdown-timeout` its args
/// run with (the flag's default unless they set it) plus what `run` does after it (up to
/// 2 s for the servers) and some margin, so a graceful shutdown is never cut short.
#[test]
fn the_pod_grace_period_outlasts_the_graceful_shutdown_timeout() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Run(Box<memcached_operator::cmd::RunArgs>),
    }
    let yaml = std::fs::read_to_string(config_dir().join("manager/manager.yaml"))
        .expect("config/manager/manager.yaml");
    let deployment = serde_yaml::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .find(|doc| doc["kind"] == "Deployment")
        .expect("a Deployment in config/manager/manager.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .map(std::time::Duration::from_secs)
        .expect("terminationGracePeriodSeconds is set");
    let args = pod["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string").to_string());
    let cli = Cli::try_parse_from(std::iter::once("memcached-operator".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the Deployment's args do not parse: {e}"));
    let Sub::Run(run) = cli.command;
    let needed = run.graceful_shutdown_timeout + std::time::Duration::from_secs(5);
    assert!(
        grace >= needed,
        "terminationGracePeriodSeconds {grace:?} is shorter than --graceful-shutdown-timeout \
         {:?} and 5s after it",
        run.graceful_shutdown_timeout
    );
}

/// The oldest supported Kubernetes is one number in three places: the operator's start-up
/// check, the API types it is built with (k8s-openapi's feature in the workspace
/// Cargo.toml) and the oldest control plane the tests run on (`hack/controlplane`).
#[test]
fn the_oldest_supported_kubernetes_is_the_api_types_and_the_oldest_tested() {
    let (major, minor) = memcached_operator::crd::OLDEST_SUPPORTED_KUBERNETES;
    let cargo = std::fs::read_to_string(config_dir().join("../Cargo.toml")).expect("Cargo.toml");
    let feature = format!("\"v{major}_{minor}\"");
    let line = cargo
        .lines()
        .find(|l| l.starts_with("k8s-openapi"))
        .expect("k8s-openapi in the workspace");
    assert!(
        line.contains(&feature),
        "k8s-openapi feature {feature}: {line}"
    );
    let oldest = &envtest::pinned_kube_versions().expect("pins")[0];
    assert_eq!((oldest.major, oldest.minor), (major, minor));
}
