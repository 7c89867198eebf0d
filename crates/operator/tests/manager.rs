//! The controller manager as users run it: real `memcached-operator run` processes against the
//! in-memory API server over HTTP. Leader election (one writer at a time, failover on SIGKILL,
//! fast handover on SIGTERM, a cut-off leader stopping before its lease can expire), secured
//! metrics, health probes and start-up errors.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apisim::{ApiServer, Fault, ServeHandle};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use memcached_api::{Memcached, condition};
use serde_json::json;

mod common;
use common::wait_for_within;

const BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
const LEASE: &str = "memcached-operator.cache.example.com";
const LEASE_DURATION: Duration = Duration::from_secs(3);

struct Cluster {
    server: ApiServer,
    _handle: ServeHandle,
    kubeconfig: PathBuf,
    _dir: TempDir,
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("mc-op-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Cluster {
    async fn start(with_crd: bool) -> Cluster {
        let server = ApiServer::builder()
            .workload_simulator(true)
            .pod_ready_delay(Duration::from_millis(50))
            .audit_log(true)
            .build();
        let handle = server.serve().await.expect("serve over HTTP");
        let dir = TempDir::new("kubeconfig");
        let kubeconfig = dir.0.join("kubeconfig");
        handle
            .write_kubeconfig(&kubeconfig)
            .expect("write kubeconfig");
        if with_crd {
            let crds: Api<CustomResourceDefinition> = Api::all(server.client());
            crds.create(&PostParams::default(), &Memcached::crd())
                .await
                .expect("CRD installs");
        }
        Cluster {
            server,
            _handle: handle,
            kubeconfig,
            _dir: dir,
        }
    }

    /// A kubeconfig whose bearer token the server attributes to `user` (in its faults and its
    /// audit log), so one operator's requests can be told from another's.
    fn kubeconfig_as(&self, user: &str) -> PathBuf {
        let token = format!("{user}-token");
        self.server.allow_token(&token, user, &[]);
        let yaml = self
            ._handle
            .kubeconfig_yaml()
            .replace("user: {}", &format!("user:\n    token: {token}"));
        assert!(
            yaml.contains(&token),
            "kubeconfig user entry not found:\n{yaml}"
        );
        let path = self.kubeconfig.with_file_name(format!("{user}.kubeconfig"));
        std::fs::write(&path, yaml).expect("write kubeconfig");
        path
    }

    fn memcacheds(&self) -> Api<Memcached> {
        Api::default_namespaced(self.server.client())
    }

    async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::default_namespaced(self.server.client());
        let lease = leases.get_opt(LEASE).await.ok().flatten()?;
        let holder = lease.spec?.holder_identity?;
        // Identities are `<POD_NAME>_<random>`.
        holder
            .split('_')
            .next()
            .map(str::to_string)
            .filter(|h| !h.is_empty())
    }

    /// The Lease's spec as it is now.
    async fn lease(&self) -> LeaseSpec {
        let leases: Api<Lease> = Api::default_namespaced(self.server.client());
        leases
            .get(LEASE)
            .await
            .expect("the Lease")
            .spec
            .expect("the Lease's spec")
    }

    /// `reportingInstance`s of the events about `name` whose note contains `text`.
    /// The `reportingInstance` of every event about `name` whose note contains `text`,
    /// waiting for at least one (events are published after the reconcile that caused them).
    async fn reporters(&self, name: &str, text: &str) -> Vec<String> {
        let events: Api<Event> = Api::default_namespaced(self.server.client());
        wait_for_within(
            &format!("an event about {name} saying {text:?}"),
            Duration::from_secs(120),
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                let reporters: Vec<String> = list
                    .items
                    .into_iter()
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                    .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(text)))
                    .filter_map(|e| e.reporting_instance)
                    .collect();
                (!reporters.is_empty()).then_some(reporters)
            },
        )
        .await
    }

    async fn apply(&self, name: &str, size: i32) {
        let mc: Memcached = serde_json::from_value(json!({
            "apiVersion": "memcached.cache.example.com/v1",
            "kind": "Memcached",
            "metadata": {"name": name},
            "spec": {"size": size}
        }))
        .expect("valid Memcached");
        self.memcacheds()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .expect("apply");
    }

    async fn converged(&self, name: &str, size: usize) {
        let api = self.memcacheds();
        wait_for_within(
            &format!("{name} at {size} ready pods"),
            Duration::from_secs(120),
            || async {
                let mc = api.get_opt(name).await.ok().flatten()?;
                let status = mc.status.as_ref()?;
                let available = mc.condition(condition::AVAILABLE)?.status == "True";
                (available
                    && status.nodes.len() == size
                    && status.observed_generation == mc.metadata.generation)
                    .then_some(())
            },
        )
        .await;
    }
}

struct Operator {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Operator {
    fn spawn(cluster: &Cluster, name: &str, args: &[&str]) -> Operator {
        Self::spawn_with(cluster, &cluster.kubeconfig, name, args)
    }

    fn spawn_with(cluster: &Cluster, kubeconfig: &Path, name: &str, args: &[&str]) -> Operator {
        let log = cluster.kubeconfig.with_file_name(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(BIN)
            .arg("run")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .env("ENABLE_WEBHOOKS", "false")
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            // Logs go to stdout, start-up errors to stderr: both are kept.
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .expect("operator binary starts");
        Operator {
            name: name.to_string(),
            child,
            log,
        }
    }

    fn spawn_candidate(cluster: &Cluster, name: &str) -> Operator {
        Self::spawn(
            cluster,
            name,
            &[
                "--leader-elect",
                "--leader-election-namespace=default",
                "--leader-elect-lease-duration=3s",
                "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=250ms",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
            ],
        )
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: sending a signal to our own child process.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    async fn wait_log(&self, needle: &str, timeout: Duration) {
        wait_for_within(
            &format!("{} logs {needle:?}", self.name),
            timeout,
            || async { self.logs().contains(needle).then_some(()) },
        )
        .await;
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_with_failover_on_kill_and_handover_on_term() {
    let cluster = Cluster::start(true).await;
    let mut first = Operator::spawn_candidate(&cluster, "op-1");
    wait_for_within("op-1 leads", Duration::from_secs(120), || async {
        (cluster.lease_holder().await.as_deref() == Some("op-1")).then_some(())
    })
    .await;
    let mut standbys = vec![
        Operator::spawn_candidate(&cluster, "op-2"),
        Operator::spawn_candidate(&cluster, "op-3"),
    ];

    cluster.apply("ha", 2).await;
    cluster.converged("ha", 2).await;
    assert_eq!(
        cluster.reporters("ha", "Created Deployment").await,
        ["op-1"],
        "only the leader writes"
    );
    // Standbys stay standbys while the leader renews. What is ruled out: a standby takes a
    // record it has seen unchanged for a lease duration, and looks every 250-550 ms; the
    // wait covers both, and the leader's renewals in it are seen.
    let before = cluster.lease().await;
    tokio::time::sleep(LEASE_DURATION + Duration::from_secs(1)).await;
    let after = cluster.lease().await;
    assert_eq!(cluster.lease_holder().await.as_deref(), Some("op-1"));
    assert_eq!(
        after.lease_transitions, before.lease_transitions,
        "no transition while the leader renews"
    );
    assert!(after.renew_time > before.renew_time, "the leader renews");

    // SIGKILL: nothing is released; a standby takes over once the lease runs out, and not
    // before: its acquisition comes at least a lease duration after the killed leader's
    // last renewal (both times are written from this machine's clock).
    let killed_at = Instant::now();
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(60)).await;
    let last = cluster.lease().await;
    let second = wait_for_within(
        "a standby leads after SIGKILL",
        Duration::from_secs(120),
        || async { cluster.lease_holder().await.filter(|h| h != "op-1") },
    )
    .await;
    println!(
        "SIGKILL failover: {:?} (lease duration {LEASE_DURATION:?})",
        killed_at.elapsed()
    );
    let taken = cluster.lease().await;
    if last
        .holder_identity
        .as_deref()
        .is_some_and(|h| h.starts_with("op-1_"))
    {
        let waited = taken
            .acquire_time
            .expect("acquireTime")
            .0
            .duration_since(last.renew_time.expect("renewTime").0);
        assert!(
            waited
                >= jiff::SignedDuration::try_from(LEASE_DURATION).expect("duration")
                    - jiff::SignedDuration::from_millis(50),
            "{second} took the Lease {waited:?} after op-1's last renewal, before it expired"
        );
    }
    assert_eq!(
        taken.lease_transitions,
        after.lease_transitions.map(|t| t + 1),
        "one transition: op-1 to {second}"
    );
    cluster.apply("ha", 3).await;
    cluster.converged("ha", 3).await;
    assert_eq!(
        cluster.reporters("ha", "from 2 to 3").await,
        std::slice::from_ref(&second),
        "the new leader, and only it, scaled"
    );

    // SIGTERM: the leader stops its controllers and releases the lease at once.
    let idx = standbys
        .iter()
        .position(|o| o.name == second)
        .expect("second leader is a standby");
    let mut leader = standbys.remove(idx);
    let remaining = standbys.pop().expect("one standby left");
    // Released rather than left to expire (how fast is measured exactly in the manager
    // crate's leader tests, on a paused clock).
    let termed_at = Instant::now();
    leader.signal(libc::SIGTERM);
    wait_for_within(
        "the last standby leads after SIGTERM",
        Duration::from_secs(120),
        || async {
            (cluster.lease_holder().await.as_deref() == Some(remaining.name.as_str())).then_some(())
        },
    )
    .await;
    println!("SIGTERM handover: {:?}", termed_at.elapsed());
    let status = leader.wait_exit(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "SIGTERM is a clean exit: {status:?}\n{}",
        leader.logs()
    );
    assert!(
        leader.logs().contains("released leader lease"),
        "the leader released the Lease:\n{}",
        leader.logs()
    );
    cluster.apply("ha", 1).await;
    cluster.converged("ha", 1).await;
    assert_eq!(
        cluster.reporters("ha", "from 3 to 1").await,
        std::slice::from_ref(&remaining.name)
    );
    drop(first);
}

/// A leader cut off from the API server exits before its standby can take the Lease over:
/// order, not a time, is asserted: when the Lease names the standby, the old leader is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_stops_before_its_lease_can_expire() {
    let cluster = Cluster::start(true).await;
    // A longer lease than the other tests: the 2 s renew deadline leaves the leader 2 s to
    // stop and exit before the Lease can expire.
    let args = [
        "--leader-elect",
        "--leader-election-namespace=default",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=250ms",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ];
    let mut leader =
        Operator::spawn_with(&cluster, &cluster.kubeconfig_as("op-cut"), "op-cut", &args);
    wait_for_within("op-cut leads", Duration::from_secs(120), || async {
        (cluster.lease_holder().await.as_deref() == Some("op-cut")).then_some(())
    })
    .await;
    let standby = Operator::spawn_with(
        &cluster,
        &cluster.kubeconfig_as("op-standby"),
        "op-standby",
        &args,
    );
    standby
        .wait_log(
            "attempting to acquire leader lease",
            Duration::from_secs(120),
        )
        .await;
    // Every renewal of op-cut fails from now on, as if it were partitioned from the API
    // server; the standby's requests are served.
    cluster.server.inject(
        Fault::new()
            .user("op-cut")
            .verb("update")
            .resource("leases")
            .status(500),
    );
    wait_for_within(
        "the standby takes the Lease over",
        Duration::from_secs(120),
        || async { (cluster.lease_holder().await.as_deref() == Some("op-standby")).then_some(()) },
    )
    .await;
    let status = leader.child.try_wait().expect("try_wait");
    assert!(
        status.is_some(),
        "op-cut still runs while op-standby holds the Lease:\n{}",
        leader.logs()
    );
    let status = leader.wait_exit(Duration::from_secs(60)).await;
    assert!(
        !status.success(),
        "losing the lease is an error exit: {status:?}"
    );
    assert!(
        leader.logs().contains("lost"),
        "the log says why:\n{}",
        leader.logs()
    );
}

/// A leader partitioned from the API server in the middle of a reconcile: its requests,
/// the Lease renewals and the reconcile's write among them, get no answer (the server holds
/// them), a standby takes over, and then the partition heals. The old leader must have
/// stopped before that: the server records no write of it after the new leader's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_writes_nothing_after_the_new_leader_took_over() {
    let cluster = Cluster::start(true).await;
    let args = [
        "--leader-elect",
        "--leader-election-namespace=default",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=250ms",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ];
    let lease_duration = Duration::from_secs(4);
    let mut old = Operator::spawn_with(&cluster, &cluster.kubeconfig_as("op-a"), "op-a", &args);
    wait_for_within("op-a leads", Duration::from_secs(120), || async {
        (cluster.lease_holder().await.as_deref() == Some("op-a")).then_some(())
    })
    .await;
    let new = Operator::spawn_with(&cluster, &cluster.kubeconfig_as("op-b"), "op-b", &args);
    cluster.apply("split", 1).await;
    cluster.converged("split", 1).await;

    // The partition: every new request of op-a is held unanswered. Its open watches still
    // deliver the next change, so it starts a reconcile whose write hangs.
    cluster.server.inject(Fault::new().user("op-a").hang());
    let leases: Api<Lease> = Api::default_namespaced(cluster.server.client());
    let last_renew = leases
        .get(LEASE)
        .await
        .ok()
        .and_then(|l| l.spec?.renew_time)
        .map(|t| t.0)
        .expect("renewTime");
    cluster.apply("split", 2).await;
    wait_for_within("op-b takes over", Duration::from_secs(120), || async {
        (cluster.lease_holder().await.as_deref() == Some("op-b")).then_some(())
    })
    .await;
    // op-a is gone by then, having given up as an error.
    let status = old.child.try_wait().expect("try_wait");
    assert!(
        status.is_some_and(|s| !s.success()),
        "op-a still runs ({status:?}) while op-b leads:\n{}",
        old.logs()
    );
    // What op-a's hanging write would now undo.
    cluster.apply("split", 3).await;
    cluster.converged("split", 3).await;

    // The partition heals; whatever op-a still had in flight reaches the server now.
    cluster.server.clear_faults();
    // What is ruled out: requests the server held being served once the fault is cleared.
    // They are woken at once (and only served if their client still waits); the test's
    // own write after the clearing is in the audit log when they would have been, and 2 s
    // more is slack.
    cluster.apply("split", 4).await;
    cluster.converged("split", 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let log = cluster.server.audit_events();
    let first_of_new = log
        .iter()
        .position(|e| e.user == "op-b" && e.is_write())
        .expect("op-b wrote");
    let stale: Vec<String> = log[first_of_new..]
        .iter()
        .filter(|e| e.user == "op-a" && e.is_write())
        .map(|e| {
            format!(
                "{} {} {}/{} ({})",
                e.verb, e.resource, e.namespace, e.name, e.code
            )
        })
        .collect();
    assert!(
        stale.is_empty(),
        "op-a wrote after op-b's first write (the new leader's Lease takeover): {stale:#?}\n{}",
        old.logs()
    );
    assert!(
        log[..first_of_new]
            .iter()
            .any(|e| e.user == "op-a" && e.is_write() && e.resource == "deployments"),
        "op-a led and wrote before the partition"
    );

    let logs = old.logs();
    assert!(logs.contains("lost"), "the log says why:\n{logs}");
    println!(
        "op-a: last renewal {last_renew}, lease valid until {}; its log:\n{logs}",
        last_renew + jiff::SignedDuration::try_from(lease_duration).expect("duration")
    );
    drop(new);
}

/// A TLS connection to `addr` that accepts any certificate (the servers under test use
/// self-signed ones).
fn tls_connect(addr: SocketAddr) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AcceptAnyCert))
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let server_name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), server_name).expect("tls client");
    let sock = TcpStream::connect(addr).expect("connect");
    rustls::StreamOwned::new(conn, sock)
}

fn https_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    http_exchange(&mut tls_connect(addr), path, token)
}

fn http_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut sock = TcpStream::connect(addr).expect("connect");
    http_exchange(&mut sock, path, token)
}

fn http_exchange(
    stream: &mut (impl Read + Write),
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("write request");
    read_response(stream)
}

/// Status code and body of an HTTP/1.1 response read to the end.
fn read_response(stream: &mut impl Read) -> (u16, String) {
    let mut response = Vec::new();
    // A TLS peer closing without close_notify shows up as an error after the data; keep what was read.
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

async fn grant_metrics_reader(cluster: &Cluster, user: &str) {
    let roles: Api<ClusterRole> = Api::all(cluster.server.client());
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .expect("role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.server.client());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "prometheus-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    }))
    .expect("binding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_an_authorized_token_unless_insecure() {
    let cluster = Cluster::start(true).await;
    cluster.server.allow_token(
        "prometheus-token",
        "system:serviceaccount:monitoring:prometheus",
        &[],
    );
    cluster
        .server
        .allow_token("nosy-token", "system:serviceaccount:default:nosy", &[]);
    grant_metrics_reader(&cluster, "system:serviceaccount:monitoring:prometheus").await;

    let secure: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let plain: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let _secure_op = Operator::spawn(
        &cluster,
        "op-secure",
        &[
            &format!("--metrics-bind-address={secure}"),
            "--health-probe-bind-address=0",
            "--max-concurrent-reconciles=3",
        ],
    );
    let _plain_op = Operator::spawn(
        &cluster,
        "op-plain",
        &[
            &format!("--metrics-bind-address={plain}"),
            "--metrics-secure=false",
            "--health-probe-bind-address=0",
        ],
    );
    cluster.apply("metered", 1).await;
    cluster.converged("metered", 1).await;

    let (code, body) = wait_for_within(
        "secure metrics answer",
        Duration::from_secs(120),
        || async {
            let r = tokio::task::spawn_blocking(move || {
                TcpStream::connect(secure).ok()?;
                Some(https_get(secure, "/metrics", Some("prometheus-token")))
            })
            .await
            .ok()
            .flatten()?;
            (r.0 != 0).then_some(r)
        },
    )
    .await;
    assert_eq!(code, 200, "{body}");
    for name in [
        "controller_runtime_reconcile_total{",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "controller_runtime_max_concurrent_reconciles",
        "controller_runtime_active_workers",
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "process_resident_memory_bytes",
        "memcached_operator_managed_instances",
    ] {
        assert!(body.contains(name), "{name} missing from:\n{body}");
    }
    // The values come from the operator's own reconciles of the one Memcached it manages,
    // and from its flags, not from anything this test records.
    let value = |series: &str| -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    };
    assert_eq!(
        value(r#"controller_runtime_max_concurrent_reconciles{controller="memcached"}"#),
        Some(3.0),
        "the --max-concurrent-reconciles flag:\n{body}"
    );
    let succeeded = ["success", "requeue_after"]
        .iter()
        .filter_map(|r| {
            value(&format!(
                r#"controller_runtime_reconcile_total{{controller="memcached",result="{r}"}}"#
            ))
        })
        .sum::<f64>();
    assert!(succeeded >= 1.0, "no reconcile counted:\n{body}");
    let instances = wait_for_within(
        "the managed-instances gauge counts the one Memcached",
        Duration::from_secs(120),
        || async move {
            let r = tokio::task::spawn_blocking(move || {
                https_get(secure, "/metrics", Some("prometheus-token"))
            })
            .await
            .ok()?;
            r.1.lines()
                .find_map(|l| {
                    l.strip_prefix("memcached_operator_managed_instances ")?
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .filter(|v| *v == 1.0)
        },
    )
    .await;
    assert_eq!(instances, 1.0);

    let denied =
        tokio::task::spawn_blocking(move || https_get(secure, "/metrics", Some("nosy-token")))
            .await
            .expect("join");
    assert_eq!(
        denied.0, 403,
        "an authenticated but unauthorized caller: {}",
        denied.1
    );
    let anonymous = tokio::task::spawn_blocking(move || https_get(secure, "/metrics", None))
        .await
        .expect("join");
    assert_eq!(anonymous.0, 401);
    let forged = tokio::task::spawn_blocking(move || https_get(secure, "/metrics", Some("forged")))
        .await
        .expect("join");
    assert_eq!(forged.0, 401);

    let insecure = wait_for_within(
        "insecure metrics answer",
        Duration::from_secs(20),
        || async {
            let r = tokio::task::spawn_blocking(move || {
                TcpStream::connect(plain).ok()?;
                Some(http_get(plain, "/metrics", None))
            })
            .await
            .ok()
            .flatten()?;
            (r.0 != 0).then_some(r)
        },
    )
    .await;
    assert_eq!(insecure.0, 200);
    assert!(insecure.1.contains("controller_runtime_reconcile_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_ready_once_caches_sync() {
    let cluster = Cluster::start(true).await;
    // Slow lists make the unsynced window long enough to observe.
    let probes: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    cluster.server.set_latency(Duration::from_millis(700));
    let op = Operator::spawn(
        &cluster,
        "op-probes",
        &[
            "--metrics-bind-address=0",
            &format!("--health-probe-bind-address={probes}"),
        ],
    );
    let get = move |path: &'static str| async move {
        tokio::task::spawn_blocking(move || {
            TcpStream::connect(probes).ok()?;
            Some(http_get(probes, path, None))
        })
        .await
        .ok()
        .flatten()
    };
    let first = wait_for_within("probe server up", Duration::from_secs(20), || {
        get("/readyz?verbose")
    })
    .await;
    assert_eq!(
        first.0, 500,
        "not ready before the caches sync: {}",
        first.1
    );
    assert!(first.1.contains("informers-synced"), "{}", first.1);
    assert_eq!(
        get("/healthz").await.map(|r| r.0),
        Some(200),
        "alive while syncing"
    );
    cluster.server.set_latency(Duration::ZERO);
    wait_for_within("ready after sync", Duration::from_secs(120), || async {
        (get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    drop(op);
}

fn run_once(kubeconfig: &Path) -> (ExitStatus, String) {
    let out = Command::new(BIN)
        .args([
            "run",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "off")
        .env("ENABLE_WEBHOOKS", "false")
        .output()
        .expect("operator runs");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

/// An API server that answers every request with this `/version` (the first thing `run`
/// asks); returns its kubeconfig.
fn server_of_version(dir: &TempDir, major: &str, minor: &str, git: &str) -> PathBuf {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let body = json!({"major": major, "minor": minor, "gitVersion": git}).to_string();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let kubeconfig = dir.0.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    kubeconfig
}

/// Below the oldest supported Kubernetes (v1.33, the version of the API types and of the
/// oldest control plane the tests run on) `run` refuses at start-up, once, naming both
/// versions, instead of having every write refused later; a provider's `33+` minor is
/// supported; `--allow-unsupported-kubernetes` goes on to the next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_kubernetes_is_refused_once_at_start_up() {
    let dir = TempDir::new("old-kube");
    let old = server_of_version(&dir, "1", "32", "v1.32.4");
    let (status, stderr) = {
        let old = old.clone();
        tokio::task::spawn_blocking(move || run_once(&old))
            .await
            .expect("join")
    };
    assert!(!status.success());
    assert!(
        stderr
            .contains("Kubernetes v1.32.4 is older than this operator supports (v1.33 and newer)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--allow-unsupported-kubernetes"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");

    let allowed = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "run",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
                "--allow-unsupported-kubernetes",
            ])
            .env("KUBECONFIG", &old)
            .env("RUST_LOG", "off")
            .env("ENABLE_WEBHOOKS", "false")
            .output()
            .expect("operator runs")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(!stderr.contains("older than"), "let through: {stderr}");

    let dir = TempDir::new("provider-kube");
    let provider = server_of_version(&dir, "1", "33+", "v1.33.5-gke.1");
    let (_, stderr) = tokio::task::spawn_blocking(move || run_once(&provider))
        .await
        .expect("join");
    assert!(
        !stderr.contains("older than"),
        "1.33+ is supported: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_or_an_unreachable_cluster_is_a_one_line_error() {
    let cluster = Cluster::start(false).await;
    let kubeconfig = cluster.kubeconfig.clone();
    let (status, stderr) = tokio::task::spawn_blocking(move || run_once(&kubeconfig))
        .await
        .expect("join");
    assert!(!status.success());
    assert!(
        stderr.contains("CRD") && stderr.contains("not installed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("memcached-operator crd | kubectl apply"),
        "says how to install it: {stderr}"
    );

    let dir = TempDir::new("unreachable");
    let port = free_port();
    let kubeconfig = dir.0.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        cluster
            ._handle
            .kubeconfig_yaml()
            .replace(&cluster._handle.url(), &format!("http://127.0.0.1:{port}")),
    )
    .expect("write kubeconfig");
    let (status, stderr) = tokio::task::spawn_blocking(move || run_once(&kubeconfig))
        .await
        .expect("join");
    assert!(!status.success());
    assert!(
        stderr.contains("cannot reach the Kubernetes API server"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn a_bad_worker_thread_count_is_refused_with_the_flag_named() {
    for (args, env) in [
        (vec!["run", "--worker-threads=-1"], None),
        (vec!["run", "--worker-threads=many"], None),
        (vec!["run"], Some(("TOKIO_WORKER_THREADS", "70000"))),
    ] {
        let mut cmd = Command::new(BIN);
        // Were the value accepted, the run would stop at once for want of a cluster.
        cmd.args(&args)
            .env("RUST_LOG", "off")
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST");
        if let Some((key, value)) = env {
            cmd.env(key, value);
        }
        let out = cmd.output().expect("operator runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?} was accepted");
        assert!(
            stderr.contains("--worker-threads"),
            "{args:?} {env:?}: {stderr}"
        );
    }
}

/// `--resync-period=0s` would re-check every object in a busy loop: refused at start-up,
/// naming the flag and why; a second is the shortest accepted.
#[test]
fn a_resync_period_under_a_second_is_refused() {
    for period in ["0s", "0ms", "500ms"] {
        let out = Command::new(BIN)
            .args(["run", &format!("--resync-period={period}")])
            .env("RUST_LOG", "off")
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("operator runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{period} was accepted");
        assert!(
            stderr.contains("--resync-period") && stderr.contains("busy loop"),
            "{period}: {stderr}"
        );
    }
}

fn https_post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut tls = tls_connect(addr);
    write!(
        tls,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write request");
    read_response(&mut tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_need_a_certificate_and_then_reject_bad_objects() {
    let cluster = Cluster::start(true).await;
    let dir = TempDir::new("webhook-certs");

    // Enabled without a certificate: refuse to start, saying why and how to fix it.
    let kubeconfig = cluster.kubeconfig.clone();
    let cert_dir = dir.0.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "run",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
            ])
            .arg(format!("--webhook-cert-dir={}", cert_dir.display()))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "off")
            .env_remove("ENABLE_WEBHOOKS")
            .output()
            .expect("operator runs")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no usable serving certificate"), "{stderr}");
    assert!(
        stderr.contains("ENABLE_WEBHOOKS=false"),
        "says how to run without: {stderr}"
    );

    let pair = manager::webhook_tls::generate_self_signed(&["localhost".to_string()])
        .expect("self-signed");
    std::fs::write(dir.0.join("tls.crt"), pair.cert_pem).expect("write cert");
    std::fs::write(dir.0.join("tls.key"), pair.key_pem).expect("write key");
    let port = free_port();
    let mut op = Operator::spawn(
        &cluster,
        "op-webhook",
        &[
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--enable-webhooks=true",
            &format!("--webhook-port={port}"),
            &format!("--webhook-cert-dir={}", dir.0.display()),
        ],
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2b0e-1d2c-4c57-9d8b-3f1a2e4b5c6d",
            "kind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
            "resource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
            "operation": "CREATE", "name": "bad", "namespace": "default",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                       "metadata": {"name": "bad", "namespace": "default"}, "spec": {"size": -1}}
        }
    })
    .to_string();
    let (code, body) = wait_for_within("webhook answers", Duration::from_secs(20), || {
        let review = review.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                TcpStream::connect(addr).ok()?;
                Some(https_post(
                    addr,
                    "/validate-memcached-cache-example-com-v1-memcached",
                    &review,
                ))
            })
            .await
            .ok()
            .flatten()
            .filter(|r| r.0 != 0)
        }
    })
    .await;
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("AdmissionReview JSON");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.size"),
        "{answer}"
    );
    assert!(
        op.child.try_wait().expect("try_wait").is_none(),
        "still serving:\n{}",
        op.logs()
    );
    drop(op);
}
