//! The OLM bundle (`bundle/`, `bundle.Dockerfile`): what `memcached-operator bundle` writes,
//! valid for the pinned `operator-sdk bundle validate` (`make tools`) with the OperatorHub
//! validators, carrying the crate's version, and with a Deployment the real API server
//! accepts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use memcached_operator::olm;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
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
    for file in olm::render(memcached_operator::manifests::IMAGE_REPOSITORY).expect("renders") {
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
    olm::write(&tmp.0, memcached_operator::manifests::IMAGE_REPOSITORY).expect("writes");
    let mut csv = read_csv(&tmp.0);
    csv["metadata"]["annotations"]["categories"] = json!("Caching");
    std::fs::write(csv_path(&tmp.0), serde_yaml::to_string(&csv).expect("YAML")).expect("write");
    let (passed, stderr) = validate(&tmp.0, "suite=operatorframework");
    assert!(!passed, "accepted:\n{stderr}");
    assert!(stderr.contains("Caching"), "{stderr}");

    csv["metadata"]["annotations"]["categories"] = json!("Database");
    csv["spec"]["customresourcedefinitions"]["owned"][0]["kind"] = json!("Memcache");
    std::fs::write(csv_path(&tmp.0), serde_yaml::to_string(&csv).expect("YAML")).expect("write");
    let (passed, stderr) = validate(&tmp.0, "suite=operatorframework");
    assert!(!passed, "accepted:\n{stderr}");
    assert!(stderr.contains("Memcache"), "{stderr}");
}

/// One version for the binary, the image tag and the bundle.
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

/// The real API server takes the CSV under OLM's own schema, and the Deployment it
/// declares (a server-side dry run); OLM mounts the webhook certificate where the operator
/// looks by default.
#[tokio::test]
async fn the_real_server_accepts_the_csv_and_its_deployment() {
    let cp = envtest::ControlPlane::shared(envtest::Kube::Oldest).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let ns = cp.namespace("olm").await.expect("namespace");
    let csv = read_csv(&repo());

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = olm_csv_crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    if crds.get_opt(&name).await.expect("get").is_none() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("OLM's CSV CRD");
    }
    let established = |c: &CustomResourceDefinition| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !established(&crds.get(&name).await.expect("get")) {
        assert!(
            std::time::Instant::now() < deadline,
            "{name} not Established"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion");
    let csvs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
    let mut object: DynamicObject = serde_json::from_value(csv.clone()).expect("a CSV");
    object.metadata.namespace = Some(ns.clone());
    csvs.create(&PostParams::default(), &object)
        .await
        .expect("the real server accepts the CSV under OLM's schema");

    let spec = &csv["spec"]["install"]["spec"]["deployments"][0];
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": spec["name"], "labels": spec["label"]},
        "spec": spec["spec"],
    }))
    .expect("a Deployment");
    let api: Api<Deployment> = Api::namespaced(client, &ns);
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &deployment,
    )
    .await
    .expect("the real server accepts the CSV's Deployment");
    assert_eq!(
        memcached_operator::webhook::DEFAULT_CERT_DIR,
        "/tmp/k8s-webhook-server/serving-certs",
        "where OLM mounts the webhook certificate"
    );
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

/// `make release-manifests VERSION=…` writes the whole operator with the release image (for
/// the manager and the TLS reload agent), and refuses a version that is not the crate's.
#[test]
fn release_manifests_carry_the_one_version() {
    let tmp = TempDir::new("release");
    let version = env!("CARGO_PKG_VERSION");
    let (ok, out) = make_release(&tmp.0, version);
    assert!(ok, "{out}");
    let yaml = std::fs::read_to_string(tmp.0.join("install.yaml")).expect("install.yaml");
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
    assert_eq!(agent, Some(json!(image)));
    for kind in [
        "CustomResourceDefinition",
        "ClusterRole",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(objects.iter().any(|o| o["kind"] == kind), "no {kind}");
    }
    assert!(!yaml.contains("controller:latest"));

    let (ok, out) = make_release(&tmp.0, "9.9.9");
    assert!(!ok);
    assert!(out.contains("9.9.9") && out.contains(version), "{out}");
}
