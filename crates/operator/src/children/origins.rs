//! Where a Memcached's fields land in its children, found by building them, and the API
//! server's refusal of a child told on the Memcached's own fields.
//!
//! Nothing here is typed by hand about the children: for each field a Memcached passes
//! through to its pods and Services, the child is built once with that field set to a value
//! no builder would make up, and wherever the value shows up in the child is where the
//! field lands ([`origins`]). So a builder that moves a field (a container added before
//! memcached's, a new child) moves its translation with it.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::Status;
use memcached_api::validation::{FieldError, ValidationErrors};
use memcached_api::{Memcached, MemcachedSpec};
use serde_json::Value;

use super::{Child, Inputs};

/// A field of the Memcached that a builder copies into a child, and how to mark it.
struct PassedThrough {
    /// Its path in the Memcached.
    field: &'static str,
    /// Sets it to a value no builder makes up (only where the Memcached has the feature: a
    /// field of a feature that is off lands nowhere).
    mark: fn(&mut MemcachedSpec),
}

/// A label key or name no object of ours carries.
const MARK: &str = "origin.memcached.invalid/marker";

fn marked_resources(mebibytes: u32) -> ResourceRequirements {
    let quantity = || [("memory".to_string(), Quantity(format!("{mebibytes}Mi")))].into();
    ResourceRequirements {
        limits: Some(quantity()),
        requests: Some(quantity()),
        ..ResourceRequirements::default()
    }
}

/// The fields a Memcached passes through to its children.
const PASSED_THROUGH: &[PassedThrough] = &[
    PassedThrough {
        field: "spec.size",
        mark: |s| s.size = 7919,
    },
    PassedThrough {
        field: "spec.containerPort",
        mark: |s| s.container_port = 30719,
    },
    PassedThrough {
        field: "spec.image",
        mark: |s| s.image = Some(format!("{MARK}/spec-image:1")),
    },
    PassedThrough {
        field: "spec.resources",
        mark: |s| s.resources = Some(marked_resources(7919)),
    },
    PassedThrough {
        field: "spec.nodeSelector",
        mark: |s| s.node_selector = Some([(MARK.to_string(), "node-selector".into())].into()),
    },
    PassedThrough {
        field: "spec.tolerations",
        mark: |s| {
            s.tolerations = Some(vec![Toleration {
                key: Some(MARK.to_string()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }])
        },
    },
    PassedThrough {
        field: "spec.affinity",
        mark: |s| {
            s.affinity = Some(Box::new(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: MARK.to_string(),
                                operator: "Exists".into(),
                                values: None,
                            }]),
                            match_fields: None,
                        }],
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }))
        },
    },
    PassedThrough {
        field: "spec.imagePullSecrets",
        mark: |s| {
            s.image_pull_secrets = Some(vec![k8s_openapi::api::core::v1::LocalObjectReference {
                name: "origin-marker-pull-secret".into(),
            }])
        },
    },
    PassedThrough {
        field: "spec.priorityClassName",
        mark: |s| s.priority_class_name = Some("origin-marker-priority".into()),
    },
    PassedThrough {
        field: "spec.podLabels",
        mark: |s| s.pod_labels = Some([(MARK.to_string(), "pod-labels".into())].into()),
    },
    PassedThrough {
        field: "spec.podAnnotations",
        mark: |s| s.pod_annotations = Some([(MARK.to_string(), "pod-annotations".into())].into()),
    },
    PassedThrough {
        field: "spec.exporter.image",
        mark: |s| {
            if let Some(exporter) = s.exporter.as_mut() {
                exporter.image = Some(format!("{MARK}/exporter-image:1"));
            }
        },
    },
    PassedThrough {
        field: "spec.proxy.replicas",
        mark: |s| {
            if let Some(proxy) = s.proxy.as_mut() {
                proxy.replicas = 7907;
            }
        },
    },
    PassedThrough {
        field: "spec.proxy.image",
        mark: |s| {
            if let Some(proxy) = s.proxy.as_mut() {
                proxy.image = Some(format!("{MARK}/proxy-image:1"));
            }
        },
    },
    PassedThrough {
        field: "spec.proxy.resources",
        mark: |s| {
            if let Some(proxy) = s.proxy.as_mut() {
                proxy.resources = Some(marked_resources(7907));
            }
        },
    },
    PassedThrough {
        field: "spec.service.labels",
        mark: |s| {
            s.service.get_or_insert_default().labels =
                Some([(MARK.to_string(), "service-labels".into())].into())
        },
    },
    PassedThrough {
        field: "spec.service.annotations",
        mark: |s| {
            s.service.get_or_insert_default().annotations =
                Some([(MARK.to_string(), "service-annotations".into())].into())
        },
    },
    PassedThrough {
        field: "spec.gracefulShutdown.preStopDelaySeconds",
        mark: |s| {
            s.graceful_shutdown
                .get_or_insert_default()
                .pre_stop_delay_seconds = 7877
        },
    },
    PassedThrough {
        field: "spec.gracefulShutdown.terminationGracePeriodSeconds",
        mark: |s| {
            s.graceful_shutdown
                .get_or_insert_default()
                .termination_grace_period_seconds = Some(7873)
        },
    },
    PassedThrough {
        field: "spec.podSecurityContext",
        mark: |s| {
            s.pod_security_context
                .get_or_insert_default()
                .se_linux_options = Some(marked_se_linux(797))
        },
    },
    PassedThrough {
        field: "spec.containerSecurityContext",
        mark: |s| {
            s.container_security_context
                .get_or_insert_default()
                .se_linux_options = Some(marked_se_linux(787))
        },
    },
    PassedThrough {
        field: "spec.networkPolicy.from",
        mark: |s| {
            if let Some(policy) = s.network_policy.as_mut() {
                policy.from = vec![marked_peer("from")];
            }
        },
    },
    PassedThrough {
        field: "spec.networkPolicy.metricsFrom",
        mark: |s| {
            if let Some(policy) = s.network_policy.as_mut() {
                policy.metrics_from = vec![marked_peer("metrics-from")];
            }
        },
    },
];

/// A NetworkPolicy peer no builder makes up.
fn marked_peer(value: &str) -> k8s_openapi::api::networking::v1::NetworkPolicyPeer {
    k8s_openapi::api::networking::v1::NetworkPolicyPeer {
        pod_selector: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([(MARK.to_string(), value.to_string())].into()),
                match_expressions: None,
            },
        ),
        ..Default::default()
    }
}

/// SELinux options no builder makes up (a level of one category of the marker's own).
fn marked_se_linux(category: u32) -> k8s_openapi::api::core::v1::SELinuxOptions {
    k8s_openapi::api::core::v1::SELinuxOptions {
        level: Some(format!("s0:c{category}")),
        ..Default::default()
    }
}

/// Where a field of the Memcached lands in a child: `child_path` (as the API server names
/// fields: `spec.template.spec.containers[0].image`) holds `field`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub child_path: String,
    pub field: &'static str,
}

/// Where `child` of `mc` holds each field `mc` passes through, found by building the child
/// with that field marked. kube-apiserver names an embedded pod template's labels and
/// annotations without `metadata` (`spec.template.labels`), so both forms are listed.
pub fn origins(child: &Child, mc: &Memcached, inputs: &Inputs<'_>) -> Vec<Origin> {
    let mut found = Vec::new();
    for passed in PASSED_THROUGH {
        let mut marked = mc.clone();
        (passed.mark)(&mut marked.spec);
        let Some(value) = field_value(&marked, passed.field) else {
            continue;
        };
        if Some(&value) == field_value(mc, passed.field).as_ref() {
            // The mark did not take (the feature is off): the field lands nowhere.
            continue;
        }
        let Ok(Some(built)) = (child.build)(&marked, inputs) else {
            continue;
        };
        let Ok(json) = built.to_json() else {
            continue;
        };
        let mut paths = Vec::new();
        find(&json, &value, &mut String::new(), &mut paths);
        for child_path in paths {
            if let Some(short) = child_path
                .contains("template.metadata.")
                .then(|| child_path.replace("template.metadata.", "template."))
            {
                found.push(Origin {
                    child_path: short,
                    field: passed.field,
                });
            }
            found.push(Origin {
                child_path,
                field: passed.field,
            });
        }
    }
    found
}

/// The value of `field` (`spec.a.b`) in `mc`'s JSON.
fn field_value(mc: &Memcached, field: &str) -> Option<Value> {
    let json = serde_json::to_value(mc).ok()?;
    let pointer = format!("/{}", field.replace('.', "/"));
    json.pointer(&pointer).filter(|v| !v.is_null()).cloned()
}

/// Paths in `tree` of the values that hold `mark`: equal to it, or for an object, holding
/// each of its entries (a builder merges the pod labels into its own).
fn find(tree: &Value, mark: &Value, path: &mut String, out: &mut Vec<String>) {
    if holds(tree, mark) {
        out.push(path.clone());
        return;
    }
    let len = path.len();
    match tree {
        Value::Object(map) => {
            for (key, value) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                find(value, mark, path, out);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                find(value, mark, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn holds(tree: &Value, mark: &Value) -> bool {
    match (tree, mark) {
        (Value::Object(tree), Value::Object(mark)) => {
            !mark.is_empty()
                && mark
                    .iter()
                    .all(|(k, v)| tree.get(k).is_some_and(|t| holds(t, v)))
        }
        (Value::Array(tree), Value::Array(mark)) => {
            !mark.is_empty()
                && tree.len() == mark.len()
                && tree.iter().zip(mark).all(|(t, m)| holds(t, m))
        }
        (tree, mark) => tree == mark,
    }
}

/// The Memcached's path for `child_path`, if one of `origins` holds it. Paths are matched
/// whole (`a.b` matches `a.b`, `a.b.c` and `a.b[0]`, never `a.bc`).
pub fn memcached_path(origins: &[Origin], child_path: &str) -> Option<String> {
    origins.iter().find_map(|origin| {
        let rest = child_path.strip_prefix(origin.child_path.as_str())?;
        (rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
            .then(|| format!("{}{rest}", origin.field))
    })
}

/// When the API server's answer `status` to a write of `child` (named `name`) of `mc` says
/// the object itself is wrong, what is wrong as errors on the Memcached's fields; `None` for
/// any other failure (forbidden, conflict, unavailable, …). Used by the webhook for dry
/// runs and by the reconciler for real writes, so both name the same field.
pub fn refusal(
    child: &Child,
    mc: &Memcached,
    inputs: &Inputs<'_>,
    name: &str,
    status: &Status,
) -> Option<ValidationErrors> {
    let object_is_wrong = match status.code {
        // Invalid (422) and BadRequest (400), but for a dry run that an admission webhook
        // on the child's kind cannot take: a limit of the cluster, not of the object.
        400 => !status.message.contains("does not support dry run"),
        422 => true,
        // Forbidden, but not by RBAC: the cluster's own policies refuse the object (a
        // ResourceQuota or LimitRange, an admission webhook or policy), and will go on
        // refusing it however often it is retried. Nor because its namespace is being
        // deleted: nothing about the object, and over when the namespace is gone.
        403 => !is_rbac_denial(status) && !is_namespace_terminating(status),
        // The server could not even convert the object to its type (a quantity that does
        // not parse): a 500 about the object, not about the server.
        500 => status
            .message
            .contains("unable to convert unstructured object"),
        _ => false,
    };
    object_is_wrong
        .then(|| ValidationErrors(translate(child, &origins(child, mc, inputs), name, status)))
}

/// Whether a 403 is RBAC's: the authorizer says who `cannot` do what to which `resource`
/// (`User "system:serviceaccount:ns:sa" cannot patch resource "deployments" in API group
/// "apps" ...`); admission's 403s (`exceeded quota: ...`, `admission webhook "..." denied the
/// request: ...`, `ValidatingAdmissionPolicy '...' ... denied request: ...`) say no such
/// thing.
pub fn is_rbac_denial(status: &Status) -> bool {
    status.code == 403
        && status.message.contains(" cannot ")
        && status.message.contains(" resource \"")
}

/// Whether the server refused to create an object because its namespace is being deleted
/// (the namespace lifecycle admission's 403, with a `NamespaceTerminating` cause on
/// `metadata.namespace`).
pub fn is_namespace_terminating(status: &Status) -> bool {
    status.code == 403
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

/// The API server's refusal of `child` as errors on the Memcached: each cause with a field
/// that comes from the Memcached is reported on that field with the server's own words;
/// anything else (a field the operator sets, or no field at all) on `spec`, naming the
/// child and its field, so nothing the server said is lost.
fn translate(child: &Child, origins: &[Origin], name: &str, status: &Status) -> Vec<FieldError> {
    let role = child.role;
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    let mut errors: Vec<FieldError> = causes
        .iter()
        .map(|cause| {
            let field = cause.field.trim_start_matches('.');
            match memcached_path(origins, field) {
                Some(path) => FieldError::new(path, cause.message.clone()),
                None if field.is_empty() => FieldError::new(
                    "spec",
                    format!(
                        "the {role} {name:?} built from it would be refused: {}",
                        cause.message
                    ),
                ),
                None => FieldError::new(
                    "spec",
                    format!(
                        "the {role} {name:?} built from it would be refused: {field}: {}",
                        cause.message
                    ),
                ),
            }
        })
        .collect();
    if errors.is_empty() {
        errors.push(FieldError::new(
            "spec",
            format!(
                "the {role} {name:?} built from it would be refused: {}",
                status.message
            ),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::{BuildSettings, SecretVersions};
    use crate::children::{CHILDREN, LiveServices, PROXY_DEPLOYMENT};

    fn every_feature() -> Memcached {
        let mut mc = Memcached::new("cache", MemcachedSpec::with_size(3));
        mc.metadata.namespace = Some("default".into());
        mc.metadata.uid = Some("uid-1".into());
        mc.spec.exporter = Some(memcached_api::ExporterSpec {
            enabled: true,
            image: None,
        });
        mc.spec.proxy = Some(Box::new(memcached_api::ProxySpec::default()));
        mc
    }

    fn path_in(role: &str, position: usize, mc: &Memcached, child_path: &str) -> Option<String> {
        let child = CHILDREN
            .iter()
            .filter(|c| c.role == role)
            .nth(position)
            .expect("a child of that role");
        let inputs = Inputs {
            settings: &BuildSettings::default(),
            secrets: &SecretVersions::default(),
            backends: &[],
            services: LiveServices::default(),
        };
        memcached_path(&origins(child, mc, &inputs), child_path)
    }

    #[test]
    fn pass_through_fields_are_found_where_the_builders_put_them() {
        let mc = every_feature();
        let pool = |path| path_in("Deployment", 0, &mc, path);
        assert_eq!(
            pool("spec.template.spec.tolerations[0].operator").as_deref(),
            Some("spec.tolerations[0].operator")
        );
        assert_eq!(
            pool("spec.template.spec.containers[0].resources.requests[memory]").as_deref(),
            Some("spec.resources.requests[memory]")
        );
        assert_eq!(
            pool("spec.template.spec.containers[0].image").as_deref(),
            Some("spec.image")
        );
        assert_eq!(
            pool("spec.template.spec.containers[1].image").as_deref(),
            Some("spec.exporter.image")
        );
        assert_eq!(pool("spec.replicas").as_deref(), Some("spec.size"));
        // kube-apiserver's short form of the template's labels.
        assert_eq!(
            pool("spec.template.labels").as_deref(),
            Some("spec.podLabels")
        );
        assert_eq!(
            pool("spec.template.metadata.annotations[a]").as_deref(),
            Some("spec.podAnnotations[a]")
        );
        assert_eq!(
            pool("spec.template.spec.imagePullSecrets[0].name").as_deref(),
            Some("spec.imagePullSecrets[0].name")
        );
        // `containers[0].imagePullPolicy` is not `containers[0].image`.
        assert_eq!(
            pool("spec.template.spec.containers[0].imagePullPolicy"),
            None
        );
        assert_eq!(
            path_in("Service", 0, &mc, "spec.ports[0].port").as_deref(),
            Some("spec.containerPort")
        );
        // The proxy's Deployment carries the proxy's own fields in the same places.
        let proxy = |path| path_in(PROXY_DEPLOYMENT, 0, &mc, path);
        assert_eq!(
            proxy("spec.template.spec.containers[0].resources.requests").as_deref(),
            Some("spec.proxy.resources.requests")
        );
        assert_eq!(
            proxy("spec.replicas").as_deref(),
            Some("spec.proxy.replicas")
        );
        assert_eq!(
            proxy("spec.template.spec.nodeSelector").as_deref(),
            Some("spec.nodeSelector")
        );
    }

    #[test]
    fn a_field_of_a_feature_that_is_off_lands_nowhere() {
        let mut mc = every_feature();
        mc.spec.exporter = None;
        assert_eq!(
            path_in(
                "Deployment",
                0,
                &mc,
                "spec.template.spec.containers[1].image"
            ),
            None
        );
    }

    #[test]
    fn the_proxy_runs_the_pools_image_unless_it_names_its_own() {
        let mc = every_feature();
        assert_eq!(
            path_in(
                PROXY_DEPLOYMENT,
                0,
                &mc,
                "spec.template.spec.containers[0].image"
            )
            .as_deref(),
            Some("spec.image"),
            "without spec.proxy.image, the pool's image is the proxy's"
        );
        let mut own = mc.clone();
        if let Some(proxy) = own.spec.proxy.as_mut() {
            proxy.image = Some("memcached:1.6.39".into());
        }
        assert_eq!(
            path_in(
                PROXY_DEPLOYMENT,
                0,
                &own,
                "spec.template.spec.containers[0].image"
            )
            .as_deref(),
            Some("spec.proxy.image")
        );
    }

    #[test]
    fn a_403_is_rbac_only_when_the_authorizer_says_who_cannot_do_what() {
        let status = |message: &str| Status::failure(message, "Forbidden").with_code(403);
        assert!(is_rbac_denial(&status(
            "deployments.apps \"cache\" is forbidden: User \"system:serviceaccount:default:nobody\" \
             cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"default\""
        )));
        for admission in [
            "deployments.apps \"cache\" is forbidden: exceeded quota: no-deployments, requested: \
             count/deployments.apps=1, used: count/deployments.apps=0, limited: count/deployments.apps=0",
            "admission webhook \"policy.example.com\" denied the request: images must come from our registry",
            "deployments.apps \"cache\" is forbidden: ValidatingAdmissionPolicy 'no-latest' with \
             binding 'no-latest' denied request: failed expression",
        ] {
            assert!(!is_rbac_denial(&status(admission)), "{admission}");
        }
    }

    /// A create refused because the pool's namespace is being deleted is not the spec's
    /// fault: not reported as a refusal of what the spec builds (the answer below is the
    /// API server's, as the operator logged it while the bench's namespaces terminated).
    #[test]
    fn a_terminating_namespace_is_not_a_refused_spec() {
        let terminating: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "message": "deployments.apps \"cache\" is forbidden: unable to create new content \
                in namespace team-a because it is being terminated",
            "reason": "Forbidden",
            "details": {"name": "cache", "group": "apps", "kind": "deployments",
                "causes": [{"reason": "NamespaceTerminating",
                    "message": "namespace team-a is being terminated",
                    "field": "metadata.namespace"}]},
            "code": 403,
        }))
        .unwrap_or_else(|_| Status::failure("unparsed", "Forbidden"));
        assert!(is_namespace_terminating(&terminating));
        let mc = every_feature();
        let inputs = Inputs {
            settings: &BuildSettings::default(),
            secrets: &SecretVersions::default(),
            backends: &[],
            services: LiveServices::default(),
        };
        let child = &CHILDREN[0];
        assert!(refusal(child, &mc, &inputs, "cache", &terminating).is_none());
        // A quota's 403 is still the object's.
        let quota = Status::failure(
            "deployments.apps \"cache\" is forbidden: exceeded quota",
            "Forbidden",
        )
        .with_code(403);
        assert!(!is_namespace_terminating(&quota));
        assert!(refusal(child, &mc, &inputs, "cache", &quota).is_some());
    }
}
