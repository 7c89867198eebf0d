//! The built-in kinds the server serves (core, apps, coordination, policy, RBAC,
//! apiextensions, admissionregistration, the reviews) and their properties: scope,
//! subresources, short names, categories.

use super::{Registry, ResourceType, ScalePaths};
use std::collections::HashMap;
use std::sync::Arc;

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    status: bool,
    scale: bool,
    short: &[&str],
    cats: &[&str],
) -> ResourceType {
    ResourceType {
        group: group.into(),
        versions: vec!["v1".into()],
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        status,
        scale: scale.then(|| ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: Some(".spec.selector".into()),
        }),
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: cats.iter().map(|s| s.to_string()).collect(),
        create_only: false,
        label_name: false,
        generation: status,
        crd: false,
        schemas: HashMap::new(),
        printer_columns: vec![],
    }
}

impl Registry {
    pub fn with_builtins() -> Registry {
        let mut r = Registry::default();
        let mut add = |t: ResourceType| {
            r.types.insert(t.key(), Arc::new(t));
        };
        let mut ns = builtin(
            "",
            "namespaces",
            "Namespace",
            false,
            true,
            false,
            &["ns"],
            &[],
        );
        ns.label_name = true;
        ns.generation = false;
        add(ns);
        let mut pods = builtin("", "pods", "Pod", true, true, false, &["po"], &["all"]);
        pods.generation = false;
        add(pods);
        let mut svc = builtin(
            "",
            "services",
            "Service",
            true,
            true,
            false,
            &["svc"],
            &["all"],
        );
        svc.label_name = true;
        svc.generation = false;
        add(svc);
        let mut nodes = builtin("", "nodes", "Node", false, true, false, &["no"], &[]);
        nodes.generation = false;
        add(nodes);
        add(builtin(
            "",
            "configmaps",
            "ConfigMap",
            true,
            false,
            false,
            &["cm"],
            &[],
        ));
        add(builtin(
            "",
            "secrets",
            "Secret",
            true,
            false,
            false,
            &[],
            &[],
        ));
        add(builtin(
            "",
            "serviceaccounts",
            "ServiceAccount",
            true,
            false,
            false,
            &["sa"],
            &[],
        ));
        add(builtin(
            "",
            "events",
            "Event",
            true,
            false,
            false,
            &["ev"],
            &[],
        ));
        add(builtin(
            "events.k8s.io",
            "events",
            "Event",
            true,
            false,
            false,
            &["ev"],
            &[],
        ));
        add(builtin(
            "apps",
            "deployments",
            "Deployment",
            true,
            true,
            true,
            &["deploy"],
            &["all"],
        ));
        add(builtin(
            "apps",
            "replicasets",
            "ReplicaSet",
            true,
            true,
            true,
            &["rs"],
            &["all"],
        ));
        add(builtin(
            "coordination.k8s.io",
            "leases",
            "Lease",
            true,
            false,
            false,
            &[],
            &[],
        ));
        add(builtin(
            "policy",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            true,
            false,
            &["pdb"],
            &[],
        ));
        add(builtin(
            "networking.k8s.io",
            "networkpolicies",
            "NetworkPolicy",
            true,
            false,
            false,
            &["netpol"],
            &[],
        ));
        // autoscaling/v2 only: the version the operator writes.
        add(ResourceType {
            versions: vec!["v2".into()],
            ..builtin(
                "autoscaling",
                "horizontalpodautoscalers",
                "HorizontalPodAutoscaler",
                true,
                true,
                false,
                &["hpa"],
                &[],
            )
        });
        add(builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
            false,
            &["crd", "crds"],
            &["api-extensions"],
        ));
        let rbac = "rbac.authorization.k8s.io";
        add(builtin(rbac, "roles", "Role", true, false, false, &[], &[]));
        add(builtin(
            rbac,
            "rolebindings",
            "RoleBinding",
            true,
            false,
            false,
            &[],
            &[],
        ));
        add(builtin(
            rbac,
            "clusterroles",
            "ClusterRole",
            false,
            false,
            false,
            &[],
            &[],
        ));
        add(builtin(
            rbac,
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            false,
            false,
            &[],
            &[],
        ));
        let mut tr = builtin(
            "authentication.k8s.io",
            "tokenreviews",
            "TokenReview",
            false,
            false,
            false,
            &[],
            &[],
        );
        tr.create_only = true;
        add(tr);
        let mut sar = builtin(
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
            false,
            false,
            false,
            &[],
            &[],
        );
        sar.create_only = true;
        add(sar);
        let adm = "admissionregistration.k8s.io";
        add(builtin(
            adm,
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            false,
            false,
            &[],
            &["api-extensions"],
        ));
        add(builtin(
            adm,
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            false,
            false,
            &[],
            &["api-extensions"],
        ));
        r
    }
}
