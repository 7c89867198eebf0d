//! Conformance-style suite: requests and the observable answers kube-apiserver gives.
//!
//! Written once against a `kube::Client` and run, as ordinary tests, against apisim and
//! against the real control plane (`crates/envtest`) at the oldest and newest pinned
//! Kubernetes versions; set `APISIM_CONFORMANCE_KUBECONFIG=/path/to/kubeconfig` and pass
//! `--ignored` to run it against any other cluster as well (in a generated namespace, deleted
//! at the end). Where
//! apisim knowingly differs (the README's "Known approximations"), the suite asserts the
//! real behaviour on real servers and apisim's on apisim.

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

/// The ConfigMap kube-controller-manager publishes into every namespace.
const ROOT_CA: &str = "kube-root-ca.crt";

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    from_json(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
}

async fn suite(c: kube::Client, ns: &str, server: Server) {
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let pp = PostParams::default();

    // kube-controller-manager publishes the cluster CA into every namespace; apisim does not
    // (README, "Known approximations").
    if server == Server::Real {
        let cms = cms.clone();
        eventually(30, "kube-root-ca.crt published", move || {
            let cms = cms.clone();
            async move { cms.get_opt(ROOT_CA).await.unwrap() }
        })
        .await;
    } else {
        assert!(cms.get_opt(ROOT_CA).await.unwrap().is_none());
    }

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
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "ConfigMap \"badlabel\" is invalid: metadata.labels: Invalid value: \"has space\": a valid label \
         must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start \
         and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used \
         for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    );
    // missing name
    let e = status(
        cms.create(&pp, &from_json(json!({"metadata": {}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );

    // selectors
    cms.create(&pp, &cm("b", json!({"tier": "back"})))
        .await
        .unwrap();
    cms.create(&pp, &cm("c", json!({"tier": "back", "x": "1"})))
        .await
        .unwrap();
    let names = |lp: ListParams| {
        let cms = cms.clone();
        async move {
            let mut v: Vec<String> = cms
                .list(&lp)
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(
        names(ListParams::default().labels("tier=back")).await,
        ["b", "c"]
    );
    assert_eq!(
        names(ListParams::default().labels("tier in (front,back),!x")).await,
        ["a", "b"]
    );
    // `notin` also selects objects without the label: on a real server that includes the
    // namespace's kube-root-ca.crt.
    let mut notin = vec!["b", "c"];
    if server == Server::Real {
        notin.push(ROOT_CA);
    }
    assert_eq!(
        names(ListParams::default().labels("tier notin (front)")).await,
        notin
    );
    assert_eq!(
        names(ListParams::default().fields("metadata.name=b")).await,
        ["b"]
    );
    let e = status(
        cms.list(&ListParams::default().fields("data.k=v"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        e.message,
        "\"data.k\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );

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
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "the server rejected our request due to an error in our request"
    );

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
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
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
    // autoscaling/v1 Scale omits spec.replicas when it is 0
    let sc = deps.get_scale("d").await.unwrap();
    assert_eq!(sc.spec.unwrap().replicas, None);
    assert_eq!(sc.status.unwrap().replicas, 0);
    let sc = deps
        .patch_scale(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(2));
    let d = deps.get("d").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(2));

    // a group the server does not serve: a plain-text 404 (kube-rs makes a Status of it);
    // a served group's unknown resource or version: a NotFound Status
    let ar = kube::api::ApiResource {
        group: "nope.conformance.example.com".into(),
        version: "v1".into(),
        api_version: "nope.conformance.example.com/v1".into(),
        kind: "Nope".into(),
        plural: "nopes".into(),
    };
    let nopes: Api<kube::api::DynamicObject> = Api::namespaced_with(c.clone(), ns, &ar);
    let e = status(nopes.get("x").await.unwrap_err());
    assert_eq!(
        (e.code, e.message.as_str(), e.reason.as_str()),
        (404, "404 page not found", "Failed to parse error data")
    );
    for path in [
        format!("/apis/apps/v1/namespaces/{ns}/nopes"),
        "/apis/apps/v9".to_string(),
        format!("/api/v1/namespaces/{ns}/nopes"),
    ] {
        let (code, _, out) = send(&c, "GET", &path, "", json!(null)).await;
        assert_eq!(
            (code, &out["reason"], &out["message"]),
            (
                404,
                &json!("NotFound"),
                &json!("the server could not find the requested resource")
            ),
            "{path}"
        );
    }

    // creating in a missing namespace
    let other: Api<ConfigMap> = Api::namespaced(c.clone(), &format!("{ns}-missing"));
    let e = status(other.create(&pp, &cm("x", json!({}))).await.unwrap_err());
    assert_eq!(e.code, 404);
    assert_eq!(e.message, format!("namespaces \"{ns}-missing\" not found"));

    unknown_fields(&c, ns).await;
    cluster_ip_for_life(&c, ns).await;
}

/// A Service keeps its cluster IP, or its lack of one (headless), for life: an apply of the
/// other form is refused on `spec.clusterIPs[0]`; a headless Service lists `None`.
async fn cluster_ip_for_life(c: &kube::Client, ns: &str) {
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), ns);
    let apply = PatchParams::apply("conformance").force();
    let service = |name: &str, headless: bool| {
        let mut spec = json!({"selector": {"app": name}, "ports": [{"port": 11211}]});
        if headless {
            spec["clusterIP"] = json!("None");
        }
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
    };
    let with_ip = services
        .patch("with-ip", &apply, &Patch::Apply(service("with-ip", false)))
        .await
        .unwrap();
    let ip = with_ip.spec.and_then(|s| s.cluster_ip).unwrap();
    assert!(ip != "None" && !ip.is_empty(), "{ip}");
    let e = status(
        services
            .patch("with-ip", &apply, &Patch::Apply(service("with-ip", true)))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    assert!(
        e.message.contains("spec.clusterIPs[0]: Invalid value: ")
            && e.message.ends_with("may not change once set"),
        "{}",
        e.message
    );
    let headless = services
        .patch("headless", &apply, &Patch::Apply(service("headless", true)))
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(headless.cluster_ips, Some(vec!["None".to_string()]));
}

/// A raw request: (HTTP status, the `Warning` headers, the JSON body).
async fn send(
    c: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: serde_json::Value,
) -> (u16, Vec<String>, serde_json::Value) {
    use http_body_util::BodyExt;
    let mut req = http::Request::builder().method(method).uri(path);
    if !content_type.is_empty() {
        req = req.header("content-type", content_type);
    }
    let body = if body.is_null() {
        vec![]
    } else {
        body.to_string().into_bytes()
    };
    let req = req.body(kube::client::Body::from(body)).unwrap();
    let res = c.send(req).await.unwrap();
    let code = res.status().as_u16();
    let warnings = res
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    // not every answer is JSON: "404 page not found" is text
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (code, warnings, body)
}

fn warning(text: &str) -> String {
    format!("299 - {}", serde_json::to_string(text).unwrap())
}

/// Fields the server's schema does not declare: server-side apply refuses them (500, whatever
/// fieldValidation says); create, update and patch drop them with a warning (kube-rs sends no
/// fieldValidation, and the server's default is Warn), or refuse them with Strict.
async fn unknown_fields(c: &kube::Client, ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let deps: Api<Deployment> = Api::namespaced(c.clone(), ns);

    // server-side apply: a ConfigMap with an unknown top-level field
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa-unknown"},
        "data": {"k": "v"}, "someUnknownField": 1});
    for pp in [
        PatchParams::apply("conf"),
        PatchParams::apply("conf").validation_ignore(),
        PatchParams::apply("conf").validation_strict(),
    ] {
        let e = status(
            cms.patch("ssa-unknown", &pp, &Patch::Apply(&obj))
                .await
                .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (500, ""), "{e:?}");
        assert_eq!(
            e.message,
            "failed to create typed patch object (/ssa-unknown; /v1, Kind=ConfigMap): \
             .someUnknownField: field not declared in schema"
        );
    }
    assert!(cms.get_opt("ssa-unknown").await.unwrap().is_none());

    // a Deployment whose pod spec has topologySpreadConstraints[0].someUnknownField (keyed
    // list items are named by their keys), with the namespace in the body
    let dep = |extra: serde_json::Value| {
        let mut tsc = json!({"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway"});
        if let (Some(t), Some(x)) = (tsc.as_object_mut(), extra.as_object()) {
            t.extend(x.clone());
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "ssa-tsc", "namespace": ns},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "tsc"}},
                "template": {"metadata": {"labels": {"app": "tsc"}}, "spec": {
                    "topologySpreadConstraints": [tsc],
                    "containers": [{"name": "c", "image": "busybox"}]}}}})
    };
    let e = status(
        deps.patch(
            "ssa-tsc",
            &PatchParams::apply("conf"),
            &Patch::Apply(dep(json!({"someUnknownField": "x"}))),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (500, ""), "{e:?}");
    assert_eq!(
        e.message,
        format!(
            "failed to create typed patch object ({ns}/ssa-tsc; apps/v1, Kind=Deployment): \
             .spec.template.spec.topologySpreadConstraints[topologyKey=\"topology.kubernetes.io/zone\",\
             whenUnsatisfiable=\"ScheduleAnyway\"].someUnknownField: field not declared in schema"
        )
    );
    // several: one line each (the real server lists them in no fixed order)
    let e = status(
        deps.patch(
            "ssa-tsc",
            &PatchParams::apply("conf"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "ssa-tsc", "bogusMeta": 1},
                "spec": {"selector": {"matchLabels": {"app": "tsc"}},
                    "template": {"metadata": {"labels": {"app": "tsc"}}, "spec": {
                        "tolerations": [{"key": "k", "bogusT": 1}],
                        "containers": [{"name": "c", "image": "busybox",
                            "ports": [{"containerPort": 80, "bogusP": 1}]}]}}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 500);
    let (head, rest) = e
        .message
        .split_once(": errors:\n  ")
        .expect("several errors");
    assert_eq!(
        head,
        "failed to create typed patch object (/ssa-tsc; apps/v1, Kind=Deployment)"
    );
    let mut lines: Vec<&str> = rest.split("\n  ").collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            ".metadata.bogusMeta: field not declared in schema",
            ".spec.template.spec.containers[name=\"c\"].ports[containerPort=80,protocol=\"TCP\"].bogusP: field not declared in schema",
            ".spec.template.spec.tolerations[0].bogusT: field not declared in schema",
        ]
    );
    // the same applied without the unknown field works
    deps.patch(
        "ssa-tsc",
        &PatchParams::apply("conf"),
        &Patch::Apply(dep(json!({}))),
    )
    .await
    .unwrap();

    // create: the unknown fields are dropped, one warning each
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "post-unknown"},
        "data": {"k": "v"}, "someUnknownField": 1, "other": {"x": 1}});
    let (code, mut warnings, out) = send(c, "POST", &base, "application/json", body.clone()).await;
    assert_eq!(code, 201, "{out}");
    warnings.sort();
    assert_eq!(
        warnings,
        [
            warning("unknown field \"other\""),
            warning("unknown field \"someUnknownField\""),
        ]
    );
    assert!(out.get("someUnknownField").is_none() && out.get("other").is_none());
    assert_eq!(out["data"], json!({"k": "v"}));
    let (_, _, stored) = send(c, "GET", &format!("{base}/post-unknown"), "", json!(null)).await;
    assert!(stored.get("someUnknownField").is_none(), "{stored}");
    // ... refused with fieldValidation=Strict
    let mut strict = body.clone();
    strict["metadata"]["name"] = json!("post-strict");
    let (code, _, out) = send(
        c,
        "POST",
        &format!("{base}?fieldValidation=Strict"),
        "application/json",
        strict,
    )
    .await;
    assert_eq!((code, out["reason"].as_str()), (400, Some("BadRequest")));
    let msg = out["message"].as_str().unwrap();
    let (head, fields) = msg.split_once("strict decoding error: ").unwrap();
    assert_eq!(
        head,
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: "
    );
    let mut fields: Vec<&str> = fields.split(", ").collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "unknown field \"other\"",
            "unknown field \"someUnknownField\""
        ]
    );
    // ... silently with Ignore
    let mut ignore = body.clone();
    ignore["metadata"]["name"] = json!("post-ignore");
    let (code, warnings, out) = send(
        c,
        "POST",
        &format!("{base}?fieldValidation=Ignore"),
        "application/json",
        ignore,
    )
    .await;
    assert_eq!((code, warnings.len()), (201, 0));
    assert!(out.get("someUnknownField").is_none());
    // nested: named by index
    let (code, warnings, _) = send(
        c,
        "POST",
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        "application/json",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "post-nested"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "n"}},
                "template": {"metadata": {"labels": {"app": "n"}}, "spec": {
                    "containers": [{"name": "c", "image": "busybox", "bogus": 1}]}}}}),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(
        warnings,
        [warning(
            "unknown field \"spec.template.spec.containers[0].bogus\""
        )]
    );

    // update and patches: the same
    let (code, warnings, out) = send(
        c,
        "PUT",
        &format!("{base}/post-unknown"),
        "application/json",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "post-unknown"},
            "data": {"k": "w"}, "someUnknownField": 1}),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(warnings, [warning("unknown field \"someUnknownField\"")]);
    assert!(out.get("someUnknownField").is_none());
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let (code, warnings, out) = send(
            c,
            "PATCH",
            &format!("{base}/post-unknown"),
            ct,
            json!({"someUnknownField": 1, "data": {"q": "r"}}),
        )
        .await;
        assert_eq!(code, 200, "{ct}: {out}");
        assert_eq!(
            warnings,
            [warning("unknown field \"someUnknownField\"")],
            "{ct}"
        );
        assert!(out.get("someUnknownField").is_none());
        assert_eq!(out["data"]["q"], "r");
    }
    // a strict patch is refused as an invalid `patch`
    let (code, _, out) = send(
        c,
        "PATCH",
        &format!("{base}/post-unknown?fieldValidation=Strict"),
        "application/strategic-merge-patch+json",
        json!({"someUnknownField": 1}),
    )
    .await;
    assert_eq!((code, out["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(
        out["message"],
        " \"\" is invalid: patch: Invalid value: \"map[someUnknownField:1]\": \
         strict decoding error: unknown field \"someUnknownField\""
    );
    assert_eq!(out["details"]["causes"][0]["field"], "patch");
    let (code, _, out) = send(
        c,
        "PATCH",
        &format!("{base}/post-unknown?fieldValidation=Strict"),
        "application/merge-patch+json",
        json!({"someUnknownField": 1}),
    )
    .await;
    assert_eq!((code, out["reason"].as_str()), (422, Some("Invalid")));
    let msg = out["message"].as_str().unwrap();
    assert!(
        msg.starts_with(" \"\" is invalid: patch: Invalid value: \"{")
            && msg.ends_with("}\": strict decoding error: unknown field \"someUnknownField\""),
        "{msg}"
    );

    unknown_fields_of_custom_resources(c, ns).await;
    dropped_object_goes_with_its_defaults(c, ns).await;
}

/// Server-side apply: an object a manager stops applying goes as a whole, with the fields
/// the server defaulted in it (the real server tracks the object itself as a member, `.`);
/// left behind, those defaults would fail the schema's `required` of the fields removed.
async fn dropped_object_goes_with_its_defaults(c: &kube::Client, ns: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let crd: CustomResourceDefinition = from_json(json!({
        "metadata": {"name": "gadgets.conformance.apisim.example.com"},
        "spec": {"group": "conformance.apisim.example.com", "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "size": {"type": "integer"},
                    "opt": {"type": "object", "required": ["max"], "properties": {
                        "max": {"type": "integer"},
                        "min": {"type": "integer", "default": 1}}}}}}}}}]}}));
    crds.patch(
        "gadgets.conformance.apisim.example.com",
        &PatchParams::apply("conf").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let base = format!("/apis/conformance.apisim.example.com/v1/namespaces/{ns}/gadgets");
    {
        let c = c.clone();
        let base = base.clone();
        eventually(30, "gadgets served", move || {
            let c = c.clone();
            let base = base.clone();
            async move { (send(&c, "GET", &base, "", json!(null)).await.0 == 200).then_some(()) }
        })
        .await;
    }
    let apply = |spec: serde_json::Value| {
        let (c, url) = (c.clone(), format!("{base}/g?fieldManager=conf&force=true"));
        async move {
            send(
                &c,
                "PATCH",
                &url,
                "application/apply-patch+yaml",
                json!({"apiVersion": "conformance.apisim.example.com/v1", "kind": "Gadget",
                       "metadata": {"name": "g"}, "spec": spec}),
            )
            .await
        }
    };
    let (code, _, out) = apply(json!({"size": 1, "opt": {"max": 3}})).await;
    assert_eq!(code, 201, "{out}");
    assert_eq!(out["spec"]["opt"], json!({"max": 3, "min": 1}), "{out}");
    let (code, _, out) = apply(json!({"size": 1})).await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["spec"], json!({"size": 1}), "{out}");
}

/// The same for a custom resource: its CRD's structural schema decides what is unknown;
/// its `metadata` is an ObjectMeta.
async fn unknown_fields_of_custom_resources(c: &kube::Client, ns: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let crd: CustomResourceDefinition = from_json(json!({
        "metadata": {"name": "widgets.conformance.apisim.example.com"},
        "spec": {"group": "conformance.apisim.example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "size": {"type": "integer"},
                    "items": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}}}}}}}}}}]}}));
    crds.patch(
        "widgets.conformance.apisim.example.com",
        &PatchParams::apply("conf").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let base = format!("/apis/conformance.apisim.example.com/v1/namespaces/{ns}/widgets");
    {
        let c = c.clone();
        let base = base.clone();
        eventually(30, "widgets served", move || {
            let c = c.clone();
            let base = base.clone();
            async move { (send(&c, "GET", &base, "", json!(null)).await.0 == 200).then_some(()) }
        })
        .await;
    }
    // (one unknown field per object: the real server reports only the first it meets in an
    // object, in no fixed order, and does not look further into that object)
    let (code, _, out) = send(
        c,
        "PATCH",
        &format!("{base}/w?fieldManager=conf"),
        "application/apply-patch+yaml",
        json!({"apiVersion": "conformance.apisim.example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "bogusMeta": 1},
            "spec": {"size": 1, "items": [{"name": "a", "zz": 1}]}}),
    )
    .await;
    assert_eq!((code, out.get("reason")), (500, None), "{out}");
    let msg = out["message"].as_str().unwrap();
    let (head, rest) = msg.split_once(": errors:\n  ").expect("several errors");
    assert_eq!(
        head,
        "failed to create typed patch object (/w; conformance.apisim.example.com/v1, Kind=Widget)"
    );
    let mut lines: Vec<&str> = rest.split("\n  ").collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            ".metadata.bogusMeta: field not declared in schema",
            ".spec.items[0].zz: field not declared in schema",
        ]
    );
    let body = json!({"apiVersion": "conformance.apisim.example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "bogusMeta": 1},
        "spec": {"size": 1, "bogus": 2, "items": [{"name": "a", "zz": 1}]}, "top": 1});
    let (code, mut warnings, out) = send(c, "POST", &base, "application/json", body.clone()).await;
    assert_eq!(code, 201, "{out}");
    warnings.sort();
    assert_eq!(
        warnings,
        [
            warning("unknown field \"metadata.bogusMeta\""),
            warning("unknown field \"spec.bogus\""),
            warning("unknown field \"spec.items[0].zz\""),
            warning("unknown field \"top\""),
        ]
    );
    assert_eq!(out["spec"], json!({"size": 1, "items": [{"name": "a"}]}));
    assert!(out["metadata"].get("bogusMeta").is_none() && out.get("top").is_none());
    let mut strict = body.clone();
    strict["metadata"] = json!({"name": "w2"});
    let (code, _, out) = send(
        c,
        "POST",
        &format!("{base}?fieldValidation=Strict"),
        "application/json",
        strict,
    )
    .await;
    assert_eq!((code, out["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        out["message"],
        "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: \
         unknown field \"spec.bogus\", unknown field \"spec.items[0].zz\", unknown field \"top\""
    );
    let (code, warnings, _) = send(
        c,
        "PATCH",
        &format!("{base}/w"),
        "application/merge-patch+json",
        json!({"spec": {"bogus": 1}}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(warnings, [warning("unknown field \"spec.bogus\"")]);
    crds.delete(
        "widgets.conformance.apisim.example.com",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
}

/// Which server the suite runs against: the few places where apisim legitimately differs
/// from kube-apiserver (documented in the crate's README, "Known approximations") ask it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Apisim,
    Real,
}

/// Runs the suite against apisim in a fresh namespace, deletes the namespace and checks that
/// it is gone.
async fn on_apisim() {
    let s = apisim::ApiServer::new();
    let c = s.client();
    let ns = format!("apisim-conf-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": ns}})),
    )
    .await
    .unwrap();
    let res = AssertUnwindSafe(suite(c.clone(), &ns, Server::Apisim))
        .catch_unwind()
        .await;
    nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    let ns2 = ns.clone();
    eventually(5, "namespace cleaned up", move || {
        let gone = s.get_object("v1", "namespaces", None, &ns2).is_none();
        async move { gone.then_some(()) }
    })
    .await;
    if let Err(p) = res {
        std::panic::resume_unwind(p);
    }
}

/// Runs the suite in a namespace of its own on the real control plane shared by this test
/// binary (`crates/envtest`).
async fn on_control_plane(kube: envtest::Kube) {
    let cp = envtest::ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let ns = cp
        .namespace("apisim-conformance")
        .await
        .unwrap_or_else(|e| panic!("namespace: {e}"));
    let c = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    eprintln!("conformance on kube-apiserver {} in {ns}", cp.version());
    suite(c, &ns, Server::Real).await;
}

/// The same suite, on every server: `conformance::apisim`, `conformance::kube_oldest`,
/// `conformance::kube_newest` (the real control plane at the oldest and newest pinned
/// Kubernetes versions), and `conformance::kubeconfig` for any cluster.
mod conformance {
    use super::*;

    #[tokio::test]
    async fn apisim() {
        on_apisim().await
    }

    #[tokio::test]
    async fn kube_oldest() {
        on_control_plane(envtest::Kube::Oldest).await
    }

    #[tokio::test]
    async fn kube_newest() {
        on_control_plane(envtest::Kube::Newest).await
    }

    /// Against the cluster of `APISIM_CONFORMANCE_KUBECONFIG` (in a generated namespace,
    /// deleted at the end), run only when asked:
    /// `APISIM_CONFORMANCE_KUBECONFIG=~/.kube/config cargo test -p apisim --test conformance -- --ignored`.
    #[tokio::test]
    #[ignore = "needs a cluster of your own: set APISIM_CONFORMANCE_KUBECONFIG and pass --ignored"]
    async fn kubeconfig() {
        let path = std::env::var("APISIM_CONFORMANCE_KUBECONFIG")
            .ok()
            .filter(|p| !p.is_empty())
            .expect("APISIM_CONFORMANCE_KUBECONFIG names the kubeconfig of the cluster to test");
        let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("kubeconfig");
        let c = kube::Client::try_from(cfg).expect("client");
        let ns = format!("apisim-conf-{}", std::process::id());
        let nss: Api<Namespace> = Api::all(c.clone());
        nss.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": ns}})),
        )
        .await
        .unwrap();
        let res = AssertUnwindSafe(suite(c.clone(), &ns, Server::Real))
            .catch_unwind()
            .await;
        let _ = nss.delete(&ns, &DeleteParams::default()).await;
        if let Err(p) = res {
            std::panic::resume_unwind(p);
        }
    }
}
