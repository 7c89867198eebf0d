//! A pod of ours as cached ([`CachedPod`]): what `status.nodes`, `status.endpoints`, the
//! proxy's backends and the TLS restart gate read of it, deserialized straight from the
//! watch with the rest of the pod skipped unparsed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use serde::Deserialize;

use crate::builders::{
    LABEL_INSTANCE, LABEL_NAME, TLS_AGENT_CERTIFICATE_INVALID, TLS_AGENT_NAME,
    TLS_AGENT_RELOAD_FAILED,
};
use crate::proxy::{DELETION_COST_ANNOTATION, PROXY_APP_NAME};

use super::*;

/// A pod of ours, as cached: identity, instance label, deletion, IP, readiness and deletion
/// cost.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WirePod")]
pub struct CachedPod {
    /// Name, namespace, resourceVersion, creationTimestamp and deletionTimestamp only.
    pub metadata: ObjectMeta,
    /// The `app.kubernetes.io/instance` label: the Memcached the pod belongs to.
    pub instance: Option<String>,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// Whether `status.conditions` has `Ready=True`.
    pub ready: bool,
    /// Whether the pod has ended (`status.phase` `Failed`, as an evicted pod, or
    /// `Succeeded`): it stays until garbage-collected but is no longer part of the pool.
    pub ended: bool,
    /// Its `controller.kubernetes.io/pod-deletion-cost` annotation (the proxy's slot of a
    /// proxied pool's pod, see [`crate::proxy::membership`]).
    pub deletion_cost: Option<String>,
    /// What the TLS reload agent reported when it last ended: its exit code
    /// ([`TLS_AGENT_RELOAD_FAILED`] or [`TLS_AGENT_CERTIFICATE_INVALID`]) and reason.
    pub tls_reload_failure: Option<(i32, String)>,
    /// Its `topology.kubernetes.io/zone` label (see [`memcached_api::ZONE_LABEL`]).
    pub zone: Option<String>,
}

resource_as!(CachedPod, Pod);

/// A pod's metadata as read: what [`CachedPod`] keeps, and the labels to find the instance in.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePodMeta {
    deletion_timestamp: Option<Time>,
    creation_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
    owner_references: Option<Vec<WireOwnerReference>>,
}

#[derive(Deserialize)]
struct WireOwnerReference {
    kind: String,
    name: String,
    #[serde(default)]
    controller: Option<bool>,
}

/// The label the Deployment controller gives a pod and its ReplicaSet (`<deployment>-<hash>`).
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Whether a pod with our labels for `instance` was made by a ReplicaSet of the Deployment
/// of that name (its controller is the ReplicaSet `<instance>-<pod-template-hash>`): labels
/// can be copied onto any pod, and a pod we did not make is never counted, annotated or
/// deleted as one of the pool's.
fn made_by_pool(
    labels: &BTreeMap<String, String>,
    owners: Option<&[WireOwnerReference]>,
    instance: &str,
) -> bool {
    let Some(hash) = labels.get(POD_TEMPLATE_HASH) else {
        return false;
    };
    owners.into_iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == "ReplicaSet"
            && o.name == format!("{instance}-{hash}")
    })
}

/// The parts of a pod's JSON that are read; serde skips everything else unparsed.
#[derive(Deserialize)]
struct WirePod {
    #[serde(default)]
    metadata: WirePodMeta,
    #[serde(default)]
    status: Option<WireStatus>,
}

#[derive(Deserialize)]
struct WireStatus {
    #[serde(rename = "podIP", default)]
    pod_ip: Option<String>,
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<WireCondition>>,
    /// Native sidecars (the TLS reload agent) report here.
    #[serde(rename = "initContainerStatuses", default)]
    init_container_statuses: Option<Vec<WireContainerStatus>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireContainerStatus {
    name: String,
    #[serde(default)]
    state: Option<WireContainerState>,
    #[serde(default)]
    last_state: Option<WireContainerState>,
}

#[derive(Deserialize)]
struct WireContainerState {
    #[serde(default)]
    terminated: Option<WireTerminated>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTerminated {
    exit_code: i32,
    #[serde(default)]
    message: Option<String>,
}

/// The reload agent's report, from its latest ending: the current state when it is
/// terminated, else the last state. An agent that recovered ended with 0 since, so an
/// older failure no longer counts.
fn tls_reload_failure(statuses: Option<Vec<WireContainerStatus>>) -> Option<(i32, String)> {
    let agent = statuses?.into_iter().find(|s| s.name == TLS_AGENT_NAME)?;
    let ended = agent
        .state
        .and_then(|s| s.terminated)
        .or_else(|| agent.last_state.and_then(|s| s.terminated))?;
    [TLS_AGENT_RELOAD_FAILED, TLS_AGENT_CERTIFICATE_INVALID]
        .contains(&ended.exit_code)
        .then(|| {
            let reason = ended
                .message
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| "the reload agent gave no reason".to_string());
            (ended.exit_code, reason)
        })
}

#[derive(Deserialize)]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl From<WirePod> for CachedPod {
    fn from(pod: WirePod) -> Self {
        let m = pod.metadata;
        // A proxy pod carries its Memcached's instance label too, but is not a pool member.
        let owners = m.owner_references;
        let zone = m
            .labels
            .as_ref()
            .and_then(|l| l.get(memcached_api::ZONE_LABEL))
            .cloned();
        let instance = m
            .labels
            .filter(|l| l.get(LABEL_NAME).map(String::as_str) != Some(PROXY_APP_NAME))
            .and_then(|mut l| {
                let instance = l.remove(LABEL_INSTANCE)?;
                made_by_pool(&l, owners.as_deref(), &instance).then_some(instance)
            });
        let deletion_cost = m
            .annotations
            .and_then(|mut a| a.remove(DELETION_COST_ANNOTATION));
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            deletion_timestamp: m.deletion_timestamp,
            creation_timestamp: m.creation_timestamp,
            uid: m.uid,
            ..ObjectMeta::default()
        };
        let status = pod.status;
        let ready = status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let ended = status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Failed" || phase == "Succeeded");
        let (ip, statuses) = match status {
            Some(s) => (s.pod_ip, s.init_container_statuses),
            None => (None, None),
        };
        CachedPod {
            metadata,
            instance,
            ip,
            ready,
            ended,
            deletion_cost,
            tls_reload_failure: tls_reload_failure(statuses),
            zone,
        }
    }
}
