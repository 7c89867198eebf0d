//! The TLS reload agent and its contract with the operator: the agent's command line, its
//! exit codes, state directory and certificate file names, and the digest of the files that
//! the operator's reconciler must compute the same way.
//!
//! The agent is a native sidecar in each memcached pod whose certificate is reloaded in
//! place. It watches the mounted certificate files and, when their contents change (the
//! kubelet swaps a Secret volume's files atomically), sends `refresh_certs` to memcached's
//! loopback-only non-TLS listener, so memcached serves the new certificate on the next
//! handshake and keeps its cache. It runs as `memcached-operator tls-reload-agent` (the
//! operator's binary delegates to [`run`]) and as this crate's own `memcached-tls-agent`.
//!
//! What it cannot load is reported through the kubelet: the reason goes to the termination
//! log and the agent exits, with [`EXIT_RELOAD_FAILED`] when memcached refused the files
//! (its TLS may be broken: the pod is restarted) or [`EXIT_CERTIFICATE_INVALID`] when
//! the agent refused them itself and memcached never saw them (it keeps serving the old
//! certificate: the pod is left running). The kubelet keeps the exit code and reason as the
//! container's last state, where the reconciler reads them. The digest of the reported
//! files is kept in a state file, so the restarted agent waits for new files instead of
//! failing again (a crash-looping sidecar would make its pod NotReady); once it loads new
//! files after a failure it exits 0, so the last state the kubelet keeps is no longer a
//! failure. Plain threads and blocking sockets: the agent does one thing every few seconds
//! and costs a few MiB.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The agent's version (this crate's own, not the workspace's): the tag of its image, which
/// config/, the Helm chart and the OLM bundle name (crates/gen).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Exit code of the agent when memcached refused to load the renewed certificate (its TLS
/// may be broken); the reconciler reads it from the container's last termination, reports
/// the pod, then restarts it.
pub const EXIT_RELOAD_FAILED: i32 = 3;
/// Exit code of the agent when it refused the files itself (not a certificate, a key of
/// another certificate) and never sent them: memcached keeps serving the certificate it
/// has, so the pod is reported and left running (a restart would not start with them).
pub const EXIT_CERTIFICATE_INVALID: i32 = 4;
/// Where the TLS Secret is mounted in the memcached container and the agent.
pub const CERT_DIR: &str = "/etc/memcached/tls";
/// The agent's state directory (an `emptyDir` that outlives its restarts).
pub const STATE_DIR: &str = "/var/run/tls-reload-agent";
/// memcached's loopback-only non-TLS listener when no `--admin-address` is given. The
/// operator always passes it, built from the port the Memcached API reserves
/// (`memcached_api::TLS_ADMIN_PORT`; a test in the operator checks they agree).
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:11299";

/// The files of a `kubernetes.io/tls` Secret memcached reads (`ca.crt` when present).
pub const CERT_FILES: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

/// A digest of the keys of a Secret that memcached reads (in the order given): the same
/// contents give the same digest, whatever else changed in the Secret (labels,
/// annotations, its `resourceVersion`). The reconciler digests the TLS Secret's keys with
/// it and the agent the mounted files, so both name one version of the files alike; it is
/// also part of the pod template's hash, so its output must never change.
pub fn secret_digest<'a>(data: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for (key, value) in data {
        for bytes in [key.as_bytes(), value] {
            ctx.update(&(bytes.len() as u64).to_le_bytes());
            ctx.update(bytes);
        }
    }
    ctx.finish().as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Parses `500ms`, `2s`, `1.5s`, `5m`, `1h`: the Go-style durations the operator's flags
/// take too (its `cmd::parse_duration` is this one), so `--interval` reads like them.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => return Err(format!("{s:?} has no unit (use ms, s, m or h)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 2s, 5m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{s:?}: {e}"))
}

/// The agent's command line.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentArgs {
    /// Directory of the mounted TLS Secret.
    #[arg(long, default_value = CERT_DIR)]
    pub cert_dir: PathBuf,
    /// memcached's non-TLS listener (loopback only) that takes `refresh_certs`.
    #[arg(long, default_value = DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: String,
    /// How often the files are read, e.g. `2s`.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Answers of memcached refusing the files before they are reported.
    #[arg(long, default_value_t = 3)]
    pub attempts: u32,
    /// Where the reason of a failed reload is written (the container's
    /// `terminationMessagePath`).
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
    /// Directory that outlives the agent's restarts (an `emptyDir`): the digest of the
    /// files last reported is kept there.
    #[arg(long, default_value = STATE_DIR)]
    pub state_dir: PathBuf,
}

/// Why a reload did not happen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReloadError {
    /// Nothing listens: memcached is not running (it reads the files when it starts).
    #[error("memcached is not listening on {0}")]
    NotListening(String),
    /// memcached refused the files (`Error loading the key: ...`).
    #[error("memcached refused the certificate: {0}")]
    Refused(String),
    /// Anything else (a connection limit reached, `ERROR Too many open connections`, a
    /// timeout): worth another try later, never a reason to restart the pod.
    #[error("talking to memcached at {address}: {reason}")]
    Transient { address: String, reason: String },
}

/// The certificate files as read at one moment.
#[derive(Debug, PartialEq, Eq)]
pub struct Files {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

impl Files {
    /// Reads the files of `dir` from one version of a Secret volume: through its `..data`
    /// link, resolved once, so a swap between two reads cannot pair an old certificate with
    /// a new key. `None` while `tls.crt` or `tls.key` cannot be read.
    pub fn read(dir: &Path) -> Option<Self> {
        let data = std::fs::canonicalize(dir.join("..data")).unwrap_or_else(|_| dir.to_path_buf());
        let read = |name: &str| std::fs::read(data.join(name));
        Some(Self {
            cert: read("tls.crt").ok()?,
            key: read("tls.key").ok()?,
            ca: read("ca.crt").unwrap_or_default(),
        })
    }

    /// A digest of the contents, as the reconciler digests a Secret's keys.
    pub fn digest(&self) -> String {
        secret_digest([
            ("tls.crt", self.cert.as_slice()),
            ("tls.key", self.key.as_slice()),
            ("ca.crt", self.ca.as_slice()),
        ])
    }

    /// Why memcached must not be sent these files, if it must not: a certificate or key
    /// that does not parse, or a key that provably belongs to another certificate. memcached
    /// (1.6.18, OpenSSL 3) installs a new chain before it checks the key, so such a pair
    /// leaves every new handshake failing until a good reload or a restart. A key rustls
    /// parses but ring cannot use (a type it does not support) is left to memcached.
    pub fn problem(&self) -> Option<String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = match CertificateDer::pem_slice_iter(&self.cert).collect::<Result<Vec<_>, _>>()
        {
            Ok(certs) if certs.is_empty() => {
                return Some("tls.crt holds no PEM certificate".into());
            }
            Ok(certs) => certs,
            Err(e) => return Some(format!("tls.crt is not a PEM certificate: {e}")),
        };
        let key = match PrivateKeyDer::from_pem_slice(&self.key) {
            Ok(key) => key,
            Err(e) => {
                return Some(format!(
                    "tls.key is not an unencrypted PEM private key: {e}"
                ));
            }
        };
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider.key_provider.load_private_key(key).ok()?;
        match rustls::sign::CertifiedKey::new(certs, signing_key).keys_match() {
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                Some("tls.key does not match the certificate in tls.crt".into())
            }
            _ => None,
        }
    }
}

fn resolve(address: &str) -> Result<SocketAddr, ReloadError> {
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ReloadError::Transient {
            address: address.to_string(),
            reason: "not an address".into(),
        })
}

/// Sends `refresh_certs` to memcached at `address` and reads its answer.
pub fn reload(address: &str, timeout: Duration) -> Result<(), ReloadError> {
    let addr = resolve(address)?;
    let transient = |reason: String| ReloadError::Transient {
        address: address.to_string(),
        reason,
    };
    let io = |e: std::io::Error| transient(e.to_string());
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
    // memcached's refusals of the files are `Error loading ...` / `Error validating ...`
    // (proto_text.c); its generic `ERROR ...` (too many connections) is not about them.
    if answer == "OK" {
        Ok(())
    } else if answer.starts_with("Error ") {
        Err(ReloadError::Refused(answer.to_string()))
    } else if answer.is_empty() {
        Err(transient(
            "memcached closed the connection without an answer".into(),
        ))
    } else {
        Err(transient(answer.to_string()))
    }
}

/// What one look at the files led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The files are as last loaded, or as last reported, or unreadable for now.
    Unchanged,
    /// memcached loaded the files.
    Reloaded,
    /// memcached loaded new files after a failure was reported: exit 0, so the kubelet's
    /// record of the agent's last run is no longer the failure.
    Recovered,
    /// memcached is not running (it loads the files when it starts), or did not answer
    /// this time: looked at again at the next interval.
    Waiting(String),
    /// The files cannot be loaded: the exit code and the reason.
    Failed(i32, String),
}

/// The agent's state: the digest of the files memcached last loaded, and of the files last
/// reported (kept across restarts in the state directory).
pub struct Agent {
    args: AgentArgs,
    loaded: Option<String>,
    reported: Option<String>,
    refusals: u32,
}

const REPORTED_FILE: &str = "reported";

impl Agent {
    /// An agent that has loaded nothing yet: its first [`Agent::step`] reloads, so a
    /// renewal that happened while the agent was restarting is not missed, unless the files
    /// are those it reported before its restart.
    pub fn new(args: AgentArgs) -> Self {
        let reported = std::fs::read_to_string(args.state_dir.join(REPORTED_FILE))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        Self {
            args,
            loaded: None,
            reported,
            refusals: 0,
        }
    }

    fn report(&mut self, digest: String, code: i32, reason: String) -> Step {
        if let Err(e) = std::fs::write(self.args.state_dir.join(REPORTED_FILE), &digest) {
            eprintln!(
                "tls-reload-agent: cannot write {}: {e}",
                self.args.state_dir.display()
            );
        }
        self.reported = Some(digest);
        self.refusals = 0;
        Step::Failed(code, reason)
    }

    /// Reads the files and reloads memcached if they changed since the last reload.
    pub fn step(&mut self) -> Step {
        let Some(files) = Files::read(&self.args.cert_dir) else {
            return Step::Unchanged;
        };
        let current = files.digest();
        if self.loaded.as_deref() == Some(current.as_str())
            || self.reported.as_deref() == Some(current.as_str())
        {
            return Step::Unchanged;
        }
        if let Some(problem) = files.problem() {
            let reason =
                format!("{problem} (not sent to memcached, which keeps the certificate it has)");
            return self.report(current, EXIT_CERTIFICATE_INVALID, reason);
        }
        match reload(&self.args.admin_address, Duration::from_secs(5)) {
            Ok(()) => {
                self.loaded = Some(current);
                self.refusals = 0;
                if self.reported.take().is_some() {
                    let _ = std::fs::remove_file(self.args.state_dir.join(REPORTED_FILE));
                    Step::Recovered
                } else {
                    Step::Reloaded
                }
            }
            Err(ReloadError::Refused(answer)) => {
                self.refusals += 1;
                if self.refusals >= self.args.attempts.max(1) {
                    let reason = format!("memcached refused the certificate: {answer}");
                    self.report(current, EXIT_RELOAD_FAILED, reason)
                } else {
                    Step::Waiting(answer)
                }
            }
            Err(e) => Step::Waiting(e.to_string()),
        }
    }
}

/// Runs the agent until it must report (its exit code and reason in the termination log)
/// or has recovered from a reported failure (exit 0).
pub fn run(args: AgentArgs) -> ExitCode {
    let interval = args.interval;
    let dir = args.cert_dir.display().to_string();
    let termination_log = args.termination_log.clone();
    let mut agent = Agent::new(args);
    println!("tls-reload-agent: watching {dir}");
    // A reason to wait is logged when it changes, not at every look.
    let mut waiting = String::new();
    loop {
        match agent.step() {
            Step::Unchanged => {}
            Step::Waiting(why) if why == waiting => {}
            Step::Waiting(why) => {
                println!("tls-reload-agent: will look again: {why}");
                waiting = why;
            }
            Step::Reloaded => {
                println!("tls-reload-agent: memcached loaded the certificate in {dir}")
            }
            Step::Recovered => {
                println!(
                    "tls-reload-agent: memcached loaded the certificate in {dir}; exiting so the failure reported before is cleared"
                );
                return ExitCode::SUCCESS;
            }
            Step::Failed(code, reason) => {
                let message =
                    format!("memcached could not load the certificate in {dir}: {reason}");
                eprintln!("tls-reload-agent: {message}");
                if let Err(e) = std::fs::write(&termination_log, &message) {
                    eprintln!(
                        "tls-reload-agent: cannot write {}: {e}",
                        termination_log.display()
                    );
                }
                return ExitCode::from(u8::try_from(code).unwrap_or(1));
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
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&state_dir).expect("state dir");
        AgentArgs {
            cert_dir: dir.join("certs"),
            admin_address: address,
            interval: Duration::from_millis(10),
            attempts: 2,
            termination_log: dir.join("termination-log"),
            state_dir,
        }
    }

    struct Pair {
        cert: String,
        key: String,
    }

    fn pair(name: &str) -> Pair {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("cert");
        Pair {
            cert: c.cert.pem(),
            key: c.signing_key.serialize_pem(),
        }
    }

    fn write(dir: &Path, cert: &str, key: &str) {
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("dir");
        std::fs::write(certs.join("tls.crt"), cert).expect("write");
        std::fs::write(certs.join("tls.key"), key).expect("write");
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tls-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_changed_certificate_is_reloaded_once() {
        let dir = temp("changed");
        let (one, two) = (pair("one.example"), pair("two.example"));
        write(&dir, &one.cert, &one.key);
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address));
        assert_eq!(agent.step(), Step::Reloaded, "the first look reloads");
        assert_eq!(agent.step(), Step::Unchanged);
        write(&dir, &two.cert, &two.key);
        assert_eq!(agent.step(), Step::Reloaded);
        assert_eq!(agent.step(), Step::Unchanged);
        let lines: Vec<String> = sent.try_iter().collect();
        assert_eq!(lines, ["refresh_certs", "refresh_certs"]);
    }

    #[test]
    fn a_refused_certificate_fails_with_memcacheds_reason_and_is_not_retried_after_a_restart() {
        let dir = temp("refused");
        let one = pair("one.example");
        write(&dir, &one.cert, &one.key);
        let (address, sent) =
            fake_memcached("Error loading the certificate chain: no start line\r\n");
        let mut agent = Agent::new(args(&dir, address.clone()));
        match agent.step() {
            Step::Waiting(why) => assert!(why.contains("no start line"), "{why}"),
            other => panic!("the first refusal is tried again: {other:?}"),
        }
        match agent.step() {
            Step::Failed(code, reason) => {
                assert_eq!(code, 3);
                assert!(reason.contains("no start line"), "{reason}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(sent.try_iter().count(), 2, "both attempts were made");
        // The kubelet restarts the agent: the same files are not tried again, so the agent
        // stays running (and its pod Ready) until the files change.
        let mut restarted = Agent::new(args(&dir, address));
        assert_eq!(restarted.step(), Step::Unchanged);
        assert_eq!(sent.try_iter().count(), 0);
    }

    #[test]
    fn a_recovery_after_a_reported_failure_exits_clean() {
        let dir = temp("recovery");
        let (one, two) = (pair("one.example"), pair("two.example"));
        write(&dir, &one.cert, &two.key);
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address.clone()));
        assert!(matches!(agent.step(), Step::Failed(4, _)));
        let mut restarted = Agent::new(args(&dir, address));
        assert_eq!(restarted.step(), Step::Unchanged, "reported already");
        write(&dir, &two.cert, &two.key);
        assert_eq!(restarted.step(), Step::Recovered);
        assert_eq!(sent.try_iter().count(), 1);
        assert!(!dir.join("state").join(REPORTED_FILE).exists());
    }

    /// memcached's own `ERROR ...` (a connection limit) and silence are not about the files:
    /// looked at again, never reported.
    #[test]
    fn a_busy_memcached_is_asked_again_not_reported() {
        let dir = temp("busy");
        let one = pair("one.example");
        write(&dir, &one.cert, &one.key);
        let (address, sent) = fake_memcached("ERROR Too many open connections\r\n");
        let mut agent = Agent::new(args(&dir, address));
        for _ in 0..5 {
            assert!(matches!(agent.step(), Step::Waiting(_)));
        }
        assert_eq!(sent.try_iter().count(), 5);
    }

    #[test]
    fn memcached_not_running_is_not_a_failure() {
        let dir = temp("down");
        let one = pair("one.example");
        write(&dir, &one.cert, &one.key);
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut agent = Agent::new(args(&dir, format!("127.0.0.1:{port}")));
        assert!(matches!(agent.step(), Step::Waiting(_)));
    }

    /// Files memcached would choke on never reach it: a key of another certificate, a key
    /// that is not one, a certificate that is not one.
    #[test]
    fn files_that_cannot_be_loaded_are_never_sent() {
        let (one, two) = (pair("one.example"), pair("two.example"));
        for (what, cert, key, words) in [
            (
                "mismatch",
                one.cert.as_str(),
                two.key.as_str(),
                "does not match",
            ),
            (
                "garbage key",
                one.cert.as_str(),
                "garbage",
                "tls.key is not",
            ),
            (
                "garbage cert",
                "garbage",
                one.key.as_str(),
                "tls.crt holds no PEM certificate",
            ),
        ] {
            let dir = temp(&what.replace(' ', "-"));
            write(&dir, cert, key);
            let (address, sent) = fake_memcached("OK\r\n");
            let mut agent = Agent::new(args(&dir, address));
            match agent.step() {
                Step::Failed(code, reason) => {
                    assert_eq!(code, 4, "{what}");
                    assert!(reason.contains(words), "{what}: {reason}");
                }
                other => panic!("{what}: expected a failure, got {other:?}"),
            }
            assert_eq!(
                sent.try_iter().count(),
                0,
                "{what}: nothing sent to memcached"
            );
        }
    }

    /// The digest is part of the pod template's hash: a new value would roll every TLS pool
    /// on an operator upgrade. The values are those of the operator before the agent became
    /// its own crate.
    #[test]
    fn the_digest_never_changes() {
        assert_eq!(
            secret_digest([
                ("tls.crt", &b"C"[..]),
                ("tls.key", &b"K"[..]),
                ("ca.crt", &b""[..]),
            ]),
            "7c70dd68dc0a614e"
        );
        assert_eq!(secret_digest([]), "e3b0c44298fc1c14");
        let files = Files {
            cert: b"C".to_vec(),
            key: b"K".to_vec(),
            ca: Vec::new(),
        };
        assert_eq!(files.digest(), "7c70dd68dc0a614e");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("15 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn missing_key_means_no_reload_yet() {
        let dir = temp("partial");
        let one = pair("one.example");
        write(&dir, &one.cert, &one.key);
        std::fs::remove_file(dir.join("certs").join("tls.key")).expect("remove");
        let (address, sent) = fake_memcached("OK\r\n");
        let mut agent = Agent::new(args(&dir, address));
        assert_eq!(agent.step(), Step::Unchanged);
        assert_eq!(sent.try_iter().count(), 0);
    }
}
