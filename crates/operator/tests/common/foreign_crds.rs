//! Minimal CRDs for the third-party kinds the manifests in `config/` use (cert-manager's
//! Issuer and Certificate, the Prometheus Operator's ServiceMonitor and PrometheusRule), so an API server
//! that lacks them can still check every object.

use serde_json::{Value, json};

/// A minimal CRD for a kind apisim does not serve, requiring what the real API requires of
/// the fields the manifests set and preserving the rest.
pub fn minimal_crd(group: &str, plural: &str, kind: &str, spec_required: &[&str]) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{group}"),
            // Needed by a real API server for *.k8s.io groups; harmless here.
            "annotations": {"api-approved.kubernetes.io": "unapproved, test only"},
        },
        "spec": {
            "group": group,
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": spec_required,
                            "x-kubernetes-preserve-unknown-fields": true,
                        },
                    },
                }},
            }],
        },
    })
}

/// cert-manager's Issuer and Certificate and the Prometheus Operator's ServiceMonitor and
/// PrometheusRule, requiring the fields the real CRDs require of what `config/` sets.
pub fn cert_manager_and_prometheus() -> Vec<Value> {
    vec![
        minimal_crd("cert-manager.io", "issuers", "Issuer", &[]),
        minimal_crd(
            "cert-manager.io",
            "certificates",
            "Certificate",
            &["secretName", "issuerRef", "dnsNames"],
        ),
        minimal_crd(
            "monitoring.coreos.com",
            "servicemonitors",
            "ServiceMonitor",
            &["endpoints", "selector"],
        ),
        minimal_crd(
            "monitoring.coreos.com",
            "prometheusrules",
            "PrometheusRule",
            &["groups"],
        ),
    ]
}
