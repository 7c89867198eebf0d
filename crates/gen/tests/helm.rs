//! The Helm chart (`charts/memcached-operator`) with the pinned helm (`make tools`): it is
//! what `memcached-operator-gen helm-chart` writes, `helm lint` passes, bad values are
//! refused naming the value, the rendered objects equal what `kubectl kustomize` builds
//! from `config/` (the README's narrowing of the webhook port included), and `helm install`
//! / `upgrade` / `uninstall` work against the real control plane (the operator's pod need
//! not run: kwok nodes run no containers).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use memcached_api::Memcached;
use memcached_operator_gen::{helm, manifests};
use serde_json::{Value, json};

#[path = "../../operator/tests/common/mod.rs"]
mod common;
use common::process::TempDir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart_dir() -> PathBuf {
    repo().join("charts/memcached-operator")
}

/// The pinned helm, with its own config, cache and data directories.
fn helm(home: &Path) -> Command {
    let helm = envtest::tool_path("helm").unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(helm);
    for (var, dir) in [
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join(dir));
    }
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn yaml_objects(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// `helm template` of the committed chart as release `memcached-operator` in
/// `memcached-operator-system` (kustomize's namePrefix and namespace).
fn template(home: &Path, sets: &[&str]) -> Vec<Value> {
    let mut cmd = helm(home);
    cmd.args(["template", "memcached-operator"])
        .arg(chart_dir())
        .args(["--namespace", "memcached-operator-system"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    yaml_objects(&ok(&mut cmd))
}

#[test]
fn committed_chart_is_what_helm_chart_writes() {
    let mut problems = vec![];
    for file in helm::render().expect("renders") {
        let committed = std::fs::read_to_string(chart_dir().join(&file.path)).ok();
        if committed.as_deref() != Some(file.content.as_str()) {
            problems.push(file.path.display().to_string());
        }
    }
    assert!(
        problems.is_empty(),
        "charts/memcached-operator is out of date with the code ({}); run `make manifests`",
        problems.join(", ")
    );
}

/// One version for the binary (`--version`), the image tag and the chart; the TLS reload
/// agent's image is its own, tagged with the agent's version, and set apart from the
/// operator's.
#[test]
fn chart_and_image_carry_the_crates_version() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("YAML");
    // The operator's binary says which version it is.
    let out = ok(Command::new(common::process::bin()).arg("--version"));
    assert_eq!(
        out.trim(),
        format!(
            "memcached-operator {}",
            chart["appVersion"].as_str().unwrap_or_default()
        )
    );
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    let tmp = TempDir::new("helm-version");
    let objects = template(tmp.path(), &[]);
    let deployment = find(
        &objects,
        "Deployment",
        "memcached-operator-controller-manager",
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        format!(
            "example.com/memcached-operator:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(
        agent_image(container),
        Some(json!(format!(
            "example.com/memcached-operator-tls-agent:{}",
            manifests::TLS_AGENT_VERSION
        )))
    );

    let objects = template(
        tmp.path(),
        &[
            "image.repository=registry.example.com/memcached-operator",
            "image.tag=v1.2.3",
            "tlsAgent.image.repository=registry.example.com/memcached-operator-tls-agent",
            "tlsAgent.image.tag=0.4.0",
        ],
    );
    let deployment = find(
        &objects,
        "Deployment",
        "memcached-operator-controller-manager",
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/memcached-operator:v1.2.3"
    );
    assert_eq!(
        agent_image(container),
        Some(json!(
            "registry.example.com/memcached-operator-tls-agent:0.4.0"
        ))
    );
}

/// The image the operator gives the TLS reload agent (`TLS_AGENT_IMAGE`).
fn agent_image(container: &Value) -> Option<Value> {
    container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "TLS_AGENT_IMAGE"))
        .map(|e| e["value"].clone())
}

#[test]
fn helm_lint_passes_for_every_feature_combination() {
    let tmp = TempDir::new("helm-lint");
    for sets in [
        vec![],
        vec!["webhook.certManager.enabled=true"],
        vec!["webhook.enabled=false", "metrics.enabled=false"],
        vec![
            "networkPolicy.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "watchNamespaces={team-a,team-b}",
            "replicaCount=2",
            "serviceAccount.create=false",
            "serviceAccount.name=ops-operator",
            "crds.install=false",
        ],
        vec![
            "prometheusRule.enabled=true",
            "prometheusRule.labels.release=kube-prometheus-stack",
            "prometheusRule.thresholds.downFor=5m",
            "dashboards.enabled=true",
            "dashboards.annotations.grafana_folder=Memcached",
        ],
    ] {
        let mut cmd = helm(tmp.path());
        cmd.args(["lint", "--strict"]).arg(chart_dir());
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = ok(&mut cmd);
        assert!(out.contains("0 chart(s) failed"), "{sets:?}: {out}");
    }
}

/// values.schema.json (and the chart's own check) refuse bad values before anything is
/// rendered, naming the value.
#[test]
fn bad_values_are_refused_naming_the_value() {
    let tmp = TempDir::new("helm-bad");
    for (set, expected) in [
        ("replicaCont=2", "replicaCont"),
        ("replicaCount=-1", "replicaCount"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("tlsAgent.image.tag=", "tlsAgent/image/tag"),
        ("tlsAgent.image.pullPolicy=Always", "pullPolicy"),
        // base64 of a PEM instead of the PEM.
        (
            "webhook.certificate.ca=LS0tLS1CRUdJTg==",
            "webhook/certificate/ca",
        ),
        (
            "webhook.certificate.existingSecret=Not_A_Name",
            "existingSecret",
        ),
        (
            "webhook.certificate.crt=-----BEGIN CERTIFICATE-----",
            "webhook.certificate.crt and webhook.certificate.key",
        ),
        (
            "webhook.certificate.existingSecret=mine",
            "webhook.certificate.ca",
        ),
        (
            "webhook.certificate.ca=-----BEGIN CERTIFICATE-----",
            "webhook.certificate.ca needs",
        ),
        (
            "webhook.certificate.existingSecret=mine,webhook.certificate.ca=-----BEGIN CERTIFICATE-----,webhook.certManager.enabled=true",
            "webhook.certificate and webhook.certManager.enabled",
        ),
        ("metrics.port=70000", "port"),
        ("webhook.certManger.enabled=true", "certManger"),
        ("tolerations[0].effect=1", "effect"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("watchNamespaces={team-a,team-a}", "watchNamespaces"),
        ("watchNamespaces={\"\"}", "watchNamespaces"),
        (
            "networkPolicy.webhookFrom[0].ipBlock.except={10.0.0.0/8}",
            "cidr",
        ),
        ("serviceAccount.create=false", "serviceAccount.name"),
        (
            "metrics.enabled=false,metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.enabled needs metrics.enabled",
        ),
    ] {
        let mut cmd = helm(tmp.path());
        cmd.args(["template", "x"])
            .arg(chart_dir())
            .args(["--set", set]);
        let out = run(&mut cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(stderr.contains(expected), "{set}: {stderr}");
    }
    let mut cmd = helm(tmp.path());
    cmd.args(["template", "x"]).arg(chart_dir()).args([
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
    ]);
    let out = run(&mut cmd);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs leaderElection.enabled"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Kubernetes names of at most 63 characters (a Service's is a DNS label) for any release
/// name: the chart cuts its prefix, never the part that tells objects apart.
#[test]
fn long_release_names_give_valid_distinct_names() {
    let tmp = TempDir::new("helm-long");
    let long = "a".repeat(70);
    for sets in [
        vec![format!("fullnameOverride={long}")],
        vec![format!("nameOverride={long}")],
    ] {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let mut all = sets.clone();
        all.extend([
            "networkPolicy.enabled=true",
            "metrics.serviceMonitor.enabled=true",
        ]);
        let objects = template(tmp.path(), &all);
        let mut names = std::collections::BTreeSet::new();
        for o in &objects {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            assert!(
                !name.is_empty() && name.len() <= 63 && !name.ends_with('-'),
                "{sets:?}: {} {name:?}",
                o["kind"]
            );
            assert!(
                names.insert((o["kind"].to_string(), name.to_string())),
                "{sets:?}: two {} named {name}",
                o["kind"]
            );
        }
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// What only Helm adds: its labels (kustomize's `managed-by: kustomize` goes with them),
/// the CRD's keep policy, and the image pull policy config/ leaves to the API server.
fn without_tool_marks(mut v: Value) -> Value {
    if let Some(labels) = v["metadata"]["labels"].as_object_mut() {
        for key in [
            "helm.sh/chart",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        ] {
            labels.remove(key);
        }
        if labels.is_empty() {
            v["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }
    }
    if let Some(annotations) = v["metadata"]["annotations"].as_object_mut() {
        annotations.remove("helm.sh/resource-policy");
        if annotations.is_empty() {
            v["metadata"]
                .as_object_mut()
                .map(|m| m.remove("annotations"));
        }
    }
    // kustomize writes an emptied map as null.
    if let Some(meta) = v["metadata"].as_object_mut() {
        meta.retain(|_, value| !value.is_null());
    }
    if let Some(containers) = v["spec"]["template"]["spec"]["containers"].as_array_mut() {
        for c in containers {
            c.as_object_mut().map(|c| c.remove("imagePullPolicy"));
        }
    }
    v
}

fn by_kind_and_name(objects: Vec<Value>) -> BTreeMap<(String, String), Value> {
    objects
        .into_iter()
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            (key, without_tool_marks(o))
        })
        .collect()
}

fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = envtest::kubectl_path().unwrap_or_else(|e| panic!("{e}"));
    yaml_objects(&ok(Command::new(kubectl).arg("kustomize").arg(dir)))
}

/// The chart with cert-manager, the ServiceMonitor, the alerts, the dashboards and the
/// NetworkPolicies renders exactly the objects kustomize builds from config/default plus
/// config/prometheus, config/grafana and config/network-policy (under config/default's namespace and prefix), but the Namespace
/// (Helm's `--create-namespace`).
#[test]
fn rendered_objects_equal_kustomizes() {
    let tmp = TempDir::new("helm-vs-kustomize");
    let overlay = tmp.path().join("overlay");
    std::fs::create_dir_all(&overlay).expect("mkdir");
    // kustomize takes relative paths only: the overlay next to a config/ tree (what
    // `manifests` writes, which is the committed tree: tests/manifests.rs).
    let config = tmp.path().join("config");
    manifests::write(&config).expect("writes config/");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        serde_yaml::to_string(&json!({
            "namespace": manifests::NAMESPACE,
            "namePrefix": manifests::NAME_PREFIX,
            "resources": ["../config/prometheus", "../config/grafana", "../config/network-policy"],
        }))
        .expect("YAML"),
    )
    .expect("write");
    let mut expected = kustomize(&config.join("default"));
    expected.extend(kustomize(&overlay));
    expected.retain(|o| o["kind"] != "Namespace");
    // The chart names the certificate's Secret after the release, so that two releases in
    // a namespace do not share it; kustomize's has the tree's namespace to itself.
    let secret = format!(
        "{}{}",
        manifests::NAME_PREFIX,
        manifests::WEBHOOK_CERT_SECRET
    );
    for o in expected.iter_mut() {
        if o["kind"] == "Certificate" {
            o["spec"]["secretName"] = json!(secret);
        }
        if o["kind"] == "Deployment" {
            o["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] = json!(secret);
        }
    }
    let expected = by_kind_and_name(expected);

    let actual = by_kind_and_name(template(
        tmp.path(),
        &[
            "webhook.certManager.enabled=true",
            "networkPolicy.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "prometheusRule.enabled=true",
            "dashboards.enabled=true",
            // config/'s image placeholders.
            "image.repository=controller",
            "image.tag=latest",
            "tlsAgent.image.repository=tls-agent",
            "tlsAgent.image.tag=latest",
        ],
    ));
    let keys = |m: &BTreeMap<(String, String), Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&actual), keys(&expected), "different objects");
    for (key, want) in &expected {
        if let Some(path) = first_difference(&actual[key], want, String::new()) {
            panic!(
                "{key:?} differs at {path}:\nhelm: {}\nkustomize: {}",
                pointer(&actual[key], &path),
                pointer(want, &path)
            );
        }
    }
}

/// The README's kustomize overlay narrowing the webhook port to the API server's
/// addresses: the YAML block that patches `/spec/ingress/0/from`.
fn readme_overlay() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(yaml, _)| yaml.to_string()))
        .find(|yaml| yaml.contains("path: /spec/ingress/0/from"))
        .expect("README.md shows the kustomize patch of the webhook's NetworkPolicy")
}

/// The webhook port narrowed to the API server's addresses as the README says: its
/// kustomize overlay and the chart's `networkPolicy.webhookFrom` give the same
/// NetworkPolicy, admitting only that peer to the webhook port and leaving the metrics
/// policy as it was; the real API server accepts it.
#[tokio::test]
async fn the_webhook_port_narrows_to_the_api_server_with_kustomize_and_helm() {
    let tmp = TempDir::new("helm-webhook-from");
    let config = tmp.path().join("config");
    manifests::write(&config).expect("writes config/");
    // As the README says: ../network-policy added to config/default's resources.
    let default = config.join("default/kustomization.yaml");
    let mut kustomization: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&default).expect("read")).expect("YAML");
    kustomization["resources"]
        .as_array_mut()
        .expect("resources")
        .push(json!("../network-policy"));
    std::fs::write(
        &default,
        serde_yaml::to_string(&kustomization).expect("YAML"),
    )
    .expect("write");
    let overlay = tmp.path().join("overlay");
    std::fs::create_dir_all(&overlay).expect("mkdir");
    std::fs::write(overlay.join("kustomization.yaml"), readme_overlay()).expect("write");
    let built = by_kind_and_name(kustomize(&overlay));

    let mut cmd = helm(tmp.path());
    cmd.args(["template", "memcached-operator"])
        .arg(chart_dir())
        .args(["--namespace", "memcached-operator-system"])
        .args(["--set", "networkPolicy.enabled=true"])
        .args([
            "--set-json",
            r#"networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"10.0.0.10/32"}}]"#,
        ]);
    let rendered = by_kind_and_name(yaml_objects(&ok(&mut cmd)));

    for name in [
        "memcached-operator-allow-webhook-traffic",
        "memcached-operator-allow-metrics-traffic",
    ] {
        let key = ("NetworkPolicy".to_string(), name.to_string());
        let (helm, kustomize) = (&rendered[&key], &built[&key]);
        if let Some(path) = first_difference(helm, kustomize, String::new()) {
            panic!(
                "{name} differs at {path}:\nhelm: {}\nkustomize: {}",
                pointer(helm, &path),
                pointer(kustomize, &path)
            );
        }
    }
    let webhook = &rendered[&(
        "NetworkPolicy".to_string(),
        "memcached-operator-allow-webhook-traffic".to_string(),
    )];
    assert_eq!(
        webhook["spec"]["ingress"],
        json!([{
            "from": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
            "ports": [{"port": 9443, "protocol": "TCP"}],
        }])
    );

    let cp = envtest::ControlPlane::shared(envtest::Kube::Newest).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let ns = cp.namespace("netpol").await.expect("namespace");
    let mut policy: NetworkPolicy = serde_json::from_value(webhook.clone()).expect("NetworkPolicy");
    policy.metadata.namespace = Some(ns.clone());
    Api::<NetworkPolicy>::namespaced(client, &ns)
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &policy,
        )
        .await
        .expect("the API server accepts the narrowed NetworkPolicy");
}

fn pointer(v: &Value, path: &str) -> String {
    v.pointer(path)
        .map(Value::to_string)
        .unwrap_or("(none)".into())
}

/// The JSON pointer of the first place `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        // YAML's 65536.0 is 65536.
        (Value::Number(x), Value::Number(y)) => (x.as_f64() != y.as_f64()).then_some(path),
        (Value::Object(x), Value::Object(y)) => x
            .keys()
            .chain(y.keys().filter(|k| !x.contains_key(*k)))
            .find_map(|k| {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(a), Some(b)) => first_difference(a, b, p),
                    _ => Some(p),
                }
            }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (a, b))| first_difference(a, b, format!("{path}/{i}"))),
        _ => (a != b).then_some(path),
    }
}

// ---------------------------------------------------------------------------------------
// The real control plane

/// The validating webhook of the release whose objects are named `<fullname>-...` is
/// registered with the CA of the Secret its operator mounts (`secret`), and that Secret's
/// serving certificate chains to it and names the webhook Service. Returns the CA.
async fn registered_with_the_secrets_ca(
    client: &kube::Client,
    ns: &str,
    fullname: &str,
    secret: &str,
) -> Vec<u8> {
    let hook = format!("{fullname}-validating-webhook-configuration");
    let host = format!("{fullname}-webhook-service.{ns}.svc");
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(&format!("{fullname}-controller-manager"))
        .await
        .expect("the release's Deployment");
    let mounted = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.volumes)
        .and_then(|v| v.into_iter().find_map(|v| v.secret))
        .and_then(|s| s.secret_name);
    assert_eq!(
        mounted.as_deref(),
        Some(secret),
        "the Secret the operator mounts"
    );
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(secret)
        .await
        .expect("the webhook certificate's Secret");
    let key = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .unwrap_or_else(|| panic!("the webhook Secret has no {k}"))
    };
    let ca = key("ca.crt");
    let bundle = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(&hook)
        .await
        .unwrap_or_else(|e| panic!("{hook}: {e}"))
        .webhooks
        .and_then(|w| w.into_iter().next())
        .and_then(|w| w.client_config.ca_bundle)
        .map(|b| b.0);
    assert_eq!(
        bundle.as_ref(),
        Some(&ca),
        "{hook} is registered with another CA than the Secret's"
    );
    verify_serving_cert(&ca, &key("tls.crt"), &host);
    ca
}

/// Panics unless `cert_pem` chains to `ca_pem` and is valid for `dns_name` (webpki, as a
/// TLS client checks it).
fn verify_serving_cert(ca_pem: &[u8], cert_pem: &[u8], dns_name: &str) {
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(ca.expect("caBundle PEM"))
            .expect("a CA certificate");
    }
    let verifier = WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
        .build()
        .expect("verifier");
    let cert = CertificateDer::from_pem_slice(cert_pem).expect("tls.crt PEM");
    let name = ServerName::try_from(dns_name.to_string()).expect("DNS name");
    verifier
        .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
        .unwrap_or_else(|e| panic!("the webhook certificate does not verify for {dns_name}: {e}"));
}

async fn lifecycle(kube: envtest::Kube) {
    let cp = envtest::ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let tmp = TempDir::new("helm-lifecycle");
    let ns = cp.namespace("helm").await.expect("namespace");
    let watched = cp.namespace("helm-watched").await.expect("namespace");
    let release = "memcached-operator";
    let helm_in = |args: &[&str]| {
        let mut cmd = helm(tmp.path());
        cmd.env("KUBECONFIG", cp.kubeconfig())
            .args(args)
            .args(["--namespace", ns.as_str()]);
        cmd
    };
    let chart = chart_dir().display().to_string();
    // `helm upgrade` of the release with `flags` (`--set`, `--reuse-values`).
    let upgrade = |flags: &[&str]| {
        ok(&mut helm_in(
            &[&["upgrade", release, chart.as_str()], flags].concat(),
        ));
    };

    // Install: every object accepted and owned by the release.
    ok(&mut helm_in(&["install", release, &chart]));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deployments
        .get("memcached-operator-controller-manager")
        .await
        .expect("the operator's Deployment");
    let annotations = deployment.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("meta.helm.sh/release-name")
            .map(String::as_str),
        Some(release)
    );
    assert_eq!(
        deployment
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .map(String::as_str),
        Some("Helm")
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("memcacheds.memcached.cache.example.com")
        .await
        .expect("the CRD");

    // The webhook is registered with the chart's own CA, that of the Secret it mounts, and
    // the certificate the operator serves verifies as the API server checks it.
    let first_ca = registered_with_the_secrets_ca(
        &client,
        &ns,
        "memcached-operator",
        "memcached-operator-webhook-server-cert",
    )
    .await;
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());

    // With the webhook registered and no operator pod serving it, the API server refuses
    // Memcacheds: the registration is live.
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let sample: Memcached =
        serde_yaml::from_str(memcached_operator::samples::SEED_SAMPLE).expect("the seed sample");
    refused_by_the_webhook(
        memcacheds.create(&PostParams::default(), &sample).await,
        &ns,
    );

    // Upgrade: values change the objects; the certificate is kept.
    upgrade(&[
        "--set",
        "replicaCount=2",
        "--set",
        &format!("watchNamespaces={{{watched}}}"),
    ]);
    let deployment = deployments
        .get("memcached-operator-controller-manager")
        .await
        .expect("Deployment");
    assert_eq!(deployment.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let args = deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default();
    assert!(args.contains(&format!("--namespace={watched}")), "{args:?}");
    let kept = registered_with_the_secrets_ca(
        &client,
        &ns,
        "memcached-operator",
        "memcached-operator-webhook-server-cert",
    )
    .await;
    assert_eq!(kept, first_ca, "the upgrade replaced the webhook CA");
    // The real server's RBAC decides: the operator may list Memcacheds in the watched
    // namespace only.
    let can_i = |namespace: &str| {
        let out = run(cp.kubectl().args([
            "auth",
            "can-i",
            "list",
            "memcacheds.memcached.cache.example.com",
            "--as",
            &format!("system:serviceaccount:{ns}:memcached-operator-controller-manager"),
            "-n",
            namespace,
        ]));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(can_i(&watched), "yes");
    assert_eq!(can_i(&ns), "no");
    // The webhooks now see the watched namespace only: outside it the API server admits a
    // Memcached without calling them (still unreachable), inside it the call fails.
    let outside: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "outside-watch"}, "spec": {"size": 1},
    }))
    .expect("Memcached");
    memcacheds
        .create(&PostParams::default(), &outside)
        .await
        .expect("a Memcached outside the watched namespaces skips the webhooks");
    refused_by_the_webhook(
        Api::<Memcached>::namespaced(client.clone(), &watched)
            .create(&PostParams::default(), &outside)
            .await,
        &watched,
    );

    // A new fullnameOverride renames the webhook Service: the kept certificate would not
    // name it, so the chart issues one that does.
    upgrade(&["--reuse-values", "--set", "fullnameOverride=mco"]);
    registered_with_the_secrets_ca(&client, &ns, "mco", "mco-webhook-server-cert").await;
    assert!(
        deployments
            .get_opt("memcached-operator-controller-manager")
            .await
            .expect("get")
            .is_none(),
        "the old Deployment is gone"
    );

    // Without webhooks the seed's sample is accepted (by the CRD's schema alone).
    upgrade(&["--reuse-values", "--set", "webhook.enabled=false"]);
    assert!(
        hooks
            .get_opt("mco-validating-webhook-configuration")
            .await
            .expect("get")
            .is_none()
    );
    memcacheds
        .create(&PostParams::default(), &sample)
        .await
        .expect("the sample is accepted");

    // Uninstall: the release's objects go; the CRD and the Memcacheds stay.
    deployments
        .get("mco-controller-manager")
        .await
        .expect("the renamed Deployment");
    let roles: Api<ClusterRole> = Api::all(client.clone());
    roles
        .get("mco-manager-role")
        .await
        .expect("the renamed ClusterRole");
    ok(&mut helm_in(&["uninstall", release, "--wait"]));
    assert!(
        deployments
            .get_opt("mco-controller-manager")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        roles
            .get_opt("mco-manager-role")
            .await
            .expect("get")
            .is_none()
    );
    crds.get("memcacheds.memcached.cache.example.com")
        .await
        .expect("the CRD is kept");
    memcacheds
        .get("memcached-sample")
        .await
        .expect("the Memcached is kept");
}

#[tokio::test]
async fn install_upgrade_uninstall_on_the_oldest_kubernetes() {
    lifecycle(envtest::Kube::Oldest).await;
}

#[tokio::test]
async fn install_upgrade_uninstall_on_the_newest_kubernetes() {
    lifecycle(envtest::Kube::Newest).await;
}

/// The API server refused a Memcached in `ns` because it could not call the webhook (no
/// operator pod serves it in these tests).
fn refused_by_the_webhook(result: kube::Result<Memcached>, ns: &str) {
    assert!(
        format!("{result:?}").contains("webhook"),
        "expected the unreachable webhook to refuse in {ns}: {result:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The webhook certificate under GitOps

/// A CA, and a serving certificate it issued for `host` with its key, as PEM:
/// `(ca.crt, tls.crt, tls.key)`.
fn webhook_certificate(host: &str) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "memcached-operator-webhook-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let mut leaf = CertificateParams::new(vec![host.to_string()]).expect("params");
    leaf.distinguished_name.push(DnType::CommonName, host);
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let crt = leaf.signed_by(&key, &issuer).expect("certificate").pem();
    (ca_pem, crt, key.serialize_pem())
}

/// Writes the certificate's files under `dir` and returns the `--set-file` flags that give
/// them to the chart as `webhook.certificate`.
fn set_files(dir: &Path, (ca, crt, key): &(String, String, String)) -> Vec<String> {
    let mut flags = vec![];
    for (value, pem, file) in [
        ("ca", ca, "ca.crt"),
        ("crt", crt, "tls.crt"),
        ("key", key, "tls.key"),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, pem).expect("write");
        flags.push("--set-file".to_string());
        flags.push(format!("webhook.certificate.{value}={}", path.display()));
    }
    flags
}

/// `helm template` of the committed chart as release `release` in
/// `memcached-operator-system`, as Argo CD renders it: the whole output.
fn template_text(home: &Path, release: &str, args: &[String]) -> String {
    let mut cmd = helm(home);
    cmd.args(["template", release])
        .arg(chart_dir())
        .args(["--namespace", "memcached-operator-system"])
        .args(args);
    ok(&mut cmd)
}

fn b64(pem: &str) -> Value {
    use base64::Engine as _;
    json!(base64::engine::general_purpose::STANDARD.encode(pem))
}

/// The caBundle of both webhook configurations, and the Secret the operator mounts.
fn ca_bundles_and_mounted_secret(objects: &[Value], fullname: &str) -> (Vec<Value>, Value) {
    let bundles = [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    .into_iter()
    .map(|kind| {
        let name = format!(
            "{fullname}-{}-webhook-configuration",
            if kind.starts_with("Mutating") {
                "mutating"
            } else {
                "validating"
            }
        );
        find(objects, kind, &name)["webhooks"][0]["clientConfig"]["caBundle"].clone()
    })
    .collect();
    let deployment = find(
        objects,
        "Deployment",
        &format!("{fullname}-controller-manager"),
    );
    let mounted =
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"].clone();
    (bundles, mounted)
}

/// Tools that apply `helm template`'s output (Argo CD) see the same objects at every render
/// with a certificate of one's own, given in the values or as a Secret made outside the
/// chart (no key in the values), and with cert-manager's; the chart's own certificate is
/// made anew at each render, as its README says. Each release's Secret carries its name.
#[test]
fn own_webhook_certificates_render_the_same_every_time() {
    let tmp = TempDir::new("helm-own-cert");
    let cert =
        webhook_certificate("memcached-operator-webhook-service.memcached-operator-system.svc");
    let pinned = set_files(tmp.path(), &cert);
    let first = template_text(tmp.path(), "memcached-operator", &pinned);
    assert_eq!(
        first,
        template_text(tmp.path(), "memcached-operator", &pinned),
        "two renders with webhook.certificate differ"
    );
    let objects = yaml_objects(&first);
    let secret = find(&objects, "Secret", "memcached-operator-webhook-server-cert");
    let (ca, crt, key) = &cert;
    assert_eq!(
        secret["data"],
        json!({"ca.crt": b64(ca), "tls.crt": b64(crt), "tls.key": b64(key)})
    );
    let (bundles, mounted) = ca_bundles_and_mounted_secret(&objects, "memcached-operator");
    assert_eq!(bundles, [b64(ca), b64(ca)]);
    assert_eq!(mounted, "memcached-operator-webhook-server-cert");

    // A Secret of one's own: only the CA (public) in the values.
    let existing = vec![
        "--set".to_string(),
        "webhook.certificate.existingSecret=memcached-webhook-tls".to_string(),
        pinned[0].clone(),
        pinned[1].clone(),
    ];
    let first = template_text(tmp.path(), "memcached-operator", &existing);
    assert_eq!(
        first,
        template_text(tmp.path(), "memcached-operator", &existing),
        "two renders with webhook.certificate.existingSecret differ"
    );
    let objects = yaml_objects(&first);
    assert!(
        !objects.iter().any(|o| o["kind"] == "Secret"),
        "the chart makes no Secret beside the user's"
    );
    let (bundles, mounted) = ca_bundles_and_mounted_secret(&objects, "memcached-operator");
    assert_eq!(bundles, [b64(ca), b64(ca)]);
    assert_eq!(mounted, "memcached-webhook-tls");

    let cert_manager = vec![
        "--set".to_string(),
        "webhook.certManager.enabled=true".to_string(),
    ];
    assert_eq!(
        template_text(tmp.path(), "memcached-operator", &cert_manager),
        template_text(tmp.path(), "memcached-operator", &cert_manager),
        "two renders with cert-manager differ"
    );

    // The chart's own certificate: each release in the namespace has its Secret.
    let a = yaml_objects(&template_text(tmp.path(), "a", &[]));
    let b = yaml_objects(&template_text(tmp.path(), "b", &[]));
    for (objects, fullname) in [(&a, "a-memcached-operator"), (&b, "b-memcached-operator")] {
        let secret = format!("{fullname}-webhook-server-cert");
        find(objects, "Secret", &secret);
        assert_eq!(ca_bundles_and_mounted_secret(objects, fullname).1, secret);
    }
    assert_ne!(
        template_text(tmp.path(), "a", &[]),
        template_text(tmp.path(), "a", &[]),
        "the README says `helm template` makes the chart's own certificate anew"
    );
}

/// On the real control plane: a certificate of one's own (values, or a Secret made outside
/// the chart) is what the webhooks are registered with and kept on upgrade; three releases
/// share a namespace, each with its own certificate; and an upgrade from a chart that named
/// the Secret `webhook-server-cert` keeps that certificate under the new name.
#[tokio::test]
async fn own_certificates_and_releases_sharing_a_namespace() {
    let cp = envtest::ControlPlane::shared(envtest::Kube::Newest).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.expect("client");
    let tmp = TempDir::new("helm-own-cert-cluster");
    let ns = cp.namespace("helm-own").await.expect("namespace");
    let chart = chart_dir().display().to_string();
    // Webhooks for this namespace only, and no CRD (the lifecycle tests own it): these
    // releases share the server with them.
    let scoped = [
        "--set".to_string(),
        format!("watchNamespaces={{{ns}}}"),
        "--set".to_string(),
        "crds.install=false".to_string(),
    ];
    let helm_in = |args: &[String]| {
        let mut cmd = helm(tmp.path());
        cmd.env("KUBECONFIG", cp.kubeconfig())
            .args(args)
            .args(["--namespace", ns.as_str()]);
        if args[0] != "uninstall" {
            cmd.args(&scoped);
        }
        ok(&mut cmd);
    };
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();

    // Values of one's own, kept by an upgrade.
    let cert = webhook_certificate(&format!(
        "pinned-memcached-operator-webhook-service.{ns}.svc"
    ));
    let pinned = set_files(tmp.path(), &cert);
    helm_in(&[strings(&["install", "pinned", &chart]), pinned.clone()].concat());
    let secret = "pinned-memcached-operator-webhook-server-cert";
    let ca =
        registered_with_the_secrets_ca(&client, &ns, "pinned-memcached-operator", secret).await;
    assert_eq!(ca, cert.0.as_bytes());
    helm_in(&strings(&[
        "upgrade",
        "pinned",
        &chart,
        "--reuse-values",
        "--set",
        "replicaCount=2",
    ]));
    let kept =
        registered_with_the_secrets_ca(&client, &ns, "pinned-memcached-operator", secret).await;
    assert_eq!(
        kept,
        cert.0.as_bytes(),
        "the upgrade replaced the pinned certificate"
    );

    // A Secret of one's own (as a SealedSecret or an ExternalSecret would make it).
    let cert = webhook_certificate(&format!("mine-memcached-operator-webhook-service.{ns}.svc"));
    let (ca, crt, key) = &cert;
    let tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "mine-webhook-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"ca.crt": ca, "tls.crt": crt, "tls.key": key},
    }))
    .expect("Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &tls)
        .await
        .expect("the user's Secret");
    let ca_flags = set_files(tmp.path(), &cert)[..2].to_vec();
    helm_in(
        &[
            strings(&[
                "install",
                "mine",
                &chart,
                "--set",
                "webhook.certificate.existingSecret=mine-webhook-tls",
            ]),
            ca_flags,
        ]
        .concat(),
    );
    let registered =
        registered_with_the_secrets_ca(&client, &ns, "mine-memcached-operator", "mine-webhook-tls")
            .await;
    assert_eq!(registered, ca.as_bytes());

    // The chart's own certificate, in the same namespace: its Secret is the release's.
    helm_in(&strings(&["install", "own", &chart]));
    let own = registered_with_the_secrets_ca(
        &client,
        &ns,
        "own-memcached-operator",
        "own-memcached-operator-webhook-server-cert",
    )
    .await;
    assert_ne!(own, ca.as_bytes());

    // Upgrade from a chart naming the Secret webhook-server-cert (this chart with that
    // name): the certificate is kept under the new name, and the old Secret goes.
    let old_chart = tmp.path().join("old-chart");
    copy_dir(&chart_dir(), &old_chart);
    let helpers = old_chart.join("templates/_helpers.tpl");
    let text = std::fs::read_to_string(&helpers).expect("read");
    let legacy = text.replace(
        "{{- .Values.webhook.certificate.existingSecret | default (include \"memcached-operator.prefixed\" (list . \"webhook-server-cert\")) }}",
        "webhook-server-cert",
    );
    assert_ne!(legacy, text, "the helper naming the Secret moved");
    std::fs::write(&helpers, legacy).expect("write");
    let old = old_chart.display().to_string();
    helm_in(&strings(&["install", "old", &old]));
    let before = registered_with_the_secrets_ca(
        &client,
        &ns,
        "old-memcached-operator",
        "webhook-server-cert",
    )
    .await;
    helm_in(&strings(&["upgrade", "old", &chart, "--reuse-values"]));
    let after = registered_with_the_secrets_ca(
        &client,
        &ns,
        "old-memcached-operator",
        "old-memcached-operator-webhook-server-cert",
    )
    .await;
    assert_eq!(after, before, "the upgrade replaced the webhook CA");
    assert!(
        Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt("webhook-server-cert")
            .await
            .expect("get")
            .is_none(),
        "the old Secret is gone"
    );

    for release in ["pinned", "mine", "own", "old"] {
        helm_in(&strings(&["uninstall", release, "--wait"]));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).expect("copy");
        }
    }
}
