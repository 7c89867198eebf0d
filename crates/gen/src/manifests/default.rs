//! `config/default`, the overlay of the whole operator (namespace, namePrefix, the metrics
//! Service, the webhook patch of the Deployment, cert-manager's replacements), and
//! `config/samples`.

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::webhook::service;
use super::{
    Doc, Error, File, Kustomization, METRICS_PORT, NAME_PREFIX, NAMESPACE, WEBHOOK_CERT_DIR,
    WEBHOOK_CERT_SECRET, WEBHOOK_CERTIFICATE, WEBHOOK_PORT, WEBHOOK_SERVICE,
};
use memcached_operator::rbac::BASE_NAMESPACE;

/// A replacement of a dot/slash-delimited part of `fields` in objects of `target_kind`
/// by `source_field` of `source`.
fn replacement(
    source: Value,
    source_field: &str,
    targets: &[(Value, &[&str])],
    delimiter: &str,
    index: u32,
) -> Value {
    let mut source = source;
    source["fieldPath"] = json!(source_field);
    json!({
        "source": source,
        "targets": targets.iter().map(|(select, fields)| json!({
            "select": select,
            "fieldPaths": fields,
            "options": {"delimiter": delimiter, "index": index, "create": true},
        })).collect::<Vec<_>>(),
    })
}

/// The Service of the secured metrics endpoint.
pub(crate) fn metrics_service() -> Result<Service, Error> {
    service(
        "controller-manager-metrics-service",
        json!({"name": "https", "port": METRICS_PORT, "protocol": "TCP", "targetPort": METRICS_PORT}),
    )
}

/// What config/default adds to the manager Deployment to serve the webhooks: the port, and
/// the certificate Secret mounted at `--webhook-cert-dir`.
pub(crate) fn manager_webhook_patch() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "controller-manager", "namespace": BASE_NAMESPACE},
        "spec": {"template": {"spec": {
            "containers": [{
                "name": "manager",
                "ports": [{"name": "webhook-server", "containerPort": WEBHOOK_PORT, "protocol": "TCP"}],
                "volumeMounts": [{"name": "cert", "mountPath": WEBHOOK_CERT_DIR, "readOnly": true}],
            }],
            "volumes": [{"name": "cert", "secret": {"secretName": WEBHOOK_CERT_SECRET, "defaultMode": 420}}],
        }}},
    })
}

pub(super) fn default_files() -> Result<Vec<File>, Error> {
    let metrics_service = metrics_service()?;
    let webhook_patch = manager_webhook_patch();
    let webhook_svc = json!({"kind": "Service", "version": "v1", "name": WEBHOOK_SERVICE});
    let certificate = json!({
        "kind": "Certificate", "group": "cert-manager.io", "version": "v1", "name": WEBHOOK_CERTIFICATE,
    });
    let dns: &[&str] = &[".spec.dnsNames.0", ".spec.dnsNames.1"];
    let inject: &[&str] = &[".metadata.annotations.[cert-manager.io/inject-ca-from]"];
    let webhooks = [
        (json!({"kind": "ValidatingWebhookConfiguration"}), inject),
        (json!({"kind": "MutatingWebhookConfiguration"}), inject),
    ];
    let kustomization = Kustomization {
        namespace: Some(NAMESPACE),
        name_prefix: Some(NAME_PREFIX),
        resources: vec![
            "../crd",
            "../rbac",
            "../manager",
            "../webhook",
            "../certmanager",
            "metrics_service.yaml",
        ],
        patches: vec![
            json!({"path": "manager_webhook_patch.yaml", "target": {"kind": "Deployment"}}),
        ],
        replacements: vec![
            replacement(
                webhook_svc.clone(),
                ".metadata.name",
                &[(certificate.clone(), dns)],
                ".",
                0,
            ),
            replacement(
                webhook_svc,
                ".metadata.namespace",
                &[(certificate.clone(), dns)],
                ".",
                1,
            ),
            replacement(
                certificate.clone(),
                ".metadata.namespace",
                &webhooks,
                "/",
                0,
            ),
            replacement(certificate, ".metadata.name", &webhooks, "/", 1),
        ],
        ..Kustomization::default()
    };
    Ok(vec![
        Doc::new("default/kustomization.yaml")
            .comment(
                "The whole operator: `make deploy IMG=...` (needs cert-manager for the webhook",
            )
            .comment(
                "certificate). Optional: add ../prometheus (the operator's ServiceMonitor and the",
            )
            .comment("alerts; needs the Prometheus Operator), ../grafana (the dashboards) and")
            .comment("../network-policy to resources.")
            .object(&kustomization)?
            .finish(),
        Doc::new("default/metrics_service.yaml")
            .object(&metrics_service)?
            .finish(),
        Doc::new("default/manager_webhook_patch.yaml")
            .comment("Serves the admission webhooks with cert-manager's certificate.")
            .object(&webhook_patch)?
            .finish(),
    ])
}

// ---------------------------------------------------------------------------------------
// config/samples

pub(super) fn sample_files() -> Result<Vec<File>, Error> {
    Ok(vec![
        Doc::new("samples/memcached_v1_memcached.yaml")
            .raw(memcached_operator::samples::SEED_SAMPLE)
            .finish(),
        Doc::new("samples/kustomization.yaml")
            .object(&Kustomization::resources(&["memcached_v1_memcached.yaml"]))?
            .finish(),
    ])
}
