//! Resource types known to the server, keyed by group and plural, and the discovery
//! documents built from them. The built-in kinds are listed in `builtins`; kinds defined by
//! CRDs are made in `crd`.

mod builtins;
mod crd;

pub use crd::from_crd;

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

/// All resource types, keyed by (group, plural).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub types: BTreeMap<ResKey, Arc<ResourceType>>,
}

impl Registry {
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
