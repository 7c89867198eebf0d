//! merge / JSON / strategic / server-side apply patches, dry run, selectors, pagination.

mod common;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn pod(name: &str) -> Pod {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}
    }))
}

#[tokio::test]
async fn merge_json_strategic() {
    let s = apisim::ApiServer::new();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    // strategic: containers merged by name
    let p = Patch::Strategic(json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}}));
    let out = pods.patch("p", &PatchParams::default(), &p).await.unwrap();
    let cs = out.spec.unwrap().containers;
    assert_eq!(cs.len(), 2);
    assert_eq!(cs[0].image.as_deref(), Some("a:1"));
    assert_eq!(cs[1].image.as_deref(), Some("b:2"));
    // strategic $patch: delete
    let p = Patch::Strategic(json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}));
    let out = pods.patch("p", &PatchParams::default(), &p).await.unwrap();
    assert_eq!(out.spec.unwrap().containers.len(), 1);
    // merge patch: lists replaced
    let p = Patch::Merge(
        json!({"spec": {"containers": [{"name": "c", "image": "c:1"}]}, "metadata": {"labels": {"l": "1"}}}),
    );
    let out = pods.patch("p", &PatchParams::default(), &p).await.unwrap();
    assert_eq!(out.spec.as_ref().unwrap().containers.len(), 1);
    assert_eq!(out.spec.unwrap().containers[0].name, "c");
    // merge patch null removes
    let out = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": null}}})),
        )
        .await
        .unwrap();
    assert!(out.metadata.labels.unwrap_or_default().is_empty());
    // json patch
    let jp: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]),
    )
    .unwrap();
    let out = pods
        .patch("p", &PatchParams::default(), &Patch::Json::<()>(jp))
        .await
        .unwrap();
    assert_eq!(out.metadata.annotations.unwrap()["a"], "b");
    // failing json patch test op -> error, nothing changed
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "zzz"}]))
            .unwrap();
    let e = status(
        pods.patch("p", &PatchParams::default(), &Patch::Json::<()>(jp))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // patch with stale resourceVersion -> 409
    let e = status(
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    // not found
    let e = status(
        pods.patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn server_side_apply_ownership_conflicts_force() {
    let s = apisim::ApiServer::new();
    let (_h, c) = http_client(&s).await;
    let cms: Api<ConfigMap> = Api::namespaced(c, "default");
    let a = PatchParams::apply("mgr-a");
    // create via apply
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "1", "y": "1"}});
    let out = cms.patch("ssa", &a, &Patch::Apply(&obj)).await.unwrap();
    let mf = out.metadata.managed_fields.unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(mf[0].manager.as_deref(), Some("mgr-a"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));
    // manager b sets x to a different value -> conflict naming field and manager
    let b = PatchParams::apply("mgr-b");
    let objb = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "2"}});
    let e = status(
        cms.patch("ssa", &b, &Patch::Apply(&objb))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains(".data.x") && e.message.contains("mgr-a"),
        "{}",
        e.message
    );
    // same value: shared ownership, no conflict
    let objb2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"y": "1"}});
    cms.patch("ssa", &b, &Patch::Apply(&objb2)).await.unwrap();
    // force takes it over
    let out = cms
        .patch("ssa", &b.clone().force(), &Patch::Apply(&objb))
        .await
        .unwrap();
    assert_eq!(out.data.as_ref().unwrap()["x"], "2");
    // b's last apply did not include y, so only a owns y now.
    // a re-applies without x and y: x (now b's) stays, y (only a's) is removed
    let obja2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"z": "3"}});
    let out = cms.patch("ssa", &a, &Patch::Apply(&obja2)).await.unwrap();
    let d = out.data.unwrap();
    assert_eq!(
        (d["x"].as_str(), d.get("y"), d["z"].as_str()),
        ("2", None, "3")
    );
    // a drops z, which only it owned -> removed
    let obja3 =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {}});
    let out = cms.patch("ssa", &a, &Patch::Apply(&obja3)).await.unwrap();
    assert!(!out.data.unwrap().contains_key("z"));
    // an Update manager (merge patch) owns what it changed; applying over it conflicts
    cms.patch(
        "ssa",
        &PatchParams {
            field_manager: Some("editor".into()),
            ..Default::default()
        },
        &Patch::Merge(json!({"data": {"w": "9"}})),
    )
    .await
    .unwrap();
    let obja4 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"w": "1"}});
    let e = status(
        cms.patch("ssa", &a, &Patch::Apply(&obja4))
            .await
            .unwrap_err(),
    );
    assert!(e.message.contains("editor"), "{}", e.message);
    // fieldManager is required for apply
    let e = status(
        cms.patch("ssa", &PatchParams::default(), &Patch::Apply(&obja4))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn apply_status_and_dry_run() {
    let s = apisim::ApiServer::new();
    let api: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
        "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    // dry run create stores nothing
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&pp, &from_json(d.clone())).await.unwrap();
    assert!(
        s.get_object("apps/v1", "deployments", Some("default"), "d")
            .is_none()
    );
    let out = api
        .patch("d", &PatchParams::apply("op").force(), &Patch::Apply(&d))
        .await
        .unwrap();
    assert_eq!(out.spec.unwrap().replicas, Some(1)); // defaulted
    let st = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "status": {"replicas": 3}});
    let out = api
        .patch_status("d", &PatchParams::apply("op").force(), &Patch::Apply(&st))
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().replicas, Some(3));
    // dry-run patch doesn't store
    let pp = PatchParams::default().dry_run();
    let out = api
        .patch("d", &pp, &Patch::Merge(json!({"spec": {"replicas": 5}})))
        .await
        .unwrap();
    assert_eq!(out.spec.unwrap().replicas, Some(5));
    assert_eq!(api.get("d").await.unwrap().spec.unwrap().replicas, Some(1));
}

#[tokio::test]
async fn selectors_and_pagination() {
    let s = apisim::ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..10 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        let mut labels = json!({"tier": tier});
        if i < 3 {
            labels["low"] = json!("yes");
        }
        let c: ConfigMap =
            from_json(json!({"metadata": {"name": format!("cm-{i:02}"), "labels": labels}}));
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    let n = |sel: &'static str| {
        let cms = cms.clone();
        async move {
            cms.list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .len()
        }
    };
    assert_eq!(n("tier=even").await, 5);
    assert_eq!(n("tier==odd").await, 5);
    assert_eq!(n("tier!=odd").await, 5);
    assert_eq!(n("tier in (odd,even)").await, 10);
    assert_eq!(n("tier notin (odd)").await, 5);
    assert_eq!(n("low").await, 3);
    assert_eq!(n("!low").await, 7);
    assert_eq!(n("low,tier=even").await, 2);
    let l = cms
        .list(&ListParams::default().fields("metadata.name=cm-03"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let l = cms
        .list(&ListParams::default().fields("metadata.name!=cm-03,metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 9);
    let e = status(
        cms.list(&ListParams::default().fields("spec.foo=bar"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    let e = status(
        cms.list(&ListParams::default().labels("a b c"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    // pagination
    let mut names = vec![];
    let mut lp = ListParams::default().limit(4);
    let mut pages = 0;
    loop {
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names.len(), 10);
}

#[tokio::test]
async fn apply_removes_a_dropped_container_whole() {
    let s = apisim::ApiServer::new();
    let api: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d = |containers: serde_json::Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": containers}}}})
    };
    let pp = PatchParams::apply("op").force();
    api.patch("d", &pp, &Patch::Apply(d(json!([{"name": "main", "image": "m:1"}, {"name": "side", "image": "s:1", "ports": [{"containerPort": 80}]}])))).await.unwrap();
    let out = api
        .patch(
            "d",
            &pp,
            &Patch::Apply(d(json!([{"name": "main", "image": "m:2"}]))),
        )
        .await
        .unwrap();
    let cs = out.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(cs.len(), 1);
    assert_eq!(
        (cs[0].name.as_str(), cs[0].image.as_deref()),
        ("main", Some("m:2"))
    );
    // defaults the server added stay
    assert_eq!(
        cs[0].termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
}
