//! The chart's admission webhooks and their certificate (`templates/webhook.yaml`):
//! `config/webhook`, cert-manager's Issuer and Certificate (`config/certmanager`), or the
//! user's own certificate or one the chart makes (a Secret, the `caBundle`).

use serde_json::{Value, json};

use super::tpl::{self, Cond, T, tpl};
use super::{
    NAMESPACE, Template, WEBHOOK_SECRET, cond, name, prefixed, release_meta, to_value, when,
};
use crate::manifests::{self, Error};

/// The self-signed webhook certificate's Secret: the Service host it was issued for.
const WEBHOOK_HOST_ANNOTATION: &str = "memcached-operator.cache.example.com/webhook-host";

/// The webhook certificate when cert-manager does not make it: the user's own
/// (`webhook.certificate`: the same at every render), or a self-signed CA and certificate
/// made at install, then read back from the Secret (`lookup`) so upgrades keep them and the
/// caBundle. `$webhookCert` holds the Secret's data (base64), or only `ca.crt` for an
/// `existingSecret`.
const WEBHOOK_CERT: &str = r#"{{- $webhookCert := dict }}
{{- $own := .Values.webhook.certificate }}
{{- if .Values.webhook.enabled }}
{{- if and .Values.webhook.certManager.enabled (or $own.ca $own.crt $own.key $own.existingSecret) }}
{{- fail "webhook.certificate and webhook.certManager.enabled: the webhook certificate comes from one of them" }}
{{- end }}
{{- if and $own.existingSecret (or $own.crt $own.key) }}
{{- fail "webhook.certificate.existingSecret and webhook.certificate.crt/key: the webhook certificate comes from one of them" }}
{{- end }}
{{- if ne (empty $own.crt) (empty $own.key) }}
{{- fail "webhook.certificate.crt and webhook.certificate.key: one without the other" }}
{{- end }}
{{- if and (or $own.crt $own.existingSecret) (not $own.ca) }}
{{- fail "webhook.certificate.ca: the PEM of the CA that issued the webhook certificate is needed (the API server checks the webhook with it)" }}
{{- end }}
{{- if and $own.ca (not (or $own.crt $own.existingSecret)) }}
{{- fail "webhook.certificate.ca needs webhook.certificate.crt and key, or webhook.certificate.existingSecret" }}
{{- end }}
{{- if $own.crt }}
{{- $webhookCert = dict "ca.crt" (b64enc $own.ca) "tls.crt" (b64enc $own.crt) "tls.key" (b64enc $own.key) }}
{{- else if $own.existingSecret }}
{{- $webhookCert = dict "ca.crt" (b64enc $own.ca) }}
{{- else if not .Values.webhook.certManager.enabled }}
{{- $service := include "memcached-operator.prefixed" (list . "webhook-service") }}
{{- $host := printf "%s.%s.svc" $service .Release.Namespace }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "memcached-operator.webhookSecretName" .) | default dict }}
{{- if not $existing }}
{{- /* Earlier charts named it webhook-server-cert: the release's own is kept too. */}}
{{- $legacy := lookup "v1" "Secret" .Release.Namespace "webhook-server-cert" | default dict }}
{{- if eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $legacy) .Release.Name }}
{{- $existing = $legacy }}
{{- end }}
{{- end }}
{{- $data := get $existing "data" | default dict }}
{{- $issuedFor := dig "metadata" "annotations" "memcached-operator.cache.example.com/webhook-host" "" $existing }}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") (eq $issuedFor $host) }}
{{- $webhookCert = $data }}
{{- else }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "memcached-operator.fullname" .)) 3650 }}
{{- $names := list $host (printf "%s.cluster.local" $host) }}
{{- $cert := genSignedCert $host nil $names 3650 $ca }}
{{- $webhookCert = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) }}
{{- end }}
{{- end }}
{{- end }}
"#;

pub(super) fn webhook_template() -> Result<Template, Error> {
    let mut svc = T::from(to_value("Service", &manifests::webhook_service()?)?);
    release_meta(&mut svc, true);
    let (mutating, validating) = manifests::webhook_configurations();
    let configuration = |v: Value| -> T {
        let mut t = T::from(v);
        release_meta(&mut t, false);
        t.at(&["metadata"]).set_when(
            "annotations",
            T::Map(vec![]),
            cond("$.Values.webhook.certManager.enabled"),
        );
        t.at(&["metadata", "annotations"]).set(
            memcached_operator::webhook::CA_INJECTION_ANNOTATION,
            tpl(format!(
                "{NAMESPACE}/{}",
                prefixed(manifests::WEBHOOK_CERTIFICATE)
            )),
        );
        let hook = t.at(&["webhooks", "0"]);
        let client = hook.at(&["clientConfig"]);
        client.set_when(
            "caBundle",
            tpl("{{ index $webhookCert \"ca.crt\" }}"),
            cond("not $.Values.webhook.certManager.enabled"),
        );
        client
            .at(&["service"])
            .set("name", name(manifests::WEBHOOK_SERVICE))
            .set("namespace", tpl(NAMESPACE));
        hook.set_when(
            "namespaceSelector",
            T::V(json!({"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": "WATCHED",
            }]})),
            Cond::With("$.Values.watchNamespaces".into()),
        );
        hook.at(&["namespaceSelector", "matchExpressions", "0"])
            .set("values", T::Yaml(".".into()));
        t
    };
    let mutating = configuration(to_value("MutatingWebhookConfiguration", &mutating)?);
    let validating = configuration(to_value("ValidatingWebhookConfiguration", &validating)?);
    let mut secret = T::from(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": manifests::WEBHOOK_CERT_SECRET, "labels": manifests::labels()},
    }));
    release_meta(&mut secret, true);
    let meta = secret.at(&["metadata"]);
    meta.set("name", tpl(WEBHOOK_SECRET));
    // Which Service the certificate names: an upgrade that renames the Service (a new
    // fullnameOverride) makes a new certificate instead of keeping one the API server
    // would refuse.
    meta.set("annotations", T::Map(vec![]))
        .at(&["annotations"])
        .set(
            WEBHOOK_HOST_ANNOTATION,
            tpl(format!(
                "{}.{NAMESPACE}.svc",
                prefixed(manifests::WEBHOOK_SERVICE)
            )),
        );
    let data: Vec<tpl::Entry> = ["ca.crt", "tls.crt", "tls.key"]
        .into_iter()
        .map(|key| tpl::Entry {
            key: key.to_string(),
            value: tpl(format!("{{{{ index $webhookCert \"{key}\" }}}}")),
            cond: Cond::Always,
        })
        .collect();
    secret.set("data", T::Map(data));

    let mut issuer = T::from(manifests::issuer());
    release_meta(&mut issuer, true);
    let mut certificate = T::from(manifests::certificate());
    release_meta(&mut certificate, true);
    let service = format!("{}.{NAMESPACE}.svc", prefixed(manifests::WEBHOOK_SERVICE));
    certificate.at(&["spec"]).set(
        "dnsNames",
        T::List(vec![
            tpl::Item {
                value: tpl(service.clone()),
                cond: Cond::Always,
            },
            tpl::Item {
                value: tpl(format!("{service}.cluster.local")),
                cond: Cond::Always,
            },
        ]),
    );
    certificate
        .at(&["spec", "issuerRef"])
        .set("name", name("selfsigned-issuer"));
    certificate
        .at(&["spec"])
        .set("secretName", tpl(WEBHOOK_SECRET));
    let cert_manager = "and $.Values.webhook.enabled $.Values.webhook.certManager.enabled";
    Ok(Template {
        path: "templates/webhook.yaml",
        comment: "The admission webhooks (config/webhook) and their certificate: cert-manager's\n\
                  (config/certmanager), the user's own, or one the chart makes.",
        preamble: WEBHOOK_CERT,
        docs: vec![
            when(svc, "$.Values.webhook.enabled"),
            when(mutating, "$.Values.webhook.enabled"),
            when(validating, "$.Values.webhook.enabled"),
            when(
                secret,
                "and $.Values.webhook.enabled (not $.Values.webhook.certManager.enabled) \
                 (not $.Values.webhook.certificate.existingSecret)",
            ),
            when(issuer, cert_manager),
            when(certificate, cert_manager),
        ],
    })
}
