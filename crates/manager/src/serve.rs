//! Serving a router on a listener, plain or over TLS, with the limits every server of
//! this process needs against clients that hold connections open (slowloris): at most
//! [`ConnectionLimits::max_connections`] connections at once (further ones wait in the
//! listen backlog, as Go's `netutil.LimitListener` makes them), a deadline for the TLS
//! handshake, and a deadline for each request's header, which also closes a connection
//! left idle between requests. Connections are hyper's (HTTP/1.1), timed by hyper-util's
//! Tokio timer and shut down gracefully with hyper-util's `GracefulShutdown`.
//!
//! [`bind`] makes the listeners: the unspecified IPv6 address (`[::]`, what `:PORT`
//! means) listens on IPv4 and IPv6 alike, falling back to IPv4 only on a host without IPv6.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Bounds on what one client can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once (those in a TLS handshake included); more wait in the
    /// listen backlog until one closes.
    pub max_connections: usize,
    /// A request's header must have arrived this long after the connection became ready
    /// for it (accepted, handshake done, or the previous response sent), else the
    /// connection is closed: it bounds both slow headers and idle keep-alive connections.
    pub header_read_timeout: Duration,
    /// A TLS client must finish its handshake within this.
    pub tls_handshake_timeout: Duration,
}

/// 256 connections, 10 s for a header (the kubelet, Prometheus and the API server send
/// theirs at once; Prometheus and the API server reconnect when an idle connection was
/// closed), 10 s for a TLS handshake.
impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Every address of the host, IPv4 and IPv6, on `port`: what `:PORT` means (see [`bind`]).
pub fn any_address(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
}

/// Listens on `addr`. The unspecified IPv6 address ([`any_address`]) gets one dual-stack
/// socket, reached over IPv4 and IPv6 whatever the host's `net.ipv6.bindv6only`; on a host
/// without IPv6 it falls back to `0.0.0.0` (an address in use or a port not allowed is
/// an error all the same). Any other address is bound as it is. Needs a Tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    bind_with(addr, dual_stack)
}

fn bind_with(
    addr: SocketAddr,
    dual_stack: impl FnOnce(SocketAddr) -> io::Result<std::net::TcpListener>,
) -> io::Result<TcpListener> {
    let listener = if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        match dual_stack(addr) {
            Ok(listener) => listener,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
                ) =>
            {
                return Err(err);
            }
            Err(err) => {
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
                tracing::info!(%err, %addr, fallback = %v4, "no IPv6 on this host, listening on IPv4 only");
                std::net::TcpListener::bind(v4)?
            }
        }
    } else {
        std::net::TcpListener::bind(addr)?
    };
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

fn dual_stack(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    // As std and Tokio do on Unix: a restarted server can bind a port in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Serves `router` on `listener` (over TLS when `tls` is given) within `limits` until
/// `shutdown`; then stops accepting, lets requests in progress finish and closes idle
/// connections, and returns once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::debug!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let watcher = graceful.watcher();
        let http = http.clone();
        let service = TowerToHyperService::new(router.clone());
        let acceptor = acceptor.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let result = match acceptor {
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(tcp), service))
                        .await
                }
                Some(acceptor) => {
                    let Some(stream) =
                        handshake(acceptor, tcp, peer, limits.tls_handshake_timeout, &shutdown)
                            .await
                    else {
                        return;
                    };
                    watcher
                        .watch(http.serve_connection(TokioIo::new(stream), service))
                        .await
                }
            };
            if let Err(err) = result {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    tokio::select! {
        _ = shutdown.cancelled() => None,
        done = tokio::time::timeout(timeout, acceptor.accept(tcp)) => match done {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(err)) => {
                tracing::debug!(%peer, %err, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use axum::routing::get;

    use super::*;
    use crate::test_http;

    fn refused(addr: SocketAddr) -> bool {
        std::net::TcpStream::connect(addr).is_err()
    }

    /// `any_address(0)` is reached over 127.0.0.1 and, on a host with IPv6, over [::1].
    #[tokio::test]
    async fn any_address_listens_on_ipv4_and_ipv6() {
        let listener = bind(any_address(0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(!refused(SocketAddr::from(([127, 0, 0, 1], port))));
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            assert!(!refused(SocketAddr::from((Ipv6Addr::LOCALHOST, port))));
        } else {
            assert_eq!(listener.local_addr().unwrap().ip(), Ipv4Addr::UNSPECIFIED);
        }
        // A given address is bound as it is: IPv4 only.
        let v4 = bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let port = v4.local_addr().unwrap().port();
        assert!(refused(SocketAddr::from((Ipv6Addr::LOCALHOST, port))));
    }

    /// Where IPv6 sockets cannot be made, `any_address` falls back to every IPv4 address;
    /// a port already in use is an error, not a fallback.
    #[tokio::test]
    async fn without_ipv6_any_address_falls_back_to_ipv4() {
        let no_ipv6 = |_| Err(io::Error::from_raw_os_error(97)); // EAFNOSUPPORT
        let listener = bind_with(any_address(0), no_ipv6).unwrap();
        let local = listener.local_addr().unwrap();
        assert_eq!(local.ip(), Ipv4Addr::UNSPECIFIED);
        assert!(!refused(SocketAddr::from(([127, 0, 0, 1], local.port()))));

        let in_use = |_| Err(io::Error::from(io::ErrorKind::AddrInUse));
        let err = bind_with(any_address(0), in_use).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let taken = bind(any_address(0)).unwrap();
        let err = bind(taken.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    /// With the cap reached by clients that send nothing (and a header deadline too long
    /// to matter), a further client's request waits unanswered; it is served as soon as
    /// one of them leaves.
    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnectionLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(3600),
            ..ConnectionLimits::default()
        };
        let shutdown = CancellationToken::new();
        let router = Router::new().route("/", get(|| async { "ok" }));
        let server = tokio::spawn(serve(listener, None, router, limits, shutdown.clone()));

        let mut idle = test_http::stalled(addr, 2).await;
        let waiting = tokio::spawn(test_http::get(addr, "/", &[]));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "a third connection was served");
        idle.pop();
        let r = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        // Shutdown closes the idle connection that is left and returns.
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("the server stops")
            .unwrap();
        assert_eq!(
            test_http::closed_by_server(idle, Duration::from_secs(30)).await,
            1
        );
    }
}
