//! The admission webhooks end to end: the real server over TLS on 127.0.0.1:0 with a
//! self-signed certificate in a temporary directory, AdmissionReview requests posted with
//! a rustls client; bad objects rejected with messages that name the problem, good ones
//! admitted with the exact defaulting patch and warnings, certificate rotation, the bounds
//! on memory and dry runs in flight (429 beyond them), and a proptest fuzz of the decoder
//! and handlers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use manager::ConnectionLimits;
use manager::webhook_tls::{self, CERT_FILE, CertWatcher, KEY_FILE};
use memcached_api::{Memcached, MemcachedSpec};
use memcached_operator::builders::{self, BuildSettings};
use memcached_operator::webhook::dry_run::ChildrenCheck;
use memcached_operator::webhook::limits::{
    HELD_PER_BODY_BYTE, LARGE_REQUESTS_BYTES, MAX_DRY_RUNS_IN_FLIGHT, MemoryBudget,
};
use memcached_operator::webhook::{
    self, Endpoint, MAX_BODY_BYTES, MUTATE_PATH, VALIDATE_PATH, WebhookConfig, WebhookError,
    WebhookServer,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

mod common;
use common::process::TempDir;
use common::{base64_decode, wait_for};

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------------------------
// Fixtures: a temporary certificate directory, the server, a minimal HTTPS client.

/// Writes a fresh self-signed pair into `dir`; returns its certificate.
fn write_cert(dir: &Path) -> CertificateDer<'static> {
    let pem = webhook_tls::generate_self_signed(&["localhost".into(), "127.0.0.1".into()])
        .expect("self-signed certificate");
    std::fs::write(dir.join(KEY_FILE), &pem.key_pem).expect("write key");
    std::fs::write(dir.join(CERT_FILE), &pem.cert_pem).expect("write cert");
    CertificateDer::from_pem_slice(pem.cert_pem.as_bytes()).expect("cert parses")
}

struct Server {
    addr: SocketAddr,
    dir: TempDir,
    /// The served certificate's watcher (its count of failed reloads).
    certs: Arc<CertWatcher>,
    cert: CertificateDer<'static>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), WebhookError>>,
}

impl Server {
    async fn start() -> Server {
        Self::start_with(ConnectionLimits::default()).await
    }

    async fn start_with(limits: ConnectionLimits) -> Server {
        Self::start_within(limits, MemoryBudget::default()).await
    }

    async fn start_within(limits: ConnectionLimits, memory: MemoryBudget) -> Server {
        let dir = TempDir::new("server");
        let cert = write_cert(dir.path());
        let server = WebhookServer::bind(WebhookConfig {
            bind: "127.0.0.1:0".parse().expect("addr"),
            cert_dir: dir.path().to_path_buf(),
            default_image: memcached_api::DEFAULT_IMAGE.to_string(),
        })
        .await
        .expect("webhook server binds")
        .with_reload_interval(Duration::from_millis(100))
        .with_limits(limits)
        .with_memory_budget(memory);
        let addr = server.local_addr().expect("local addr");
        let certs = server.certificates();
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.run(stop.clone()));
        Server {
            addr,
            dir,
            certs,
            cert,
            stop,
            task,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Reply {
        let body = serde_json::to_vec(body).expect("encode");
        https(self.addr, path, "application/json", body, BodyMode::Length).await
    }

    async fn shutdown(self) {
        self.stop.cancel();
        let result = tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("server stops on cancel")
            .expect("server task");
        assert!(result.is_ok(), "{result:?}");
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    /// The status line and headers.
    head: String,
    body: String,
    cert: Option<CertificateDer<'static>>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.body))
    }
    fn response(&self) -> Value {
        self.json()["response"].clone()
    }
    fn message(&self) -> String {
        self.response()["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    fn allowed(&self) -> bool {
        self.response()["allowed"].as_bool() == Some(true)
    }
    fn warnings(&self) -> Vec<String> {
        serde_json::from_value(self.response()["warnings"].clone()).unwrap_or_default()
    }
    /// The JSON patch, decoded from base64.
    fn patch(&self) -> Option<Value> {
        let encoded = self.response()["patch"].as_str()?.to_string();
        assert_eq!(self.response()["patchType"], "JSONPatch");
        Some(serde_json::from_slice(&base64_decode(&encoded)).expect("patch is JSON"))
    }
}

/// Test-only verifier: accepts the self-signed certificate (and records nothing; the
/// presented certificate is read from the connection).
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum BodyMode {
    Length,
    Chunked,
}

/// A TLS connection to `addr` that accepts any server certificate, handshake done.
async fn tls_connect(addr: SocketAddr) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("server name");
    connector.connect(name, tcp).await.expect("TLS handshake")
}

async fn https(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    mode: BodyMode,
) -> Reply {
    let stream = tls_connect(addr).await;
    let cert = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned());
    let mut reply = exchange(stream, "POST", path, content_type, body, mode).await;
    reply.cert = cert;
    reply
}

/// One HTTP/1.1 request; the body is written while the response is read, so a server
/// that answers 413 before reading everything does not deadlock the test.
async fn exchange<S: AsyncRead + AsyncWrite + Send + 'static>(
    stream: S,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    mode: BodyMode,
) -> Reply {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    match mode {
        BodyMode::Length => head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len())),
        BodyMode::Chunked => head.push_str("Transfer-Encoding: chunked\r\n\r\n"),
    }
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        match mode {
            BodyMode::Length => wr.write_all(&body).await?,
            BodyMode::Chunked => {
                for chunk in body.chunks(64 * 1024) {
                    wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                        .await?;
                    wr.write_all(chunk).await?;
                    wr.write_all(b"\r\n").await?;
                }
                wr.write_all(b"0\r\n\r\n").await?;
            }
        }
        wr.flush().await?;
        Ok::<_, std::io::Error>(wr)
    });
    let mut raw = Vec::new();
    // TLS peers may close without close_notify; keep what was read.
    let _ = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw)).await;
    writer.abort();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        head: head.to_string(),
        body,
        cert: None,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

// ---------------------------------------------------------------------------------------
// AdmissionReview builders.

fn memcached(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": "default", "uid": "6d9b2a4e-0000-4000-8000-000000000001"},
        "spec": spec,
    })
}

fn review_with(operation: &str, object: Value, old: Value, uid: &str) -> Value {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
            "resource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
            "requestKind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
            "requestResource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
            "name": name,
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    })
}

fn create(object: Value) -> Value {
    review_with(
        "CREATE",
        object,
        Value::Null,
        "705ab4f5-6393-11e8-b7cc-42010a800002",
    )
}

fn update(old: Value, new: Value) -> Value {
    review_with("UPDATE", new, old, "705ab4f5-6393-11e8-b7cc-42010a800003")
}

// ---------------------------------------------------------------------------------------
// The bad-object table.

/// How a case is sent.
enum Sent {
    /// An AdmissionReview, as JSON.
    Review(Value),
    /// Raw bytes with a content type.
    Raw(&'static str, Vec<u8>, BodyMode),
}

struct Bad {
    what: &'static str,
    send: Sent,
    /// Substrings the message must contain (field names and rules).
    expect: Vec<&'static str>,
    /// Whether the mutating webhook rejects it too (structural problems and bad
    /// requests); semantic rules are the validating webhook's.
    mutate_rejects: bool,
}

fn bad(what: &'static str, review: Value, expect: &[&'static str], mutate_rejects: bool) -> Bad {
    Bad {
        what,
        send: Sent::Review(review),
        expect: expect.to_vec(),
        mutate_rejects,
    }
}

fn raw(what: &'static str, ct: &'static str, body: Vec<u8>, expect: &[&'static str]) -> Bad {
    Bad {
        what,
        send: Sent::Raw(ct, body, BodyMode::Length),
        expect: expect.to_vec(),
        mutate_rejects: true,
    }
}

fn spec_case(what: &'static str, spec: Value, expect: &[&'static str], structural: bool) -> Bad {
    bad(what, create(memcached("cache", spec)), expect, structural)
}

fn bad_cases() -> Vec<Bad> {
    let long64 = "m".repeat(64);
    let long55 = "m".repeat(55);
    let mut object_without_spec = memcached("cache", Value::Null);
    object_without_spec
        .as_object_mut()
        .expect("object")
        .remove("spec");
    let mut generate = memcached("", json!({"size": 1}));
    generate["metadata"] =
        json!({"generateName": format!("{}-", "g".repeat(55)), "namespace": "default"});
    let mut other_kind = create(memcached("cache", json!({"size": 1})));
    other_kind["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let mut v1beta1 = create(memcached("cache", json!({"size": 1})));
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_uid = create(memcached("cache", json!({"size": 1})));
    no_uid["request"]
        .as_object_mut()
        .expect("request")
        .remove("uid");
    let mut big = create(memcached("cache", json!({"size": 1})));
    big["request"]["object"]["metadata"]["annotations"] =
        json!({"filler": "x".repeat(MAX_BODY_BYTES)});
    let big = serde_json::to_vec(&big).expect("encode");
    // 100 KB of one-key objects: some 10 MiB as JSON values, more than a request may take.
    let mut dense = create(memcached("cache", json!({"size": 1})));
    dense["request"]["object"]["metadata"]["annotations"] = json!({"a": ""});
    let dense = serde_json::to_string(&dense).expect("encode").replacen(
        r#"{"a":""}"#,
        &format!("{{\"a\":[{}]}}", vec![r#"{"a":0}"#; 12_500].join(",")),
        1,
    );
    let dense = dense.into_bytes();

    vec![
        spec_case("negative size", json!({"size": -1}), &["spec.size: Invalid value: -1: must be between 0 and 100"], false),
        spec_case("huge size", json!({"size": 101}), &["spec.size: Invalid value: 101: must be between 0 and 100"], false),
        spec_case("size beyond int32", json!({"size": 99_999_999_999i64}), &["spec.size: Invalid value: 99999999999: must be between 0 and 100"], true),
        spec_case("size as a word", json!({"size": "three"}), &["spec.size: Invalid value: \"three\": must be an integer (is string)"], true),
        spec_case("fractional size", json!({"size": 2.5}), &["spec.size: Invalid value: 2.5: must be an integer (is number)"], true),
        spec_case("boolean size", json!({"size": true}), &["spec.size", "must be an integer (is boolean)"], true),
        spec_case("missing size", json!({"containerPort": 11211}), &["spec.size: Required value"], true),
        bad("64-character name", create(memcached(&long64, json!({"size": 1}))), &["metadata.name: Invalid value", "no more than 54 characters (is 64)"], false),
        bad("55-character name", create(memcached(&long55, json!({"size": 1}))), &["metadata.name", "no more than 54 characters (is 55)"], false),
        bad("uppercase name", create(memcached("Memcached-Sample", json!({"size": 1}))), &["metadata.name: Invalid value: \"Memcached-Sample\"", "DNS-1035"], false),
        bad("name starting with a digit", create(memcached("1cache", json!({"size": 1}))), &["metadata.name", "DNS-1035"], false),
        bad("name with a dot", create(memcached("my.cache", json!({"size": 1}))), &["metadata.name", "DNS-1035"], false),
        bad("generateName too long", create(generate), &["metadata.generateName", "no more than 49 characters"], false),
        spec_case("port 0", json!({"size": 1, "containerPort": 0}), &["spec.containerPort: Invalid value: 0: must be between 1 and 65535"], false),
        spec_case("port 70000", json!({"size": 1, "containerPort": 70000}), &["spec.containerPort: Invalid value: 70000: must be between 1 and 65535"], false),
        spec_case("port clashes with the exporter", json!({"size": 1, "containerPort": 9150}), &["spec.containerPort: Invalid value: 9150", "reserved", "exporter"], false),
        spec_case("port as a string", json!({"size": 1, "containerPort": "11211"}), &["spec.containerPort: Invalid value: \"11211\": must be an integer"], true),
        spec_case("image with spaces", json!({"size": 1, "image": "memcached 1.6"}), &["spec.image: Invalid value: \"memcached 1.6\"", "whitespace"], false),
        spec_case("image with an uppercase path", json!({"size": 1, "image": "team/Memcached:1.6"}), &["spec.image", "\"Memcached\" must be lowercase"], false),
        spec_case("image with a bad tag", json!({"size": 1, "image": "memcached:-1.6"}), &["spec.image", "tag \"-1.6\""], false),
        spec_case("image with a bad digest", json!({"size": 1, "image": "memcached@sha256:abc"}), &["spec.image", "digest \"sha256:abc\""], false),
        spec_case("image with an unknown digest algorithm", json!({"size": 1, "image": format!("memcached@md5:{}", &SHA[..32])}), &["spec.image", "unsupported algorithm \"md5\""], false),
        spec_case("image with a scheme", json!({"size": 1, "image": "https://registry.example.com/memcached"}), &["spec.image", "URL scheme"], false),
        spec_case("empty image", json!({"size": 1, "image": ""}), &["spec.image: Invalid value: \"\": must not be empty"], false),
        spec_case("image as a number", json!({"size": 1, "image": 42}), &["spec.image: Invalid value: 42: must be a string"], true),
        spec_case("unknown spec field", json!({"size": 1, "replicas": 3}), &["spec.replicas: Forbidden: unknown field \"replicas\""], true),
        bad("unknown top-level field", create({
            let mut o = memcached("cache", json!({"size": 1}));
            o["extra"] = json!(true);
            o
        }), &["extra: Forbidden: unknown field"], true),
        spec_case("null spec", Value::Null, &["spec: Required value: must not be null"], true),
        bad("missing spec", create(object_without_spec), &["spec: Required value"], true),
        spec_case("spec as a list", json!([1, 2]), &["spec: Invalid value: [1,2]: must be an object (is array)"], true),
        bad("empty object", create(json!({})), &["apiVersion: Required value", "kind: Required value", "spec: Required value"], true),
        bad("wrong apiVersion", create({
            let mut o = memcached("cache", json!({"size": 1}));
            o["apiVersion"] = json!("memcached.cache.example.com/v2");
            o
        }), &["apiVersion: Unsupported value: \"memcached.cache.example.com/v2\": supported values: \"memcached.cache.example.com/v1\""], true),
        bad("wrong kind", create({
            let mut o = memcached("cache", json!({"size": 1}));
            o["kind"] = json!("Redis");
            o
        }), &["kind: Unsupported value: \"Redis\""], true),
        bad("object is not an object", create(json!("memcached")), &["object: Invalid value: \"memcached\": must be a Memcached object"], true),
        bad("request for another kind", other_kind, &["this webhook admits memcached.cache.example.com/v1 Memcached, not apps/v1 Deployment"], true),
        bad("no object on CREATE", create(Value::Null), &["request.object is required"], true),
        bad("several problems at once", create(memcached("Bad_Name", json!({"size": -3, "containerPort": 9150, "image": "a b"}))), &["[", "metadata.name", "spec.size", "spec.containerPort", "spec.image"], false),
        bad("invalid update", update(memcached("cache", json!({"size": 1})), memcached("cache", json!({"size": -1}))), &["spec.size: Invalid value: -1"], false),
        raw("malformed JSON", "application/json", b"{\"apiVersion\": \"admission.k8s.io/v1\", ".to_vec(), &["not valid JSON", "EOF"]),
        raw("JSON that is not an AdmissionReview", "application/json", br#"{"hello": "world"}"#.to_vec(), &["expected apiVersion \"admission.k8s.io/v1\" and kind \"AdmissionReview\""]),
        raw("a JSON list", "application/json", b"[1,2,3]".to_vec(), &["JSON array, not an admission.k8s.io/v1 AdmissionReview"]),
        raw("empty body", "application/json", Vec::new(), &["request body is empty"]),
        raw("AdmissionReview v1beta1", "application/json", serde_json::to_vec(&v1beta1).expect("encode"), &["admission.k8s.io/v1beta1", "admission.k8s.io/v1 only"]),
        raw("AdmissionReview without request", "application/json", br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}"#.to_vec(), &["has no request"]),
        raw("request without uid", "application/json", serde_json::to_vec(&no_uid).expect("encode"), &["malformed AdmissionReview request", "uid"]),
        raw("wrong content type", "text/plain", br#"{}"#.to_vec(), &["contentType=\"text/plain\", expected application/json"]),
        raw("oversized body", "application/json", big.clone(), &["request body too large", "1 MiB"]),
        raw("dense JSON", "application/json", dense.clone(), &["request too costly", "MiB"]),
        Bad {
            what: "oversized chunked body",
            send: Sent::Raw("application/json", big, BodyMode::Chunked),
            expect: vec!["request body too large"],
            mutate_rejects: true,
        },
    ]
}

#[tokio::test]
async fn bad_objects_and_requests_are_rejected_naming_the_problem() {
    let server = Server::start().await;
    let cases = bad_cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for case in &cases {
        for path in [VALIDATE_PATH, MUTATE_PATH] {
            let reply = match &case.send {
                Sent::Review(review) => server.post(path, review).await,
                Sent::Raw(ct, body, mode) => {
                    https(server.addr, path, ct, body.clone(), *mode).await
                }
            };
            let what = format!("{} ({path})", case.what);
            if path == MUTATE_PATH && !case.mutate_rejects {
                assert_eq!(reply.status, 200, "{what}: {}", reply.body);
                assert!(
                    reply.allowed(),
                    "{what}: defaulting leaves semantic rules to validation: {}",
                    reply.body
                );
                continue;
            }
            let http_error = (400..500).contains(&reply.status);
            assert!(
                http_error || (reply.status == 200 && !reply.allowed()),
                "{what}: expected a rejection, got {} {}",
                reply.status,
                reply.body
            );
            let message = reply.message();
            for needle in &case.expect {
                assert!(
                    message.contains(needle),
                    "{what}: {needle:?} not in {message:?}"
                );
            }
            let code = reply.response()["status"]["code"].as_u64().unwrap_or(0);
            if http_error {
                assert_eq!(code, u64::from(reply.status), "{what}");
                assert!(
                    matches!(reply.status, 400 | 413),
                    "{what}: {}",
                    reply.status
                );
            } else {
                assert!(matches!(code, 400 | 422), "{what}: status code {code}");
                assert!(
                    !reply.response()["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .is_empty(),
                    "{what}: uid echoed"
                );
            }
            if case.what.starts_with("oversized") || case.what == "dense JSON" {
                assert_eq!(reply.status, 413, "{what}");
            }
        }
    }
    // An invalid object is answered as kube-apiserver answers one: 422 Invalid, a cause per field.
    let reply = server
        .post(
            VALIDATE_PATH,
            &create(memcached("cache", json!({"size": -1, "containerPort": 0}))),
        )
        .await;
    let status = &reply.response()["status"];
    assert_eq!(status["code"], 422);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["message"],
        "Memcached.memcached.cache.example.com \"cache\" is invalid: [spec.size: Invalid value: -1: must be between 0 and 100, spec.containerPort: Invalid value: 0: must be between 1 and 65535, inclusive]"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "spec.size");
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "FieldValueInvalid"
    );
    assert_eq!(status["details"]["kind"], "Memcached");

    // Wrong method and unknown path.
    let reply = https(
        server.addr,
        "/nowhere",
        "application/json",
        b"{}".to_vec(),
        BodyMode::Length,
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert!(reply.body.contains(VALIDATE_PATH));
    // The server still serves after all that.
    let reply = server
        .post(
            VALIDATE_PATH,
            &create(memcached("cache", json!({"size": 3}))),
        )
        .await;
    assert!(reply.allowed(), "{}", reply.body);
    server.shutdown().await;
}

struct Good {
    what: &'static str,
    review: Value,
    patch: Option<Value>,
    warnings: Vec<&'static str>,
}

fn good_cases() -> Vec<Good> {
    let add_port = Some(json!([{"op": "add", "path": "/spec/containerPort", "value": 11211}]));
    let mut generated = memcached("", json!({"size": 2}));
    generated["metadata"] = json!({"generateName": "cache-", "namespace": "default"});
    let mut deleting = memcached("cache", json!({"size": 3, "containerPort": 11211}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    deleting["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let mut delete = review_with(
        "DELETE",
        Value::Null,
        memcached("cache", json!({"size": 1})),
        "d-1",
    );
    delete["request"]["options"] = json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"});
    let mut status = create(memcached("cache", json!({"size": 1})));
    status["request"]["subResource"] = json!("status");
    vec![
        Good {
            what: "the seed sample",
            review: create(memcached("memcached-sample", json!({"size": 3}))),
            patch: add_port.clone(),
            warnings: vec![],
        },
        Good {
            what: "complete object",
            review: create(memcached(
                "cache",
                json!({"size": 3, "containerPort": 11211}),
            )),
            patch: None,
            warnings: vec![],
        },
        Good {
            what: "null port",
            review: create(memcached(
                "cache",
                json!({"size": 3, "containerPort": null}),
            )),
            patch: Some(json!([{"op": "replace", "path": "/spec/containerPort", "value": 11211}])),
            warnings: vec![],
        },
        Good {
            what: "size 0",
            review: create(memcached("cache", json!({"size": 0}))),
            patch: add_port.clone(),
            warnings: vec!["spec.size: 0 runs no memcached pods"],
        },
        Good {
            what: "size 1, untagged image",
            review: create(memcached(
                "cache",
                json!({"size": 1, "containerPort": 11211, "image": "memcached"}),
            )),
            patch: None,
            warnings: vec![
                "spec.size: 1",
                "no redundancy",
                "spec.image: \"memcached\" has no tag",
            ],
        },
        Good {
            what: "latest tag",
            review: create(memcached(
                "cache",
                json!({"size": 2, "containerPort": 11211, "image": "memcached:latest"}),
            )),
            patch: None,
            warnings: vec!["\"latest\" tag"],
        },
        Good {
            what: "pinned image from a private registry",
            review: create(memcached(
                "cache",
                json!({"size": 2, "containerPort": 11212, "image": format!("registry.example.com:5000/team/memcached:1.6.39@sha256:{SHA}")}),
            )),
            patch: None,
            warnings: vec![],
        },
        Good {
            what: "largest size, privileged port",
            review: create(memcached("cache", json!({"size": 100, "containerPort": 1}))),
            patch: None,
            warnings: vec!["spec.containerPort: 1 is a privileged port"],
        },
        Good {
            what: "54-character name",
            review: create(memcached(&"m".repeat(54), json!({"size": 2}))),
            patch: add_port.clone(),
            warnings: vec![],
        },
        Good {
            what: "generateName",
            review: create(generated),
            patch: add_port.clone(),
            warnings: vec![],
        },
        Good {
            what: "port change on update",
            review: update(
                memcached("cache", json!({"size": 2, "containerPort": 11211})),
                memcached("cache", json!({"size": 2, "containerPort": 11311})),
            ),
            patch: None,
            warnings: vec!["changing 11211 to 11311", "moves the Service port"],
        },
        Good {
            what: "scale on update",
            review: update(
                memcached("cache", json!({"size": 2, "containerPort": 11211})),
                memcached("cache", json!({"size": 5, "containerPort": 11211})),
            ),
            patch: None,
            warnings: vec![],
        },
        Good {
            what: "update of an object being deleted",
            review: update(deleting.clone(), deleting),
            patch: None,
            warnings: vec![],
        },
        Good {
            what: "DELETE",
            review: delete,
            patch: None,
            warnings: vec![],
        },
        Good {
            what: "status subresource",
            review: status,
            patch: None,
            warnings: vec![],
        },
    ]
}

#[tokio::test]
async fn good_objects_are_admitted_with_the_exact_patch_and_warnings() {
    let server = Server::start().await;
    for case in good_cases() {
        let uid = case.review["request"]["uid"].clone();
        let reply = server.post(MUTATE_PATH, &case.review).await;
        assert_eq!(reply.status, 200, "{}: {}", case.what, reply.body);
        let json = reply.json();
        assert_eq!(json["apiVersion"], "admission.k8s.io/v1", "{}", case.what);
        assert_eq!(json["kind"], "AdmissionReview", "{}", case.what);
        assert_eq!(json["response"]["uid"], uid, "{}", case.what);
        assert!(reply.allowed(), "{}: {}", case.what, reply.body);
        assert_eq!(reply.patch(), case.patch, "{}", case.what);
        if case.patch.is_none() {
            assert!(json["response"].get("patchType").is_none(), "{}", case.what);
        }
        assert!(
            reply.warnings().is_empty(),
            "{}: warnings come from validation only",
            case.what
        );

        // The patched object is what validation then sees.
        let mut review = case.review.clone();
        if let Some(patch) = reply.patch() {
            let patch: json_patch::Patch = serde_json::from_value(patch).expect("a JSON patch");
            json_patch::patch(&mut review["request"]["object"], &patch).expect("patch applies");
            if let Some(name) = review["request"]["object"]["metadata"]["generateName"].as_str() {
                // The API server names the object between mutation and validation.
                let name = format!("{name}x7k2p");
                review["request"]["object"]["metadata"]["name"] = json!(name);
                review["request"]["name"] = json!(name);
            }
        }
        let reply = server.post(VALIDATE_PATH, &review).await;
        assert_eq!(reply.status, 200, "{}: {}", case.what, reply.body);
        assert!(reply.allowed(), "{}: {}", case.what, reply.body);
        assert_eq!(reply.response()["uid"], uid, "{}", case.what);
        assert!(reply.response().get("patch").is_none(), "{}", case.what);
        let warnings = reply.warnings();
        for needle in &case.warnings {
            assert!(
                warnings.iter().any(|w| w.contains(needle)),
                "{}: {needle:?} not in {warnings:?}",
                case.what
            );
        }
        if case.warnings.is_empty() {
            assert!(
                warnings.is_empty(),
                "{}: unexpected {warnings:?}",
                case.what
            );
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let server = Server::start().await;
    let review = create(memcached("cache", json!({"size": 3})));
    let first = server.post(VALIDATE_PATH, &review).await;
    assert_eq!(first.cert.as_ref(), Some(&server.cert));
    assert!(first.allowed());

    let rotated = write_cert(server.dir.path());
    assert_ne!(rotated, server.cert);
    served(&server, &review, &rotated, "the rotated certificate").await;

    // A broken pair keeps the last good one. The watcher polls every 100 ms; what is waited
    // for is not a time but its count of pairs it failed to load, so the check below runs
    // only once it has read the broken key.
    let failed = server.certs.failed_reloads();
    std::fs::write(server.dir.path().join(KEY_FILE), "garbage").expect("write");
    wait_for("the watcher read the broken key", || async {
        (server.certs.failed_reloads() > failed).then_some(())
    })
    .await;
    let reply = server.post(VALIDATE_PATH, &review).await;
    assert!(
        reply.allowed(),
        "served with the broken key: {}",
        reply.body
    );
    assert_eq!(
        reply.cert.as_ref(),
        Some(&rotated),
        "the last good pair is served after a broken one"
    );
    // The watcher goes on after the failure: a good pair written next is served.
    let repaired = write_cert(server.dir.path());
    served(
        &server,
        &review,
        &repaired,
        "the pair written after the broken one",
    )
    .await;
    server.shutdown().await;
}

/// Posts `review` until the server presents `cert`, checking every answer on the way
/// allows it (a rotation never interrupts the service).
async fn served(server: &Server, review: &Value, cert: &CertificateDer<'static>, what: &str) {
    wait_for(&format!("{what} presented"), || async {
        let reply = server.post(VALIDATE_PATH, review).await;
        assert!(
            reply.allowed(),
            "still serving during rotation: {}",
            reply.body
        );
        (reply.cert.as_ref() == Some(cert)).then_some(())
    })
    .await;
}

/// How many of `conns` the server closes (end of stream or reset) within `within`.
async fn closed_by_server<S: AsyncRead + Unpin>(conns: Vec<S>, within: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    let waits = conns.into_iter().map(|mut s| async move {
        let closed = async {
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::time::timeout_at(deadline, closed).await.is_ok()
    });
    futures::future::join_all(waits)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count()
}

/// More clients than the connection cap that connect and never finish a request (no TLS
/// handshake, or a handshake and nothing or half a request after it) are all disconnected
/// by the server, and the API server's review is answered all the same.
#[tokio::test]
async fn stalled_clients_beyond_the_cap_are_disconnected() {
    // A handshake deadline long enough for a real handshake on a busy machine.
    let server = Server::start_with(ConnectionLimits {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(1),
        tls_handshake_timeout: Duration::from_secs(5),
    })
    .await;
    let mut no_handshake = Vec::new();
    for _ in 0..4 {
        no_handshake.push(
            tokio::net::TcpStream::connect(server.addr)
                .await
                .expect("connect"),
        );
    }
    let mut after_handshake = Vec::new();
    for i in 0..4 {
        let mut s = tls_connect(server.addr).await;
        if i % 2 == 1 {
            // The server may already have given up on it: a failed write is fine.
            let _ = s
                .write_all(format!("POST {VALIDATE_PATH} HTTP/1.1\r\nHost: lo").as_bytes())
                .await;
            let _ = s.flush().await;
        }
        after_handshake.push(s);
    }
    let review = create(memcached("cache", json!({"size": 3})));
    let reply = tokio::time::timeout(Duration::from_secs(30), server.post(VALIDATE_PATH, &review))
        .await
        .expect("the review is answered");
    assert!(reply.allowed(), "{}", reply.body);
    let within = Duration::from_secs(30);
    let closed = tokio::join!(
        closed_by_server(no_handshake, within),
        closed_by_server(after_handshake, within)
    );
    assert_eq!(closed, (4, 4), "stalled connections closed by the server");
    server.shutdown().await;
}

/// Large requests may hold half the memory budget. With it held by clients that declared
/// 1 MiB bodies and send them slowly, a large review is answered at once with 429, a
/// Retry-After and an AdmissionReview saying why; a review of ordinary size is still
/// admitted; once a holder leaves, large reviews are admitted again.
#[tokio::test]
async fn large_bodies_beyond_their_share_of_memory_are_answered_429_at_once() {
    let budget = MemoryBudget::default();
    let server = Server::start_within(ConnectionLimits::default(), budget.clone()).await;
    let each = MAX_BODY_BYTES * HELD_PER_BODY_BYTE;
    let mut holders = Vec::new();
    for _ in 0..LARGE_REQUESTS_BYTES / each {
        let mut s = tls_connect(server.addr).await;
        let head = format!(
            "POST {VALIDATE_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {MAX_BODY_BYTES}\r\n\r\n{{\"apiVersion\":"
        );
        s.write_all(head.as_bytes()).await.expect("write");
        s.flush().await.expect("flush");
        holders.push(s);
    }
    wait_for(
        "the slow clients hold the large requests' share",
        || async { (budget.held() == LARGE_REQUESTS_BYTES).then_some(()) },
    )
    .await;

    let mut large = create(memcached("cache", json!({"size": 1})));
    large["request"]["object"]["metadata"]["annotations"] =
        json!({"filler": "x".repeat(MAX_BODY_BYTES / 2)});
    let reply = server.post(VALIDATE_PATH, &large).await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert!(
        reply
            .head
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 1\r\n"),
        "{}",
        reply.head
    );
    assert!(!reply.allowed(), "{}", reply.body);
    let status = &reply.response()["status"];
    assert_eq!(
        (status["code"].as_u64(), status["reason"].as_str()),
        (Some(429), Some("TooManyRequests"))
    );
    let message = reply.message();
    assert!(
        message.contains("busy") && message.contains("large requests") && message.contains("retry"),
        "{message}"
    );

    let small = server
        .post(
            VALIDATE_PATH,
            &create(memcached("cache", json!({"size": 3}))),
        )
        .await;
    assert!(small.allowed(), "{}", small.body);

    drop(holders.pop());
    wait_for("a holder's share given back", || async {
        (budget.held() == LARGE_REQUESTS_BYTES - each).then_some(())
    })
    .await;
    let reply = server.post(VALIDATE_PATH, &large).await;
    assert!(reply.allowed(), "{} {}", reply.status, reply.body);
    drop(holders);
    wait_for("every share given back", || async {
        (budget.held() == 0).then_some(())
    })
    .await;
    server.shutdown().await;
}

/// POSTs `review` to `path` of `app` (no TLS): the HTTP status, the Retry-After header and
/// the AdmissionReview's `response`.
async fn call(app: &axum::Router, path: &str, review: &Value) -> (u16, Option<String>, Value) {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("answered");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    (status, retry_after, answer["response"].clone())
}

/// At most MAX_DRY_RUNS_IN_FLIGHT reviews dry-run their children at once. With that many
/// waiting on an API server that does not answer, the next review that needs a dry run is
/// answered 429 at once (Retry-After, its uid echoed); reviews that need none (an invalid
/// object, the defaulting webhook) are answered as ever; and once the waiting ones end,
/// dry runs start again.
#[tokio::test]
async fn reviews_beyond_the_dry_runs_in_flight_are_answered_429_at_once() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    let check =
        ChildrenCheck::new(client, BuildSettings::default()).with_budget(Duration::from_secs(3600));
    let app = webhook::router_with(memcached_api::DEFAULT_IMAGE, Some(check.clone()));
    let waiting: Vec<_> = (0..MAX_DRY_RUNS_IN_FLIGHT)
        .map(|i| {
            let (app, review) = (
                app.clone(),
                create(memcached(&format!("cache-{i}"), json!({"size": 1}))),
            );
            tokio::spawn(async move { call(&app, VALIDATE_PATH, &review).await })
        })
        .collect();
    wait_for("every dry-run slot taken", || async {
        (check.in_flight() == MAX_DRY_RUNS_IN_FLIGHT).then_some(())
    })
    .await;

    let review = create(memcached("one-more", json!({"size": 1})));
    let (status, retry_after, response) = call(&app, VALIDATE_PATH, &review).await;
    assert_eq!(status, 429, "{response}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["uid"], review["request"]["uid"], "{response}");
    assert_eq!(response["status"]["code"], 429, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("busy") && message.contains("retry"),
        "{message}"
    );
    // No dry run needed: answered as ever.
    let invalid = create(memcached("bad", json!({"size": -1})));
    let (status, _, response) = call(&app, VALIDATE_PATH, &invalid).await;
    assert_eq!(
        (status, response["status"]["code"].as_u64()),
        (200, Some(422)),
        "{response}"
    );
    let (status, _, response) = call(&app, MUTATE_PATH, &review).await;
    assert_eq!(
        (status, response["allowed"].as_bool()),
        (200, Some(true)),
        "{response}"
    );

    // The waiting reviews end (the API server went away): dry runs are tried again, and
    // fail fast against a closed port (503 in the answer, as the failure policy says).
    for w in &waiting {
        w.abort();
    }
    held.abort();
    wait_for("the dry-run slots given back", || async {
        (check.in_flight() == 0).then_some(())
    })
    .await;
    let (status, _, response) = call(&app, VALIDATE_PATH, &review).await;
    assert_eq!(
        (status, response["status"]["code"].as_u64()),
        (200, Some(503)),
        "{response}"
    );
}

/// The webhook server's default address listens on IPv4 and IPv6 alike: the API server
/// reaches it over 127.0.0.1 and over [::1].
#[tokio::test]
async fn the_default_address_is_reached_over_ipv4_and_ipv6() {
    let dir = TempDir::new("dual-stack");
    write_cert(dir.path());
    let default = WebhookConfig::default().bind;
    let server = WebhookServer::bind(WebhookConfig {
        bind: SocketAddr::new(default.ip(), 0),
        cert_dir: dir.path().to_path_buf(),
        ..WebhookConfig::default()
    })
    .await
    .expect("webhook server binds");
    let local = server.local_addr().expect("local addr");
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.run(stop.clone()));
    let review = create(memcached("cache", json!({"size": 3})));
    let body = serde_json::to_vec(&review).expect("encode");
    // Both families must be tested: a host without an IPv6 loopback cannot show the
    // dual-stack default, so it fails here rather than passing on IPv4 alone.
    if let Err(e) = std::net::TcpListener::bind("[::1]:0") {
        panic!(
            "this host has no IPv6 loopback ({e}): enable it (`sysctl -w net.ipv6.conf.lo.disable_ipv6=0`) to test the webhook's dual-stack default"
        );
    }
    let reached = [
        SocketAddr::from(([127, 0, 0, 1], local.port())),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, local.port())),
    ];
    for addr in reached {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_ok(),
            "{addr} refused"
        );
        let reply = https(
            addr,
            VALIDATE_PATH,
            "application/json",
            body.clone(),
            BodyMode::Length,
        )
        .await;
        assert!(reply.allowed(), "{addr}: {}", reply.body);
    }
    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("server stops on cancel")
        .expect("server task");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn no_certificate_means_no_start_with_a_message_that_says_how_to_fix_it() {
    let dir = TempDir::new("nocert");
    let err = webhook::check_certificate(dir.path()).expect_err("no certificate");
    let text = err.to_string();
    for needle in [
        "tls.crt",
        "cert-manager",
        "ENABLE_WEBHOOKS=false",
        "--webhook-cert-dir",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    let config = WebhookConfig {
        bind: "127.0.0.1:0".parse().expect("addr"),
        cert_dir: dir.path().to_path_buf(),
        ..WebhookConfig::default()
    };
    assert!(matches!(
        WebhookServer::bind(config.clone()).await,
        Err(WebhookError::Certificate { .. })
    ));
    assert!(
        webhook::serve(config.clone(), CancellationToken::new())
            .await
            .is_err()
    );

    std::fs::write(dir.path().join(CERT_FILE), "not a certificate").expect("write");
    std::fs::write(dir.path().join(KEY_FILE), "not a key").expect("write");
    assert!(webhook::check_certificate(dir.path()).is_err());

    write_cert(dir.path());
    webhook::check_certificate(dir.path()).expect("a good pair passes");
    let bad_default = WebhookConfig {
        default_image: "Not An Image".into(),
        ..config
    };
    let err = WebhookServer::bind(bad_default)
        .await
        .err()
        .expect("bad default image");
    assert!(err.to_string().contains("--memcached-image"), "{err}");
}

#[tokio::test]
async fn the_router_serves_without_tls_and_rejects_wrong_methods() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = webhook::router(memcached_api::DEFAULT_IMAGE);
    let task = tokio::spawn(async move { axum::serve(listener, app).await });
    let plain = |method: &'static str, path: &'static str, body: Vec<u8>| async move {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        exchange(
            stream,
            method,
            path,
            "application/json",
            body,
            BodyMode::Length,
        )
        .await
    };
    let body = serde_json::to_vec(&create(memcached("cache", json!({"size": 3})))).expect("encode");
    let reply = plain("POST", MUTATE_PATH, body).await;
    assert_eq!(reply.status, 200);
    assert!(reply.patch().is_some());
    let reply = plain("GET", VALIDATE_PATH, Vec::new()).await;
    assert_eq!(reply.status, 405);
    task.abort();
}

#[test]
fn webhook_configurations_follow_the_kubebuilder_conventions() {
    let (mutating, validating) = webhook::webhook_configurations(
        "memcached-operator-webhook-service",
        "memcached-operator-system",
        "memcached-operator-serving-cert",
    );
    for (meta, webhooks) in [
        (
            &mutating.metadata,
            serde_json::to_value(&mutating.webhooks).expect("encode"),
        ),
        (
            &validating.metadata,
            serde_json::to_value(&validating.webhooks).expect("encode"),
        ),
    ] {
        let annotations = meta.annotations.as_ref().expect("annotations");
        assert_eq!(
            annotations["cert-manager.io/inject-ca-from"],
            "memcached-operator-system/memcached-operator-serving-cert"
        );
        let hook = &webhooks[0];
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(hook["matchPolicy"], "Equivalent");
        assert_eq!(hook["timeoutSeconds"], 10);
        assert_eq!(
            hook["rules"][0]["apiGroups"],
            json!(["memcached.cache.example.com"])
        );
        assert_eq!(hook["rules"][0]["apiVersions"], json!(["v1"]));
        assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(hook["rules"][0]["resources"], json!(["memcacheds"]));
        let service = &hook["clientConfig"]["service"];
        assert_eq!(service["name"], "memcached-operator-webhook-service");
        assert_eq!(service["namespace"], "memcached-operator-system");
        assert_eq!(service["port"], 443);
    }
    assert_eq!(
        mutating.webhooks.as_ref().expect("hooks")[0]
            .client_config
            .service
            .as_ref()
            .and_then(|s| s.path.as_deref()),
        Some(MUTATE_PATH)
    );
    assert_eq!(
        validating.webhooks.as_ref().expect("hooks")[0]
            .client_config
            .service
            .as_ref()
            .and_then(|s| s.path.as_deref()),
        Some(VALIDATE_PATH)
    );
    assert_eq!(
        mutating.webhooks.as_ref().expect("hooks")[0].name,
        webhook::MUTATING_WEBHOOK_NAME
    );
}

// ---------------------------------------------------------------------------------------
// Fuzz: the decoder and handlers with arbitrary bytes and arbitrary Memcached-shaped JSON.

mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    pub const CASES: u32 = 2000;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: CASES,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop_oneof![
                Just(-1i64),
                Just(0),
                Just(1),
                Just(2),
                Just(100),
                Just(101),
                Just(1023),
                Just(9150),
                Just(11211),
                Just(65535),
                Just(65536),
                Just(i64::from(i32::MAX) + 1)
            ]
            .prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
                .map(Value::Number)),
            "\\PC{0,16}".prop_map(Value::from),
            "[a-zA-Z0-9./:@_-]{0,24}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    "size|containerPort|image|spec|metadata|name|[a-zA-Z]{0,6}",
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_field(interesting: Vec<i64>) -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            6 => prop::sample::select(interesting).prop_map(|n| Some(Value::from(n))),
            1 => Just(None),
            1 => arb_json().prop_map(Some),
        ]
    }

    fn arb_image() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            2 => Just(None),
            3 => "(([a-z0-9]{1,6}\\.[a-z]{2,3}(:[0-9]{1,5})?/)?[a-z0-9]{1,8}([._-][a-z0-9]{1,5})?(:[A-Za-z0-9_][A-Za-z0-9._-]{0,10})?)".prop_map(|s| Some(Value::from(s))),
            1 => "[a-z0-9._/:@-]{0,24}".prop_map(|s| Some(Value::from(s))),
            1 => "\\PC{0,30}".prop_map(|s| Some(Value::from(s))),
            1 => arb_json().prop_map(Some),
        ]
    }

    fn arb_name() -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => "[a-z]([a-z0-9-]{0,50}[a-z0-9])?".prop_map(Value::from),
            1 => "[a-z][a-z0-9-]{50,62}[a-z0-9]".prop_map(Value::from),
            1 => "\\PC{0,70}".prop_map(Value::from),
            1 => arb_json(),
        ]
    }

    /// A Memcached-shaped object: mostly plausible, sometimes anything.
    fn arb_memcached() -> impl Strategy<Value = Value> {
        (
            arb_name(),
            arb_field((-3..=103).chain([i64::from(i32::MAX) + 5]).collect()),
            arb_field(vec![-1, 0, 1, 80, 1023, 9150, 11211, 65535, 65536]),
            arb_image(),
            prop::option::weighted(0.1, ("[a-z]{1,8}", arb_json())),
            prop_oneof![15 => Just(None), 1 => arb_json().prop_map(Some)],
        )
            .prop_map(|(name, size, port, image, extra, replace_spec)| {
                let mut spec = serde_json::Map::new();
                for (key, value) in [("size", size), ("containerPort", port), ("image", image)] {
                    if let Some(value) = value {
                        spec.insert(key.to_string(), value);
                    }
                }
                if let Some((k, v)) = extra {
                    spec.insert(k, v);
                }
                let spec = replace_spec.unwrap_or(Value::Object(spec));
                json!({
                    "apiVersion": "memcached.cache.example.com/v1",
                    "kind": "Memcached",
                    "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
                    "spec": spec,
                })
            })
    }

    fn check_outcome(object: &Value, body: &[u8]) -> (bool, bool) {
        let mutated = webhook::handle(Endpoint::Mutate, body, memcached_api::DEFAULT_IMAGE)
            .expect("a well-formed review is never a bad request");
        let validated = webhook::handle(Endpoint::Validate, body, memcached_api::DEFAULT_IMAGE)
            .expect("a well-formed review is never a bad request");
        let m = mutated.response.expect("response");
        let v = validated.response.expect("response");
        assert_eq!(m.uid, "fuzz-uid");
        assert_eq!(v.uid, "fuzz-uid");
        if !m.allowed {
            assert!(!m.result.message.is_empty(), "a denial says why");
        }
        if !v.allowed {
            assert!(!v.result.message.is_empty(), "a denial says why");
            assert!(matches!(v.result.code, 400 | 422), "{}", v.result.code);
        }
        // Mutating: the patch applies and fills exactly the schema defaults.
        let mut patched = object.clone();
        if let Some(patch) = &m.patch {
            assert!(m.allowed);
            let patch: json_patch::Patch = serde_json::from_slice(patch).expect("patch is JSON");
            json_patch::patch(&mut patched, &patch).expect("patch applies");
            assert_eq!(patched["spec"]["containerPort"], 11211);
        }
        if m.allowed {
            // Defaulting is idempotent: the patched object needs no further patch.
            let again = webhook::handle(
                Endpoint::Mutate,
                &serde_json::to_vec(&create_fuzz(patched.clone())).expect("encode"),
                memcached_api::DEFAULT_IMAGE,
            )
            .expect("review")
            .response
            .expect("response");
            assert!(again.allowed && again.patch.is_none(), "idempotent");
        }
        // Validating: an admitted object is one the reconciler builds. (That the API server
        // stores it and accepts its children is checked against the real server:
        // `admission_children.rs`, `what_the_webhooks_admit_the_real_api_server_accepts`.)
        if v.allowed {
            let mc = webhook::decode_memcached(object).expect("admitted objects decode");
            assert!(
                m.allowed,
                "what validation admits, defaulting does not reject"
            );
            let mut mc = mc;
            mc.metadata.uid = Some("u-1".into());
            check_builders(&mc);
        }
        (m.allowed, v.allowed)
    }

    fn create_fuzz(object: Value) -> Value {
        review_with("CREATE", object, Value::Null, "fuzz-uid")
    }

    pub fn check_builders(mc: &Memcached) {
        let settings = BuildSettings::default();
        let deployment = builders::desired_deployment(mc, &settings).expect("deployment");
        let service = builders::desired_service(mc).expect("service");
        let spec = deployment.spec.as_ref().expect("deployment spec");
        assert_eq!(spec.replicas, Some(mc.spec.size));
        let pod = spec.template.spec.as_ref().expect("pod spec");
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some(mc.image_or(&settings.default_image))
        );
        let ports = container.ports.as_ref().expect("ports");
        assert_eq!(ports[0].container_port, mc.spec.container_port);
        let service_ports = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .expect("service ports");
        assert_eq!(service_ports[0].port, mc.spec.container_port);
        let name = mc.metadata.name.as_deref().expect("name");
        assert!(name.len() <= 63);
        assert_eq!(deployment.metadata.name.as_deref(), Some(name));
        assert_eq!(
            spec.selector
                .match_labels
                .as_ref()
                .and_then(|l| l.get(builders::LABEL_INSTANCE)),
            Some(&name.to_string())
        );
    }

    proptest! {
        #![proptest_config(config())]

        /// Arbitrary bytes: a 400/413 or an answer, never a panic.
        #[test]
        fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
            for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
                match webhook::handle(endpoint, &body, memcached_api::DEFAULT_IMAGE) {
                    Ok(review) => prop_assert!(review.response.is_some()),
                    Err(bad) => {
                        prop_assert!(bad.status == 400 || bad.status == 413);
                        prop_assert!(!bad.message.is_empty());
                        let json = webhook::review_json(&bad.to_review()).expect("encodes");
                        prop_assert!(!json.is_empty());
                    }
                }
            }
        }

        /// Arbitrary JSON as the body, as the request, and as the object.
        #[test]
        fn arbitrary_json(value in arb_json()) {
            for body in [
                value.clone(),
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": value.clone()}),
                create_fuzz(value.clone()),
            ] {
                let bytes = serde_json::to_vec(&body).expect("encode");
                for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
                    if let Ok(review) = webhook::handle(endpoint, &bytes, memcached_api::DEFAULT_IMAGE) {
                        let response = review.response.expect("response");
                        prop_assert!(response.allowed || !response.result.message.is_empty());
                    }
                }
            }
        }

        /// Memcached-shaped objects: the outcomes are consistent with validation and the
        /// builders; counts of each outcome are checked below.
        #[test]
        fn memcached_shaped(object in arb_memcached()) {
            let body = serde_json::to_vec(&create_fuzz(object.clone())).expect("encode");
            check_outcome(&object, &body);
        }

    }

    fn arb_builder_input() -> impl Strategy<Value = Memcached> {
        (
            prop_oneof![3 => "[a-z][a-z0-9-]{0,60}", 1 => "\\PC{0,80}"],
            prop_oneof![3 => 0..=100i32, 1 => any::<i32>()],
            prop_oneof![3 => 1..=65535i32, 1 => any::<i32>()],
            prop::option::of(prop_oneof![
                3 => "[a-z0-9]{1,8}(:[a-z0-9.]{1,8})?",
                1 => "\\PC{0,40}"
            ]),
        )
            .prop_map(|(name, size, port, image)| Memcached {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some("default".into()),
                    uid: Some("u-1".into()),
                    ..ObjectMeta::default()
                },
                spec: MemcachedSpec {
                    container_port: port,
                    image,
                    ..MemcachedSpec::with_size(size)
                },
                status: None,
            })
    }

    /// The desired-state builders with arbitrary specs: no panic on any, and a spec the
    /// webhook admits yields a Deployment whose replicas, image and ports are the spec's.
    /// The admitted branch is counted: it must run for a good share of the cases.
    #[test]
    fn builders_with_arbitrary_specs() {
        let mut runner = proptest::test_runner::TestRunner::new(config());
        let strategy = arb_builder_input();
        let mut checked = 0u32;
        for _ in 0..CASES {
            let mc = strategy.new_tree(&mut runner).expect("generate").current();
            let settings = BuildSettings::default();
            assert!(builders::desired_deployment(&mc, &settings).is_ok());
            assert!(builders::desired_service(&mc).is_ok());
            let review = create_fuzz(serde_json::to_value(&mc).expect("encode"));
            let body = serde_json::to_vec(&review).expect("encode");
            let admitted = webhook::handle(Endpoint::Validate, &body, memcached_api::DEFAULT_IMAGE)
                .expect("review")
                .response
                .is_some_and(|r| r.allowed);
            if admitted {
                check_builders(&mc);
                checked += 1;
            }
        }
        println!("builders: {CASES} arbitrary specs, {checked} admitted and checked");
        assert!(
            checked > CASES / 8,
            "only {checked} of {CASES} specs reached the builder checks"
        );
    }

    /// The fuzz is only worth something if it reaches both outcomes often.
    #[test]
    fn memcached_shaped_inputs_reach_both_outcomes() {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: CASES,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let (mut admitted, mut denied, mut patched) = (0u32, 0u32, 0u32);
        for _ in 0..CASES {
            let object = arb_memcached()
                .new_tree(&mut runner)
                .expect("generate")
                .current();
            let body = serde_json::to_vec(&create_fuzz(object.clone())).expect("encode");
            let (_, validated) = check_outcome(&object, &body);
            if validated {
                admitted += 1;
            } else {
                denied += 1;
            }
            if object["spec"]
                .get("containerPort")
                .is_none_or(Value::is_null)
                && validated
            {
                patched += 1;
            }
        }
        println!(
            "fuzz: {CASES} Memcached-shaped reviews, {admitted} admitted, {denied} denied, {patched} admitted with a defaulting patch"
        );
        assert!(admitted > CASES / 20, "admitted {admitted}");
        assert!(denied > CASES / 20, "denied {denied}");
        assert!(patched > 0);
    }
}
