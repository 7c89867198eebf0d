//! The observed state of a Memcached: [`MemcachedStatus`], the proxy's [`ProxyStatus`], and
//! the condition types the operator reports in `status.conditions`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a Memcached pool.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Names of the memcached pods, sorted (as in the seed).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Pods of the current Deployment (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// Pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `ip:port` of every ready pod, sorted by pod name, for clients that do their own
    /// consistent hashing.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Label selector of the pods, as a string (the scale subresource's selector, for HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `Available`, `Progressing`, `Degraded` and `Ready` (kstatus: what `kubectl wait
    /// --for=condition=Ready` reads), in the `metav1.Condition` shape, and `ProxyReady`
    /// while the proxy runs.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The proxy, while it runs. Written as `null` when it does not, so the operator's
    /// merge patch of the status removes what an earlier one wrote.
    #[serde(default)]
    pub proxy: Option<ProxyStatus>,
    /// Who decides `spec.size`: `HorizontalPodAutoscaler/NAME` while `spec.autoscaling` is
    /// set, else nothing (the spec, by hand). Written as `null` when it is not, so the
    /// operator's merge patch of the status removes what an earlier one wrote.
    #[serde(default)]
    pub size_managed_by: Option<String>,
    /// The last `spec.rollout.restartedAt` whose restart is done: every pod replaced since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// The progress of the last flush on demand (`spec.flush`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<FlushStatus>,
}

/// The progress of a flush on demand.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlushStatus {
    /// The `spec.flush.requestedAt` this is the progress of.
    pub requested_at: String,
    /// The pods flushed for it, in order.
    #[serde(default)]
    pub flushed: Vec<String>,
    /// When the last of them was flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_flush_time: Option<Time>,
    /// When every Ready pod had been flushed: the flush is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// Observed state of the proxy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Proxy pods of the current Deployment.
    #[serde(default)]
    pub replicas: i32,
    /// Proxy pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The backends in the proxy configuration last written (the ConfigMap `NAME-proxy`):
    /// the pool's pods in the proxy's rings, sorted by copy and slot. A pod joins when it is
    /// first Ready and stays until it is deleted or has ended, Ready or not.
    #[serde(default)]
    pub backends: Vec<ProxyBackend>,
    /// Version of that configuration (a hash of it, on its first line).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_version: String,
    /// When the configuration last changed under running proxies (unset for the first
    /// one, which the proxies read as they start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_changed_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// One backend of the proxy.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyBackend {
    /// The copy (group of pods) it belongs to, from 1 to `spec.proxy.copies`.
    pub copy: i32,
    /// Its place in its copy's ring, from 0: the keys it serves belong to the slot, not to
    /// the pod, so the pod that replaces it takes the same slot and the same keys.
    #[serde(default)]
    pub slot: i32,
    /// The memcached pod.
    pub pod: String,
    /// Its `ip:port`.
    pub address: String,
    /// The zone of its copy (`spec.proxy.zones`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// While the slot warms up (`spec.proxy.warmUp`): the stopping pod that held it
    /// before, which the proxies read a miss from and write to as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_from: Option<WarmFrom>,
    /// While a slot added by a scale-out warms up (`spec.proxy.warmUp`): the ring as it was
    /// before it grew, which the proxies read the slot's misses from and write its keys to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_from: Option<GrownFrom>,
}

/// The ring a slot added by a scale-out warms up from.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct GrownFrom {
    /// How many slots the ring had before it grew (its first slots, whose pods are the
    /// same).
    pub slots: i32,
    /// Until when, RFC 3339: the proxies' loading of the change and a minute more.
    pub until: String,
}

/// The pod a slot warms up from.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct WarmFrom {
    /// The pod that held the slot, stopping.
    pub pod: String,
    /// Its `ip:port`.
    pub address: String,
}

impl ProxyBackend {
    /// A slot whose pod is gone, kept (routing nowhere) until a new pod takes it: the
    /// ConfigMap records it with no pod; `status.proxy.backends` lists only pods.
    pub fn is_vacant(&self) -> bool {
        self.pod.is_empty()
    }
}

/// Condition types reported in `status.conditions`.
pub mod condition {
    /// All desired pods are ready.
    pub const AVAILABLE: &str = "Available";
    /// A rollout or scale is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// The operator cannot make the pool match the spec (invalid input, API errors).
    pub const DEGRADED: &str = "Degraded";
    /// The proxy runs, is configured with the pool's Ready pods, and has had time to load
    /// that configuration (present only while `spec.proxy.enabled`).
    pub const PROXY_READY: &str = "ProxyReady";
    /// Every pod loaded its renewed TLS certificate in place; `False` names a pod whose
    /// reload agent could not load it: `CertificateInvalid` (the agent refused the files;
    /// memcached keeps its certificate) or `ReloadFailed` (memcached refused them; the pod
    /// is restarted). Present only while the certificate is reloaded in place.
    pub const CERTIFICATES_RELOADED: &str = "CertificatesReloaded";
    /// The pool serves as its spec says (the kstatus convention, which `kubectl wait
    /// --for=condition=Ready` and GitOps health checks read): `Available` True,
    /// `Progressing` False (or waiting only for the operator's own rollout slot), `Degraded`
    /// False, and `ProxyReady` True while the proxy is on; its `observedGeneration` names
    /// the generation it speaks for. False names the first of those that is not so.
    pub const READY: &str = "Ready";
}
