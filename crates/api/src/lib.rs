//! The `Memcached` custom resource (`memcached.cache.example.com/v1`): its spec types, the
//! defaults and bounds the CRD schema declares, and the modules that check a Memcached
//! without an API server.
//!
//! [`status`] holds the observed state. [`validation`] holds the API's rules and
//! [`warnings`] the risky but legal choices; they build on [`memcached_rules`] (what memcached
//! itself accepts), [`image`] and [`quantity`] (the grammars of those fields), and answer in
//! [`field_error`]s.
//!
//! The CRD YAML is generated from these types (`memcached-operator crd`); never edit it by hand.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
    Toleration,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod field_error;
pub mod image;
pub mod memcached_rules;
pub mod pod_security;
pub mod quantity;
pub mod status;
pub mod validation;
pub mod warnings;

pub use image::{IMAGE_PATTERN, MAX_IMAGE_LENGTH};
pub use quantity::QUANTITY_PATTERN;
pub use status::{
    FlushStatus, GrownFrom, MemcachedStatus, ProxyBackend, ProxyStatus, WarmFrom, condition,
};

/// API group of the Memcached kind (Kubebuilder: `--group memcached --domain cache.example.com`).
pub const GROUP: &str = "memcached.cache.example.com";
/// The one served and stored version.
pub const VERSION: &str = "v1";
/// Default memcached port, as in the seed.
pub const DEFAULT_CONTAINER_PORT: i32 = 11211;
/// Largest `spec.size` accepted. A memcached pool beyond 100 pods is a sign of a mistake
/// (a typo, a runaway autoscaler) far more often than a real need; raise it deliberately.
pub const MAX_SIZE: i32 = 100;
/// Default memcached image when neither the CR nor the operator's `--memcached-image` says
/// otherwise: the current 1.6 line on Alpine (the seed used the long-unsupported 1.4.36).
pub const DEFAULT_IMAGE: &str = "memcached:1.6.39-alpine";
/// Port reserved for the memcached exporter sidecar the operator is meant to add to each
/// pod (9150 is prometheus `memcached_exporter`'s default). The pod shares one network
/// namespace, so `spec.containerPort` may not take it (see [`validation::RESERVED_PORTS`]).
pub const EXPORTER_PORT: i32 = 9150;
/// memcached's loopback-only, non-TLS listener in a pod whose certificate is reloaded in
/// place: the reload agent sends `refresh_certs` there. Not reachable from outside the pod.
pub const TLS_ADMIN_PORT: i32 = 11299;

/// `spec.resources`' schema: k8s-openapi's `ResourceRequirements`, with
/// [`QUANTITY_PATTERN`] on the quantities of `requests` and `limits`, so a cluster without
/// the webhook still refuses `memory: abc` on the Memcached itself (the API server cannot
/// even convert such a Deployment, so nothing downstream could name the field).
fn resources_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Option<ResourceRequirements>>();
    for list in ["requests", "limits"] {
        if let Some(quantity) = schema
            .as_object_mut()
            .and_then(|o| o.get_mut("properties"))
            .and_then(|p| p.get_mut(list))
            .and_then(|l| l.get_mut("additionalProperties"))
            .and_then(|q| q.as_object_mut())
        {
            quantity.insert("pattern".into(), QUANTITY_PATTERN.into());
        }
    }
    schema
}

/// Desired state of a Memcached pool.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "memcached.cache.example.com",
    version = "v1",
    kind = "Memcached",
    plural = "memcacheds",
    singular = "memcached",
    namespaced,
    status = "MemcachedStatus",
    shortname = "mc",
    category = "all",
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "Memcached is a pool of memcached pods managed by the memcached-operator."
)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedSpec {
    /// Number of memcached pods (Deployment replicas). 0 keeps the Service but runs no pods.
    #[schemars(range(min = 0, max = 100))]
    pub size: i32,

    /// Port memcached listens on, in the pods and on the Service.
    #[serde(default = "default_container_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: i32,

    /// Container image, `[registry[:port]/]path[:tag][@digest]`. Unset means the
    /// operator's default (`--memcached-image`), chosen at each reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(IMAGE_PATTERN))]
    pub image: Option<String>,

    /// memcached's own settings, turned into its command-line flags. Unset means the seed's
    /// behaviour: 64 MiB of cache, 1024 connections, 4 threads, 1 MiB items, `-v`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MemcachedConfig>,

    /// Resources of the memcached container. Unset: derived from `config` (memory request
    /// = limit = cache + 25% + 48 MiB + 5 KiB per connection, 32 KiB with TLS, so the pod
    /// is never evicted or OOM-killed for using the cache it was given; CPU request 100m,
    /// no CPU limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,

    /// Secrets (in the Memcached's namespace) the kubelet pulls the pods' images with:
    /// memcached's, the proxy's, the exporter's and the TLS reload agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Passed through to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Passed through to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Passed through to the pods (in addition to the topology spread below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<Affinity>>,
    /// Passed through to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Extra annotations on the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// Extra labels on the pods (the operator's own labels cannot be overridden).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,

    /// How pods are spread across nodes and zones. Unset means `Preferred`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread: Option<TopologySpread>,

    /// A Prometheus memcached exporter sidecar, its port on the Service, and a
    /// ServiceMonitor when the Prometheus Operator is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<ExporterSpec>,

    /// SASL authentication (memcached `-S`) with the password database in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSpec>,

    /// TLS (memcached `-Z`) with the certificate in a `kubernetes.io/tls` Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// memcached's built-in proxy in front of the pool: one endpoint, the Service
    /// `NAME-proxy`, that hashes every key to the same pod, so clients that do not hash keys
    /// themselves stop missing. Off unless `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Box<ProxySpec>>,

    /// How pods are replaced in a rollout. Unset: each new pod must stay Ready
    /// [`DEFAULT_MIN_READY_SECONDS`] seconds before the next old one goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,

    /// extstore: memcached keeps the values of cold items in a file on disk and only their
    /// keys in memory, so a pool holds more than its memory. Off unless `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extstore: Option<Box<ExtstoreSpec>>,

    /// Extra annotations and labels on the pool's client Services (`NAME`, and `NAME-proxy`
    /// with the proxy): for load balancers, meshes and service discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Box<ServiceMetadataSpec>>,

    /// How a memcached or proxy pod stops: a delay before memcached is told to exit, so
    /// clients and proxies move away from a pod while it still answers. Unset: Kubernetes'
    /// defaults (no delay, 30 s grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown: Option<GracefulShutdownSpec>,

    /// Pod-level security settings of the memcached and proxy pods: each field set here
    /// replaces the operator's (non-root UID 11211, `fsGroup` 11211, `RuntimeDefault`
    /// seccomp). Setting `runAsUser` also removes the UID the operator sets on each
    /// container, so the pod's applies (as OpenShift's UID ranges need). Values outside
    /// the `restricted` Pod Security Standard are refused.
    // Boxed (here, in `container_security_context`, and the largest of the other sections:
    // `affinity`, `proxy`, `extstore`, `service`, `networkPolicy`): a cached Memcached is
    // 1,344 bytes inline instead of 2,624, most of which was room for sections few pools
    // set (BENCHMARKS.md, "What the idle operator held", and "10,000 pools in 150 MiB").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<Box<PodSecurityContext>>,

    /// A NetworkPolicy for the pool's pods (and the proxy's): ingress to memcached's port
    /// only from the peers listed and the pool's own proxy, to the exporter's only from
    /// the scrapers listed; nothing else. Off unless `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<Box<NetworkPolicySpec>>,

    /// A HorizontalPodAutoscaler for the pool: it sets `spec.size` through the Memcached's
    /// scale subresource, between `minReplicas` and `maxReplicas`, from the memcached
    /// container's CPU and/or memory use. While it is set, `spec.size` is the autoscaler's
    /// (an update that changes it by hand is refused; `spec.size: 0` pauses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,

    /// A flush on demand: each new `requestedAt` empties every pod's cache once (memcached's
    /// `flush_all`), one pod at a time with a pause between pods, without a restart;
    /// `status.flush` shows the progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<FlushSpec>,

    /// Container-level security settings of every container of the memcached and proxy
    /// pods: each field set here replaces the operator's (no privilege escalation, every
    /// capability dropped, read-only root filesystem, non-root). Values outside the
    /// `restricted` Pod Security Standard are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_security_context: Option<Box<SecurityContext>>,
}

/// Default cache size in MiB (the seed's `-m 64`).
pub const DEFAULT_MEMORY_MIB: i32 = 64;
/// memcached's default connection limit.
pub const DEFAULT_MAX_CONNECTIONS: i32 = 1024;
/// memcached's default worker thread count.
pub const DEFAULT_THREADS: i32 = 4;
/// memcached's default largest item.
pub const DEFAULT_MAX_ITEM_SIZE: &str = "1m";
/// The seed's `-v`.
pub const DEFAULT_VERBOSITY: i32 = 1;
/// Default image of the exporter sidecar.
pub const DEFAULT_EXPORTER_IMAGE: &str = "quay.io/prometheus/memcached-exporter:v0.15.3";

/// memcached settings; each becomes one flag.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedConfig {
    /// Cache memory in MiB (`-m`).
    #[serde(default = "default_memory_mib", rename = "memoryMiB")]
    #[schemars(range(min = 8, max = 65536))]
    pub memory_mib: i32,
    /// Simultaneous connections (`-c`).
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 16, max = 65536))]
    pub max_connections: i32,
    /// Worker threads (`-t`).
    #[serde(default = "default_threads")]
    #[schemars(range(min = 1, max = 64))]
    pub threads: i32,
    /// Largest item memcached stores (`-I`): a number of bytes, or with a `k` or `m` suffix
    /// (`512k`, `2m`); a multiple of 512k (memcached's chunk size) from 512k to 1024m, and at
    /// most half the cache.
    #[serde(default = "default_max_item_size")]
    #[schemars(pattern(r"^[0-9]{1,10}[kKmM]?$"))]
    pub max_item_size: String,
    /// 0 (quiet) to 3 (`-vvv`).
    #[serde(default = "default_verbosity")]
    #[schemars(range(min = 0, max = 3))]
    pub verbosity: i32,
    /// Further flags, appended as given. Flags the operator manages (memory, connections,
    /// threads, item size, port, listen address, user, verbosity, SASL, TLS, daemon mode)
    /// are rejected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub extra_args: Vec<String>,
}

impl Default for MemcachedConfig {
    fn default() -> Self {
        Self {
            memory_mib: DEFAULT_MEMORY_MIB,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            threads: DEFAULT_THREADS,
            max_item_size: DEFAULT_MAX_ITEM_SIZE.to_string(),
            verbosity: DEFAULT_VERBOSITY,
            extra_args: Vec::new(),
        }
    }
}

fn default_memory_mib() -> i32 {
    DEFAULT_MEMORY_MIB
}
fn default_max_connections() -> i32 {
    DEFAULT_MAX_CONNECTIONS
}
fn default_threads() -> i32 {
    DEFAULT_THREADS
}
fn default_max_item_size() -> String {
    DEFAULT_MAX_ITEM_SIZE.to_string()
}
fn default_verbosity() -> i32 {
    DEFAULT_VERBOSITY
}

/// How strictly pods are spread over nodes (`kubernetes.io/hostname`) and zones
/// (`topology.kubernetes.io/zone`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum TopologySpread {
    /// Spread when possible (`ScheduleAnyway`): losing a node loses as little cache as the
    /// cluster allows, and a small cluster still schedules every pod.
    #[default]
    Preferred,
    /// Never put two pods on one node (`DoNotSchedule`): pods stay Pending when there are
    /// fewer nodes than pods. Zones stay best effort (`ScheduleAnyway`): nodes without a
    /// zone label cannot take a pod under a strict zone rule, so on a cluster without zones
    /// every pod would stay Pending.
    Required,
    /// No spreading rules from the operator.
    Disabled,
}

/// The memcached exporter sidecar.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterSpec {
    /// Run the sidecar.
    #[serde(default)]
    pub enabled: bool,
    /// Exporter image; unset means the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(IMAGE_PATTERN))]
    pub image: Option<String>,
}

/// Default number of proxy pods.
pub const DEFAULT_PROXY_REPLICAS: i32 = 2;
/// Most proxy pods accepted.
pub const MAX_PROXY_REPLICAS: i32 = 32;
/// The label of a node's zone, which the API server copies onto a pod when the pod is
/// scheduled, from Kubernetes 1.35 on (the alpha admission plugin of 1.33 copies
/// `topology.k8s.io/zone` instead, a label nodes do not carry).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Most copies of each key accepted (`spec.proxy.copies`).
pub const MAX_PROXY_COPIES: i32 = 3;
/// How long the proxies may take to load a change of their routes, in seconds: the
/// kubelet's rewrite of the mounted ConfigMap (at most about 90 s with its defaults) and the
/// proxy's own check (measured in the operator's `proxy::PROPAGATION_WINDOW`).
pub const PROXY_PROPAGATION_SECONDS: i32 = 100;
/// The least `spec.gracefulShutdown.preStopDelaySeconds` without a warning when
/// `spec.proxy.warmUp` is on: the proxies' loading of the change, then a minute of warm-up.
pub const WARM_UP_PRE_STOP_SECONDS: i32 = PROXY_PROPAGATION_SECONDS + 60;

/// The proxy (memcached `-o proxy_config=routelib`, memcached ≥ 1.6.23 built with
/// `--enable-proxy`, as the official image is since March 2025: docker-library's "Enable
/// built-in proxy support").
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Run the proxy.
    #[serde(default)]
    pub enabled: bool,
    /// Proxy pods (they hold no data: any of them serves any key).
    #[serde(default = "default_proxy_replicas")]
    #[schemars(range(min = 1, max = 32))]
    pub replicas: i32,
    /// Image of the proxy pods; unset means the pool's image (`spec.image`, else the
    /// operator's default), which must be memcached 1.6.23 or newer built with the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Resources of the proxy container. Unset: 100m CPU and 64Mi of memory requested,
    /// 128Mi the memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// How many pods hold each key. 1: the keys are sharded over the pool by consistent
    /// hashing (the most cache for the memory). 2 or 3: the pool is split into that many
    /// groups, each a consistent-hash ring; every write goes to all groups and a read is
    /// answered by one group, falling over to the next on a miss or an error, so a key
    /// survives the loss of a pod (best effort: memcached does not synchronise copies, and
    /// `cas` and `incr`/`decr` are not consistent across them).
    #[serde(default = "default_proxy_copies")]
    #[schemars(range(min = 1, max = 3))]
    pub copies: i32,
    /// Zones of the copies (as many as `copies`, which must be 2 or 3): copy i lives in the
    /// i-th zone (`topology.kubernetes.io/zone`). The pool's pods are placed in these zones
    /// only, evenly (a strict zone spread), each pod holds a slot of its own zone's copy,
    /// and each proxy pod reads its own zone's copy first, falling over to the other zones
    /// on a miss or an error; writes still go to every copy. A pod's zone is read from its
    /// `topology.kubernetes.io/zone` label, which the API server copies from the node when
    /// the pod is scheduled from Kubernetes 1.35 on: a pod without it waits outside the
    /// rings, and `ProxyReady` says so. Unset: copies are not tied to zones. Changing the
    /// list moves every pod whose zone no longer matches its copy (its keys start cold in
    /// their new copy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub zones: Vec<String>,
    /// Warm-up of replaced pods (one copy only): while a pod of the pool stops (a rollout,
    /// a restart on demand, an eviction), the proxies read its slot from the new pod first
    /// and, on a miss there, from the stopping pod, writing the value back to the new pod
    /// as an add (`ms ... ME`, so a newer value is never overwritten); writes and deletes
    /// reach both. The slots a scale-out adds warm up the same way from the ring before it
    /// (the keys that moved only), for the proxies' loading of the change and a minute
    /// more. A replaced pod's warm-up lasts as long as the old pod serves: its
    /// `spec.gracefulShutdown.preStopDelaySeconds`, of which the proxies' loading of the
    /// change takes up to 100 s. Off by default: turning it on or off restarts the proxy
    /// pods (not the pool's), and needs `image` set to a memcached whose proxy copies
    /// whole values into a new request (memcached up to 1.6.45 may truncate large values
    /// read from a pipelined connection; see the README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up: Option<WarmUpSpec>,
    /// A gutter (one copy only): in each proxy pod, a small cache of its own that takes
    /// the reads and writes of a pool pod that fails (stopped, unreachable, its slot
    /// vacant) with a short TTL, instead of sending them to the backend behind the cache
    /// until a new pod serves the slot. Off by default: it costs each proxy pod
    /// `memoryMiB`, and turning it on or off restarts the proxy pods (not the pool's).
    /// Values written to the gutter live `ttlSeconds` at most; a pool pod that was cut
    /// off without restarting comes back with the values it had (see the README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gutter: Option<GutterSpec>,
}

/// Default memory of each proxy pod's gutter, MiB.
pub const DEFAULT_GUTTER_MEMORY_MIB: i32 = 32;
/// Default TTL of a value in the gutter, seconds.
pub const DEFAULT_GUTTER_TTL_SECONDS: i32 = 10;

/// `spec.proxy.gutter`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GutterSpec {
    /// Serve a failed pod's keys from the gutter.
    #[serde(default)]
    pub enabled: bool,
    /// Cache memory of the gutter in each proxy pod, MiB (the proxy's `-m`; the proxy's
    /// default resources grow by as much).
    #[serde(default = "default_gutter_memory_mib", rename = "memoryMiB")]
    #[schemars(range(min = 8, max = 4096))]
    pub memory_mib: i32,
    /// TTL of every value written to the gutter, seconds (a client's own TTL is
    /// replaced by it).
    #[serde(default = "default_gutter_ttl_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub ttl_seconds: i32,
}

impl Default for GutterSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            memory_mib: DEFAULT_GUTTER_MEMORY_MIB,
            ttl_seconds: DEFAULT_GUTTER_TTL_SECONDS,
        }
    }
}

fn default_gutter_memory_mib() -> i32 {
    DEFAULT_GUTTER_MEMORY_MIB
}
fn default_gutter_ttl_seconds() -> i32 {
    DEFAULT_GUTTER_TTL_SECONDS
}

/// `spec.proxy.warmUp`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmUpSpec {
    /// Warm replaced pods up from the pods they replace.
    #[serde(default)]
    pub enabled: bool,
}

impl ProxySpec {
    /// Whether replaced pods warm up through the proxy (`spec.proxy.warmUp.enabled`).
    pub fn warm_up_enabled(&self) -> bool {
        self.warm_up.as_ref().is_some_and(|w| w.enabled)
    }

    /// Whether copies are tied to zones (`spec.proxy.zones`, one per copy).
    pub fn zoned(&self) -> bool {
        self.copies > 1 && self.zones.len() == self.copies as usize
    }

    /// The gutter, when `spec.proxy.gutter.enabled`.
    pub fn gutter_enabled(&self) -> Option<&GutterSpec> {
        self.gutter.as_ref().filter(|g| g.enabled)
    }
}

impl Default for ProxySpec {
    fn default() -> Self {
        Self {
            enabled: true,
            replicas: DEFAULT_PROXY_REPLICAS,
            image: None,
            resources: None,
            copies: 1,
            zones: Vec::new(),
            warm_up: None,
            gutter: None,
        }
    }
}

fn default_proxy_replicas() -> i32 {
    DEFAULT_PROXY_REPLICAS
}
fn default_proxy_copies() -> i32 {
    1
}

/// SASL authentication.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SaslSpec {
    /// Secret in the same namespace with key `sasl-pwdb`: `user@domain:password` lines
    /// (memcached's built-in password database; memcached appends its host name to a user
    /// name without `@`, so clients authenticate as `user@domain`).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// TLS.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Secret in the same namespace with `tls.crt` and `tls.key` (as cert-manager writes).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// How a renewed certificate reaches the running pods. Unset means `InPlace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<TlsRotation>,
    /// Client certificates (mutual TLS): memcached verifies each client's certificate
    /// against a CA (`ssl_ca_cert`, `ssl_verify_mode`). Unset: any client may connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuthSpec>,
}

impl TlsSpec {
    /// A TLS spec with the certificate in `secret_name` and the default rotation.
    pub fn secret(secret_name: impl Into<String>) -> Self {
        Self {
            secret_name: secret_name.into(),
            rotation: None,
            client_auth: None,
        }
    }
}

/// Key of the CA certificate(s) in a Secret, as cert-manager writes it.
pub const CA_KEY: &str = "ca.crt";

/// Client certificate verification.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientAuthSpec {
    /// Secret in the same namespace whose `ca.crt` holds the CA certificate(s) client
    /// certificates must chain to. Unset: the `ca.crt` of `spec.tls.secretName` (cert-manager
    /// writes the issuing CA there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub ca_secret_name: Option<String>,
    /// `Required`: a client without a valid certificate is refused. `Optional`: a client
    /// may connect without one, but a certificate it presents must be valid. Unset means
    /// `Required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<ClientVerify>,
}

/// When memcached asks for a client certificate.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ClientVerify {
    /// memcached's `ssl_verify_mode=2`: no valid certificate, no connection.
    #[default]
    Required,
    /// memcached's `ssl_verify_mode=1`: a certificate is asked for, and checked if given.
    Optional,
}

impl ClientVerify {
    /// memcached's `ssl_verify_mode` for it.
    pub fn ssl_verify_mode(self) -> u8 {
        match self {
            Self::Required => 2,
            Self::Optional => 1,
        }
    }
}

/// How a renewed TLS certificate reaches the running memcached processes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum TlsRotation {
    /// A reload agent (a native sidecar from the operator's image) watches the mounted
    /// certificate and has memcached load it in place (`refresh_certs`): no pod restarts,
    /// no cache lost. Files that cannot be loaded are reported (`CertificatesReloaded`);
    /// a pod whose memcached refused them is then restarted. With SASL (binary protocol
    /// only, so no `refresh_certs`) this acts as `Restart`.
    #[default]
    InPlace,
    /// Every renewal rolls the pods, one at a time (each comes back with an empty cache).
    Restart,
}

/// Default of `spec.rollout.minReadySeconds`: longer than the 20 s the liveness probe needs
/// to fail a pod for the first time (10 s initial delay + 10 s period), so a pod that dies
/// soon after it became Ready stops the rollout before a second old pod (and its cache)
/// goes, and long enough for the hottest keys to refill the new pod.
pub const DEFAULT_MIN_READY_SECONDS: i32 = 30;
/// Largest `spec.rollout.minReadySeconds` accepted: five minutes per pod. Kubernetes wants
/// a Deployment's `progressDeadlineSeconds` (600, its default, which the operator keeps)
/// above `minReadySeconds`, and a longer wait per pod is a rollout of hours.
pub const MAX_MIN_READY_SECONDS: i32 = 300;

/// Rollout settings.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Seconds a new pod must be Ready before it counts as available and the next old pod
    /// is replaced (the Deployment's `minReadySeconds`): time for the new, empty cache to
    /// fill before another one is emptied.
    #[serde(default = "default_min_ready_seconds")]
    #[schemars(range(min = 0, max = 300))]
    pub min_ready_seconds: i32,
    /// A restart on demand: each new value (a timestamp, say) replaces every memcached pod
    /// once, one at a time at the pace above, as `kubectl rollout restart` does for a
    /// Deployment; `status.restartedAt` shows it once done. Unset or unchanged: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub restarted_at: Option<String>,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            min_ready_seconds: DEFAULT_MIN_READY_SECONDS,
            restarted_at: None,
        }
    }
}

fn default_min_ready_seconds() -> i32 {
    DEFAULT_MIN_READY_SECONDS
}

/// Default size of the extstore file.
pub const DEFAULT_EXTSTORE_SIZE: &str = "1Gi";
/// memcached's default extstore page size (`ext_page_size`), MiB.
pub const DEFAULT_EXTSTORE_PAGE_MIB: i32 = 64;
/// memcached's default write buffer size (`ext_wbuf_size`), MiB.
pub const DEFAULT_EXTSTORE_WBUF_MIB: i32 = 4;
/// memcached's default extstore IO threads (`ext_threads`).
pub const DEFAULT_EXTSTORE_THREADS: i32 = 1;
/// memcached's default smallest value stored on disk (`ext_item_size`), bytes.
pub const DEFAULT_EXTSTORE_ITEM_BYTES: i32 = 512;

/// extstore (memcached `-o ext_path=...`): values of cold items go to a file; keys and
/// item headers stay in memory.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtstoreSpec {
    /// Use extstore.
    #[serde(default)]
    pub enabled: bool,
    /// Size of the extstore file (a quantity, e.g. `4Gi`): memcached uses the whole pages
    /// of `pageSizeMiB` that fit (at least one, fewer than 65,535). The volume has room
    /// beyond it, so a full file never crosses its limit: an `emptyDir` is limited to
    /// twice the size and 1 MiB, a claim asks for an eighth more and 64 MiB.
    #[serde(default = "default_extstore_size")]
    #[schemars(length(min = 1, max = 64))]
    pub size: String,
    /// Where the file lives. Unset: an `emptyDir` (node disk, gone with the pod). Set: a
    /// generic ephemeral volume of this StorageClass, created with the pod and deleted
    /// with it, so the cache is not on the node's root disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// `ext_page_size`: MiB the file is allocated and compacted in; even, a multiple of
    /// `writeBufferMiB`.
    #[serde(default = "default_extstore_page_mib", rename = "pageSizeMiB")]
    #[schemars(range(min = 2, max = 1024))]
    pub page_size_mib: i32,
    /// `ext_wbuf_size`: MiB of each write buffer; even, at least `config.maxItemSize`.
    /// memcached keeps 6 of them in memory, which the pod's memory covers.
    #[serde(default = "default_extstore_wbuf_mib", rename = "writeBufferMiB")]
    #[schemars(range(min = 2, max = 256))]
    pub write_buffer_mib: i32,
    /// `ext_threads`: IO threads reading and writing the file.
    #[serde(default = "default_extstore_threads")]
    #[schemars(range(min = 1, max = 64))]
    pub threads: i32,
    /// `ext_item_size`: values of at least this many bytes may go to disk (smaller ones
    /// cost more memory as a disk pointer than they save).
    #[serde(default = "default_extstore_item_bytes")]
    #[schemars(range(min = 1, max = 1073741824))]
    pub item_size_bytes: i32,
    /// `ext_item_age`: only items not read for this many seconds go to disk. Unset: any
    /// item, once memory is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub item_age_seconds: Option<i32>,
}

impl Default for ExtstoreSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            size: DEFAULT_EXTSTORE_SIZE.to_string(),
            storage_class_name: None,
            page_size_mib: DEFAULT_EXTSTORE_PAGE_MIB,
            write_buffer_mib: DEFAULT_EXTSTORE_WBUF_MIB,
            threads: DEFAULT_EXTSTORE_THREADS,
            item_size_bytes: DEFAULT_EXTSTORE_ITEM_BYTES,
            item_age_seconds: None,
        }
    }
}

/// The pool's NetworkPolicy.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the NetworkPolicies (`NAME`, and `NAME-proxy` with the proxy).
    #[serde(default)]
    pub enabled: bool,
    /// The clients: peers (pod and namespace selectors, IP blocks, as in a NetworkPolicy's
    /// `from`) allowed to memcached's port, and to the proxy's. At least one when enabled;
    /// `{namespaceSelector: {}}` admits every pod of the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<NetworkPolicyPeer>,
    /// The scrapers allowed to the exporter's port (9150), e.g. Prometheus' pods. Empty:
    /// nothing may scrape it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

/// Default `spec.flush.pauseSeconds`.
pub const DEFAULT_FLUSH_PAUSE_SECONDS: i32 = 30;
/// Longest `spec.flush.pauseSeconds`.
pub const MAX_FLUSH_PAUSE_SECONDS: i32 = 3600;

/// A paced flush of the pool's caches.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlushSpec {
    /// Each new value (a timestamp, say) flushes every pod once: the operator sends
    /// `flush_all` to each Ready pod's memcached in turn, by pod name. Unchanged: nothing.
    #[schemars(length(min = 1, max = 64))]
    pub requested_at: String,
    /// Seconds between two pods, so the backend refills one pod's share of the keys before
    /// the next pod's misses start.
    #[serde(default = "default_flush_pause_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub pause_seconds: i32,
}

fn default_flush_pause_seconds() -> i32 {
    DEFAULT_FLUSH_PAUSE_SECONDS
}

/// Default `spec.autoscaling.minReplicas`.
pub const DEFAULT_AUTOSCALING_MIN_REPLICAS: i32 = 1;
/// Default `spec.autoscaling.scaleDownStabilizationSeconds`: ten minutes, so a short lull
/// does not cost a pod's share of the cache (each removed pod's keys miss once).
pub const DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS: i32 = 600;
/// Longest `spec.autoscaling.scaleDownStabilizationSeconds` (the HPA's own limit).
pub const MAX_SCALE_DOWN_STABILIZATION_SECONDS: i32 = 3600;
/// Largest utilization target accepted, in percent of the request.
pub const MAX_UTILIZATION_PERCENTAGE: i32 = 1000;
/// Seconds between two pods removed by the autoscaler: one pod at a time, so each step
/// costs the clients one pod's share of the keys and the backend refills it before the next.
pub const SCALE_DOWN_PERIOD_SECONDS: i32 = 60;

/// The pool's HorizontalPodAutoscaler.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingSpec {
    /// Fewest pods the autoscaler keeps.
    #[serde(default = "default_autoscaling_min_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub min_replicas: i32,
    /// Most pods the autoscaler runs (at least `minReplicas`).
    #[schemars(range(min = 1, max = 100))]
    pub max_replicas: i32,
    /// Target of the memcached container's CPU use, in percent of its CPU request.
    #[serde(
        default,
        rename = "targetCPUUtilizationPercentage",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub target_cpu_utilization_percentage: Option<i32>,
    /// Target of the memcached container's memory use, in percent of its memory request.
    /// memcached keeps the memory it has taken (up to `-m`), so this scales a pool up as it
    /// fills and seldom down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub target_memory_utilization_percentage: Option<i32>,
    /// How long the metrics must ask for fewer pods before a pod is removed (the HPA's
    /// scale-down stabilisation window); then one pod a minute at most.
    #[serde(default = "default_scale_down_stabilization_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_down_stabilization_seconds: i32,
}

fn default_autoscaling_min_replicas() -> i32 {
    DEFAULT_AUTOSCALING_MIN_REPLICAS
}
fn default_scale_down_stabilization_seconds() -> i32 {
    DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS
}

/// Metadata of the pool's client Services.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMetadataSpec {
    /// Extra annotations on the Services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Extra labels on the Services (the operator's own labels cannot be overridden).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Longest `spec.gracefulShutdown.preStopDelaySeconds` accepted.
pub const MAX_PRE_STOP_DELAY_SECONDS: i32 = 600;
/// Longest `spec.gracefulShutdown.terminationGracePeriodSeconds` accepted.
pub const MAX_TERMINATION_GRACE_SECONDS: i32 = 3600;
/// What `terminationGracePeriodSeconds` adds to the delay when unset: Kubernetes' own
/// default grace, after the delay.
pub const DEFAULT_GRACE_AFTER_DELAY_SECONDS: i32 = 30;

/// How a pod stops.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GracefulShutdownSpec {
    /// Seconds a deleted pod keeps serving before memcached is sent SIGTERM (a `preStop`
    /// sleep, run by the kubelet: nothing is needed in the image). The pod leaves the
    /// Services' endpoints and the proxy's backends at once, so clients that re-resolve
    /// and pools that reconnect move away while the old connections are still answered.
    #[serde(default)]
    #[schemars(range(min = 0, max = 600))]
    pub pre_stop_delay_seconds: i32,
    /// The pod's `terminationGracePeriodSeconds`: the whole time from deletion to SIGKILL,
    /// the delay included, so it must be longer than the delay. Unset: the delay plus 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub termination_grace_period_seconds: Option<i32>,
}

impl GracefulShutdownSpec {
    /// The grace period the pods get: the one set, else the delay and Kubernetes' 30 s.
    pub fn grace_seconds(&self) -> i64 {
        self.termination_grace_period_seconds.map_or_else(
            || {
                i64::from(self.pre_stop_delay_seconds)
                    + i64::from(DEFAULT_GRACE_AFTER_DELAY_SECONDS)
            },
            i64::from,
        )
    }
}

fn default_extstore_size() -> String {
    DEFAULT_EXTSTORE_SIZE.to_string()
}
fn default_extstore_page_mib() -> i32 {
    DEFAULT_EXTSTORE_PAGE_MIB
}
fn default_extstore_wbuf_mib() -> i32 {
    DEFAULT_EXTSTORE_WBUF_MIB
}
fn default_extstore_threads() -> i32 {
    DEFAULT_EXTSTORE_THREADS
}
fn default_extstore_item_bytes() -> i32 {
    DEFAULT_EXTSTORE_ITEM_BYTES
}

impl MemcachedSpec {
    /// A spec with `size` pods and every other field unset (the seed's sample).
    pub fn with_size(size: i32) -> Self {
        Self {
            size,
            container_port: DEFAULT_CONTAINER_PORT,
            image: None,
            config: None,
            resources: None,
            image_pull_secrets: None,
            node_selector: None,
            tolerations: None,
            affinity: None,
            priority_class_name: None,
            pod_annotations: None,
            pod_labels: None,
            topology_spread: None,
            exporter: None,
            sasl: None,
            tls: None,
            proxy: None,
            rollout: None,
            extstore: None,
            service: None,
            graceful_shutdown: None,
            pod_security_context: None,
            container_security_context: None,
            network_policy: None,
            autoscaling: None,
            flush: None,
        }
    }

    /// The memcached settings, defaults filled in.
    pub fn config(&self) -> MemcachedConfig {
        self.config.clone().unwrap_or_default()
    }

    /// Whether the exporter sidecar runs.
    pub fn exporter_enabled(&self) -> bool {
        self.exporter.as_ref().is_some_and(|e| e.enabled)
    }

    /// The proxy's settings, when it runs.
    pub fn proxy_enabled(&self) -> Option<&ProxySpec> {
        self.proxy.as_deref().filter(|p| p.enabled)
    }

    /// The NetworkPolicy's settings, when it is on.
    pub fn network_policy_enabled(&self) -> Option<&NetworkPolicySpec> {
        self.network_policy.as_deref().filter(|n| n.enabled)
    }

    /// extstore's settings, when it is on.
    pub fn extstore_enabled(&self) -> Option<&ExtstoreSpec> {
        self.extstore.as_deref().filter(|e| e.enabled)
    }

    /// `minReadySeconds` of the pool's Deployment.
    pub fn min_ready_seconds(&self) -> i32 {
        self.rollout
            .as_ref()
            .map_or(DEFAULT_MIN_READY_SECONDS, |r| r.min_ready_seconds)
    }

    /// Whether a renewed TLS certificate is loaded in place by the reload agent: TLS is on,
    /// its rotation is `InPlace` and SASL is off (with SASL memcached speaks only the
    /// binary protocol, which has no `refresh_certs`).
    pub fn tls_reloads_in_place(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|t| t.rotation.unwrap_or_default() == TlsRotation::InPlace)
            && self.sasl.is_none()
    }
}

fn default_container_port() -> i32 {
    DEFAULT_CONTAINER_PORT
}

impl Memcached {
    /// The image to run: the CR's own, else the operator's default.
    pub fn image_or<'a>(&'a self, default: &'a str) -> &'a str {
        match self.spec.image.as_deref() {
            Some(image) if !image.is_empty() => image,
            _ => default,
        }
    }

    /// A condition of the status by type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn seed_sample_parses_with_defaults() {
        let yaml = r#"
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata:
  name: memcached-sample
spec:
  size: 3
"#;
        let mc: Memcached = serde_yaml::from_str(yaml).expect("seed sample parses");
        assert_eq!(mc.spec.size, 3);
        assert_eq!(mc.spec.container_port, DEFAULT_CONTAINER_PORT);
        assert_eq!(mc.image_or(DEFAULT_IMAGE), DEFAULT_IMAGE);
    }

    #[test]
    fn crd_declares_subresources_columns_and_names() {
        let crd = Memcached::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("memcacheds.memcached.cache.example.com")
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["mc".to_string()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["all".to_string()]));
        let version = &crd.spec.versions[0];
        let sub = version.subresources.as_ref().expect("subresources");
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().expect("scale subresource");
        assert_eq!(scale.spec_replicas_path, ".spec.size");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Size", "Ready", "Available", "Age"]);
    }

    #[test]
    fn crd_schema_carries_bounds_and_defaults() {
        let crd = Memcached::crd();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serializes");
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["size"]));
        let size = &spec["properties"]["size"];
        assert_eq!(size["minimum"], 0.0);
        assert_eq!(size["maximum"], f64::from(MAX_SIZE));
        let port = &spec["properties"]["containerPort"];
        assert_eq!(port["default"], 11211);
        assert_eq!(port["minimum"], 1.0);
        assert_eq!(port["maximum"], 65535.0);
        let image = &spec["properties"]["image"];
        assert_eq!(image["pattern"], IMAGE_PATTERN);
        assert_eq!(image["maxLength"], MAX_IMAGE_LENGTH);
    }
}
