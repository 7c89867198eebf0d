//! The MutatingWebhookConfiguration and ValidatingWebhookConfiguration that register the
//! two webhooks with the API server (the base of `config/webhook`, and of the Helm chart
//! and the OLM bundle through `manifests`).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memcached_api::{GROUP, VERSION};

use super::{
    CA_INJECTION_ANNOTATION, MUTATE_PATH, MUTATING_CONFIGURATION_NAME, MUTATING_WEBHOOK_NAME,
    TIMEOUT_SECONDS, VALIDATE_PATH, VALIDATING_CONFIGURATION_NAME, VALIDATING_WEBHOOK_NAME,
};

/// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration that send
/// Memcached creates and updates to the webhook Service `service_namespace/service_name`
/// (port 443), with the CA bundle injected by cert-manager from the Certificate
/// `service_namespace/cert_manager_certificate`.
pub fn webhook_configurations(
    service_name: &str,
    service_namespace: &str,
    cert_manager_certificate: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let metadata = |name: &str| ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([
            (
                "app.kubernetes.io/name".to_string(),
                "memcached-operator".to_string(),
            ),
            (
                "app.kubernetes.io/component".to_string(),
                "webhook".to_string(),
            ),
        ])),
        annotations: Some(BTreeMap::from([(
            CA_INJECTION_ANNOTATION.to_string(),
            format!("{service_namespace}/{cert_manager_certificate}"),
        )])),
        ..ObjectMeta::default()
    };
    let client_config = |path: &str| WebhookClientConfig {
        service: Some(ServiceReference {
            name: service_name.to_string(),
            namespace: service_namespace.to_string(),
            path: Some(path.to_string()),
            port: Some(443),
        }),
        ..WebhookClientConfig::default()
    };
    let rules = || {
        Some(vec![RuleWithOperations {
            api_groups: Some(vec![GROUP.to_string()]),
            api_versions: Some(vec![VERSION.to_string()]),
            operations: Some(vec!["CREATE".to_string(), "UPDATE".to_string()]),
            resources: Some(vec!["memcacheds".to_string()]),
            scope: Some("Namespaced".to_string()),
        }])
    };
    let mutating = MutatingWebhookConfiguration {
        metadata: metadata(MUTATING_CONFIGURATION_NAME),
        webhooks: Some(vec![MutatingWebhook {
            name: MUTATING_WEBHOOK_NAME.to_string(),
            admission_review_versions: vec!["v1".to_string()],
            client_config: client_config(MUTATE_PATH),
            failure_policy: Some("Fail".to_string()),
            match_policy: Some("Equivalent".to_string()),
            side_effects: "None".to_string(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            reinvocation_policy: Some("Never".to_string()),
            rules: rules(),
            ..MutatingWebhook::default()
        }]),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: metadata(VALIDATING_CONFIGURATION_NAME),
        webhooks: Some(vec![ValidatingWebhook {
            name: VALIDATING_WEBHOOK_NAME.to_string(),
            admission_review_versions: vec!["v1".to_string()],
            client_config: client_config(VALIDATE_PATH),
            failure_policy: Some("Fail".to_string()),
            match_policy: Some("Equivalent".to_string()),
            side_effects: "None".to_string(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            rules: rules(),
            ..ValidatingWebhook::default()
        }]),
    };
    (mutating, validating)
}
