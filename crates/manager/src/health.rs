//! Liveness and readiness probes: named boolean checks set by the program, served as
//! `/healthz` and `/readyz` with controller-runtime's healthz output (`[+]name ok`,
//! `[-]name failed`), including `?verbose`, `?exclude=name` and `/readyz/<name>`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::serve::ConnectionLimits;

/// Errors of the probe server, naming the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the probe address failed.
    #[error("binding health probe address {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving health probes: {0}")]
    Serve(#[source] std::io::Error),
}

#[derive(Debug, Default)]
struct Checks {
    healthy: BTreeMap<String, bool>,
    ready: BTreeMap<String, bool>,
}

/// Named liveness and readiness checks. Cheap to clone; all clones share state.
///
/// With no checks registered a probe passes (controller-runtime registers a
/// `ping` check that always passes; this is the same).
#[derive(Debug, Clone, Default)]
pub struct Health {
    checks: Arc<RwLock<Checks>>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Healthz,
    Readyz,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Healthz => "healthz",
            Kind::Readyz => "readyz",
        }
    }
}

impl Health {
    /// No checks yet: both probes pass.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or adds) readiness check `name`.
    pub fn set_ready(&self, name: &str, ok: bool) {
        self.write(|c| c.ready.insert(name.to_string(), ok));
    }

    /// Sets (or adds) liveness check `name`.
    pub fn set_healthy(&self, name: &str, ok: bool) {
        self.write(|c| c.healthy.insert(name.to_string(), ok));
    }

    /// True when every readiness check passes.
    pub fn is_ready(&self) -> bool {
        self.snapshot(Kind::Readyz).values().all(|ok| *ok)
    }

    /// True when every liveness check passes.
    pub fn is_healthy(&self) -> bool {
        self.snapshot(Kind::Healthz).values().all(|ok| *ok)
    }

    fn write<R>(&self, f: impl FnOnce(&mut Checks) -> R) -> R {
        let mut guard = self.checks.write().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    fn snapshot(&self, kind: Kind) -> BTreeMap<String, bool> {
        let guard = self.checks.read().unwrap_or_else(|p| p.into_inner());
        match kind {
            Kind::Healthz => guard.healthy.clone(),
            Kind::Readyz => guard.ready.clone(),
        }
    }

    /// Router serving `/healthz`, `/healthz/{name}`, `/readyz`, `/readyz/{name}`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(healthz))
            .route("/healthz/{name}", get(healthz_one))
            .route("/readyz", get(readyz))
            .route("/readyz/{name}", get(readyz_one))
            .with_state(self.clone())
    }
}

async fn healthz(State(h): State<Health>, RawQuery(q): RawQuery) -> (StatusCode, String) {
    respond(&h, Kind::Healthz, q.as_deref(), None)
}

async fn readyz(State(h): State<Health>, RawQuery(q): RawQuery) -> (StatusCode, String) {
    respond(&h, Kind::Readyz, q.as_deref(), None)
}

async fn healthz_one(
    State(h): State<Health>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> (StatusCode, String) {
    respond(&h, Kind::Healthz, q.as_deref(), Some(&name))
}

async fn readyz_one(
    State(h): State<Health>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> (StatusCode, String) {
    respond(&h, Kind::Readyz, q.as_deref(), Some(&name))
}

/// Renders a probe response the way controller-runtime's `healthz.Handler` does.
fn respond(
    h: &Health,
    kind: Kind,
    query: Option<&str>,
    only: Option<&str>,
) -> (StatusCode, String) {
    let mut verbose = false;
    let mut excluded: Vec<&str> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "verbose" => verbose = v != "false" && v != "0",
            "exclude" => excluded.extend(v.split(',').filter(|s| !s.is_empty())),
            _ => {}
        }
    }
    let checks = h.snapshot(kind);
    if let Some(name) = only {
        return match checks.get(name) {
            None => (StatusCode::NOT_FOUND, format!("no such check: {name}\n")),
            Some(true) => (StatusCode::OK, "ok".to_string()),
            Some(false) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: check {name} failed\n"),
            ),
        };
    }
    let mut body = String::new();
    let mut failed = false;
    for (name, ok) in &checks {
        if excluded.contains(&name.as_str()) {
            body.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        if *ok {
            body.push_str(&format!("[+]{name} ok\n"));
        } else {
            failed = true;
            body.push_str(&format!("[-]{name} failed: reason withheld\n"));
        }
    }
    if failed {
        body.push_str(&format!("{} check failed\n", kind.name()));
        tracing::info!(probe = kind.name(), "probe failed");
        (StatusCode::INTERNAL_SERVER_ERROR, body)
    } else if verbose {
        body.push_str(&format!("{} check passed\n", kind.name()));
        (StatusCode::OK, body)
    } else {
        (StatusCode::OK, "ok".to_string())
    }
}

/// Serves the probes on `addr` until `shutdown` is cancelled.
pub async fn serve_probes(
    addr: SocketAddr,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let listener = crate::serve::bind(addr).map_err(|source| Error::Bind { addr, source })?;
    serve_probes_on(listener, health, shutdown).await
}

/// Like [`serve_probes`] on an already bound listener (tests bind port 0).
pub async fn serve_probes_on(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    serve_probes_with(listener, health, ConnectionLimits::default(), shutdown).await
}

/// Like [`serve_probes_on`] within `limits` instead of the defaults.
pub async fn serve_probes_with(
    listener: tokio::net::TcpListener,
    health: Health,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving health probes");
    }
    crate::serve::serve(listener, None, health.router(), limits, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::test_http::get;

    #[tokio::test]
    async fn probes_flip_from_500_to_200() {
        let health = Health::new();
        health.set_healthy("ping", true);
        health.set_ready("informers-synced", false);
        health.set_ready("webhook", true);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_probes_on(listener, health.clone(), shutdown.clone()));

        let r = get(addr, "/healthz", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        let r = get(addr, "/readyz", &[]).await;
        assert_eq!(r.status, 500);
        assert!(r.body.contains("[-]informers-synced failed"), "{}", r.body);
        assert!(r.body.contains("[+]webhook ok"), "{}", r.body);
        assert_eq!(get(addr, "/readyz/informers-synced", &[]).await.status, 500);
        assert_eq!(get(addr, "/readyz/webhook", &[]).await.status, 200);
        assert_eq!(get(addr, "/readyz/nope", &[]).await.status, 404);
        assert_eq!(
            get(addr, "/readyz?exclude=informers-synced", &[])
                .await
                .status,
            200
        );

        health.set_ready("informers-synced", true);
        let r = get(addr, "/readyz", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        let r = get(addr, "/readyz?verbose", &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body,
            "[+]informers-synced ok\n[+]webhook ok\nreadyz check passed\n"
        );

        health.set_healthy("ping", false);
        assert_eq!(get(addr, "/healthz", &[]).await.status, 500);

        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// More clients than the connection cap that connect and never finish a request are
    /// all disconnected by the server, and a probe is answered all the same.
    #[tokio::test]
    async fn stalled_clients_beyond_the_cap_are_disconnected() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let limits = ConnectionLimits {
            max_connections: 4,
            header_read_timeout: Duration::from_secs(1),
            ..ConnectionLimits::default()
        };
        let server = tokio::spawn(serve_probes_with(
            listener,
            Health::new(),
            limits,
            shutdown.clone(),
        ));

        let idle = crate::test_http::stalled(addr, 8).await;
        let probe = tokio::time::timeout(Duration::from_secs(30), get(addr, "/healthz", &[]))
            .await
            .expect("the probe is answered");
        assert_eq!(probe.status, 200);
        let closed = crate::test_http::closed_by_server(idle, Duration::from_secs(30)).await;
        assert_eq!(closed, 8, "stalled connections closed by the server");

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[test]
    fn no_checks_pass() {
        let h = Health::new();
        assert!(h.is_ready() && h.is_healthy());
        assert_eq!(respond(&h, Kind::Readyz, None, None).0, StatusCode::OK);
    }
}
