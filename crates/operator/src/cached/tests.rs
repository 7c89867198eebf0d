//! The cached forms keep what the controller reads, and nothing else.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::*;
use crate::builders::{APPLIED_HASH_ANNOTATION, LABEL_INSTANCE, LABEL_NAME};
use crate::proxy::{DELETION_COST_ANNOTATION, PROXY_APP_NAME};

#[test]
fn keeps_what_the_controller_reads_and_nothing_else() {
    let pod: CachedPod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "m-abc", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
            "labels": {LABEL_INSTANCE: "m", "pod-template-hash": "h", "team": "a"},
            "annotations": {"a": "b", DELETION_COST_ANNOTATION: "998"},
            "managedFields": [{"manager": "x"}],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "m-h", "uid": "r", "controller": true}],
        },
        "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6",
            "args": ["-m", "64"]}]},
        "status": {
            "podIP": "10.0.0.7",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "memcached", "ready": true, "restartCount": 0,
                "image": "memcached:1.6", "imageID": ""}],
        },
    }))
    .unwrap_or_default();
    assert_eq!(pod.name_any(), "m-abc");
    assert_eq!(pod.namespace().as_deref(), Some("ns"));
    assert_eq!(pod.instance.as_deref(), Some("m"));
    assert!(pod.labels().is_empty() && pod.annotations().is_empty());
    assert!(pod.managed_fields().is_empty() && pod.owner_references().is_empty());
    assert_eq!(
        pod.uid().as_deref(),
        Some("u1"),
        "a pod is restarted with its uid as a precondition"
    );
    assert_eq!(pod.tls_reload_failure, None);
    assert_eq!(
        pod.deletion_cost.as_deref(),
        Some("998"),
        "the deletion cost is compared before it is written"
    );
    assert_eq!(pod.ip.as_deref(), Some("10.0.0.7"));
    assert!(pod.ready);
    assert_eq!(pod.resource_version().as_deref(), Some("7"));

    let proxy: CachedPod = serde_json::from_value(json!({
        "metadata": {"name": "m-proxy-abc", "namespace": "ns",
            "labels": {LABEL_INSTANCE: "m", LABEL_NAME: PROXY_APP_NAME}},
    }))
    .unwrap_or_default();
    assert_eq!(proxy.instance, None, "a proxy pod is no member of the pool");
}

/// Our labels copied onto a pod the pool's ReplicaSet did not make (a debugging pod, a
/// bare pod, another controller's): never one of the pool's pods.
#[test]
fn a_pod_with_copied_labels_is_not_the_pools() {
    let pod = |owners: serde_json::Value, hash: Option<&str>| -> CachedPod {
        let mut labels = json!({LABEL_INSTANCE: "m"});
        if let Some(hash) = hash {
            labels["pod-template-hash"] = json!(hash);
        }
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": labels,
                "ownerReferences": owners},
        }))
        .unwrap_or_default()
    };
    let rs = |name: &str, controller: bool| {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": "r",
            "controller": controller}])
    };
    assert_eq!(
        pod(rs("m-h", true), Some("h")).instance.as_deref(),
        Some("m")
    );
    assert_eq!(pod(json!(null), Some("h")).instance, None, "a bare pod");
    assert_eq!(
        pod(rs("m-h", true), None).instance,
        None,
        "no template hash"
    );
    assert_eq!(
        pod(rs("other-h", true), Some("h")).instance,
        None,
        "another ReplicaSet"
    );
    assert_eq!(
        pod(rs("m-h", false), Some("h")).instance,
        None,
        "not its controller"
    );
    let job = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "m-h", "uid": "j",
        "controller": true}]);
    assert_eq!(pod(job, Some("h")).instance, None, "a Job's pod");
}

/// The kubelet's shape of a native sidecar that ended (now or before its restart) with
/// the reload agent's exit code and termination message.
#[test]
fn a_refused_reload_is_read_from_the_agents_termination() {
    let with_agent = |state: serde_json::Value, last: serde_json::Value| -> CachedPod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"initContainerStatuses": [{
                "name": "tls-reload-agent", "ready": false, "restartCount": 1,
                "image": "op", "imageID": "", "state": state, "lastState": last,
            }]},
        }))
        .unwrap_or_default()
    };
    let refused = json!({"terminated": {"exitCode": 3, "reason": "Error",
        "message": "memcached could not load the certificate in /etc/memcached/tls: key mismatch"}});
    let running = json!({"running": {"startedAt": "2026-11-25T00:00:00Z"}});
    let pod = with_agent(running.clone(), refused.clone());
    assert_eq!(
        pod.tls_reload_failure,
        Some((
            3,
            "memcached could not load the certificate in /etc/memcached/tls: key mismatch"
                .to_string()
        ))
    );
    let ended_now = with_agent(refused.clone(), json!({})).tls_reload_failure;
    assert_eq!(ended_now.map(|f| f.0), Some(3));
    let invalid =
        json!({"terminated": {"exitCode": 4, "message": "tls.crt holds no PEM certificate"}});
    assert_eq!(
        with_agent(running.clone(), invalid)
            .tls_reload_failure
            .map(|f| f.0),
        Some(4)
    );
    // Recovered since: it ended with 0 after the failure (now the last state).
    let recovered = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    assert_eq!(
        with_agent(running.clone(), recovered.clone()).tls_reload_failure,
        None
    );
    // Terminated now with 0, the failure one run before: the latest ending counts.
    assert_eq!(with_agent(recovered, refused).tls_reload_failure, None);
    // Another ending (OOM-killed: 137) is the kubelet's business, not a refused reload.
    let oom = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    assert_eq!(with_agent(running, oom).tls_reload_failure, None);
}

#[test]
fn a_pod_without_status_or_ready_condition_is_not_ready() {
    let bare: CachedPod =
        serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap_or_default();
    assert!(!bare.ready && bare.ip.is_none() && bare.name_any() == "p");
    let unready: CachedPod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }))
    .unwrap_or_default();
    assert!(!unready.ready);
}

#[test]
fn a_cached_deployment_keeps_its_spec_for_the_drift_check() {
    let full: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "m", "namespace": "ns", "generation": 2,
            "managedFields": [{"manager": "x"}]},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "memcached", "args": ["-m", "64"]}]}}},
        "status": {"observedGeneration": 2, "readyReplicas": 3,
            "conditions": [{"type": "Available", "status": "True",
                "reason": "MinimumReplicasAvailable", "message": "has minimum availability"}]},
    }))
    .unwrap_or_default();
    let cached: CachedDeployment =
        serde_json::from_value(serde_json::to_value(&full).unwrap_or_default()).unwrap_or_default();
    assert_eq!(cached.replicas, Some(3));
    assert!(cached.metadata.managed_fields.is_none());
    let live = cached.live_json().unwrap_or_default();
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["-m", "64"])
    );
    assert_eq!(live["metadata"]["generation"], json!(2));
    assert_eq!(
        (&live["apiVersion"], &live["kind"]),
        (&json!("apps/v1"), &json!("Deployment"))
    );
    assert_eq!(live["status"]["readyReplicas"], json!(3));
    let view = cached.without_spec();
    let counts = DeploymentStatus {
        conditions: None,
        ..full.status.clone().unwrap_or_default()
    };
    assert_eq!(
        view.status,
        Some(counts),
        "the rollout counts, not the conditions"
    );
    assert_eq!(view.metadata.generation, Some(2));
}

/// A rollout to pods that crash (a flag memcached refuses) or never become ready: after
/// `progressDeadlineSeconds` kube-controller-manager sets `Progressing=False` with
/// reason `ProgressDeadlineExceeded` (the form below is what it writes). The cache must
/// keep that condition, and the status must say `Degraded`, not `Progressing`.
#[test]
fn a_stuck_rollout_survives_the_cache_and_is_degraded() {
    let full = json!({
        "metadata": {"name": "m", "namespace": "ns", "generation": 2},
        "spec": {"replicas": 3},
        "status": {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 1,
            "readyReplicas": 3, "availableReplicas": 3, "unavailableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                 "message": "ReplicaSet \"m-7d9c\" has timed out progressing."}]},
    });
    let cached: CachedDeployment = serde_json::from_value(full).unwrap_or_default();
    let view = cached.without_spec();
    let mut mc = memcached_api::Memcached::new("m", memcached_api::MemcachedSpec::with_size(3));
    mc.metadata.generation = Some(1);
    let status = crate::status::desired_status(
        &mc,
        &crate::status::Observed {
            deployment: Some(&view),
            pods: vec![],
            problem: None,
            proxy: None,
            reload_failures: Vec::new(),
            rollout_waiting: None,
            flush: None,
        },
        jiff::Timestamp::UNIX_EPOCH,
    );
    let get = |t: &str| status.conditions.iter().find(|c| c.type_ == t).cloned();
    let degraded = get(memcached_api::condition::DEGRADED).expect("Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "ProgressDeadlineExceeded")
    );
    assert!(
        degraded.message.contains("has timed out progressing"),
        "{}",
        degraded.message
    );
    let progressing = get(memcached_api::condition::PROGRESSING).expect("Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "ProgressDeadlineExceeded")
    );

    // Once the rollout completes, the controller replaces the condition: no longer stuck.
    let done: CachedDeployment = serde_json::from_value(json!({
        "metadata": {"name": "m", "namespace": "ns", "generation": 3},
        "status": {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 3,
            "readyReplicas": 3, "availableReplicas": 3,
            "conditions": [{"type": "Progressing", "status": "True",
                "reason": "NewReplicaSetAvailable", "message": "done"}]},
    }))
    .unwrap_or_default();
    let view = done.without_spec();
    let status = crate::status::desired_status(
        &mc,
        &crate::status::Observed {
            deployment: Some(&view),
            pods: vec![],
            problem: None,
            proxy: None,
            reload_failures: Vec::new(),
            rollout_waiting: None,
            flush: None,
        },
        jiff::Timestamp::UNIX_EPOCH,
    );
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == memcached_api::condition::DEGRADED)
        .map(|c| c.status.clone());
    assert_eq!(degraded.as_deref(), Some("False"));
}

#[test]
fn a_service_is_cached_without_its_status_and_keeps_its_spec() {
    let full: Service = serde_json::from_value(json!({
        "metadata": {"name": "m", "namespace": "ns", "managedFields": [{"manager": "x"}]},
        "spec": {"clusterIP": "None", "ports": [{"name": "memcached", "port": 11211}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}},
    }))
    .unwrap_or_default();
    let cached: CachedService =
        serde_json::from_value(serde_json::to_value(&full).unwrap_or_default()).unwrap_or_default();
    assert!(cached.metadata.managed_fields.is_none());
    let live = cached.live_json().unwrap_or_default();
    assert_eq!(live["spec"]["ports"][0]["port"], json!(11211));
    assert_eq!(
        (&live["apiVersion"], &live["kind"]),
        (&json!("v1"), &json!("Service"))
    );
    assert!(live.get("status").is_none());
    let mut other_status = full;
    other_status.status = None;
    assert_eq!(
        serde_json::from_value::<CachedService>(
            serde_json::to_value(&other_status).unwrap_or_default()
        )
        .unwrap_or_default(),
        cached,
        "status is not kept, so its churn changes nothing"
    );
}

#[test]
fn metadata_is_read_whole_except_managed_fields() {
    let json = json!({
        "name": "m", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
        "generation": 3, "generateName": "m-", "selfLink": "/x",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
        "labels": {"a": "b"}, "annotations": {"c": "d"}, "finalizers": ["f"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u-0",
            "controller": true}],
        "managedFields": [{"manager": "x", "operation": "Apply",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
    });
    let mut want: ObjectMeta = serde_json::from_value(json.clone()).unwrap_or_default();
    assert!(want.managed_fields.is_some());
    want.managed_fields = None;
    // Through a `Value` and through text (as from a watch): the same result.
    let from_value: WireMeta = serde_json::from_value(json.clone()).unwrap_or_default();
    let from_text: WireMeta = serde_json::from_str(&json.to_string()).unwrap_or_default();
    for wire in [from_value, from_text] {
        let (metadata, text) = wire.split();
        assert!(metadata.labels.is_none() && metadata.owner_references.is_none());
        assert_eq!(text.complete(&metadata), want);
        assert_eq!(
            text.owner_references(metadata.name.as_deref()),
            want.owner_references.clone().unwrap_or_default()
        );
    }
}

#[test]
fn children_are_kept_whole_for_the_drift_check() {
    let json = json!({
        "metadata": {"name": "m", "namespace": "ns",
            "labels": {LABEL_INSTANCE: "m"}, "annotations": {"h": "1"},
            "ownerReferences": [{"apiVersion": "cache.example.com/v1", "kind": "Memcached",
                "name": "m", "uid": "u", "controller": true}]},
        "spec": {"ports": [{"port": 11211}]},
    });
    let cached: CachedService = serde_json::from_str(&json.to_string()).unwrap_or_default();
    let live = cached.live_json().unwrap_or_default();
    assert_eq!(live["metadata"]["labels"], json["metadata"]["labels"]);
    assert_eq!(
        live["metadata"]["annotations"],
        json["metadata"]["annotations"]
    );
    assert_eq!(
        live["metadata"]["ownerReferences"],
        json["metadata"]["ownerReferences"]
    );
    assert_eq!(live["spec"], json["spec"]);
    assert_eq!(cached.owners()[0].name, "m");

    // A child with none of the three: an empty object, and nothing made up.
    let bare: CachedPdb =
        serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap_or_default();
    assert_eq!(bare.meta_text().text(Some("b")), "{}");
    assert!(bare.owners().is_empty());
    let live = bare.live_json().unwrap_or_default();
    assert!(live["metadata"].get("labels").is_none() && live.get("spec").is_none());
}

#[test]
fn it_is_a_fraction_of_a_pod() {
    assert!(std::mem::size_of::<CachedPod>() * 4 < std::mem::size_of::<Pod>());
}

/// Pools made from one template: their Deployments' specs differ only in the pools' names,
/// so the cache holds one text for them, and each gives back exactly the spec the API server
/// sent, also where the name is part of other values (a pool named `memcached` runs the image
/// `memcached:…` with the command `memcached`; one named `m` is in `matchLabels`).
#[test]
fn pools_of_one_template_share_one_spec_text() {
    let deployment = |name: &str, image: &str| {
        json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"replicas": 3,
                "selector": {"matchLabels": {LABEL_INSTANCE: name}},
                "template": {"metadata": {"labels": {LABEL_INSTANCE: name}},
                    "spec": {"containers": [{"name": "memcached", "image": image,
                        "command": ["memcached", "-m", "64"]}]}}},
        })
    };
    let cache = |json: &Value| -> CachedDeployment {
        serde_json::from_str(&json.to_string()).unwrap_or_default()
    };
    let sent = [
        deployment("sessions", "memcached:1.6"),
        deployment("carts", "memcached:1.6"),
        deployment("memcached", "memcached:1.6"),
        deployment("m", "memcached:1.6"),
        deployment("other", "memcached:1.5"),
    ];
    let cached: Vec<CachedDeployment> = sent.iter().map(cache).collect();
    for (sent, cached) in sent.iter().zip(&cached) {
        let live = cached.live_json().unwrap_or_default();
        assert_eq!(live["spec"], sent["spec"], "{}", sent["metadata"]["name"]);
        assert_eq!(cached.replicas, Some(3));
    }
    let shared = |a: usize, b: usize| cached[a].spec_shared().shares_with(cached[b].spec_shared());
    assert!(shared(0, 1), "one template, one text");
    assert!(!shared(0, 4), "another image, another text");

    // The same for the kinds cached as their spec: a budget's selector names its pool.
    let budget = |name: &str| -> CachedPdb {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {LABEL_INSTANCE: name}}},
        }))
        .unwrap_or_default()
    };
    let (a, b) = (budget("sessions"), budget("carts"));
    assert!(a.spec_shared().shares_with(b.spec_shared()));
    assert_eq!(
        serde_json::from_str::<Value>(&b.spec_json()).unwrap_or_default(),
        json!({"maxUnavailable": 1, "selector": {"matchLabels": {LABEL_INSTANCE: "carts"}}})
    );
}

/// The labels, annotations and ownerReferences of the children of pools made from one
/// template differ only in the pool's name and uid: one text for all of them, each child's
/// read back exactly.
#[test]
fn pools_of_one_template_share_one_metadata_text() {
    let service = |name: &str, owner: &str, uid: &str| {
        json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("svc-{uid}"),
                "labels": {LABEL_INSTANCE: owner, "app.kubernetes.io/name": "memcached"},
                "annotations": {"team": "cache",
                    // Each pool's own, as the operator writes it.
                    APPLIED_HASH_ANNOTATION: uid[19..].replace('-', "")},
                "ownerReferences": [{"apiVersion": "cache.example.com/v1", "kind": "Memcached",
                    "name": owner, "uid": uid, "controller": true,
                    "blockOwnerDeletion": true}]},
            "spec": {"clusterIP": "None", "selector": {LABEL_INSTANCE: owner}},
        })
    };
    let sent = [
        service(
            "sessions",
            "sessions",
            "0c1f0e7e-1111-4000-8000-00000000000a",
        ),
        service("carts", "carts", "0c1f0e7e-2222-4000-8000-00000000000b"),
        // Names that occur inside the uid, the label keys and values: read back exactly
        // (shared or not).
        service("a", "a", "0c1f0e7e-3333-4000-8000-0000000000aa"),
        service(
            "memcached",
            "memcached",
            "0c1f0e7e-4444-4000-8000-00000000000c",
        ),
        // A child not named as its owner: its text names the owner, so it is its own.
        service(
            "carts-proxy",
            "carts",
            "0c1f0e7e-2222-4000-8000-00000000000b",
        ),
        // No owner at all.
        json!({"metadata": {"name": "loose", "labels": {"x": "loose"}}}),
    ];
    let cached: Vec<CachedService> = sent
        .iter()
        .map(|json| serde_json::from_str(&json.to_string()).unwrap_or_default())
        .collect();
    for (sent, cached) in sent.iter().zip(&cached) {
        let live = cached.live_json().unwrap_or_default();
        for field in ["labels", "annotations", "ownerReferences"] {
            assert_eq!(
                live["metadata"][field], sent["metadata"][field],
                "{field} of {}",
                sent["metadata"]["name"]
            );
        }
        let owners = cached.owners();
        let sent_owners = sent["metadata"]["ownerReferences"].as_array().cloned();
        assert_eq!(owners.len(), sent_owners.unwrap_or_default().len());
    }
    let shared = |a: usize, b: usize| cached[a].meta_text().shares_with(cached[b].meta_text());
    assert!(shared(0, 1), "one template, one text");
    assert!(!shared(1, 4), "a proxy's text names its owner");
    // Shared text, yet another owner: not the same metadata (the classifier hashes it).
    assert_ne!(cached[0].meta_text(), cached[1].meta_text());
    // The annotation whose value is kept aside is the one the operator writes.
    let applied: AppliedHash = serde_json::from_value(json!({APPLIED_HASH_ANNOTATION: "00ff"}))
        .unwrap_or(AppliedHash { hash: None });
    assert_eq!(applied.hash.as_deref(), Some("00ff"));
}
