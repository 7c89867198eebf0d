//! Compact forms of the objects the controller caches but reads only a little of.
//!
//! A `k8s_openapi` `Pod` is 2,176 bytes before any of its strings, lists or maps, because
//! every optional field of its spec and status is inline; with a real pod's spec that was
//! about 5 KiB per cached pod. The controller reads a pod's name, uid, namespace, instance label,
//! deletion state, IP, readiness, deletion cost and the TLS reload agent's failure, so
//! [`CachedPod`] is deserialized straight from the watch with only those: the spec is skipped
//! while parsing, never allocated.
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
//!
//! And a spec's text is kept once for every child whose spec differs from it only in the
//! child's own name ([`SharedText`]), and the metadata's text once for every child whose
//! differs only in its name, its owner's uid and its applied-hash annotation: the
//! Deployments of the pools made from one template share both (682 bytes per cached
//! Deployment instead of 2,873 with both texts its own, `tests/decode_cost.rs`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod deployment;
mod pod;
#[cfg(test)]
mod tests;

pub use deployment::CachedDeployment;
pub use pod::CachedPod;

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

pub(crate) use resource_as;

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

/// A child's spec (or a ConfigMap's data, or its labels, annotations and ownerReferences)
/// as JSON text, with every occurrence of what makes it the child's own taken out (its own
/// name, its controller's uid, the hash of its desired state), and that shape shared by
/// every child whose text differs only in those: the Deployments of pools made from one
/// Memcached template hold one text between them, not 2.3 KB each (BENCHMARKS.md, "One
/// text for the pools of one template").
///
/// Each value is replaced by its mark ([`MARKS`]: U+0001 to U+0003), which JSON text never
/// holds unescaped (a serializer writes a control character as `\u0001`, and the text is
/// always written by one), so putting the values back gives the text exactly as the API
/// server sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SharedText(Arc<str>);

/// What stands in a [`SharedText`] for the child's name, its controller's uid, and the
/// value of its applied-hash annotation.
const MARKS: [char; 3] = ['\u{1}', '\u{2}', '\u{3}'];

/// The values a [`SharedText`]'s marks stand for, in the order of [`MARKS`].
type Own<'a> = [Option<&'a str>; 3];

impl SharedText {
    /// `text` with its `own` values taken out, interned.
    fn new(text: JsonText, own: Own) -> Self {
        Self::of(String::from(text.0), own)
    }

    fn of(text: String, own: Own) -> Self {
        debug_assert!(
            !text.contains(MARKS),
            "JSON text holds no raw U+0001 to U+0003"
        );
        let mut shape = text;
        // The hash and the uid first: a short name (`a`) may occur inside them, which would
        // otherwise be left in pieces, one per pool. Any order round-trips exactly.
        for (value, mark) in own.into_iter().zip(MARKS).rev() {
            if let Some(value) = value.filter(|v| !v.is_empty() && shape.contains(*v)) {
                shape = shape.replace(value, mark.encode_utf8(&mut [0; 4]));
            }
        }
        SharedText(Shapes::intern(shape))
    }

    /// The text with its `own` values put back (those it was made with).
    pub fn text(&self, own: Own) -> Cow<'_, str> {
        let mut text = Cow::Borrowed(&*self.0);
        for (value, mark) in own.into_iter().zip(MARKS) {
            if let Some(value) = value.filter(|_| text.contains(mark)) {
                text = Cow::Owned(text.replace(mark, value));
            }
        }
        text
    }

    /// Whether `self` and `other` are one allocation.
    pub fn shares_with(&self, other: &SharedText) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Every [`SharedText`] shape in use, each once. A shape no child holds any more is dropped
/// when the set has doubled since it was last swept, so the set stays within twice what is
/// in use (and a few hundred).
struct Shapes {
    set: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Shapes {
    const LEAST_SWEEP: usize = 256;

    fn intern(shape: String) -> Arc<str> {
        static SHAPES: LazyLock<Mutex<Shapes>> = LazyLock::new(|| {
            Mutex::new(Shapes {
                set: HashSet::new(),
                sweep_at: Shapes::LEAST_SWEEP,
            })
        });
        // The set is left whole by any panic (an insert or a retain), so a poisoned lock's
        // set is still right.
        let mut shapes = SHAPES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = shapes.set.get(shape.as_str()) {
            return shared.clone();
        }
        if shapes.set.len() >= shapes.sweep_at {
            shapes.set.retain(|s| Arc::strong_count(s) > 1);
            shapes.sweep_at = (shapes.set.len() * 2).max(Self::LEAST_SWEEP);
        }
        let shared: Arc<str> = Arc::from(shape);
        shapes.set.insert(shared.clone());
        shared
    }
}

/// A cached child's labels, annotations and ownerReferences, as the text of one JSON object
/// (`{"labels":…,"annotations":…,"ownerReferences":…}`, absent ones left out), shared
/// ([`SharedText`]) by the children of one kind and template: what differs between pools is
/// the child's name (put back from its metadata), its controller's uid and its
/// applied-hash annotation (kept here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MetaText {
    shape: SharedText,
    owner_uid: Option<Box<str>>,
    applied_hash: Option<Box<str>>,
}

/// The annotation whose value [`MetaText`] keeps beside its shared text
/// ([`crate::builders::APPLIED_HASH_ANNOTATION`]).
#[derive(Deserialize)]
struct AppliedHash {
    #[serde(rename = "memcached.cache.example.com/applied-hash")]
    hash: Option<String>,
}

/// The three fields of [`MetaText`], typed.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl MetaText {
    /// The fields of the child named `name`.
    fn new(fields: [(&str, Option<JsonText>); 3], name: Option<&str>) -> Self {
        #[derive(Deserialize)]
        struct Owner {
            uid: String,
            #[serde(default)]
            controller: Option<bool>,
        }
        let mut text = String::from("{");
        let mut owner_uid = None;
        let mut applied_hash = None;
        for (field, value) in fields {
            if let Some(value) = value {
                if field == "annotations" {
                    applied_hash = serde_json::from_str::<AppliedHash>(value.as_str())
                        .ok()
                        .and_then(|a| a.hash)
                        .map(String::into_boxed_str);
                }
                if field == "ownerReferences" {
                    owner_uid = serde_json::from_str::<Vec<Owner>>(value.as_str())
                        .ok()
                        .and_then(|owners| owners.into_iter().find(|o| o.controller == Some(true)))
                        .map(|o| o.uid.into_boxed_str());
                }
                if text.len() > 1 {
                    text.push(',');
                }
                text.push('"');
                text.push_str(field);
                text.push_str("\":");
                text.push_str(value.as_str());
            }
        }
        text.push('}');
        MetaText {
            shape: SharedText::of(text, [name, owner_uid.as_deref(), applied_hash.as_deref()]),
            owner_uid,
            applied_hash,
        }
    }

    /// The text of the child named `name` (the name in its metadata).
    pub fn text(&self, name: Option<&str>) -> Cow<'_, str> {
        self.shape.text([
            name,
            self.owner_uid.as_deref(),
            self.applied_hash.as_deref(),
        ])
    }

    /// Whether `self` and `other` share their text.
    pub fn shares_with(&self, other: &MetaText) -> bool {
        self.shape.shares_with(&other.shape)
    }

    /// The fields, typed. The text was written from the API's own JSON, so it parses; were
    /// a value not of its type (a label that is not a string), the fields read as absent,
    /// which the drift check sees as drift and repairs by applying again.
    fn fields(&self, name: Option<&str>) -> MetaFields {
        serde_json::from_str(&self.text(name)).unwrap_or_default()
    }

    /// `ownerReferences` of the child named `name`, parsed.
    fn owner_references(&self, name: Option<&str>) -> Vec<OwnerReference> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Owners {
            #[serde(default)]
            owner_references: Vec<OwnerReference>,
        }
        serde_json::from_str::<Owners>(&self.text(name))
            .map(|o| o.owner_references)
            .unwrap_or_default()
    }

    /// `metadata` with these fields filled in.
    pub fn complete(&self, metadata: &ObjectMeta) -> ObjectMeta {
        let fields = self.fields(metadata.name.as_deref());
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
        let text = MetaText::new(
            [
                ("labels", self.labels),
                ("annotations", self.annotations),
                ("ownerReferences", self.owner_references),
            ],
            self.name.as_deref(),
        );
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

    /// `metadata.ownerReferences` (`ResourceExt::owner_references` reads the typed
    /// metadata, which does not hold them).
    fn owners(&self) -> Vec<OwnerReference> {
        self.meta_text()
            .owner_references(self.meta().name.as_deref())
    }

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
    spec: SharedText,
    verified: Verified,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for SpecOnly<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            meta_text: self.meta_text.clone(),
            spec: self.spec.clone(),
            verified: self.verified.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> SpecOnly<K> {
    /// The spec as the API server returned it, as JSON text.
    pub fn spec_json(&self) -> Cow<'_, str> {
        self.spec.text([self.metadata.name.as_deref(), None, None])
    }

    /// The spec's shared text (the same allocation as every child's whose spec differs
    /// only in its name).
    pub fn spec_shared(&self) -> &SharedText {
        &self.spec
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
            spec: SharedText::new(wire.spec, [metadata.name.as_deref(), None, None]),
            metadata,
            meta_text,
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
        object_json::<K>(&self.metadata, &self.meta_text, &self.spec_json())
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
/// A NetworkPolicy as cached.
pub type CachedNetworkPolicy = SpecOnly<k8s_openapi::api::networking::v1::NetworkPolicy>;
/// A HorizontalPodAutoscaler as cached (its status, which the HPA controller rewrites as
/// the metrics move, left out).
pub type CachedHpa = SpecOnly<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>;
/// A ConfigMap as cached (its `data` kept as [`SpecOnly::spec_json`]).
pub type CachedConfigMap = SpecOnly<ConfigMap>;
/// A ServiceMonitor as cached.
pub type CachedServiceMonitor = SpecOnly<crate::builders::ServiceMonitor>;
