//! The OLM bundle (`bundle/`, `bundle.Dockerfile`), generated from the same code as
//! `config/` and the chart (`memcached-operator bundle`, `make bundle`): the
//! ClusterServiceVersion with the owned CRD and its descriptors, the RBAC, the Deployment,
//! the webhook definitions and the OperatorHub listing; the CRD, the metrics Service and the
//! metrics-reader ClusterRole beside it. `tests/olm.rs` validates it with the pinned
//! `operator-sdk bundle validate --select-optional suite=operatorhub`.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kube::CustomResourceExt;
use memcached_api::Memcached;
use serde_json::{Value, json};

use crate::manifests::{self, Error, File, HEADER};
use crate::{rbac, webhook};

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

/// Title Case of a camelCase field name (`maxItemSize` -> `Max Item Size`).
fn display_name(field: &str) -> String {
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

/// The first sentence of a schema description.
fn first_sentence(description: &str) -> String {
    let one_line = description.replace('\n', " ");
    match one_line.find(". ") {
        Some(i) => one_line[..=i].to_string(),
        None => one_line,
    }
}

/// OLM descriptors of the top-level fields of `spec` or `status`, from the CRD's schema.
fn descriptors(schema: &Value, section: &str) -> Vec<Value> {
    let props = schema
        .pointer(&format!("/properties/{section}/properties"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    props
        .iter()
        .map(|(field, prop)| {
            let mut d = json!({
                "path": field,
                "displayName": display_name(field),
                "description": first_sentence(
                    prop.get("description").and_then(Value::as_str).unwrap_or_default()
                ),
            });
            let x = match (section, field.as_str()) {
                ("spec", "size") => Some("urn:alm:descriptor:com.tectonic.ui:podCount"),
                ("spec", "image") => Some("urn:alm:descriptor:com.tectonic.ui:text"),
                ("spec", "resources") => {
                    Some("urn:alm:descriptor:com.tectonic.ui:resourceRequirements")
                }
                ("spec", "tolerations") => Some("urn:alm:descriptor:io.kubernetes:Tolerations"),
                ("spec", "affinity") => Some("urn:alm:descriptor:com.tectonic.ui:nodeAffinity"),
                ("status", "conditions") => Some("urn:alm:descriptor:io.kubernetes.conditions"),
                _ => None,
            };
            if let Some(x) = x {
                d["x-descriptors"] = json!([x]);
            }
            d
        })
        .collect()
}

fn to_value<S: serde::Serialize>(what: &str, obj: &S) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|e| Error::Typed {
        what: what.to_string(),
        json: e.to_string(),
    })
}

/// The ClusterServiceVersion, for the operator's image in `repository`.
pub fn cluster_service_version(repository: &str) -> Result<Value, Error> {
    let image = || image(repository);
    let crd = to_value("CRD", &Memcached::crd())?;
    let schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema")
        .cloned()
        .unwrap_or(Value::Null);
    let sample: Value =
        serde_yaml::from_str(crate::demo::SEED_SAMPLE).map_err(|source| Error::Yaml {
            path: "the seed sample".into(),
            source,
        })?;

    // The manager Deployment as config/default deploys it, with the released image; OLM
    // mounts its own webhook certificate at the same directory, and tells the operator
    // which namespaces to watch in an annotation (empty: all).
    let mut deployment = to_value("Deployment", &manifests::manager_deployment()?)?;
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    container["image"] = json!(image());
    if let Some(env) = container["env"].as_array_mut() {
        for e in env.iter_mut() {
            if e["name"] == "TLS_AGENT_IMAGE" {
                e["value"] = json!(image());
            }
        }
        env.push(json!({
            "name": "WATCH_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['olm.targetNamespaces']"}},
        }));
    }
    let patch = manifests::manager_webhook_patch();
    if let (Some(ports), Some(webhook_ports)) = (
        container["ports"].as_array_mut(),
        patch
            .pointer("/spec/template/spec/containers/0/ports")
            .and_then(Value::as_array),
    ) {
        ports.splice(0..0, webhook_ports.iter().cloned());
    }
    let deployment_name = format!("{}controller-manager", manifests::NAME_PREFIX);
    let service_account = format!("{}{}", manifests::NAME_PREFIX, rbac::SERVICE_ACCOUNT);

    let mut cluster_rules = rbac::policy_rules(rbac::MANAGER_RULES);
    cluster_rules.extend(rbac::policy_rules(rbac::METRICS_AUTH_RULES));

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
                        "rules": to_value("rules", &rbac::policy_rules(rbac::LEADER_ELECTION_RULES))?,
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
    let mut reader = to_value("ClusterRole", &rbac::metrics_reader_role())?;
    reader["metadata"]["name"] = json!(format!("{}metrics-reader", manifests::NAME_PREFIX));
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
    Ok(vec![
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
    ])
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
    }
}
