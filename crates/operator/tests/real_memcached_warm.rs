//! A cache that stays warm through routine operations, against a real memcached (Debian's
//! package; `.ci/run` installs it) running the exact argument lists the Deployment builder
//! produces: a renewed TLS certificate is loaded in place by the reload agent (the operator's
//! own binary) without losing an item, a certificate memcached refuses is reported by the
//! agent (exit code 3, memcached's reason in the termination log) while memcached keeps
//! serving the old one, extstore holds four times the memory's worth of items, a full
//! extstore (memcached 1.6.38, every page written) stays within the `emptyDir` limit the
//! builder sets on tmpfs, ext4 and XFS and fits the filesystem of the claim it sets, and
//! every extstore/rollout/TLS combination the validation accepts starts a memcached that
//! reports the settings asked for. Only what must differ on a test machine is rewritten: file
//! paths, loopback instead of every address, free ports, and `-u nobody` when run as root
//! (the filesystems other than the temp dir are mounted only as root).
//! Without a `memcached` binary the tests fail, naming the package that provides it.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PodSpec;
use memcached_api::{
    ClientAuthSpec, ClientVerify, ExtstoreSpec, Memcached, MemcachedConfig, MemcachedSpec,
    RolloutSpec, TlsRotation, TlsSpec,
};
use memcached_operator::builders::{self, BuildSettings};
use proptest::prelude::*;

mod common;
use common::process::{free_port, memcached_binary, recent_memcached};
use common::{big_value, volume_bytes};

const TLS_DIR: &str = "/etc/memcached/tls";
const EXTSTORE_FILE: &str = "/var/lib/memcached/extstore/data";
const AGENT_BINARY: &str = builders::TLS_AGENT_BINARY;
const MIB: u64 = 1024 * 1024;

// ---------------------------------------------------------------------------------------
// Processes, ports, directories

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// A directory under the system temp dir, removed when dropped. 0755, so memcached running
/// as `nobody` can read what is in it.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mc-warm-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        chmod(&dir, 0o755);
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// A subdirectory anyone may write in (extstore's file is created by `nobody`).
    fn writable_subdir(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).expect("subdir");
        chmod(&dir, 0o777);
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed when dropped; its output goes to `log`.
struct Running {
    child: Child,
    log: PathBuf,
    what: &'static str,
}

impl Running {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the process's output) if it has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}): {}", self.what, self.output());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(what: &'static str, program: &str, args: &[String], log: PathBuf) -> Running {
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("{what} ({program}) starts: {e}"));
    Running { child, log, what }
}

/// Starts memcached with `args` (argv[0] replaced by the binary). Without a `-l` of the
/// builder's, it listens on loopback only; as root it runs as `nobody` (memcached refuses
/// root without `-u`; in the pod it runs as UID 11211).
fn start_memcached(args: &[String], dir: &TempDir) -> Running {
    start_memcached_binary(&memcached_binary(), args, dir)
}

/// [`start_memcached`] with another memcached `binary`.
fn start_memcached_binary(binary: &str, args: &[String], dir: &TempDir) -> Running {
    let mut argv = args[1..].to_vec();
    if !argv.iter().any(|a| a == "-l") {
        argv.extend(["-l".to_string(), "127.0.0.1".to_string()]);
    }
    if is_root() {
        argv.extend(["-u".to_string(), "nobody".to_string()]);
    }
    spawn("memcached", binary, &argv, dir.path().join("memcached.log"))
}

/// Waits (at most 10 s) until something listens on `port`, failing if `process` exits.
fn wait_listening(port: u16, process: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        process.assert_running();
        assert!(
            Instant::now() < deadline,
            "{} did not listen on {port} within 10 s: {}",
            process.what,
            process.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replaces `from` by `to` in every argument, failing unless it occurs somewhere (so a
/// change of the builder's output does not make the rewrite, and the test, silently moot).
fn rewrite(args: &mut [String], from: &str, to: &str) {
    assert!(
        args.iter().any(|a| a.contains(from)),
        "{from:?} is not in {args:?}"
    );
    for arg in args.iter_mut() {
        *arg = arg.replace(from, to);
    }
}

fn pool(spec: MemcachedSpec) -> Memcached {
    let mut mc = Memcached::new("warm", spec);
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some("u".into());
    mc
}

fn pod_spec(mc: &Memcached) -> PodSpec {
    builders::desired_deployment(mc, &BuildSettings::default())
        .expect("builds")
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec")
}

fn memcached_command(pod: &PodSpec) -> Vec<String> {
    pod.containers
        .first()
        .and_then(|c| c.command.clone())
        .expect("memcached's command")
}

// ---------------------------------------------------------------------------------------
// A memcached text-protocol client, over plain TCP or TLS

/// memcached's text client of the real-node suites, with the batched sets these tests use.
use common::real_node::Text as Client;

impl<S: Read + Write> Client<S> {
    fn send(&mut self, bytes: &[u8]) {
        self.0
            .get_mut()
            .write_all(bytes)
            .expect("send to memcached");
    }

    fn set_command(key: &str, value: &[u8]) -> Vec<u8> {
        let mut cmd = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        cmd.extend_from_slice(value);
        cmd.extend_from_slice(b"\r\n");
        cmd
    }

    /// Sets each item and waits for its answer before the next. Over TLS memcached 1.6.18
    /// stalls on pipelined requests (what is left in its TLS buffer after a read is not
    /// processed until more bytes arrive), so TLS clients do not pipeline.
    fn set_each(&mut self, items: &[(String, Vec<u8>)]) {
        for item in items {
            self.set_many(std::slice::from_ref(item));
        }
    }

    /// Sets every item in one write, then reads every answer.
    fn set_many(&mut self, items: &[(String, Vec<u8>)]) {
        let mut batch = Vec::new();
        for (key, value) in items {
            batch.extend(Self::set_command(key, value));
        }
        self.send(&batch);
        for (key, _) in items {
            let answer = self.line();
            assert_eq!(answer, "STORED", "set {key}");
        }
    }

    /// Sets `items` in one round trip; the items memcached refused for lack of memory
    /// (`-M`), to be sent again.
    fn set_many_refused(&mut self, items: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
        let mut batch = Vec::new();
        for (key, value) in items {
            batch.extend(Self::set_command(key, value));
        }
        self.send(&batch);
        let mut refused = Vec::new();
        for item in items {
            match self.line().as_str() {
                "STORED" => {}
                "SERVER_ERROR out of memory storing object" => refused.push(item.clone()),
                other => panic!("set {}: {other}", item.0),
            }
        }
        refused
    }
}

fn plain(port: u16) -> Client<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    Client(BufReader::new(stream))
}

use common::tls::TlsStream;

/// A new TLS connection to memcached on `port`, and the DER of the end-entity certificate
/// its handshake presented.
fn tls(port: u16) -> Result<(Client<TlsStream>, Vec<u8>), String> {
    let (stream, presented) =
        common::tls::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
    Ok((Client(BufReader::new(stream)), presented))
}

// ---------------------------------------------------------------------------------------
// Certificates, in a directory laid out as the kubelet lays out a Secret volume

struct Cert {
    name: &'static str,
    pem: String,
    key_pem: String,
    der: Vec<u8>,
}

fn self_signed(name: &'static str) -> Cert {
    let certified = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("rcgen");
    Cert {
        name,
        pem: certified.cert.pem(),
        key_pem: certified.signing_key.serialize_pem(),
        der: certified.cert.der().to_vec(),
    }
}

/// The kubelet's atomic writer: the files live in a timestamped directory, `..data` links
/// to it and `tls.crt` etc. link through `..data`; an update writes a new directory and
/// renames a new `..data` link over the old one, so readers see all old or all new files.
struct SecretVolume {
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    fn new(dir: PathBuf) -> Self {
        std::fs::create_dir_all(&dir).expect("secret dir");
        chmod(&dir, 0o755);
        Self { dir, generation: 0 }
    }

    fn write(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let data = format!("..gen_{}", self.generation);
        let data_dir = self.dir.join(&data);
        std::fs::create_dir(&data_dir).expect("data dir");
        chmod(&data_dir, 0o755);
        for (name, contents) in files {
            let path = data_dir.join(name);
            std::fs::write(&path, contents).expect("write secret file");
            // memcached runs as `nobody` in a root test run: the key must be readable.
            chmod(&path, 0o644);
        }
        let tmp = self.dir.join("..data_tmp");
        symlink(&data, &tmp).expect("symlink");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(name), &link).expect("symlink");
            }
        }
        if let Some(old) = old {
            let _ = std::fs::remove_dir_all(self.dir.join(old));
        }
    }

    fn install(&mut self, cert: &Cert, key_of: &Cert) {
        self.write(&[("tls.crt", &cert.pem), ("tls.key", &key_of.key_pem)]);
    }
}

/// A TLS pool as the builder makes it with the default rotation (`InPlace`): memcached and
/// the reload agent, both from the pod spec's commands.
struct TlsPool {
    memcached: Running,
    /// memcached's binary and arguments, to start it again as a rollout would.
    binary: String,
    args: Vec<String>,
    agent: Running,
    port: u16,
    admin: u16,
    agent_args: Vec<String>,
    volume: SecretVolume,
    termination_log: PathBuf,
    dir: TempDir,
}

impl TlsPool {
    fn start(first: &Cert) -> Self {
        Self::start_with(&memcached_binary(), first, None)
    }

    /// A pool of memcached `binary` that verifies clients against the CA `ca_pem`, written
    /// as the Secret's `ca.crt`, when `client_auth` is given.
    fn start_with(binary: &str, first: &Cert, client_auth: Option<(ClientAuthSpec, &str)>) -> Self {
        let dir = TempDir::new("tls");
        let port = free_port();
        let admin = free_port();
        let mc = pool(MemcachedSpec {
            container_port: i32::from(port),
            tls: Some(TlsSpec {
                client_auth: client_auth.as_ref().map(|(spec, _)| spec.clone()),
                ..TlsSpec::secret("certs")
            }),
            ..MemcachedSpec::with_size(1)
        });
        let pod = pod_spec(&mc);
        let certs = dir.path().join("certs");
        let certs_str = certs.display().to_string();

        let mut args = memcached_command(&pod);
        rewrite(&mut args, TLS_DIR, &certs_str);
        rewrite(
            &mut args,
            &format!("*:{port},notls:127.0.0.1:{}", memcached_api::TLS_ADMIN_PORT),
            &format!("127.0.0.1:{port},notls:127.0.0.1:{admin}"),
        );

        let mut agent_args = pod
            .init_containers
            .as_ref()
            .and_then(|c| c.first())
            .and_then(|c| c.command.clone())
            .expect("the reload agent's command");
        assert_eq!(agent_args[0], AGENT_BINARY, "{agent_args:?}");
        rewrite(&mut agent_args, TLS_DIR, &certs_str);
        let state = dir.writable_subdir("agent-state");
        rewrite(
            &mut agent_args,
            builders::TLS_AGENT_STATE_DIR,
            &state.display().to_string(),
        );
        rewrite(
            &mut agent_args,
            &format!("127.0.0.1:{}", memcached_api::TLS_ADMIN_PORT),
            &format!("127.0.0.1:{admin}"),
        );
        let termination_log = dir.path().join("termination-log");
        agent_args.extend([
            "--interval".to_string(),
            "200ms".to_string(),
            "--termination-log".to_string(),
            termination_log.display().to_string(),
        ]);

        let mut volume = SecretVolume::new(certs);
        match client_auth {
            None => volume.install(first, first),
            Some((_, ca_pem)) => volume.write(&[
                ("tls.crt", &first.pem),
                ("tls.key", &first.key_pem),
                ("ca.crt", ca_pem),
            ]),
        }
        let mut memcached = start_memcached_binary(binary, &args, &dir);
        let agent = spawn(
            "the reload agent",
            env!("CARGO_BIN_EXE_memcached-operator"),
            &agent_command(&agent_args),
            dir.path().join("agent.log"),
        );
        wait_listening(port, &mut memcached);
        wait_listening(admin, &mut memcached);
        Self {
            memcached,
            binary: binary.to_string(),
            args,
            agent,
            port,
            admin,
            agent_args,
            volume,
            termination_log,
            dir,
        }
    }

    /// Stops memcached and starts it again with the same arguments and files, as a new pod
    /// of the rollout would (an empty cache).
    fn restart_memcached(&mut self) {
        let _ = self.memcached.child.kill();
        let _ = self.memcached.child.wait();
        self.memcached = start_memcached_binary(&self.binary, &self.args, &self.dir);
        wait_listening(self.port, &mut self.memcached);
    }

    /// Starts the agent again, as the kubelet restarts an exited sidecar.
    fn restart_agent(&mut self) {
        let _ = std::fs::remove_file(&self.termination_log);
        self.agent = spawn(
            "the reload agent",
            env!("CARGO_BIN_EXE_memcached-operator"),
            &agent_command(&self.agent_args),
            self.dir.path().join("agent-2.log"),
        );
    }

    /// A new TLS connection, failing unless it presents `cert`.
    fn connect_presenting(&self, cert: &Cert) -> Client<TlsStream> {
        let (client, presented) = tls(self.port).expect("TLS connection");
        assert!(
            presented == cert.der,
            "memcached presents a certificate other than {}",
            cert.name
        );
        client
    }

    /// Polls (at most 15 s) until a new handshake presents `cert`.
    fn wait_presenting(&mut self, cert: &Cert) -> Client<TlsStream> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            self.memcached.assert_running();
            if let Ok((client, presented)) = tls(self.port)
                && presented == cert.der
            {
                return client;
            }
            assert!(
                Instant::now() < deadline,
                "memcached did not present {} within 15 s; agent: {}",
                cert.name,
                self.agent.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn small_items(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let value = format!("value {i} {}", "x".repeat(i % 700)).into_bytes();
            (format!("warm:{i}"), value)
        })
        .collect()
}

fn assert_all_present<S: Read + Write>(client: &mut Client<S>, items: &[(String, Vec<u8>)]) {
    let mut missing = Vec::new();
    for (key, value) in items {
        if client.get_bytes(key).as_ref() != Some(value) {
            missing.push(key.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} items missing or changed, e.g. {:?}",
        missing.len(),
        items.len(),
        &missing[..missing.len().min(5)]
    );
}

fn stat(stats: &HashMap<String, String>, key: &str) -> u64 {
    stats
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("stats has no numeric {key}: {stats:?}"))
}

// ---------------------------------------------------------------------------------------
// 1. A renewed certificate is loaded in place; the cache stays

#[test]
fn a_renewed_certificate_is_loaded_in_place_and_the_cache_stays() {
    let first = self_signed("first.example");
    let second = self_signed("second.example");
    let mut pool = TlsPool::start(&first);

    let items = small_items(1000);
    let mut client = pool.wait_presenting(&first);
    client.set_each(&items);
    let before = client.stats("");
    assert_eq!(stat(&before, "pid"), u64::from(pool.memcached.child.id()));
    drop(client);

    pool.volume.install(&second, &second);
    let mut client = pool.wait_presenting(&second);
    assert_all_present(&mut client, &items);
    let after = client.stats("");
    assert_eq!(
        stat(&after, "pid"),
        stat(&before, "pid"),
        "the same memcached"
    );
    assert!(
        stat(&after, "uptime") >= stat(&before, "uptime"),
        "memcached did not restart: {after:?}"
    );
    assert_eq!(stat(&after, "curr_items"), 1000);
    // Every new handshake presents the new certificate, not just one.
    drop(pool.connect_presenting(&second));
    pool.memcached.assert_running();
    pool.agent.assert_running();
    assert!(
        pool.agent
            .output()
            .contains("memcached loaded the certificate"),
        "the agent reloaded: {}",
        pool.agent.output()
    );
    assert!(
        !pool.termination_log.exists(),
        "nothing in the termination log"
    );
}

// ---------------------------------------------------------------------------------------
// 1b. Client certificates: verified against the CA, which reloads in place too

/// A CA that signs client certificates.
struct ClientCa {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl ClientCa {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let pem = params.self_signed(&key).expect("CA").pem();
        Self {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A client certificate `name` signed by this CA.
    fn client(&self, name: &str) -> common::tls::ClientCert {
        let key = rcgen::KeyPair::generate().expect("client key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("client certificate");
        common::tls::ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// Whether memcached on `port` serves a TLS client presenting `client` (or no certificate):
/// the handshake completes and `get key` is answered. The value it answered, if any.
fn served(
    port: u16,
    client: Option<&common::tls::ClientCert>,
    key: &str,
) -> Result<Option<String>, String> {
    let (stream, _) =
        common::tls::connect_as(std::net::SocketAddr::from(([127, 0, 0, 1], port)), client)?;
    Client(BufReader::new(stream))
        .try_get(key)
        .map_err(|e| format!("get {key}: {e}"))
}

#[test]
fn client_certificates_are_verified_and_a_new_ca_needs_a_restart_to_drop_the_old() {
    for binary in [memcached_binary(), recent_memcached()] {
        let server = self_signed("server.example");
        let first_ca = ClientCa::new("first client CA");
        let second_ca = ClientCa::new("second client CA");
        let alice = first_ca.client("alice");
        let mallory = second_ca.client("mallory");
        let mut pool = TlsPool::start_with(
            &binary,
            &server,
            Some((ClientAuthSpec::default(), first_ca.pem.as_str())),
        );
        pool.wait_presenting(&server);
        // A client of the CA is served.
        let (stream, _) = common::tls::connect_as(
            std::net::SocketAddr::from(([127, 0, 0, 1], pool.port)),
            Some(&alice),
        )
        .expect("alice's handshake");
        let mut client = Client(BufReader::new(stream));
        client.set_each(&[("who".to_string(), b"alice".to_vec())]);
        drop(client);
        assert_eq!(
            served(pool.port, Some(&alice), "who"),
            Ok(Some("alice".into())),
            "{binary}"
        );
        // Without a certificate, or with one of another CA, nothing is served.
        let anonymous = served(pool.port, None, "who");
        assert!(
            anonymous.is_err(),
            "{binary}: a client without a certificate: {anonymous:?}"
        );
        let stranger = served(pool.port, Some(&mallory), "who");
        assert!(
            stranger.is_err(),
            "{binary}: a client of another CA: {stranger:?}"
        );
        let pid = pool.memcached.child.id();

        // A new CA in the Secret: the agent has memcached load it in place, as it does a
        // renewed certificate, and its clients are served at once, from the same cache.
        pool.volume.write(&[
            ("tls.crt", &server.pem),
            ("tls.key", &server.key_pem),
            ("ca.crt", &second_ca.pem),
        ]);
        let deadline = Instant::now() + Duration::from_secs(15);
        while served(pool.port, Some(&mallory), "who").is_err() {
            pool.memcached.assert_running();
            assert!(
                Instant::now() < deadline,
                "{binary}: memcached did not take the new CA within 15 s; agent: {}",
                pool.agent.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            served(pool.port, Some(&mallory), "who"),
            Ok(Some("alice".into())),
            "{binary}: the same cache"
        );
        assert_eq!(
            pool.memcached.child.id(),
            pid,
            "{binary}: the same memcached"
        );
        // But the CA taken out of ca.crt is still trusted: memcached adds the CAs of a
        // reloaded ca.crt to those it has. That is why a new CA rolls the pods.
        assert_eq!(
            served(pool.port, Some(&alice), "who"),
            Ok(Some("alice".into())),
            "{binary}: memcached dropped a CA in place; a new CA need not roll the pods"
        );
        // A memcached started on the new files (a new pod) trusts the new CA alone.
        pool.restart_memcached();
        assert_eq!(
            served(pool.port, Some(&mallory), "who"),
            Ok(None),
            "{binary}"
        );
        let old_client = served(pool.port, Some(&alice), "who");
        assert!(
            old_client.is_err(),
            "{binary}: a client of the CA taken out: {old_client:?}"
        );
        pool.agent.assert_running();
    }
}

#[test]
fn optional_client_verification_serves_clients_without_a_certificate_only() {
    let server = self_signed("server.example");
    let ca = ClientCa::new("client CA");
    let other = ClientCa::new("another CA");
    let pool = TlsPool::start_with(
        &memcached_binary(),
        &server,
        Some((
            ClientAuthSpec {
                verify: Some(ClientVerify::Optional),
                ..ClientAuthSpec::default()
            },
            ca.pem.as_str(),
        )),
    );
    assert_eq!(
        served(pool.port, None, "absent"),
        Ok(None),
        "no certificate: served"
    );
    assert_eq!(
        served(pool.port, Some(&ca.client("alice")), "absent"),
        Ok(None),
        "a certificate of the CA: served"
    );
    let stranger = served(pool.port, Some(&other.client("mallory")), "absent");
    assert!(
        stranger.is_err(),
        "a certificate of another CA: {stranger:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A certificate memcached refuses is reported

/// Waits (at most 15 s) for the agent to exit, failing unless it exits with `code`; the
/// termination log's contents.
fn wait_agent_failed(pool: &mut TlsPool, code: i32) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = pool.agent.child.try_wait().expect("agent status") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not exit within 15 s of a refused certificate: {}",
            pool.agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(code), "{}", pool.agent.output());
    let reason = std::fs::read_to_string(&pool.termination_log).expect("termination log");
    assert!(
        reason.contains(&format!(
            "memcached could not load the certificate in {}: ",
            pool.dir.path().join("certs").display()
        )),
        "{reason}"
    );
    reason
}

/// A key that does not match the certificate: the agent reports it and exits 4 without
/// sending it to memcached, which keeps serving the old certificate and every item. The
/// kubelet restarts the agent, which waits for new files (it does not fail again on the
/// same ones); once the Secret is fixed it loads them with no item lost, then exits 0 so
/// the kubelet's record of its last run is no longer the failure.
#[test]
fn a_mismatched_key_is_reported_and_never_reaches_memcached() {
    let first = self_signed("first.example");
    let second = self_signed("second.example");
    let mut pool = TlsPool::start(&first);

    let items = small_items(1000);
    let mut client = pool.wait_presenting(&first);
    client.set_each(&items);
    let pid = stat(&client.stats(""), "pid");
    drop(client);

    // The second certificate with the first one's key.
    pool.volume.install(&second, &first);
    let reason = wait_agent_failed(&mut pool, builders::TLS_AGENT_CERTIFICATE_INVALID);
    assert!(
        reason.contains("tls.key does not match the certificate in tls.crt"),
        "{reason}"
    );

    pool.memcached.assert_running();
    let mut client = pool.connect_presenting(&first);
    assert_all_present(&mut client, &items);
    assert_eq!(stat(&client.stats(""), "pid"), pid, "the same memcached");
    drop(client);

    // The kubelet restarts the agent; the Secret is fixed; the agent loads it.
    pool.restart_agent();
    pool.volume.install(&second, &second);
    let mut client = pool.wait_presenting(&second);
    assert_all_present(&mut client, &items);
    assert_eq!(stat(&client.stats(""), "pid"), pid, "the same memcached");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = pool.agent.child.try_wait().expect("agent status") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the recovered agent did not exit 0 within 15 s: {}",
            pool.agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{}", pool.agent.output());
}

/// Why the agent checks the pair itself: memcached 1.6.18 installs a new chain in its live
/// TLS context before it checks the key, so `refresh_certs` with a mismatched pair answers
/// an error and leaves every new handshake failing (alert `handshake_failure`), though the
/// process and its cache stay.
#[test]
fn memcached_itself_fails_every_handshake_after_a_mismatched_reload() {
    let first = self_signed("first.example");
    let second = self_signed("second.example");
    let mut pool = TlsPool::start(&first);
    drop(pool.wait_presenting(&first));
    // Stop the agent: the pair goes to memcached directly.
    let _ = pool.agent.child.kill();
    let _ = pool.agent.child.wait();
    pool.volume.install(&second, &first);
    let mut admin = plain(pool.admin);
    admin.send(b"refresh_certs\r\n");
    let answer = admin.line();
    assert!(
        answer.contains("Error loading the key: ") && answer.contains("key values mismatch"),
        "{answer}"
    );
    pool.memcached.assert_running();
    match tls(pool.port) {
        Err(e) => assert!(e.contains("HandshakeFailure"), "{e}"),
        Ok(_) => panic!("memcached presented a certificate after a mismatched reload"),
    }
}

/// A certificate that is not one: the agent reports it and exits 4 without sending it;
/// memcached keeps serving the old certificate and every item.
#[test]
fn an_unreadable_certificate_is_reported_and_memcached_keeps_the_old_one() {
    let first = self_signed("first.example");
    let mut pool = TlsPool::start(&first);

    let items = small_items(1000);
    let mut client = pool.wait_presenting(&first);
    client.set_each(&items);
    let pid = stat(&client.stats(""), "pid");
    drop(client);

    pool.volume.write(&[
        ("tls.crt", "not a certificate\n"),
        ("tls.key", &first.key_pem),
    ]);
    let reason = wait_agent_failed(&mut pool, builders::TLS_AGENT_CERTIFICATE_INVALID);
    assert!(
        reason.contains("tls.crt holds no PEM certificate"),
        "{reason}"
    );

    pool.memcached.assert_running();
    let mut client = pool.connect_presenting(&first);
    assert_all_present(&mut client, &items);
    assert_eq!(stat(&client.stats(""), "pid"), pid, "the same memcached");
}

// ---------------------------------------------------------------------------------------
// 3. extstore holds four times the memory

#[test]
fn extstore_holds_four_times_the_memory() {
    const MEMORY_MIB: u64 = 64;
    const VALUE: usize = 16 * 1024;
    const TOTAL: u64 = 4 * MEMORY_MIB * MIB;
    let count = usize::try_from(TOTAL).expect("usize") / VALUE;

    let dir = TempDir::new("extstore");
    let port = free_port();
    let mc = pool(MemcachedSpec {
        container_port: i32::from(port),
        config: Some(MemcachedConfig {
            memory_mib: MEMORY_MIB as i32,
            ..MemcachedConfig::default()
        }),
        extstore: Some(Box::new(ExtstoreSpec {
            size: "1Gi".into(),
            ..ExtstoreSpec::default()
        })),
        ..MemcachedSpec::with_size(1)
    });
    memcached_api::validation::validate(&mc).expect("a valid spec");
    let mut args = memcached_command(&pod_spec(&mc));
    let file = dir.writable_subdir("extstore").join("data");
    rewrite(&mut args, EXTSTORE_FILE, &file.display().to_string());
    // memcached's flush thread moves values to the file in the background; a writer that
    // outruns it (unpaced writes, or a busy machine starving the flusher) would have items
    // evicted. `-M` makes memcached refuse a write it has no room for yet instead, so the
    // writes below are paced by memcached itself: a refused one is sent again once the
    // flusher has written more. What is checked, every item read back from a pool four
    // times its memory, does not depend on it.
    args.push("-M".into());
    let mut memcached = start_memcached(&args, &dir);
    wait_listening(port, &mut memcached);

    let mut client = plain(port);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut refusals = 0u64;
    let deadline = Instant::now() + Duration::from_secs(300);
    for batch in (0..count).collect::<Vec<_>>().chunks(64) {
        let mut items: Vec<(String, Vec<u8>)> = batch
            .iter()
            .map(|&i| (format!("ext:{i}"), big_value(i, VALUE)))
            .collect();
        loop {
            let written = stat(&client.stats(""), "extstore_bytes_written");
            items = client.set_many_refused(&items);
            if items.is_empty() {
                break;
            }
            refusals += items.len() as u64;
            assert!(
                Instant::now() < deadline,
                "memcached kept refusing writes for lack of memory: {:?}",
                client.stats("")
            );
            // Wait for the flusher to make room: more bytes written to the file.
            while stat(&client.stats(""), "extstore_bytes_written") == written
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        sent += (batch.len() * VALUE) as u64;
    }
    let rate = sent as f64 / MIB as f64 / started.elapsed().as_secs_f64();

    let mut misses = 0;
    let mut wrong = 0;
    for i in 0..count {
        match client.get_bytes(&format!("ext:{i}")) {
            None => misses += 1,
            Some(v) if v != big_value(i, VALUE) => wrong += 1,
            Some(_) => {}
        }
    }
    let stats = client.stats("");
    let used = stat(&stats, "extstore_bytes_used");
    eprintln!(
        "extstore: {count} items of {VALUE} bytes written at {rate:.1} MiB/s ({refusals} \
         writes refused until the flusher made room); \
         extstore_objects_used {}, extstore_bytes_used {used} ({:.1} MiB), \
         extstore_bytes_written {}, get_extstore {}, evictions {}",
        stat(&stats, "extstore_objects_used"),
        used as f64 / MIB as f64,
        stat(&stats, "extstore_bytes_written"),
        stat(&stats, "get_extstore"),
        stat(&stats, "evictions"),
    );
    // A cache, not a store: when memcached's slab rebalancer moves a page between item
    // sizes it drops what it cannot rescue (`slab_reassign_evictions_nomem`), more often on
    // a busy machine (1.1 % of the items under a load of 15 on two cores). The
    // claim is the capacity: all but a sliver of four times the memory is read back, and
    // every item missing is one memcached counted as dropped (below).
    assert!(
        misses * 100 <= count * 3,
        "of {count} items, {misses} missing (more than 3 %): {stats:?}"
    );
    assert_eq!(
        misses,
        stat(&stats, "slab_reassign_evictions_nomem") as usize + stat(&stats, "evictions") as usize,
        "every missing item was dropped by memcached's own rebalancing: {stats:?}"
    );
    assert_eq!(wrong, 0, "of {count} items, {wrong} with other contents");
    assert!(stat(&stats, "extstore_objects_used") > 0, "{stats:?}");
    assert!(
        used > MEMORY_MIB * MIB,
        "extstore holds more than the memory: {used} bytes"
    );
    assert_eq!(stat(&stats, "evictions"), 0, "{stats:?}");
    memcached.assert_running();
}

// ---------------------------------------------------------------------------------------
// 4. A full extstore stays within its volume

/// A filesystem mounted for one test (as root): tmpfs, or ext4 or XFS on a loop device of a
/// sparse image. Unmounted (and the loop device freed) when dropped.
struct Mounted {
    dir: PathBuf,
    what: String,
}

impl Mounted {
    /// Mounts `kind` of `bytes` under `dir`, or says why it cannot here and what provides it
    /// (the tests run as root, as CI runs them; `mkfs.xfs` is Debian's xfsprogs, which
    /// .ci/run installs).
    fn new(kind: &str, bytes: u64, dir: &TempDir) -> Result<Self, String> {
        if !is_root() {
            return Err(format!(
                "mounting {kind} for the extstore measurement needs root: run the tests as root, as CI does"
            ));
        }
        let mount = dir.path().join(format!("{kind}-mnt"));
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        let run = |program: &str, args: &[&str]| -> Result<(), String> {
            let out = Command::new(program)
                .args(args)
                .output()
                .map_err(|e| format!("{program}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{program} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let target = mount.display().to_string();
        if kind == "tmpfs" {
            run(
                "mount",
                &[
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={bytes}"),
                    "tmpfs",
                    &target,
                ],
            )?;
        } else {
            let image = dir.path().join(format!("{kind}.img"));
            let file = std::fs::File::create(&image).map_err(|e| e.to_string())?;
            file.set_len(bytes).map_err(|e| e.to_string())?;
            let image = image.display().to_string();
            match kind {
                // mkfs.ext4's defaults keep 5% for root: of what CSI drivers make (they
                // pass -m0), the least room for memcached, which is not root.
                "ext4" => run("mkfs.ext4", &["-q", "-F", &image])?,
                "xfs" => run("mkfs.xfs", &["-q", "-f", &image])
                    .map_err(|e| format!("{e} (mkfs.xfs: apt-get install xfsprogs)"))?,
                other => return Err(format!("no filesystem {other}")),
            }
            run("mount", &["-o", "loop", &image, &target])?;
        }
        chmod(&mount, 0o755);
        Ok(Self {
            dir: mount,
            what: format!("{kind} of {} MiB", bytes / MIB),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// Bytes the filesystem of `path` leaves to a user other than root.
fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path");
    // SAFETY: statvfs fills the zeroed struct it is given, for a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    st.f_bavail.saturating_mul(st.f_frsize)
}

/// Where the file has its first hole (its length if it has none): a write memcached lost
/// (it does not check pwrite's result) leaves the pages of it unallocated.
fn first_hole(file: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(file).expect("the extstore file");
    // SAFETY: lseek on a descriptor this function owns, with valid arguments.
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE) };
    u64::try_from(at).expect("SEEK_HOLE answers")
}

/// extstore as the tests below fill it: 2 MiB pages and buffers (memcached's smallest) and
/// the smallest cache, so a few passes over the file are quick.
fn small_extstore(size: &str, storage_class: Option<&str>, port: u16) -> Memcached {
    let mc = pool(MemcachedSpec {
        container_port: i32::from(port),
        config: Some(MemcachedConfig {
            memory_mib: 16,
            ..MemcachedConfig::default()
        }),
        extstore: Some(Box::new(ExtstoreSpec {
            size: size.into(),
            storage_class_name: storage_class.map(String::from),
            page_size_mib: 2,
            write_buffer_mib: 2,
            ..ExtstoreSpec::default()
        })),
        ..MemcachedSpec::with_size(1)
    });
    memcached_api::validation::validate(&mc).expect("a valid spec");
    mc
}

/// The extstore volume's size the builder sets: the `emptyDir`'s `sizeLimit`, or the
/// generic ephemeral volume's claim, in bytes (the builder writes whole MiB).
fn volume_size(pod: &PodSpec) -> u64 {
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "extstore")
        .expect("the extstore volume");
    let quantity = volume
        .empty_dir
        .as_ref()
        .and_then(|e| e.size_limit.clone())
        .or_else(|| {
            let claim = volume.ephemeral.as_ref()?.volume_claim_template.as_ref()?;
            claim
                .spec
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .cloned()
        })
        .expect("a size on the extstore volume");
    quantity
        .0
        .strip_suffix("Mi")
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("a size in whole MiB: {quantity:?}"))
        * MIB
}

/// Runs memcached with the builder's command for `mc`, its extstore file in `volume`, and
/// writes 16 KiB values until memcached's own stats say every page of the file has been
/// written and then recycled (page evictions and reclaims at least the page count), the
/// file at its full size. How fast does not matter: values the flusher did not keep up
/// with are evicted from memory, and writing goes on. Returns the most the volume held
/// (sampled after every batch, as the kubelet samples it), the file, and the last stats.
fn fill_extstore(
    mc: &Memcached,
    volume: &Path,
    dir: &TempDir,
) -> (u64, PathBuf, HashMap<String, String>) {
    const VALUE: usize = 16 * 1024;
    let port = u16::try_from(mc.spec.container_port).expect("a port");
    let mut args = memcached_command(&pod_spec(mc));
    std::fs::create_dir_all(volume).expect("the volume's directory");
    chmod(volume, 0o777);
    let file = volume.join("data");
    rewrite(&mut args, EXTSTORE_FILE, &file.display().to_string());
    // 1.6.38, not Debian's 1.6.18: that one never uses the first page of its file (it
    // leaves page 0 off its free list); 1.6.38 uses them all, as the default image's
    // 1.6.39 does.
    let mut memcached = start_memcached_binary(&recent_memcached(), &args, dir);
    wait_listening(port, &mut memcached);
    let mut client = plain(port);
    let mut peak = 0;
    let mut written = 0u64;
    for batch in 0.. {
        let items: Vec<(String, Vec<u8>)> = (0..64)
            .map(|j| {
                let i = batch * 64 + j;
                (format!("fill:{i}"), big_value(i, VALUE))
            })
            .collect();
        client.set_many(&items);
        written += (64 * VALUE) as u64;
        peak = peak.max(volume_bytes(volume));
        let stats = client.stats("");
        let pages = stat(&stats, "extstore_pages_free") + stat(&stats, "extstore_pages_used");
        let recycled =
            stat(&stats, "extstore_page_evictions") + stat(&stats, "extstore_page_reclaims");
        let full = std::fs::metadata(&file).map_or(0, |m| m.len())
            == stat(&stats, "extstore_limit_maxbytes");
        if full && recycled >= pages {
            memcached.assert_running();
            // The file reached its size since the sample above.
            return (peak.max(volume_bytes(volume)), file, stats);
        }
        // A filesystem too small for the file: memcached's writes past the free space
        // fail (it does not check them), and the file never reaches its size.
        let free = free_bytes(volume);
        assert!(
            full || free >= 2 * MIB,
            "the filesystem ran out of space before memcached's file was full: {} of {} bytes written, {free} bytes left for non-root",
            std::fs::metadata(&file).map_or(0, |m| m.len()),
            stat(&stats, "extstore_limit_maxbytes")
        );
        // Not a timing assertion: a bound on the work, far above the 2 to 4 passes over
        // the file this takes, so a memcached that never fills its file fails the test
        // instead of hanging it.
        assert!(
            written < 50 * stat(&stats, "extstore_limit_maxbytes"),
            "{} MiB written and extstore is still not full: {stats:?}",
            written / MIB
        );
    }
    unreachable!("the loop returns or fails")
}

/// A full extstore never crosses its `emptyDir`'s limit: memcached started with the
/// builder's exact command is written to until its own stats say the file is full and its
/// pages recycled, and what the volume held at any point (the kubelet's count: every
/// entry's blocks, the directory's too) stays within the `sizeLimit` the builder sets, so
/// the kubelet never evicts the pod for it. On the machine's temp dir, and as root on
/// fresh tmpfs, ext4 and XFS (whose preallocation past the end of a growing file is the
/// most a full file takes: 2 × size − 64 KiB here, a power of two).
#[test]
fn a_full_extstore_stays_within_its_empty_dir_limit() {
    let dir = TempDir::new("ext-full");
    let mut volumes = vec![("temp dir".to_string(), dir.path().join("extstore"), None)];
    for kind in ["tmpfs", "ext4", "xfs"] {
        let m = Mounted::new(kind, 512 * MIB, &dir).unwrap_or_else(|why| panic!("{why}"));
        volumes.push((m.what.clone(), m.dir.join("extstore"), Some(m)));
    }
    for (what, volume, _mounted) in &volumes {
        let mc = small_extstore("32Mi", None, free_port());
        let limit = volume_size(&pod_spec(&mc));
        let (peak, file, stats) = fill_extstore(&mc, volume, &dir);
        let size = std::fs::metadata(&file).expect("the file").len();
        eprintln!(
            "{what}: file {size} bytes, the volume held at most {peak} bytes ({:+} against the file), limit {limit}",
            i128::from(peak) - i128::from(size)
        );
        assert!(
            peak <= limit,
            "on {what} the full extstore took {peak} bytes, over the emptyDir's sizeLimit {limit}: the kubelet would evict the pod ({stats:?})"
        );
    }
}

/// A full extstore fits the filesystem its generic ephemeral volume claims: on ext4 (with
/// its default 5% kept for root, more than CSI drivers keep) and XFS made to exactly the
/// claim's size, memcached (not root) fills its file and recycles its pages, and the file
/// is whole: its full size, no page left unwritten by a write that found no space.
#[test]
fn a_full_extstore_fits_its_claim() {
    let dir = TempDir::new("ext-claim");
    // XFS is at least 300 MiB: a size whose claim is that large.
    for (kind, size) in [("ext4", "32Mi"), ("xfs", "256Mi")] {
        let mc = small_extstore(size, Some("standard"), free_port());
        let claim = volume_size(&pod_spec(&mc));
        let mounted = Mounted::new(kind, claim, &dir).unwrap_or_else(|why| panic!("{why}"));
        let (_, file, stats) = fill_extstore(&mc, &mounted.dir.join("extstore"), &dir);
        let len = std::fs::metadata(&file).expect("the file").len();
        let free = free_bytes(&mounted.dir);
        eprintln!(
            "{}: file {len} bytes, first hole at {}, {free} bytes left for non-root",
            mounted.what,
            first_hole(&file)
        );
        assert_eq!(
            len,
            stat(&stats, "extstore_limit_maxbytes"),
            "on {}",
            mounted.what
        );
        assert_eq!(
            first_hole(&file),
            len,
            "on {} memcached's writes found no space: part of the file was never written ({stats:?})",
            mounted.what
        );
    }
}

// ---------------------------------------------------------------------------------------
// 5. Every accepted extstore/rollout/TLS combination starts a real memcached

fn extstore_spec() -> impl Strategy<Value = ExtstoreSpec> {
    (
        prop_oneof![(1i32..=16).prop_map(|n| n * 2), 2i32..=256],
        prop_oneof![(1i32..=16).prop_map(Some), Just(None)],
        2i32..=1024,
        prop_oneof![1i32..=4, 1i32..=64],
        prop_oneof![1i32..=4096, 1i32..=4 * 1024 * 1024],
        proptest::option::of(prop_oneof![0i32..=3600, 0i32..=i32::MAX]),
        prop_oneof![
            (1u32..=64).prop_map(|n| format!("{}Mi", n * 64)),
            (1u32..=64).prop_map(|n| format!("{n}Gi")),
            (1u32..=4096).prop_map(|n| format!("{n}M")),
        ],
    )
        .prop_map(
            |(wbuf, pages_per_wbuf, raw_page, threads, item, age, size)| ExtstoreSpec {
                enabled: true,
                size,
                storage_class_name: None,
                page_size_mib: pages_per_wbuf.map_or(raw_page, |n| (wbuf * n).min(1024)),
                write_buffer_mib: wbuf,
                threads,
                item_size_bytes: item,
                item_age_seconds: age,
            },
        )
}

fn task_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever extstore settings, item size, memory, rollout and TLS rotation the
    /// validation accepts, the builder's command starts memcached with those settings:
    /// `stats settings` reports the item size, write buffer and item age, `stats` the file's
    /// size in whole pages, the process runs the extstore IO threads, and TLS is on when
    /// asked for (in place: TLS on the port and a plain loopback listener).
    #[test]
    fn every_accepted_extstore_combination_starts_a_real_memcached(
        ext in extstore_spec(),
        memory_mib in 8i32..=256,
        max_item_size in prop_oneof![
            Just("1m".to_string()),
            (1u32..=16).prop_map(|n| format!("{}k", n * 256)),
            (1u32..=8).prop_map(|n| format!("{n}m")),
        ],
        min_ready in proptest::option::of(0i32..=3600),
        tls_rotation in prop_oneof![
            Just(None),
            Just(Some(TlsRotation::InPlace)),
            Just(Some(TlsRotation::Restart)),
        ],
    ) {
        let port = free_port();
        let config = MemcachedConfig {
            memory_mib,
            max_item_size: max_item_size.clone(),
            ..MemcachedConfig::default()
        };
        let mc = pool(MemcachedSpec {
            container_port: i32::from(port),
            config: Some(config),
            extstore: Some(Box::new(ext.clone())),
            rollout: min_ready.map(|s| RolloutSpec { min_ready_seconds: s, ..Default::default() }),
            tls: tls_rotation.map(|r| TlsSpec { secret_name: "certs".into(), rotation: Some(r), client_auth: None }),
            ..MemcachedSpec::with_size(1)
        });
        prop_assume!(memcached_api::validation::validate(&mc).is_ok());

        let dir = TempDir::new("prop");
        let mut args = memcached_command(&pod_spec(&mc));
        let file = dir.writable_subdir("extstore").join("data");
        rewrite(&mut args, EXTSTORE_FILE, &file.display().to_string());
        let admin = free_port();
        if tls_rotation.is_some() {
            let cert = self_signed("prop.example");
            let certs = dir.path().join("certs");
            SecretVolume::new(certs.clone()).install(&cert, &cert);
            rewrite(&mut args, TLS_DIR, &certs.display().to_string());
        }
        if tls_rotation == Some(TlsRotation::InPlace) {
            rewrite(
                &mut args,
                &format!("*:{port},notls:127.0.0.1:{}", memcached_api::TLS_ADMIN_PORT),
                &format!("127.0.0.1:{port},notls:127.0.0.1:{admin}"),
            );
        }
        let mut memcached = start_memcached(&args, &dir);
        wait_listening(port, &mut memcached);

        let (settings, stats) = match tls_rotation {
            None => {
                let mut c = plain(port);
                (c.stats("settings"), c.stats(""))
            }
            Some(TlsRotation::InPlace) => {
                wait_listening(admin, &mut memcached);
                let mut c = plain(admin);
                let settings = c.stats("settings");
                // The port itself speaks TLS.
                let (mut t, _) = tls(port).expect("TLS on the port");
                prop_assert_eq!(t.stats("settings").get("tcpport").cloned(), Some(port.to_string()));
                (settings, c.stats(""))
            }
            Some(TlsRotation::Restart) => {
                let (mut c, _) = tls(port).expect("TLS on the port");
                (c.stats("settings"), c.stats(""))
            }
        };
        let ssl = if tls_rotation.is_some() { "yes" } else { "no" };
        prop_assert_eq!(settings.get("ssl_enabled").map(String::as_str), Some(ssl), "{:?}", args);
        prop_assert_eq!(
            settings.get("maxbytes").cloned(),
            Some((u64::try_from(memory_mib).expect("positive") * MIB).to_string())
        );
        let item_max = memcached_api::validation::parse_item_size(&max_item_size).expect("accepted");
        prop_assert_eq!(settings.get("item_size_max").cloned(), Some(item_max.to_string()));
        prop_assert_eq!(settings.get("ext_item_size").cloned(), Some(ext.item_size_bytes.to_string()), "{:?}", args);
        prop_assert_eq!(
            settings.get("ext_wbuf_size").cloned(),
            Some((u64::try_from(ext.write_buffer_mib).expect("positive") * MIB).to_string())
        );
        // Unset: memcached's "no age limit", UINT_MAX.
        let age = ext.item_age_seconds.map_or(u64::from(u32::MAX), |a| u64::try_from(a).expect("positive"));
        prop_assert_eq!(settings.get("ext_item_age").cloned(), Some(age.to_string()), "{:?}", args);
        // The file: as many whole pages of ext_page_size as the size holds (memcached
        // rounds a size that is not a whole number of pages down).
        let page = u64::try_from(ext.page_size_mib).expect("positive") * MIB;
        // The size in bytes, read here from the three forms the strategy makes (not with
        // the operator's own parser, which is under test).
        let size: u64 = {
            let (number, unit) = ext.size.split_at(ext.size.trim_end_matches(char::is_alphabetic).len());
            let n: u64 = number.parse().expect("a number");
            match unit {
                "Mi" => n << 20,
                "Gi" => n << 30,
                "M" => n * 1_000_000,
                other => panic!("a size the strategy does not make: {other}"),
            }
        };
        let pages = (size >> 20) * MIB / page;
        prop_assert_eq!(stat(&stats, "extstore_limit_maxbytes"), pages * page, "{:?}", args);
        prop_assert_eq!(
            stat(&stats, "extstore_pages_free") + stat(&stats, "extstore_pages_used"),
            pages
        );
        // ext_threads is in no stats: its IO threads are in the process.
        let threads = usize::try_from(ext.threads + MemcachedConfig::default().threads).expect("positive");
        let tasks = task_count(memcached.child.id());
        prop_assert!(tasks >= threads, "{} threads, expected at least {}", tasks, threads);
        memcached.assert_running();
    }
}

/// The pod's agent command (`/memcached-tls-agent FLAGS`, the agent's own image) run as
/// the same agent in the operator's binary (`memcached-operator tls-reload-agent FLAGS`):
/// a test of this package can run only its own binaries; crates/tls-agent's tests run the
/// agent's.
fn agent_command(pod_command: &[String]) -> Vec<String> {
    assert_eq!(
        pod_command.first().map(String::as_str),
        Some(memcached_operator::builders::TLS_AGENT_BINARY),
        "the pod runs the agent's own binary"
    );
    std::iter::once("tls-reload-agent".to_string())
        .chain(pod_command[1..].iter().cloned())
        .collect()
}
