//! Odd and malformed requests: always a Status error, never a panic, nothing stored.

mod common;
use common::*;

#[tokio::test]
async fn malformed_requests_get_status_errors() {
    let s = apisim::ApiServer::new();
    let h = s.serve().await.unwrap();
    let url = h.url();
    let cm = "/api/v1/namespaces/default/configmaps";
    let j = "application/json";
    let cases: Vec<(&str, String, &str, String)> = vec![
        ("POST", cm.into(), j, "[]".into()),
        ("POST", cm.into(), j, "\"str\"".into()),
        ("POST", cm.into(), j, "".into()),
        ("POST", cm.into(), j, r#"{"metadata":"x"}"#.into()),
        ("POST", cm.into(), j, r#"{"metadata":{"name":5}}"#.into()),
        (
            "POST",
            cm.into(),
            j,
            r#"{"apiVersion":5,"metadata":{"name":"a"}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","labels":"x"}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","labels":{"k":5}}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","annotations":{"bad key!":"v"}}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","finalizers":"x"}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","ownerReferences":[{}]}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"a","ownerReferences":"x"}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            j,
            r#"{"metadata":{"name":"ünïcode"}}"#.into(),
        ),
        (
            "POST",
            cm.into(),
            "application/vnd.kubernetes.protobuf",
            "xx".into(),
        ),
        ("POST", cm.into(), "application/yaml", "a: [b".into()),
        ("POST", format!("{cm}/x"), j, "{}".into()),
        ("PUT", format!("{cm}/x"), j, "{}".into()),
        (
            "PATCH",
            format!("{cm}/x"),
            "application/merge-patch+json",
            "{}".into(),
        ),
        ("PATCH", format!("{cm}/x"), "text/plain", "{}".into()),
        ("GET", format!("{cm}?limit=-1"), j, "".into()),
        ("GET", format!("{cm}?limit=abc"), j, "".into()),
        ("GET", format!("{cm}?continue=zz"), j, "".into()),
        ("GET", format!("{cm}?continue=%ff%fe"), j, "".into()),
        (
            "GET",
            format!("{cm}?watch=true&resourceVersion=abc"),
            j,
            "".into(),
        ),
        (
            "GET",
            format!("{cm}?watch=true&timeoutSeconds=-5"),
            j,
            "".into(),
        ),
        (
            "GET",
            format!("{cm}?labelSelector=a%20in%20(b"),
            j,
            "".into(),
        ),
        ("GET", format!("{cm}?labelSelector=!!a"), j, "".into()),
        (
            "GET",
            format!("{cm}?fieldSelector=metadata.name"),
            j,
            "".into(),
        ),
        (
            "GET",
            "/api/v1/namespaces//configmaps/x".into(),
            j,
            "".into(),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x/y/z/w".into(),
            j,
            "".into(),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x/status".into(),
            j,
            "".into(),
        ),
        (
            "GET",
            "/api/v1/namespaces/Bad_NS/configmaps".into(),
            j,
            "".into(),
        ),
        ("GET", "/api/v1/configmaps/x".into(), j, "".into()),
        ("GET", "/apis/apps/v9/deployments".into(), j, "".into()),
        ("DELETE", format!("{cm}/x"), j, "{not json".into()),
        (
            "DELETE",
            format!("{cm}/x"),
            j,
            r#"{"propagationPolicy":"Sideways"}"#.into(),
        ),
        (
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews/x".into(),
            j,
            "{}".into(),
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/pods/x/scale".into(),
            j,
            "{}".into(),
        ),
        (
            "POST",
            format!("{cm}?dryRun=Some"),
            j,
            r#"{"metadata":{"name":"a"}}"#.into(),
        ),
    ];
    for (m, path, ct, body) in &cases {
        let (code, v) = raw(&url, m, path, ct, body).await;
        assert!(code >= 400, "{m} {path} {body}: {code} {v}");
        assert_eq!(v["kind"], "Status", "{m} {path} {body}: {v}");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["code"], code);
        assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
    assert!(
        s.list_objects("v1", "configmaps", Some("default"))
            .is_empty()
    );
    // outside every served API group: kube-apiserver's plain-text 404
    for path in ["/apis/nope.io/v1", "/apis/nope.io/v1/things", "/nonsense"] {
        let (code, v) = raw(&url, "GET", path, j, "").await;
        assert_eq!((code, v), (404, serde_json::Value::Null), "{path}");
    }

    // patches that would break the object
    let (c, _) = raw(&url, "POST", cm, j, r#"{"metadata":{"name":"p"}}"#).await;
    assert_eq!(c, 201);
    let patches = [
        (
            "application/json-patch+json",
            r#"[{"op":"replace","path":"","value":[]}]"#,
        ),
        (
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/metadata","value":"x"}]"#,
        ),
        ("application/json-patch+json", r#"{"op":"add"}"#),
        (
            "application/merge-patch+json",
            r#"{"metadata":{"name":"other"}}"#,
        ),
        (
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"bad key":"v"}}}"#,
        ),
        ("application/merge-patch+json", "[1]"),
        ("application/strategic-merge-patch+json", "7"),
        (
            "application/apply-patch+yaml",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"p"}}"#,
        ),
    ];
    for (ct, body) in patches {
        let (code, v) = raw(&url, "PATCH", &format!("{cm}/p"), ct, body).await;
        assert!(code >= 400, "{ct} {body}: {code} {v}");
        assert_eq!(v["kind"], "Status");
    }
    let p = s
        .get_object("v1", "configmaps", Some("default"), "p")
        .unwrap();
    assert_eq!(p["metadata"]["name"], "p");
    assert!(p["metadata"]["labels"].is_null());
    // still serving
    let (c, _) = raw(&url, "GET", &format!("{cm}/p"), j, "").await;
    assert_eq!(c, 200);
}

#[tokio::test]
async fn huge_timeout_values_do_not_panic() {
    let s = apisim::ApiServer::new();
    let mut svc = s.service();
    for t in ["18446744073709551615", "99999999999999999999"] {
        let req = http::Request::get(format!(
            "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds={t}"
        ))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
        let resp = tower::Service::call(&mut svc, req).await.unwrap();
        assert!(
            resp.status() == 200 || resp.status() == 400,
            "{}",
            resp.status()
        );
    }
    // the server still answers
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::default_namespaced(s.client());
    assert!(
        cms.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
