//! The OLM bundle (`bundle/`, `bundle.Dockerfile`): what `memcached-operator-gen bundle`
//! writes, valid for the pinned `operator-sdk bundle validate` (`make tools`) with the
//! OperatorHub validators, carrying the crate's version, and with a Deployment the real API
//! server accepts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use envtest::Kube;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use memcached_api::{Memcached, condition};
use memcached_operator_gen::{manifests, olm};
use serde_json::{Value, json};

#[path = "../../operator/tests/common/mod.rs"]
mod common;
use common::cluster::{apply_crd, service_account_token};
use common::process::{Operator, TempDir};
use common::wait_for_within;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `operator-sdk bundle validate <root>/bundle` with the optional validators `selector`:
/// whether it passed, and what it printed (on stdout or stderr).
fn validate(root: &Path, selector: &str) -> (bool, String) {
    let sdk = envtest::tool_path("operator-sdk").unwrap_or_else(|e| panic!("{e}"));
    let out: Output = Command::new(&sdk)
        .current_dir(root)
        .args([
            "bundle",
            "validate",
            "./bundle",
            "--select-optional",
            selector,
        ])
        .args(["--optional-values=k8s-version=1.33"])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", sdk.display()));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn csv_path(root: &Path) -> PathBuf {
    root.join(format!(
        "bundle/manifests/{}.clusterserviceversion.yaml",
        olm::PACKAGE
    ))
}

fn read_csv(root: &Path) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(csv_path(root)).expect("CSV")).expect("YAML")
}

#[test]
fn committed_bundle_is_what_bundle_writes() {
    let mut stale = vec![];
    for file in olm::render(memcached_operator_gen::manifests::IMAGE_REPOSITORY).expect("renders") {
        let committed = std::fs::read_to_string(repo().join(&file.path)).ok();
        if committed.as_deref() != Some(file.content.as_str()) {
            stale.push(file.path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date with the code ({}); run `make bundle`",
        stale.join(", ")
    );
}

/// The OperatorHub validators (operator-framework suite: operatorhub v2, capabilities,
/// categories, deprecated APIs, good practices; and the older `operatorhub`) find no error.
#[test]
fn operator_sdk_validates_the_bundle_for_operatorhub() {
    for selector in ["suite=operatorframework", "name=operatorhub"] {
        let (passed, stderr) = validate(&repo(), selector);
        assert!(passed, "{selector}:\n{stderr}");
        assert!(!stderr.contains("level=error"), "{selector}:\n{stderr}");
        assert!(
            stderr.contains("All validation tests have completed successfully"),
            "{selector}:\n{stderr}"
        );
    }
}

/// The validation can fail: a category OperatorHub does not list, or a CSV without its
/// owned CRD's kind, is refused, naming what is wrong.
#[test]
fn operator_sdk_refuses_a_broken_bundle() {
    let tmp = TempDir::new("olm-broken");
    let root = tmp.path();
    olm::write(root, memcached_operator_gen::manifests::IMAGE_REPOSITORY).expect("writes");
    let mut csv = read_csv(root);
    csv["metadata"]["annotations"]["categories"] = json!("Caching");
    std::fs::write(csv_path(root), serde_yaml::to_string(&csv).expect("YAML")).expect("write");
    let (passed, stderr) = validate(root, "suite=operatorframework");
    assert!(!passed, "accepted:\n{stderr}");
    assert!(stderr.contains("Caching"), "{stderr}");

    csv["metadata"]["annotations"]["categories"] = json!("Database");
    csv["spec"]["customresourcedefinitions"]["owned"][0]["kind"] = json!("Memcache");
    std::fs::write(csv_path(root), serde_yaml::to_string(&csv).expect("YAML")).expect("write");
    let (passed, stderr) = validate(root, "suite=operatorframework");
    assert!(!passed, "accepted:\n{stderr}");
    assert!(stderr.contains("Memcache"), "{stderr}");
}

/// One version for the binary, the image tag and the bundle; the TLS reload agent's image
/// (in the operator's environment and the related images, for mirroring) carries the
/// agent's own.
#[test]
fn the_bundle_carries_the_crates_version() {
    let csv = read_csv(&repo());
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(csv["spec"]["version"], version);
    assert_eq!(
        csv["metadata"]["name"],
        format!("memcached-operator.v{version}")
    );
    let image = format!("example.com/memcached-operator:{version}");
    assert_eq!(csv["metadata"]["annotations"]["containerImage"], image);
    let container = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"]
        [0];
    assert_eq!(container["image"], image);
    let agent_image = format!(
        "example.com/memcached-operator-tls-agent:{}",
        manifests::TLS_AGENT_VERSION
    );
    let agent = container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "TLS_AGENT_IMAGE"))
        .map(|e| e["value"].clone());
    assert_eq!(agent, Some(json!(agent_image)));
    let related: Vec<&Value> = csv["spec"]["relatedImages"]
        .as_array()
        .expect("relatedImages")
        .iter()
        .map(|r| &r["image"])
        .collect();
    for image in [&image, &agent_image] {
        assert!(
            related.contains(&&json!(image)),
            "{image} not in {related:?}"
        );
    }
}

/// OLM's own CRD of ClusterServiceVersions, from the operator-framework/api module the
/// pinned operator-sdk is built with (`make tools` downloads it).
fn olm_csv_crd() -> CustomResourceDefinition {
    let tools = repo().join("hack/tools/operator-sdk");
    let out = Command::new("go")
        .current_dir(&tools)
        .args([
            "list",
            "-m",
            "-f",
            "{{.Dir}}",
            "github.com/operator-framework/api",
        ])
        .output()
        .unwrap_or_else(|e| panic!("go (needed to find OLM's CRDs; `make tools`): {e}"));
    assert!(
        out.status.success(),
        "go list github.com/operator-framework/api in {} failed (run `make tools`): {}",
        tools.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let yaml =
        std::fs::read_to_string(dir.join("crds/operators.coreos.com_clusterserviceversions.yaml"))
            .expect("OLM's ClusterServiceVersion CRD");
    serde_yaml::from_str(&yaml).expect("a CRD")
}

/// The real API server takes the CSV under OLM's own schema.
#[tokio::test]
async fn the_real_server_accepts_the_csv() {
    let cp = envtest::ControlPlane::shared(Kube::Oldest).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let ns = cp.namespace("olm").await.expect("namespace");
    apply_crd(&client, &olm_csv_crd()).await;
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion");
    let csvs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
    let mut object: DynamicObject = serde_json::from_value(read_csv(&repo())).expect("a CSV");
    object.metadata.namespace = Some(ns.clone());
    csvs.create(&PostParams::default(), &object)
        .await
        .expect("the real server accepts the CSV under OLM's schema");
}

// ---------------------------------------------------------------------------------------
// The operator as OLM installs it

/// What OLM makes of the CSV's `install.spec` in the operator's namespace: the
/// ServiceAccounts its permissions name, a Role and RoleBinding for each `permissions`
/// entry, a ClusterRole and ClusterRoleBinding for each `clusterPermissions` entry (named
/// after the operator's namespace, so the tests sharing a server do not collide), and the Deployment with the OperatorGroup's
/// `olm.targetNamespaces` annotation on its pod template. Returns the ServiceAccount.
async fn install_like_olm(client: &Client, csv: &Value, operator_ns: &str, target: &str) -> String {
    let install = &csv["spec"]["install"]["spec"];
    let mut accounts = vec![];
    for (i, p) in permission_sets(csv, "permissions").iter().enumerate() {
        let sa = p["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName");
        accounts.push(sa.to_string());
        ensure_service_account(client, operator_ns, sa).await;
        let name = format!("csv-permissions-{i}");
        create_role_in(client, operator_ns, operator_ns, &name, p).await;
    }
    for (i, p) in permission_sets(csv, "clusterPermissions")
        .iter()
        .enumerate()
    {
        let sa = p["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName");
        accounts.push(sa.to_string());
        ensure_service_account(client, operator_ns, sa).await;
        let name = format!("{operator_ns}-csv-cluster-permissions-{i}");
        create_cluster_role(client, &name, operator_ns, p, &[]).await;
    }
    accounts.dedup();
    assert_eq!(
        accounts.len(),
        1,
        "one ServiceAccount for every permission: {accounts:?}"
    );

    let spec = &install["deployments"][0];
    let mut deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": spec["name"], "labels": spec["label"]},
        "spec": spec["spec"],
    }))
    .expect("a Deployment");
    if let Some(template) = deployment.spec.as_mut().map(|s| &mut s.template) {
        template
            .metadata
            .get_or_insert_default()
            .annotations
            .get_or_insert_default()
            .insert("olm.targetNamespaces".into(), target.into());
    }
    Api::<Deployment>::namespaced(client.clone(), operator_ns)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("the real server accepts the CSV's Deployment");
    accounts.remove(0)
}

fn permission_sets(csv: &Value, key: &str) -> Vec<Value> {
    csv["spec"]["install"]["spec"][key]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn ensure_service_account(client: &Client, ns: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    if api.get_opt(name).await.expect("get").is_none() {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("SA");
        api.create(&PostParams::default(), &sa)
            .await
            .expect("ServiceAccount");
    }
}

fn subjects(operator_ns: &str, permission: &Value) -> Value {
    json!([{
        "kind": "ServiceAccount",
        "name": permission["serviceAccountName"],
        "namespace": operator_ns,
    }])
}

/// A Role with the permission's rules in `ns`, bound to its ServiceAccount in
/// `operator_ns` (OLM's own Role, and its copy in a target namespace).
async fn create_role_in(client: &Client, ns: &str, operator_ns: &str, name: &str, p: &Value) {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": p["rules"],
    }))
    .expect("Role");
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("the real server takes the CSV's permissions as a Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects(operator_ns, p),
    }))
    .expect("RoleBinding");
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
}

/// A ClusterRole with the permission's rules and `extra` rules, bound cluster-wide.
async fn create_cluster_role(
    client: &Client,
    name: &str,
    operator_ns: &str,
    p: &Value,
    extra: &[Value],
) {
    let mut rules = p["rules"].as_array().cloned().unwrap_or_default();
    rules.extend(extra.iter().cloned());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": rules,
    }))
    .expect("ClusterRole");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("the real server takes the CSV's permissions as a ClusterRole");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects(operator_ns, p),
    }))
    .expect("ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("ClusterRoleBinding");
}

async fn delete_cluster_roles(client: &Client, names: &[String]) {
    for name in names {
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }
}

/// The CSV container's flags, with the metrics and probe listeners off (the operator runs
/// on this machine, next to other tests).
fn csv_args(csv: &Value) -> Vec<String> {
    csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"]
        [0]["args"]
        .as_array()
        .expect("the container's args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| *a != "run")
        .map(|a| {
            if a.starts_with("--metrics-bind-address=") {
                "--metrics-bind-address=0".to_string()
            } else if a.starts_with("--health-probe-bind-address=") {
                "--health-probe-bind-address=0".to_string()
            } else {
                a.to_string()
            }
        })
        .collect()
}

/// The seed's sample in `ns`, applied by the admin.
async fn apply_sample(client: &Client, ns: &str) -> String {
    let sample: Value =
        serde_yaml::from_str(memcached_operator::samples::SEED_SAMPLE).expect("the seed sample");
    let name = sample["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    Api::<Memcached>::namespaced(client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply("olm-test"),
            &Patch::Apply(&sample),
        )
        .await
        .expect("apply the seed's sample");
    name
}

/// Waits until the Memcached `name` in `ns` is Available with three pods in status.nodes.
async fn converged(client: &Client, ns: &str, name: &str, op: &Operator) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    wait_for_within(
        &format!("{ns}/{name} Available with 3 pods in status.nodes"),
        Duration::from_secs(90),
        || async {
            let mc = api.get_opt(name).await.ok().flatten()?;
            let available = mc.condition(condition::AVAILABLE)?.status == "True";
            let nodes = mc.status.as_ref()?.nodes.len();
            (available && nodes == 3).then_some(())
        },
    )
    .await;
    let logs = op.logs();
    assert!(
        !logs.contains("forbidden") && !logs.contains("Forbidden"),
        "the operator was refused something:\n{logs}"
    );
}

/// What OLM does with the bundle, done by hand on the real control plane (no OLM runs
/// here), and the operator run with only that identity:
/// * the CSV's Deployment runs under the ServiceAccount OLM creates for its permissions
///   (the ReplicaSet controller makes the pod; a missing account would stop it), with
///   `WATCH_NAMESPACE` from `olm.targetNamespaces`;
/// * SingleNamespace (OperatorGroup targeting one namespace): OLM copies the CSV's
///   `permissions` into the target namespace; the operator converges the seed's sample
///   there and never touches another namespace's Memcached;
/// * AllNamespaces (`olm.targetNamespaces` empty): OLM lifts `permissions` to a
///   ClusterRole; the operator then converges the other namespace's Memcached too.
async fn runs_as_olm_installs_it(kube: Kube) {
    let cp = envtest::ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let csv = read_csv(&repo());
    let crd: CustomResourceDefinition = serde_yaml::from_str(
        &std::fs::read_to_string(
            repo().join("bundle/manifests/memcached.cache.example.com_memcacheds.yaml"),
        )
        .expect("the bundle's CRD"),
    )
    .expect("a CRD");
    apply_crd(&client, &crd).await;
    let operator_ns = cp.namespace("olm-operator").await.expect("namespace");
    let target = cp.namespace("olm-target").await.expect("namespace");
    let other = cp.namespace("olm-other").await.expect("namespace");

    let sa = install_like_olm(&client, &csv, &operator_ns, &target).await;
    let deployment = csv["spec"]["install"]["spec"]["deployments"][0]["name"]
        .as_str()
        .expect("deployment name")
        .to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &operator_ns);
    let pod = wait_for_within(
        &format!("a pod of {deployment} (the ReplicaSet could not create one)"),
        Duration::from_secs(60),
        || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&deployment))
                })
        },
    )
    .await;
    let pod_spec = pod.spec.expect("pod spec");
    assert_eq!(pod_spec.service_account_name.as_deref(), Some(sa.as_str()));
    let watch = pod_spec.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "WATCH_NAMESPACE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(
        watch.as_deref(),
        Some("metadata.annotations['olm.targetNamespaces']")
    );

    // SingleNamespace: the permissions copied into the target namespace.
    for (i, p) in permission_sets(&csv, "permissions").iter().enumerate() {
        create_role_in(
            &client,
            &target,
            &operator_ns,
            &format!("csv-permissions-{i}"),
            p,
        )
        .await;
    }
    let dir = TempDir::new("olm-run");
    let kubeconfig = cp
        .kubeconfig_for_token(
            &format!("{operator_ns}-sa"),
            &service_account_token(&client, &operator_ns, &sa).await,
        )
        .expect("token kubeconfig");
    let args = csv_args(&csv);
    let mut op = Operator::spawn(
        &kubeconfig,
        dir.path(),
        "olm-single-namespace",
        &args,
        &[
            ("WATCH_NAMESPACE", &target),
            ("POD_NAMESPACE", &operator_ns),
        ],
    );
    let in_target = apply_sample(&client, &target).await;
    let in_other = apply_sample(&client, &other).await;
    converged(&client, &target, &in_target, &op).await;
    let untouched = Api::<Memcached>::namespaced(client.clone(), &other)
        .get(&in_other)
        .await
        .expect("get");
    assert!(
        untouched.status.is_none(),
        "a SingleNamespace operator reconciled {other}: {:?}",
        untouched.status
    );
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &other)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "a SingleNamespace operator created a Deployment in {other}"
    );
    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());

    // AllNamespaces: the permissions lifted to a ClusterRole (OLM adds namespaces view).
    let mut lifted = vec![];
    for (i, p) in permission_sets(&csv, "permissions").iter().enumerate() {
        let name = format!("{operator_ns}-csv-permissions-{i}");
        let namespaces_view = json!({
            "apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"],
        });
        create_cluster_role(&client, &name, &operator_ns, p, &[namespaces_view]).await;
        lifted.push(name);
    }
    let mut op = Operator::spawn(
        &kubeconfig,
        dir.path(),
        "olm-all-namespaces",
        &args,
        &[("WATCH_NAMESPACE", ""), ("POD_NAMESPACE", &operator_ns)],
    );
    converged(&client, &other, &in_other, &op).await;
    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());

    lifted.extend(
        (0..permission_sets(&csv, "clusterPermissions").len())
            .map(|i| format!("{operator_ns}-csv-cluster-permissions-{i}")),
    );
    delete_cluster_roles(&client, &lifted).await;
    Api::<Deployment>::namespaced(client, &operator_ns)
        .delete(&deployment, &DeleteParams::default())
        .await
        .expect("delete the CSV's Deployment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_olm_installs_it_on_the_oldest_kubernetes() {
    runs_as_olm_installs_it(Kube::Oldest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_olm_installs_it_on_the_newest_kubernetes() {
    runs_as_olm_installs_it(Kube::Newest).await;
}

fn make_release(dir: &Path, version: &str) -> (bool, String) {
    let kubectl = envtest::kubectl_path().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new("make")
        .current_dir(repo())
        .arg("-s")
        .arg("release-manifests")
        .arg(format!("VERSION={version}"))
        .arg(format!("KUBECTL={}", kubectl.display()))
        .arg(format!("RELEASE_DIR={}", dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("make (apt-get install make): {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `make release-manifests VERSION=…` writes the whole operator with the release images: the
/// manager's tagged with the crate's version, the TLS reload agent's tagged with its own
/// (crates/tls-agent/Cargo.toml, which the Makefile reads as the generator does); and it
/// refuses a version that is not the crate's.
#[test]
fn release_manifests_carry_the_one_version() {
    let tmp = TempDir::new("release");
    let version = env!("CARGO_PKG_VERSION");
    let (ok, out) = make_release(tmp.path(), version);
    assert!(ok, "{out}");
    let yaml = std::fs::read_to_string(tmp.path().join("install.yaml")).expect("install.yaml");
    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .collect();
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the operator's Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let image = format!("example.com/memcached-operator:{version}");
    assert_eq!(container["image"], image);
    let agent = container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "TLS_AGENT_IMAGE"))
        .map(|e| e["value"].clone());
    assert_eq!(
        agent,
        Some(json!(format!(
            "example.com/memcached-operator-tls-agent:{}",
            manifests::TLS_AGENT_VERSION
        )))
    );
    for kind in [
        "CustomResourceDefinition",
        "ClusterRole",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(objects.iter().any(|o| o["kind"] == kind), "no {kind}");
    }
    assert!(!yaml.contains("controller:latest"));
    assert!(!yaml.contains(manifests::TLS_AGENT_IMAGE_PLACEHOLDER));

    let (ok, out) = make_release(tmp.path(), "9.9.9");
    assert!(!ok);
    assert!(out.contains("9.9.9") && out.contains(version), "{out}");
}
