//! The operator's API clients: kube's own stack ([`kube::Client::try_from`]), built from the
//! same parts ([`ConfigExt`]) with two changes.
//!
//! - **Reads and writes** ([`client`]) go over HTTP/1 connections whose read buffer is
//!   capped at [`READ_BUFFER_MAX`]. hyper's default read buffer grows to the largest read it
//!   has seen (up to 408 KiB: a list, a burst of events) and keeps that size for the
//!   connection's life. A capped buffer reads a large body in more reads of at most
//!   [`READ_BUFFER_MAX`]; the API server's response heads are far smaller.
//! - **Watches** ([`watch_client`]) go over HTTP/2 where the server offers it (ALPN, as
//!   client-go does): one connection carries the watches of [`SCOPES_PER_WATCH_CONNECTION`]
//!   namespaces, where over HTTP/1 every watch held a TLS connection of its own (9 kinds per
//!   watched namespace: 900 connections over 100 namespaces, most of the operator's memory
//!   at 10,000 pools; see BENCHMARKS.md). A server without HTTP/2 (plain HTTP, or HTTP/2
//!   turned off) is watched over HTTP/1 as before.
//!
//! Left out of kube's stack: the debug-level request spans (nothing of ours reads them).
//! With a proxy in the kubeconfig (`proxy-url`) the client is kube's own, uncapped and
//! HTTP/1: kube builds the tunnels.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// The most each API connection's read buffer holds (hyper's least allowed is 8 KiB).
pub const READ_BUFFER_MAX: usize = 16 * 1024;

/// How many watched namespaces share one HTTP/2 connection. Each namespace has up to 11
/// watches open at once (9 kinds, the ServiceMonitor definition and, while it is served,
/// our ServiceMonitors): 88 streams, under the 100 that kube-apiserver allows on one
/// connection by default (`--http2-max-streams-per-connection`; a stream past the limit
/// would wait for another to end).
pub const SCOPES_PER_WATCH_CONNECTION: usize = 8;

/// How often an idle HTTP/2 connection is pinged, and how long the answer may take before
/// the connection is dropped (and its watches start again on a new one): client-go's
/// `ReadIdleTimeout` and `PingTimeout`. A dead peer is found even while every watch is quiet.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for `config`: kube's stack (TLS, time limits, retries of the server's 5xx and
/// 429, authentication, the extra headers such as our `User-Agent`) over HTTP/1
/// connections whose read buffers never grow past [`READ_BUFFER_MAX`].
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let https = config.rustls_https_connector_with_connector(http_connector())?;
    let connections = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build(timeouts(&config, https));
    stack(&config, connections)
}

/// A client for the informers' lists and watches: the same stack as [`client`], but over
/// one connection that speaks HTTP/2 if the server offers it, so that all of this client's
/// watches share it. Give each group of [`SCOPES_PER_WATCH_CONNECTION`] namespaces a client
/// of its own: one client keeps one HTTP/2 connection. Make one request on it before its
/// watches start: requests made before the first connection is up each dial one of their
/// own (and all but one are dropped once HTTP/2 is agreed).
pub fn watch_client(config: kube::Config) -> Result<kube::Client, BoxError> {
    if config.proxy_url.is_some() {
        return Ok(kube::Client::try_from(config)?);
    }
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| format!("tls-server-name {name:?}: {e}"))?;
            builder.with_server_name_resolver(FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let https = builder
        .enable_all_versions()
        .wrap_connector(http_connector());
    let connections = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        // The pool would retire its one HTTP/2 connection once no request had checked it out
        // for 90 s (open watches do not count), and a wave of watches restarting together
        // would then dial a connection each; the pings find a dead one instead.
        .pool_idle_timeout(None::<Duration>)
        .http1_max_buf_size(READ_BUFFER_MAX)
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(timeouts(&config, https));
    Ok(stack(&config, connections)?)
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

fn http_connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http
}

/// `connector` with the kubeconfig's time limits.
fn timeouts(config: &kube::Config, connector: Https) -> hyper_timeout::TimeoutConnector<Https> {
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    connector
}

/// kube's layers (base URI, retries, authentication, extra headers) over `connections`.
fn stack<C>(
    config: &kube::Config,
    connections: hyper_util::client::legacy::Client<C, kube::client::Body>,
) -> Result<kube::Client, kube::Error>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(connections);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}
