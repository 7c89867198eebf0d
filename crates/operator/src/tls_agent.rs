//! The TLS reload agent (`memcached-operator tls-reload-agent`): a native sidecar in each
//! memcached pod whose certificate is reloaded in place. It watches the mounted certificate
//! files and, when their contents change (the kubelet swaps a Secret volume's files
//! atomically), sends `refresh_certs` to memcached's loopback-only non-TLS listener, so
//! memcached serves the new certificate on the next handshake and keeps its cache.
//!
//! A reload memcached refuses is written to the termination log and the agent exits with
//! [`TLS_AGENT_RELOAD_FAILED`]: the kubelet keeps that reason in the container's last state,
//! where the reconciler reads it, reports the pod and restarts it. Plain threads and
//! blocking sockets: the agent does one thing every few seconds and should cost no more
//! than a few MiB.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::builders::{TLS_AGENT_RELOAD_FAILED, TLS_DIR};

/// The files of a `kubernetes.io/tls` Secret memcached reads (`ca.crt` when present).
pub const CERT_FILES: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

/// The agent's command line.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentArgs {
    /// Directory of the mounted TLS Secret.
    #[arg(long, default_value = TLS_DIR)]
    pub cert_dir: PathBuf,
    /// memcached's non-TLS listener (loopback only) that takes `refresh_certs`.
    #[arg(long, default_value = "127.0.0.1:11299")]
    pub admin_address: String,
    /// How often the files are read, e.g. `2s`.
    #[arg(long, default_value = "2s", value_parser = crate::cmd::parse_duration)]
    pub interval: Duration,
    /// Attempts at a reload memcached does not answer `OK` before the pod is reported.
    #[arg(long, default_value_t = 3)]
    pub attempts: u32,
    /// Where the reason of a failed reload is written (the container's
    /// `terminationMessagePath`).
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

/// Why a reload did not happen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReloadError {
    /// Nothing listens: memcached is not running (it reads the files when it starts).
    #[error("memcached is not listening on {0}")]
    NotListening(String),
    /// memcached answered something other than `OK` (its reason, e.g. a key that does not
    /// match the certificate).
    #[error("memcached refused the certificate: {0}")]
    Refused(String),
    /// The connection failed or timed out mid-way.
    #[error("talking to memcached at {address}: {reason}")]
    Io { address: String, reason: String },
}

/// A digest of the certificate files' contents in `dir` (a missing `ca.crt` counts as
/// empty); `None` while `tls.crt` or `tls.key` cannot be read.
pub fn digest(dir: &Path) -> Option<String> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for name in CERT_FILES {
        let bytes = match std::fs::read(dir.join(name)) {
            Ok(bytes) => bytes,
            Err(_) if name == "ca.crt" => Vec::new(),
            Err(_) => return None,
        };
        ctx.update(&(bytes.len() as u64).to_le_bytes());
        ctx.update(&bytes);
    }
    Some(
        ctx.finish().as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

fn resolve(address: &str) -> Result<SocketAddr, ReloadError> {
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ReloadError::Io {
            address: address.to_string(),
            reason: "not an address".into(),
        })
}

/// Whether `tls.key` provably does not belong to the certificate in `tls.crt` (their
/// public keys differ). memcached (OpenSSL 3) installs a new chain before it checks the
/// key, so a mismatched pair sent to it leaves every new handshake failing until a good
/// reload or a restart (measured with Debian's 1.6.18): such a pair is never sent. What
/// rustls cannot read (a key type ring does not support) is left to memcached to judge.
pub fn key_mismatch(dir: &Path) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert_pem = std::fs::read(dir.join("tls.crt")).ok()?;
    let key_pem = std::fs::read(dir.join("tls.key")).ok()?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).ok()?;
    let provider = rustls::crypto::ring::default_provider();
    let signing_key = provider.key_provider.load_private_key(key).ok()?;
    match rustls::sign::CertifiedKey::new(certs, signing_key).keys_match() {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Some(
            "tls.key does not match the certificate in tls.crt (not sent to memcached, which keeps serving the certificate it has)".into(),
        ),
        _ => None,
    }
}

/// Sends `refresh_certs` to memcached at `address` and reads its answer.
pub fn reload(address: &str, timeout: Duration) -> Result<(), ReloadError> {
    let addr = resolve(address)?;
    let io = |e: std::io::Error| ReloadError::Io {
        address: address.to_string(),
        reason: e.to_string(),
    };
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(ReloadError::NotListening(address.to_string()));
        }
        Err(e) => return Err(io(e)),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream.write_all(b"refresh_certs\r\n").map_err(io)?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).map_err(io)?;
    let answer = line.trim_end();
    match answer {
        "OK" => Ok(()),
        "" => Err(ReloadError::Io {
            address: address.to_string(),
            reason: "memcached closed the connection without an answer".into(),
        }),
        other => Err(ReloadError::Refused(other.to_string())),
    }
}

/// What one look at the files led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The files are as last loaded (or unreadable for now).
    Unchanged,
    /// memcached loaded the files.
    Reloaded,
    /// memcached is not running; it loads the files when it starts.
    NotRunning,
    /// memcached refused the files every time: the reason.
    Failed(String),
}

/// The agent's state: the digest of the files memcached last loaded.
pub struct Agent {
    args: AgentArgs,
    loaded: Option<String>,
}

impl Agent {
    /// An agent that has loaded nothing yet: its first [`Agent::step`] reloads, so a
    /// renewal that happened while the agent was restarting is not missed.
    pub fn new(args: AgentArgs) -> Self {
        Self { args, loaded: None }
    }

    /// Reads the files and reloads memcached if they changed since the last reload.
    pub fn step(&mut self) -> Step {
        let Some(current) = digest(&self.args.cert_dir) else {
            return Step::Unchanged;
        };
        if self.loaded.as_deref() == Some(current.as_str()) {
            return Step::Unchanged;
        }
        if let Some(reason) = key_mismatch(&self.args.cert_dir) {
            return Step::Failed(reason);
        }
        let timeout = Duration::from_secs(5);
        let mut last = String::new();
        for attempt in 1..=self.args.attempts.max(1) {
            match reload(&self.args.admin_address, timeout) {
                Ok(()) => {
                    self.loaded = Some(current);
                    return Step::Reloaded;
                }
                Err(ReloadError::NotListening(_)) => return Step::NotRunning,
                Err(e) => last = e.to_string(),
            }
            if attempt < self.args.attempts {
                std::thread::sleep(self.args.interval);
            }
        }
        Step::Failed(last)
    }
}

/// Runs the agent until memcached refuses a certificate (exit code
/// [`TLS_AGENT_RELOAD_FAILED`], the reason in the termination log).
pub fn run(args: AgentArgs) -> ExitCode {
    let interval = args.interval;
    let dir = args.cert_dir.display().to_string();
    let termination_log = args.termination_log.clone();
    let mut agent = Agent::new(args);
    println!("tls-reload-agent: watching {dir}");
    loop {
        match agent.step() {
            Step::Unchanged | Step::NotRunning => {}
            Step::Reloaded => {
                println!("tls-reload-agent: memcached loaded the certificate in {dir}")
            }
            Step::Failed(reason) => {
                let message =
                    format!("memcached could not load the certificate in {dir}: {reason}");
                eprintln!("tls-reload-agent: {message}");
                if let Err(e) = std::fs::write(&termination_log, &message) {
                    eprintln!(
                        "tls-reload-agent: cannot write {}: {e}",
                        termination_log.display()
                    );
                }
                return ExitCode::from(TLS_AGENT_RELOAD_FAILED as u8);
            }
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers every connection's first line with `answer`, counting them.
    fn fake_memcached(answer: &'static str) -> (String, std::sync::mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut line = String::new();
                if BufReader::new(&stream).read_line(&mut line).is_ok() {
                    let _ = tx.send(line.trim_end().to_string());
                    let _ = (&stream).write_all(answer.as_bytes());
                }
            }
        });
        (address, rx)
    }

    fn args(dir: &Path, address: String) -> AgentArgs {
        AgentArgs {
            cert_dir: dir.to_path_buf(),
            admin_address: address,
            interval: Duration::from_millis(10),
            attempts: 2,
            termination_log: dir.join("termination-log"),
        }
    }

    fn cert_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tls-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("tls.crt"), "cert 1").expect("write");
        std::fs::write(dir.join("tls.key"), "key 1").expect("write");
        dir
    }

    #[test]
    fn a_changed_certificate_is_reloaded_once() {
        let dir = cert_dir("changed");
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address));
        assert_eq!(agent.step(), Step::Reloaded, "the first look reloads");
        assert_eq!(agent.step(), Step::Unchanged);
        std::fs::write(dir.join("tls.crt"), "cert 2").expect("write");
        assert_eq!(agent.step(), Step::Reloaded);
        assert_eq!(agent.step(), Step::Unchanged);
        let lines: Vec<String> = sent.try_iter().collect();
        assert_eq!(lines, ["refresh_certs", "refresh_certs"]);
    }

    #[test]
    fn a_refused_certificate_fails_with_memcacheds_reason() {
        let dir = cert_dir("refused");
        let (address, sent) =
            fake_memcached("Error loading the certificate chain: no start line\r\n");
        let mut agent = Agent::new(args(&dir, address));
        match agent.step() {
            Step::Failed(reason) => assert!(reason.contains("no start line"), "{reason}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(sent.try_iter().count(), 2, "every attempt is made");
    }

    #[test]
    fn memcached_not_running_is_not_a_failure() {
        let dir = cert_dir("down");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut agent = Agent::new(args(&dir, format!("127.0.0.1:{port}")));
        assert_eq!(agent.step(), Step::NotRunning);
    }

    /// A key of another certificate is caught before memcached sees it.
    #[test]
    fn a_key_of_another_certificate_is_never_sent() {
        let dir = cert_dir("mismatch");
        let one = rcgen::generate_simple_self_signed(vec!["one.example".into()]).expect("cert");
        let two = rcgen::generate_simple_self_signed(vec!["two.example".into()]).expect("cert");
        std::fs::write(dir.join("tls.crt"), one.cert.pem()).expect("write");
        std::fs::write(dir.join("tls.key"), two.signing_key.serialize_pem()).expect("write");
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address));
        match agent.step() {
            Step::Failed(reason) => assert!(reason.contains("does not match"), "{reason}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(sent.try_iter().count(), 0, "nothing sent to memcached");
        // The matching key: reloaded.
        std::fs::write(dir.join("tls.key"), one.signing_key.serialize_pem()).expect("write");
        assert_eq!(agent.step(), Step::Reloaded);
    }

    #[test]
    fn missing_key_means_no_reload_yet() {
        let dir = cert_dir("partial");
        std::fs::remove_file(dir.join("tls.key")).expect("remove");
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address));
        assert_eq!(agent.step(), Step::Unchanged);
        assert_eq!(sent.try_iter().count(), 0);
    }
}
