//! Discovery, fault injection, request counting, latency, TokenReview/SubjectAccessReview.

mod common;
use apisim::Fault;
use common::*;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn discovery_and_version() {
    let s = apisim::ApiServer::new();
    let (h, c) = http_client(&s).await;
    let v = c.apiserver_version().await.unwrap();
    assert_eq!(
        (v.major.as_str(), v.minor.as_str(), v.git_version.as_str()),
        ("1", "33", "v1.33.0")
    );
    let d = Discovery::new(c.clone()).run().await.unwrap();
    let kinds: Vec<String> = d
        .groups()
        .flat_map(|g| g.recommended_resources())
        .map(|(r, _)| format!("{}/{}", r.group, r.kind))
        .collect();
    for k in [
        "/Pod",
        "/Namespace",
        "apps/Deployment",
        "apps/ReplicaSet",
        "coordination.k8s.io/Lease",
        "policy/PodDisruptionBudget",
        "apiextensions.k8s.io/CustomResourceDefinition",
        "rbac.authorization.k8s.io/ClusterRole",
        "events.k8s.io/Event",
        "admissionregistration.k8s.io/ValidatingWebhookConfiguration",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k} missing from {kinds:?}");
    }
    assert!(!kinds.iter().any(|k| k.contains("ServiceMonitor")));
    // scale subresource advertised
    let (_, body) = raw(&h.url(), "GET", "/apis/apps/v1", "application/json", "").await;
    let names: Vec<&str> = body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"deployments/scale") && names.contains(&"deployments/status"));
    // no OpenAPI: a path outside every API group is a plain-text 404, as kube-apiserver's
    let (code, body) = raw(&h.url(), "GET", "/openapi/v2", "application/json", "").await;
    assert_eq!((code, body), (404, serde_json::Value::Null));
}

#[tokio::test]
async fn faults_and_counts() {
    let s = apisim::ApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": "a"}})),
    )
    .await
    .unwrap();
    s.reset_request_counts();
    s.inject(
        Fault::new()
            .verb("patch")
            .resource("configmaps")
            .status(409)
            .times(2),
    );
    for _ in 0..2 {
        let e = status(
            api.patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"x": "1"}})),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    }
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();
    s.clear_faults();
    s.inject(Fault::new().verb("get").status(500).fraction(0.5));
    let mut fails = 0;
    for _ in 0..10 {
        if let Err(e) = api.get("a").await {
            let st = status(e);
            assert_eq!(st.reason, "InternalError");
            fails += 1;
        }
    }
    assert_eq!(fails, 5);
    s.clear_faults();
    s.inject(
        Fault::new()
            .resource("configmaps")
            .namespace("other")
            .status(429),
    );
    api.get("a").await.unwrap();
    let other: Api<ConfigMap> = Api::namespaced(s.client(), "other");
    let e = status(other.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    s.clear_faults();

    let c = s.request_counts();
    assert_eq!(c.get("patch", "configmaps"), 3);
    assert_eq!(c.get("get", "configmaps"), 11);
    assert_eq!(c.get("list", "configmaps"), 1);
    assert_eq!(c.writes(), 3);
    assert_eq!(c.total(), 15);
    assert_eq!(c.by_verb()["get"], 11);
    assert!(c.to_string().contains("configmaps"));
    api.patch_status("a", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .ok();
    // configmaps have no status subresource: counted anyway, 404
    assert_eq!(s.request_counts().get("patch", "configmaps/status"), 1);
    assert_eq!(s.request_counts().iter().count(), 4);

    s.set_latency(Duration::from_millis(100));
    let t = std::time::Instant::now();
    api.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    s.set_latency(Duration::ZERO);
}

#[tokio::test]
async fn token_and_subject_access_reviews() {
    let s = apisim::ApiServer::new();
    s.allow_token("good", "alice", &["devs"]);
    let c = s.client();
    let trs: Api<TokenReview> = Api::all(c.clone());
    let tr = trs
        .create(
            &PostParams::default(),
            &from_json(json!({"spec": {"token": "good"}})),
        )
        .await
        .unwrap();
    let st = tr.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    assert_eq!(st.user.unwrap().username.as_deref(), Some("alice"));
    let tr = trs
        .create(
            &PostParams::default(),
            &from_json(json!({"spec": {"token": "bad"}})),
        )
        .await
        .unwrap();
    assert_eq!(tr.status.unwrap().authenticated, Some(false));
    assert!(
        s.list_objects("authentication.k8s.io/v1", "tokenreviews", None)
            .is_empty()
    );
    assert_eq!(status(trs.get("x").await.unwrap_err()).code, 405);

    let sars: Api<SubjectAccessReview> = Api::all(c.clone());
    let ask = |path: &str, user: &str| {
        from_json::<SubjectAccessReview>(
            json!({"spec": {"user": user, "groups": ["devs"], "nonResourceAttributes": {"path": path, "verb": "get"}}}),
        )
    };
    let r = sars
        .create(&PostParams::default(), &ask("/metrics", "alice"))
        .await
        .unwrap();
    assert!(!r.status.unwrap().allowed);
    let crs: Api<ClusterRole> = Api::all(c.clone());
    crs.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": "metrics"}, "rules": [
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]}
        ]})),
    )
    .await
    .unwrap();
    let crbs: Api<ClusterRoleBinding> = Api::all(c.clone());
    crbs.create(&PostParams::default(), &from_json(json!({"metadata": {"name": "m"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics"},
        "subjects": [{"kind": "Group", "name": "devs"}]}))).await.unwrap();
    let r = sars
        .create(&PostParams::default(), &ask("/metrics", "alice"))
        .await
        .unwrap();
    assert!(r.status.unwrap().allowed);
    let r = sars
        .create(&PostParams::default(), &ask("/other", "alice"))
        .await
        .unwrap();
    assert!(!r.status.unwrap().allowed);
    let res = |verb: &str| {
        from_json::<SubjectAccessReview>(
            json!({"spec": {"user": "bob", "groups": ["devs"], "resourceAttributes": {"namespace": "default", "verb": verb, "group": "apps", "resource": "deployments"}}}),
        )
    };
    assert!(
        sars.create(&PostParams::default(), &res("list"))
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    );
    assert!(
        !sars
            .create(&PostParams::default(), &res("delete"))
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn kubeconfig_works_with_kube_rs() {
    let s = apisim::ApiServer::new();
    let h = s.serve().await.unwrap();
    assert_eq!(h.url(), format!("http://127.0.0.1:{}", h.port()));
    let kc = kube::config::Kubeconfig::from_yaml(&h.kubeconfig_yaml()).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("apisim"));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let c = kube::Client::try_from(cfg).unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c);
    cms.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": "via-kc"}})),
    )
    .await
    .unwrap();
    assert!(
        s.get_object("v1", "configmaps", Some("default"), "via-kc")
            .is_some()
    );
    // dropping the handle stops the server
    let url = h.url();
    drop(h);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let addr = url.trim_start_matches("http://").to_string();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn dropping_the_handle_ends_open_connections() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<apisim::ApiServer>();
    assert_send_sync::<apisim::ApiService>();
    let s = apisim::ApiServer::new();
    let (h, c) = http_client(&s).await;
    let api: Api<ConfigMap> = Api::default_namespaced(c);
    let mut stream = Box::pin(api.watch(&Default::default(), "0").await.unwrap());
    drop(h);
    use futures::StreamExt;
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch connection was closed");
}

/// The in-process change feed reports every stored change in order, with the stored
/// object, and says so when a receiver fell behind instead of skipping silently.
#[tokio::test]
async fn change_feed_reports_writes_in_order_and_gaps() {
    let s = apisim::ApiServer::new();
    let mut changes = s.changes();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let cm: ConfigMap = from_json(json!({"metadata": {"name": "fed"}, "data": {"k": "1"}}));
    api.create(&PostParams::default(), &cm).await.unwrap();
    api.patch(
        "fed",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.delete("fed", &Default::default()).await.unwrap();
    let mut seen = vec![];
    for _ in 0..3 {
        let c = changes.recv().await.unwrap();
        seen.push((
            c.event_type().to_string(),
            c.kind_plural().to_string(),
            c.object()["data"]["k"].as_str().unwrap_or("").to_string(),
        ));
    }
    let want = |t: &str, v: &str| (t.to_string(), "configmaps".to_string(), v.to_string());
    assert_eq!(
        seen,
        vec![
            want("ADDED", "1"),
            want("MODIFIED", "2"),
            want("DELETED", "2")
        ]
    );

    // a receiver that never reads falls more than the channel's 16,384 changes behind and
    // is told so
    let busy = apisim::ApiServer::new();
    let mut late = busy.changes();
    let api: Api<ConfigMap> = Api::namespaced(busy.client(), "default");
    for i in 0..17_000 {
        let cm: ConfigMap = from_json(json!({"metadata": {"name": format!("c{i}")}}));
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    assert_eq!(late.recv().await.unwrap().event_type(), "LAGGED");
}

/// A kube::Client that talks HTTP to `url` with a bearer token, as a kubeconfig user would.
async fn client_with_token(url: &str, token: &str) -> kube::Client {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: default\ncurrent-context: c\n"
    );
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A partition of one client: its requests (told apart by the user its token names) get no
/// answer while a hanging fault lasts, and other users' are served. Once the fault is
/// cleared a held request is served if its client still waits, never if it gave up. The
/// audit log records who changed what, in order.
#[tokio::test]
async fn a_hanging_fault_partitions_one_user_until_cleared() {
    let s = apisim::ApiServer::builder().audit_log(true).build();
    s.allow_token("token-a", "alice", &[]);
    s.allow_token("token-b", "bob", &[]);
    let h = s.serve().await.unwrap();
    let alice: Api<ConfigMap> =
        Api::default_namespaced(client_with_token(&h.url(), "token-a").await);
    let bob: Api<ConfigMap> = Api::default_namespaced(client_with_token(&h.url(), "token-b").await);
    let cm = |name: &str| -> ConfigMap { from_json(json!({"metadata": {"name": name}})) };
    alice
        .create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();

    s.inject(Fault::new().user("alice").hang());
    let held = {
        let (alice, cm) = (alice.clone(), cm("held"));
        tokio::spawn(async move { alice.create(&PostParams::default(), &cm).await })
    };
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        alice.create(&PostParams::default(), &cm("abandoned")),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "alice's request was answered during the partition"
    );
    bob.create(&PostParams::default(), &cm("bob"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !held.is_finished(),
        "alice's request was answered during the partition"
    );
    let exists = |name: &str| {
        s.get_object("v1", "configmaps", Some("default"), name)
            .is_some()
    };
    assert!(!exists("held") && !exists("abandoned") && exists("bob"));

    s.clear_faults();
    let created = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("a held request is served once the fault is cleared")
        .unwrap()
        .unwrap();
    assert_eq!(created.metadata.name.as_deref(), Some("held"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !exists("abandoned"),
        "a request its client gave up on was served"
    );

    let writes: Vec<(String, String, String, u16)> = s
        .audit_events()
        .into_iter()
        .filter(|e| e.is_write())
        .map(|e| (e.user, e.verb, e.resource, e.code))
        .collect();
    let write = |user: &str| {
        (
            user.to_string(),
            "create".to_string(),
            "configmaps".to_string(),
            201,
        )
    };
    assert_eq!(writes, [write("alice"), write("bob"), write("alice")]);
    let anonymous = apisim::ApiServer::builder().audit_log(true).build();
    let cms: Api<ConfigMap> = Api::default_namespaced(anonymous.client());
    cms.create(&PostParams::default(), &cm("x")).await.unwrap();
    assert_eq!(anonymous.audit_events()[0].user, "system:anonymous");
    assert!(
        s.audit_events()
            .iter()
            .all(|e| e.user != "system:anonymous")
    );
    assert!(apisim::ApiServer::new().audit_events().is_empty());
}
