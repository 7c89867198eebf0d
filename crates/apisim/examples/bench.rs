//! Measure 10,000 creates (with 100 open watches) and a full list.
//!
//! `cargo run -p apisim --example bench` (add `--release` for optimized numbers).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const N: usize = 10_000;
fn watches() -> usize {
    std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100)
}

#[tokio::main]
async fn main() {
    #[allow(non_snake_case)]
    let WATCHES = watches();
    let server = apisim::ApiServer::new();
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let seen = Arc::new(AtomicUsize::new(0));
    let mut watchers = vec![];
    // raw watch streams straight from the tower service (counts ADDED lines without
    // deserializing them, so this measures the server, not kube-rs's JSON decoding)
    for _ in 0..WATCHES {
        let mut svc = server.service();
        let req = http::Request::get(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0",
        )
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
        let resp = tower::Service::call(&mut svc, req).await.expect("watch");
        let seen = seen.clone();
        watchers.push(tokio::spawn(async move {
            use http_body_util::BodyExt;
            let mut body = resp.into_body();
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    let n = data.windows(7).filter(|w| w == b"\"ADDED\"").count();
                    seen.fetch_add(n, Ordering::Relaxed);
                }
            }
        }));
    }
    let t = Instant::now();
    let mut tasks = vec![];
    let per = N / 10;
    for w in 0..10 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("cm-{w}-{i:05}"), "labels": {"w": w.to_string()}},
                    "data": {"k": "v"}
                }))
                .expect("cm");
                api.create(&PostParams::default(), &cm)
                    .await
                    .expect("create");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let create = t.elapsed();

    let t = Instant::now();
    let list = api.list(&ListParams::default()).await.expect("list");
    let list_time = t.elapsed();
    assert_eq!(list.items.len(), N);

    let t = Instant::now();
    let sel = api
        .list(&ListParams::default().labels("w=3"))
        .await
        .expect("list");
    let sel_time = t.elapsed();
    assert_eq!(sel.items.len(), N / 10);

    let t = Instant::now();
    while seen.load(Ordering::Relaxed) < N * WATCHES && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fanout = t.elapsed();
    println!(
        "{N} creates (10 concurrent clients, {WATCHES} open watches): {create:?} ({:.0}/s)",
        N as f64 / create.as_secs_f64()
    );
    println!("full list of {N}: {list_time:?}");
    println!("label-selected list ({} of {N}): {sel_time:?}", N / 10);
    println!(
        "watch events delivered: {} of {} (drained {fanout:?} after the last create)",
        seen.load(Ordering::Relaxed),
        N * WATCHES
    );
    for w in watchers {
        w.abort();
    }
}
