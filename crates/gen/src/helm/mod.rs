//! The Helm chart (`charts/memcached-operator`), generated from the same code as `config/`
//! (`memcached-operator-gen helm-chart`, run by `make manifests`).
//!
//! Every object starts as the JSON of the kustomize base ([`crate::manifests`],
//! [`memcached_operator::rbac`], [`memcached_operator::webhook`]); the chart swaps in
//! template text where a value comes from `values.yaml` or the release (names, namespace,
//! image, resources, placement) and guards optional parts with `if`. `tests/helm.rs` renders
//! the chart with the pinned helm and checks that where the two overlap, the objects equal
//! what `kubectl kustomize` builds from `config/`.

pub mod tpl;
pub mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::CustomResourceExt;
use memcached_api::Memcached;
use serde::Serialize;
use serde_json::{Value, json};

use crate::manifests::{self, Error, File, HEADER};
use memcached_operator::rbac;
use tpl::{Cond, T, tpl};
pub use values::Values;

/// The chart's name (and directory under `charts/`).
pub const CHART: &str = "memcached-operator";
/// The oldest Kubernetes the chart installs on (`kubeVersion`): k8s-openapi's feature.
pub const KUBE_VERSION: &str = ">=1.33.0-0";

const NAMESPACE: &str = "{{ $.Release.Namespace }}";
/// The self-signed webhook certificate's Secret: the Service host it was issued for.
const WEBHOOK_HOST_ANNOTATION: &str = "memcached-operator.cache.example.com/webhook-host";
const IMAGE: &str = "{{ include \"memcached-operator.image\" $ }}";
const TLS_AGENT_IMAGE: &str = "{{ include \"memcached-operator.tlsAgentImage\" $ }}";
/// The webhook certificate's Secret: the release's own (`<fullname>-webhook-server-cert`, so
/// that two releases in a namespace do not share it) or `webhook.certificate.existingSecret`.
const WEBHOOK_SECRET: &str = "{{ include \"memcached-operator.webhookSecretName\" $ }}";
const LABELS: &str = "{{- include \"memcached-operator.labels\" $ | nindent {indent} }}";

fn to_value<S: Serialize>(what: &str, obj: &S) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|e| Error::Typed {
        what: what.to_string(),
        json: e.to_string(),
    })
}

/// `<fullname>-<base>`: the kustomize namePrefix with the release's name (the prefix cut
/// so that the name fits in 63 characters).
fn name(base: &str) -> T {
    tpl(prefixed(base))
}

fn prefixed(base: &str) -> String {
    format!("{{{{ include \"memcached-operator.prefixed\" (list $ \"{base}\") }}}}")
}

/// The object's name and namespace from the release, and the chart's labels next to the
/// object's own (without kustomize's `managed-by`).
fn release_meta(obj: &mut T, namespaced: bool) {
    let meta = obj.at(&["metadata"]);
    let base = match meta.get_mut(&["name"]) {
        Some(T::V(Value::String(n))) => n.clone(),
        _ => panic!("a chart object without a name"),
    };
    meta.set("name", name(&base));
    if namespaced {
        meta.set("namespace", tpl(NAMESPACE));
    }
    let labels = match meta.get_mut(&["labels"]) {
        Some(l) => l,
        None => meta.set("labels", T::Map(vec![])).at(&["labels"]),
    };
    labels.remove("app.kubernetes.io/managed-by");
    labels.set("", T::Raw(LABELS.to_string()));
}

/// The subjects of a binding: the operator's ServiceAccount in the release's namespace.
fn bind_to_release(binding: &mut T) {
    let role = match binding.get_mut(&["roleRef", "name"]) {
        Some(T::V(Value::String(n))) => n.clone(),
        _ => panic!("a binding without a roleRef"),
    };
    binding.at(&["roleRef"]).set("name", name(&role));
    let subject = binding.at(&["subjects", "0"]);
    subject.set(
        "name",
        tpl("{{ include \"memcached-operator.serviceAccountName\" $ }}"),
    );
    subject.set("namespace", tpl(NAMESPACE));
}

/// One piece of a template file.
enum Doc {
    /// An object, present when the condition holds.
    Object(T, Cond),
    /// Template text as is (a `range` over documents).
    Raw(String),
}

struct Template {
    path: &'static str,
    comment: &'static str,
    preamble: &'static str,
    docs: Vec<Doc>,
}

impl Template {
    fn render(&self) -> File {
        let mut out = String::new();
        for line in self.comment.lines() {
            out.push_str("{{- /* ");
            out.push_str(line);
            out.push_str(" */}}\n");
        }
        out.push_str(self.preamble);
        for doc in &self.docs {
            match doc {
                Doc::Object(t, cond) => tpl::document(&mut out, t, cond),
                Doc::Raw(text) => out.push_str(text),
            }
        }
        File {
            path: PathBuf::from(self.path),
            content: out,
        }
    }
}

fn cond(expr: &str) -> Cond {
    Cond::If(expr.to_string())
}

fn always(t: T) -> Doc {
    Doc::Object(t, Cond::Always)
}

fn when(t: T, expr: &str) -> Doc {
    Doc::Object(t, cond(expr))
}

fn raw_entry(text: &str) -> T {
    T::Raw(text.to_string())
}

// ---------------------------------------------------------------------------------------
// templates

fn crd_template() -> Result<Template, Error> {
    let mut crd = T::from(to_value("CRD", &Memcached::crd())?);
    let meta = crd.at(&["metadata"]);
    meta.set("labels", T::Map(vec![]))
        .at(&["labels"])
        .set("", raw_entry(LABELS));
    meta.set_when(
        "annotations",
        T::V(json!({"helm.sh/resource-policy": "keep"})),
        cond("$.Values.crds.keep"),
    );
    Ok(Template {
        path: "templates/crd.yaml",
        comment: "The Memcached CRD: upgraded with the chart, kept on uninstall (crds.keep).",
        preamble: "",
        docs: vec![when(crd, "$.Values.crds.install")],
    })
}

fn rbac_template() -> Result<Template, Error> {
    let sa_name = || tpl("{{ include \"memcached-operator.serviceAccountName\" $ }}");
    let mut sa = T::from(to_value("ServiceAccount", &manifests::service_account()?)?);
    release_meta(&mut sa, true);
    let meta = sa.at(&["metadata"]);
    meta.set("name", sa_name());
    meta.set_when(
        "annotations",
        T::Yaml(".".into()),
        Cond::With("$.Values.serviceAccount.annotations".into()),
    );
    let cluster_role = |role: k8s_openapi::api::rbac::v1::ClusterRole| -> Result<T, Error> {
        let mut t = T::from(to_value("ClusterRole", &role)?);
        release_meta(&mut t, false);
        Ok(t)
    };
    let cluster_binding = |name: &str, role: &str| -> Result<T, Error> {
        let mut t = T::from(to_value(
            "ClusterRoleBinding",
            &rbac::cluster_role_binding(name, role),
        )?);
        release_meta(&mut t, false);
        bind_to_release(&mut t);
        Ok(t)
    };
    // With watchNamespaces, the manager's ClusterRole is bound in each watched namespace.
    let mut per_namespace = cluster_binding("manager-rolebinding", "manager-role")?;
    per_namespace.set("kind", T::V(json!("RoleBinding")));
    per_namespace
        .at(&["metadata"])
        .set("namespace", tpl("{{ . }}"));
    let mut range = String::from("{{- range $.Values.watchNamespaces }}\n");
    tpl::document(&mut range, &per_namespace, &Cond::Always);
    range.push_str("{{- end }}\n");

    let mut leader_role = T::from(to_value("Role", &rbac::leader_election_role())?);
    release_meta(&mut leader_role, true);
    let mut leader_binding = T::from(to_value(
        "RoleBinding",
        &rbac::leader_election_role_binding(),
    )?);
    release_meta(&mut leader_binding, true);
    bind_to_release(&mut leader_binding);

    Ok(Template {
        path: "templates/rbac.yaml",
        comment: "The operator's ServiceAccount and RBAC (crates/operator/src/rbac.rs).",
        preamble: "",
        docs: vec![
            when(sa, "$.Values.serviceAccount.create"),
            always(cluster_role(rbac::manager_role())?),
            when(
                cluster_binding("manager-rolebinding", "manager-role")?,
                "not $.Values.watchNamespaces",
            ),
            Doc::Raw(range),
            // Cluster-scoped reads are bound cluster-wide, watchNamespaces or not.
            always(cluster_role(rbac::crd_reader_role())?),
            always(cluster_binding(
                "crd-reader-rolebinding",
                "crd-reader-role",
            )?),
            when(leader_role, "$.Values.leaderElection.enabled"),
            when(leader_binding, "$.Values.leaderElection.enabled"),
            when(
                cluster_role(rbac::metrics_auth_role())?,
                "$.Values.metrics.enabled",
            ),
            when(
                cluster_binding("metrics-auth-rolebinding", "metrics-auth-role")?,
                "$.Values.metrics.enabled",
            ),
            when(
                cluster_role(rbac::metrics_reader_role())?,
                "$.Values.metrics.enabled",
            ),
            always(cluster_role(rbac::cluster_role(
                "memcached-editor-role",
                rbac::EDITOR_RULES,
            ))?),
            always(cluster_role(rbac::cluster_role(
                "memcached-viewer-role",
                rbac::VIEWER_RULES,
            ))?),
        ],
    })
}

/// `{{- with EXPR }}` the YAML of EXPR merged into the surrounding map or list.
fn merged(expr: &str) -> T {
    T::Raw(format!(
        "{{{{- with {expr} }}}}\n{{{{- toYaml . | nindent {{indent}} }}}}\n{{{{- end }}}}"
    ))
}

const METRICS_ADDRESS: &str = "--metrics-bind-address={{ if $.Values.metrics.enabled }}:{{ $.Values.metrics.port }}{{ else }}0{{ end }}";

fn deployment_template() -> Result<Template, Error> {
    let patch = T::from(manifests::manager_webhook_patch());
    let mut patch = patch;
    let webhook_volumes = patch.at(&["spec", "template", "spec", "volumes"]).clone();
    let patched = patch.at(&["spec", "template", "spec", "containers", "0"]);
    let webhook_ports = patched.at(&["ports"]).clone();
    let webhook_mounts = patched.at(&["volumeMounts"]).clone();

    let mut d = T::from(to_value("Deployment", &manifests::manager_deployment()?)?);
    release_meta(&mut d, true);
    d.at(&["spec"])
        .set("replicas", tpl("{{ $.Values.replicaCount }}"));
    let template = d.at(&["spec", "template"]);
    template
        .at(&["metadata", "annotations"])
        .set("", merged("$.Values.podAnnotations"));
    template
        .at(&["metadata", "labels"])
        .set("", merged("$.Values.podLabels"));
    let pod = template.at(&["spec"]);
    pod.set(
        "securityContext",
        T::Yaml("$.Values.podSecurityContext".into()),
    );
    pod.set(
        "serviceAccountName",
        tpl("{{ include \"memcached-operator.serviceAccountName\" $ }}"),
    );
    for key in [
        "imagePullSecrets",
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
    ] {
        pod.set_when(
            key,
            T::Yaml(".".into()),
            Cond::With(format!("$.Values.{key}")),
        );
    }
    pod.set_when(
        "priorityClassName",
        tpl("{{ . }}"),
        Cond::With("$.Values.priorityClassName".into()),
    );
    if let T::List(mut items) = webhook_volumes {
        for item in items.iter_mut() {
            item.value
                .at(&["secret"])
                .set("secretName", tpl(WEBHOOK_SECRET));
        }
        pod.set_when("volumes", T::List(items), cond("$.Values.webhook.enabled"));
    }

    let container = pod.at(&["containers", "0"]);
    container.set("image", tpl(IMAGE));
    container.set("imagePullPolicy", tpl("{{ $.Values.image.pullPolicy }}"));
    container.set("resources", T::Yaml("$.Values.resources".into()));
    container.set(
        "securityContext",
        T::Yaml("$.Values.securityContext".into()),
    );
    let args = container.at(&["args"]);
    args.items_when(
        |a| *a == T::V(json!("--leader-elect")),
        cond("$.Values.leaderElection.enabled"),
    );
    if let T::List(items) = args {
        for item in items.iter_mut() {
            if let T::V(Value::String(a)) = &item.value
                && a.starts_with("--metrics-bind-address=")
            {
                item.value = tpl(METRICS_ADDRESS);
            }
        }
    }
    args.push(
        tpl("--namespace={{ join \",\" . }}"),
        Cond::With("$.Values.watchNamespaces".into()),
    );
    args.push(merged("$.Values.extraArgs"), Cond::Always);

    let env = container.at(&["env"]);
    if let T::List(items) = env {
        for item in items.iter_mut() {
            if item.value.get_mut(&["name"]) == Some(&mut T::V(json!("TLS_AGENT_IMAGE"))) {
                item.value.set("value", tpl(TLS_AGENT_IMAGE));
            }
        }
    }
    env.push(
        T::V(json!({"name": "ENABLE_WEBHOOKS", "value": "false"})),
        cond("not $.Values.webhook.enabled"),
    );

    let ports = container.at(&["ports"]);
    ports.items_when(
        |p| {
            let mut p = p.clone();
            p.get_mut(&["name"]) == Some(&mut T::V(json!("https")))
        },
        cond("$.Values.metrics.enabled"),
    );
    if let T::List(items) = ports {
        for item in items.iter_mut() {
            if item.cond != Cond::Always {
                item.value
                    .set("containerPort", tpl("{{ $.Values.metrics.port }}"));
            }
        }
    }
    // First, where kustomize's strategic merge puts the patch's port.
    if let (T::List(webhook), T::List(items)) = (webhook_ports, ports) {
        let webhook = webhook.into_iter().map(|item| tpl::Item {
            value: item.value,
            cond: cond("$.Values.webhook.enabled"),
        });
        items.splice(0..0, webhook);
    }
    container.set_when(
        "volumeMounts",
        webhook_mounts,
        cond("$.Values.webhook.enabled"),
    );

    Ok(Template {
        path: "templates/deployment.yaml",
        comment: "The operator (config/manager with config/default's webhook patch).",
        preamble: "{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}\n\
                   {{- fail \"replicaCount > 1 needs leaderElection.enabled: operators without leader election would all reconcile\" }}\n\
                   {{- end }}\n",
        docs: vec![always(d)],
    })
}

fn metrics_template() -> Result<Template, Error> {
    let mut svc = T::from(to_value("Service", &manifests::metrics_service()?)?);
    release_meta(&mut svc, true);
    let port = svc.at(&["spec", "ports", "0"]);
    port.set("port", tpl("{{ $.Values.metrics.port }}"));
    port.set("targetPort", tpl("{{ $.Values.metrics.port }}"));
    let mut monitor = T::from(manifests::service_monitor());
    release_meta(&mut monitor, true);
    Ok(Template {
        path: "templates/metrics.yaml",
        comment: "The metrics Service, and the Prometheus Operator's ServiceMonitor (config/prometheus).",
        preamble: "{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}\n\
                   {{- fail \"metrics.serviceMonitor.enabled needs metrics.enabled: there is no metrics endpoint to scrape\" }}\n\
                   {{- end }}\n",
        docs: vec![
            when(svc, "$.Values.metrics.enabled"),
            when(
                monitor,
                "and $.Values.metrics.enabled $.Values.metrics.serviceMonitor.enabled",
            ),
        ],
    })
}

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

fn webhook_template() -> Result<Template, Error> {
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

fn network_policy_template() -> Result<Template, Error> {
    let [metrics, webhook] = manifests::network_policies()?;
    let mut metrics = T::from(to_value("NetworkPolicy", &metrics)?);
    release_meta(&mut metrics, true);
    metrics
        .at(&["spec", "ingress", "0", "ports", "0"])
        .set("port", tpl("{{ $.Values.metrics.port }}"));
    let mut webhook = T::from(to_value("NetworkPolicy", &webhook)?);
    release_meta(&mut webhook, true);
    // Only the API server, where the user can say who that is.
    webhook.at(&["spec", "ingress", "0"]).set_when(
        "from",
        T::Yaml(".".into()),
        Cond::With("$.Values.networkPolicy.webhookFrom".into()),
    );
    Ok(Template {
        path: "templates/networkpolicy.yaml",
        comment: "NetworkPolicies of the operator's pod (config/network-policy).",
        preamble: "",
        docs: vec![
            when(
                metrics,
                "and $.Values.networkPolicy.enabled $.Values.metrics.enabled",
            ),
            when(
                webhook,
                "and $.Values.networkPolicy.enabled $.Values.webhook.enabled",
            ),
        ],
    })
}

const HELPERS: &str = r#"{{/* The chart's name. */}}
{{- define "memcached-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object's name: the release's name, with the chart's unless it has it. */}}
{{- define "memcached-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* `<fullname>-<suffix>`, the fullname cut so that the whole fits in 63 characters: (list $ "suffix"). */}}
{{- define "memcached-operator.prefixed" -}}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "memcached-operator.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{/* Labels the chart adds to every object (next to app.kubernetes.io/name). */}}
{{- define "memcached-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "memcached-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memcached-operator.prefixed" (list . "controller-manager")) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: the ServiceAccount to run as when serviceAccount.create is false (the chart does not bind the operator's roles to the namespace's default account)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image. */}}
{{- define "memcached-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The TLS reload agent's image, which the operator gives memcached pods (TLS_AGENT_IMAGE). */}}
{{- define "memcached-operator.tlsAgentImage" -}}
{{ .Values.tlsAgent.image.repository }}:{{ .Values.tlsAgent.image.tag }}
{{- end }}

{{/* The webhook certificate's Secret: the release's own, or webhook.certificate.existingSecret. */}}
{{- define "memcached-operator.webhookSecretName" -}}
{{- .Values.webhook.certificate.existingSecret | default (include "memcached-operator.prefixed" (list . "webhook-server-cert")) }}
{{- end }}
"#;

const NOTES: &str = r#"memcached-operator {{ .Chart.AppVersion }} is installed in {{ .Release.Namespace }}.

Create a Memcached:

  kubectl apply -f - <<EOF
  apiVersion: memcached.cache.example.com/v1
  kind: Memcached
  metadata:
    name: memcached-sample
  spec:
    size: 3
  EOF

and watch it become Available:

  kubectl get memcached memcached-sample -o jsonpath='{.status.conditions}'
{{- if .Values.metrics.enabled }}

Metrics: https://{{ include "memcached-operator.prefixed" (list . "controller-manager-metrics-service") }}.{{ .Release.Namespace }}.svc:{{ .Values.metrics.port }}/metrics
for callers bound to the ClusterRole {{ include "memcached-operator.prefixed" (list . "metrics-reader") }}.
{{- end }}
"#;

fn chart_yaml() -> Result<String, Error> {
    let chart = json!({
        "apiVersion": "v2",
        "name": CHART,
        "description": "A Kubernetes operator for Memcached: pools of memcached with disruption \
                        budgets, spreading, TLS renewal in place, paced rollouts and metrics.",
        "type": "application",
        "version": manifests::VERSION,
        "appVersion": manifests::VERSION,
        "kubeVersion": KUBE_VERSION,
        "keywords": ["memcached", "cache", "operator"],
        "annotations": {"artifacthub.io/operator": "true"},
    });
    let yaml = serde_yaml::to_string(&chart).map_err(|source| Error::Yaml {
        path: "Chart.yaml".into(),
        source,
    })?;
    Ok(format!("{HEADER}{yaml}"))
}

fn values_yaml() -> Result<String, Error> {
    let yaml = serde_yaml::to_string(&Values::default()).map_err(|source| Error::Yaml {
        path: "values.yaml".into(),
        source,
    })?;
    Ok(format!(
        "{HEADER}# Every value is described in README.md and checked by values.schema.json.\n{yaml}"
    ))
}

/// One README row per leaf of the values: its key, type, default and description.
fn values_table() -> String {
    let schema = values::schema();
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let defaults = serde_json::to_value(Values::default()).unwrap_or(Value::Null);
    let mut rows = vec![];
    fn resolve<'a>(s: &'a Value, defs: &'a Value) -> &'a Value {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => defs.get(r.trim_start_matches("#/$defs/")).unwrap_or(s),
            None => s,
        }
    }
    fn walk(schema: &Value, defs: &Value, defaults: &Value, prefix: &str, rows: &mut Vec<String>) {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return;
        };
        for (key, prop) in props {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let resolved = resolve(prop, defs);
            let ours = prop.get("$ref").and_then(Value::as_str).is_some_and(|r| {
                [
                    "Image",
                    "TlsAgent",
                    "TlsAgentImage",
                    "LeaderElection",
                    "Crds",
                    "Webhook",
                    "CertManager",
                    "WebhookCertificate",
                    "Metrics",
                    "ServiceMonitor",
                    "NetworkPolicy",
                    "ServiceAccount",
                ]
                .iter()
                .any(|ours| r.ends_with(&format!("/{ours}")))
            });
            let default = defaults.get(key).cloned().unwrap_or(Value::Null);
            if ours {
                walk(resolved, defs, &default, &path, rows);
                continue;
            }
            let ty = match resolved.get("type") {
                Some(Value::String(t)) => t.clone(),
                Some(other) => other.to_string(),
                None if resolved.get("enum").is_some() || resolved.get("oneOf").is_some() => {
                    "string".into()
                }
                None => "object".into(),
            };
            let description = prop
                .get("description")
                .or_else(|| resolved.get("description"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .replace('\n', " ");
            rows.push(format!(
                "| `{path}` | {ty} | `{}` | {description} |",
                serde_json::to_string(&default).unwrap_or_default()
            ));
        }
    }
    walk(&schema, &defs, &defaults, "", &mut rows);
    rows.join("\n")
}

fn readme() -> String {
    format!(
        r#"<!-- Generated by memcached-operator-gen helm-chart; do not edit. -->
# memcached-operator

A Kubernetes operator for Memcached. This chart installs the operator, its CRD, RBAC and
admission webhooks; it is generated from the same code as the kustomize tree (`config/`)
and renders the same objects.

Requires Kubernetes {KUBE_VERSION}. The images are not published to a registry: build and
push the operator's (`make docker-build docker-push IMG=registry/memcached-operator:{version}`)
and set `image.repository`, and the TLS reload agent's
(`make docker-build-tls-agent docker-push-tls-agent
TLS_AGENT_IMG=registry/memcached-operator-tls-agent:{agent_version}`) and set
`tlsAgent.image.repository`. The agent has its own version ({agent_version}, the default
`tlsAgent.image.tag`), which moves only when the agent changes. The operator adds it as a
sidecar to the memcached pods whose certificate is reloaded in place, and those pods pull it
with their Memcached's `spec.imagePullSecrets` (`imagePullSecrets` here is the operator
pod's).

## Install, upgrade, uninstall

```sh
helm install memcached-operator charts/memcached-operator \
  --namespace memcached-operator-system --create-namespace \
  --set image.repository=registry/memcached-operator \
  --set tlsAgent.image.repository=registry/memcached-operator-tls-agent
helm upgrade memcached-operator charts/memcached-operator \
  --namespace memcached-operator-system --reuse-values
helm uninstall memcached-operator --namespace memcached-operator-system
```

`helm uninstall` keeps the Memcached CRD (and so every Memcached and its cache) unless
`crds.keep=false`; delete it with
`kubectl delete crd memcacheds.memcached.cache.example.com`. The kept CRD still names the
release that installed it, so install again under the same release name and namespace
(Helm refuses to adopt it from another release).

## The webhook certificate

The API server calls the admission webhooks over TLS and checks the operator's certificate
with the webhooks' `caBundle`. It comes from one of:

- **The chart** (the default): a self-signed CA and certificate made at `helm install`, in
  the Secret `<fullname>-webhook-server-cert`. `helm upgrade` looks them up and keeps them
  while they name the webhook Service (a new `fullnameOverride` makes new ones). `helm
  template` has no cluster to look them up in and makes new ones at every render.
- **cert-manager** (`webhook.certManager.enabled=true`): an Issuer and a Certificate;
  cert-manager renews it and its CA injector fills in the `caBundle`.
- **Your own** (`webhook.certificate`): a certificate valid for
  `<fullname>-webhook-service.<namespace>.svc`, its key and its CA, given as values
  (`--set-file webhook.certificate.crt=tls.crt --set-file webhook.certificate.key=tls.key
  --set-file webhook.certificate.ca=ca.crt`), or a `kubernetes.io/tls` Secret you make
  (`webhook.certificate.existingSecret`, with `webhook.certificate.ca`): then no key is in
  the values.

GitOps tools that apply `helm template`'s output (Argo CD) would see the chart's own
certificate change at every render, and so the Secret and both webhook configurations out
of sync: use cert-manager, or your own certificate, with which every render is the same.
With `existingSecret` the key can stay out of Git (a SealedSecret, an ExternalSecret); the
operator serves a renewed certificate once the kubelet updates the mount, without a
restart.

Each release has its own webhook certificate Secret (`<fullname>-webhook-server-cert`; an
upgrade from a chart that named it `webhook-server-cert` keeps its certificate), so
releases in one namespace do not take each other's. They still share the leader-election
Lease (a fixed name, as in the kustomize tree), so only one of their operators is active
at a time: give each release a namespace of its own.

## Values

| Key | Type | Default | Description |
|-----|------|---------|-------------|
{table}
"#,
        version = manifests::VERSION,
        agent_version = manifests::TLS_AGENT_VERSION,
        table = values_table(),
    )
}

/// Every file of the chart, sorted by path.
pub fn render() -> Result<Vec<File>, Error> {
    let mut files = BTreeMap::new();
    let mut add = |path: &str, content: String| {
        files.insert(
            PathBuf::from(path),
            File {
                path: PathBuf::from(path),
                content,
            },
        );
    };
    add("Chart.yaml", chart_yaml()?);
    add("values.yaml", values_yaml()?);
    let schema = serde_json::to_string_pretty(&values::schema()).unwrap_or_default();
    add("values.schema.json", format!("{schema}\n"));
    add("README.md", readme());
    add(
        "templates/_helpers.tpl",
        format!(
            "{{{{/* {} */}}}}\n{HELPERS}",
            HEADER.trim_start_matches("# ").trim_end()
        ),
    );
    add("templates/NOTES.txt", NOTES.to_string());
    for t in [
        crd_template()?,
        rbac_template()?,
        deployment_template()?,
        metrics_template()?,
        webhook_template()?,
        network_policy_template()?,
    ] {
        let mut file = t.render();
        file.content = format!(
            "{{{{- /* {} */}}}}\n{}",
            HEADER.trim_start_matches("# ").trim_end(),
            file.content
        );
        add(t.path, file.content);
    }
    Ok(files.into_values().collect())
}

/// Writes the chart under `dir`, only rewriting files whose content changed; returns the
/// paths written.
pub fn write(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    manifests::write_files(dir, render()?)
}
