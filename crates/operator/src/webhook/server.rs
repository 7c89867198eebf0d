//! The HTTPS server of the webhooks: the listener, TLS with a reloaded certificate, the
//! axum router, the checks on headers and body (type, size, deadline, the memory it may
//! hold) and the handler that turns a request into an AdmissionReview on the wire; and the
//! thread of its own the operator runs it on ([`WebhookServer::spawn`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use manager::ConnectionLimits;
use manager::webhook_tls::{self, CertWatcher};
use memcached_api::validation;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::admission::{Endpoint, handle_checked};
use super::decode::{BadRequest, decoded_size, too_large};
use super::dry_run::ChildrenCheck;
use super::limits::{
    HELD_PER_BODY_BYTE, Held, MAX_REQUEST_BYTES, MemoryBudget, RETRY_AFTER_SECONDS, Refusal,
};
use super::{
    DEFAULT_CERT_DIR, DEFAULT_PORT, MAX_BODY_BYTES, MUTATE_PATH, TIMEOUT_SECONDS, VALIDATE_PATH,
};

/// A request body must arrive within this time (the API server gives up after
/// [`TIMEOUT_SECONDS`] anyway), so a slow client cannot hold a handler.
const BODY_TIMEOUT: Duration = Duration::from_secs(TIMEOUT_SECONDS as u64);

/// Where and how the webhooks are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Address to listen on (`[::]:9443` by default: every address, IPv4 and IPv6; IPv4
    /// only on a host without IPv6).
    pub bind: SocketAddr,
    /// Directory holding `tls.crt` and `tls.key` (a cert-manager Secret mounted there).
    pub cert_dir: PathBuf,
    /// The operator's `--memcached-image`, used for warnings about objects that do not
    /// name an image (it is not written into objects; see the [module documentation](super)).
    pub default_image: String,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            bind: manager::serve::any_address(DEFAULT_PORT),
            cert_dir: PathBuf::from(DEFAULT_CERT_DIR),
            default_image: memcached_api::DEFAULT_IMAGE.to_string(),
        }
    }
}

/// Why the webhook server cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No usable certificate in the directory.
    #[error(
        "the admission webhooks are enabled but there is no usable serving certificate in {}: {source}. \
         In a cluster, install cert-manager and deploy with its Certificate (config/certmanager), whose \
         Secret is mounted at that directory as tls.crt and tls.key; or point --webhook-cert-dir at a \
         directory that has them. To run outside a cluster (make run), disable the webhooks with \
         ENABLE_WEBHOOKS=false (or --enable-webhooks=false)",
        dir.display()
    )]
    Certificate {
        dir: PathBuf,
        #[source]
        source: webhook_tls::Error,
    },
    /// The TLS server configuration could not be built.
    #[error("setting up webhook TLS: {0}")]
    Tls(#[source] webhook_tls::Error),
    /// The operator's default image is not a valid reference.
    #[error("the default memcached image {image:?} (--memcached-image) is not valid: {reason}")]
    DefaultImage { image: String, reason: String },
    /// Binding the port failed.
    #[error("binding the webhook server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving admission webhooks: {0}")]
    Serve(#[source] std::io::Error),
    /// The webhook server's thread or runtime could not be started, or stopped unexpectedly.
    #[error("the webhook server's thread: {0}")]
    Thread(String),
    /// The API client of the dry runs could not be made.
    #[error("cannot make the API client for the webhook's dry runs: {0}")]
    Client(String),
}

/// Checks that `cert_dir` holds a usable key pair (`tls.crt`, `tls.key`). The operator
/// calls this at start when webhooks are enabled and refuses to start without one; the
/// error says why and how to fix it.
pub fn check_certificate(cert_dir: impl AsRef<Path>) -> Result<(), WebhookError> {
    load_certificate(cert_dir.as_ref()).map(|_| ())
}

fn load_certificate(dir: &Path) -> Result<Arc<CertWatcher>, WebhookError> {
    CertWatcher::new(dir).map_err(|source| WebhookError::Certificate {
        dir: dir.to_path_buf(),
        source,
    })
}

/// Serves both webhooks until `shutdown`: [`WebhookServer::bind`] then
/// [`WebhookServer::run`].
pub async fn serve(config: WebhookConfig, shutdown: CancellationToken) -> Result<(), WebhookError> {
    WebhookServer::bind(config).await?.run(shutdown).await
}

/// A bound, not yet running webhook server (lets callers learn the port first).
pub struct WebhookServer {
    listener: TcpListener,
    certs: Arc<CertWatcher>,
    default_image: String,
    children: Option<ChildrenCheck>,
    reload_interval: Duration,
    limits: ConnectionLimits,
    memory: MemoryBudget,
}

/// A webhook server running on a thread of its own ([`WebhookServer::spawn`]).
pub struct WebhookThread {
    addr: SocketAddr,
    done: tokio::sync::oneshot::Receiver<Result<(), WebhookError>>,
}

impl WebhookThread {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the server has stopped (after its shutdown token was cancelled: requests
    /// in progress finished, connections closed) and the thread ends.
    pub async fn stopped(self) -> Result<(), WebhookError> {
        self.done.await.unwrap_or_else(|_| {
            Err(WebhookError::Thread(
                "it ended without saying why (a panic: see the log)".to_string(),
            ))
        })
    }
}

impl WebhookServer {
    /// Loads the certificate (failing as [`check_certificate`] does), checks the default
    /// image, and binds `config.bind` (port 0 picks a free port).
    pub async fn bind(config: WebhookConfig) -> Result<Self, WebhookError> {
        let certs = load_certificate(&config.cert_dir)?;
        validation::validate_image(&config.default_image).map_err(|reason| {
            WebhookError::DefaultImage {
                image: config.default_image.clone(),
                reason,
            }
        })?;
        let listener = manager::serve::bind(config.bind).map_err(|source| WebhookError::Bind {
            addr: config.bind,
            source,
        })?;
        Ok(Self {
            listener,
            certs,
            default_image: config.default_image,
            children: None,
            reload_interval: webhook_tls::DEFAULT_POLL_INTERVAL,
            limits: ConnectionLimits::default(),
            memory: MemoryBudget::default(),
        })
    }

    /// Binds and serves on a new thread named `webhook`, with a single-threaded Tokio
    /// runtime of its own, until `shutdown`. Nothing the server does (TLS handshakes,
    /// reading and decoding bodies, dry runs) then runs on the caller's runtime, which in
    /// the operator renews the Lease: a flood of the webhook port takes one core at most
    /// and never delays a renewal, even with `--worker-threads 0`.
    ///
    /// `setup` runs on the new runtime before serving (what holds tasks of a runtime must be
    /// made there; the dry runs of a [`ChildrenCheck`] have a thread of their own,
    /// [`ChildrenCheck::on_own_thread`]). Returns once the server listens, or with why it
    /// cannot.
    pub async fn spawn<F>(
        config: WebhookConfig,
        setup: F,
        shutdown: CancellationToken,
    ) -> Result<WebhookThread, WebhookError>
    where
        F: FnOnce(WebhookServer) -> Result<WebhookServer, WebhookError> + Send + 'static,
    {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        runtime_thread("webhook", move || async move {
            let server = match WebhookServer::bind(config).await.and_then(setup) {
                Ok(server) => server,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            if started_tx.send(server.local_addr()).is_err() {
                return;
            }
            let result = server.run(shutdown).await;
            if let Err(e) = &result {
                tracing::error!(error = %e, "webhook server stopped");
            }
            let _ = done_tx.send(result);
        })
        .await
        .map_err(WebhookError::Thread)?;
        let addr = started_rx.await.unwrap_or_else(|_| {
            Err(WebhookError::Thread(
                "it ended while starting (a panic: see the log)".to_string(),
            ))
        })?;
        Ok(WebhookThread { addr, done })
    }

    /// How often the certificate files are re-read (default 5 s).
    pub fn with_reload_interval(mut self, interval: Duration) -> Self {
        self.reload_interval = interval;
        self
    }

    /// Also dry-runs the children of every Memcached the validating webhook would admit
    /// (see [`crate::webhook::dry_run`]).
    pub fn with_children_check(mut self, check: ChildrenCheck) -> Self {
        self.children = Some(check);
        self
    }

    /// Serves within `limits` (connections at once, header and TLS handshake deadlines)
    /// instead of the defaults.
    pub fn with_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Holds request bodies and their decoded forms within `memory` instead of the default
    /// budget ([`MemoryBudget::default`]).
    pub fn with_memory_budget(mut self, memory: MemoryBudget) -> Self {
        self.memory = memory;
        self
    }

    /// The certificate being served and reloaded (for its reload counts).
    pub fn certificates(&self) -> Arc<CertWatcher> {
        self.certs.clone()
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, WebhookError> {
        self.listener.local_addr().map_err(WebhookError::Serve)
    }

    /// Serves until `shutdown`, reloading the certificate when its files change.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WebhookError> {
        let tls = webhook_tls::server_config(self.certs.clone()).map_err(WebhookError::Tls)?;
        let watch = tokio::spawn(
            self.certs
                .clone()
                .watch(self.reload_interval, shutdown.clone()),
        );
        let addr = self.local_addr()?;
        tracing::info!(%addr, mutate = MUTATE_PATH, validate = VALIDATE_PATH, "serving admission webhooks");
        let state = HandlerState::new(self.default_image, self.children, self.memory);
        let report = tokio::spawn(report_busy(state.busy.clone(), shutdown.clone()));
        let app = router_with_state(state);
        manager::serve::serve(self.listener, Some(tls), app, self.limits, shutdown).await;
        watch.abort();
        report.abort();
        Ok(())
    }
}

/// How often the count of requests answered 429 is logged (when there were any): one line
/// rather than one per request, which a flood would turn into a flood of logs.
const BUSY_REPORT_INTERVAL: Duration = Duration::from_secs(10);

async fn report_busy(busy: Arc<AtomicU64>, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(BUSY_REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let refused = busy.swap(0, Ordering::Relaxed);
        if refused > 0 {
            tracing::warn!(
                refused,
                seconds = BUSY_REPORT_INTERVAL.as_secs(),
                "the webhooks answered 429 (busy) to requests beyond their bounds on memory and dry runs; the API server retries them"
            );
        }
    }
}

/// The two webhook routes, without TLS (tests call the handlers through it).
pub fn router(default_image: impl Into<String>) -> Router {
    router_with(default_image, None)
}

/// The two webhook routes, the validating one also dry-running children when `children`
/// is given (within the default memory budget).
pub fn router_with(default_image: impl Into<String>, children: Option<ChildrenCheck>) -> Router {
    router_with_state(HandlerState::new(
        default_image.into(),
        children,
        MemoryBudget::default(),
    ))
}

fn router_with_state(state: HandlerState) -> Router {
    let state = Arc::new(state);
    Router::new()
        .route(
            MUTATE_PATH,
            post(|State(s): State<Arc<HandlerState>>, headers: HeaderMap, body: axum::body::Body| async move {
                http_handler(Endpoint::Mutate, &s, &headers, body).await
            }),
        )
        .route(
            VALIDATE_PATH,
            post(|State(s): State<Arc<HandlerState>>, headers: HeaderMap, body: axum::body::Body| async move {
                http_handler(Endpoint::Validate, &s, &headers, body).await
            }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                format!("no webhook here: POST an AdmissionReview to {MUTATE_PATH} or {VALIDATE_PATH}\n"),
            )
        })
        .with_state(state)
}

struct HandlerState {
    default_image: String,
    children: Option<ChildrenCheck>,
    memory: MemoryBudget,
    /// Requests answered 429 since the last report.
    busy: Arc<AtomicU64>,
}

impl HandlerState {
    fn new(default_image: String, children: Option<ChildrenCheck>, memory: MemoryBudget) -> Self {
        Self {
            default_image,
            children,
            memory,
            busy: Arc::new(AtomicU64::new(0)),
        }
    }
}

async fn http_handler(
    endpoint: Endpoint,
    state: &HandlerState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Response {
    match answer(endpoint, state, headers, body).await {
        Ok(review) => json_response(StatusCode::OK, &review),
        Err(bad) if bad.status == StatusCode::TOO_MANY_REQUESTS => {
            state.busy.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(message = %bad.message, "refused an admission request: busy");
            json_response(bad.status, &bad.to_review())
        }
        Err(bad) => {
            tracing::info!(status = %bad.status, message = %bad.message, "rejected a malformed admission request");
            json_response(bad.status, &bad.to_review())
        }
    }
}

/// The answer to one request, holding what it needs of the memory budget from its header
/// (as its declared length says) until the answer is made.
async fn answer(
    endpoint: Endpoint,
    state: &HandlerState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<AdmissionReview<DynamicObject>, BadRequest> {
    let declared = check_headers(headers)?;
    let mut held = state
        .memory
        .hold(declared.unwrap_or(0).saturating_mul(HELD_PER_BODY_BYTE))
        .map_err(refused)?;
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, read_body(body, declared, &mut held)).await
    {
        Err(_) => {
            return Err(BadRequest::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ));
        }
        Ok(read) => read?,
    };
    // The body and what decoding it takes, known now: three times the estimate of its
    // JSON tree (the tree, the typed Memcached, the defaulted copy), refused before any of
    // it is made when it is more than a request may hold.
    held.resize(
        decoded_size(&bytes)
            .saturating_mul(HELD_PER_BODY_BYTE - 1)
            .saturating_add(bytes.len()),
    )
    .map_err(refused)?;
    handle_checked(
        endpoint,
        &bytes,
        &state.default_image,
        state.children.as_ref(),
    )
    .await
}

/// The answer when a request cannot hold what it needs: 413 for more than any request
/// may, 429 for more than the budget has left now.
fn refused(refusal: Refusal) -> BadRequest {
    const MIB: f64 = 1024.0 * 1024.0;
    match refusal {
        Refusal::TooLarge { wanted } => BadRequest::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request too costly: its body and decoding it would take about {:.1} MiB, and a request may take {:.0} MiB (a Memcached's review takes well under 1 MiB)",
                wanted as f64 / MIB,
                MAX_REQUEST_BYTES as f64 / MIB
            ),
        ),
        Refusal::Busy {
            wanted,
            held,
            limit,
            large,
        } => BadRequest::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the webhook is busy: requests in progress hold {:.1} MiB of the {:.0} MiB {} requests may hold, too much to hold {:.1} MiB for this one; retry in {RETRY_AFTER_SECONDS} s",
                held as f64 / MIB,
                limit as f64 / MIB,
                if large { "large" } else { "all" },
                wanted as f64 / MIB
            ),
        ),
    }
}

fn json_response(status: StatusCode, review: &AdmissionReview<DynamicObject>) -> Response {
    let body = match review_json(review) {
        Ok(body) => body,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the AdmissionReview response: {e}\n"),
            )
                .into_response();
        }
    };
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        // The API server's client waits this long and retries (up to 10 times within the
        // webhook's timeout); without it, a 429 would fail the write at once.
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(RETRY_AFTER_SECONDS),
        );
    }
    response
}

/// The AdmissionReview as sent on the wire. `response.patch` is a Go `[]byte`, which is
/// base64 in JSON; kube-core serializes its `Vec<u8>` as an array of numbers
/// (kube-rs issue 1781), so it is rewritten here.
pub fn review_json(review: &AdmissionReview<DynamicObject>) -> Result<Vec<u8>, serde_json::Error> {
    let mut value = serde_json::to_value(review)?;
    if let Some(patch) = value.pointer_mut("/response/patch")
        && let Some(bytes) = patch.as_array().map(|a| {
            a.iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Vec<u8>>()
        })
    {
        *patch = Value::String(base64(&bytes));
    }
    serde_json::to_vec(&value)
}

/// Standard base64 with padding (RFC 4648), as Go's encoding/json writes `[]byte`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Checks the content type and the declared length, returned when there is one (a
/// chunked body has none).
fn check_headers(headers: &HeaderMap) -> Result<Option<usize>, BadRequest> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(BadRequest::new(
            StatusCode::BAD_REQUEST,
            format!("contentType={content_type:?}, expected application/json"),
        ));
    }
    let Some(length) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return Ok(None);
    };
    match usize::try_from(length) {
        Ok(length) if length <= MAX_BODY_BYTES => Ok(Some(length)),
        _ => Err(too_large(length)),
    }
}

/// Reads the body into a buffer of the declared length, or for a chunked body one that
/// doubles as it fills, holding [`HELD_PER_BODY_BYTE`] per byte of its capacity before it
/// grows.
async fn read_body(
    body: axum::body::Body,
    declared: Option<usize>,
    held: &mut Held,
) -> Result<Vec<u8>, BadRequest> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            BadRequest::new(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            )
        })?;
        let length = bytes.len() + chunk.len();
        if length > MAX_BODY_BYTES {
            return Err(too_large(length as u64));
        }
        if length > bytes.capacity() {
            let capacity = length.max(bytes.capacity() * 2).min(MAX_BODY_BYTES);
            held.resize(capacity.saturating_mul(HELD_PER_BODY_BYTE))
                .map_err(refused)?;
            bytes.reserve_exact(capacity - bytes.len());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Starts a thread named `name` with a single-threaded Tokio runtime of its own and runs on
/// it, until done, the future `body` makes. Returns the runtime's handle (for more work on
/// that thread while `body` runs) once the runtime is up, or why the thread or its runtime
/// could not start.
pub(super) async fn runtime_thread<F, Fut>(
    name: &str,
    body: F,
) -> Result<tokio::runtime::Handle, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (started_tx, started) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    if started_tx.send(Ok(runtime.handle().clone())).is_ok() {
                        runtime.block_on(body());
                    }
                }
                Err(e) => {
                    let _ = started_tx.send(Err(format!("cannot start its runtime: {e}")));
                }
            }
        })
        .map_err(|e| format!("cannot start it: {e}"))?;
    started
        .await
        .unwrap_or_else(|_| Err("it ended while starting (a panic: see the log)".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
