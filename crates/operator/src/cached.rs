//! Compact forms of the objects the controller caches but reads only a little of.
//!
//! A `k8s_openapi` `Pod` is 2,176 bytes before any of its strings, lists or maps, because
//! every optional field of its spec and status is inline; with a real pod's spec that was
//! about 5 KiB per cached pod. The controller reads a pod's name, uid, namespace, instance label,
//! deletion state, IP, readiness and the TLS reload agent's failure, so [`CachedPod`] is deserialized straight from the
//! watch with only those: the spec is skipped while parsing, never allocated.
//!
//! A Deployment's pod template is read only by the drift check, as JSON; deserialized into
//! `k8s_openapi` types it took about 12 KiB per Deployment, as JSON text about 2 KiB. So
//! [`CachedDeployment`] keeps its spec as JSON text and its metadata and status typed, and
//! [`SpecOnly`] does the same for Services and budgets, whose status is never read.
//!
//! Their labels, annotations and ownerReferences are kept the same way, as one JSON text
//! ([`MetaText`]): typed, those are two `BTreeMap`s (each a 540-byte node, however few its
//! entries) and some twenty small strings; as text, one allocation. A cached Service went
//! from 2.3 to 1.3 KB (heaptrack, BENCHMARKS.md §16). Specs and metadata are written to text
//! while they are read ([`JsonText`]), never built as a `serde_json::Value` tree first.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builders::{
    LABEL_INSTANCE, LABEL_NAME, TLS_AGENT_CERTIFICATE_INVALID, TLS_AGENT_NAME,
    TLS_AGENT_RELOAD_FAILED,
};
use crate::proxy::PROXY_APP_NAME;

/// A pod of ours, as cached: identity, instance label, deletion, IP and readiness.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WirePod")]
pub struct CachedPod {
    /// Name, namespace, resourceVersion and deletionTimestamp only.
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
    /// What the TLS reload agent reported when it last ended: its exit code
    /// ([`TLS_AGENT_RELOAD_FAILED`] or [`TLS_AGENT_CERTIFICATE_INVALID`]) and reason.
    pub tls_reload_failure: Option<(i32, String)>,
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

/// One JSON value as text, written while it is read (`serde_transcode`): no `Value` tree is
/// built on the way, whatever the deserializer (a watch line, an API answer, a `Value`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JsonText(Box<str>);

impl JsonText {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut out = Vec::with_capacity(256);
        serde_transcode::transcode(deserializer, &mut serde_json::Serializer::new(&mut out))
            .map_err(serde::de::Error::custom)?;
        String::from_utf8(out)
            .map(|text| JsonText(text.into_boxed_str()))
            .map_err(serde::de::Error::custom)
    }
}

/// A cached child's labels, annotations and ownerReferences, as the text of one JSON object
/// (`{"labels":…,"annotations":…,"ownerReferences":…}`, absent ones left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MetaText(Box<str>);

/// The three fields of [`MetaText`], typed.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl MetaText {
    fn new(fields: [(&str, Option<JsonText>); 3]) -> Self {
        let mut text = String::from("{");
        for (name, value) in fields {
            if let Some(value) = value {
                if text.len() > 1 {
                    text.push(',');
                }
                text.push('"');
                text.push_str(name);
                text.push_str("\":");
                text.push_str(value.as_str());
            }
        }
        text.push('}');
        MetaText(text.into_boxed_str())
    }

    /// The text itself (hashed by the trigger classifier: any change to these fields is
    /// drift).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The fields, typed. The text was written from the API's own JSON, so it parses; were
    /// a value not of its type (a label that is not a string), the fields read as absent,
    /// which the drift check sees as drift and repairs by applying again.
    fn fields(&self) -> MetaFields {
        serde_json::from_str(&self.0).unwrap_or_default()
    }

    /// `ownerReferences`, parsed.
    pub fn owner_references(&self) -> Vec<OwnerReference> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Owners {
            #[serde(default)]
            owner_references: Vec<OwnerReference>,
        }
        serde_json::from_str::<Owners>(&self.0)
            .map(|o| o.owner_references)
            .unwrap_or_default()
    }

    /// `metadata` with these fields filled in.
    pub fn complete(&self, metadata: &ObjectMeta) -> ObjectMeta {
        let fields = self.fields();
        ObjectMeta {
            labels: fields.labels,
            annotations: fields.annotations,
            owner_references: fields.owner_references,
            ..metadata.clone()
        }
    }
}

/// A child's metadata as read from the API: `managedFields` (a field tree as large as the
/// spec for every object we apply, and read by no one) skipped unparsed; labels, annotations
/// and ownerReferences as text.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    annotations: Option<JsonText>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<JsonText>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<JsonText>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl WireMeta {
    /// The metadata without labels, annotations and ownerReferences, and those as text.
    fn split(self) -> (ObjectMeta, MetaText) {
        let text = MetaText::new([
            ("labels", self.labels),
            ("annotations", self.annotations),
            ("ownerReferences", self.owner_references),
        ]);
        let metadata = ObjectMeta {
            creation_timestamp: self.creation_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            deletion_timestamp: self.deletion_timestamp,
            finalizers: self.finalizers,
            generate_name: self.generate_name,
            generation: self.generation,
            name: self.name,
            namespace: self.namespace,
            resource_version: self.resource_version,
            self_link: self.self_link,
            uid: self.uid,
            ..ObjectMeta::default()
        };
        (metadata, text)
    }
}

/// A pod's metadata as read: what [`CachedPod`] keeps, and the labels to find the instance in.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePodMeta {
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
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
        let instance = m
            .labels
            .filter(|l| l.get(LABEL_NAME).map(String::as_str) != Some(PROXY_APP_NAME))
            .and_then(|mut l| l.remove(LABEL_INSTANCE));
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            deletion_timestamp: m.deletion_timestamp,
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
            tls_reload_failure: tls_reload_failure(statuses),
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

    /// Labels, annotations and ownerReferences (which `metadata` does not hold).
    fn meta_text(&self) -> &MetaText;

    /// The desired state this version of the child was last found converged with.
    fn verified(&self) -> &Verified;

    /// `spec.replicas`, for a kind that has it.
    fn replicas(&self) -> Option<i32> {
        None
    }
}

/// The hash of the desired state a cached child was last found converged with (0: none
/// yet), so that the drift check's JSON comparison runs once per version of the child and
/// desired state instead of on every reconcile. It lives and dies with this version: any
/// change to the child arrives as a new cached object, checked afresh. Not part of the
/// object: clones keep it, equality ignores it.
#[derive(Debug, Default)]
pub struct Verified(AtomicU64);

impl Verified {
    /// Whether this version was found converged with the desired state hashed as `hash`.
    pub fn holds(&self, hash: u64) -> bool {
        hash != 0 && self.0.load(Ordering::Relaxed) == hash
    }

    /// Records that this version is converged with the desired state hashed as `hash`.
    pub fn record(&self, hash: u64) {
        self.0.store(hash, Ordering::Relaxed);
    }
}

impl Clone for Verified {
    fn clone(&self) -> Self {
        Verified(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

impl PartialEq for Verified {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A child whose status is never read, as cached: metadata (without managedFields) typed,
/// labels, annotations, ownerReferences and the spec as JSON text. A change to its status
/// does not change this at all.
#[derive(Debug, Default, PartialEq)]
pub struct SpecOnly<K> {
    /// Without labels, annotations and ownerReferences: see [`CacheForm::meta_text`].
    pub metadata: ObjectMeta,
    meta_text: MetaText,
    spec_json: JsonText,
    verified: Verified,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for SpecOnly<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            meta_text: self.meta_text.clone(),
            spec_json: self.spec_json.clone(),
            verified: self.verified.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> SpecOnly<K> {
    /// The spec as the API server returned it, as JSON text.
    pub fn spec_json(&self) -> &str {
        self.spec_json.as_str()
    }
}

impl<'de, K> Deserialize<'de> for SpecOnly<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: WireMeta,
            // A ConfigMap's `data` stands where other kinds have their spec.
            #[serde(default, alias = "data")]
            spec: JsonText,
        }
        let wire = Wire::deserialize(deserializer)?;
        let (metadata, meta_text) = wire.metadata.split();
        Ok(Self {
            metadata,
            meta_text,
            spec_json: wire.spec,
            verified: Verified::default(),
            kind: PhantomData,
        })
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
        object_json::<K>(&self.metadata, &self.meta_text, self.spec_json.as_str())
    }

    fn meta_text(&self) -> &MetaText {
        &self.meta_text
    }

    fn verified(&self) -> &Verified {
        &self.verified
    }
}

/// A cached object as the JSON the drift check compares against: type, metadata (completed
/// from its text) and the spec kept as text.
fn object_json<K: Resource<DynamicType = ()>>(
    metadata: &ObjectMeta,
    meta_text: &MetaText,
    spec_json: &str,
) -> Option<Value> {
    let mut json = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": serde_json::to_value(meta_text.complete(metadata)).ok()?,
    });
    if !spec_json.is_empty() {
        json[body_field::<K>()] = serde_json::from_str(spec_json).ok()?;
    }
    Some(json)
}

/// Where a kind keeps what [`SpecOnly`] caches: `data` for a ConfigMap, else `spec`.
fn body_field<K: Resource<DynamicType = ()>>() -> &'static str {
    if K::kind(&()) == "ConfigMap" && K::group(&()).is_empty() {
        "data"
    } else {
        "spec"
    }
}

/// A Service as cached.
pub type CachedService = SpecOnly<Service>;
/// A PodDisruptionBudget as cached.
pub type CachedPdb = SpecOnly<PodDisruptionBudget>;
/// A ConfigMap as cached (its `data` kept as [`SpecOnly::spec_json`]).
pub type CachedConfigMap = SpecOnly<ConfigMap>;

/// A Deployment of ours, as cached: metadata (without managedFields) and the status's rollout
/// counts typed, `spec.replicas` read out; labels, annotations, ownerReferences and the whole
/// spec kept as JSON text for the drift check.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireDeployment")]
pub struct CachedDeployment {
    /// Without labels, annotations and ownerReferences: see [`CacheForm::meta_text`].
    pub metadata: ObjectMeta,
    meta_text: MetaText,
    /// `spec.replicas` (the API server defaults it to 1).
    pub replicas: Option<i32>,
    spec_json: JsonText,
    pub status: Option<DeploymentStatus>,
    verified: Verified,
}

impl CachedDeployment {
    /// The Deployment without its spec, labels, annotations and ownerReferences: what the
    /// Memcached's status is computed from (its generation and status).
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
    spec: JsonText,
    #[serde(default)]
    status: Option<WireDeploymentStatus>,
}

/// The rollout counts of a Deployment's status, and of its conditions only the one that
/// says the rollout is stuck (`Progressing=False`, `ProgressDeadlineExceeded`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDeploymentStatus {
    available_replicas: Option<i32>,
    observed_generation: Option<i64>,
    ready_replicas: Option<i32>,
    replicas: Option<i32>,
    updated_replicas: Option<i32>,
    #[serde(default)]
    conditions: Vec<WireDeploymentCondition>,
}

#[derive(Deserialize)]
struct WireDeploymentCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl From<WireDeploymentStatus> for DeploymentStatus {
    fn from(s: WireDeploymentStatus) -> Self {
        let stuck: Vec<DeploymentCondition> = s
            .conditions
            .into_iter()
            .filter(|c| {
                c.type_ == "Progressing"
                    && c.reason.as_deref() == Some(crate::status::PROGRESS_DEADLINE_EXCEEDED)
            })
            .map(|c| DeploymentCondition {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                message: c.message,
                ..DeploymentCondition::default()
            })
            .collect();
        DeploymentStatus {
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            ready_replicas: s.ready_replicas,
            replicas: s.replicas,
            updated_replicas: s.updated_replicas,
            conditions: (!stuck.is_empty()).then_some(stuck),
            ..DeploymentStatus::default()
        }
    }
}

impl From<WireDeployment> for CachedDeployment {
    fn from(d: WireDeployment) -> Self {
        #[derive(Deserialize)]
        struct Replicas {
            replicas: Option<i32>,
        }
        let (metadata, meta_text) = d.metadata.split();
        let replicas = serde_json::from_str::<Replicas>(d.spec.as_str())
            .ok()
            .and_then(|s| s.replicas);
        CachedDeployment {
            metadata,
            meta_text,
            replicas,
            spec_json: d.spec,
            status: d.status.map(DeploymentStatus::from),
            verified: Verified::default(),
        }
    }
}

impl CacheForm for CachedDeployment {
    type Full = Deployment;

    fn live_json(&self) -> Option<Value> {
        let mut json =
            object_json::<Deployment>(&self.metadata, &self.meta_text, self.spec_json.as_str())?;
        json["status"] = serde_json::to_value(&self.status).ok()?;
        Some(json)
    }

    fn meta_text(&self) -> &MetaText {
        &self.meta_text
    }

    fn verified(&self) -> &Verified {
        &self.verified
    }

    fn replicas(&self) -> Option<i32> {
        self.replicas
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
        assert_eq!(pod.instance.as_deref(), Some("m"));
        assert!(pod.labels().is_empty() && pod.annotations().is_empty());
        assert!(pod.managed_fields().is_empty() && pod.owner_references().is_empty());
        assert_eq!(
            pod.uid().as_deref(),
            Some("u1"),
            "a pod is restarted with its uid as a precondition"
        );
        assert_eq!(pod.tls_reload_failure, None);
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
        // Through a `Value` and through text (as from a watch): the same result.
        let from_value: WireMeta = serde_json::from_value(json.clone()).unwrap_or_default();
        let from_text: WireMeta = serde_json::from_str(&json.to_string()).unwrap_or_default();
        for wire in [from_value, from_text] {
            let (metadata, text) = wire.split();
            assert!(metadata.labels.is_none() && metadata.owner_references.is_none());
            assert_eq!(text.complete(&metadata), want);
            assert_eq!(
                text.owner_references(),
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
        assert_eq!(cached.meta_text().owner_references()[0].name, "m");

        // A child with none of the three: an empty object, and nothing made up.
        let bare: CachedPdb =
            serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap_or_default();
        assert_eq!(bare.meta_text().as_str(), "{}");
        assert!(bare.meta_text().owner_references().is_empty());
        let live = bare.live_json().unwrap_or_default();
        assert!(live["metadata"].get("labels").is_none() && live.get("spec").is_none());
    }

    #[test]
    fn it_is_a_fraction_of_a_pod() {
        assert!(std::mem::size_of::<CachedPod>() * 4 < std::mem::size_of::<Pod>());
    }
}
