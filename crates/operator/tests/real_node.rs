//! The operator (in-process: pods on the real node cannot reach the API server) running real
//! memcached on the real node (crates/envtest: containerd, runc and the pinned kubelet), on
//! each pinned version: what the kwok suites only simulate, the kubelet decides here.
//! - the seed's sample (config/samples, placed on the real node): pods Ready by their
//!   probes, a value set on each pod through its pod IP read back, `status.nodes` naming
//!   them, scaled to 5 and back to 3, nothing restarted;
//! - TLS `InPlace`: the Secret rotated, the kubelet swaps the mounted files, the reload
//!   agent (its own image, `/memcached-tls-agent`) has memcached load them: the next
//!   handshake on each pod IP presents the new certificate, every item is still there, no
//!   container restarted, and `CertificatesReloaded` is `True` (`InPlace`);
//! - SASL, with an image that has no SASL configuration of its own (as the official images
//!   do not) and the ANONYMOUS plugin: memcached starts, offers PLAIN alone, serves a client
//!   with the Secret's password and refuses one without it, with a wrong one or ANONYMOUS;
//!   and a SASL pool the last release (`make previous-release`) left crash-looping serves
//!   once this build takes over;
//! - the exporter (its image built from hack/memcached-exporter, the version the operator
//!   runs by default): the ServiceMonitor the operator writes leads, through the Service and
//!   the EndpointSlices Kubernetes keeps, to each pod's exporter, which reports its own
//!   pod's memcached (up, its items, its hits and misses); the families it exports are
//!   hack/memcached-exporter/metrics.txt, and those of the kubelet's cAdvisor endpoint
//!   include hack/node/cadvisor-metrics.txt: the alerts and dashboards are checked against
//!   both (crates/gen/tests/monitoring.rs).
//!
//! Needs root and `make node` (the kubelet, containerd, and bin/node-images: memcached built
//! with SASL by `make memcached-proxy`, the TLS reload agent, the exporter). Clients use pod
//! IPs, reachable from the host on the node's bridge.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use envtest::Kube;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_api::{Memcached, MemcachedSpec, RolloutSpec, SaslSpec, TlsSpec, condition};
use serde_json::json;

mod common;
use common::process::{Operator, TempDir, previous_release};
use common::real_node::{CONVERGE, Env, Text, assert_no_restarts, blocking, connect, plain, poll};

/// How long a rotated Secret may take to reach the pods and be loaded: the kubelet
/// refreshes a Secret volume at its periodic sync (about a minute, plus its cache's TTL),
/// the agent looks every 2 s.
const ROTATION: Duration = Duration::from_secs(420);

/// One real node at a time in this binary (and, across binaries, `flock /tmp/real-node.lock`).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The seed's sample, as `kubectl apply -k config/samples` creates it.
const SAMPLE: &str = include_str!("../../../config/samples/memcached_v1_memcached.yaml");

use common::tls::TlsStream;

/// A new TLS connection to memcached at `ip`, and the DER of the certificate it presented.
fn tls(ip: Ipv4Addr) -> Result<(Text<TlsStream>, Vec<u8>), String> {
    let (stream, presented) = common::tls::connect(SocketAddr::from((ip, 11211)))?;
    Ok((Text(BufReader::new(stream)), presented))
}

struct Cert {
    pem: String,
    key_pem: String,
    der: Vec<u8>,
}

fn self_signed(name: &str) -> Cert {
    let certified = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("rcgen");
    Cert {
        pem: certified.cert.pem(),
        key_pem: certified.signing_key.serialize_pem(),
        der: certified.cert.der().to_vec(),
    }
}

fn tls_secret(cert: &Cert) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("certs".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(cert.pem.clone().into())),
            (
                "tls.key".to_string(),
                ByteString(cert.key_pem.clone().into()),
            ),
        ])),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// memcached's binary protocol, for SASL

/// One binary-protocol request; the answer's status and value, or `None` when memcached
/// closed the connection instead.
fn try_binary(
    s: &mut TcpStream,
    opcode: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let body = extras.len() + key.len() + value.len();
    let mut req = vec![0x80, opcode];
    req.extend((key.len() as u16).to_be_bytes());
    req.push(extras.len() as u8);
    req.push(0); // data type
    req.extend(0u16.to_be_bytes()); // vbucket
    req.extend((body as u32).to_be_bytes());
    req.extend(0u32.to_be_bytes()); // opaque
    req.extend(0u64.to_be_bytes()); // cas
    req.extend(extras);
    req.extend(key);
    req.extend(value);
    s.write_all(&req).ok()?;
    let mut header = [0u8; 24];
    s.read_exact(&mut header).ok()?;
    assert_eq!(header[0], 0x81, "a response's magic");
    let status = u16::from_be_bytes([header[6], header[7]]);
    let total = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let (extras_len, key_len) = (
        header[4] as usize,
        u16::from_be_bytes([header[2], header[3]]) as usize,
    );
    let mut rest = vec![0; total];
    s.read_exact(&mut rest).ok()?;
    Some((status, rest[extras_len + key_len..].to_vec()))
}

/// One binary-protocol request; the answer's status and value.
fn binary(
    s: &mut TcpStream,
    opcode: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
) -> (u16, Vec<u8>) {
    try_binary(s, opcode, key, extras, value)
        .unwrap_or_else(|| panic!("memcached closed the connection instead of answering"))
}

const SASL_LIST_MECHS: u8 = 0x20;
const SASL_AUTH: u8 = 0x21;
const GET: u8 = 0x00;
const SET: u8 = 0x01;
const STATUS_OK: u16 = 0x0000;
const STATUS_AUTH_ERROR: u16 = 0x0020;

/// A SASL PLAIN authentication; memcached's status.
fn sasl_plain(s: &mut TcpStream, user: &str, password: &str) -> u16 {
    let token = format!("\0{user}\0{password}");
    binary(s, SASL_AUTH, b"PLAIN", &[], token.as_bytes()).0
}

fn binary_set(s: &mut TcpStream, key: &str, value: &str) -> u16 {
    // flags, expiry
    binary(s, SET, key.as_bytes(), &[0; 8], value.as_bytes()).0
}

fn binary_get(s: &mut TcpStream, key: &str) -> (u16, Vec<u8>) {
    binary(s, GET, key.as_bytes(), &[], &[])
}

// ---------------------------------------------------------------------------------------
// 1. The seed's sample

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_runs_real_memcached_newest() {
    the_sample_runs_real_memcached_and_scales(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_runs_real_memcached_oldest() {
    the_sample_runs_real_memcached_and_scales(Kube::Oldest).await;
}

async fn the_sample_runs_real_memcached_and_scales(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = Env::start(kube, "sample").await;
    let memcacheds: Api<Memcached> = env.api();
    let mut sample: Memcached = serde_yaml::from_str(SAMPLE).expect("config/samples parses");
    assert_eq!(sample.spec.size, 3, "the seed's sample");
    env.on_the_real_node(&mut sample.spec);
    let name = sample.name_any();
    let started = Instant::now();
    memcacheds
        .create(&PostParams::default(), &sample)
        .await
        .unwrap();

    let pool = env.ready_pool(&name, 3).await;
    println!(
        "{kube:?}: 3 real memcached pods Ready after {:?}: {pool:?}",
        started.elapsed()
    );
    let subnet = env.node.pod_subnet.trim_end_matches("0/24").to_string();
    for (pod, ip) in &pool {
        assert!(ip.to_string().starts_with(&subnet), "{pod} at {ip}");
        blocking(|| {
            let mut c = plain(*ip);
            c.set("owner", pod);
            assert_eq!(
                c.get("owner").as_deref(),
                Some(pod.as_str()),
                "{pod} at {ip}"
            );
        });
    }
    // Each pod is its own memcached: reading back through a new connection gives its value.
    for (pod, ip) in &pool {
        let got = blocking(|| plain(*ip).get("owner"));
        assert_eq!(got.as_deref(), Some(pod.as_str()), "{pod} at {ip}");
    }

    // Scale to 5: two more real pods, each answering.
    let started = Instant::now();
    memcacheds
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    let five = env.ready_pool(&name, 5).await;
    println!("{kube:?}: scaled to 5 in {:?}", started.elapsed());
    for pod in pool.keys() {
        assert!(
            five.contains_key(pod),
            "{pod} kept while scaling up: {five:?}"
        );
    }
    for (pod, ip) in &five {
        blocking(|| {
            let mut c = plain(*ip);
            c.set("scaled", "5");
            assert_eq!(c.get("scaled").as_deref(), Some("5"), "{pod} at {ip}");
        });
    }

    // And back to 3: the pods that stay keep their values.
    let started = Instant::now();
    memcacheds
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}})),
        )
        .await
        .unwrap();
    let three = env.ready_pool(&name, 3).await;
    println!("{kube:?}: back to 3 in {:?}: {three:?}", started.elapsed());
    for (pod, ip) in &three {
        assert!(five.contains_key(pod), "{pod} was one of the 5: {five:?}");
        let got = blocking(|| plain(*ip).get("scaled"));
        assert_eq!(got.as_deref(), Some("5"), "{pod} at {ip} kept its items");
        if pool.contains_key(pod) {
            let got = blocking(|| plain(*ip).get("owner"));
            assert_eq!(got.as_deref(), Some(pod.as_str()), "{pod} at {ip}");
        }
    }
    assert_no_restarts(&env.restarts(&name).await, 3);
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 2. TLS, the certificate reloaded in place

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_reloaded_in_place_newest() {
    a_rotated_certificate_is_reloaded_in_place(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_reloaded_in_place_oldest() {
    a_rotated_certificate_is_reloaded_in_place(Kube::Oldest).await;
}

async fn a_rotated_certificate_is_reloaded_in_place(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = Env::start(kube, "tls").await;
    let secrets: Api<Secret> = env.api();
    let memcacheds: Api<Memcached> = env.api();
    let (first, second) = (
        self_signed("memcached.first"),
        self_signed("memcached.second"),
    );
    secrets
        .create(&PostParams::default(), &tls_secret(&first))
        .await
        .unwrap();
    let mut spec = MemcachedSpec {
        tls: Some(TlsSpec::secret("certs")),
        rollout: Some(RolloutSpec {
            min_ready_seconds: 0,
            ..Default::default()
        }),
        ..MemcachedSpec::with_size(3)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(&PostParams::default(), &Memcached::new("tls", spec))
        .await
        .unwrap();
    let pool = env.ready_pool("tls", 3).await;
    let in_place = |m: &Memcached| {
        m.condition(condition::CERTIFICATES_RELOADED)
            .is_some_and(|c| c.status == "True" && c.reason == "InPlace")
    };
    poll("CertificatesReloaded=True (InPlace)", CONVERGE, || async {
        memcacheds.get("tls").await.ok().filter(in_place)
    })
    .await;

    // Items on each pod, over TLS; the first certificate presented.
    let items: Vec<(String, String)> = (0..20)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    for (pod, ip) in &pool {
        blocking(|| {
            let (mut c, presented) = tls(*ip).unwrap();
            assert!(
                presented == first.der,
                "{pod} at {ip} presents the first certificate"
            );
            for (k, v) in &items {
                c.set(k, v);
            }
        });
    }

    // Rotate: a new certificate and key in the same Secret.
    let rotated = Instant::now();
    secrets
        .replace("certs", &PostParams::default(), &{
            let mut s = secrets.get("certs").await.unwrap();
            s.data = tls_secret(&second).data;
            s
        })
        .await
        .unwrap();
    let mut reloaded = BTreeMap::new();
    while reloaded.len() < pool.len() {
        for (pod, ip) in &pool {
            if reloaded.contains_key(pod) {
                continue;
            }
            if let Ok((_, presented)) = blocking(|| tls(*ip))
                && presented == second.der
            {
                reloaded.insert(pod.clone(), rotated.elapsed());
            }
        }
        assert!(
            rotated.elapsed() < ROTATION,
            "within {ROTATION:?} of the Secret's rotation, only {reloaded:?} presented the \
             new certificate (pods: {pool:?}); CertificatesReloaded: {:?}",
            memcacheds
                .get("tls")
                .await
                .ok()
                .and_then(|m| m.condition(condition::CERTIFICATES_RELOADED).cloned())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{kube:?}: the new certificate presented by each pod after: {reloaded:?}");

    // No restart, no rollout: the same pods, every item still there.
    let after = env.ready_pool("tls", 3).await;
    assert_eq!(after, pool, "the same pods, at the same addresses");
    for (pod, ip) in &pool {
        blocking(|| {
            let (mut c, presented) = tls(*ip).unwrap();
            assert!(presented == second.der, "{pod} at {ip}");
            for (k, v) in &items {
                assert_eq!(c.get(k).as_ref(), Some(v), "{k} on {pod} at {ip}");
            }
        });
    }
    // memcached and its reload agent (a native sidecar) in each of the 3 pods.
    assert_no_restarts(&env.restarts("tls").await, 6);
    let m = memcacheds.get("tls").await.unwrap();
    let c = m.condition(condition::CERTIFICATES_RELOADED).cloned();
    assert!(
        in_place(&m),
        "CertificatesReloaded after the rotation: {c:?}"
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 3. SASL

/// The Secret `sasl` (one user) and the Memcached `sasl` (2 pods on the real node) using
/// it; the user and password.
async fn create_sasl_pool(env: &Env) -> (&'static str, &'static str) {
    let secrets: Api<Secret> = env.api();
    let memcacheds: Api<Memcached> = env.api();
    // memcached appends its host's name (the pod's) to a user name without `@` before it
    // looks the user up, so the database's users (and the clients') name a domain.
    let (user, password) = ("app@memcached", "s3cret-on-the-node");
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("sasl".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "sasl-pwdb".to_string(),
                    ByteString(format!("{user}:{password}\n").into()),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut spec = MemcachedSpec {
        sasl: Some(SaslSpec {
            secret_name: "sasl".into(),
        }),
        ..MemcachedSpec::with_size(2)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(&PostParams::default(), &Memcached::new("sasl", spec))
        .await
        .unwrap();
    (user, password)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_serves_only_the_password_newest() {
    sasl_serves_only_the_password(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_serves_only_the_password_oldest() {
    sasl_serves_only_the_password(Kube::Oldest).await;
}

async fn sasl_serves_only_the_password(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = Env::start(kube, "sasl").await;
    let (user, password) = create_sasl_pool(&env).await;
    let pool = env.ready_pool("sasl", 2).await;
    for (pod, ip) in &pool {
        blocking(|| {
            // With the Secret's password: authenticated, then served.
            let mut s = connect(*ip);
            assert_eq!(sasl_plain(&mut s, user, password), STATUS_OK, "{pod}: auth");
            assert_eq!(binary_set(&mut s, "greeting", pod), STATUS_OK, "{pod}: set");
            let (status, value) = binary_get(&mut s, "greeting");
            assert_eq!(
                (status, value),
                (STATUS_OK, pod.as_bytes().to_vec()),
                "{pod}"
            );

            // Without authenticating: refused (memcached answers "Auth failure." and closes
            // the connection).
            let mut s = connect(*ip);
            let (status, value) = binary_get(&mut s, "greeting");
            assert_eq!(
                status, STATUS_AUTH_ERROR,
                "{pod}: unauthenticated get: {value:?}"
            );
            let mut s = connect(*ip);
            assert_eq!(
                binary_set(&mut s, "greeting", "x"),
                STATUS_AUTH_ERROR,
                "{pod}"
            );
            // memcached offers PLAIN alone, though the image's SASL plugins include
            // ANONYMOUS (as Debian's libsasl2-modules do): with no `mech_list` Cyrus SASL
            // offers every plugin ("PLAIN ANONYMOUS" here). ANONYMOUS gets nothing.
            let mut s = connect(*ip);
            let (status, mechs) = binary(&mut s, SASL_LIST_MECHS, b"", &[], b"");
            assert_eq!(
                (status, String::from_utf8_lossy(&mechs).trim().to_string()),
                (STATUS_OK, "PLAIN".to_string()),
                "{pod}: the mechanisms offered"
            );
            let mut s = connect(*ip);
            let (status, _) = binary(&mut s, SASL_AUTH, b"ANONYMOUS", &[], b"anyone");
            assert_eq!(status, STATUS_AUTH_ERROR, "{pod}: ANONYMOUS");
            let after = try_binary(&mut s, GET, b"greeting", &[], &[]);
            assert!(
                after
                    .as_ref()
                    .is_none_or(|(status, _)| *status == STATUS_AUTH_ERROR),
                "{pod}: a get after ANONYMOUS: {after:?}"
            );
            // With a wrong password: refused, and then served nothing.
            let mut s = connect(*ip);
            assert_eq!(
                sasl_plain(&mut s, user, "wrong"),
                STATUS_AUTH_ERROR,
                "{pod}"
            );
            let after = try_binary(&mut s, GET, b"greeting", &[], &[]);
            assert!(
                after
                    .as_ref()
                    .is_none_or(|(status, _)| *status == STATUS_AUTH_ERROR),
                "{pod}: a get after a refused authentication: {after:?}"
            );
            // The text protocol is off (SASL makes memcached binary-only).
            let mut s = connect(*ip);
            s.write_all(b"get greeting\r\n").unwrap();
            let mut answer = String::new();
            let _ = BufReader::new(&mut s).read_line(&mut answer);
            assert!(
                !answer.starts_with("VALUE"),
                "{pod}: text get answered {answer:?}"
            );
        });
    }
    // The value set by the authenticated client is still there (nothing unauthenticated
    // overwrote it), and no container restarted.
    for (pod, ip) in &pool {
        blocking(|| {
            let mut s = connect(*ip);
            assert_eq!(sasl_plain(&mut s, user, password), STATUS_OK);
            assert_eq!(binary_get(&mut s, "greeting").1, pod.as_bytes(), "{pod}");
        });
    }
    assert_no_restarts(&env.restarts("sasl").await, 2);
    env.stop().await;
}

// The last release gave memcached no SASL configuration: with an image that has none of its
// own (the official images), its SASL pools never started. The upgrade repairs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_pool_the_last_release_left_down_serves_after_the_upgrade() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut env = Env::without_controller(Kube::Newest, "sasl-upgrade").await;
    let dir = TempDir::new("sasl-upgrade");
    let previous = Operator::spawn_program(
        &previous_release(),
        env.cp.kubeconfig(),
        dir.path(),
        "previous-release",
        &[
            format!("--namespace={}", env.ns),
            "--metrics-bind-address=0".to_string(),
            "--health-probe-bind-address=0".to_string(),
            format!("--memcached-image={}", env.node.memcached_image),
            format!("--tls-agent-image={}", env.node.tls_agent_image),
        ],
        &[("RUST_LOG", "info")],
    );
    let (user, password) = create_sasl_pool(&env).await;
    // Under the last release memcached exits at start ("Error initializing sasl.").
    poll(
        "the last release's memcached restarted by the kubelet",
        CONVERGE,
        || async {
            env.restarts("sasl")
                .await
                .iter()
                .any(|(_, container, n)| container == "memcached" && *n >= 1)
                .then_some(())
        },
    )
    .await;
    let deployments: Api<Deployment> = env.api();
    let available = deployments
        .get("sasl")
        .await
        .unwrap()
        .status
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    assert_eq!(available, 0, "the last release's SASL pool serves");
    drop(previous);

    env.start_controller();
    let pool = env.ready_pool("sasl", 2).await;
    for (pod, ip) in &pool {
        blocking(|| {
            let mut s = connect(*ip);
            assert_eq!(sasl_plain(&mut s, user, password), STATUS_OK, "{pod}: auth");
            assert_eq!(binary_set(&mut s, "greeting", pod), STATUS_OK, "{pod}: set");
            assert_eq!(binary_get(&mut s, "greeting").1, pod.as_bytes(), "{pod}");
        });
    }
    assert_no_restarts(&env.restarts("sasl").await, 2);
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 4. The exporter, scraped where the ServiceMonitor points

/// The families the shipped exporter exports from memcached as the operator runs it
/// (`# TYPE` lines), one per line: what alerts and dashboards may use.
const EXPORTER_FAMILIES: &str = include_str!("../../../hack/memcached-exporter/metrics.txt");
const EXPORTER_FAMILIES_PATH: &str = "hack/memcached-exporter/metrics.txt";
/// The families the pinned kubelets' cAdvisor endpoint exports (both versions have each).
const CADVISOR_FAMILIES: &str = include_str!("../../../hack/node/cadvisor-metrics.txt");
const CADVISOR_FAMILIES_PATH: &str = "hack/node/cadvisor-metrics.txt";

/// `GET path` over plain HTTP/1.0; the status and the body.
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("reading {addr}{path}: {e}"))?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// A sample's value in Prometheus' text format: `name{labels} value` with the labels
/// written as the exporter writes them (sorted), or `name value` for `labels` "".
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let series = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    metrics.lines().find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok())?
    })
}

fn families(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// What Prometheus scrapes for a ServiceMonitor: the Services its selector matches in its
/// namespace, their EndpointSlices' Ready addresses, at the port of the endpoint's `port`
/// name; pod name → address (`kube-controller-manager` and the kubelet decide them).
async fn monitor_targets(env: &Env, monitor: &str) -> Option<BTreeMap<String, SocketAddr>> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
    let monitors: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), &env.ns, &ApiResource::from_gvk(&gvk));
    let sm = monitors.get(monitor).await.ok()?;
    let selector = sm.data["spec"]["selector"]["matchLabels"].as_object()?;
    let labels = selector
        .iter()
        .map(|(k, v)| Some(format!("{k}={}", v.as_str()?)))
        .collect::<Option<Vec<_>>>()?
        .join(",");
    let port = sm.data["spec"]["endpoints"][0]["port"]
        .as_str()?
        .to_string();
    let services = env
        .api::<Service>()
        .list(&ListParams::default().labels(&labels))
        .await
        .ok()?;
    let mut targets = BTreeMap::new();
    for svc in services.items {
        let slices = env
            .api::<EndpointSlice>()
            .list(
                &ListParams::default()
                    .labels(&format!("kubernetes.io/service-name={}", svc.name_any())),
            )
            .await
            .ok()?;
        for slice in slices.items {
            let Some(number) = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(&*port))
                .and_then(|p| p.port)
            else {
                continue;
            };
            for e in &slice.endpoints {
                let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                let pod = e.target_ref.as_ref().and_then(|r| r.name.clone());
                if let (true, Some(pod), Some(ip)) = (ready, pod, e.addresses.first()) {
                    let ip: Ipv4Addr = ip.parse().ok()?;
                    targets.insert(pod, SocketAddr::from((ip, number as u16)));
                }
            }
        }
    }
    Some(targets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_reports_each_pod_where_the_monitor_points_newest() {
    the_exporter_reports_each_pod_where_the_monitor_points(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_reports_each_pod_where_the_monitor_points_oldest() {
    the_exporter_reports_each_pod_where_the_monitor_points(Kube::Oldest).await;
}

/// A pool with the exporter on the real node: the ServiceMonitor the operator writes leads,
/// through the Service and the EndpointSlices Kubernetes keeps, to each pod's exporter (the
/// image built from hack/memcached-exporter, the version the operator runs by default), and
/// each exporter reports its own pod's memcached: up, the items set on that pod alone, the
/// hits and misses it served. The families it exports are the committed list the alerts and
/// dashboards are checked against.
async fn the_exporter_reports_each_pod_where_the_monitor_points(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = Env::without_controller(kube, "exporter").await;
    common::cluster::apply_crd(&env.client, &common::service_monitor_crd()).await;
    let mut env = env;
    env.start_controller();
    let memcacheds: Api<Memcached> = env.api();
    let mut spec = MemcachedSpec {
        exporter: Some(memcached_api::ExporterSpec {
            enabled: true,
            image: None,
        }),
        ..MemcachedSpec::with_size(2)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(&PostParams::default(), &Memcached::new("exported", spec))
        .await
        .unwrap();
    let pool = env.ready_pool("exported", 2).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    for name in pool.keys() {
        let pod = pods.get(name).await.unwrap();
        let images: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .filter_map(|c| c.image.clone())
            .collect();
        assert!(
            images.contains(&env.node.exporter_image),
            "{name} runs the node's exporter image: {images:?}"
        );
    }

    let targets = poll(
        "the ServiceMonitor's targets are the pool's two Ready pods",
        CONVERGE,
        || async {
            let t = monitor_targets(&env, "exported").await?;
            (t.keys().collect::<Vec<_>>() == pool.keys().collect::<Vec<_>>()).then_some(t)
        },
    )
    .await;

    // Pod i holds i + 1 items; each is read back once, and one key missed.
    for (i, ip) in pool.values().enumerate() {
        blocking(|| {
            let mut c = plain(*ip);
            for k in 0..=i {
                c.set(&format!("key-{k}"), "value");
                assert_eq!(c.get(&format!("key-{k}")).as_deref(), Some("value"));
            }
            assert_eq!(c.get("absent"), None);
        });
    }
    for (i, (pod, addr)) in targets.iter().enumerate() {
        let (status, metrics) = blocking(|| http_get(*addr, "/metrics"))
            .unwrap_or_else(|e| panic!("scraping {pod} at {addr}: {e}"));
        assert_eq!(status, 200, "{pod} at {addr}: {metrics}");
        let at = |name: &str, labels: &str| {
            sample(&metrics, name, labels)
                .unwrap_or_else(|| panic!("{pod} at {addr} exports {name}{{{labels}}}"))
        };
        assert_eq!(at("memcached_up", ""), 1.0, "{pod}: memcached is up");
        assert_eq!(
            at("memcached_current_items", ""),
            (i + 1) as f64,
            "{pod} reports the items set on it alone"
        );
        assert_eq!(
            at("memcached_commands_total", r#"command="set",status="hit""#),
            (i + 1) as f64,
            "{pod}: its sets"
        );
        assert_eq!(
            at("memcached_commands_total", r#"command="get",status="hit""#),
            (i + 1) as f64,
            "{pod}: its hits"
        );
        assert_eq!(
            at("memcached_commands_total", r#"command="get",status="miss""#),
            1.0,
            "{pod}: its miss"
        );
        let exported = families(&metrics);
        if std::env::var_os("UPDATE_EXPORTER_FAMILIES").is_some() {
            let text: String = exported.iter().map(|f| format!("{f}\n")).collect();
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(EXPORTER_FAMILIES_PATH);
            std::fs::write(&path, text).unwrap();
            continue;
        }
        let committed: std::collections::BTreeSet<String> =
            EXPORTER_FAMILIES.lines().map(str::to_string).collect();
        assert_eq!(
            exported, committed,
            "the families {pod}'s exporter exports are {EXPORTER_FAMILIES_PATH} \
             (UPDATE_EXPORTER_FAMILIES=1 rewrites it from this run)"
        );
    }

    // The kubelet's cAdvisor series (what kube-prometheus scrapes for containers' CPU,
    // memory and network), which the proxy's dashboard reads: the committed families are
    // among what this kubelet exports, once the pool's containers are measured.
    let scraped = poll(
        "the kubelet's cAdvisor metrics labelling the pool's memcached containers (cAdvisor \
         asks /run/containerd/containerd.sock, which the node links to its containerd when \
         the path is free: a host's own containerd there hides this node's containers)",
        CONVERGE,
        || async {
            let request = http::Request::get(format!(
                "/api/v1/nodes/{}/proxy/metrics/cadvisor",
                env.node.name
            ))
            .body(Vec::new())
            .ok()?;
            let text = env.client.request_text(request).await.ok()?;
            text.lines()
                .any(|l| {
                    l.starts_with("container_cpu_usage_seconds_total{")
                        && l.contains("container=\"memcached\"")
                })
                .then_some(text)
        },
    )
    .await;
    let exported = families(&scraped);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(CADVISOR_FAMILIES_PATH);
    if std::env::var_os("UPDATE_EXPORTER_FAMILIES").is_some() {
        let text: String = exported.iter().map(|f| format!("{f}\n")).collect();
        std::fs::write(&path, text).unwrap();
    } else {
        let committed: std::collections::BTreeSet<String> =
            CADVISOR_FAMILIES.lines().map(str::to_string).collect();
        let missing: Vec<_> = committed.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{kube:?}'s kubelet does not export {missing:?} of {CADVISOR_FAMILIES_PATH}"
        );
    }
    assert_no_restarts(&env.restarts("exported").await, 4);
    env.stop().await;
}
