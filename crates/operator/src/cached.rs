//! Compact forms of the objects the controller caches but reads only a little of.
//!
//! A `k8s_openapi` `Pod` is 2,176 bytes before any of its strings, lists or maps, because
//! every optional field of its spec and status is inline; with a real pod's spec that was
//! about 5 KiB per cached pod. The controller reads a pod's name, namespace, instance label,
//! deletion state, IP and readiness, so [`CachedPod`] is deserialized straight from the
//! watch with only those: the spec is skipped while parsing, never allocated.
//!
//! A Deployment's pod template is read only by the drift check, as JSON; deserialized into
//! `k8s_openapi` types it took about 12 KiB per Deployment, as JSON text about 2 KiB. So
//! [`CachedDeployment`] keeps its spec as JSON text and its metadata and status typed, and
//! [`SpecOnly`] does the same for Services and budgets, whose status is never read.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builders::LABEL_INSTANCE;

/// A pod of ours, as cached: identity, instance label, deletion, IP and readiness.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WirePod")]
pub struct CachedPod {
    /// Name, namespace, uid, resourceVersion, deletionTimestamp and the instance label only.
    pub metadata: ObjectMeta,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// Whether `status.conditions` has `Ready=True`.
    pub ready: bool,
}

/// `Resource` for a cached form of a built-in kind: the same kind, group, version and plural
/// (so `Api<$cached>` talks to the real resource), metadata from its `metadata` field.
macro_rules! resource_as {
    ($cached:ty, $kind:ty) => {
        impl Resource for $cached {
            type DynamicType = ();
            type Scope = <$kind as Resource>::Scope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$kind>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$kind>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$kind>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$kind>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource_as!(CachedPod, Pod);

/// An object's metadata as read from the API, without `managedFields`: that is a field tree
/// as large as the spec for every object we apply, and no reader needs it, so serde skips
/// it unparsed instead of building it only to drop it.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<WireMeta> for ObjectMeta {
    fn from(m: WireMeta) -> Self {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

/// The parts of a pod's JSON that are read; serde skips everything else unparsed.
#[derive(Deserialize)]
struct WirePod {
    #[serde(default)]
    metadata: WireMeta,
    #[serde(default)]
    status: Option<WireStatus>,
}

#[derive(Deserialize)]
struct WireStatus {
    #[serde(rename = "podIP", default)]
    pod_ip: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<WireCondition>>,
}

#[derive(Deserialize)]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl From<WirePod> for CachedPod {
    fn from(pod: WirePod) -> Self {
        let m = ObjectMeta::from(pod.metadata);
        let labels: BTreeMap<String, String> = m
            .labels
            .into_iter()
            .flatten()
            .filter(|(k, _)| k == LABEL_INSTANCE)
            .collect();
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            deletion_timestamp: m.deletion_timestamp,
            labels: (!labels.is_empty()).then_some(labels),
            ..ObjectMeta::default()
        };
        let status = pod.status;
        let ready = status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        CachedPod {
            metadata,
            ip: status.and_then(|s| s.pod_ip),
            ready,
        }
    }
}

/// A child kind as the controller caches it, next to the full kind it writes.
pub trait CacheForm:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The object as written to (and returned by) the API.
    type Full: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug;

    /// The object as JSON, for the drift check (at least every field the operator sets).
    fn live_json(&self) -> Option<Value>;
}

/// A child whose status is never read, as cached: metadata (without managedFields) typed,
/// the spec as JSON text. A change to its status does not change this at all.
#[derive(Debug, Default, PartialEq)]
pub struct SpecOnly<K> {
    pub metadata: ObjectMeta,
    spec_json: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for SpecOnly<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            spec_json: self.spec_json.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> SpecOnly<K> {
    /// The spec as the API server returned it, as JSON text.
    pub fn spec_json(&self) -> &str {
        &self.spec_json
    }

    fn new(metadata: ObjectMeta, spec: Option<&Value>) -> Self {
        Self {
            metadata,
            spec_json: spec
                .map(Value::to_string)
                .unwrap_or_default()
                .into_boxed_str(),
            kind: PhantomData,
        }
    }
}

impl<'de, K> Deserialize<'de> for SpecOnly<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: WireMeta,
            #[serde(default)]
            spec: Option<Value>,
        }
        let wire = Wire::deserialize(deserializer)?;
        Ok(Self::new(wire.metadata.into(), wire.spec.as_ref()))
    }
}

impl<K: Resource<DynamicType = ()>> Resource for SpecOnly<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K> CacheForm for SpecOnly<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    type Full = K;

    fn live_json(&self) -> Option<Value> {
        object_json::<K>(&self.metadata, &self.spec_json)
    }
}

/// A cached object as the JSON the drift check compares against: type, metadata and the
/// spec kept as text.
fn object_json<K: Resource<DynamicType = ()>>(
    metadata: &ObjectMeta,
    spec_json: &str,
) -> Option<Value> {
    let mut json = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": serde_json::to_value(metadata).ok()?,
    });
    if !spec_json.is_empty() {
        json["spec"] = serde_json::from_str(spec_json).ok()?;
    }
    Some(json)
}

/// A Service as cached.
pub type CachedService = SpecOnly<Service>;
/// A PodDisruptionBudget as cached.
pub type CachedPdb = SpecOnly<PodDisruptionBudget>;

/// A Deployment of ours, as cached: metadata (without managedFields) and status typed,
/// `spec.replicas` read out, the whole spec kept as JSON text for the drift check.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireDeployment")]
pub struct CachedDeployment {
    pub metadata: ObjectMeta,
    /// `spec.replicas` (the API server defaults it to 1).
    pub replicas: Option<i32>,
    spec_json: Box<str>,
    pub status: Option<DeploymentStatus>,
}

impl CachedDeployment {
    /// The Deployment without its spec: what the Memcached's status is computed from.
    pub fn without_spec(&self) -> Deployment {
        Deployment {
            metadata: self.metadata.clone(),
            spec: None,
            status: self.status.clone(),
        }
    }
}

resource_as!(CachedDeployment, Deployment);

#[derive(Deserialize)]
struct WireDeployment {
    #[serde(default)]
    metadata: WireMeta,
    #[serde(default)]
    spec: Option<Value>,
    #[serde(default)]
    status: Option<DeploymentStatus>,
}

impl From<WireDeployment> for CachedDeployment {
    fn from(d: WireDeployment) -> Self {
        let metadata = ObjectMeta::from(d.metadata);
        let replicas = d
            .spec
            .as_ref()
            .and_then(|s| s.get("replicas"))
            .and_then(Value::as_i64)
            .and_then(|r| i32::try_from(r).ok());
        let spec_json = d
            .spec
            .map(|s| s.to_string())
            .unwrap_or_default()
            .into_boxed_str();
        CachedDeployment {
            metadata,
            replicas,
            spec_json,
            status: d.status,
        }
    }
}

impl CacheForm for CachedDeployment {
    type Full = Deployment;

    fn live_json(&self) -> Option<Value> {
        let mut json = object_json::<Deployment>(&self.metadata, &self.spec_json)?;
        json["status"] = serde_json::to_value(&self.status).ok()?;
        Some(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    #[test]
    fn keeps_what_the_controller_reads_and_nothing_else() {
        let pod: CachedPod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "m-abc", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {LABEL_INSTANCE: "m", "pod-template-hash": "h", "team": "a"},
                "annotations": {"a": "b"},
                "managedFields": [{"manager": "x"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "m-1", "uid": "r"}],
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
        assert_eq!(pod.labels().len(), 1, "only the instance label");
        assert_eq!(
            pod.labels().get(LABEL_INSTANCE).map(String::as_str),
            Some("m")
        );
        assert!(pod.annotations().is_empty() && pod.managed_fields().is_empty());
        assert!(pod.owner_references().is_empty());
        assert_eq!(pod.ip.as_deref(), Some("10.0.0.7"));
        assert!(pod.ready);
        assert_eq!(pod.resource_version().as_deref(), Some("7"));
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
            "status": {"observedGeneration": 2, "readyReplicas": 3},
        }))
        .unwrap_or_default();
        let cached: CachedDeployment =
            serde_json::from_value(serde_json::to_value(&full).unwrap_or_default())
                .unwrap_or_default();
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
        assert_eq!(view.status, full.status);
        assert_eq!(view.metadata.generation, Some(2));
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
            serde_json::from_value(serde_json::to_value(&full).unwrap_or_default())
                .unwrap_or_default();
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
        let wire: WireMeta = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(ObjectMeta::from(wire), want);
    }

    #[test]
    fn it_is_a_fraction_of_a_pod() {
        assert!(std::mem::size_of::<CachedPod>() * 4 < std::mem::size_of::<Pod>());
    }
}
