//! The list of a pool's children drives every consumer of it: a child added to the list
//! (here a ConfigMap `NAME-extra`, wanted while the pods carry the annotation `extra`) is
//! created, repaired and deleted by the reconciler, dry-run by the validating webhook's
//! children check, and granted by the generated RBAC, with no other change anywhere.

use std::sync::LazyLock;
use std::time::Duration;

use apisim::{ApiServer, Fault};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders::{self, BuildSettings};
use memcached_operator::children::{CHILDREN, Child, Desired, Keep, Kind, Report};
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::rbac;
use memcached_operator::webhook::dry_run::{ChildrenCheck, Verdict};
use serde_json::json;

mod common;
use common::wait_for;

/// The extra child: a ConfigMap owned and labelled as every child is.
fn extra(mc: &Memcached) -> Result<Option<Desired>, builders::BuildError> {
    let wanted = mc
        .spec
        .pod_annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("extra"));
    if !wanted {
        return Ok(None);
    }
    let name = mc.metadata.name.as_deref().unwrap_or_default();
    Ok(Some(Desired::ConfigMap(ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{name}-extra")),
            namespace: mc.metadata.namespace.clone(),
            labels: Some(builders::labels(name)),
            owner_references: Some(vec![builders::owner_reference(mc)?]),
            ..ObjectMeta::default()
        },
        data: Some([("size".to_string(), mc.spec.size.to_string())].into()),
        ..ConfigMap::default()
    })))
}

/// [`CHILDREN`] and the extra child.
static WITH_EXTRA: LazyLock<&'static [Child]> = LazyLock::new(|| {
    let mut list = CHILDREN.to_vec();
    list.push(Child {
        role: "extra ConfigMap",
        kind: Kind::ConfigMap,
        name: |name| format!("{name}-extra"),
        build: |mc, _| extra(mc),
        report: Report::Plain,
        keep: Keep::Nothing,
    });
    Box::leak(list.into_boxed_slice())
});

async fn server() -> (ApiServer, Client) {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(20))
        .build();
    let client = server.client();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("CRD");
    (server, client)
}

async fn apply(client: &Client, name: &str, annotations: serde_json::Value) {
    let mc = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": name}, "spec": {"size": 2, "podAnnotations": annotations}
    });
    Api::<Memcached>::namespaced(client.clone(), "default")
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&mc),
        )
        .await
        .expect("apply");
}

#[tokio::test]
async fn a_child_added_to_the_list_is_created_repaired_and_deleted_by_the_reconciler() {
    let (_server, client) = server().await;
    let config = ControllerConfig {
        children: *WITH_EXTRA,
        status_batch: Duration::ZERO,
        ..ControllerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller::run(client.clone(), config, async {
        let _ = stopped.await;
    }));
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    apply(&client, "pool", json!({"extra": "yes"})).await;
    let created = wait_for("the extra ConfigMap", || async {
        config_maps.get_opt("pool-extra").await.ok().flatten()
    })
    .await;
    let owner = created
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone());
    assert_eq!(owner.as_deref(), Some("pool"), "owned by its Memcached");

    // Drift in the new child is seen (its kind's informer) and repaired (the apply path).
    config_maps
        .patch(
            "pool-extra",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"size": "99"}})),
        )
        .await
        .expect("edit");
    wait_for("the extra ConfigMap repaired", || async {
        let cm = config_maps.get_opt("pool-extra").await.ok().flatten()?;
        (cm.data?.get("size")? == "2").then_some(())
    })
    .await;

    // No longer wanted: deleted.
    apply(&client, "pool", json!({})).await;
    wait_for("the extra ConfigMap deleted", || async {
        config_maps
            .get_opt("pool-extra")
            .await
            .ok()
            .and_then(|cm| cm.is_none().then_some(()))
    })
    .await;
    let _ = stop.send(());
    let _ = run.await;
}

#[tokio::test]
async fn a_child_added_to_the_list_is_dry_run_by_the_webhook() {
    let (server, client) = server().await;
    // The API server refuses the extra child (and only it).
    server.inject(
        Fault::new()
            .verb("patch")
            .resource("configmaps")
            .name("cache-extra")
            .status(422)
            .message("ConfigMap \"cache-extra\" is invalid"),
    );
    let mut mc = Memcached::new("cache", memcached_api::MemcachedSpec::with_size(2));
    mc.metadata.namespace = Some("default".into());
    mc.spec.pod_annotations = Some([("extra".to_string(), "yes".to_string())].into());

    let with_extra =
        ChildrenCheck::new(client.clone(), BuildSettings::default()).with_children(*WITH_EXTRA);
    match with_extra.check(&mc).await {
        Verdict::Refused(errors) => {
            let message = errors.to_string();
            assert!(
                message
                    .contains("the extra ConfigMap \"cache-extra\" built from it would be refused"),
                "{message}"
            );
        }
        other => panic!("the extra child was not dry-run: {other:?}"),
    }
    let without = ChildrenCheck::new(client, BuildSettings::default());
    assert_eq!(without.check(&mc).await, Verdict::Accepted);
}

#[test]
fn rbac_grants_what_the_listed_children_need() {
    let granted = |children: &[Child], resource: &str| {
        rbac::manager_rules_for(children)
            .iter()
            .any(|r| r.resources.contains(&resource) && r.verbs.contains(&"patch"))
    };
    let pool_only = &CHILDREN[..1];
    assert!(granted(pool_only, "deployments"));
    assert!(!granted(pool_only, "configmaps"), "no child of that kind");
    let extra_only: Vec<Child> = WITH_EXTRA.iter().rev().take(1).copied().collect();
    assert!(granted(&extra_only, "configmaps"));
    assert!(!granted(&extra_only, "deployments"));
    // The operator's own role is its list's.
    assert_eq!(rbac::manager_rules(), rbac::manager_rules_for(CHILDREN));
}

/// The proxy's pods mount its ConfigMap, so the proxy Deployment is applied only once the
/// ConfigMap is: with the ConfigMap's writes refused, turning the gutter on (a start file
/// in the ConfigMap, named by the proxy's command) leaves the proxy Deployment as it was
/// while the pool itself still follows its spec; once the writes pass, both change.
#[tokio::test]
async fn the_proxy_deployment_waits_for_its_config_map() {
    use k8s_openapi::api::apps::v1::Deployment;
    let (server, client) = server().await;
    let config = ControllerConfig {
        status_batch: Duration::ZERO,
        ..ControllerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller::run(client.clone(), config, async {
        let _ = stopped.await;
    }));
    let memcacheds = Api::<Memcached>::namespaced(client.clone(), "default");
    let apply = |spec: serde_json::Value| {
        let memcacheds = memcacheds.clone();
        async move {
            let mc = json!({
                "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                "metadata": {"name": "p"}, "spec": spec
            });
            memcacheds
                .patch("p", &PatchParams::apply("test").force(), &Patch::Apply(&mc))
                .await
                .expect("apply");
        }
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let replicas = |name: &'static str| {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.spec?.replicas)
        }
    };
    let proxy_memory = || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get_opt("p-proxy").await.ok().flatten()?;
            let command = d.spec?.template.spec?.containers.first()?.command.clone()?;
            let at = command.iter().position(|a| a == "-m")?;
            command.get(at + 1).cloned()
        }
    };
    apply(json!({"size": 2, "proxy": {"enabled": true}})).await;
    wait_for("the proxy without a gutter", || async {
        (proxy_memory().await.as_deref() == Some("8")).then_some(())
    })
    .await;

    server.inject(
        Fault::new()
            .verb("patch")
            .resource("configmaps")
            .name("p-proxy")
            .status(500),
    );
    apply(json!({"size": 3, "proxy": {"enabled": true, "gutter": {"enabled": true}}})).await;
    wait_for("the pool at its new size", || async {
        (replicas("p").await == Some(3)).then_some(())
    })
    .await;
    assert_eq!(
        proxy_memory().await.as_deref(),
        Some("8"),
        "the proxy Deployment waits for its ConfigMap"
    );

    server.clear_faults();
    wait_for("the proxy with its gutter", || async {
        (proxy_memory().await.as_deref() == Some("32")).then_some(())
    })
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let data = config_maps
        .get("p-proxy")
        .await
        .expect("ConfigMap")
        .data
        .unwrap_or_default();
    assert!(data.contains_key(memcached_operator::proxy::GUTTER_KEY));
    let _ = stop.send(());
    let _ = run.await;
}
