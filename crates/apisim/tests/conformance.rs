//! Conformance-style suite: requests and the observable answers kube-apiserver gives.
//!
//! Written once against a `kube::Client`. Runs against apisim by default; set
//! `APISIM_CONFORMANCE_KUBECONFIG=/path/to/kubeconfig` to run the same suite against a real
//! cluster (it works in a generated namespace and deletes it at the end).

mod common;
use common::*;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

async fn client() -> (Option<apisim::ApiServer>, kube::Client, bool) {
    match std::env::var("APISIM_CONFORMANCE_KUBECONFIG") {
        Ok(path) if !path.is_empty() => {
            let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("kubeconfig");
            (None, kube::Client::try_from(cfg).expect("client"), true)
        }
        _ => {
            let s = apisim::ApiServer::new();
            let c = s.client();
            (Some(s), c, false)
        }
    }
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    from_json(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
}

async fn suite(c: kube::Client, ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let pp = PostParams::default();

    // create / get
    let a = cms
        .create(&pp, &cm("a", json!({"tier": "front"})))
        .await
        .unwrap();
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
    let rv_a: u64 = a
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .expect("numeric rv");
    assert!(rv_a > 0);

    // AlreadyExists
    let e = status(cms.create(&pp, &cm("a", json!({}))).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "configmaps \"a\" already exists");

    // NotFound
    let e = status(cms.get("missing").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "configmaps \"missing\" not found");
    let d = e.details.unwrap();
    assert_eq!(
        (d.name.as_str(), d.kind.as_str(), d.group.as_str()),
        ("missing", "configmaps", "")
    );

    // stale update -> Conflict
    let mut stale = a.clone();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    stale.data = Some([("k".to_string(), "x".to_string())].into());
    let e = status(cms.replace("a", &pp, &stale).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .starts_with("Operation cannot be fulfilled on configmaps \"a\""),
        "{}",
        e.message
    );

    // invalid name
    let e = status(
        cms.create(&pp, &cm("Bad_Name", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "metadata.name")
    );
    // invalid label value
    let e = status(
        cms.create(&pp, &cm("badlabel", json!({"a": "has space"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // missing name
    let e = status(
        cms.create(&pp, &from_json(json!({"metadata": {}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    // selectors
    cms.create(&pp, &cm("b", json!({"tier": "back"})))
        .await
        .unwrap();
    cms.create(&pp, &cm("c", json!({"tier": "back", "x": "1"})))
        .await
        .unwrap();
    let n = |lp: ListParams| {
        let cms = cms.clone();
        async move { cms.list(&lp).await.unwrap().items.len() }
    };
    assert_eq!(n(ListParams::default().labels("tier=back")).await, 2);
    assert_eq!(
        n(ListParams::default().labels("tier in (front,back),!x")).await,
        2
    );
    assert_eq!(
        n(ListParams::default().labels("tier notin (front)")).await,
        2
    );
    assert_eq!(n(ListParams::default().fields("metadata.name=b")).await, 1);
    let e = status(
        cms.list(&ListParams::default().fields("data.k=v"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);

    // pagination: sorted by name, continue token
    let p1 = cms.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(p1.items.len(), 2);
    let cont = p1.metadata.continue_.clone().expect("continue token");
    let p2 = cms
        .list(&ListParams::default().limit(2).continue_token(&cont))
        .await
        .unwrap();
    let names: Vec<String> = p1
        .items
        .iter()
        .chain(p2.items.iter())
        .filter_map(|c| c.metadata.name.clone())
        .filter(|n| n.len() == 1)
        .collect();
    assert_eq!(names, vec!["a", "b", "c"]);

    // merge patch null removes a key; json patch test failure is 422
    let out = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": null}}})),
        )
        .await
        .unwrap();
    assert!(!out.metadata.labels.unwrap().contains_key("x"));
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/k", "value": "nope"}]))
            .unwrap();
    let e = status(
        cms.patch("c", &PatchParams::default(), &Patch::Json::<()>(jp))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    // dry run stores nothing
    cms.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &cm("dry", json!({})),
    )
    .await
    .unwrap();
    assert_eq!(status(cms.get("dry").await.unwrap_err()).code, 404);

    // watch from a resourceVersion: ADDED, MODIFIED, DELETED in order
    let start = cms
        .get("a")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    cms.create(&pp, &cm("w", json!({}))).await.unwrap();
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    let mut stream = Box::pin(
        cms.watch(
            &WatchParams::default().fields("metadata.name=w").timeout(5),
            &start,
        )
        .await
        .unwrap(),
    );
    let mut kinds = vec![];
    while kinds.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch event in time")
        {
            Some(Ok(WatchEvent::Added(_))) => kinds.push("ADDED"),
            Some(Ok(WatchEvent::Modified(_))) => kinds.push("MODIFIED"),
            Some(Ok(WatchEvent::Deleted(_))) => kinds.push("DELETED"),
            Some(Ok(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(kinds, vec!["ADDED", "MODIFIED", "DELETED"]);

    // server-side apply: conflicts between managers, force
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "1"}});
    cms.patch("ssa", &PatchParams::apply("conf-a"), &Patch::Apply(&obj))
        .await
        .unwrap();
    let obj2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "2"}});
    let e = status(
        cms.patch("ssa", &PatchParams::apply("conf-b"), &Patch::Apply(&obj2))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("conf-a") && e.message.contains(".data.x"),
        "{}",
        e.message
    );
    let out = cms
        .patch(
            "ssa",
            &PatchParams::apply("conf-b").force(),
            &Patch::Apply(&obj2),
        )
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["x"], "2");
    let e = status(
        cms.patch("ssa", &PatchParams::default(), &Patch::Apply(&obj2))
            .await
            .unwrap_err(),
    );
    assert!(
        e.code == 400 || e.code == 422,
        "fieldManager required: {}",
        e.code
    );

    // finalizers
    let f = cms
        .create(
            &pp,
            &from_json(
                json!({"metadata": {"name": "fin", "finalizers": ["conformance.example.com/x"]}}),
            ),
        )
        .await
        .unwrap();
    assert!(f.metadata.deletion_timestamp.is_none());
    let d = cms
        .delete("fin", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("object returned");
    assert!(d.metadata.deletion_timestamp.is_some());
    cms.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(status(cms.get("fin").await.unwrap_err()).code, 404);

    // generation and the status subresource (Deployment)
    let deps: Api<Deployment> = Api::namespaced(c.clone(), ns);
    let dep: Deployment = from_json(json!({"metadata": {"name": "d"}, "spec": {"replicas": 0,
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}));
    let d = deps.create(&pp, &dep).await.unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let d = deps
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let d = deps
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minReadySeconds": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    let d = deps
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"collisionCount": 5}})),
        )
        .await
        .unwrap();
    assert_ne!(d.status.and_then(|s| s.collision_count), Some(5));
    let sc = deps.get_scale("d").await.unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(0));

    // creating in a missing namespace
    let other: Api<ConfigMap> = Api::namespaced(c.clone(), &format!("{ns}-missing"));
    let e = status(other.create(&pp, &cm("x", json!({}))).await.unwrap_err());
    assert_eq!(e.code, 404);
    assert_eq!(e.message, format!("namespaces \"{ns}-missing\" not found"));
}

#[tokio::test]
async fn conformance() {
    let (server, c, _real) = client().await;
    let ns = format!("apisim-conf-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": ns}})),
    )
    .await
    .unwrap();
    let res = AssertUnwindSafe(suite(c.clone(), &ns)).catch_unwind().await;
    let _ = nss.delete(&ns, &DeleteParams::default()).await;
    if let Some(s) = &server {
        let s = s.clone();
        let ns2 = ns.clone();
        eventually(5, "namespace cleaned up", move || {
            let gone = s.get_object("v1", "namespaces", None, &ns2).is_none();
            async move { gone.then_some(()) }
        })
        .await;
    }
    if let Err(p) = res {
        std::panic::resume_unwind(p);
    }
}
