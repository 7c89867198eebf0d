//! CRDs: install → discovery → create CRs → schema validation (422 naming the field),
//! pruning, defaulting, status/scale subresources, CRD deletion.

mod common;
use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Discovery;
use serde_json::{Value, json};

pub fn memcached_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "memcacheds.cache.example.com"},
        "spec": {
            "group": "cache.example.com",
            "names": {"kind": "Memcached", "plural": "memcacheds", "singular": "memcached", "shortNames": ["mc"], "categories": ["all"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 100},
                                "containerPort": {"type": "integer", "format": "int32", "default": 11211, "minimum": 1, "maximum": 65535},
                                "image": {"type": "string", "minLength": 1, "maxLength": 20, "nullable": true},
                                "mode": {"type": "string", "enum": ["fast", "safe"]},
                                "tag": {"type": "string", "pattern": "^[a-z]+$"},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "port": {"x-kubernetes-int-or-string": true},
                                "list": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "replicas": {"type": "integer"},
                                "selector": {"type": "string"}
                            }
                        }
                    }
                }}
            }]
        }
    })
}

fn ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1", "Memcached"),
        "memcacheds",
    )
}

fn mc(name: &str, spec: Value) -> DynamicObject {
    from_json(
        json!({"apiVersion": "cache.example.com/v1", "kind": "Memcached", "metadata": {"name": name}, "spec": spec}),
    )
}

async fn install(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &from_json(memcached_crd()))
        .await
        .unwrap();
    let conds = crd.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "NamesAccepted" && c.status == "True")
    );
}

#[tokio::test]
async fn crd_install_discovery_validation() {
    let s = apisim::ApiServer::new();
    let (_h, client) = http_client(&s).await;
    install(&client).await;
    let d = Discovery::new(client.clone()).run().await.unwrap();
    let (found, caps) = d
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(r, _)| r.kind == "Memcached")
        .expect("Memcached discovered");
    assert_eq!(found.plural, "memcacheds");
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "memcacheds/status" || r.plural == "status")
    );

    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar());
    // valid: defaulting + pruning
    let out = api
        .create(
            &PostParams::default(),
            &mc(
                "a",
                json!({"size": 3, "unknown": 1, "extra": {"kept": true}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(out.data["spec"]["containerPort"], 11211);
    assert!(out.data["spec"].get("unknown").is_none());
    assert_eq!(out.data["spec"]["extra"]["kept"], true);
    assert_eq!(out.metadata.generation, Some(1));

    let bad = [
        (
            json!({"size": -1}),
            "spec.size",
            "Memcached.cache.example.com \"bad\" is invalid: spec.size: Invalid value: -1: spec.size in body should be greater than or equal to 0",
        ),
        (
            json!({"size": 101}),
            "spec.size",
            "spec.size in body should be less than or equal to 100",
        ),
        (
            json!({"size": "x"}),
            "spec.size",
            "spec.size in body must be of type integer",
        ),
        (json!({}), "spec.size", "spec.size: Required value"),
        (
            json!({"size": 1, "mode": "slow"}),
            "spec.mode",
            "Unsupported value: \"slow\"",
        ),
        (
            json!({"size": 1, "tag": "A1"}),
            "spec.tag",
            "should match '^[a-z]+$'",
        ),
        (
            json!({"size": 1, "image": "x".repeat(21)}),
            "spec.image",
            "Too long",
        ),
        (
            json!({"size": 1, "image": ""}),
            "spec.image",
            "at least 1 chars long",
        ),
        (
            json!({"size": 1, "list": ["a", "b", "c"]}),
            "spec.list",
            "Too many",
        ),
        (
            json!({"size": 1, "labels": {"a": 1}}),
            "spec.labels.a",
            "must be of type string",
        ),
        (
            json!({"size": 1, "port": true}),
            "spec.port",
            "int-or-string",
        ),
        (json!({"size": 3000000000u64}), "spec.size", "int32"),
    ];
    for (spec, field, msg) in bad {
        let e = status(
            api.create(&PostParams::default(), &mc("bad", spec.clone()))
                .await
                .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{spec}");
        assert!(e.message.contains(msg), "{spec}: {}", e.message);
        let causes = e.details.unwrap().causes;
        assert!(
            causes.iter().any(|c| c.field == field),
            "{spec}: {causes:?}"
        );
    }
    // ok variants
    api.create(
        &PostParams::default(),
        &mc("ok1", json!({"size": 0, "image": null, "port": "http"})),
    )
    .await
    .unwrap();
    assert!(
        s.get_object("cache.example.com/v1", "memcacheds", Some("default"), "bad")
            .is_none()
    );
    // fieldValidation=Strict turns pruning into a 422 on the patch
    let pp = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..Default::default()
    };
    let e = status(
        api.patch("a", &pp, &Patch::Merge(json!({"spec": {"bogus": 1}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .ends_with("strict decoding error: unknown field \"spec.bogus\""),
        "{}",
        e.message
    );
    assert_eq!(e.details.unwrap().causes[0].field, "patch");
    // strategic merge is not supported for CRs
    let e = status(
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 415);
    // custom resources need a resourceVersion on PUT
    let mut cur = api.get("a").await.unwrap();
    cur.metadata.resource_version = None;
    let e = status(
        api.replace("a", &PostParams::default(), &cur)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("metadata.resourceVersion"),
        "{}",
        e.message
    );
    // update validates too
    let e = status(
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": -5}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn crd_status_and_scale_subresources_and_deletion() {
    let s = apisim::ApiServer::new();
    let client = s.client();
    install(&client).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar());
    api.create(&PostParams::default(), &mc("m", json!({"size": 2})))
        .await
        .unwrap();
    // status via main resource is ignored; via /status it's kept; spec via /status ignored
    let out = api
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert!(out.data.get("status").is_none());
    let out = api
        .patch_status(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"size": 50}, "status": {"replicas": 2, "selector": "app=m"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(out.data["status"]["replicas"], 2);
    assert_eq!(out.data["spec"]["size"], 2);
    assert_eq!(out.metadata.generation, Some(1));
    // scale subresource
    let sc = api.get_scale("m").await.unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(2));
    assert_eq!(sc.status.as_ref().unwrap().replicas, 2);
    assert_eq!(sc.status.unwrap().selector.as_deref(), Some("app=m"));
    let sc = api
        .patch_scale(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(5));
    let cur = api.get("m").await.unwrap();
    assert_eq!(cur.data["spec"]["size"], 5);
    assert_eq!(cur.metadata.generation, Some(2));
    let e = status(
        api.patch_scale(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 500}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // deleting the CRD deletes its objects, removes the kind and ends its watches
    let mut watch = Box::pin(api.watch(&Default::default(), "0").await.unwrap());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("memcacheds.cache.example.com", &Default::default())
        .await
        .unwrap();
    assert!(
        s.list_objects("cache.example.com/v1", "memcacheds", None)
            .is_empty()
    );
    use futures::StreamExt;
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(Ok(_)) = watch.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "watch ended when the CRD was deleted");
    let e = status(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 404);
    let d = Discovery::new(client.clone()).run().await.unwrap();
    assert!(!d.groups().any(|g| g.name() == "cache.example.com"));
}

#[tokio::test]
async fn crd_validation_errors() {
    let s = apisim::ApiServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    let mut bad = memcached_crd();
    bad["metadata"]["name"] = json!("wrong.name");
    let e = status(
        crds.create(&PostParams::default(), &from_json(bad))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let mut bad = memcached_crd();
    bad["spec"]["names"]["plural"] = json!("configmaps");
    bad["spec"]["group"] = json!("");
    bad["metadata"]["name"] = json!("configmaps.");
    let e = status(
        crds.create(&PostParams::default(), &from_json(bad))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn apply_uses_list_map_keys_from_the_schema() {
    let s = apisim::ApiServer::new();
    let c = s.client();
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.x.io"},
        "spec": {"group": "x.io", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "members": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "role": {"type": "string"}}}},
                    "tags": {"type": "array", "items": {"type": "string"}}
                }}}}}}]}
    });
    crds.create(&PostParams::default(), &from_json(crd))
        .await
        .unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("x.io", "v1", "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), "default", &ar);
    let w = |spec: Value| json!({"apiVersion": "x.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec});
    api.patch(
        "w",
        &PatchParams::apply("a"),
        &Patch::Apply(w(
            json!({"members": [{"name": "m1", "role": "x"}], "tags": ["t1"]}),
        )),
    )
    .await
    .unwrap();
    // b adds its own member: merged by key, no conflict
    let out = api
        .patch(
            "w",
            &PatchParams::apply("b"),
            &Patch::Apply(w(json!({"members": [{"name": "m2"}]}))),
        )
        .await
        .unwrap();
    assert_eq!(out.data["spec"]["members"].as_array().unwrap().len(), 2);
    // the atomic list conflicts
    let e = status(
        api.patch(
            "w",
            &PatchParams::apply("b"),
            &Patch::Apply(w(json!({"members": [{"name": "m2"}], "tags": ["t2"]}))),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert!(e.message.contains(".spec.tags"), "{}", e.message);
    // a drops m1: only m1 goes
    let out = api
        .patch(
            "w",
            &PatchParams::apply("a"),
            &Patch::Apply(w(json!({"tags": ["t1"]}))),
        )
        .await
        .unwrap();
    let members: Vec<&str> = out.data["spec"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(members, vec!["m2"]);
}
