//! The operator installed as a user installs it, running as two pods of its own image on
//! the real node (crates/envtest: containerd, runc, the pinned kubelet and kube-proxy; the
//! image `envtest.local/memcached-operator:VERSION`, built by `make node`), on each pinned
//! version. The real node runs alone (no kwok nodes, as `make dev-cluster NODE=real`), so it
//! is untainted and the manifests need no toleration: the tests set only what a user sets.
//! - `config/default` through the README's overlay (kustomize's `images:` for the operator
//!   and the TLS reload agent, 2 replicas, `--memcached-image` naming the node's memcached),
//!   built by the pinned kubectl and applied server-side. cert-manager is not installed
//!   here: its CRDs are (minimal ones), and the test does its two jobs, issuing the Secret
//!   the `Certificate` asks for (self-signed, for its `dnsNames`, as its `selfSigned`
//!   Issuer does) and injecting its CA into the webhook configurations named by their
//!   `cert-manager.io/inject-ca-from` annotation (cainjector's job).
//! - the Helm chart (`helm install` with `image.repository`, `tlsAgent.image.*`,
//!   `replicaCount=2`, `extraArgs`), which makes its webhook certificate itself.
//!
//! Each asserts, with the API server, the kubelet and kube-proxy deciding:
//! - both pods Ready (by their probes) from the operator's image, one of them holding the
//!   Lease, and each replica's `/metrics` saying which one leads;
//! - the seed's sample (`kubectl apply -k config/samples`, verbatim) converges to three real
//!   memcached pods named in `status.nodes`, each storing and returning a value at its pod
//!   IP; admitting it took both webhooks (`failurePolicy: Fail`), and the API server's
//!   audit log shows it called the mutating one;
//! - the API server calls the validating webhook through its Service: a Memcached the
//!   schema lets through is refused with the webhook's message naming the field, and one
//!   whose Deployment Kubernetes would refuse is refused naming the Memcached's field (the
//!   webhook's server-side dry run, made from the pod);
//! - `/metrics` over HTTPS through the metrics Service's ClusterIP: 200 for a ServiceAccount
//!   bound to the metrics-reader ClusterRole, 403 for another, 401 without a token;
//! - (`config/default`) deleting the leader's pod hands the Lease to the other replica,
//!   which then reconciles a scale of the sample to 4 (every write to the sample's
//!   Deployment after the scale made with that pod's token, by the audit log).
//!
//! Needs root and `make node` (the image is checked to be built from this test's sources).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube, Options, RealNodeInfo};
use k8s_openapi::ByteString;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::api::{GroupVersionKind, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_api::Memcached;
use serde_json::{Value, json};

mod common;
use common::cluster::service_account_token;
use common::foreign_crds;
use common::process::TempDir;
use common::real_node::poll;

/// Long enough for a loaded 2-core machine: images, sandboxes, probes, a Lease changing hands.
const CONVERGE: Duration = Duration::from_secs(300);
/// The leader-election Lease (`--leader-election-id`'s default), in the operator's namespace.
const LEASE: &str = "memcached-operator.cache.example.com";
/// The namespace both installs use (config/default's, and the Helm release's here).
const OPERATOR_NS: &str = "memcached-operator-system";
/// The seed's sample, in `default` as `kubectl apply -k config/samples` creates it.
const SAMPLE: &str = "memcached-sample";
const VALIDATING_WEBHOOK: &str = "vmemcached-v1.kb.io";
const MUTATING_WEBHOOK: &str = "mmemcached-v1.kb.io";

/// One real node at a time in this binary (and, across binaries, `flock /tmp/real-node.lock`).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> PathBuf {
    envtest::repo_root()
}

/// Runs `cmd` to the end on a blocking thread, feeding it `stdin`.
async fn run(mut cmd: Command, stdin: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{:?} starts: {e}", cmd.get_program()));
        if let Some(input) = stdin
            && let Some(mut pipe) = child.stdin.take()
        {
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("command runs")
    })
    .await
    .expect("join")
}

/// Runs `cmd`, failing the test with its output unless it succeeds; its stdout.
async fn ok(cmd: Command, stdin: Option<String>) -> String {
    let what = format!(
        "{:?} {:?}",
        cmd.get_program(),
        cmd.get_args().collect::<Vec<_>>()
    );
    let out = run(cmd, stdin).await;
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The image under test is the operator under test: `hack/node/images.sh` records a hash of
/// the workspace sources the image's binary was built from (the files of its cargo dep-info,
/// by path and contents); the same hash of this test's own operator binary must match.
fn assert_the_image_is_built_from_these_sources() {
    let root = repo();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_memcached-operator"));
    let dep_info = bin.with_extension("d");
    let text = std::fs::read_to_string(&dep_info)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dep_info.display()));
    let prefix = format!("{}/", root.display());
    let mut files: Vec<&str> = text
        .split_whitespace()
        .filter(|f| !f.ends_with(':') && f.starts_with(&prefix))
        .collect();
    files.sort();
    files.dedup();
    let mut listing = String::new();
    for f in files {
        let contents = std::fs::read(f).unwrap_or_else(|e| panic!("reading {f}: {e}"));
        let digest = ring::digest::digest(&ring::digest::SHA256, &contents);
        listing.push_str(&format!(
            "{} {}\n",
            &f[prefix.len()..],
            hex(digest.as_ref())
        ));
    }
    let ours = hex(ring::digest::digest(&ring::digest::SHA256, listing.as_bytes()).as_ref());
    let recorded = envtest::bin_root().join("node-images/operator.sources");
    let image = std::fs::read_to_string(&recorded).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e}; the operator's image is built by make node (or: hack/node/images.sh)",
            recorded.display()
        )
    });
    assert_eq!(
        image.trim(),
        ours,
        "the operator's image (bin/node-images/operator.tar) was built from other sources \
         than this test's operator: make node (or: hack/node/images.sh)"
    );
}

/// `repository:tag` split at the tag.
fn repo_and_tag(image: &str) -> (&str, &str) {
    image
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("image {image} has no tag"))
}

/// A control plane whose only node is the real one (untainted: every pod runs there).
struct Env {
    cp: ControlPlane,
    node: RealNodeInfo,
    client: Client,
    tmp: TempDir,
}

impl Env {
    async fn start(kube: Kube, test: &str) -> Env {
        assert_the_image_is_built_from_these_sources();
        let cp = ControlPlane::start(Options {
            nodes: 0,
            real_node: true,
            ..Options::new(kube)
        })
        .await
        .unwrap_or_else(|e| panic!("control plane with a real node (make node): {e}"));
        let node = cp.real_node().expect("the real node").clone();
        let client = cp.client().await.expect("admin client");
        Env {
            cp,
            node,
            client,
            tmp: TempDir::new(test),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut cmd = self.cp.kubectl();
        cmd.args(args);
        cmd
    }

    /// The pinned helm, with its own directories, on this control plane.
    fn helm(&self, args: &[&str]) -> Command {
        let helm = envtest::tool_path("helm").unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(helm);
        for (var, dir) in [
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_DATA_HOME", "data"),
        ] {
            cmd.env(var, self.tmp.path().join("helm").join(dir));
        }
        cmd.env("KUBECONFIG", self.cp.kubeconfig()).args(args);
        cmd
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// `config/default` as a user installs it: the README's overlay, built by the pinned
    /// kubectl and applied server-side; cert-manager's part played as the module docs say.
    /// Returns the objects applied.
    async fn install_config_default(&self) -> Vec<Value> {
        for crd in foreign_crds::cert_manager_and_prometheus() {
            let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("CRD");
            common::cluster::apply_crd(&self.client, &crd).await;
        }
        let tmp = self.tmp.path();
        copy_tree(&repo().join("config"), &tmp.join("config"));
        let (op_repo, op_tag) = repo_and_tag(&self.node.operator_image);
        let (agent_repo, agent_tag) = repo_and_tag(&self.node.tls_agent_image);
        let patch = serde_yaml::to_string(&json!([
            {"op": "replace", "path": "/spec/replicas", "value": 2},
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": format!("--memcached-image={}", self.node.memcached_image)},
        ]))
        .expect("YAML");
        let overlay = json!({
            "resources": ["../config/default"],
            "images": [
                {"name": "controller", "newName": op_repo, "newTag": op_tag},
                {"name": "tls-agent", "newName": agent_repo, "newTag": agent_tag},
            ],
            "patches": [{"target": {"kind": "Deployment"}, "patch": patch}],
        });
        std::fs::create_dir_all(tmp.join("overlay")).expect("mkdir overlay");
        std::fs::write(
            tmp.join("overlay/kustomization.yaml"),
            serde_yaml::to_string(&overlay).expect("YAML"),
        )
        .expect("write the overlay");
        let overlay_dir = tmp.join("overlay").display().to_string();
        let yaml = ok(self.kubectl(&["kustomize", &overlay_dir]), None).await;
        let objects = yaml_docs(&yaml);
        ok(
            self.kubectl(&["apply", "--server-side", "-f", "-"]),
            Some(yaml),
        )
        .await;
        self.play_cert_manager(&objects).await;
        objects
    }

    /// cert-manager's two jobs for `objects`: the Secret each Certificate asks for, and its
    /// CA in the webhook configurations that ask for it (`cert-manager.io/inject-ca-from`).
    async fn play_cert_manager(&self, objects: &[Value]) {
        let certificates: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "Certificate")
            .collect();
        assert_eq!(
            certificates.len(),
            1,
            "config/default asks for one certificate"
        );
        let certificate = certificates[0];
        let ns = certificate["metadata"]["namespace"].as_str().expect("ns");
        let name = certificate["metadata"]["name"].as_str().expect("name");
        let dns_names: Vec<String> = certificate["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .map(|n| n.as_str().expect("a DNS name").to_string())
            .collect();
        assert!(
            dns_names.iter().any(|n| n.ends_with(&format!(".{ns}.svc"))),
            "the certificate names the webhook Service: {dns_names:?}"
        );
        let issued = rcgen::generate_simple_self_signed(dns_names).expect("rcgen");
        let cert_pem = issued.cert.pem();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": certificate["spec"]["secretName"], "namespace": ns},
            "type": "kubernetes.io/tls",
        }))
        .expect("Secret");
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), ByteString(cert_pem.clone().into())),
                (
                    "tls.key".to_string(),
                    ByteString(issued.signing_key.serialize_pem().into()),
                ),
                ("ca.crt".to_string(), ByteString(cert_pem.clone().into())),
            ])),
            ..secret
        };
        Api::<Secret>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("the webhook's certificate Secret");
        let ca = serde_json::to_value(ByteString(cert_pem.into())).expect("base64");
        let mut injected = 0;
        for config in objects.iter().filter(|o| {
            o["kind"] == "MutatingWebhookConfiguration"
                || o["kind"] == "ValidatingWebhookConfiguration"
        }) {
            assert_eq!(
                config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                json!(format!("{ns}/{name}")),
                "the webhook configuration asks for the certificate's CA"
            );
            let patch: Vec<Value> = (0..config["webhooks"].as_array().expect("webhooks").len())
                .map(|i| {
                    json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                           "value": ca})
                })
                .collect();
            let patch: json_patch::Patch = serde_json::from_value(json!(patch)).expect("patch");
            let config_name = config["metadata"]["name"].as_str().expect("name");
            let gvk = GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                config["kind"].as_str().expect("kind"),
            );
            let api: Api<DynamicObject> =
                Api::all_with(self.client.clone(), &ApiResource::from_gvk(&gvk));
            api.patch(
                config_name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
            .unwrap_or_else(|e| panic!("injecting the CA into {config_name}: {e}"));
            injected += 1;
        }
        assert_eq!(
            injected, 2,
            "a mutating and a validating webhook configuration"
        );
    }

    /// The Helm chart as a user installs it (the README's command with this node's images,
    /// two replicas, and `--memcached-image` through `extraArgs`). Returns the objects of
    /// the release.
    async fn install_helm_chart(&self) -> Vec<Value> {
        let (op_repo, op_tag) = repo_and_tag(&self.node.operator_image);
        let chart = repo().join("charts/memcached-operator");
        let chart_yaml: Value = serde_yaml::from_str(
            &std::fs::read_to_string(chart.join("Chart.yaml")).expect("Chart.yaml"),
        )
        .expect("Chart.yaml");
        assert_eq!(
            chart_yaml["appVersion"].as_str(),
            Some(op_tag),
            "the image is tagged with the chart's appVersion, the tag the chart uses"
        );
        let (agent_repo, agent_tag) = repo_and_tag(&self.node.tls_agent_image);
        let extra_args = json!([format!("--memcached-image={}", self.node.memcached_image)]);
        let chart = chart.display().to_string();
        let sets = [
            format!("image.repository={op_repo}"),
            format!("tlsAgent.image.repository={agent_repo}"),
            format!("tlsAgent.image.tag={agent_tag}"),
            "replicaCount=2".to_string(),
        ];
        let extra = format!("extraArgs={extra_args}");
        let mut args = vec![
            "install",
            "memcached-operator",
            chart.as_str(),
            "-n",
            OPERATOR_NS,
            "--create-namespace",
            "--set-json",
            extra.as_str(),
        ];
        for s in &sets {
            args.extend(["--set", s.as_str()]);
        }
        ok(self.helm(&args), None).await;
        let manifest = ok(
            self.helm(&["get", "manifest", "memcached-operator", "-n", OPERATOR_NS]),
            None,
        )
        .await;
        yaml_docs(&manifest)
    }

    /// Waits until the operator runs as 2 Ready pods of its image (the kubelet's verdict by
    /// its probes), none being deleted; fails at once when the image cannot be used. Returns
    /// them (name → IP).
    async fn operator_pods(&self) -> BTreeMap<String, Ipv4Addr> {
        let pods = self.pods(OPERATOR_NS);
        let image = self.node.operator_image.clone();
        poll(
            "2 Ready operator pods of the node's operator image",
            CONVERGE,
            || async {
                let list = pods
                    .list(&ListParams::default().labels("control-plane=controller-manager"))
                    .await
                    .ok()?;
                let mut ready = BTreeMap::new();
                for pod in &list.items {
                    let status = pod.status.as_ref()?;
                    for c in status.container_statuses.iter().flatten() {
                        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
                        let reason = waiting.and_then(|w| w.reason.as_deref());
                        assert!(
                            !matches!(
                                reason,
                                Some("ErrImagePull" | "ImagePullBackOff" | "ErrImageNeverPull")
                            ),
                            "the operator's pod {} cannot use its image: {waiting:?}",
                            pod.name_any()
                        );
                    }
                    let spec = pod.spec.as_ref()?;
                    assert_eq!(
                        spec.containers[0].image.as_deref(),
                        Some(image.as_str()),
                        "the operator's pod runs the node's operator image"
                    );
                    let is_ready = status
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    if is_ready && pod.metadata.deletion_timestamp.is_none() {
                        ready.insert(pod.name_any(), status.pod_ip.as_deref()?.parse().ok()?);
                    }
                }
                (ready.len() == 2 && list.items.len() == 2).then_some(ready)
            },
        )
        .await
    }

    /// The pod holding the Lease (its identity is `<pod name>_<uuid>`), once one does.
    async fn leader(&self, not: Option<&str>) -> String {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), OPERATOR_NS);
        poll(
            &format!("the Lease {OPERATOR_NS}/{LEASE} held (not by {not:?})"),
            CONVERGE,
            || async {
                let lease = leases.get_opt(LEASE).await.ok()??;
                let holder = lease.spec?.holder_identity?;
                let pod = holder.split_once('_')?.0.to_string();
                (Some(pod.as_str()) != not).then_some(pod)
            },
        )
        .await
    }

    /// Waits until the sample has `size` Ready memcached pods named by `status.nodes`;
    /// returns them (name → IP).
    async fn sample_pool(&self, size: usize) -> BTreeMap<String, Ipv4Addr> {
        let memcacheds: Api<Memcached> = Api::namespaced(self.client.clone(), "default");
        let pods = self.pods("default");
        poll(
            &format!("{size} Ready memcached pods of {SAMPLE}, named by status.nodes"),
            CONVERGE,
            || async {
                let list = pods
                    .list(
                        &ListParams::default()
                            .labels(&format!("app.kubernetes.io/instance={SAMPLE}")),
                    )
                    .await
                    .ok()?;
                let mut pool = BTreeMap::new();
                for pod in &list.items {
                    let status = pod.status.as_ref()?;
                    let ready = status
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    if !ready || pod.metadata.deletion_timestamp.is_some() {
                        return None;
                    }
                    pool.insert(pod.name_any(), status.pod_ip.as_deref()?.parse().ok()?);
                }
                let status = memcacheds.get(SAMPLE).await.ok()?.status?;
                let mut nodes = status.nodes.clone();
                nodes.sort();
                (pool.len() == size
                    && status.ready_replicas == size as i32
                    && nodes == pool.keys().cloned().collect::<Vec<_>>())
                .then_some(pool)
            },
        )
        .await
    }
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A value set on memcached at `ip` is read back.
fn set_and_get(ip: Ipv4Addr, key: &str, value: &str) {
    let mut s = TcpStream::connect_timeout(&SocketAddr::from((ip, 11211)), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connecting to memcached at {ip}:11211: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "set {key} 0 0 {}\r\n{value}\r\nget {key}\r\n",
        value.len()
    )
    .expect("write to memcached");
    let lines: Vec<String> = BufReader::new(s)
        .lines()
        .take(4)
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("reading memcached at {ip}: {e}"));
    assert_eq!(
        lines,
        [
            "STORED".to_string(),
            format!("VALUE {key} 0 {}", value.len()),
            value.to_string(),
            "END".to_string()
        ],
        "memcached at {ip}"
    );
}

/// `GET path` over HTTPS at `addr` (any certificate: the operator's metrics certificate is
/// self-signed), with `token` as the bearer; the status code and body.
fn https_get(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let (mut stream, _) = common::tls::connect(addr)?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    // A peer closing without close_notify shows as an error after the data.
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP answer from {addr}: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// [`https_get`] from a blocking thread, retried until it answers (kube-proxy programs a
/// new Service or endpoint within a sync).
async fn scrape(addr: SocketAddr, token: Option<String>) -> (u16, String) {
    poll(&format!("an HTTPS answer at {addr}"), CONVERGE, || {
        let token = token.clone();
        async move {
            tokio::task::spawn_blocking(move || https_get(addr, "/metrics", token.as_deref()))
                .await
                .expect("join")
                .ok()
        }
    })
    .await
}

/// The API server's refusal of creating `spec` as Memcached `name` in `default`.
async fn refusal(client: &Client, name: &str, spec: Value) -> (u16, String) {
    let m: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("a Memcached");
    match Api::<Memcached>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &m)
        .await
    {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("{name}: expected the API server to refuse it, got {other:?}"),
    }
}

/// The audit log's events (JSON), in the order the API server finished them.
fn audit_events(cp: &ControlPlane) -> Vec<Value> {
    std::fs::read_to_string(cp.audit_log())
        .expect("the audit log")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .collect()
}

/// The pod whose bound ServiceAccount token made a request (the token's pod claim, which the
/// API server puts in the user's extra).
fn pod_of(event: &Value) -> Option<&str> {
    event["user"]["extra"]["authentication.kubernetes.io/pod-name"][0].as_str()
}

/// What both installs must give: the operator's pods and Lease, the sample served, the
/// webhooks called through their Service, `/metrics` authorised by the API server. Returns
/// the operator's pods and the leader.
async fn the_installed_operator_works(
    env: &Env,
    installed: &[Value],
) -> (BTreeMap<String, Ipv4Addr>, String) {
    let operators = env.operator_pods().await;
    let leader = env.leader(None).await;
    assert!(
        operators.contains_key(&leader),
        "the Lease is held by one of the operator's pods: {leader} of {operators:?}"
    );

    // The seed's sample, as the README's quick start applies it.
    let samples = repo().join("config/samples").display().to_string();
    // The webhooks' Service routes to their pods once kube-proxy has the endpoints, a moment
    // after the pods turn Ready (until then the API server's call is refused, and with
    // failurePolicy Fail so is the Memcached): wait, as a user would, until a server-side
    // dry run of the sample passes through them.
    poll(
        "the webhooks reachable through their Service (a server-side dry run)",
        CONVERGE,
        || async {
            let dry_run = env.kubectl(&["apply", "-k", &samples, "--dry-run=server"]);
            run(dry_run, None).await.status.success().then_some(())
        },
    )
    .await;
    ok(env.kubectl(&["apply", "-k", &samples]), None).await;
    let pool = env.sample_pool(3).await;
    for (pod, ip) in &pool {
        set_and_get(*ip, "greeting", &format!("hello from {pod}"));
    }
    // Both webhooks answered it (failurePolicy Fail: no answer, no Memcached); the audit
    // log names the mutating one.
    let created = audit_events(&env.cp)
        .into_iter()
        .find(|e| {
            e["verb"] == "create"
                && !e["requestURI"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("dryRun")
                && e["objectRef"]["resource"] == "memcacheds"
                && e["objectRef"]["name"] == SAMPLE
                && e["responseStatus"]["code"] == 201
        })
        .expect("the sample's creation in the audit log");
    let annotations = created["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        annotations.iter().any(|(k, v)| {
            k.starts_with("mutation.webhook.admission.k8s.io/")
                && v.as_str().is_some_and(|v| v.contains(MUTATING_WEBHOOK))
        }),
        "the API server called {MUTATING_WEBHOOK} for the sample: {annotations:?}"
    );

    // The validating webhook, called by the API server through its Service: a Memcached
    // the schema lets through but the operator's rules refuse, and one whose Deployment
    // Kubernetes would refuse (the webhook's dry run, made from its pod).
    let denied = format!("admission webhook \"{VALIDATING_WEBHOOK}\" denied the request");
    let (code, message) = refusal(
        &env.client,
        "port-clash",
        json!({"size": 2, "containerPort": 9150}),
    )
    .await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(&denied) && message.contains("spec.containerPort"),
        "the webhook's refusal names the field: {message}"
    );
    let (code, message) = refusal(
        &env.client,
        "toleration-bogus",
        json!({"size": 1, "tolerations": [{"key": "k", "operator": "Bogus", "value": "v"}]}),
    )
    .await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(&denied)
            && message.contains("spec.tolerations[0].operator")
            && message.contains("Unsupported value: \"Bogus\""),
        "the webhook's dry run refusal names the Memcached's field: {message}"
    );
    // A negative size never reaches the webhook: the CRD's schema refuses it first.
    let (code, message) = refusal(&env.client, "negative", json!({"size": -1})).await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.size") && !message.contains("admission webhook"),
        "{message}"
    );

    // /metrics through the metrics Service, reviewed by the API server: a ServiceAccount
    // bound to the metrics-reader ClusterRole reads it, another is forbidden, none is
    // unauthorized.
    let reader = installed
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole"
                && o["rules"] == json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
        })
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("the install has the metrics-reader ClusterRole")
        .to_string();
    let metrics_service = installed
        .iter()
        .find(|o| {
            o["kind"] == "Service"
                && o["spec"]["ports"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["targetPort"] == 8443))
        })
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("the install has the metrics Service")
        .to_string();
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), "default");
    for name in ["scraper", "nosy"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("SA");
        sas.create(&PostParams::default(), &sa)
            .await
            .expect("ServiceAccount");
    }
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "metrics-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": "default"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the scraper's binding");
    let client = env.client.clone();
    poll(
        "the API server lets the scraper read /metrics",
        CONVERGE,
        || {
            let client = client.clone();
            async move {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some("system:serviceaccount:default:scraper".into()),
                        groups: Some(vec!["system:authenticated".into()]),
                        non_resource_attributes: Some(NonResourceAttributes {
                            path: Some("/metrics".into()),
                            verb: Some("get".into()),
                        }),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                };
                let r = Api::<SubjectAccessReview>::all(client)
                    .create(&PostParams::default(), &review)
                    .await
                    .ok()?;
                r.status?.allowed.then_some(())
            }
        },
    )
    .await;
    let service = Api::<Service>::namespaced(env.client.clone(), OPERATOR_NS)
        .get(&metrics_service)
        .await
        .expect("the metrics Service");
    let cluster_ip: Ipv4Addr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("the metrics Service's ClusterIP");
    let through_service = SocketAddr::from((cluster_ip, 8443));
    let scraper = service_account_token(&env.client, "default", "scraper").await;
    let nosy = service_account_token(&env.client, "default", "nosy").await;
    let lease_gauge = format!("leader_election_master_status{{name=\"{LEASE}\"}}");
    // Each request may land on either replica: every one must answer alike.
    for _ in 0..4 {
        let (code, body) = scrape(through_service, Some(scraper.clone())).await;
        assert_eq!(code, 200, "the scraper reads /metrics: {body}");
        assert!(body.contains(&lease_gauge), "{body}");
        let (code, body) = scrape(through_service, Some(nosy.clone())).await;
        assert_eq!(
            code, 403,
            "an account without the metrics-reader role: {body}"
        );
        let (code, body) = scrape(through_service, None).await;
        assert_eq!(code, 401, "no token: {body}");
    }
    // Each replica's own /metrics (at its pod IP) says which one leads, as the Lease does.
    for (pod, ip) in &operators {
        let (code, body) = scrape(SocketAddr::from((*ip, 8443)), Some(scraper.clone())).await;
        assert_eq!(code, 200, "{pod}: {body}");
        let expected = format!("{lease_gauge} {}", u8::from(*pod == leader));
        assert!(
            body.lines().any(|l| l == expected),
            "{pod} (leader: {leader}) reports `{expected}`:\n{body}"
        );
    }
    (operators, leader)
}

async fn config_default_on_the_real_node(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let begin = Instant::now();
    let env = Env::start(kube, "op-config-default").await;
    let installed = env.install_config_default().await;
    let (operators, leader) = the_installed_operator_works(&env, &installed).await;

    // The leader's pod deleted (as a node drain or `kubectl delete pod` does): another
    // replica takes the Lease (the standby, or the pod the ReplicaSet made in its place,
    // whichever asks first once the deleted one lets go of it) and reconciles the next
    // change.
    assert_eq!(operators.len(), 2);
    env.pods(OPERATOR_NS)
        .delete(&leader, &DeleteParams::default())
        .await
        .expect("delete the leader's pod");
    let new_leader = env.leader(Some(&leader)).await;
    ok(
        env.kubectl(&["scale", &format!("memcached/{SAMPLE}"), "--replicas=4"]),
        None,
    )
    .await;
    let pool = env.sample_pool(4).await;
    for (pod, ip) in &pool {
        set_and_get(*ip, "after-failover", pod);
    }
    // Every write to the sample's Deployment after the scale came from the new leader's pod.
    let events = audit_events(&env.cp);
    let scaled = events
        .iter()
        .position(|e| {
            e["objectRef"]["resource"] == "memcacheds"
                && e["objectRef"]["subresource"] == "scale"
                && e["verb"] == "patch"
        })
        .expect("the scale in the audit log");
    let writes: Vec<Option<&str>> = events[scaled..]
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "deployments"
                && e["objectRef"]["name"] == SAMPLE
                && matches!(e["verb"].as_str(), Some("patch" | "update" | "create"))
                && !e["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains("dryRun=All"))
                && e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("system:serviceaccount:memcached-operator"))
        })
        .map(pod_of)
        .collect();
    assert!(
        !writes.is_empty() && writes.iter().all(|p| *p == Some(new_leader.as_str())),
        "the sample's Deployment scaled by {new_leader} only: {writes:?}"
    );
    // The Deployment replaced the deleted pod: two replicas again, one of them leading.
    let operators_after = env.operator_pods().await;
    assert!(
        !operators_after.contains_key(&leader) && operators_after.contains_key(&new_leader),
        "{operators_after:?}"
    );
    assert_eq!(env.leader(None).await, new_leader);
    println!(
        "config/default on the real node ({}): {:.0} s",
        env.cp.version(),
        begin.elapsed().as_secs_f64()
    );
}

async fn helm_chart_on_the_real_node(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let begin = Instant::now();
    let env = Env::start(kube, "op-helm").await;
    let installed = env.install_helm_chart().await;
    the_installed_operator_works(&env, &installed).await;
    println!(
        "the Helm chart on the real node ({}): {:.0} s",
        env.cp.version(),
        begin.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_default_on_the_real_node_oldest() {
    config_default_on_the_real_node(Kube::Oldest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_default_on_the_real_node_newest() {
    config_default_on_the_real_node(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_on_the_real_node_oldest() {
    helm_chart_on_the_real_node(Kube::Oldest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_on_the_real_node_newest() {
    helm_chart_on_the_real_node(Kube::Newest).await;
}
