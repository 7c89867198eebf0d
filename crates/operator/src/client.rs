//! The operator's API client: kube's own stack ([`kube::Client::try_from`]), built from the
//! same parts ([`ConfigExt`]) with one change: each connection's read buffer is capped at
//! [`READ_BUFFER_MAX`].
//!
//! kube-client speaks HTTP/1 only, so every watch holds a connection of its own (9 kinds per
//! watched namespace), and hyper's default read buffer grows to the largest read it has
//! seen (up to 408 KiB: a list, a burst of events) and keeps that size for the
//! connection's life. Over 100 namespaces that was most of the operator's memory (see
//! BENCHMARKS.md, "10,000 pools"). A capped buffer reads a large body in more reads of at
//! most [`READ_BUFFER_MAX`]; the API server's response heads are far smaller.
//!
//! Left out of kube's stack: the debug-level request spans (nothing of ours reads them).
//! With a proxy in the kubeconfig (`proxy-url`) the client is kube's own, uncapped: kube
//! builds the tunnels.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// The most each API connection's read buffer holds (hyper's least allowed is 8 KiB).
pub const READ_BUFFER_MAX: usize = 16 * 1024;

/// A client for `config`: kube's stack (TLS, time limits, retries of the server's 5xx and
/// 429, authentication, the extra headers such as our `User-Agent`) over connections whose
/// read buffers never grow past [`READ_BUFFER_MAX`].
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let connections = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build(connector);
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
    Ok(kube::Client::new(service, config.default_namespace))
}
