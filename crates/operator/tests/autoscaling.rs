//! `spec.autoscaling` on the real control plane (both pinned versions): the operator's
//! HorizontalPodAutoscaler is run by kube-controller-manager's own HPA controller, which
//! reads the pods' use from `metrics.k8s.io` and writes `spec.size` through the Memcached's
//! scale subresource; the operator follows with the Deployment.
//!
//! The metrics come from a small metrics API in this test, registered as metrics-server is
//! (an APIService for `metrics.k8s.io/v1beta1`), behind an ExternalName Service naming
//! `localhost`, which the API server's aggregator resolves like a cluster IP. It reports each
//! pod's memcached container at a share of that container's memory request that the test
//! sets; nothing here computes what the HPA decides.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use envtest::Kube;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_api::validation::parse_quantity_bytes;
use memcached_api::{Memcached, SCALE_DOWN_PERIOD_SECONDS};
use memcached_operator::controller::{self, ControllerConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

mod common;
use common::cluster::{Cluster, Server};
use common::wait_for_within;

/// The HPA controller looks every 15 s and scales up at most to double per step; a pool of
/// 1 reaches 4 in two or three looks.
const DEADLINE: Duration = Duration::from_secs(300);
const APISERVICE: &str = "v1beta1.metrics.k8s.io";

on_both_versions! {
/// Above its memory target the HPA grows the pool to `maxReplicas` through `spec.size`,
/// the operator's Deployment following; below it, the HPA removes one pod, not three at
/// once (the scale-down policy); the status says who sizes the pool.
async fn the_autoscaler_sizes_the_pool_from_the_metrics_api(kube: Kube) {
    let server = match kube {
        Kube::Oldest => Server::Oldest,
        _ => Server::Newest,
    };
    let cluster = Cluster::start(server, "autoscaler_sizes_the_pool", |b| b, false).await;
    let client = cluster.client.clone();
    let usage_percent = Arc::new(AtomicU32::new(90));
    let port = serve_metrics(client.clone(), usage_percent.clone()).await;
    register_metrics_api(&client, port).await;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller::run(
        client.clone(),
        ControllerConfig {
            namespace: cluster.watch_namespace(),
            ..ControllerConfig::default()
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let memcacheds: Api<Memcached> = cluster.api();
    let autoscaling = json!({"minReplicas": 1, "maxReplicas": 4,
        "targetMemoryUtilizationPercentage": 50, "scaleDownStabilizationSeconds": 0});
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "auto"},
        "spec": {"size": 1, "rollout": {"minReadySeconds": 0}, "autoscaling": autoscaling},
    });
    memcacheds
        .patch("auto", &PatchParams::apply("test").force(), &Patch::Apply(&mc))
        .await
        .expect("apply");

    // 90 % of the request against a 50 % target: up to the maximum, by the HPA alone.
    let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let size_now = || {
        let (memcacheds, sizes) = (memcacheds.clone(), sizes.clone());
        async move {
            let mc = memcacheds.get("auto").await.ok()?;
            let mut seen = sizes.lock().ok()?;
            if seen.last() != Some(&mc.spec.size) {
                seen.push(mc.spec.size);
            }
            Some(mc)
        }
    };
    let mc = wait_for_within("the HPA to size the pool at 4", DEADLINE, || async {
        size_now().await.filter(|mc| mc.spec.size == 4)
    })
    .await;
    assert_eq!(
        mc.status.and_then(|s| s.size_managed_by).as_deref(),
        Some("HorizontalPodAutoscaler/auto")
    );
    let deployments: Api<Deployment> = cluster.api();
    wait_for_within("the Deployment at 4", DEADLINE, || async {
        let d = deployments.get("auto").await.ok()?;
        (d.spec?.replicas == Some(4)).then_some(())
    })
    .await;
    let hpa = cluster
        .api::<HorizontalPodAutoscaler>()
        .get("auto")
        .await
        .expect("the HPA");
    let active = hpa
        .status
        .clone()
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "ScalingActive")
        .map(|c| (c.status, c.message));
    assert_eq!(
        active.as_ref().map(|(s, _)| s.as_str()),
        Some("True"),
        "{active:?}"
    );

    // 10 %: the HPA would want 1 pod, but removes one a minute. Its rate counts from the
    // pods of a minute ago, scale-ups included, so the test lets the last one age first.
    let last_scale = hpa
        .status
        .as_ref()
        .and_then(|s| s.last_scale_time.as_ref())
        .map(|t| t.0)
        .expect("the HPA's last scale time");
    let aged = last_scale + Duration::from_secs(SCALE_DOWN_PERIOD_SECONDS as u64 + 5);
    if let Ok(left) = aged.duration_since(jiff::Timestamp::now()).try_into() {
        tokio::time::sleep(left).await;
    }
    usage_percent.store(10, Ordering::SeqCst);
    wait_for_within("the HPA to remove a pod", DEADLINE, || async {
        size_now().await.filter(|mc| mc.spec.size < 4)
    })
    .await;
    let seen = sizes.lock().expect("sizes").clone();
    assert_eq!(seen.first(), Some(&1), "{seen:?}");
    assert_eq!(seen.last(), Some(&3), "one pod at a time: {seen:?}");
    // Up without a step back, to the maximum, then one pod down.
    let (up, down) = seen.split_at(seen.len() - 1);
    assert!(up.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
    assert_eq!((up.last(), down), (Some(&4), &[3][..]), "{seen:?}");

    let _ = stop_tx.send(());
    let _ = task.await;
    // The shared control plane keeps no API group whose server is gone.
    let _ = Api::<APIService>::all(client.clone())
        .delete(APISERVICE, &DeleteParams::default())
        .await;
}
}

/// Registers the test's metrics API as `metrics.k8s.io/v1beta1` and waits until the
/// aggregator has found it available.
async fn register_metrics_api(client: &Client, port: u16) {
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "test-metrics", "namespace": "kube-system"},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": i32::from(port)}]},
    });
    services
        .patch(
            "test-metrics",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&service),
        )
        .await
        .expect("the metrics Service");
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                 "insecureSkipTLSVerify": true,
                 "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"name": "test-metrics", "namespace": "kube-system",
                             "port": i32::from(port)}},
    });
    let apiservices: Api<APIService> = Api::all(client.clone());
    apiservices
        .patch(
            APISERVICE,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&apiservice),
        )
        .await
        .expect("the APIService");
    wait_for_within("the metrics API available", DEADLINE, || async {
        let s = apiservices.get(APISERVICE).await.ok()?;
        let available = s
            .status?
            .conditions?
            .into_iter()
            .any(|c| c.type_ == "Available" && c.status == "True");
        available.then_some(())
    })
    .await;
}

/// Serves `metrics.k8s.io/v1beta1` over TLS on a loopback port: discovery, and each pod's
/// memcached container at `usage_percent` of its memory request (the pods listed from the
/// API server with the request's own label selector). Returns the port.
async fn serve_metrics(client: Client, usage_percent: Arc<AtomicU32>) -> u16 {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let cert = CertificateDer::from(certified.cert.der().to_vec());
    let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("certificate");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, client, usage) =
                (acceptor.clone(), client.clone(), usage_percent.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut stream = BufReader::new(tls);
                let mut request_line = String::new();
                if stream.read_line(&mut request_line).await.is_err() {
                    return;
                }
                loop {
                    let mut header = String::new();
                    match stream.read_line(&mut header).await {
                        Ok(n) if n > 2 => continue,
                        _ => break,
                    }
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or("/");
                let (code, body) = match metrics_response(&client, path, &usage).await {
                    Some(body) => ("200 OK", body),
                    None => ("404 Not Found", json!({"kind": "Status", "code": 404})),
                };
                let body = body.to_string();
                let head = format!(
                    "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let inner = stream.get_mut();
                let _ = inner.write_all(head.as_bytes()).await;
                let _ = inner.write_all(body.as_bytes()).await;
                let _ = inner.shutdown().await;
            });
        }
    });
    port
}

async fn metrics_response(client: &Client, path: &str, usage_percent: &AtomicU32) -> Option<Value> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if path == "/apis/metrics.k8s.io/v1beta1" {
        return Some(json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1",
            "resources": [{"name": "pods", "singularName": "", "namespaced": true,
                           "kind": "PodMetrics", "verbs": ["get", "list"]}],
        }));
    }
    let ns = path
        .strip_prefix("/apis/metrics.k8s.io/v1beta1/namespaces/")?
        .strip_suffix("/pods")?;
    let selector = form_urlencoded::parse(query.as_bytes())
        .find_map(|(k, v)| (k == "labelSelector").then(|| v.into_owned()))
        .unwrap_or_default();
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?;
    let percent = u64::from(usage_percent.load(Ordering::SeqCst));
    let now = jiff::Timestamp::now().to_string();
    let items: Vec<Value> = pods
        .items
        .iter()
        .map(|pod| {
            let containers: Vec<Value> = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| {
                    let request = c
                        .resources
                        .as_ref()
                        .and_then(|r| r.requests.as_ref())
                        .and_then(|r| r.get("memory"))
                        .and_then(|q| parse_quantity_bytes(&q.0))
                        .unwrap_or(0);
                    let used = request / 100 * percent;
                    json!({"name": c.name, "usage": {"cpu": "1m", "memory": used.to_string()}})
                })
                .collect();
            json!({
                "metadata": {"name": pod.name_any(), "namespace": ns,
                             "labels": pod.labels()},
                "timestamp": now, "window": "30s", "containers": containers,
            })
        })
        .collect();
    Some(json!({
        "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {}, "items": items,
    }))
}
