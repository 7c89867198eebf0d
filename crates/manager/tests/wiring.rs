//! The pieces wired together the way the operator's `main` does (see README):
//! probes, insecure metrics, leader election on apisim, graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use manager::{Health, LeaderElectionConfig, Metrics, MetricsServer, MetricsServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

#[tokio::test]
async fn probes_metrics_and_leader_election_together() {
    let api = apisim::ApiServer::new();
    let shutdown = CancellationToken::new();
    let metrics = Metrics::new();
    let health = Health::new();
    health.set_healthy("ping", true);
    health.set_ready("leader-or-standby", false);

    let probe_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let probe_addr = probe_listener.local_addr().unwrap();
    let probes = tokio::spawn(manager::health::serve_probes_on(
        probe_listener,
        health.clone(),
        shutdown.clone(),
    ));

    let cfg = MetricsServerConfig {
        bind: manager::metrics_server::parse_bind_address("127.0.0.1:0").unwrap(),
        secure: false,
        cert_dir: None,
    };
    let server = MetricsServer::bind(&cfg, None, &shutdown)
        .await
        .unwrap()
        .unwrap();
    let metrics_addr = server.local_addr().unwrap();
    let metrics_task = tokio::spawn(server.run(metrics.clone(), shutdown.clone()));

    assert_eq!(get(probe_addr, "/readyz").await.0, 500);
    health.set_ready("leader-or-standby", true);
    assert_eq!(get(probe_addr, "/readyz").await.0, 200);

    let leader_cfg = LeaderElectionConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1400),
        retry_period: Duration::from_millis(200),
        ..LeaderElectionConfig::new("memcached-operator-lock", "default")
    };
    let (m, sd) = (metrics.clone(), shutdown.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let leader = tokio::spawn(async move {
        manager::run_as_leader(api.client(), Some(leader_cfg), &m, sd, |token| async move {
            let _ = started_tx.send(());
            token.cancelled().await;
            Ok::<(), std::io::Error>(())
        })
        .await
    });
    tokio::time::timeout(Duration::from_secs(60), started_rx)
        .await
        .unwrap()
        .unwrap();

    let (status, body) = get(metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    // Written by the leader election itself (the controller's own series, from a real
    // reconcile, are checked on the operator's binary: `crates/operator/tests/manager.rs`,
    // `metrics_need_an_authorized_token_unless_insecure`).
    let series = r#"leader_election_master_status{name="memcached-operator-lock"} 1"#;
    assert!(body.contains(series), "{series} missing in\n{body}");

    shutdown.cancel();
    let all = async {
        leader.await.unwrap().unwrap();
        metrics_task.await.unwrap().unwrap();
        probes.await.unwrap().unwrap();
    };
    manager::shutdown::with_timeout(Duration::from_secs(60), all)
        .await
        .unwrap();
}
