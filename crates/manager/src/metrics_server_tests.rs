use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::api::{Api, PostParams};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::*;
use crate::test_http::{self, Response};
use crate::test_util::TempDir;

/// Tokens: "alice" is valid and allowed, "bob" valid but denied, anything else invalid,
/// "boom" makes the TokenReview fail.
#[derive(Default)]
struct FakeAuth {
    authn_calls: AtomicUsize,
    authz_calls: AtomicUsize,
}

impl Authorizer for FakeAuth {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, AuthError>> {
        Box::pin(async move {
            self.authn_calls.fetch_add(1, Ordering::SeqCst);
            match token {
                "alice" | "bob" => Ok(Some(UserInfo {
                    username: format!("system:serviceaccount:monitoring:{token}"),
                    ..Default::default()
                })),
                "boom" => Err(AuthError::Other("api down".into())),
                _ => Ok(None),
            }
        })
    }
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>> {
        Box::pin(async move {
            self.authz_calls.fetch_add(1, Ordering::SeqCst);
            Ok(user.username.ends_with(":alice") && verb == "get" && path == "/metrics")
        })
    }
}

struct Running {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

async fn start(
    tls: Option<Arc<ServerConfig>>,
    auth: Option<Arc<CachingAuthorizer>>,
    shutdown: CancellationToken,
) -> Running {
    let metrics = Metrics::new();
    metrics.controller("memcached");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(serve_metrics_on(
        listener,
        tls,
        metrics,
        auth,
        shutdown.clone(),
    ));
    Running {
        addr,
        shutdown,
        task,
    }
}

fn assert_metrics_body(r: &Response) {
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some(CONTENT_TYPE));
    assert!(
        r.body.contains(
            r#"controller_runtime_reconcile_total{controller="memcached",result="success"} 0"#
        ),
        "{}",
        r.body
    );
    assert!(r.body.contains("process_start_time_seconds"), "{}", r.body);
}

#[tokio::test]
async fn secure_mode_authenticates_and_authorizes() {
    let fake = Arc::new(FakeAuth::default());
    let auth = Arc::new(CachingAuthorizer::new(fake.clone(), AUTH_CACHE_TTL));
    let tls = webhook_tls::self_signed_server_config().unwrap();
    let srv = start(Some(tls), Some(auth), CancellationToken::new()).await;

    let (r, _) = test_http::tls::get(srv.addr, "/metrics", &[]).await;
    assert_eq!(r.status, 401, "no token");
    let (r, _) = test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Basic abc")]).await;
    assert_eq!(r.status, 401, "not a bearer token");
    let (r, _) =
        test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Bearer mallory")]).await;
    assert_eq!(r.status, 401, "token failing TokenReview");
    let (r, _) =
        test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Bearer bob")]).await;
    assert_eq!(r.status, 403, "SubjectAccessReview denied");
    assert!(r.body.contains("monitoring:bob"), "{}", r.body);
    let (r, _) =
        test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Bearer boom")]).await;
    assert_eq!(r.status, 500, "review call failed");
    let (r, _) =
        test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Bearer alice")]).await;
    assert_metrics_body(&r);

    // The decision for alice is cached: a second scrape makes no API calls.
    let before = (
        fake.authn_calls.load(Ordering::SeqCst),
        fake.authz_calls.load(Ordering::SeqCst),
    );
    let (r, _) =
        test_http::tls::get(srv.addr, "/metrics", &[("Authorization", "Bearer alice")]).await;
    assert_eq!(r.status, 200);
    let after = (
        fake.authn_calls.load(Ordering::SeqCst),
        fake.authz_calls.load(Ordering::SeqCst),
    );
    assert_eq!(before, after);
    srv.stop().await;
}

/// On Tokio's paused clock (which the cache reads), so the two checks inside the TTL and the
/// one after it are exactly that however slowly the machine runs.
#[tokio::test(start_paused = true)]
async fn cache_expires() {
    let fake = Arc::new(FakeAuth::default());
    let auth = CachingAuthorizer::new(fake.clone(), Duration::from_millis(100));
    assert_eq!(
        auth.check("alice", "get", "/metrics").await.unwrap(),
        Decision::Allowed
    );
    assert_eq!(
        auth.check("alice", "get", "/metrics").await.unwrap(),
        Decision::Allowed
    );
    assert_eq!(fake.authn_calls.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_millis(99)).await;
    assert_eq!(
        auth.check("alice", "get", "/metrics").await.unwrap(),
        Decision::Allowed
    );
    assert_eq!(
        fake.authn_calls.load(Ordering::SeqCst),
        1,
        "cached until the TTL ends"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        auth.check("alice", "get", "/metrics").await.unwrap(),
        Decision::Allowed
    );
    assert_eq!(
        fake.authn_calls.load(Ordering::SeqCst),
        2,
        "reviewed again once the TTL ended"
    );
    // Errors are not cached.
    assert!(auth.check("boom", "get", "/metrics").await.is_err());
    assert!(auth.check("boom", "get", "/metrics").await.is_err());
    assert_eq!(fake.authn_calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn insecure_mode_serves_plain_http_without_token() {
    let srv = start(None, None, CancellationToken::new()).await;
    let r = test_http::get(srv.addr, "/metrics", &[]).await;
    assert_metrics_body(&r);
    assert_eq!(test_http::get(srv.addr, "/other", &[]).await.status, 404);
    srv.stop().await;
}

#[tokio::test]
async fn serves_new_certificate_after_files_change() {
    let dir = TempDir::new("metrics-cert");
    let write = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let pem = webhook_tls::generate_self_signed(&names).unwrap();
        std::fs::write(dir.path().join(webhook_tls::CERT_FILE), &pem.cert_pem).unwrap();
        std::fs::write(dir.path().join(webhook_tls::KEY_FILE), &pem.key_pem).unwrap();
        CertificateDer::from_pem_slice(pem.cert_pem.as_bytes()).unwrap()
    };
    let first = write(&["localhost"]);
    let shutdown = CancellationToken::new();
    let tls = webhook_tls::server_config_from_dir(
        dir.path(),
        Duration::from_millis(100),
        shutdown.clone(),
    )
    .unwrap();
    let srv = start(Some(tls), None, shutdown).await;

    let (r, served) = test_http::tls::get(srv.addr, "/metrics", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(served, first);

    let second = write(&["localhost", "metrics.example"]);
    assert_ne!(first, second);
    // The files are polled every 100 ms; the deadline only bounds a broken reload.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, served) = test_http::tls::get(srv.addr, "/metrics", &[]).await;
        if served == second {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new certificate not served within 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    srv.stop().await;
}

#[tokio::test]
async fn serve_metrics_disabled_returns_at_once() {
    let config = MetricsServerConfig {
        bind: None,
        ..Default::default()
    };
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        serve_metrics(config, Metrics::new(), None, CancellationToken::new()),
    )
    .await
    .unwrap();
    assert!(r.is_ok());
}

#[tokio::test]
async fn secure_mode_without_client_is_an_error() {
    let config = MetricsServerConfig {
        bind: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let r = serve_metrics(config, Metrics::new(), None, CancellationToken::new()).await;
    assert!(matches!(r, Err(Error::NoClient)));
}

#[tokio::test]
async fn serve_metrics_insecure_binds_and_stops() {
    let config = MetricsServerConfig {
        bind: Some("127.0.0.1:0".parse().unwrap()),
        secure: false,
        cert_dir: None,
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve_metrics(
        config,
        Metrics::new(),
        None,
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn parses_controller_runtime_addresses() {
    assert_eq!(parse_bind_address("0").unwrap(), None);
    assert_eq!(
        parse_bind_address(":8443").unwrap(),
        Some("[::]:8443".parse().unwrap())
    );
    assert_eq!(
        parse_bind_address("127.0.0.1:0").unwrap(),
        Some("127.0.0.1:0".parse().unwrap())
    );
    assert_eq!(
        parse_bind_address("[::1]:8080").unwrap(),
        Some("[::1]:8080".parse().unwrap())
    );
    assert_eq!(
        parse_bind_address("localhost:8080").unwrap(),
        Some("127.0.0.1:8080".parse().unwrap())
    );
    for bad in ["", ":", ":http", "8443", "example.com:80", ":99999"] {
        assert!(parse_bind_address(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        MetricsServerConfig::default().bind,
        Some(DEFAULT_SECURE_BIND)
    );
    assert!(MetricsServerConfig::default().secure);
}

/// The real `KubeAuthorizer` (TokenReview + SubjectAccessReview) against apisim's RBAC,
/// through `MetricsServer::bind` in secure mode with a self-signed certificate.
#[tokio::test]
async fn secure_mode_end_to_end_with_kube_reviews() {
    let api = apisim_with_prometheus().await;
    let client = api.client();
    let config = MetricsServerConfig {
        bind: Some("127.0.0.1:0".parse().unwrap()),
        secure: true,
        cert_dir: None,
    };
    let shutdown = CancellationToken::new();
    let server = MetricsServer::bind(&config, Some(client), &shutdown)
        .await
        .unwrap()
        .unwrap();
    let addr = server.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let metrics = Metrics::new();
    metrics.controller("memcached");
    let task = tokio::spawn(server.run(metrics, shutdown.clone()));

    let (r, _) = test_http::tls::get(addr, "/metrics", &[]).await;
    assert_eq!(r.status, 401);
    let (r, _) = test_http::tls::get(addr, "/metrics", &[("Authorization", "Bearer forged")]).await;
    assert_eq!(r.status, 401);
    let (r, _) = test_http::tls::get(
        addr,
        "/metrics",
        &[("Authorization", "Bearer nobody-token")],
    )
    .await;
    assert_eq!(r.status, 403);
    let (r, _) =
        test_http::tls::get(addr, "/metrics", &[("Authorization", "Bearer prom-token")]).await;
    assert_metrics_body(&r);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// apisim with RBAC letting `prom-token` (monitoring/prometheus) `get /metrics`, and
/// `nobody-token` authenticated but allowed nothing.
async fn apisim_with_prometheus() -> apisim::ApiServer {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let api = apisim::ApiServer::new();
    api.allow_token(
        "prom-token",
        "system:serviceaccount:monitoring:prometheus",
        &["system:serviceaccounts"],
    );
    api.allow_token("nobody-token", "system:serviceaccount:default:nobody", &[]);
    let client = api.client();
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "prometheus-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    api
}

/// (TokenReviews, SubjectAccessReviews) the API server has received.
fn reviews(api: &apisim::ApiServer) -> (u64, u64) {
    let counts = api.request_counts();
    (
        counts.get("create", "tokenreviews"),
        counts.get("create", "subjectaccessreviews"),
    )
}

async fn scrape(addr: SocketAddr, token: &str) -> Response {
    let bearer = format!("Bearer {token}");
    test_http::get(addr, "/metrics", &[("Authorization", bearer.as_str())]).await
}

/// A flood of distinct junk bearer tokens costs at most the review budget in TokenReviews
/// (the rest are answered 429 without one), and the cached decision for the authorized
/// scraper survives it: its next scrape makes no review at all.
#[tokio::test]
async fn a_flood_of_junk_tokens_costs_at_most_the_review_budget() {
    const BUDGET: u64 = 10;
    // More than the 1024 decisions a cache keeps, so a shared cache would be cleared.
    const FLOOD: usize = 1100;
    let api = apisim_with_prometheus().await;
    let kube: Arc<dyn Authorizer> = Arc::new(KubeAuthorizer::new(api.client()));
    // A budget that does not refill during the test, so the bound is a count.
    let limits = ReviewLimits {
        burst: BUDGET as u32,
        refill: Duration::from_secs(3600),
        ..ReviewLimits::default()
    };
    let auth = Arc::new(CachingAuthorizer::with_limits(kube, limits));
    let srv = start(None, Some(auth), CancellationToken::new()).await;

    assert_metrics_body(&scrape(srv.addr, "prom-token").await);
    assert_eq!(
        reviews(&api),
        (1, 1),
        "the scraper's first request is reviewed"
    );

    let statuses: Vec<u16> = futures::stream::iter(0..FLOOD)
        .map(|i| async move { scrape(srv.addr, &format!("junk-{i}")).await.status })
        .buffer_unordered(8)
        .collect()
        .await;
    let refused = statuses.iter().filter(|s| **s == 429).count();
    let unauthenticated = statuses.iter().filter(|s| **s == 401).count();
    assert_eq!(
        refused + unauthenticated,
        FLOOD,
        "only 401 and 429: {statuses:?}"
    );
    let (token_reviews, _) = reviews(&api);
    assert!(
        token_reviews - 1 <= BUDGET,
        "{FLOOD} junk tokens cost {} TokenReviews, more than the budget of {BUDGET}",
        token_reviews - 1
    );

    let before = reviews(&api);
    assert_metrics_body(&scrape(srv.addr, "prom-token").await);
    assert_eq!(
        reviews(&api),
        before,
        "the scraper's decision was evicted by the flood"
    );
    srv.stop().await;
}

/// While the API server holds TokenReviews unanswered, at most the concurrency limit of
/// them are in flight: further unknown tokens are refused at once (429) without a review,
/// and each is answered once the API server answers.
#[tokio::test]
async fn reviews_of_unknown_tokens_in_flight_are_limited() {
    let api = apisim_with_prometheus().await;
    let kube: Arc<dyn Authorizer> = Arc::new(KubeAuthorizer::new(api.client()));
    let limits = ReviewLimits {
        concurrent: 4,
        timeout: Duration::from_secs(3600),
        ..ReviewLimits::default()
    };
    let srv = start(
        None,
        Some(Arc::new(CachingAuthorizer::with_limits(kube, limits))),
        CancellationToken::new(),
    )
    .await;
    assert_metrics_body(&scrape(srv.addr, "prom-token").await);
    api.inject(apisim::Fault::new().resource("tokenreviews").hang());
    api.reset_request_counts();

    let mut pending: futures::stream::FuturesUnordered<_> = (0..10)
        .map(|i| async move { scrape(srv.addr, &format!("stuck-{i}")).await })
        .collect();
    // Four reviews hang; the six others are answered without one.
    let mut refused = Vec::new();
    for _ in 0..6 {
        let r = pending.next().await.expect("a response");
        refused.push((r.status, r.header("retry-after").map(str::to_string)));
    }
    assert_eq!(refused, vec![(429, Some("1".to_string())); 6]);
    assert_eq!(reviews(&api).0, 4, "TokenReviews in flight");
    api.clear_faults();
    let rest: Vec<u16> = pending.map(|r| r.status).collect().await;
    assert_eq!(rest, vec![401; 4]);
    srv.stop().await;
}

/// Reviews of tokens the API server authenticated before do not spend the budget for
/// unknown ones: a scraper whose decision expired is reviewed again while junk is refused.
#[tokio::test]
async fn a_known_scraper_is_reviewed_when_the_budget_is_spent() {
    let fake = Arc::new(FakeAuth::default());
    let limits = ReviewLimits {
        ttl: Duration::ZERO, // every decision expires at once
        burst: 1,
        refill: Duration::from_secs(3600),
        ..ReviewLimits::default()
    };
    let auth = CachingAuthorizer::with_limits(fake.clone(), limits);
    assert_eq!(
        auth.check("alice", "get", "/metrics").await.unwrap(),
        Decision::Allowed
    );
    assert!(matches!(
        auth.check("mallory", "get", "/metrics").await,
        Err(CheckError::Busy { .. })
    ));
    for _ in 0..3 {
        assert_eq!(
            auth.check("alice", "get", "/metrics").await.unwrap(),
            Decision::Allowed
        );
    }
    assert_eq!(
        fake.authn_calls.load(Ordering::SeqCst),
        4,
        "alice reviewed 4 times"
    );
}

/// A review the API server never answers fails the request (503) after the review
/// timeout instead of holding it forever.
#[tokio::test]
async fn a_review_that_never_returns_times_out() {
    let api = apisim_with_prometheus().await;
    let kube: Arc<dyn Authorizer> = Arc::new(KubeAuthorizer::new(api.client()));
    let limits = ReviewLimits {
        timeout: Duration::from_secs(1),
        ..ReviewLimits::default()
    };
    let srv = start(
        None,
        Some(Arc::new(CachingAuthorizer::with_limits(kube, limits))),
        CancellationToken::new(),
    )
    .await;
    api.inject(apisim::Fault::new().resource("tokenreviews").hang());
    let r = tokio::time::timeout(Duration::from_secs(60), scrape(srv.addr, "stuck"))
        .await
        .expect("a request whose TokenReview hangs is answered");
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(reviews(&api).0, 1);
    api.clear_faults();
    srv.stop().await;
}

/// More clients than the connection cap that connect and never finish a request (no TLS
/// handshake, or a handshake and nothing or half a request after it) are all disconnected
/// by the server, and a scrape is served all the same.
#[tokio::test]
async fn stalled_clients_beyond_the_cap_are_disconnected() {
    use tokio::io::AsyncWriteExt;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Long enough for a real handshake on a busy machine.
    let limits = ConnectionLimits {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(1),
        tls_handshake_timeout: Duration::from_secs(5),
    };
    let shutdown = CancellationToken::new();
    let tls = webhook_tls::self_signed_server_config().unwrap();
    let task = tokio::spawn(serve_metrics_with(
        listener,
        Some(tls),
        Metrics::new(),
        None,
        limits,
        shutdown.clone(),
    ));
    let srv = Running {
        addr,
        shutdown,
        task,
    };

    let no_handshake = test_http::stalled(srv.addr, 4).await;
    let mut after_handshake = Vec::new();
    for i in 0..4 {
        let mut s = test_http::tls::connect(srv.addr).await;
        if i % 2 == 1 {
            // The server may already have given up on it: a failed write is fine.
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHo").await;
            let _ = s.flush().await;
        }
        after_handshake.push(s);
    }
    let (r, _) = tokio::time::timeout(
        Duration::from_secs(30),
        test_http::tls::get(srv.addr, "/metrics", &[]),
    )
    .await
    .expect("the scrape is served");
    assert_eq!(r.status, 200);
    let within = Duration::from_secs(30);
    let closed = tokio::join!(
        test_http::closed_by_server(no_handshake, within),
        test_http::closed_by_server(after_handshake, within)
    );
    assert_eq!(closed, (4, 4), "stalled connections closed by the server");
    srv.stop().await;
}

/// Whether this host can use IPv6 loopback.
fn host_has_ipv6() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// `:PORT` listens on every address, IPv4 and IPv6 alike (as controller-runtime's `:8443`
/// does), so a scraper reaches the server over 127.0.0.1 and over [::1]; on a host without
/// IPv6 it falls back to IPv4 only.
#[tokio::test]
async fn any_address_is_reached_over_ipv4_and_ipv6() {
    let config = MetricsServerConfig {
        bind: parse_bind_address(":0").unwrap(),
        secure: false,
        cert_dir: None,
    };
    let shutdown = CancellationToken::new();
    let server = MetricsServer::bind(&config, None, &shutdown)
        .await
        .unwrap()
        .unwrap();
    let local = server.local_addr().unwrap();
    let task = tokio::spawn(server.run(Metrics::new(), shutdown.clone()));
    let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), local.port());
    assert_eq!(test_http::get(v4, "/metrics", &[]).await.status, 200);
    if host_has_ipv6() {
        let v6 = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), local.port());
        let stream = tokio::net::TcpStream::connect(v6).await;
        assert!(stream.is_ok(), "[::1] refused: {stream:?}");
        assert_eq!(test_http::get(v6, "/metrics", &[]).await.status, 200);
    } else {
        assert_eq!(
            local.ip(),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            "IPv4 fallback"
        );
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
