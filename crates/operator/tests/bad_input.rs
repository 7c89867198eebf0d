//! Bad input on the paths that do not go through the webhook: the in-memory API server
//! with the generated CRD rejects what the schema can express (422 naming the field,
//! nothing stored); what passes the schema but breaks the operator's rules (as if the
//! webhook were off) reaches the real controller, which must not panic, must create no
//! children for it, must mark it `Degraded` with reason `InvalidSpec` naming the field,
//! and must keep converging the valid objects beside it.

use std::sync::Arc;
use std::time::Duration;

use apisim::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::{Memcached, condition, validation};
use memcached_operator::controller::{self, Backoff, ControllerConfig, ReconcileCounters};
use memcached_operator::webhook::{self, Endpoint};
use serde_json::{Value, json};

mod common;
use common::bad_inputs::{SHA, memcached, schema_passes_operator_refuses, schema_rejects};
use common::wait_for;

async fn server_with_crd() -> (ApiServer, Client) {
    let server = ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(50))
        .build();
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .expect("CRD installs");
    (server, client)
}

fn dynamic(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::erase::<Memcached>(&()),
    )
}

async fn create_raw(client: &Client, object: &Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(object.clone()).expect("a DynamicObject");
    dynamic(client).create(&PostParams::default(), &obj).await
}

/// The webhook's verdict on an object, for comparison with the schema's.
fn webhook_denies(object: &Value) -> Option<String> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
            "resource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
            "operation": "CREATE",
            "userInfo": {},
            "object": object,
        }
    });
    let body = serde_json::to_vec(&review).expect("encode");
    let response = webhook::handle(Endpoint::Validate, &body, memcached_api::DEFAULT_IMAGE)
        .expect("well-formed review")
        .response
        .expect("response");
    (!response.allowed).then_some(response.result.message)
}

#[tokio::test]
async fn the_schema_rejects_what_it_can_express_and_stores_nothing() {
    let (_server, client) = server_with_crd().await;
    let cases = schema_rejects();
    for (what, object, code, needles) in &cases {
        let err = create_raw(&client, object).await.err();
        let Some(kube::Error::Api(status)) = err else {
            panic!("{what}: expected an API error, got {err:?}");
        };
        assert_eq!(status.code, *code, "{what}: {status:?}");
        for needle in needles {
            assert!(
                status.message.contains(needle),
                "{what}: {needle:?} not in {:?}",
                status.message
            );
        }
        // The webhook rejects every one of them too (defence in depth).
        assert!(
            webhook_denies(object).is_some(),
            "{what}: the webhook admits it"
        );
    }
    let stored = dynamic(&client)
        .list(&Default::default())
        .await
        .expect("list");
    assert!(
        stored.items.is_empty(),
        "nothing stored: {:?}",
        stored
            .items
            .iter()
            .map(|o| &o.metadata.name)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn unknown_fields_are_pruned_by_the_api_server_as_kubernetes_does() {
    let (_server, client) = server_with_crd().await;
    let mut object = memcached("pruned", json!({"size": 1, "replicas": 3}));
    object["extra"] = json!(true);
    // The webhook refuses them outright...
    let denial = webhook_denies(&object).expect("denied");
    assert!(
        denial.contains("spec.replicas: Forbidden: unknown field"),
        "{denial}"
    );
    // ...while the API server, without it, drops them (kube-apiserver also warns).
    let created = create_raw(&client, &object).await.expect("created");
    assert!(created.data.get("extra").is_none());
    assert!(created.data["spec"].get("replicas").is_none());
    assert_eq!(
        created.data["spec"]["containerPort"], 11211,
        "schema default"
    );
}

struct Controller {
    counters: Arc<ReconcileCounters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    fn start(client: &Client) -> Controller {
        let config = ControllerConfig {
            backoff: Backoff {
                base: Duration::from_millis(20),
                cap: Duration::from_millis(500),
            },
            ..ControllerConfig::default()
        };
        let counters = config.counters.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run(client.clone(), config, async {
            let _ = rx.await;
        }));
        Controller {
            counters,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        assert!(!self.task.is_finished(), "the controller is still running");
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the controller stops on request")
            .expect("the controller did not panic");
    }
}

#[tokio::test]
async fn invalid_objects_that_pass_the_schema_degrade_and_valid_ones_still_converge() {
    let (_server, client) = server_with_crd().await;
    let controller = Controller::start(&client);
    let bad = schema_passes_operator_refuses();
    for (name, spec, _) in &bad {
        let object = memcached(name, spec.clone());
        assert!(
            webhook_denies(&object).is_some(),
            "{name}: the webhook would have stopped it"
        );
        create_raw(&client, &object)
            .await
            .unwrap_or_else(|e| panic!("{name}: the schema lets it through: {e}"));
    }
    let good = [
        ("good-a", json!({"size": 2})),
        (
            "good-b",
            json!({"size": 1, "image": format!("memcached:1.6.39-alpine@sha256:{SHA}")}),
        ),
        ("good-c", json!({"size": 3, "containerPort": 11311})),
    ];
    for (name, spec) in &good {
        create_raw(&client, &memcached(name, spec.clone()))
            .await
            .expect("valid object created");
    }

    let memcacheds: Api<Memcached> = Api::default_namespaced(client.clone());
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let services: Api<Service> = Api::default_namespaced(client.clone());
    for (name, _, field) in &bad {
        let mc = wait_for(&format!("Degraded on {name}"), || async {
            let mc = memcacheds.get(name).await.ok()?;
            (mc.condition(condition::DEGRADED)?.status == "True").then_some(mc)
        })
        .await;
        let degraded = mc.condition(condition::DEGRADED).expect("condition");
        assert_eq!(degraded.reason, "InvalidSpec", "{name}");
        assert!(
            degraded.message.contains(field),
            "{name}: {field} not in {:?}",
            degraded.message
        );
        // The same words the webhook would have used.
        let expected = validation::validate(&mc).expect_err("invalid").to_string();
        assert!(
            degraded.message.contains(&expected),
            "{name}: {:?} vs {expected:?}",
            degraded.message
        );
    }
    let converge = |name: &'static str, size: usize| {
        let memcacheds = memcacheds.clone();
        async move {
            wait_for(&format!("{name} converged at {size}"), || async {
                let mc = memcacheds.get(name).await.ok()?;
                let status = mc.status.as_ref()?;
                let available = mc.condition(condition::AVAILABLE)?.status == "True";
                (status.nodes.len() == size && status.ready_replicas as usize == size && available)
                    .then_some(mc)
            })
            .await
        }
    };
    converge("good-a", 2).await;
    converge("good-b", 1).await;
    converge("good-c", 3).await;
    for (name, _, _) in &bad {
        assert!(
            deployments.get_opt(name).await.expect("get").is_none(),
            "{name}: no Deployment for an invalid object"
        );
        assert!(
            services.get_opt(name).await.expect("get").is_none(),
            "{name}: no Service for an invalid object"
        );
    }

    // The operator still serves: a scale of a valid object converges, and fixing an
    // invalid one makes it converge too.
    memcacheds
        .patch(
            "good-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}})),
        )
        .await
        .expect("scale");
    converge("good-a", 4).await;
    memcacheds
        .patch(
            "port-clash",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containerPort": 11211}})),
        )
        .await
        .expect("fix");
    let fixed = converge("port-clash", 2).await;
    assert_eq!(
        fixed
            .condition(condition::DEGRADED)
            .map(|c| c.status.as_str()),
        Some("False")
    );
    assert!(controller.counters.reconciles() > 0);
    controller.stop().await;
}
