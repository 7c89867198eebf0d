//! The `/metrics` endpoint. Secure mode (the default, `:8443`): TLS plus the checks of
//! controller-runtime's `filters.WithAuthenticationAndAuthorization` (bearer token →
//! TokenReview → SubjectAccessReview `get /metrics`, decisions cached briefly). Insecure: plain HTTP.
//! The checks themselves (reviews, caching, limits) are in `auth`.

mod auth;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::{
    AUTH_CACHE_TTL, AuthError, Authorizer, CachingAuthorizer, CheckError, Decision, KubeAuthorizer,
    ReviewLimits, UserInfo,
};

use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::serve::ConnectionLimits;
use crate::webhook_tls;

/// controller-runtime's default secure metrics address, `:8443`: every address, IPv4 and
/// IPv6 (see [`crate::serve::bind`]).
pub const DEFAULT_SECURE_BIND: SocketAddr =
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 8443);

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
