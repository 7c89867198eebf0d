//! Resource types known to the server: built-ins and CRD-defined kinds.

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where the replica counts of a scalable resource live.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    pub group: String,
    /// Served versions, preferred (storage) first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub status: bool,
    pub scale: Option<ScalePaths>,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Only `create` is served (TokenReview, SubjectAccessReview).
    pub create_only: bool,
    /// Names must be DNS-1123 labels (63) instead of subdomains (253).
    pub label_name: bool,
    /// `metadata.generation` is maintained.
    pub generation: bool,
    /// Defined by a CRD: version -> openAPIV3Schema.
    pub crd: bool,
    pub schemas: HashMap<String, Value>,
    /// additionalPrinterColumns of the storage version: (name, type, jsonPath).
    pub printer_columns: Vec<(String, String, String)>,
}

pub type ResKey = (String, String);

impl ResourceType {
    pub fn key(&self) -> ResKey {
        (self.group.clone(), self.plural.clone())
    }
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }
    pub fn preferred_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }
    /// `Kind` or `Kind.group` as used in Invalid messages.
    pub fn kind_qualified(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            vec!["create"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

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

/// All resource types, keyed by (group, plural).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub types: BTreeMap<ResKey, Arc<ResourceType>>,
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

    /// Find a resource type by group, served version and plural.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<ResourceType>> {
        self.types
            .get(&(group.to_string(), plural.to_string()))
            .filter(|t| t.versions.iter().any(|v| v == version))
    }

    /// group -> versions (preferred first) for discovery.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            let e = m.entry(t.group.clone()).or_default();
            for v in &t.versions {
                if !e.contains(v) {
                    e.push(v.clone());
                }
            }
        }
        for vs in m.values_mut() {
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        m
    }

    /// An `APIResourceList` for one group/version.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = vec![];
        for t in self.types.values() {
            if t.group != group || !t.versions.iter().any(|v| v == version) {
                continue;
            }
            let mut r = json!({
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": t.verbs(),
            });
            if !t.short_names.is_empty() {
                r["shortNames"] = json!(t.short_names);
            }
            if !t.categories.is_empty() {
                r["categories"] = json!(t.categories);
            }
            resources.push(r);
            if t.status {
                resources.push(json!({
                    "name": format!("{}/status", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
            if t.scale.is_some() {
                resources.push(json!({
                    "name": format!("{}/scale", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }))
    }

    pub fn group_json(&self, group: &str, versions: &[String]) -> Value {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        let pref = vs.first().cloned().unwrap_or(json!({}));
        json!({"name": group, "versions": vs, "preferredVersion": pref})
    }

    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .filter(|(g, _)| !g.is_empty())
            .map(|(g, vs)| self.group_json(g, vs))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }
}

/// Kubernetes version priority: v1 > v1beta2 > v1beta1 > v1alpha1, GA by number.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major: u32 = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    let (lvl, n) = if let Some(b) = tail.strip_prefix("beta") {
        (2, b)
    } else if let Some(a) = tail.strip_prefix("alpha") {
        (1, a)
    } else {
        return (0, 0, 0);
    };
    (lvl, major, n.parse().unwrap_or(0))
}

/// Build a resource type from a CRD object. Errors are field messages.
pub fn from_crd(crd: &Value) -> Result<ResourceType, Vec<crate::error::FieldError>> {
    use crate::error::FieldError;
    let mut errs = vec![];
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("").to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or("").to_string();
    let kind = names["kind"].as_str().unwrap_or("").to_string();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    let scope = spec["scope"].as_str().unwrap_or("");
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::other(
            "FieldValueNotSupported",
            "spec.scope",
            format!(
                "Unsupported value: {}: supported values: \"Cluster\", \"Namespaced\"",
                crate::error::show(&spec["scope"])
            ),
        ));
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!(
                versions
                    .iter()
                    .map(|v| v["name"].clone())
                    .collect::<Vec<_>>()
            ),
            "must have exactly one version marked as storage version",
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let mut served: Vec<String> = vec![];
    let mut schemas = HashMap::new();
    let mut status = false;
    let mut scale = None;
    let storage = versions
        .iter()
        .find(|v| v["storage"].as_bool() == Some(true))
        .cloned()
        .unwrap_or(Value::Null);
    for v in &versions {
        let vn = v["name"].as_str().unwrap_or("").to_string();
        if v["served"].as_bool() == Some(true) {
            served.push(vn.clone());
        }
        if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(vn.clone(), s.clone());
        } else if let Some(s) = spec.pointer("/validation/openAPIV3Schema") {
            schemas.insert(vn.clone(), s.clone());
        }
    }
    let subs = if storage["subresources"].is_object() {
        &storage["subresources"]
    } else {
        &spec["subresources"]
    };
    if subs["status"].is_object() {
        status = true;
    }
    if let Some(sc) = subs["scale"].as_object() {
        scale = Some(ScalePaths {
            spec_replicas: sc
                .get("specReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".spec.replicas")
                .to_string(),
            status_replicas: sc
                .get("statusReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".status.replicas")
                .to_string(),
            label_selector: sc
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
    }
    // storage version first, then by priority
    let sv = storage["name"].as_str().unwrap_or("").to_string();
    served.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    if let Some(pos) = served.iter().position(|v| *v == sv) {
        let s = served.remove(pos);
        served.insert(0, s);
    }
    let str_list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(ResourceType {
        group,
        versions: served,
        singular: names["singular"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase()),
        list_kind: names["listKind"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{kind}List")),
        plural,
        kind,
        namespaced: scope == "Namespaced",
        status,
        scale,
        short_names: str_list(&names["shortNames"]),
        categories: str_list(&names["categories"]),
        create_only: false,
        label_name: false,
        generation: true,
        crd: true,
        schemas,
        printer_columns: storage["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("type"), s("jsonPath"))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    })
}
