//! The overlays `config/default` leaves out: `config/prometheus` (the Prometheus Operator's
//! ServiceMonitor) and `config/network-policy` (the NetworkPolicies of the operator's pod).

use serde_json::{Value, json};

use super::{
    Doc, Error, File, Kustomization, METRICS_PORT, WEBHOOK_PORT, labels, object_labels,
    selector_labels, typed,
};
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

pub(super) fn prometheus_files() -> Result<Vec<File>, Error> {
    let monitor = service_monitor();
    Ok(vec![
        Doc::new("prometheus/monitor.yaml")
            .comment("Scrapes the secured metrics endpoint with the Prometheus service account's")
            .comment(
                "token (bind it to the metrics-reader ClusterRole). The serving certificate is",
            )
            .comment("self-signed unless --metrics-cert-dir is set, hence insecureSkipVerify.")
            .object(&monitor)?
            .finish(),
        Doc::new("prometheus/kustomization.yaml")
            .object(&Kustomization::resources(&["monitor.yaml"]))?
            .finish(),
    ])
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
