//! The Helm chart (`charts/memcached-operator`), generated from the same code as `config/`
//! (`memcached-operator-gen helm-chart`, run by `make manifests`).
//!
//! Every object starts as the JSON of the kustomize base ([`crate::manifests`],
//! [`memcached_operator::rbac`], [`memcached_operator::webhook`]); the chart swaps in
//! template text where a value comes from `values.yaml` or the release (names, namespace,
//! image, resources, placement) and guards optional parts with `if`. `tests/helm.rs` renders
//! the chart with the pinned helm and checks that where the two overlap, the objects equal
//! what `kubectl kustomize` builds from `config/`.
//!
//! This module holds what the templates share (release names, labels, conditions) and
//! writes the chart around them: `Chart.yaml`, `values.yaml` and its schema, the README,
//! `_helpers.tpl` and `NOTES.txt`. Each template file is built in a module of its own.

mod deployment;
mod metrics;
mod monitoring;
mod rbac;
pub mod tpl;
pub mod values;
mod webhook;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::manifests::{self, Error, File, HEADER};
use tpl::{Cond, T, tpl};
pub use values::Values;

/// The chart's name (and directory under `charts/`).
pub const CHART: &str = "memcached-operator";
/// The oldest Kubernetes the chart installs on (`kubeVersion`): k8s-openapi's feature.
pub const KUBE_VERSION: &str = ">=1.33.0-0";

const NAMESPACE: &str = "{{ $.Release.Namespace }}";
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
                    "PrometheusRule",
                    "AlertThresholds",
                    "Dashboards",
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
    // The dashboards' JSON, which templates/dashboards.yaml reads with .Files.Get.
    for d in crate::monitoring::dashboards::dashboards() {
        let f = crate::monitoring::dashboard_file(monitoring::DASHBOARD_DIR, &d);
        add(&f.path.display().to_string(), f.content);
    }
    for t in [
        rbac::crd_template()?,
        rbac::rbac_template()?,
        deployment::deployment_template()?,
        metrics::metrics_template()?,
        webhook::webhook_template()?,
        metrics::network_policy_template()?,
        monitoring::prometheus_rule_template()?,
        monitoring::dashboards_template()?,
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
