//! Load: 10,000 creates and a full list; 100 concurrent watches all see every event.
//! (Numbers for the README come from `cargo run -p apisim --example bench`.)

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use std::time::{Duration, Instant};

fn cm(name: String) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_creates_and_a_full_list() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let t = Instant::now();
    let mut tasks = vec![];
    for w in 0..8 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..10_000).step_by(8) {
                api.create(&PostParams::default(), &cm(format!("cm-{i:05}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let created = t.elapsed();
    let t = Instant::now();
    let l = api.list(&ListParams::default()).await.unwrap();
    let listed = t.elapsed();
    assert_eq!(l.items.len(), 10_000);
    assert_eq!(l.items[0].metadata.name.as_deref(), Some("cm-00000"));
    eprintln!("10,000 creates: {created:?}; full list: {listed:?}");
    assert!(
        created < Duration::from_secs(60),
        "creates took {created:?}"
    );
    assert!(listed < Duration::from_secs(10), "list took {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_watches() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut watchers = vec![];
    for _ in 0..100 {
        let stream = api.watch(&WatchParams::default(), "0").await.unwrap();
        watchers.push(tokio::spawn(async move {
            let mut stream = Box::pin(stream);
            let mut n = 0;
            while n < 500 {
                match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(_)))) => n += 1,
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            n
        }));
    }
    for i in 0..500 {
        api.create(&PostParams::default(), &cm(format!("w-{i:04}")))
            .await
            .unwrap();
    }
    for w in watchers {
        assert_eq!(w.await.unwrap(), 500);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_deletes_with_gc_running() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..3000 {
        api.create(&PostParams::default(), &cm(format!("d-{i:04}")))
            .await
            .unwrap();
    }
    let t = Instant::now();
    for i in 0..3000 {
        api.delete(&format!("d-{i:04}"), &Default::default())
            .await
            .unwrap();
    }
    let took = t.elapsed();
    eprintln!("3,000 deletes: {took:?}");
    assert!(took < Duration::from_secs(30), "deletes took {took:?}");
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
