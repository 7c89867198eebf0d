//! CRUD, errors, generation, status subresource — in-process and over HTTP.

mod common;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    from_json(json!({"metadata": {"name": name, "labels": {"app": "x"}}, "data": {"k": "v"}}))
}

fn deploy(name: &str, replicas: i32) -> Deployment {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "memcached:1.6"}]}}
        }
    }))
}

async fn crud_roundtrip(client: kube::Client, server: &apisim::ApiServer) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.name.as_deref(), Some("a"));
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert_eq!(meta.uid.as_ref().unwrap().len(), 36);
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_ref().unwrap().parse().unwrap();

    let got = api.get("a").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");

    // update
    let mut upd = got.clone();
    upd.data.as_mut().unwrap().insert("k".into(), "w".into());
    let updated = api
        .replace("a", &PostParams::default(), &upd)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    // stale update -> 409 Conflict
    let e = status(
        api.replace("a", &PostParams::default(), &upd)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert_eq!(e.reason, "Conflict");
    // AlreadyExists
    let e = status(
        api.create(&PostParams::default(), &cm("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    // list
    let l = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    assert!(l.metadata.resource_version.is_some());
    // delete
    // an immediate deletion of a ConfigMap is answered with a Status (like kube-apiserver)
    let d = api.delete("a", &DeleteParams::default()).await.unwrap();
    let st = d.right().expect("Status");
    assert!(st.is_success());
    assert_eq!(st.details.unwrap().name, "a");
    let e = status(api.get("a").await.unwrap_err());
    assert_eq!(e.code, 404);
    assert_eq!(e.reason, "NotFound");
    assert_eq!(e.message, "configmaps \"a\" not found");
    let det = e.details.unwrap();
    assert_eq!((det.name.as_str(), det.kind.as_str()), ("a", "configmaps"));
    assert!(
        server
            .get_object("v1", "configmaps", Some("default"), "a")
            .is_none()
    );
}

#[tokio::test]
async fn crud_in_process() {
    let s = apisim::ApiServer::new();
    crud_roundtrip(s.client(), &s).await;
}

#[tokio::test]
async fn crud_over_http() {
    let s = apisim::ApiServer::new();
    let (_h, c) = http_client(&s).await;
    crud_roundtrip(c, &s).await;
}

#[tokio::test]
async fn generate_name_and_builtin_namespaces() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("");
    c.metadata.name = None;
    c.metadata.generate_name = Some("gen-".into());
    let out = api.create(&PostParams::default(), &c).await.unwrap();
    let name = out.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    assert!(
        name[4..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    let nss: Api<Namespace> = Api::all(s.client());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&n.to_string()));
    }
}

#[tokio::test]
async fn generation_and_status_subresource() {
    let s = apisim::ApiServer::new();
    let api: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d = api
        .create(&PostParams::default(), &deploy("web", 1))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    // metadata-only change: generation unchanged
    let p = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    let d = api.patch("web", &PatchParams::default(), &p).await.unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    // spec change: +1
    let d = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    // main-resource patch cannot change status
    let d = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 7}})),
        )
        .await
        .unwrap();
    assert!(d.status.is_none());
    // status patch changes status only (and not generation)
    let p = Patch::Merge(json!({"spec": {"replicas": 9}, "status": {"replicas": 7}}));
    let d = api
        .patch_status("web", &PatchParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().replicas, Some(7));
    assert_eq!(d.spec.unwrap().replicas, Some(2));
    assert_eq!(d.metadata.generation, Some(2));
    // no-op update keeps the resourceVersion
    let cur = api.get("web").await.unwrap();
    let again = api
        .replace("web", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(
        cur.metadata.resource_version,
        again.metadata.resource_version
    );
}

#[tokio::test]
async fn bad_input_gives_status_errors() {
    let s = apisim::ApiServer::new();
    let h = s.serve().await.unwrap();
    let url = h.url();
    let cases: Vec<(&str, &str, u16, &str)> = vec![
        (
            "/api/v1/namespaces/default/configmaps",
            "{not json",
            400,
            "BadRequest",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"apps/v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
            400,
            "BadRequest",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#,
            400,
            "BadRequest",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#,
            422,
            "Invalid",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#,
            422,
            "Invalid",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","labels":{"a b":"c"}}}"#,
            422,
            "Invalid",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"other"}}"#,
            400,
            "BadRequest",
        ),
        (
            "/api/v1/namespaces/nope/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
            404,
            "NotFound",
        ),
        (
            "/api/v1/namespaces/default/widgets",
            r#"{"apiVersion":"v1","kind":"Widget","metadata":{"name":"x"}}"#,
            404,
            "NotFound",
        ),
        (
            "/api/v1/namespaces",
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a.b"}}"#,
            422,
            "Invalid",
        ),
    ];
    let long254 = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{}"}}}}"#,
        "a".repeat(254)
    );
    let long64 = format!(
        r#"{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{}"}}}}"#,
        "a".repeat(64)
    );
    let mut all = cases.clone();
    all.push((
        "/api/v1/namespaces/default/configmaps",
        &long254,
        422,
        "Invalid",
    ));
    all.push(("/api/v1/namespaces", &long64, 422, "Invalid"));
    for (path, body, code, reason) in all {
        let (c, v) = raw(&url, "POST", path, "application/json", body).await;
        assert_eq!(c, code, "{path} {body}: {v}");
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], reason, "{v}");
        assert_eq!(v["code"], code);
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert!(
        s.list_objects("v1", "configmaps", Some("default"))
            .is_empty()
    );
    assert!(s.get_object("v1", "namespaces", None, "a.b").is_none());
    // the 422 names the field
    let (_, v) = raw(
        &url,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#,
    )
    .await;
    assert_eq!(v["details"]["causes"][0]["field"], "metadata.name");
    assert!(v["message"].as_str().unwrap().starts_with(
        "ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\""
    ));
}

#[tokio::test]
async fn builtin_defaults_like_the_real_server() {
    use k8s_openapi::api::core::v1::Service;
    let s = apisim::ApiServer::new();
    let svcs: Api<Service> = Api::namespaced(s.client(), "default");
    let svc: Service = from_json(
        json!({"metadata": {"name": "mc"}, "spec": {"selector": {"app": "mc"}, "ports": [{"name": "memcached", "port": 11211}]}}),
    );
    let out = svcs.create(&PostParams::default(), &svc).await.unwrap();
    let spec = out.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert!(spec.cluster_ip.as_deref().unwrap().starts_with("10.96."));
    let p = &spec.ports.unwrap()[0];
    assert_eq!(p.protocol.as_deref(), Some("TCP"));
    assert_eq!(
        p.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(11211))
    );
    // an update without clusterIP keeps it
    let ip = spec.cluster_ip.clone();
    let out = svcs
        .patch(
            "mc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": null, "clusterIPs": null}})),
        )
        .await
        .unwrap();
    assert_eq!(out.spec.unwrap().cluster_ip, ip);

    let api: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d = api
        .create(&PostParams::default(), &deploy("web", 1))
        .await
        .unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.revision_history_limit, Some(10));
    let ps = spec.template.spec.unwrap();
    assert_eq!(ps.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        ps.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    assert_eq!(
        ps.containers[0].termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
}

#[tokio::test]
async fn data_keys_secrets_and_protected_namespaces() {
    use k8s_openapi::api::core::v1::Secret;
    let s = apisim::ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let bad: ConfigMap = from_json(json!({"metadata": {"name": "b"}, "data": {"bad key": "v"}}));
    let e = status(cms.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "data[bad key]")
    );
    let secrets: Api<Secret> = Api::namespaced(s.client(), "default");
    let sec: Secret =
        from_json(json!({"metadata": {"name": "s"}, "stringData": {"user": "admin"}}));
    let out = secrets.create(&PostParams::default(), &sec).await.unwrap();
    assert!(out.string_data.is_none());
    assert_eq!(out.data.unwrap()["user"].0, b"admin".to_vec());
    assert_eq!(out.type_.as_deref(), Some("Opaque"));
    let nss: Api<Namespace> = Api::all(s.client());
    let e = status(
        nss.delete("default", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    // 3 MiB body limit
    let h = s.serve().await.unwrap();
    let big = format!(
        r#"{{"metadata":{{"name":"big"}},"data":{{"k":"{}"}}}}"#,
        "x".repeat(3 * 1024 * 1024 + 1)
    );
    let (code, v) = raw(
        &h.url(),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        &big,
    )
    .await;
    assert_eq!(
        (code, v["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
}
