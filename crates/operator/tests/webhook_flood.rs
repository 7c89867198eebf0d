//! A flood of the webhook port from loopback against `memcached-operator run` on the real
//! control plane (newest pinned version), leader election on and the webhooks registered in
//! the API server: hundreds of clients sending large bodies slowly, clients sending dense
//! JSON that would take ~90 times its size to decode, and many valid reviews at once, each
//! needing a dry run of its children. Meanwhile the operator's resident memory stays under
//! the manager Deployment's memory limit, it keeps renewing its Lease, and Memcacheds created
//! through the API server are admitted.
//!
//! Its own test binary, so that no other test shares the machine's two cores with the flood.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

mod common;
use common::cluster::apply_crd;
use common::process::{Operator, TempDir, free_port};
use common::wait_for_within;

/// The leader-election Lease's default name (`--leader-election-id`).
const LEASE: &str = "memcached-operator.cache.example.com";
/// Short lease settings, as in `tests/real_cluster.rs`: a main thread held up for 2 s
/// loses the Lease and the process exits.
const LEASE_FLAGS: [&str; 3] = [
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=250ms",
];
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(20);
/// Clients sending a large body slowly, each reconnecting at once when answered: more
/// than the webhook's 256 connections, and a stream of TLS handshakes that keeps its
/// thread busy (the same flood with the webhooks on the Lease's runtime lost the Lease).
const SLOW_CLIENTS: usize = 300;
/// Their body: a Memcached review padded to just under the webhook's 1 MiB limit.
const SLOW_BODY: usize = 1_000_000;
/// Sent 16 KiB every 100 ms: about 6 s per body, within the server's 10 s deadline.
const SLOW_CHUNK: usize = 16 * 1024;
const SLOW_PAUSE: Duration = Duration::from_millis(100);
/// Clients sending dense JSON (an array of one-key objects) of the same size at once.
const BOMB_CLIENTS: usize = 4;
/// Clients sending valid reviews of new Memcacheds to the validating webhook, one after
/// another, as the API server does in a burst of writes from other users.
const VALID_CLIENTS: usize = 16;
/// A refused valid or dense client sends again after this: the 429's Retry-After, which
/// the API server honours too.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Memcacheds created through the API server during the flood, one every 4 s.
const GOOD_CREATES: usize = 4;

/// The manager container's memory limit in `config/manager/manager.yaml`, in bytes.
fn manager_memory_limit() -> u64 {
    let path = envtest::repo_root().join("config/manager/manager.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .find(|d: &Value| d["kind"] == "Deployment")
        .expect("config/manager has the manager's Deployment");
    let limit = deployment
        .pointer("/spec/template/spec/containers/0/resources/limits/memory")
        .and_then(Value::as_str)
        .expect("the manager has a memory limit")
        .to_string();
    let mib: u64 = limit
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("memory limit {limit:?} is not in Mi"));
    mib * 1024 * 1024
}

/// The process's resident memory (VmRSS), in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// `config/webhook/manifests.yaml`'s configurations, pointed at `https://127.0.0.1:PORT`
/// with the cluster CA as `caBundle`, limited to namespace `ns` and named after it.
fn webhook_configurations(
    ns: &str,
    port: u16,
    ca_pem: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let path = envtest::repo_root().join("config/webhook/manifests.yaml");
    let text = std::fs::read_to_string(&path).expect("config/webhook/manifests.yaml");
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .collect();
    let adapt = |kind: &str| -> Value {
        let mut doc = docs
            .iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in config/webhook/manifests.yaml"))
            .clone();
        let name = doc["metadata"]["name"].as_str().expect("name").to_string();
        doc["metadata"] = json!({"name": format!("{ns}-{name}")});
        for hook in doc["webhooks"].as_array_mut().expect("webhooks") {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("service path")
                .to_string();
            hook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
            });
            hook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        }
        doc
    };
    (
        serde_json::from_value(adapt("MutatingWebhookConfiguration")).expect("mutating"),
        serde_json::from_value(adapt("ValidatingWebhookConfiguration")).expect("validating"),
    )
}

/// An AdmissionReview of the creation of `object` in `ns`.
fn create_review(ns: &str, object: Value, uid: &str) -> Value {
    let name = object["metadata"]["name"].clone();
    let gvk = json!({"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"});
    let gvr =
        json!({"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"});
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": name,
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "flood", "groups": ["system:authenticated"]},
            "object": object,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    })
}

fn memcached(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"size": 1},
    })
}

/// A valid review of a Memcached whose annotation pads the body to exactly `size` bytes.
fn padded_review(ns: &str, size: usize) -> Vec<u8> {
    let mut object = memcached(ns, "padded");
    object["metadata"]["annotations"] = json!({"example.com/filler": ""});
    let base = serde_json::to_vec(&create_review(ns, object.clone(), "padded")).expect("JSON");
    object["metadata"]["annotations"]["example.com/filler"] = json!("x".repeat(size - base.len()));
    let body = serde_json::to_vec(&create_review(ns, object, "padded")).expect("JSON");
    assert_eq!(body.len(), size);
    body
}

/// A review whose object carries an array of one-key objects, about `size` bytes: JSON that
/// takes some 90 times its size as `serde_json::Value`s.
fn dense_review(ns: &str, size: usize) -> Vec<u8> {
    let mut object = memcached(ns, "dense");
    object["dense"] = json!([]);
    let base = serde_json::to_vec(&create_review(ns, object, "dense")).expect("JSON");
    let text = String::from_utf8(base).expect("UTF-8");
    let items = (size - text.len()) / 8;
    let filler = vec![r#"{"a":0}"#; items].join(",");
    text.replacen(r#""dense":[]"#, &format!(r#""dense":[{filler}]"#), 1)
        .into_bytes()
}

/// A TLS client trusting the cluster CA (which signed the webhook's certificate).
fn tls_connector(ca_pem: &str) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// One POST of `body` over a new TLS connection, written `chunk` bytes at a time with
/// `pause` between chunks while the response is read: the HTTP status (0 when the
/// connection ended without one) and the response body.
async fn post(
    tls: &TlsConnector,
    addr: SocketAddr,
    path: &str,
    body: Arc<Vec<u8>>,
    chunk: usize,
    pause: Duration,
) -> (u16, Vec<u8>) {
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").expect("server name");
        tls.connect(name, tcp).await
    };
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(60), connect).await else {
        return (0, Vec::new());
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        for part in body.chunks(chunk) {
            wr.write_all(part).await?;
            wr.flush().await?;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        // The write half stays open until the response is read.
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(())
    });
    let mut raw = Vec::new();
    // TLS peers may close without close_notify; what was read is kept.
    let _ = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut raw)).await;
    writer.abort();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let head = String::from_utf8_lossy(&raw[..split.unwrap_or(raw.len())]).to_string();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = split.map(|i| raw[i + 4..].to_vec()).unwrap_or_default();
    (status, body)
}

/// Responses per (kind of client, HTTP status).
#[derive(Default)]
struct Tally(Mutex<BTreeMap<(&'static str, u16), u64>>);

impl Tally {
    fn add(&self, who: &'static str, status: u16) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry((who, status)).or_default() += 1;
    }
    fn get(&self, who: &'static str, status: u16) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(who, status)).copied().unwrap_or(0)
    }
    fn snapshot(&self) -> BTreeMap<(&'static str, u16), u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One observation of the Lease: its holder and renewTime.
#[derive(Clone, Debug, PartialEq)]
struct LeaseSeen {
    holder: Option<String>,
    renew: Option<String>,
}

async fn lease(client: &Client, ns: &str) -> Option<LeaseSeen> {
    let spec = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?;
    Some(LeaseSeen {
        holder: spec.holder_identity,
        renew: spec.renew_time.map(|t| t.0.to_string()),
    })
}

/// `memcached-operator run` in `ns` with leader election on the namespace's Lease and the
/// webhooks on a free port with a certificate of the cluster CA; returns once it holds the
/// Lease (with its identity) and its webhook port listens.
async fn start_operator(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    dir: &TempDir,
) -> (Operator, SocketAddr, String) {
    let (cert, key) = cp
        .serving_cert(&["127.0.0.1", "localhost"])
        .expect("serving certificate");
    let cert_dir = dir.path().join("certs");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    std::fs::write(cert_dir.join("tls.crt"), cert).expect("write tls.crt");
    std::fs::write(cert_dir.join("tls.key"), key).expect("write tls.key");
    let port = free_port();
    let mut args = vec![
        format!("--namespace={ns}"),
        "--leader-elect".to_string(),
        format!("--leader-election-namespace={ns}"),
        "--metrics-bind-address=0".into(),
        "--health-probe-bind-address=0".into(),
        format!("--webhook-port={port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ];
    args.extend(LEASE_FLAGS.iter().map(|f| f.to_string()));
    let mut op = Operator::spawn(
        cp.kubeconfig(),
        dir.path(),
        "op-flood",
        &args,
        &[("ENABLE_WEBHOOKS", "true")],
    );
    let identity = wait_for_within(
        "the operator holds the Lease",
        Duration::from_secs(60),
        || async {
            lease(client, ns)
                .await?
                .holder
                .filter(|h| h.starts_with("op-flood_"))
        },
    )
    .await;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(op.exited().is_none(), "the operator exited:\n{}", op.logs());
        assert!(
            Instant::now() < deadline,
            "the webhook port does not listen:\n{}",
            op.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (op, addr, identity)
}

/// Registers the webhooks of `config/webhook` for `ns`, pointed at `port`, and waits until
/// the API server calls them: a dry run of an object only the validating webhook refuses
/// says when. Returns the configurations' names.
async fn register_webhooks(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    port: u16,
) -> (String, String) {
    let (mutating, validating) = webhook_configurations(ns, port, cp.ca_pem());
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .expect("the API server accepts the MutatingWebhookConfiguration");
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .expect("the API server accepts the ValidatingWebhookConfiguration");
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let probe: Memcached = serde_json::from_value(json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "probe"}, "spec": {"size": 1, "containerPort": 9150}
    }))
    .expect("Memcached");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for_within(
        "the API server calls the webhook",
        Duration::from_secs(60),
        || async {
            match memcacheds.create(&dry_run, &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains("admission webhook") => Some(()),
                _ => None,
            }
        },
    )
    .await;
    (
        mutating.metadata.name.unwrap_or_default(),
        validating.metadata.name.unwrap_or_default(),
    )
}

/// The flood's clients, each sending until `end`: their answers go to `tally`, and valid
/// reviews the webhook admitted are counted in `admitted`.
fn flood(
    tls: &TlsConnector,
    addr: SocketAddr,
    ns: &str,
    end: Instant,
    tally: &Arc<Tally>,
    admitted: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use memcached_operator::webhook::{MUTATE_PATH, VALIDATE_PATH};
    let mut clients = Vec::new();
    let slow_body = Arc::new(padded_review(ns, SLOW_BODY));
    for i in 0..SLOW_CLIENTS {
        let (tls, tally, body) = (tls.clone(), tally.clone(), slow_body.clone());
        let path = if i % 2 == 0 {
            VALIDATE_PATH
        } else {
            MUTATE_PATH
        };
        clients.push(tokio::spawn(async move {
            while Instant::now() < end {
                let (status, _) =
                    post(&tls, addr, path, body.clone(), SLOW_CHUNK, SLOW_PAUSE).await;
                tally.add("slow", status);
            }
        }));
    }
    let dense = Arc::new(dense_review(ns, SLOW_BODY));
    for _ in 0..BOMB_CLIENTS {
        let (tls, tally, body) = (tls.clone(), tally.clone(), dense.clone());
        clients.push(tokio::spawn(async move {
            while Instant::now() < end {
                let (status, _) = post(
                    &tls,
                    addr,
                    VALIDATE_PATH,
                    body.clone(),
                    64 * 1024,
                    Duration::ZERO,
                )
                .await;
                tally.add("dense", status);
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }));
    }
    for i in 0..VALID_CLIENTS {
        let (tls, tally, admitted, ns) =
            (tls.clone(), tally.clone(), admitted.clone(), ns.to_string());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < end {
                n += 1;
                let name = format!("valid-{i}-{n}");
                let review = create_review(&ns, memcached(&ns, &name), &name);
                let body = Arc::new(serde_json::to_vec(&review).expect("JSON"));
                let (status, body) =
                    post(&tls, addr, VALIDATE_PATH, body, 64 * 1024, Duration::ZERO).await;
                tally.add("valid", status);
                let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
                if status == 200 && answer["response"]["allowed"] == true {
                    admitted.fetch_add(1, Ordering::Relaxed);
                } else {
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }));
    }
    clients
}

/// The flood. What a user cares about, asserted at the end: the operator's peak resident
/// memory is under the manager's memory limit; the Lease was held by it at every look and
/// renewed throughout; the process still runs and then stops cleanly on SIGTERM; and every
/// Memcached created through the API server during the flood was admitted. "Admitted" means
/// the create call succeeded and the object is stored: the API server called both webhooks
/// and got an answer within their 10 s timeout, retrying a 429 after its Retry-After on its
/// own as it does for every webhook call; the test itself never retries a create.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_the_webhook_port_costs_neither_memory_nor_the_lease_nor_admission() {
    let limit = manager_memory_limit();
    let cp = ControlPlane::shared(Kube::Newest).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    let ns = cp
        .namespace("flood")
        .await
        .unwrap_or_else(|e| panic!("namespace: {e}"));
    apply_crd(&client, &Memcached::crd()).await;
    let dir = TempDir::new("flood");
    let (mut op, addr, identity) = start_operator(cp, &client, &ns, &dir).await;
    let (mutating, validating) = register_webhooks(cp, &client, &ns, addr.port()).await;
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), &ns);

    let pid = op.pid();
    let idle = rss(pid).expect("the operator's VmRSS");
    let start = Instant::now();
    // Resident memory every 20 ms, and the Lease every 200 ms, until the flood's clients
    // are all done.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(rss(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let watcher = {
        let (client, ns, sampling) = (client.clone(), ns.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                if let Some(l) = lease(&client, &ns).await {
                    seen.push(l);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            seen
        })
    };
    let tally = Arc::new(Tally::default());
    let admitted = Arc::new(AtomicU64::new(0));
    let tls = tls_connector(cp.ca_pem());
    let clients = flood(&tls, addr, &ns, start + FLOOD, &tally, &admitted);

    // Memcacheds created through the API server while the flood runs.
    let mut creates = Vec::new();
    for i in 0..GOOD_CREATES {
        tokio::time::sleep_until((start + Duration::from_secs(2 + 4 * i as u64)).into()).await;
        let name = format!("good-{i}");
        let mc: Memcached = serde_json::from_value(memcached(&ns, &name)).expect("Memcached");
        let began = Instant::now();
        let result = memcacheds.create(&PostParams::default(), &mc).await;
        println!(
            "{name}: {:?} after {:?}",
            result.as_ref().map(|_| "created"),
            began.elapsed()
        );
        creates.push((name, result));
    }
    for c in clients {
        let _ = c.await;
    }
    let flood_took = start.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    let seen = watcher.await.expect("lease watcher");

    let tallied = tally.snapshot();
    println!("flood of {flood_took:?}: responses per client kind and HTTP status {tallied:?}");
    println!(
        "valid reviews admitted by the webhook: {}",
        admitted.load(Ordering::Relaxed)
    );
    println!(
        "operator VmRSS: {:.1} MiB idle, {:.1} MiB peak during the flood (limit {:.0} MiB)",
        mib(idle),
        mib(peak),
        mib(limit)
    );
    let mut renewals: Vec<jiff::Timestamp> = seen
        .iter()
        .filter_map(|l| l.renew.as_deref()?.parse().ok())
        .collect();
    renewals.dedup();
    let longest = renewals
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default();
    println!(
        "{} looks at the Lease, {} renewals seen, longest time between two: {longest:#}",
        seen.len(),
        renewals.len()
    );

    // The process runs on, still leading.
    assert!(
        op.exited().is_none(),
        "the operator exited during the flood:\n{}",
        op.logs()
    );
    assert!(
        !op.logs().contains("leader election lost"),
        "the operator lost its Lease:\n{}",
        op.logs()
    );
    // Memory within the Deployment's limit.
    assert!(
        peak < limit,
        "peak VmRSS {:.1} MiB is over the manager's limit of {:.0} MiB",
        mib(peak),
        mib(limit)
    );
    // The Lease held by the operator at every look, and renewed again and again.
    assert!(!seen.is_empty());
    for l in &seen {
        assert_eq!(l.holder.as_deref(), Some(identity.as_str()), "{seen:?}");
    }
    assert!(
        renewals.windows(2).all(|w| w[0] < w[1]),
        "renewTime goes only forward: {renewals:?}"
    );
    assert!(
        renewals.len() >= 4,
        "the Lease was renewed only {} times during the flood",
        renewals.len()
    );
    // Every Memcached created through the API server was admitted and stored.
    for (name, result) in &creates {
        assert!(
            result.is_ok(),
            "{name} was not admitted during the flood: {result:?}"
        );
        assert!(
            memcacheds.get_opt(name).await.expect("get").is_some(),
            "{name} stored"
        );
    }
    // The flood met the bounds: large bodies beyond the memory bound were refused at once,
    // dense JSON was refused before it was decoded (413, or 429 while large bodies held
    // their share), valid reviews were answered, and no client got a server error.
    assert!(tally.get("slow", 429) > 0, "{tallied:?}");
    assert!(
        tally.get("dense", 413) + tally.get("dense", 429) > 0,
        "{tallied:?}"
    );
    assert_eq!(tally.get("dense", 200), 0, "{tallied:?}");
    assert!(admitted.load(Ordering::Relaxed) > 0, "{tallied:?}");
    // And most valid reviews were answered at their first try: the dry runs do not wait
    // behind the flood's TLS handshakes (on the server's thread they took 1.5–2.9 s each,
    // and 166 valid reviews were refused against 34 admitted).
    assert!(
        tally.get("valid", 200) > tally.get("valid", 429),
        "more valid reviews refused as busy than admitted: {tallied:?}"
    );
    for ((who, status), n) in &tallied {
        assert!(
            *status < 500,
            "{n} {who} clients got HTTP {status}: {tallied:?}"
        );
    }

    // SIGTERM: a clean stop that releases the Lease, webhook server and all.
    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());
    assert!(op.logs().contains("released leader lease"), "{}", op.logs());

    let dp = DeleteParams::default();
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(&mutating, &dp)
        .await;
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(&validating, &dp)
        .await;
}
