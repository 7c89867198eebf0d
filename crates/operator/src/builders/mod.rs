//! Desired state: pure functions from a Memcached (and the operator's settings) to the
//! objects it should own: the Deployment ([`pool`]: its pod template), the client Service,
//! the headless Service, the PodDisruptionBudget and (with the exporter) the
//! ServiceMonitor; the labels, names and owner reference they share. No client, no clock,
//! no randomness, so they are unit-tested in microseconds and the reconciler only applies
//! what they return. Which of them a Memcached has is listed in [`crate::children`].

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricSource, CrossVersionObjectReference, HPAScalingPolicy, HPAScalingRules,
    HorizontalPodAutoscaler, HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec,
    MetricSpec, MetricTarget,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use memcached_api::{EXPORTER_PORT, Memcached};

pub mod pool;
#[cfg(test)]
mod tests;

pub use pool::*;

/// Field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "memcached-operator";
/// Value of `app.kubernetes.io/managed-by` on everything the operator creates.
pub const MANAGED_BY: &str = "memcached-operator";
/// Name of the memcached container and of its port (as in the seed).
pub const CONTAINER_NAME: &str = "memcached";
/// Name of the exporter sidecar and of its port.
pub const EXPORTER_NAME: &str = "exporter";
/// Name of the metrics port (exporter) on the pods and the Service.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Annotation holding a hash of the last applied desired object, so a converged object
/// is recognised without a write (see [`crate::drift`]).
pub const APPLIED_HASH_ANNOTATION: &str = "memcached.cache.example.com/applied-hash";
/// Pod template annotation: a hash of the memcached configuration, including the versions
/// of the Secrets it mounts, so a rotated SASL or TLS Secret rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "memcached.cache.example.com/config-hash";
/// Pod template annotation holding `spec.rollout.restartedAt`: a new value is a new
/// template, so the Deployment replaces every pod once (as `kubectl rollout restart`'s
/// `kubectl.kubernetes.io/restartedAt` does).
pub const RESTARTED_AT_ANNOTATION: &str = "memcached.cache.example.com/restartedAt";
/// UID the memcached images run as (the `memcache` user of the official image).
pub const MEMCACHED_UID: i64 = 11211;
/// UID of the exporter image (`nobody`).
pub const EXPORTER_UID: i64 = 65534;
/// Suffix of the headless Service's name.
pub use memcached_api::validation::HEADLESS_SUFFIX;
/// Key of the SASL password database in its Secret.
pub const SASL_PWDB_KEY: &str = "sasl-pwdb";
/// The keys of the TLS Secret memcached reads (without client authentication memcached
/// verifies no client, so a `ca.crt` beside them is not mounted).
pub const TLS_KEYS: [&str; 2] = ["tls.crt", "tls.key"];
/// The keys of the TLS Secret memcached reads when it verifies clients against the
/// Secret's own `ca.crt`.
pub const TLS_KEYS_WITH_CA: [&str; 3] = ["tls.crt", "tls.key", memcached_api::CA_KEY];
/// The key memcached reads from a CA Secret of its own (`spec.tls.clientAuth.caSecretName`).
pub const CA_KEYS: [&str; 1] = [memcached_api::CA_KEY];
/// Where the `sasl` volume is mounted: the password database and memcached's SASL
/// configuration.
pub const SASL_DIR: &str = "/etc/memcached/sasl";
/// The environment variable memcached reads its SASL configuration's directory from.
/// Without one (or `/etc/sasl2/memcached.conf` in the image, which the official images do
/// not have) `memcached -S` exits at start ("Error initializing sasl.").
pub const SASL_CONF_PATH_ENV: &str = "SASL_CONF_PATH";
/// The SASL configuration's file name in [`SASL_DIR`] (Cyrus SASL reads `APP.conf`).
pub const SASL_CONF_FILE: &str = "memcached.conf";
/// Pod template annotation whose value the `sasl` volume holds as [`SASL_CONF_FILE`].
pub const SASL_CONF_ANNOTATION: &str = "memcached.cache.example.com/sasl-conf";
/// memcached's SASL configuration: PLAIN alone, the one mechanism memcached checks against
/// its password database. With no `mech_list` Cyrus SASL offers every mechanism of the
/// image's plugin directory (with Debian's `libsasl2-modules`: ANONYMOUS, LOGIN, the
/// digests), none of which the database was written for.
pub const SASL_CONF: &str = "mech_list: plain\n";
/// Where the TLS Secret is mounted in the memcached container and the reload agent.
pub use memcached_tls_agent::CERT_DIR as TLS_DIR;
/// Where the extstore volume is mounted, and the file memcached writes in it.
pub const EXTSTORE_DIR: &str = "/var/lib/memcached/extstore";
pub const EXTSTORE_FILE: &str = "/var/lib/memcached/extstore/data";
/// Name of the extstore volume.
pub const EXTSTORE_VOLUME: &str = "extstore";
/// Name of the TLS reload agent's container (a native sidecar).
pub const TLS_AGENT_NAME: &str = "tls-reload-agent";
// The reload agent's contract (crates/tls-agent): its exit codes, which the reconciler
// reads from the container's last termination, and its state directory. The old names
// stay, as the rest of the operator knows them.
pub use memcached_tls_agent::{
    EXIT_CERTIFICATE_INVALID as TLS_AGENT_CERTIFICATE_INVALID,
    EXIT_RELOAD_FAILED as TLS_AGENT_RELOAD_FAILED, STATE_DIR as TLS_AGENT_STATE_DIR,
};
const TLS_AGENT_STATE_VOLUME: &str = "tls-reload-agent";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";

/// What the builders need besides the Memcached itself.
#[derive(Clone, Debug)]
pub struct BuildSettings {
    /// Image used when the CR does not name one (`--memcached-image`).
    pub default_image: String,
    /// Exporter image used when the CR does not name one.
    pub default_exporter_image: String,
    /// Image of the TLS reload agent (`--tls-agent-image`): its own small image
    /// (tls-agent.Dockerfile), whose binary is at [`TLS_AGENT_BINARY`], versioned as the
    /// agent (crates/tls-agent), so that it moves only when the agent changes.
    pub tls_agent_image: String,
}

/// The agent's binary in its image (tls-agent.Dockerfile's `COPY`). Pools created by
/// releases before 0.2.0 run it as `/memcached-operator tls-reload-agent` from the
/// operator's image, and keep doing so (see `controller::rollout`).
pub const TLS_AGENT_BINARY: &str = "/memcached-tls-agent";
/// The reload agent's image when the operator is not told one (`make run` outside the
/// cluster): the Makefile's default `TLS_AGENT_IMG`.
pub const DEFAULT_TLS_AGENT_IMAGE: &str = "tls-agent:latest";

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            default_image: memcached_api::DEFAULT_IMAGE.to_string(),
            default_exporter_image: memcached_api::DEFAULT_EXPORTER_IMAGE.to_string(),
            tls_agent_image: DEFAULT_TLS_AGENT_IMAGE.to_string(),
        }
    }
}

/// Digests of the contents of the Secrets the pods mount, as read by the reconciler; part
/// of the config hash, so that a rotated Secret rolls the pods and an edit of a Secret's
/// metadata alone does not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SecretVersions {
    /// [`secret_digest`] of the SASL Secret's password database.
    pub sasl: Option<String>,
    /// [`secret_digest`] of the TLS Secret's certificate and key.
    pub tls: Option<String>,
    /// [`secret_digest`] of the client CA (`ca.crt`) with client authentication. Always
    /// part of the config hash, even when certificates reload in place: memcached's
    /// `refresh_certs` adds the CAs of a new `ca.crt` to those it trusts but never drops
    /// one (measured, memcached 1.6.18 and 1.6.38), so only a restart takes a CA out.
    pub client_ca: Option<String>,
}

/// Why a desired object cannot be built. Only objects that never came from the API server
/// (no name, no uid) hit these; the reconciler reports them rather than panicking.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("the Memcached has no metadata.{0}")]
    MissingMetadata(&'static str),
}

/// Labels that select the pods of one Memcached. They never change across operator
/// versions, because a Deployment's selector is immutable.
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "memcached".to_string()),
        (LABEL_INSTANCE.to_string(), name.to_string()),
    ])
}

/// The recommended labels put on every object the operator creates for Memcached `name`.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(name);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "cache".to_string());
    labels
}

/// The selector as a string, as the scale subresource reports it for HPA.
pub fn selector_string(name: &str) -> String {
    selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A controller owner reference to `mc` that blocks its deletion until the child is gone
/// under foreground deletion.
pub fn owner_reference(mc: &Memcached) -> Result<OwnerReference, BuildError> {
    Ok(OwnerReference {
        api_version: Memcached::api_version(&()).into_owned(),
        kind: Memcached::kind(&()).into_owned(),
        name: mc
            .metadata
            .name
            .clone()
            .ok_or(BuildError::MissingMetadata("name"))?,
        uid: mc
            .metadata
            .uid
            .clone()
            .ok_or(BuildError::MissingMetadata("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

pub(crate) fn child_metadata(mc: &Memcached, child_name: &str) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(child_name.to_string()),
        namespace: mc.metadata.namespace.clone(),
        labels: Some(labels(name_of(mc)?)),
        owner_references: Some(vec![owner_reference(mc)?]),
        ..ObjectMeta::default()
    })
}

/// `child_metadata` for one of the pool's client Services: `spec.service`'s annotations and
/// labels added, the operator's labels over any of the same key.
pub(crate) fn service_metadata(
    mc: &Memcached,
    child_name: &str,
    own_labels: BTreeMap<String, String>,
) -> Result<ObjectMeta, BuildError> {
    let mut metadata = child_metadata(mc, child_name)?;
    let extra = mc.spec.service.as_ref();
    let mut labels = extra.and_then(|s| s.labels.clone()).unwrap_or_default();
    labels.extend(own_labels);
    metadata.labels = Some(labels);
    metadata.annotations = extra
        .and_then(|s| s.annotations.clone())
        .filter(|a| !a.is_empty());
    Ok(metadata)
}

pub(crate) fn name_of(mc: &Memcached) -> Result<&str, BuildError> {
    mc.metadata
        .name
        .as_deref()
        .ok_or(BuildError::MissingMetadata("name"))
}

/// The headless Service's name.
pub fn headless_name(name: &str) -> String {
    format!("{name}{HEADLESS_SUFFIX}")
}

fn service_ports(mc: &Memcached) -> Vec<ServicePort> {
    let mut ports = vec![ServicePort {
        name: Some(CONTAINER_NAME.to_string()),
        port: mc.spec.container_port,
        target_port: Some(IntOrString::String(CONTAINER_NAME.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }];
    if mc.spec.exporter_enabled() {
        ports.push(ServicePort {
            name: Some(METRICS_PORT_NAME.to_string()),
            port: EXPORTER_PORT,
            target_port: Some(IntOrString::String(METRICS_PORT_NAME.to_string())),
            protocol: Some("TCP".to_string()),
            ..ServicePort::default()
        });
    }
    ports
}

/// The client Service `NAME`, headless, on `spec.containerPort` (and the exporter's metrics
/// port when it runs): DNS answers with the address of every ready pod, for clients that
/// hash keys over the pods (a cluster IP would send each connection to a random pod, whose
/// keys another connection then misses), and Prometheus scrapes each pod through it. One
/// Service per pool: the control plane keeps one set of endpoints for its pods.
pub fn desired_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    Ok(Service {
        metadata: service_metadata(mc, name, labels(name))?,
        spec: Some(headless_spec(name, service_ports(mc))),
        status: None,
    })
}

fn headless_spec(name: &str, ports: Vec<ServicePort>) -> ServiceSpec {
    ServiceSpec {
        type_: Some("ClusterIP".to_string()),
        cluster_ip: Some("None".to_string()),
        selector: Some(selector_labels(name)),
        ports: Some(ports),
        publish_not_ready_addresses: Some(false),
        ..ServiceSpec::default()
    }
}

/// The client Service `NAME` as earlier releases created it, with a cluster IP, which a
/// Service keeps for life: a pool created by one of them keeps this form (and its
/// `NAME-headless`, [`desired_headless_service`]) until the Service is deleted (see
/// `children::LiveServices`).
pub fn desired_cluster_ip_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    Ok(Service {
        metadata: service_metadata(mc, name, labels(name))?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector_labels(name)),
            ports: Some(service_ports(mc)),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// The headless Service `<name>-headless` that earlier releases created beside a
/// ClusterIP `NAME`: kept for the pools that have one (clients may resolve it), never
/// created for a pool whose `NAME` is headless.
pub fn desired_headless_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    let mut ports = service_ports(mc);
    ports.truncate(1);
    Ok(Service {
        metadata: service_metadata(mc, &headless_name(name), labels(name))?,
        spec: Some(headless_spec(name, ports)),
        status: None,
    })
}

/// A PodDisruptionBudget allowing one voluntary disruption at a time when there are at
/// least two pods; `None` below that (a budget on one pod would block node drains).
pub fn desired_pdb(mc: &Memcached) -> Result<Option<PodDisruptionBudget>, BuildError> {
    let name = name_of(mc)?;
    if mc.spec.size < 2 {
        return Ok(None);
    }
    Ok(Some(PodDisruptionBudget {
        metadata: child_metadata(mc, name)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}

/// An ingress rule admitting `from` to `port` (TCP); `None` when `from` is empty (a rule
/// without peers would admit everyone).
pub(crate) fn ingress(port: i32, from: Vec<NetworkPolicyPeer>) -> Option<NetworkPolicyIngressRule> {
    (!from.is_empty()).then(|| NetworkPolicyIngressRule {
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".to_string()),
            end_port: None,
        }]),
        from: Some(from),
    })
}

/// A NetworkPolicy `metadata` selecting `pods` that admits only `rules` (no rule: nothing).
pub(crate) fn network_policy(
    metadata: ObjectMeta,
    pods: BTreeMap<String, String>,
    rules: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(pods),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(rules),
            egress: None,
        }),
    }
}

/// The NetworkPolicy `NAME` of the pool's pods, with `spec.networkPolicy`: memcached's port
/// from the peers listed and the pool's proxy pods, the exporter's from the scrapers listed;
/// no other ingress (egress is left open: memcached makes no connection of its own).
pub fn desired_network_policy(mc: &Memcached) -> Result<Option<NetworkPolicy>, BuildError> {
    let Some(policy) = mc.spec.network_policy_enabled() else {
        return Ok(None);
    };
    let name = name_of(mc)?;
    let mut clients = policy.from.clone();
    if mc.spec.proxy_enabled().is_some() {
        clients.push(NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(crate::proxy::proxy_selector_labels(name)),
                match_expressions: None,
            }),
            ..NetworkPolicyPeer::default()
        });
    }
    let mut rules: Vec<_> = ingress(mc.spec.container_port, clients)
        .into_iter()
        .collect();
    if mc.spec.exporter_enabled() {
        rules.extend(ingress(EXPORTER_PORT, policy.metrics_from.clone()));
    }
    Ok(Some(network_policy(
        child_metadata(mc, name)?,
        selector_labels(name),
        rules,
    )))
}

/// The HorizontalPodAutoscaler `NAME`, with `spec.autoscaling`: it targets the Memcached's
/// scale subresource (not the Deployment, which the operator sizes from `spec.size`, so the
/// two never write the same field), on the memcached container's own CPU and memory
/// (`ContainerResource`: the exporter's and the agent's use do not count), and removes one
/// pod a minute at most after the stabilisation window: each removed pod's keys miss once.
pub fn desired_hpa(mc: &Memcached) -> Result<Option<HorizontalPodAutoscaler>, BuildError> {
    let Some(autoscaling) = &mc.spec.autoscaling else {
        return Ok(None);
    };
    let name = name_of(mc)?;
    let target = |resource: &str, percent: i32| MetricSpec {
        type_: "ContainerResource".to_string(),
        container_resource: Some(ContainerResourceMetricSource {
            container: CONTAINER_NAME.to_string(),
            name: resource.to_string(),
            target: MetricTarget {
                type_: "Utilization".to_string(),
                average_utilization: Some(percent),
                ..MetricTarget::default()
            },
        }),
        ..MetricSpec::default()
    };
    let metrics = [
        ("cpu", autoscaling.target_cpu_utilization_percentage),
        ("memory", autoscaling.target_memory_utilization_percentage),
    ]
    .into_iter()
    .filter_map(|(resource, percent)| percent.map(|p| target(resource, p)))
    .collect();
    Ok(Some(HorizontalPodAutoscaler {
        metadata: child_metadata(mc, name)?,
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(Memcached::api_version(&()).into_owned()),
                kind: Memcached::kind(&()).into_owned(),
                name: name.to_string(),
            },
            min_replicas: Some(autoscaling.min_replicas),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(metrics),
            behavior: Some(HorizontalPodAutoscalerBehavior {
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(
                        autoscaling.scale_down_stabilization_seconds,
                    ),
                    policies: Some(vec![HPAScalingPolicy {
                        type_: "Pods".to_string(),
                        value: 1,
                        period_seconds: memcached_api::SCALE_DOWN_PERIOD_SECONDS,
                    }]),
                    ..HPAScalingRules::default()
                }),
                scale_up: None,
            }),
        }),
        status: None,
    }))
}

/// A Prometheus Operator ServiceMonitor (`monitoring.coreos.com/v1`), typed as far as the
/// operator needs it: its metadata, and its spec as JSON (the operator writes two fields of
/// it and reads none).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServiceMonitor {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

impl Resource for ServiceMonitor {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ServiceMonitor".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "monitoring.coreos.com".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "servicemonitors".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The Prometheus Operator ServiceMonitor scraping the exporter through the client Service,
/// when the exporter runs.
pub fn desired_service_monitor(mc: &Memcached) -> Result<Option<ServiceMonitor>, BuildError> {
    let name = name_of(mc)?;
    if !mc.spec.exporter_enabled() {
        return Ok(None);
    }
    Ok(Some(ServiceMonitor {
        api_version: ServiceMonitor::api_version(&()).into_owned(),
        kind: ServiceMonitor::kind(&()).into_owned(),
        metadata: child_metadata(mc, name)?,
        spec: serde_json::json!({
            "selector": {"matchLabels": labels(name)},
            "endpoints": [{"port": METRICS_PORT_NAME, "interval": "30s"}],
        }),
    }))
}
