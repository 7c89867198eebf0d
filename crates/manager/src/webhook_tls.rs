//! TLS for the servers this process runs (metrics, admission webhooks):
//! a rustls server config (ring provider) whose certificate comes from `tls.crt`/`tls.key`
//! in a directory and is swapped in when the files change, or a self-signed one (rcgen).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// Certificate file name inside the certificate directory (as in a `kubernetes.io/tls` Secret).
pub const CERT_FILE: &str = "tls.crt";
/// Key file name inside the certificate directory.
pub const KEY_FILE: &str = "tls.key";
/// How often [`CertWatcher::watch`] re-reads the files by default. A Secret update
/// reaches the mounted volume after about a minute anyway; this only adds little.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// Errors loading or building TLS material, naming the step and file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A PEM file could not be parsed or held no usable item.
    #[error("parsing PEM in {path}: {reason}")]
    Pem {
        /// File.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key is unsupported or does not match the certificate.
    #[error("loading key pair from {dir}: {source}")]
    KeyPair {
        /// Directory.
        dir: PathBuf,
        /// Cause.
        source: rustls::Error,
    },
    /// Building the rustls server config failed.
    #[error("building TLS server config: {0}")]
    Config(#[source] rustls::Error),
    /// Generating the self-signed certificate failed.
    #[error("generating self-signed certificate: {0}")]
    SelfSigned(#[source] rcgen::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config (TLS 1.2+, ALPN `http/1.1`) whose certificate comes from `resolver`.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<ServerConfig>, Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(Error::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Builds a key pair from PEM text; `dir` is only used in error messages.
fn certified_key(dir: &Path, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            path: cert_path.clone(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            path: cert_path,
            reason: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| Error::Pem {
        path: key_path,
        reason: e.to_string(),
    })?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|source| Error::KeyPair {
        dir: dir.to_path_buf(),
        source,
    })
}

fn read(path: PathBuf) -> Result<Vec<u8>, Error> {
    std::fs::read(&path).map_err(|source| Error::Read { path, source })
}

/// Serves the key pair found in a directory and swaps it when the files change.
///
/// Changes are detected by comparing file contents at each poll (robust against
/// coarse mtimes and against the symlink swaps of Secret volumes). A pair that fails
/// to load (e.g. half-written) is logged and the previous one stays in use.
#[derive(Debug)]
pub struct CertWatcher {
    dir: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
    /// Polls of [`CertWatcher::watch`] that found files it could not load.
    failed_reloads: AtomicU64,
}

impl CertWatcher {
    /// Loads `dir/tls.crt` and `dir/tls.key`; fails if they are missing or invalid.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Arc<Self>, Error> {
        let dir = dir.into();
        let cert = read(dir.join(CERT_FILE))?;
        let key = read(dir.join(KEY_FILE))?;
        let ck = certified_key(&dir, &cert, &key)?;
        Ok(Arc::new(Self {
            dir,
            current: RwLock::new(Arc::new(ck)),
            loaded: Mutex::new((cert, key)),
            failed_reloads: AtomicU64::new(0),
        }))
    }

    /// Re-reads the files; returns `Ok(true)` when a new pair was loaded.
    pub fn reload_if_changed(&self) -> Result<bool, Error> {
        let cert = read(self.dir.join(CERT_FILE))?;
        let key = read(self.dir.join(KEY_FILE))?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 == cert && loaded.1 == key {
            return Ok(false);
        }
        let ck = certified_key(&self.dir, &cert, &key)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ck);
        *loaded = (cert, key);
        tracing::info!(dir = %self.dir.display(), "reloaded TLS certificate");
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown` is cancelled.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(err) = self.reload_if_changed() {
                self.failed_reloads.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%err, "TLS certificate reload failed; keeping the previous one");
            }
        }
    }

    /// How many polls of [`CertWatcher::watch`] found files that failed to load (the
    /// previous pair was kept each time).
    pub fn failed_reloads(&self) -> u64 {
        self.failed_reloads.load(Ordering::Relaxed)
    }

    /// The end-entity certificate currently served.
    pub fn current_cert(&self) -> Option<CertificateDer<'static>> {
        let ck = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ck.cert.first().cloned()
    }
}

impl ResolvesServerCert for CertWatcher {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Server config for a directory: loads now, and keeps reloading every `poll`
/// until `shutdown` (spawns the watcher task; needs a Tokio runtime).
pub fn server_config_from_dir(
    dir: impl Into<PathBuf>,
    poll: Duration,
    shutdown: CancellationToken,
) -> Result<Arc<ServerConfig>, Error> {
    let watcher = CertWatcher::new(dir)?;
    let config = server_config(watcher.clone())?;
    tokio::spawn(watcher.watch(poll, shutdown));
    Ok(config)
}

/// A self-signed certificate and key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct SelfSigned {
    /// `CERTIFICATE` PEM.
    pub cert_pem: String,
    /// `PRIVATE KEY` (PKCS#8) PEM.
    pub key_pem: String,
}

/// Generates a self-signed certificate for `names` (DNS names or IP addresses).
pub fn generate_self_signed(names: &[String]) -> Result<SelfSigned, Error> {
    let ck = rcgen::generate_simple_self_signed(names.to_vec()).map_err(Error::SelfSigned)?;
    Ok(SelfSigned {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
    })
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Server config with a freshly generated self-signed certificate for `localhost`,
/// `127.0.0.1` and this host's name (what controller-runtime does without a cert dir).
pub fn self_signed_server_config() -> Result<Arc<ServerConfig>, Error> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(h) = hostname::get()
        && let Some(h) = h.to_str()
        && !h.is_empty()
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        names.push(h.to_string());
    }
    let pem = generate_self_signed(&names)?;
    let ck = certified_key(
        Path::new("<self-signed>"),
        pem.cert_pem.as_bytes(),
        pem.key_pem.as_bytes(),
    )?;
    server_config(Arc::new(Fixed(Arc::new(ck))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path) -> SelfSigned {
        let pem = generate_self_signed(&["localhost".to_string()]).unwrap();
        std::fs::write(dir.join(CERT_FILE), &pem.cert_pem).unwrap();
        std::fs::write(dir.join(KEY_FILE), &pem.key_pem).unwrap();
        pem
    }

    fn der(pem: &SelfSigned) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.cert_pem.as_bytes()).unwrap()
    }

    #[test]
    fn loads_and_reloads_only_on_change() {
        let dir = crate::test_util::TempDir::new("tls-reload");
        let first = write_pair(dir.path());
        let w = CertWatcher::new(dir.path()).unwrap();
        assert_eq!(w.current_cert().unwrap(), der(&first));
        assert!(!w.reload_if_changed().unwrap());

        let second = write_pair(dir.path());
        assert!(w.reload_if_changed().unwrap());
        assert_eq!(w.current_cert().unwrap(), der(&second));

        // A broken key keeps the previous pair.
        std::fs::write(dir.path().join(KEY_FILE), "garbage").unwrap();
        assert!(w.reload_if_changed().is_err());
        assert_eq!(w.current_cert().unwrap(), der(&second));
    }

    #[test]
    fn missing_files_name_the_file() {
        let dir = crate::test_util::TempDir::new("tls-missing");
        let err = CertWatcher::new(dir.path()).unwrap_err().to_string();
        assert!(err.contains("tls.crt"), "{err}");
    }

    #[test]
    fn mismatched_key_is_rejected() {
        let dir = crate::test_util::TempDir::new("tls-mismatch");
        write_pair(dir.path());
        let other = generate_self_signed(&["x".to_string()]).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), other.key_pem).unwrap();
        assert!(matches!(
            CertWatcher::new(dir.path()),
            Err(Error::KeyPair { .. })
        ));
    }

    #[test]
    fn self_signed_config_builds() {
        assert!(self_signed_server_config().is_ok());
    }
}
