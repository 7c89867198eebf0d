//! Unknown fields: which fields of an object the server's schema does not declare.
//!
//! kube-apiserver decodes built-in kinds into their Go types and custom resources against
//! their CRD's structural schema. A field neither declares is *unknown*: create, update and
//! patch drop it (with a `Warning` header, or refuse it with `fieldValidation=Strict`), and a
//! server-side apply refuses it whatever `fieldValidation` says (500, `failed to create typed
//! patch object`).
//!
//! Built-in kinds are checked against the JSON schemas of k8s-openapi's types (the Kubernetes
//! version of its enabled feature), custom resources against their version's
//! `openAPIV3Schema`, with `metadata` checked against `ObjectMeta` for both.

use k8s_openapi::schemars::{JsonSchema, SchemaGenerator};
use serde_json::Value;
use std::sync::OnceLock;

use crate::registry::ResourceType;

/// One step of a path into an object.
#[derive(Debug, Clone, PartialEq)]
pub enum Seg {
    Field(String),
    /// A list item: its index and, for a keyed list, its key as server-side apply prints it
    /// (`name="c"`, `containerPort=80,protocol="TCP"`).
    Item(usize, Option<String>),
}

/// The path of an unknown field.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// As the JSON decoder's warnings and strict decoding errors name it:
    /// `spec.template.spec.containers[0].bogus`.
    pub fn decoder(&self) -> String {
        let mut s = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Field(f) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(f);
                }
                Seg::Item(i, _) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }

    /// As server-side apply names it: `.spec.containers[name="c"].bogus`, list items by
    /// their key in keyed lists, by index in atomic ones.
    pub fn apply(&self) -> String {
        let mut s = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Field(f) => {
                    s.push('.');
                    s.push_str(f);
                }
                Seg::Item(_, Some(k)) => s.push_str(&format!("[{k}]")),
                Seg::Item(i, None) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }
}

/// A schema to check against: JSON-schema nodes, `$ref`s resolved in `defs`.
#[derive(Clone, Copy)]
struct Schema<'a> {
    node: &'a Value,
    defs: &'a Value,
    /// Built-in kind: keyed lists come from [`builtin_list_keys`] (the Go types' list-map
    /// keys, which k8s-openapi's schemas do not carry).
    builtin: bool,
}

impl<'a> Schema<'a> {
    fn resolve(mut self) -> Self {
        for _ in 0..64 {
            let Some(r) = self.node.get("$ref").and_then(Value::as_str) else {
                break;
            };
            match r
                .strip_prefix("#/$defs/")
                .and_then(|name| self.defs.get(name))
            {
                Some(n) => self.node = n,
                None => break,
            }
        }
        self
    }

    fn with(self, node: &'a Value) -> Self {
        Schema { node, ..self }.resolve()
    }
}

fn root_schema<T: JsonSchema>() -> Value {
    let schema = SchemaGenerator::default().into_root_schema_for::<T>();
    serde_json::to_value(schema).unwrap_or(Value::Null)
}

/// The root schema of a built-in kind (built once, on first use), or None for kinds apisim
/// has no schema for.
fn builtin_schema(group: &str, kind: &str) -> Option<&'static Value> {
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, authentication::v1 as authn,
        authorization::v1 as authz, autoscaling::v2 as autoscaling,
        coordination::v1 as coordination, core::v1 as core, events::v1 as events,
        networking::v1 as networking, policy::v1 as policy, rbac::v1 as rbac,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    macro_rules! cached {
        ($t:ty) => {{
            static SCHEMA: OnceLock<Value> = OnceLock::new();
            SCHEMA.get_or_init(root_schema::<$t>)
        }};
    }
    Some(match (group, kind) {
        ("", "Namespace") => cached!(core::Namespace),
        ("", "Pod") => cached!(core::Pod),
        ("", "Service") => cached!(core::Service),
        ("", "Node") => cached!(core::Node),
        ("", "ConfigMap") => cached!(core::ConfigMap),
        ("", "Secret") => cached!(core::Secret),
        ("", "ServiceAccount") => cached!(core::ServiceAccount),
        ("", "Event") => cached!(core::Event),
        ("events.k8s.io", "Event") => cached!(events::Event),
        ("apps", "Deployment") => cached!(apps::Deployment),
        ("apps", "ReplicaSet") => cached!(apps::ReplicaSet),
        ("coordination.k8s.io", "Lease") => cached!(coordination::Lease),
        ("policy", "PodDisruptionBudget") => cached!(policy::PodDisruptionBudget),
        ("networking.k8s.io", "NetworkPolicy") => cached!(networking::NetworkPolicy),
        ("autoscaling", "HorizontalPodAutoscaler") => cached!(autoscaling::HorizontalPodAutoscaler),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            cached!(apiext::CustomResourceDefinition)
        }
        ("rbac.authorization.k8s.io", "Role") => cached!(rbac::Role),
        ("rbac.authorization.k8s.io", "RoleBinding") => cached!(rbac::RoleBinding),
        ("rbac.authorization.k8s.io", "ClusterRole") => cached!(rbac::ClusterRole),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => cached!(rbac::ClusterRoleBinding),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            cached!(admission::MutatingWebhookConfiguration)
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            cached!(admission::ValidatingWebhookConfiguration)
        }
        ("authentication.k8s.io", "TokenReview") => cached!(authn::TokenReview),
        ("authorization.k8s.io", "SubjectAccessReview") => cached!(authz::SubjectAccessReview),
        _ => return None,
    })
}

fn object_meta_schema() -> &'static Value {
    static META: OnceLock<Value> = OnceLock::new();
    META.get_or_init(root_schema::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>)
}

/// The list-map keys of built-in lists, by field name (the Go types' `listMapKey`s): how
/// server-side apply names their items. Other lists are atomic (items by index).
fn builtin_list_keys(field: &str, item: &Value) -> Option<&'static [&'static str]> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates"
        | "env"
        | "claims"
        | "webhooks" => &["name"],
        "hostAliases" | "podIPs" | "hostIPs" => &["ip"],
        "topologySpreadConstraints" => &["topologyKey", "whenUnsatisfiable"],
        "ports" if item.get("containerPort").is_some() => &["containerPort", "protocol"],
        "ports" => &["port", "protocol"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "ownerReferences" => &["uid"],
        "conditions" => &["type"],
        _ => return None,
    })
}

/// `k="v",k2=80`: a keyed list item's key as server-side apply prints it. A missing `protocol`
/// is its default, TCP; other missing keys print as "".
fn render_key(keys: &[&str], item: &Value) -> String {
    keys.iter()
        .map(|k| {
            let v = match item.get(*k) {
                Some(v) => v.to_string(),
                None if *k == "protocol" => "\"TCP\"".to_string(),
                None => "\"\"".to_string(),
            };
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn item_key(s: Schema<'_>, field: &str, item: &Value) -> Option<String> {
    if let Some(keys) = s.node["x-kubernetes-list-map-keys"].as_array()
        && s.node["x-kubernetes-list-type"] == "map"
    {
        let keys: Vec<&str> = keys.iter().filter_map(Value::as_str).collect();
        return Some(render_key(&keys, item));
    }
    if s.builtin {
        return builtin_list_keys(field, item).map(|keys| render_key(keys, item));
    }
    None
}

/// How the walk reports.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Every unknown field (the JSON decoder's warnings).
    All,
    /// Server-side apply's typed conversion: it visits an object's fields in Go's random map
    /// order and stops at the first unknown one, so it reports one unknown field per object,
    /// and the known fields visited after it go unchecked. apisim checks every known field
    /// and reports the first unknown field in name order: one of the answers the real server
    /// gives (the same, when no object has two unknown fields, or one and another below one
    /// of its known fields).
    FirstPerObject,
}

/// A step of the path being walked, borrowed (made into a [`Seg`] only for a field found).
#[derive(Clone, Copy)]
enum Step<'a> {
    Field(&'a str),
    Item {
        index: usize,
        item: &'a Value,
        list: Schema<'a>,
        field: &'a str,
    },
}

struct Walk {
    mode: Mode,
    found: Vec<FieldPath>,
}

impl Walk {
    fn report<'a>(&mut self, path: &[Step<'a>], k: &'a str) {
        let segs = path
            .iter()
            .chain(std::iter::once(&Step::Field(k)))
            .map(|st| match *st {
                Step::Field(f) => Seg::Field(f.to_string()),
                Step::Item {
                    index,
                    item,
                    list,
                    field,
                } => Seg::Item(index, item_key(list, field, item)),
            })
            .collect();
        self.found.push(FieldPath(segs));
    }

    fn value<'a>(
        &mut self,
        s: Schema<'a>,
        v: &'a Value,
        path: &mut Vec<Step<'a>>,
        field: &'a str,
        root: bool,
    ) {
        match v {
            Value::Object(m) => self.object(s, m, path, root),
            Value::Array(a) => {
                let Some(items) = s.node.get("items") else {
                    return;
                };
                let items = s.with(items);
                for (index, item) in a.iter().enumerate() {
                    if !item.is_object() && !item.is_array() {
                        continue;
                    }
                    path.push(Step::Item {
                        index,
                        item,
                        list: s,
                        field,
                    });
                    self.value(items, item, path, "", false);
                    path.pop();
                }
            }
            _ => {}
        }
    }

    fn object<'a>(
        &mut self,
        s: Schema<'a>,
        m: &'a serde_json::Map<String, Value>,
        path: &mut Vec<Step<'a>>,
        root: bool,
    ) {
        let props = s.node.get("properties").and_then(Value::as_object);
        let addl = s.node.get("additionalProperties");
        let embedded = root || s.node["x-kubernetes-embedded-resource"] == true;
        let preserve = s.node["x-kubernetes-preserve-unknown-fields"] == true;
        if props.is_none() && addl.is_none() && (s.builtin || preserve) {
            // free-form: FieldsV1, RawExtension, JSON; in a custom resource, only with
            // x-kubernetes-preserve-unknown-fields (structural pruning drops the rest)
            return;
        }
        let known = |k: &str| -> Option<Schema<'a>> {
            if let Some(p) = props.and_then(|p| p.get(k)) {
                return Some(s.with(p));
            }
            if embedded && k == "metadata" {
                let meta = object_meta_schema();
                return Some(
                    Schema {
                        node: meta,
                        defs: &meta["$defs"],
                        builtin: true,
                    }
                    .resolve(),
                );
            }
            match addl {
                Some(a) if a.is_object() => Some(s.with(a)),
                _ => None,
            }
        };
        let free = |k: &str| {
            addl == Some(&Value::Bool(true))
                || preserve
                || (embedded && (k == "apiVersion" || k == "kind"))
        };
        let mut reported = false;
        for (k, v) in m {
            match known(k) {
                Some(sub) => {
                    if v.is_object() || v.is_array() {
                        path.push(Step::Field(k));
                        self.value(sub, v, path, k, false);
                        path.pop();
                    }
                }
                None if free(k) => {}
                None if reported && self.mode == Mode::FirstPerObject => {}
                None => {
                    reported = true;
                    self.report(path, k);
                }
            }
        }
    }
}

fn walk(rt: &ResourceType, version: &str, obj: &Value, mode: Mode) -> Vec<FieldPath> {
    let mut w = Walk {
        mode,
        found: vec![],
    };
    let mut path = vec![];
    if rt.crd {
        let Some(schema) = rt.schemas.get(version) else {
            return vec![];
        };
        let s = Schema {
            node: schema,
            defs: &Value::Null,
            builtin: false,
        };
        w.value(s, obj, &mut path, "", true);
    } else if let Some(schema) = builtin_schema(&rt.group, &rt.kind) {
        let s = Schema {
            node: schema,
            defs: &schema["$defs"],
            builtin: true,
        };
        w.value(s, obj, &mut path, "", false);
    }
    w.found
}

/// Every unknown field of `obj` (a built-in kind's or a custom resource's), in name order.
pub fn unknown(rt: &ResourceType, version: &str, obj: &Value) -> Vec<FieldPath> {
    walk(rt, version, obj, Mode::All)
}

/// The unknown fields server-side apply reports for an applied configuration.
pub fn unknown_for_apply(rt: &ResourceType, version: &str, obj: &Value) -> Vec<FieldPath> {
    walk(rt, version, obj, Mode::FirstPerObject)
}

/// Removes the fields at `paths` (as returned by [`unknown`] for `obj`; only fields go, never
/// list items, so the paths stay valid as they are removed).
pub fn remove(obj: &mut Value, paths: &[FieldPath]) {
    fn at<'v>(v: &'v mut Value, segs: &[Seg]) -> Option<&'v mut Value> {
        segs.iter().try_fold(v, |cur, seg| match seg {
            Seg::Field(f) => cur.get_mut(f.as_str()),
            Seg::Item(i, _) => cur.get_mut(*i),
        })
    }
    for p in paths {
        if let Some((Seg::Field(f), parents)) = p.0.split_last()
            && let Some(m) = at(obj, parents).and_then(Value::as_object_mut)
        {
            m.remove(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    fn rt(group: &str, plural: &str) -> ResourceType {
        let reg = Registry::with_builtins();
        reg.types
            .get(&(group.to_string(), plural.to_string()))
            .map(|t| (**t).clone())
            .expect("built-in")
    }

    #[test]
    fn a_deployment_s_unknown_fields_are_found_at_any_depth_and_removed() {
        let dep = rt("apps", "deployments");
        let mut obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"a": "b"}, "bogusMeta": 1,
                "managedFields": [{"fieldsV1": {"f:spec": {}}}]},
            "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                        "whenUnsatisfiable": "ScheduleAnyway", "someUnknownField": "x"}],
                    "tolerations": [{"key": "a", "bogus": 1}],
                    "containers": [{"name": "c", "image": "i",
                        "resources": {"limits": {"cpu": "1"}},
                        "ports": [{"containerPort": 80, "bogusP": 1}]}]}}}});
        let found: Vec<String> = unknown(&dep, "v1", &obj)
            .iter()
            .map(FieldPath::decoder)
            .collect();
        assert_eq!(
            found,
            [
                "metadata.bogusMeta",
                "spec.template.spec.containers[0].ports[0].bogusP",
                "spec.template.spec.tolerations[0].bogus",
                "spec.template.spec.topologySpreadConstraints[0].someUnknownField",
            ]
        );
        let applied: Vec<String> = unknown_for_apply(&dep, "v1", &obj)
            .iter()
            .map(FieldPath::apply)
            .collect();
        assert_eq!(
            applied,
            [
                ".metadata.bogusMeta",
                ".spec.template.spec.containers[name=\"c\"].ports[containerPort=80,protocol=\"TCP\"].bogusP",
                ".spec.template.spec.tolerations[0].bogus",
                ".spec.template.spec.topologySpreadConstraints[topologyKey=\"zone\",whenUnsatisfiable=\"ScheduleAnyway\"].someUnknownField",
            ]
        );
        let paths = unknown(&dep, "v1", &obj);
        remove(&mut obj, &paths);
        assert!(unknown(&dep, "v1", &obj).is_empty());
        assert_eq!(obj["metadata"]["labels"]["a"], "b");
        assert_eq!(
            obj["spec"]["template"]["spec"]["containers"][0]["ports"][0],
            json!({"containerPort": 80})
        );
    }

    #[test]
    fn apply_reports_one_unknown_field_per_object() {
        let cm = rt("", "configmaps");
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
            "data": {"k": "v", "known": {"nested": 1}}, "zz": 1, "aa": {"nested": 1},
            "metadata": {"name": "x", "bogus": 1}});
        let applied: Vec<String> = unknown_for_apply(&cm, "v1", &obj)
            .iter()
            .map(FieldPath::apply)
            .collect();
        assert_eq!(applied, [".aa", ".metadata.bogus"]);
        assert_eq!(unknown(&cm, "v1", &obj).len(), 3);
    }

    #[test]
    fn known_objects_have_no_unknown_fields() {
        let crd = rt("apiextensions.k8s.io", "customresourcedefinitions");
        let obj = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "ws.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"kind": "W", "plural": "ws"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "properties": {"spec": {"type": "object", "default": {"a": 1},
                            "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
        assert!(unknown(&crd, "v1", &obj).is_empty());
    }
}
