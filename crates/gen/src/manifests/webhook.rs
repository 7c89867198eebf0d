//! `config/webhook` and `config/certmanager`: the webhook configurations and the Service the
//! API server calls them through, and cert-manager's Issuer and Certificate of the webhook.

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::{
    Doc, Error, File, Kustomization, WEBHOOK_CERT_SECRET, WEBHOOK_CERTIFICATE, WEBHOOK_PORT,
    WEBHOOK_SERVICE, base_name, labels, object_labels, selector_labels, typed,
};
use memcached_operator::rbac::BASE_NAMESPACE;
use memcached_operator::webhook;

pub(crate) fn service(name: &str, port: Value) -> Result<Service, Error> {
    typed(
        "Service",
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": BASE_NAMESPACE, "labels": object_labels()},
            "spec": {"ports": [port], "selector": selector_labels()},
        }),
    )
}

/// The Service the API server calls the webhooks through.
pub(crate) fn webhook_service() -> Result<Service, Error> {
    service(
        WEBHOOK_SERVICE,
        json!({"name": "webhook", "port": 443, "protocol": "TCP", "targetPort": WEBHOOK_PORT}),
    )
}

/// Both webhook configurations, named as in the kustomize base (without the namePrefix).
pub(crate) fn webhook_configurations() -> (
    k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
) {
    let (mut mutating, mut validating) =
        webhook::webhook_configurations(WEBHOOK_SERVICE, BASE_NAMESPACE, WEBHOOK_CERTIFICATE);
    mutating.metadata.name = Some(base_name(webhook::MUTATING_CONFIGURATION_NAME));
    validating.metadata.name = Some(base_name(webhook::VALIDATING_CONFIGURATION_NAME));
    (mutating, validating)
}

pub(super) fn webhook_files() -> Result<Vec<File>, Error> {
    // The webhook module names the configurations as deployed; the kustomize base carries
    // the names without the namePrefix config/default adds back.
    let (mutating, validating) = webhook_configurations();
    let svc = webhook_service()?;
    let webhook_targets = |path: &str| {
        json!([
            {"kind": "MutatingWebhookConfiguration", "group": "admissionregistration.k8s.io", "path": path},
            {"kind": "ValidatingWebhookConfiguration", "group": "admissionregistration.k8s.io", "path": path},
        ])
    };
    let mut namespace_specs = webhook_targets("webhooks/clientConfig/service/namespace");
    for spec in namespace_specs.as_array_mut().into_iter().flatten() {
        spec["create"] = json!(true);
    }
    let config = json!({
        "nameReference": [{
            "kind": "Service",
            "version": "v1",
            "fieldSpecs": webhook_targets("webhooks/clientConfig/service/name"),
        }],
        "namespace": namespace_specs,
    });
    Ok(vec![
        Doc::new("webhook/manifests.yaml")
            .object(&mutating)?
            .object(&validating)?
            .finish(),
        Doc::new("webhook/service.yaml").object(&svc)?.finish(),
        Doc::new("webhook/kustomizeconfig.yaml")
            .comment("Teaches kustomize to prefix and namespace the webhook Service references.")
            .object(&config)?
            .finish(),
        Doc::new("webhook/kustomization.yaml")
            .object(&Kustomization {
                configurations: vec!["kustomizeconfig.yaml"],
                ..Kustomization::resources(&["manifests.yaml", "service.yaml"])
            })?
            .finish(),
    ])
}

// ---------------------------------------------------------------------------------------
// config/certmanager

/// cert-manager's self-signed Issuer of the webhook certificate.
pub(crate) fn issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": "selfsigned-issuer", "namespace": BASE_NAMESPACE, "labels": labels()},
        "spec": {"selfSigned": {}},
    })
}

/// The webhook's serving Certificate (DNS names filled in by config/default's replacements).
pub(crate) fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": WEBHOOK_CERTIFICATE, "namespace": BASE_NAMESPACE, "labels": labels()},
        "spec": {
            "dnsNames": [
                "SERVICE_NAME.SERVICE_NAMESPACE.svc",
                "SERVICE_NAME.SERVICE_NAMESPACE.svc.cluster.local",
            ],
            "issuerRef": {"kind": "Issuer", "name": "selfsigned-issuer"},
            "secretName": WEBHOOK_CERT_SECRET,
        },
    })
}

pub(super) fn certmanager_files() -> Result<Vec<File>, Error> {
    let issuer = issuer();
    let certificate = certificate();
    let config = json!({
        "nameReference": [{
            "kind": "Issuer",
            "group": "cert-manager.io",
            "fieldSpecs": [{"kind": "Certificate", "group": "cert-manager.io", "path": "spec/issuerRef/name"}],
        }],
    });
    Ok(vec![
        Doc::new("certmanager/issuer.yaml")
            .comment("Needs cert-manager (https://cert-manager.io) in the cluster.")
            .object(&issuer)?
            .finish(),
        Doc::new("certmanager/certificate.yaml")
            .comment("The webhook's serving certificate; SERVICE_NAME and SERVICE_NAMESPACE are")
            .comment("replaced by the replacements in config/default/kustomization.yaml.")
            .object(&certificate)?
            .finish(),
        Doc::new("certmanager/kustomizeconfig.yaml")
            .comment("Teaches kustomize to prefix the Issuer reference of the Certificate.")
            .object(&config)?
            .finish(),
        Doc::new("certmanager/kustomization.yaml")
            .object(&Kustomization {
                configurations: vec!["kustomizeconfig.yaml"],
                ..Kustomization::resources(&["issuer.yaml", "certificate.yaml"])
            })?
            .finish(),
    ])
}
