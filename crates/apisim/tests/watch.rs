//! Watch: resume from a resourceVersion, 410 Expired, bookmarks, selectors, timeouts,
//! cut_watches, and kube-runtime's watcher/reflector staying in sync.

mod common;
use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use std::time::Duration;

fn cm(name: &str, tier: &str) -> ConfigMap {
    from_json(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
}

fn kind(e: &WatchEvent<ConfigMap>) -> String {
    match e {
        WatchEvent::Added(c) => format!("ADDED {}", c.metadata.name.clone().unwrap()),
        WatchEvent::Modified(c) => format!("MODIFIED {}", c.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(c) => format!("DELETED {}", c.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => "BOOKMARK".into(),
        WatchEvent::Error(s) => format!("ERROR {}", s.code),
    }
}

async fn next_events(api: &Api<ConfigMap>, wp: &WatchParams, rv: &str, n: usize) -> Vec<String> {
    let stream = api.watch(wp, rv).await.unwrap();
    let mut stream = Box::pin(stream);
    let mut out = vec![];
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some(Ok(e))) => {
                let k = kind(&e);
                if k != "BOOKMARK" {
                    out.push(k);
                }
            }
            other => panic!("stream ended early: {other:?} after {out:?}"),
        }
    }
    out
}

#[tokio::test]
async fn watch_from_resource_version_over_http() {
    let s = apisim::ApiServer::new();
    let (_h, c) = http_client(&s).await;
    let api: Api<ConfigMap> = Api::namespaced(c, "default");
    let a = api
        .create(&PostParams::default(), &cm("a", "x"))
        .await
        .unwrap();
    let rv = a.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("b", "x"))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let evs = next_events(&api, &WatchParams::default(), &rv, 3).await;
    assert_eq!(evs, vec!["ADDED b", "MODIFIED a", "DELETED b"]);
    // "0": synthetic ADDED for current objects then live events
    let stream = api.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    let first = stream.try_next().await.unwrap().unwrap();
    assert_eq!(kind(&first), "ADDED a");
    api.create(&PostParams::default(), &cm("c", "x"))
        .await
        .unwrap();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if kind(&e) == "BOOKMARK" {
            continue;
        }
        assert_eq!(kind(&e), "ADDED c");
        break;
    }
}

#[tokio::test]
async fn too_old_resource_version_gives_410_event() {
    let s = apisim::ApiServer::builder().watch_history(5).build();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..20 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), "x"))
            .await
            .unwrap();
    }
    let stream = api.watch(&WatchParams::default(), "3").await.unwrap();
    let mut stream = Box::pin(stream);
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(st) => {
            assert_eq!(st.code, 410);
            assert_eq!(st.reason, "Expired");
            assert!(st.message.starts_with("too old resource version: 3"));
        }
        other => panic!("expected 410 error, got {other:?}"),
    }
    assert!(
        stream.try_next().await.unwrap().is_none(),
        "stream ends after the 410"
    );
}

#[tokio::test]
async fn bookmarks_selectors_and_timeout() {
    let s = apisim::ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .build();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a", "front"))
        .await
        .unwrap();
    let rv = s.resource_version().to_string();
    let wp = WatchParams::default().labels("tier=front").timeout(2);
    let stream = api.watch(&wp, &rv).await.unwrap();
    let mut stream = Box::pin(stream);
    // a bookmark right away
    let e = stream.try_next().await.unwrap().unwrap();
    match e {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected bookmark, got {other:?}"),
    }
    // a stops matching -> DELETED; matches again -> ADDED
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &cm("other", "back"))
        .await
        .unwrap();
    let mut seen = vec![];
    let start = std::time::Instant::now();
    while let Some(e) = stream.try_next().await.unwrap() {
        seen.push(kind(&e));
    }
    // ended by timeoutSeconds=2
    assert!(start.elapsed() < Duration::from_secs(4));
    let real: Vec<&String> = seen.iter().filter(|k| *k != "BOOKMARK").collect();
    assert_eq!(real, vec!["DELETED a", "ADDED a"]);
    assert!(
        seen.iter().filter(|k| *k == "BOOKMARK").count() >= 3,
        "{seen:?}"
    );
}

#[tokio::test]
async fn cut_watches_ends_streams() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let stream = api.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    let t = tokio::spawn(async move {
        let mut n = 0;
        while let Ok(Some(_)) = stream.try_next().await {
            n += 1;
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.cut_watches();
    tokio::time::timeout(Duration::from_secs(2), t)
        .await
        .expect("stream ended")
        .unwrap();
}

async fn reflector_stays_in_sync(streaming: bool) {
    let s = apisim::ApiServer::builder().watch_history(3).build();
    let (_h, c) = http_client(&s).await;
    let api: Api<ConfigMap> = Api::namespaced(c, "default");
    let (reader, writer) = reflector::store::<ConfigMap>();
    let mut cfg = watcher::Config::default();
    if streaming {
        cfg = cfg.streaming_lists();
    }
    let stream = reflector(writer, watcher(api.clone(), cfg)).applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        // errors (the 410s) are expected; the watcher re-lists by itself
        while let Some(r) = stream.next().await {
            if let Err(e) = r {
                eprintln!("watcher error (expected): {e}");
            }
        }
    });
    reader.wait_until_ready().await.unwrap();
    let want = |n: usize| {
        let reader = reader.clone();
        async move { (reader.state().len() == n).then_some(()) }
    };
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("r{i}"), "x"))
            .await
            .unwrap();
    }
    eventually(5, "5 objects", || want(5)).await;
    s.cut_watches();
    for i in 5..8 {
        api.create(&PostParams::default(), &cm(&format!("r{i}"), "x"))
            .await
            .unwrap();
    }
    eventually(5, "8 objects after cut", || want(8)).await;
    // force a 410: block re-watches, cut, make more changes than the history holds
    s.reset_request_counts();
    s.inject(apisim::Fault::new().verb("watch").status(500));
    s.cut_watches();
    let s2 = s.clone();
    eventually(5, "a failed re-watch", || {
        let s2 = s2.clone();
        async move { (s2.request_counts().get("watch", "configmaps") >= 1).then_some(()) }
    })
    .await;
    for i in 0..4 {
        api.delete(&format!("r{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for i in 8..12 {
        api.create(&PostParams::default(), &cm(&format!("r{i}"), "x"))
            .await
            .unwrap();
    }
    s.clear_faults();
    let expect = vec!["r10", "r11", "r4", "r5", "r6", "r7", "r8", "r9"];
    let names = || {
        let mut n: Vec<String> = reader
            .state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        n.sort();
        n
    };
    eventually(5, "in sync after 410", || {
        let ok = names() == expect;
        async move { ok.then_some(()) }
    })
    .await;
    let counts = s.request_counts();
    if !streaming {
        assert!(
            counts.get("list", "configmaps") >= 1,
            "re-listed after 410:\n{counts}"
        );
    }
    task.abort();
}

#[tokio::test]
async fn reflector_in_sync_across_cuts_and_410() {
    reflector_stays_in_sync(false).await;
}

#[tokio::test]
async fn reflector_with_streaming_lists() {
    reflector_stays_in_sync(true).await;
}

#[tokio::test]
async fn metadata_only_get_list_and_watch() {
    let s = apisim::ApiServer::new();
    let (_h, c) = http_client(&s).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    api.create(&PostParams::default(), &cm("m1", "x"))
        .await
        .unwrap();
    let m = api.get_metadata("m1").await.unwrap();
    assert_eq!(m.metadata.name.as_deref(), Some("m1"));
    let l = api.list_metadata(&Default::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    // Api<PartialObjectMeta<K>> makes metadata-only requests
    let mapi: Api<kube::core::PartialObjectMeta<ConfigMap>> = Api::namespaced(c.clone(), "default");
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(mapi, watcher::Config::default()));
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    api.create(&PostParams::default(), &cm("m2", "x"))
        .await
        .unwrap();
    eventually(5, "metadata reflector has 2", || {
        let n = reader.state().len();
        async move { (n == 2).then_some(()) }
    })
    .await;
    task.abort();
}
