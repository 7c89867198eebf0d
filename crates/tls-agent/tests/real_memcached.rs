//! The `memcached-tls-agent` binary against a real memcached (Debian's package; `.ci/run`
//! installs it): one certificate renewal, loaded in place without losing an item. The
//! operator's `tests/real_memcached_warm.rs` covers the rest with the pod spec's commands.
//! Without a `memcached` binary the test fails, naming the package that provides it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};

/// Debian's `memcached` on the PATH (or in /usr/bin, /usr/local/bin).
fn memcached_binary() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
        .map(|dir| format!("{dir}/memcached"))
        .find(|path| Path::new(path).is_file())
        .unwrap_or_else(|| {
            panic!("memcached is not installed: apt-get install memcached (.ci/run does)")
        })
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// World-readable, so memcached running as `nobody` (in a root test run) reads the files.
fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed when dropped; its output goes to `log`.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn start(program: &str, args: &[String], log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{program} starts: {e}"));
        Self { child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("exited ({status}): {}", self.output());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A certificate and its key, in PEM, and the certificate's DER.
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

/// Writes the pair as the kubelet updates a Secret volume: into a new directory, then
/// `..data` renamed over to point at it, so a reader never sees a new certificate with an
/// old key.
fn install(dir: &Path, generation: u32, cert: &Cert) {
    let data = format!("..gen_{generation}");
    std::fs::create_dir(dir.join(&data)).expect("data dir");
    chmod(&dir.join(&data), 0o755);
    for (name, contents) in [("tls.crt", &cert.pem), ("tls.key", &cert.key_pem)] {
        let path = dir.join(&data).join(name);
        std::fs::write(&path, contents).expect("write");
        chmod(&path, 0o644);
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(name), &link).expect("symlink");
        }
    }
    symlink(&data, dir.join("..data_tmp")).expect("symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
}

/// Accepts any server certificate (the test compares the one presented with the ones it
/// wrote), but checks the handshake's signature, so the server proved it holds the key.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The DER of the certificate a new TLS handshake with memcached on `port` presents.
fn presented(port: u16) -> Result<Vec<u8>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from("memcached.test").map_err(|e| e.to_string())?;
    let mut conn = ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut sock = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).map_err(|e| e.to_string())?;
    }
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or_else(|| "no certificate presented".into())
}

/// One text-protocol request on the plain loopback listener: the answer's lines, up to
/// `END`, `STORED` or an error.
fn ask(port: u16, request: &str) -> Vec<String> {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    (&stream).write_all(request.as_bytes()).expect("send");
    let mut lines = Vec::new();
    for line in BufReader::new(&stream).lines() {
        let line = line.expect("read");
        let last = line == "END" || line == "STORED" || line.contains("ERROR");
        lines.push(line);
        if last {
            return lines;
        }
    }
    panic!("memcached closed the connection: {lines:?}");
}

/// Polls (at most 15 s) until `ready` holds, failing with `what` and `agent`'s output.
fn wait(what: &str, agent: &mut Running, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ready() {
        agent.assert_running();
        assert!(
            Instant::now() < deadline,
            "{what} within 15 s; agent: {}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_renewed_certificate_is_loaded_in_place_and_the_cache_stays() {
    let memcached_bin = memcached_binary();
    let dir = TempDir(std::env::temp_dir().join(format!("tls-agent-real-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let certs = dir.0.join("certs");
    let state = dir.0.join("state");
    for d in [&dir.0, &certs, &state] {
        std::fs::create_dir_all(d).expect("dir");
        chmod(d, 0o755);
    }
    let (first, second) = (self_signed("first.example"), self_signed("second.example"));
    install(&certs, 1, &first);

    // As the operator's builders start memcached with in-place rotation: TLS on the port, a
    // plain listener on loopback for the agent.
    let (port, admin) = (free_port(), free_port());
    let certs_str = certs.display().to_string();
    let mut args: Vec<String> = [
        "-p".to_string(),
        port.to_string(),
        "-Z".into(),
        "-o".into(),
        format!("ssl_chain_cert={certs_str}/tls.crt,ssl_key={certs_str}/tls.key"),
        "-l".into(),
        format!("127.0.0.1:{port},notls:127.0.0.1:{admin}"),
    ]
    .into();
    if is_root() {
        args.extend(["-u".into(), "nobody".into()]);
    }
    let mut memcached = Running::start(&memcached_bin, &args, dir.0.join("memcached.log"));
    let termination_log = dir.0.join("termination-log");
    let mut agent = Running::start(
        env!("CARGO_BIN_EXE_memcached-tls-agent"),
        &[
            format!("--cert-dir={certs_str}"),
            format!("--admin-address=127.0.0.1:{admin}"),
            format!("--state-dir={}", state.display()),
            format!("--termination-log={}", termination_log.display()),
            "--interval=200ms".into(),
        ],
        dir.0.join("agent.log"),
    );

    wait(
        "memcached presented the first certificate",
        &mut agent,
        || {
            memcached.assert_running();
            presented(port).is_ok_and(|der| der == first.der)
        },
    );
    assert_eq!(ask(admin, "set warm 0 0 5\r\nvalue\r\n"), ["STORED"]);

    install(&certs, 2, &second);
    wait(
        "memcached presented the renewed certificate",
        &mut agent,
        || {
            memcached.assert_running();
            presented(port).is_ok_and(|der| der == second.der)
        },
    );
    assert_eq!(
        ask(admin, "get warm\r\n"),
        ["VALUE warm 0 5", "value", "END"],
        "the same memcached, its cache kept"
    );
    memcached.assert_running();
    agent.assert_running();
    assert!(
        agent.output().contains("memcached loaded the certificate"),
        "{}",
        agent.output()
    );
    assert!(!termination_log.exists(), "nothing reported");
}
