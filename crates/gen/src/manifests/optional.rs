//! The overlays `config/default` leaves out: `config/prometheus` (the Prometheus Operator's
//! ServiceMonitor of the operator and the alerts), `config/grafana` (the dashboards) and
//! `config/network-policy` (the NetworkPolicies of the operator's pod).

use serde_json::{Value, json};

use super::{
    Doc, Error, File, Kustomization, METRICS_PORT, WEBHOOK_PORT, labels, object_labels,
    selector_labels, typed,
};
use crate::monitoring;
use memcached_operator::rbac::BASE_NAMESPACE;

/// The Prometheus Operator's ServiceMonitor of the metrics Service.
pub(crate) fn service_monitor() -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": "controller-manager-metrics-monitor",
            "namespace": BASE_NAMESPACE,
            "labels": object_labels(),
        },
        "spec": {
            "endpoints": [{
                // The operator's series name the pool's namespace (`namespace`): kept, not
                // replaced by the operator's own (Prometheus moves a clashing label to
                // `exported_namespace` otherwise), as kube-prometheus does for
                // kube-state-metrics. Its other series carry no namespace: the target's.
                "honorLabels": true,
                "path": "/metrics",
                "port": "https",
                "scheme": "https",
                "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "tlsConfig": {"insecureSkipVerify": true},
            }],
            "selector": {"matchLabels": selector_labels()},
        },
    })
}

/// The alerts (crate::monitoring::alerts) with their default thresholds.
pub(crate) fn prometheus_rule() -> Value {
    monitoring::prometheus_rule(json!({
        "name": monitoring::RULE_NAME,
        "namespace": BASE_NAMESPACE,
        "labels": labels(),
    }))
}

pub(super) fn prometheus_files() -> Result<Vec<File>, Error> {
    let monitor = service_monitor();
    Ok(vec![
        Doc::new("prometheus/alerts.yaml")
            .comment("The alerts of the pools (from their exporters' metrics) and of the operator.")
            .comment("Prometheus loads a PrometheusRule its ruleSelector matches: add its labels")
            .comment("(kube-prometheus-stack: release: <its release>) with kustomize's `labels`.")
            .comment("Thresholds: README, \"Alerts and dashboards\".")
            .object(&prometheus_rule())?
            .finish(),
        Doc::new("prometheus/monitor.yaml")
            .comment("Scrapes the secured metrics endpoint with the Prometheus service account's")
            .comment(
                "token (bind it to the metrics-reader ClusterRole). The serving certificate is",
            )
            .comment("self-signed unless --metrics-cert-dir is set, hence insecureSkipVerify.")
            .object(&monitor)?
            .finish(),
        Doc::new("prometheus/kustomization.yaml")
            .object(&Kustomization::resources(&["monitor.yaml", "alerts.yaml"]))?
            .finish(),
    ])
}

// ---------------------------------------------------------------------------------------
// config/grafana

/// The dashboards' ConfigMaps, as kustomize's configMapGenerator makes them: one per
/// dashboard, named after it, labelled for Grafana's sidecar, without a hash suffix (the
/// sidecar reads every labelled ConfigMap; a fixed name replaces the old one).
pub(crate) fn dashboard_generator() -> Value {
    let (key, value) = monitoring::DASHBOARD_LABEL;
    let mut labels = labels();
    labels[key] = json!(value);
    let generators: Vec<Value> = monitoring::dashboards::dashboards()
        .iter()
        .map(|d| {
            json!({
                "name": d.file,
                "files": [format!("dashboards/{}.json", d.file)],
                "options": {"disableNameSuffixHash": true, "labels": labels},
            })
        })
        .collect();
    json!({"namespace": BASE_NAMESPACE, "configMapGenerator": generators})
}

pub(super) fn grafana_files() -> Result<Vec<File>, Error> {
    let mut files = vec![
        Doc::new("grafana/kustomization.yaml")
            .comment("The Grafana dashboards, as ConfigMaps Grafana's dashboard sidecar loads")
            .comment("(label grafana_dashboard: \"1\"; kube-prometheus-stack's Grafana has it on).")
            .comment("The JSON in dashboards/ imports into any Grafana as well.")
            .object(&dashboard_generator())?
            .finish(),
    ];
    for d in monitoring::dashboards::dashboards() {
        files.push(monitoring::dashboard_file("grafana/dashboards", &d));
    }
    Ok(files)
}

// ---------------------------------------------------------------------------------------
// config/network-policy

fn network_policy(name: &str, from: Value, port: i32) -> Value {
    let mut rule = json!({"ports": [{"port": port, "protocol": "TCP"}]});
    if !from.is_null() {
        rule["from"] = from;
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": BASE_NAMESPACE, "labels": labels()},
        "spec": {
            "podSelector": {"matchLabels": selector_labels()},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    })
}

/// The NetworkPolicies: metrics from namespaces labelled `metrics: enabled`, and the
/// webhook port from anywhere (the API server's address is the cluster's own: README says
/// how to narrow it with a patch, the chart with `networkPolicy.webhookFrom`).
pub(crate) fn network_policies()
-> Result<[k8s_openapi::api::networking::v1::NetworkPolicy; 2], Error> {
    Ok([
        typed(
            "NetworkPolicy",
            network_policy(
                "allow-metrics-traffic",
                json!([{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}]),
                METRICS_PORT,
            ),
        )?,
        typed(
            "NetworkPolicy",
            network_policy("allow-webhook-traffic", Value::Null, WEBHOOK_PORT),
        )?,
    ])
}

pub(super) fn network_policy_files() -> Result<Vec<File>, Error> {
    let [metrics, webhook] = network_policies()?;
    Ok(vec![
        Doc::new("network-policy/allow-metrics-traffic.yaml")
            .comment(
                "Only pods in namespaces labelled `metrics: enabled` may scrape the metrics port.",
            )
            .object(&metrics)?
            .finish(),
        Doc::new("network-policy/allow-webhook-traffic.yaml")
            .comment("The API server calls the webhook; it is not a pod a namespaceSelector can")
            .comment("match, so the webhook port is open to all sources (and only that port).")
            .comment("Narrow it to the API server's addresses, which only your cluster knows,")
            .comment("with a patch adding spec.ingress[0].from: [{ipBlock: {cidr: ...}}]")
            .comment("(README: \"Who may call the webhooks\").")
            .object(&webhook)?
            .finish(),
        Doc::new("network-policy/kustomization.yaml")
            .object(&Kustomization::resources(&[
                "allow-metrics-traffic.yaml",
                "allow-webhook-traffic.yaml",
            ]))?
            .finish(),
    ])
}
