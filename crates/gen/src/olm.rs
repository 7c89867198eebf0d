//! The OLM bundle (`bundle/`, `bundle.Dockerfile`), generated from the same code as
//! `config/` and the chart (`memcached-operator-gen bundle`, `make bundle`): the
//! ClusterServiceVersion with the owned CRD and its descriptors, the RBAC, the Deployment,
//! the webhook definitions and the OperatorHub listing; the CRD, the metrics Service and the
//! metrics-reader ClusterRole beside it. `tests/olm.rs` validates it with the pinned
//! `operator-sdk bundle validate` with the OperatorHub validators (`suite=operatorframework`
//! and `name=operatorhub`), and runs the operator as OLM installs it on the real control plane.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use kube::CustomResourceExt;
use memcached_api::Memcached;
use serde_json::{Value, json};

use crate::manifests::{self, Error, File, HEADER};
use crate::monitoring;
use memcached_operator::{rbac, webhook};

/// The OLM package, and the CSV's name prefix.
pub const PACKAGE: &str = "memcached-operator";
/// The channel the bundle is published to.
pub const CHANNEL: &str = "alpha";
/// The oldest Kubernetes the bundle installs on (k8s-openapi's feature).
pub const MIN_KUBE_VERSION: &str = "1.33.0";

/// The released image of this version in `repository`.
pub fn image(repository: &str) -> String {
    format!("{repository}:{}", manifests::VERSION)
}

const ICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect width="64" height="64" rx="12" fill="#1f6f5c"/><path d="M14 48V18h7l11 15 11-15h7v30h-7V29L32 44 21 29v19z" fill="#fff"/></svg>"##;

const DESCRIPTION: &str = "\
Memcached Operator runs pools of [memcached](https://memcached.org) on Kubernetes from a \
`Memcached` resource:

```yaml
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata:
  name: memcached-sample
spec:
  size: 3
```

It keeps a Deployment of `size` memcached pods and a Service, repairs drift, and reports the \
pods and conditions (`Available`, `Progressing`, `Degraded`) in the status.

### What it does for production pools
* **Tuning**: memory, connections, threads, item size and extra flags, checked before they \
reach memcached; memory requests derived from the cache size.
* **Availability**: a PodDisruptionBudget, spreading across zones and nodes, paced rollouts \
(`spec.rollout.minReadySeconds`) shown in the status.
* **TLS and SASL**: certificates renewed in place without restarting memcached, so the cache \
stays warm.
* **extstore**: items spill to disk when RAM is full.
* **One endpoint**: memcached's own proxy in front of the pool.
* **Metrics**: a memcached exporter sidecar and a ServiceMonitor; the operator's own metrics \
for authorized callers only.

Admission webhooks default and validate every Memcached, naming the field at fault.
";

/// Title Case of a camelCase field name (`maxItemSize` -> `Max Item Size`), with the
/// acronyms the API spells in lower case written as acronyms (`tls` -> `TLS`).
fn display_name(field: &str) -> String {
    match field {
        "tls" => return "TLS".into(),
        "sasl" => return "SASL".into(),
        _ => {}
    }
    let mut out = String::new();
    for (i, c) in field.chars().enumerate() {
        if i == 0 {
            out.extend(c.to_uppercase());
        } else if c.is_uppercase() {
            out.push(' ');
            out.push(c);
        } else {
            out.push(c);
        }
    }
    out
}

/// The first sentence of a schema description ("e.g. ", "i.e. " and "etc. " do not end it).
fn first_sentence(description: &str) -> String {
    let one_line = description.replace('\n', " ");
    let end = one_line.match_indices(". ").map(|(i, _)| i).find(|&i| {
        !["e.g", "i.e", "etc"]
            .iter()
            .any(|a| one_line[..i].ends_with(a))
    });
    match end {
        Some(i) => one_line[..=i].to_string(),
        None => one_line,
    }
}

/// The OpenShift console's widgets for the fields that have one, by path (`.` between
/// levels) in `spec` or `status`: top-level fields and the nested fields named here.
const X_DESCRIPTORS: &[(&str, &str, &str, &str)] = &[
    // (section, path, display name of a nested field, x-descriptor)
    (
        "spec",
        "size",
        "",
        "urn:alm:descriptor:com.tectonic.ui:podCount",
    ),
    (
        "spec",
        "image",
        "",
        "urn:alm:descriptor:com.tectonic.ui:text",
    ),
    (
        "spec",
        "containerPort",
        "",
        "urn:alm:descriptor:com.tectonic.ui:number",
    ),
    (
        "spec",
        "resources",
        "",
        "urn:alm:descriptor:com.tectonic.ui:resourceRequirements",
    ),
    (
        "spec",
        "tolerations",
        "",
        "urn:alm:descriptor:com.tectonic.ui:advanced",
    ),
    (
        "spec",
        "affinity",
        "",
        "urn:alm:descriptor:com.tectonic.ui:advanced",
    ),
    (
        "spec",
        "affinity.nodeAffinity",
        "Node Affinity",
        "urn:alm:descriptor:com.tectonic.ui:nodeAffinity",
    ),
    (
        "spec",
        "affinity.podAffinity",
        "Pod Affinity",
        "urn:alm:descriptor:com.tectonic.ui:podAffinity",
    ),
    (
        "spec",
        "affinity.podAntiAffinity",
        "Pod Anti-Affinity",
        "urn:alm:descriptor:com.tectonic.ui:podAntiAffinity",
    ),
    (
        "spec",
        "config.memoryMiB",
        "Memory (MiB)",
        "urn:alm:descriptor:com.tectonic.ui:number",
    ),
    (
        "spec",
        "tls.secretName",
        "TLS Secret",
        "urn:alm:descriptor:io.kubernetes:Secret",
    ),
    (
        "spec",
        "sasl.secretName",
        "SASL Secret",
        "urn:alm:descriptor:io.kubernetes:Secret",
    ),
    (
        "status",
        "conditions",
        "",
        "urn:alm:descriptor:io.kubernetes.conditions",
    ),
];

/// The schema of `path` (`a.b`) under `section` of the CRD's schema.
fn schema_at<'a>(schema: &'a Value, section: &str, path: &str) -> Option<&'a Value> {
    let mut pointer = format!("/properties/{section}");
    for part in path.split('.') {
        pointer.push_str("/properties/");
        pointer.push_str(part);
    }
    schema.pointer(&pointer)
}

/// OLM descriptors of `spec` or `status`, from the CRD's schema: every top-level field,
/// and the nested fields of [`X_DESCRIPTORS`] the schema has, each with its widget.
fn descriptors(schema: &Value, section: &str) -> Vec<Value> {
    let top = schema
        .pointer(&format!("/properties/{section}/properties"))
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(field, prop)| (field.clone(), display_name(field), prop));
    let nested = X_DESCRIPTORS
        .iter()
        .filter(|(s, path, _, _)| *s == section && path.contains('.'))
        .filter_map(|(_, path, name, _)| {
            schema_at(schema, section, path).map(|prop| (path.to_string(), name.to_string(), prop))
        });
    let mut fields: Vec<(String, String, &Value)> = top.chain(nested).collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
        .into_iter()
        .map(|(path, name, prop)| {
            let mut d = json!({
                "path": path,
                "displayName": name,
                "description": first_sentence(
                    prop.get("description").and_then(Value::as_str).unwrap_or_default()
                ),
            });
            if let Some((_, _, _, x)) = X_DESCRIPTORS
                .iter()
                .find(|(s, p, _, _)| *s == section && *p == path)
            {
                d["x-descriptors"] = json!([x]);
            }
            d
        })
        .collect()
}

/// Drops kustomize's `app.kubernetes.io/managed-by` label (OLM manages these objects).
fn without_kustomize_label(object: &mut Value) {
    if let Some(labels) = object["metadata"]["labels"].as_object_mut() {
        labels.remove("app.kubernetes.io/managed-by");
    }
}

fn to_value<S: serde::Serialize>(what: &str, obj: &S) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|e| Error::Typed {
        what: what.to_string(),
        json: e.to_string(),
    })
}

/// The ClusterServiceVersion, for the operator's image in `repository` (and the TLS reload
/// agent's beside it, [`manifests::tls_agent_image`]).
pub fn cluster_service_version(repository: &str) -> Result<Value, Error> {
    let image = || image(repository);
    let agent_image = manifests::tls_agent_image(repository);
    let crd = to_value("CRD", &Memcached::crd())?;
    let schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema")
        .cloned()
        .unwrap_or(Value::Null);
    let sample: Value =
        serde_yaml::from_str(memcached_operator::samples::SEED_SAMPLE).map_err(|source| {
            Error::Yaml {
                path: "the seed sample".into(),
                source,
            }
        })?;

    // The manager Deployment as config/default deploys it, with the released images (the
    // operator's, and the TLS reload agent's it gives memcached pods) and the
    // ServiceAccount OLM creates for the permissions below; OLM mounts its own webhook
    // certificate at the same directory, and tells the operator which namespaces to watch
    // in an annotation (empty: all).
    let deployment_name = format!("{}controller-manager", manifests::NAME_PREFIX);
    let service_account = format!("{}{}", manifests::NAME_PREFIX, rbac::SERVICE_ACCOUNT);
    let mut deployment = manifests::manager_deployment()?;
    let pod = deployment
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut());
    if let Some(pod) = pod {
        pod.service_account_name = Some(service_account.clone());
        for container in &mut pod.containers {
            container.image = Some(image());
            let env = container.env.get_or_insert_with(Vec::new);
            for e in env.iter_mut() {
                if e.name == "TLS_AGENT_IMAGE" {
                    e.value = Some(agent_image.clone());
                }
            }
            env.push(EnvVar {
                name: "WATCH_NAMESPACE".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.annotations['olm.targetNamespaces']".into(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            });
        }
    }
    let mut deployment = to_value("Deployment", &deployment)?;
    without_kustomize_label(&mut deployment);
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    let patch = manifests::manager_webhook_patch();
    if let (Some(ports), Some(webhook_ports)) = (
        container["ports"].as_array_mut(),
        patch
            .pointer("/spec/template/spec/containers/0/ports")
            .and_then(Value::as_array),
    ) {
        ports.splice(0..0, webhook_ports.iter().cloned());
    }

    // What the operator does in the namespaces it watches is namespaced: OLM grants it in
    // each target namespace (and lifts it to a ClusterRole in AllNamespaces mode), so a
    // SingleNamespace install reaches no other namespace. Only the metrics endpoint's
    // TokenReview and SubjectAccessReview are cluster-wide.
    let mut namespaced_rules = rbac::policy_rules(&rbac::manager_rules());
    namespaced_rules.extend(rbac::policy_rules(rbac::LEADER_ELECTION_RULES));
    let mut cluster_rules = rbac::policy_rules(rbac::METRICS_AUTH_RULES);
    cluster_rules.extend(rbac::policy_rules(rbac::CLUSTER_READ_RULES));

    let (mutating, validating) = manifests::webhook_configurations();
    let definition = |kind: &str, hook: Value, path_default: &str| {
        json!({
            "type": kind,
            "admissionReviewVersions": hook["admissionReviewVersions"],
            "containerPort": 443,
            "targetPort": manifests::WEBHOOK_PORT,
            "deploymentName": deployment_name,
            "failurePolicy": hook["failurePolicy"],
            "generateName": hook["name"],
            "rules": hook["rules"],
            "sideEffects": hook["sideEffects"],
            "timeoutSeconds": hook["timeoutSeconds"],
            "webhookPath": hook["clientConfig"]["service"]["path"].as_str().unwrap_or(path_default),
        })
    };
    let mutating = to_value("MutatingWebhookConfiguration", &mutating)?;
    let validating = to_value("ValidatingWebhookConfiguration", &validating)?;

    let owned = json!({
        "name": crd["metadata"]["name"],
        "version": memcached_api::VERSION,
        "kind": "Memcached",
        "displayName": "Memcached",
        "description": "A pool of memcached pods, its Service and what keeps it available.",
        "resources": [
            {"kind": "Deployment", "name": "", "version": "v1"},
            {"kind": "Service", "name": "", "version": "v1"},
            {"kind": "ConfigMap", "name": "", "version": "v1"},
            {"kind": "PodDisruptionBudget", "name": "", "version": "v1"},
        ],
        "specDescriptors": descriptors(&schema, "spec"),
        "statusDescriptors": descriptors(&schema, "status"),
    });

    Ok(json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": format!("{PACKAGE}.v{}", manifests::VERSION),
            "namespace": "placeholder",
            "annotations": {
                "alm-examples": serde_json::to_string_pretty(&json!([sample])).unwrap_or_default(),
                "capabilities": "Seamless Upgrades",
                "categories": "Database",
                "containerImage": image(),
                "description": "Runs pools of memcached: sizing, disruption budgets, TLS renewed in place, paced rollouts, metrics.",
                "operators.operatorframework.io/builder": format!("memcached-operator-{}", manifests::VERSION),
                // Every earlier version upgrades straight to this one.
                "olm.skipRange": format!("<{}", manifests::VERSION),
                "support": "memcached-operator maintainers",
            },
        },
        "spec": {
            "displayName": "Memcached Operator",
            "description": DESCRIPTION,
            "version": manifests::VERSION,
            "minKubeVersion": MIN_KUBE_VERSION,
            "maturity": CHANNEL,
            "provider": {"name": "memcached-operator maintainers"},
            "maintainers": [{"name": "memcached-operator maintainers", "email": "maintainers@example.com"}],
            "links": [{"name": "Memcached", "url": "https://memcached.org"}],
            "keywords": ["memcached", "cache", "key-value"],
            "icon": [{
                "base64data": base64::engine::general_purpose::STANDARD.encode(ICON),
                "mediatype": "image/svg+xml",
            }],
            "installModes": [
                {"type": "OwnNamespace", "supported": true},
                {"type": "SingleNamespace", "supported": true},
                {"type": "MultiNamespace", "supported": true},
                {"type": "AllNamespaces", "supported": true},
            ],
            "customresourcedefinitions": {"owned": [owned]},
            "relatedImages": [
                {"name": "memcached-operator", "image": image()},
                // Mirrored for disconnected installs like the others: memcached pods run it.
                {"name": "memcached-tls-agent", "image": agent_image},
                {"name": "memcached", "image": memcached_api::DEFAULT_IMAGE},
                {"name": "memcached-exporter", "image": memcached_api::DEFAULT_EXPORTER_IMAGE},
            ],
            "install": {
                "strategy": "deployment",
                "spec": {
                    "clusterPermissions": [{
                        "serviceAccountName": service_account,
                        "rules": to_value("rules", &cluster_rules)?,
                    }],
                    "permissions": [{
                        "serviceAccountName": service_account,
                        "rules": to_value("rules", &namespaced_rules)?,
                    }],
                    "deployments": [{
                        "name": deployment_name,
                        "label": deployment["metadata"]["labels"],
                        "spec": deployment["spec"],
                    }],
                },
            },
            "webhookdefinitions": [
                definition("MutatingAdmissionWebhook", mutating["webhooks"][0].clone(), webhook::MUTATE_PATH),
                definition("ValidatingAdmissionWebhook", validating["webhooks"][0].clone(), webhook::VALIDATE_PATH),
            ],
        },
    }))
}

/// The bundle's labels (metadata/annotations.yaml and bundle.Dockerfile's LABELs).
fn bundle_annotations() -> Vec<(&'static str, String)> {
    vec![
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1".into(),
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.package.v1",
            PACKAGE.into(),
        ),
        (
            "operators.operatorframework.io.bundle.channels.v1",
            CHANNEL.into(),
        ),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNEL.into(),
        ),
    ]
}

fn yaml_file(path: &str, value: &Value) -> Result<File, Error> {
    let yaml = serde_yaml::to_string(value).map_err(|source| Error::Yaml {
        path: path.to_string(),
        source,
    })?;
    Ok(File {
        path: PathBuf::from(path),
        content: format!("{HEADER}{yaml}"),
    })
}

/// Every file of the bundle, by path relative to the repository: `bundle/...` and
/// `bundle.Dockerfile`, for the operator's image in `repository`
/// ([`manifests::IMAGE_REPOSITORY`] in the committed bundle).
pub fn render(repository: &str) -> Result<Vec<File>, Error> {
    let mut metrics_service = to_value("Service", &manifests::metrics_service()?)?;
    metrics_service["metadata"]["name"] = json!(format!(
        "{}controller-manager-metrics-service",
        manifests::NAME_PREFIX
    ));
    if let Some(meta) = metrics_service["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    without_kustomize_label(&mut metrics_service);
    let mut reader = to_value("ClusterRole", &rbac::metrics_reader_role())?;
    reader["metadata"]["name"] = json!(format!("{}metrics-reader", manifests::NAME_PREFIX));
    without_kustomize_label(&mut reader);
    // The alerts and the dashboards, in the operator's namespace (OLM installs a
    // PrometheusRule where the Prometheus Operator's CRDs are served).
    let mut rule = manifests::prometheus_rule();
    rule["metadata"]["name"] = json!(format!(
        "{}{}",
        manifests::NAME_PREFIX,
        monitoring::RULE_NAME
    ));
    if let Some(meta) = rule["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    without_kustomize_label(&mut rule);
    let (label, label_value) = monitoring::DASHBOARD_LABEL;
    let dashboards: Vec<(String, Value)> = monitoring::dashboards::dashboards()
        .iter()
        .map(|d| {
            let name = format!("{}{}", manifests::NAME_PREFIX, d.file);
            let mut cm = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": manifests::labels()},
                "data": {format!("{}.json", d.file): monitoring::dashboard_file("", d).content},
            });
            cm["metadata"]["labels"][label] = json!(label_value);
            without_kustomize_label(&mut cm);
            (format!("bundle/manifests/{name}_v1_configmap.yaml"), cm)
        })
        .collect();
    let annotations: serde_json::Map<String, Value> = bundle_annotations()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut dockerfile = String::from(HEADER);
    dockerfile.push_str("# The bundle image: make bundle-build BUNDLE_IMG=...\nFROM scratch\n\n");
    for (k, v) in bundle_annotations() {
        dockerfile.push_str(&format!("LABEL {k}={v}\n"));
    }
    dockerfile.push_str("\nCOPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n");
    let mut files = vec![
        yaml_file(
            &format!(
                "bundle/manifests/{}{}_monitoring.coreos.com_v1_prometheusrule.yaml",
                manifests::NAME_PREFIX,
                monitoring::RULE_NAME
            ),
            &rule,
        )?,
        yaml_file(
            &format!("bundle/manifests/{PACKAGE}.clusterserviceversion.yaml"),
            &cluster_service_version(repository)?,
        )?,
        yaml_file(
            "bundle/manifests/memcached.cache.example.com_memcacheds.yaml",
            &to_value("CRD", &Memcached::crd())?,
        )?,
        yaml_file(
            &format!(
                "bundle/manifests/{}controller-manager-metrics-service_v1_service.yaml",
                manifests::NAME_PREFIX
            ),
            &metrics_service,
        )?,
        yaml_file(
            &format!(
                "bundle/manifests/{}metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml",
                manifests::NAME_PREFIX
            ),
            &reader,
        )?,
        yaml_file(
            "bundle/metadata/annotations.yaml",
            &json!({"annotations": annotations}),
        )?,
        File {
            path: PathBuf::from("bundle.Dockerfile"),
            content: dockerfile,
        },
    ];
    for (path, cm) in dashboards {
        files.push(yaml_file(&path, &cm)?);
    }
    Ok(files)
}

/// Writes the bundle under `root` (the repository), only rewriting files whose content
/// changed; returns the paths written.
pub fn write(root: &Path, repository: &str) -> Result<Vec<PathBuf>, Error> {
    manifests::write_files(root, render(repository)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_split_camel_case() {
        assert_eq!(display_name("maxItemSize"), "Max Item Size");
        assert_eq!(display_name("size"), "Size");
        assert_eq!(display_name("tls"), "TLS");
        assert_eq!(display_name("sasl"), "SASL");
    }

    #[test]
    fn first_sentences_skip_abbreviations() {
        assert_eq!(
            first_sentence("Pod rules (e.g. co-locate this pod). More."),
            "Pod rules (e.g. co-locate this pod)."
        );
        assert_eq!(first_sentence("One line"), "One line");
    }

    /// Every field given a console widget is in the CRD (a renamed field fails here
    /// instead of losing its widget), and the widgets land on those paths in the CSV.
    #[test]
    fn every_x_descriptor_names_a_field_of_the_crd() {
        let crd = serde_json::to_value(Memcached::crd()).expect("CRD");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for (section, path, _, _) in X_DESCRIPTORS {
            assert!(
                schema_at(schema, section, path).is_some(),
                "{section}.{path} is not in the CRD"
            );
        }
        let csv = cluster_service_version("example.com/op").expect("CSV");
        let owned = &csv["spec"]["customresourcedefinitions"]["owned"][0];
        let widget = |list: &str, path: &str| {
            owned[list]
                .as_array()
                .into_iter()
                .flatten()
                .find(|d| d["path"] == path)
                .map(|d| d["x-descriptors"][0].clone())
        };
        assert_eq!(
            widget("specDescriptors", "tls.secretName"),
            Some(json!("urn:alm:descriptor:io.kubernetes:Secret"))
        );
        assert_eq!(
            widget("specDescriptors", "affinity.podAntiAffinity"),
            Some(json!("urn:alm:descriptor:com.tectonic.ui:podAntiAffinity"))
        );
        assert_eq!(
            widget("statusDescriptors", "conditions"),
            Some(json!("urn:alm:descriptor:io.kubernetes.conditions"))
        );
    }
}
