//! The chart's values: one Rust type gives `values.yaml` (its defaults),
//! `values.schema.json` (schemars; Helm refuses values that do not match it, unknown keys
//! included) and the README's table (the doc comments).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
    Toleration, TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::manifests;
use crate::monitoring::AlertThresholds;

/// The values of the memcached-operator chart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Values {
    /// The operator's image.
    pub image: Image,
    pub tls_agent: TlsAgent,
    /// Secrets to pull the image from a private registry (`[{name: regcred}]`).
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Replicas of the operator. With leader election one reconciles and the others stand
    /// by; more than 1 needs `leaderElection.enabled`.
    #[schemars(range(min = 0))]
    pub replica_count: i32,
    pub leader_election: LeaderElection,
    /// Namespaces whose Memcacheds the operator manages; empty: every namespace. With
    /// namespaces, the manager's ClusterRole is bound in each of them only (RoleBindings),
    /// and the webhooks see only their Memcacheds. Each namespace must exist.
    #[schemars(
        inner(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")),
        extend("uniqueItems" = true)
    )]
    pub watch_namespaces: Vec<String>,
    pub crds: Crds,
    pub webhook: Webhook,
    pub metrics: Metrics,
    pub prometheus_rule: PrometheusRule,
    pub dashboards: Dashboards,
    pub network_policy: NetworkPolicy,
    pub service_account: ServiceAccount,
    /// The operator container's resources.
    pub resources: ResourceRequirements,
    /// The operator pod's security context.
    pub pod_security_context: PodSecurityContext,
    /// The operator container's security context.
    pub security_context: SecurityContext,
    /// Annotations added to the operator's pod.
    pub pod_annotations: BTreeMap<String, String>,
    /// Labels added to the operator's pod.
    pub pod_labels: BTreeMap<String, String>,
    /// Node labels the operator's pod must match.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the operator's pod.
    pub tolerations: Vec<Toleration>,
    /// Affinity of the operator's pod.
    pub affinity: Affinity,
    /// Topology spread constraints of the operator's pods.
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// PriorityClass of the operator's pod.
    pub priority_class_name: String,
    /// More flags for `memcached-operator run` (`memcached-operator run --help`), e.g.
    /// `--max-concurrent-reconciles=32` or `--log-format=json`.
    pub extra_args: Vec<String>,
    /// Replaces the chart's name in object names.
    pub name_override: String,
    /// Replaces the `<release>-<chart>` prefix of object names.
    pub fullname_override: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Image {
    /// Repository of the operator's image.
    pub repository: String,
    /// Tag of the image; empty: the chart's appVersion.
    pub tag: String,
    /// When the kubelet pulls the image.
    pub pull_policy: PullPolicy,
}

/// The TLS reload agent: a native sidecar the operator adds to the memcached pods whose
/// certificate is reloaded in place (`--tls-agent-image`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsAgent {
    pub image: TlsAgentImage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsAgentImage {
    /// Repository of the TLS reload agent's own image (`make docker-build-tls-agent`). It
    /// runs in memcached pods, whose kubelet pulls it with the Memcached's
    /// `spec.imagePullSecrets` (not with `imagePullSecrets`, the operator pod's).
    #[schemars(length(min = 1))]
    pub repository: String,
    /// Tag of the agent's image: the agent's own version (crates/tls-agent), which moves
    /// only when the agent changes, not with the chart's appVersion. A new one reaches
    /// running pools with their next rollout.
    #[schemars(length(min = 1))]
    pub tag: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElection {
    /// Run active/standby on a Lease in the release's namespace (`--leader-elect`).
    pub enabled: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Crds {
    /// Install and upgrade the Memcached CRD with the chart.
    pub install: bool,
    /// Keep the CRD when the release is uninstalled (`helm.sh/resource-policy: keep`):
    /// deleting it would delete every Memcached and its cache.
    pub keep: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Webhook {
    /// Serve the defaulting and validating admission webhooks and register them.
    pub enabled: bool,
    pub cert_manager: CertManager,
    pub certificate: WebhookCertificate,
}

/// A webhook certificate of your own (GitOps): with it the chart makes none, and every
/// render is the same, `helm template`'s included.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WebhookCertificate {
    /// PEM of the CA that issued the webhook's serving certificate: the webhooks' caBundle,
    /// which the API server checks the operator with. Needed with `crt` and `key`, or with
    /// `existingSecret`.
    #[schemars(pattern(r"^(-----BEGIN CERTIFICATE-----[\s\S]*)?$"))]
    pub ca: String,
    /// PEM of the webhook's serving certificate, valid for the DNS name
    /// `<fullname>-webhook-service.<namespace>.svc`; the chart puts it, `key` and `ca` in
    /// its Secret as given (`--set-file webhook.certificate.crt=tls.crt`).
    #[schemars(pattern(r"^(-----BEGIN CERTIFICATE-----[\s\S]*)?$"))]
    pub crt: String,
    /// PEM of the serving certificate's private key.
    #[schemars(pattern(r"^(-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*)?$"))]
    pub key: String,
    /// A `kubernetes.io/tls` Secret in the release's namespace with the serving certificate,
    /// made outside the chart (a SealedSecret, an ExternalSecret, ...): the operator mounts
    /// it instead of the chart's, and no key is in the values (set `ca` too). The operator
    /// serves a renewed certificate once the kubelet updates the mount, without a restart;
    /// a new CA needs `ca` updated.
    #[schemars(length(max = 253), pattern(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"))]
    pub existing_secret: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CertManager {
    /// The webhook certificate from cert-manager (an Issuer and a Certificate; its CA
    /// injector fills in the caBundle). Off, and no `webhook.certificate`: the chart makes a
    /// self-signed CA and certificate at install and keeps them across upgrades (`helm
    /// upgrade` looks them up in the cluster; `helm template` cannot, and makes new ones at
    /// every render).
    pub enabled: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Metrics {
    /// Serve Prometheus metrics over HTTPS to authorized callers (bind them to the
    /// `metrics-reader` ClusterRole), and a Service for them.
    pub enabled: bool,
    /// Port of the metrics endpoint and its Service.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    pub service_monitor: ServiceMonitor,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceMonitor {
    /// A ServiceMonitor for the Prometheus Operator (needs its CRDs).
    pub enabled: bool,
}

/// The alerts (README, "Alerts and dashboards").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PrometheusRule {
    /// The pools' and the operator's alerts as a PrometheusRule (needs the Prometheus
    /// Operator's CRDs); the pools' read their exporters (`spec.exporter.enabled`).
    pub enabled: bool,
    /// Labels added to the PrometheusRule, for Prometheus' `ruleSelector`
    /// (kube-prometheus-stack: `release: <its release>`).
    pub labels: BTreeMap<String, String>,
    pub thresholds: AlertThresholds,
}

/// The Grafana dashboards (README, "Alerts and dashboards").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dashboards {
    /// The pool, proxy and operator dashboards as ConfigMaps, which Grafana's dashboard
    /// sidecar loads.
    pub enabled: bool,
    /// Labels of the ConfigMaps: the sidecar's `label` and `labelValue`.
    pub labels: BTreeMap<String, String>,
    /// Annotations of the ConfigMaps (the sidecar's folder annotation, for instance).
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NetworkPolicy {
    /// NetworkPolicies admitting only metrics scrapers from namespaces labelled
    /// `metrics: enabled` to the metrics port, and `webhookFrom` to the webhook port.
    pub enabled: bool,
    /// Who may reach the webhook port, as NetworkPolicy peers: the API server's addresses,
    /// which only the cluster knows (`[{ipBlock: {cidr: 10.0.0.10/32}}]`; on kubeadm the
    /// control-plane nodes' addresses). Empty: every source, since the API server is no
    /// pod a selector can match.
    pub webhook_from: Vec<NetworkPolicyPeer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceAccount {
    /// Create the operator's ServiceAccount.
    pub create: bool,
    /// Its name; empty: `<fullname>-controller-manager`. Required when `create` is false
    /// (the chart refuses to bind the operator's roles to a namespace's `default` account).
    pub name: String,
    /// Annotations of the ServiceAccount (workload identity, for instance).
    pub annotations: BTreeMap<String, String>,
}

impl Default for Values {
    /// The defaults are the kustomize tree's: resources and security contexts come from
    /// [`manifests::manager_deployment`].
    fn default() -> Values {
        let pod = manifests::manager_deployment()
            .ok()
            .and_then(|d| d.spec)
            .and_then(|s| s.template.spec);
        let container = pod.as_ref().and_then(|p| p.containers.first().cloned());
        Values {
            image: Image::default(),
            tls_agent: TlsAgent::default(),
            image_pull_secrets: vec![],
            replica_count: 1,
            leader_election: LeaderElection { enabled: true },
            watch_namespaces: vec![],
            crds: Crds {
                install: true,
                keep: true,
            },
            webhook: Webhook {
                enabled: true,
                cert_manager: CertManager { enabled: false },
                certificate: WebhookCertificate::default(),
            },
            metrics: Metrics {
                enabled: true,
                port: manifests::METRICS_PORT,
                service_monitor: ServiceMonitor { enabled: false },
            },
            prometheus_rule: PrometheusRule {
                enabled: false,
                labels: BTreeMap::new(),
                thresholds: AlertThresholds::default(),
            },
            dashboards: Dashboards {
                enabled: false,
                labels: BTreeMap::from([(
                    crate::monitoring::DASHBOARD_LABEL.0.to_string(),
                    crate::monitoring::DASHBOARD_LABEL.1.to_string(),
                )]),
                annotations: BTreeMap::new(),
            },
            network_policy: NetworkPolicy {
                enabled: false,
                webhook_from: vec![],
            },
            service_account: ServiceAccount {
                create: true,
                name: String::new(),
                annotations: BTreeMap::new(),
            },
            resources: container
                .as_ref()
                .and_then(|c| c.resources.clone())
                .unwrap_or_default(),
            pod_security_context: pod
                .as_ref()
                .and_then(|p| p.security_context.clone())
                .unwrap_or_default(),
            security_context: container
                .and_then(|c| c.security_context)
                .unwrap_or_default(),
            pod_annotations: BTreeMap::new(),
            pod_labels: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            affinity: Affinity::default(),
            topology_spread_constraints: vec![],
            priority_class_name: String::new(),
            extra_args: vec![],
            name_override: String::new(),
            fullname_override: String::new(),
        }
    }
}

impl Default for Image {
    fn default() -> Image {
        Image {
            repository: manifests::IMAGE_REPOSITORY.to_string(),
            tag: String::new(),
            pull_policy: PullPolicy::IfNotPresent,
        }
    }
}

impl Default for TlsAgent {
    fn default() -> TlsAgent {
        TlsAgent {
            image: TlsAgentImage {
                repository: manifests::tls_agent_repository(manifests::IMAGE_REPOSITORY),
                tag: manifests::TLS_AGENT_VERSION.to_string(),
            },
        }
    }
}

impl Default for TlsAgentImage {
    fn default() -> TlsAgentImage {
        TlsAgent::default().image
    }
}

macro_rules! default_from_values {
    ($($ty:ident => $field:ident $(. $sub:ident)*),* $(,)?) => {$(
        impl Default for $ty {
            fn default() -> $ty {
                Values::default().$field$(.$sub)*
            }
        }
    )*};
}

default_from_values!(
    LeaderElection => leader_election,
    Crds => crds,
    Webhook => webhook,
    CertManager => webhook.cert_manager,
    Metrics => metrics,
    ServiceMonitor => metrics.service_monitor,
    PrometheusRule => prometheus_rule,
    Dashboards => dashboards,
    NetworkPolicy => network_policy,
    ServiceAccount => service_account,
);

/// `values.schema.json`: the JSON Schema of [`Values`] (k8s-openapi's schemas for the
/// Kubernetes types: quantities take `1` as well as `500m`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Values)).unwrap_or_default()
}
