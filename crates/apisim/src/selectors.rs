//! Label selectors (the query syntax and `metav1.LabelSelector` objects) and field
//! selectors (metadata.name, metadata.namespace and the fields each kind can be selected
//! by), parsed with kube-apiserver's error messages and matched against objects.

use crate::error::ApiError;
use crate::util::re;
use crate::validation::{key_error, label_value_error};
use regex::Regex;
use serde_json::Value;
use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq)]
pub enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector(pub Vec<LabelReq>);

fn split_top(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = vec![];
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        static SET: OnceLock<Regex> = OnceLock::new();
        let set = re(&SET, r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*$");
        let bad = |r: &str, why: &str| {
            ApiError::bad_request(format!("unable to parse requirement: {r}: {why}"))
        };
        for raw in split_top(s) {
            let r = raw.trim();
            if r.is_empty() {
                return Err(bad(r, "found '', expected: identifier"));
            }
            let check_key = |k: &str| -> Result<String, ApiError> {
                let k = k.trim();
                match key_error(k) {
                    Some(e) => Err(ApiError::bad_request(format!(
                        "unable to parse requirement: values[0][{k}]: Invalid value: \"{k}\": {e}"
                    ))),
                    None => Ok(k.to_string()),
                }
            };
            let check_val = |v: &str| -> Result<String, ApiError> {
                let v = v.trim();
                match label_value_error(v) {
                    Some(e) => Err(ApiError::bad_request(format!(
                        "unable to parse requirement: Invalid value: \"{v}\": {e}"
                    ))),
                    None => Ok(v.to_string()),
                }
            };
            if let Some(c) = set.captures(r) {
                let key = check_key(&c[1])?;
                let vals = c[3]
                    .split(',')
                    .map(&check_val)
                    .collect::<Result<Vec<_>, _>>()?;
                reqs.push(if &c[2] == "in" {
                    LabelReq::In(key, vals)
                } else {
                    LabelReq::NotIn(key, vals)
                });
            } else if let Some(k) = r.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(check_key(k)?));
            } else if let Some((k, v)) = r.split_once("!=") {
                reqs.push(LabelReq::Ne(check_key(k)?, check_val(v)?));
            } else if let Some((k, v)) = r.split_once("==") {
                reqs.push(LabelReq::Eq(check_key(k)?, check_val(v)?));
            } else if let Some((k, v)) = r.split_once('=') {
                reqs.push(LabelReq::Eq(check_key(k)?, check_val(v)?));
            } else if r.contains(['(', ')', ' ', '<', '>']) {
                return Err(bad(r, "invalid syntax"));
            } else {
                reqs.push(LabelReq::Exists(check_key(r)?));
            }
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }

    /// From a `metav1.LabelSelector` object (matchLabels + matchExpressions).
    pub fn from_object(sel: &Value) -> LabelSelector {
        let mut reqs = vec![];
        if let Some(m) = sel["matchLabels"].as_object() {
            for (k, v) in m {
                reqs.push(LabelReq::Eq(
                    k.clone(),
                    v.as_str().unwrap_or("").to_string(),
                ));
            }
        }
        if let Some(es) = sel["matchExpressions"].as_array() {
            for e in es {
                let k = e["key"].as_str().unwrap_or("").to_string();
                let vals: Vec<String> = e["values"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                match e["operator"].as_str().unwrap_or("") {
                    "In" => reqs.push(LabelReq::In(k, vals)),
                    "NotIn" => reqs.push(LabelReq::NotIn(k, vals)),
                    "Exists" => reqs.push(LabelReq::Exists(k)),
                    "DoesNotExist" => reqs.push(LabelReq::NotExists(k)),
                    _ => {}
                }
            }
        }
        LabelSelector(reqs)
    }

    pub fn to_query(&self) -> String {
        self.0
            .iter()
            .map(|r| match r {
                LabelReq::Eq(k, v) => format!("{k}={v}"),
                LabelReq::Ne(k, v) => format!("{k}!={v}"),
                LabelReq::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                LabelReq::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                LabelReq::Exists(k) => k.clone(),
                LabelReq::NotExists(k) => format!("!{k}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// Extra field selector keys per (group, plural), beyond metadata.name/namespace.
fn extra_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
        ],
        ("apps", "replicasets") => &["status.replicas"],
        _ => &[],
    }
}

/// kube-apiserver's answer to a field selector on a field it cannot select by: kinds with
/// field label conversions of their own (and custom resources) say "field label not
/// supported", the others that only metadata.name and metadata.namespace are known.
fn unsupported_field_label(group: &str, plural: &str, k: &str) -> String {
    const BUILTIN_GROUPS: &[&str] = &[
        "",
        "apps",
        "events.k8s.io",
        "coordination.k8s.io",
        "policy",
        "networking.k8s.io",
        "autoscaling",
        "apiextensions.k8s.io",
        "rbac.authorization.k8s.io",
        "admissionregistration.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
    ];
    let own_conversion = matches!(
        (group, plural),
        (
            "",
            "pods" | "nodes" | "events" | "namespaces" | "secrets" | "services"
        ) | ("events.k8s.io", "events")
    );
    if own_conversion || !BUILTIN_GROUPS.contains(&group) {
        format!("field label not supported: {k}")
    } else {
        format!(
            "\"{k}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    }
}

impl FieldSelector {
    pub fn parse(s: &str, group: &str, plural: &str) -> Result<FieldSelector, ApiError> {
        let mut out = vec![];
        for raw in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = raw.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = raw.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = raw.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{raw}'"
                )));
            };
            let k = k.trim();
            if k != "metadata.name"
                && k != "metadata.namespace"
                && !extra_fields(group, plural).contains(&k)
            {
                return Err(ApiError::bad_request(unsupported_field_label(
                    group, plural, k,
                )));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let mut cur = obj;
            let path: Vec<&str> = if k == "source" {
                vec!["source", "component"]
            } else {
                k.split('.').collect()
            };
            for p in path {
                cur = &cur[p];
            }
            let actual = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (actual == *v) == *eq
        })
    }
}
