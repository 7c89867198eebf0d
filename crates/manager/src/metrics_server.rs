//! The `/metrics` endpoint. Secure mode (the default, `:8443`): TLS plus the checks of
//! controller-runtime's `filters.WithAuthenticationAndAuthorization` (bearer token →
//! TokenReview → SubjectAccessReview `get /metrics`, decisions cached briefly). Insecure: plain HTTP.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::serve::ConnectionLimits;
use crate::webhook_tls;

/// controller-runtime's default secure metrics address, `:8443`: every address, IPv4 and
/// IPv6 (see [`crate::serve::bind`]).
pub const DEFAULT_SECURE_BIND: SocketAddr =
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 8443);
/// How long an authentication/authorization decision is reused for the same token.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(10);
/// At most this many cached decisions are kept.
const AUTH_CACHE_MAX: usize = 1024;

/// Errors of the metrics server, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bind address could not be parsed.
    #[error("invalid metrics bind address {0:?}: expected \"0\", \":PORT\" or \"HOST:PORT\"")]
    InvalidAddress(String),
    /// Binding failed.
    #[error("binding metrics address {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// Secure mode needs a Kubernetes client for TokenReview/SubjectAccessReview.
    #[error("secure metrics serving needs a Kubernetes client for authentication")]
    NoClient,
    /// Loading or generating the certificate failed.
    #[error("setting up metrics TLS: {0}")]
    Tls(#[from] webhook_tls::Error),
    /// Serving failed.
    #[error("serving metrics: {0}")]
    Serve(#[source] std::io::Error),
}

/// Where and how `/metrics` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsServerConfig {
    /// Address to listen on; `None` disables the server (`--metrics-bind-address=0`).
    pub bind: Option<SocketAddr>,
    /// TLS plus authentication/authorization (default true).
    pub secure: bool,
    /// Directory with `tls.crt`/`tls.key`; `None` = self-signed certificate generated at start.
    pub cert_dir: Option<PathBuf>,
}

impl Default for MetricsServerConfig {
    fn default() -> Self {
        Self {
            bind: Some(DEFAULT_SECURE_BIND),
            secure: true,
            cert_dir: None,
        }
    }
}

impl MetricsServerConfig {
    /// Parses controller-runtime's address syntax: `"0"` → disabled, `":8443"` →
    /// `[::]:8443` (every address, IPv4 and IPv6; IPv4 only on a host without IPv6),
    /// `"127.0.0.1:0"`, `"[::1]:8080"`, `"localhost:8080"`.
    pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>, Error> {
        parse_bind_address(s)
    }
}

/// See [`MetricsServerConfig::parse_bind`].
pub fn parse_bind_address(s: &str) -> Result<Option<SocketAddr>, Error> {
    let s = s.trim();
    let bad = || Error::InvalidAddress(s.to_string());
    if s == "0" {
        return Ok(None);
    }
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(Some(crate::serve::any_address(port)));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
    }
    Err(bad())
}

/// The authenticated caller (from a TokenReview).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name, e.g. `system:serviceaccount:monitoring:prometheus`.
    pub username: String,
    /// UID.
    pub uid: Option<String>,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// A review call that failed (answered with 500, never cached).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The TokenReview call failed.
    #[error("creating TokenReview: {0}")]
    TokenReview(#[source] kube::Error),
    /// The SubjectAccessReview call failed.
    #[error("creating SubjectAccessReview: {0}")]
    SubjectAccessReview(#[source] kube::Error),
    /// Any other failure (fakes, future implementations).
    #[error("{0}")]
    Other(String),
}

/// Authentication and authorization of scrapers, behind a trait so the server is
/// testable without a cluster. [`KubeAuthorizer`] is the real one.
pub trait Authorizer: Send + Sync + 'static {
    /// `Ok(None)` when the token is not valid.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, AuthError>>;
    /// Whether `user` may do `verb` on the non-resource URL `path`.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>>;
}

/// Checks tokens with `TokenReview` and access with `SubjectAccessReview` (needs RBAC:
/// `create` on `tokenreviews` and `subjectaccessreviews`, as kube-rbac-proxy does).
#[derive(Clone)]
pub struct KubeAuthorizer {
    client: kube::Client,
}

impl KubeAuthorizer {
    /// Uses `client` for the reviews.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Authorizer for KubeAuthorizer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, AuthError>> {
        Box::pin(async move {
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: None,
                },
                ..Default::default()
            };
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(AuthError::TokenReview)?;
            let Some(status) = out.status else {
                return Ok(None);
            };
            if status.authenticated != Some(true) {
                return Ok(None);
            }
            let user = status.user.unwrap_or_default();
            Ok(Some(UserInfo {
                username: user.username.unwrap_or_default(),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.username.clone()),
                    uid: user.uid.clone(),
                    groups: Some(user.groups.clone()),
                    extra: Some(user.extra.clone()),
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(path.to_string()),
                        verb: Some(verb.to_string()),
                    }),
                    resource_attributes: None,
                },
                ..Default::default()
            };
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(AuthError::SubjectAccessReview)?;
            Ok(out.status.map(|s| s.allowed).unwrap_or(false))
        })
    }
}

/// Outcome of checking one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// 200.
    Allowed,
    /// No or invalid token: 401.
    Unauthenticated,
    /// Valid token, access denied: 403.
    Forbidden(String),
}

/// How much checking scrapers may cost the API server. Bearer tokens nobody has seen
/// authenticated are the cost an anonymous client can make at will, so their reviews are
/// rate-limited and limited in number at once; tokens the API server authenticated before
/// are reviewed again once per `ttl` without those limits, so a flood of junk cannot lock
/// out a real scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewLimits {
    /// How long a decision (allowed, denied, or an unknown token) is reused.
    pub ttl: Duration,
    /// Reviews of unknown tokens that may be made in a burst ...
    pub burst: u32,
    /// ... and one more each `refill` after it (a token bucket).
    pub refill: Duration,
    /// At most this many reviews of unknown tokens in flight at once.
    pub concurrent: usize,
    /// Each TokenReview and SubjectAccessReview call is abandoned after this long (the
    /// scraper is answered 503).
    pub timeout: Duration,
}

/// At most 20 reviews of unknown tokens at once, 10 a second after that, 4 in flight, each
/// call abandoned after 10 s (the API server's own delegated authentication's timeout).
impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            ttl: AUTH_CACHE_TTL,
            burst: 20,
            refill: Duration::from_millis(100),
            concurrent: 4,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why no decision was reached (never cached).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The review budget for unknown tokens is spent: 429, try again after `retry_after`.
    #[error("too many requests with unknown tokens; retry after {retry_after:?}")]
    Busy {
        /// When the budget allows another review.
        retry_after: Duration,
    },
    /// A review call took longer than [`ReviewLimits::timeout`]: 503.
    #[error("the API server did not answer a review within {0:?}")]
    Timeout(Duration),
    /// A review call failed: 500.
    #[error(transparent)]
    Review(#[from] AuthError),
}

/// SHA-256 of a bearer token: what the caches keep instead of the token (32 bytes each
/// whatever its size, and no credential in memory longer than its request).
type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    out
}

/// (token, verb, path).
type CacheKey = (TokenDigest, String, String);

/// Decisions kept apart by kind, so junk cannot evict real decisions: `known` holds only
/// tokens the API server authenticated (allowed or denied), `rejected` the tokens it did
/// not. Each keeps at most 1024 entries, dropping expired ones first and
/// then the oldest. An expired `known` entry still marks its token as known.
#[derive(Default)]
struct Caches {
    known: HashMap<CacheKey, (Instant, Decision)>,
    rejected: HashMap<TokenDigest, Instant>,
}

fn make_room<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    at: impl Fn(&V) -> Instant,
    ttl: Duration,
) {
    if map.len() < AUTH_CACHE_MAX {
        return;
    }
    map.retain(|_, v| at(v).elapsed() < ttl);
    while map.len() >= AUTH_CACHE_MAX {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| at(v))
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        map.remove(&oldest);
    }
}

/// Caches decisions per (token, verb, path) for a TTL and bounds what unknown tokens
/// cost (see [`ReviewLimits`]).
pub struct CachingAuthorizer {
    inner: Arc<dyn Authorizer>,
    limits: ReviewLimits,
    cache: Mutex<Caches>,
    budget: governor::DefaultDirectRateLimiter,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl CachingAuthorizer {
    /// Wraps `inner`, reusing decisions for `ttl`, with the default [`ReviewLimits`].
    pub fn new(inner: Arc<dyn Authorizer>, ttl: Duration) -> Self {
        Self::with_limits(
            inner,
            ReviewLimits {
                ttl,
                ..ReviewLimits::default()
            },
        )
    }

    /// Wraps `inner` with `limits` (a zero burst, refill or concurrency counts as one, a
    /// zero refill as one nanosecond).
    pub fn with_limits(inner: Arc<dyn Authorizer>, limits: ReviewLimits) -> Self {
        let burst = std::num::NonZeroU32::new(limits.burst).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = governor::Quota::with_period(limits.refill)
            .unwrap_or_else(|| governor::Quota::per_second(std::num::NonZeroU32::MAX))
            .allow_burst(burst);
        Self {
            inner,
            limits,
            cache: Mutex::new(Caches::default()),
            budget: governor::RateLimiter::direct(quota),
            in_flight: Arc::new(tokio::sync::Semaphore::new(limits.concurrent.max(1))),
        }
    }

    /// Decides for a bearer `token` doing `verb` on `path`.
    pub async fn check(&self, token: &str, verb: &str, path: &str) -> Result<Decision, CheckError> {
        let token_digest = digest(token);
        let key = (token_digest, verb.to_string(), path.to_string());
        let ttl = self.limits.ttl;
        let known = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, d)) = cache.known.get(&key) {
                if at.elapsed() < ttl {
                    return Ok(d.clone());
                }
                true
            } else {
                if cache
                    .rejected
                    .get(&token_digest)
                    .is_some_and(|at| at.elapsed() < ttl)
                {
                    return Ok(Decision::Unauthenticated);
                }
                false
            }
        };
        // Only unknown tokens spend the budget; a permit is held for their whole review.
        let _permit = if known {
            None
        } else {
            let permit =
                self.in_flight
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| CheckError::Busy {
                        retry_after: Duration::from_secs(1),
                    })?;
            if let Err(not_until) = self.budget.check() {
                use governor::clock::{Clock, DefaultClock};
                return Err(CheckError::Busy {
                    retry_after: not_until.wait_time_from(DefaultClock::default().now()),
                });
            }
            Some(permit)
        };
        let timeout = self.limits.timeout;
        let decision = match bounded(timeout, self.inner.authenticate(token)).await? {
            None => Decision::Unauthenticated,
            Some(user) => {
                if bounded(timeout, self.inner.authorize(&user, verb, path)).await? {
                    Decision::Allowed
                } else {
                    Decision::Forbidden(user.username)
                }
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if decision == Decision::Unauthenticated {
            // A token no longer valid is no longer known.
            cache.known.retain(|(t, _, _), _| *t != token_digest);
            make_room(&mut cache.rejected, |at| *at, ttl);
            cache.rejected.insert(token_digest, Instant::now());
        } else {
            cache.rejected.remove(&token_digest);
            make_room(&mut cache.known, |(at, _)| *at, ttl);
            cache.known.insert(key, (Instant::now(), decision.clone()));
        }
        Ok(decision)
    }
}

/// `review`, abandoned after `timeout`.
async fn bounded<T>(
    timeout: Duration,
    review: BoxFuture<'_, Result<T, AuthError>>,
) -> Result<T, CheckError> {
    tokio::time::timeout(timeout, review)
        .await
        .map_err(|_| CheckError::Timeout(timeout))?
        .map_err(CheckError::Review)
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    auth: Option<Arc<CachingAuthorizer>>,
}

fn plain(status: StatusCode, msg: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg.into(),
    )
        .into_response()
}

async fn metrics_handler(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(auth) = &state.auth {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized\n");
        };
        let verb = method.as_str().to_ascii_lowercase();
        match auth.check(token, &verb, uri.path()).await {
            Ok(Decision::Allowed) => {}
            Ok(Decision::Unauthenticated) => {
                return plain(StatusCode::UNAUTHORIZED, "Unauthorized\n");
            }
            Ok(Decision::Forbidden(user)) => {
                tracing::debug!(%user, "metrics access denied");
                return plain(
                    StatusCode::FORBIDDEN,
                    format!("Authorization denied for user {user}\n"),
                );
            }
            Err(CheckError::Busy { retry_after }) => {
                let mut response = plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too many requests with unknown tokens, try again later\n",
                );
                let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, seconds.max(1).into());
                return response;
            }
            Err(err @ CheckError::Timeout(_)) => {
                tracing::warn!(%err, "metrics authentication/authorization timed out");
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Authentication or authorization timed out\n",
                );
            }
            Err(CheckError::Review(err)) => {
                tracing::error!(%err, "metrics authentication/authorization failed");
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Authentication or authorization failed\n",
                );
            }
        }
    }
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

/// The router: `GET /metrics`, checked by `auth` when given.
pub fn router(metrics: Metrics, auth: Option<Arc<CachingAuthorizer>>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(AppState { metrics, auth })
}

/// Serves `/metrics` as configured until `shutdown`. Returns at once if disabled.
/// Same as [`MetricsServer::bind`] followed by [`MetricsServer::run`].
pub async fn serve_metrics(
    config: MetricsServerConfig,
    metrics: Metrics,
    client: Option<kube::Client>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    match MetricsServer::bind(&config, client, &shutdown).await? {
        Some(server) => server.run(metrics, shutdown).await,
        None => {
            tracing::info!("metrics server disabled");
            Ok(())
        }
    }
}

/// A bound, not yet running metrics server (lets callers learn the port first).
pub struct MetricsServer {
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    auth: Option<Arc<CachingAuthorizer>>,
    limits: ConnectionLimits,
}

impl MetricsServer {
    /// Binds `config.bind` and prepares TLS and authentication (secure mode needs
    /// `client`). With a cert dir, a task reloading the certificate runs until
    /// `shutdown`. `Ok(None)` when the server is disabled.
    pub async fn bind(
        config: &MetricsServerConfig,
        client: Option<kube::Client>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Error> {
        let Some(addr) = config.bind else {
            return Ok(None);
        };
        let (tls, auth) = if config.secure {
            let client = client.ok_or(Error::NoClient)?;
            let tls = match &config.cert_dir {
                Some(dir) => webhook_tls::server_config_from_dir(
                    dir,
                    webhook_tls::DEFAULT_POLL_INTERVAL,
                    shutdown.clone(),
                )?,
                None => {
                    tracing::info!(
                        "no metrics certificate directory given, using a self-signed certificate"
                    );
                    webhook_tls::self_signed_server_config()?
                }
            };
            let auth: Arc<dyn Authorizer> = Arc::new(KubeAuthorizer::new(client));
            (
                Some(tls),
                Some(Arc::new(CachingAuthorizer::new(auth, AUTH_CACHE_TTL))),
            )
        } else {
            (None, None)
        };
        let listener = crate::serve::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        Ok(Some(Self {
            listener,
            tls,
            auth,
            limits: ConnectionLimits::default(),
        }))
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener.local_addr().map_err(Error::Serve)
    }

    /// Serves within `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves until `shutdown`.
    pub async fn run(self, metrics: Metrics, shutdown: CancellationToken) -> Result<(), Error> {
        serve_metrics_with(
            self.listener,
            self.tls,
            metrics,
            self.auth,
            self.limits,
            shutdown,
        )
        .await
    }
}

/// Lower-level form of [`serve_metrics`] on a bound listener (tests bind port 0):
/// TLS when `tls` is given, request checks when `auth` is given.
pub async fn serve_metrics_on(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    metrics: Metrics,
    auth: Option<Arc<CachingAuthorizer>>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let limits = ConnectionLimits::default();
    serve_metrics_with(listener, tls, metrics, auth, limits, shutdown).await
}

/// [`serve_metrics_on`] within `limits` instead of the defaults.
pub async fn serve_metrics_with(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    metrics: Metrics,
    auth: Option<Arc<CachingAuthorizer>>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let app = router(metrics, auth);
    let addr = listener.local_addr().map_err(Error::Serve)?;
    tracing::info!(%addr, secure = tls.is_some(), "serving metrics");
    crate::serve::serve(listener, tls, app, limits, shutdown).await;
    Ok(())
}

#[cfg(test)]
#[path = "metrics_server_tests.rs"]
mod tests;
