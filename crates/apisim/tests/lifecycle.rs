//! Deletion: finalizers, namespaces, ownerReference garbage collection.

mod common;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::json;

async fn gone(s: &apisim::ApiServer, plural: &str, ns: &str, name: &str) {
    let s = s.clone();
    let (p, n, nm) = (plural.to_string(), ns.to_string(), name.to_string());
    eventually(5, &format!("{plural} {name} gone"), move || {
        let g = s.get_object("v1", &p, Some(&n), &nm).is_none();
        async move { g.then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn finalizers_block_deletion() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let c: ConfigMap =
        from_json(json!({"metadata": {"name": "f", "finalizers": ["example.com/x"]}}));
    api.create(&PostParams::default(), &c).await.unwrap();
    let d = api.delete("f", &DeleteParams::default()).await.unwrap();
    let obj = d.left().unwrap();
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.deletion_grace_period_seconds, Some(0));
    // still there
    let cur = api.get("f").await.unwrap();
    assert!(cur.metadata.deletion_timestamp.is_some());
    // remove the finalizer with a JSON patch -> gone
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}])).unwrap();
    api.patch("f", &PatchParams::default(), &Patch::Json::<()>(jp))
        .await
        .unwrap();
    assert_eq!(status(api.get("f").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn namespace_deletion() {
    let s = apisim::ApiServer::new();
    let nss: Api<Namespace> = Api::all(s.client());
    nss.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": "doomed"}})),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "doomed");
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": format!("c{i}")}})),
        )
        .await
        .unwrap();
    }
    let held: ConfigMap = from_json(json!({"metadata": {"name": "held", "finalizers": ["x/y"]}}));
    cms.create(&PostParams::default(), &held).await.unwrap();
    let d = nss
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(d.metadata.deletion_timestamp.is_some());
    assert_eq!(d.status.unwrap().phase.as_deref(), Some("Terminating"));
    // creating in a terminating namespace -> 403
    let e = status(
        cms.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "new"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    for i in 0..3 {
        gone(&s, "configmaps", "doomed", &format!("c{i}")).await;
    }
    // the namespace waits for the finalizer
    assert!(s.get_object("v1", "namespaces", None, "doomed").is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let s2 = s.clone();
    eventually(5, "namespace removed", move || {
        let g = s2.get_object("v1", "namespaces", None, "doomed").is_none();
        async move { g.then_some(()) }
    })
    .await;
    // creating in a missing namespace -> 404 for the namespace
    let e = status(
        cms.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "new"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 404);
    assert_eq!(e.message, "namespaces \"doomed\" not found");
}

async fn owner_and_dependents(api: &Api<ConfigMap>, sec: &Api<Secret>, block: bool) -> String {
    let owner = api
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "owner"}})),
        )
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    for i in 0..2 {
        let d: Secret = from_json(
            json!({"metadata": {"name": format!("dep{i}"), "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": block}
            ]}}),
        );
        sec.create(&PostParams::default(), &d).await.unwrap();
    }
    uid
}

#[tokio::test]
async fn gc_background_foreground_orphan() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let sec: Api<Secret> = Api::namespaced(s.client(), "default");
    // background (default)
    owner_and_dependents(&api, &sec, false).await;
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    assert!(
        s.get_object("v1", "configmaps", Some("default"), "owner")
            .is_none()
    );
    gone(&s, "secrets", "default", "dep0").await;
    gone(&s, "secrets", "default", "dep1").await;

    // foreground: owner stays (with the foregroundDeletion finalizer) until blocking dependents are gone
    // (a finalizer on a dependent holds the owner)
    owner_and_dependents(&api, &sec, true).await;
    sec.patch(
        "dep0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["hold/it"]}})),
    )
    .await
    .unwrap();
    let d = api
        .delete("owner", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(
        d.metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_string())
    );
    gone(&s, "secrets", "default", "dep1").await;
    let o = api.get("owner").await.unwrap();
    assert!(o.metadata.deletion_timestamp.is_some());
    sec.patch(
        "dep0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    gone(&s, "secrets", "default", "dep0").await;
    gone(&s, "configmaps", "default", "owner").await;

    // orphan: dependents stay, without the ownerReference
    owner_and_dependents(&api, &sec, false).await;
    api.delete(
        "owner",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    gone(&s, "configmaps", "default", "owner").await;
    let deps = sec.list(&ListParams::default()).await.unwrap();
    assert_eq!(deps.items.len(), 2);
    for d in deps.items {
        assert!(d.metadata.owner_references.unwrap_or_default().is_empty());
    }
}

#[tokio::test]
async fn delete_collection_and_preconditions() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..4 {
        let l = if i < 2 { "a" } else { "b" };
        api.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": format!("c{i}"), "labels": {"g": l}}})),
        )
        .await
        .unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("g=a"),
    )
    .await
    .unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = status(api.delete("c2", &dp).await.unwrap_err());
    assert_eq!(e.code, 409);
    let e = status(
        api.delete("nope", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn marking_for_deletion_bumps_generation() {
    use k8s_openapi::api::apps::v1::Deployment;
    let s = apisim::ApiServer::new();
    let api: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d: Deployment = from_json(
        json!({"metadata": {"name": "g", "finalizers": ["x/y"]}, "spec": {
        "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
    );
    assert_eq!(
        api.create(&PostParams::default(), &d)
            .await
            .unwrap()
            .metadata
            .generation,
        Some(1)
    );
    let out = api
        .delete("g", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(out.metadata.generation, Some(2));
}
