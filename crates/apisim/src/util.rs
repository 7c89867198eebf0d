//! Small helpers: names, labels, selectors, query strings, time.

use crate::error::{ApiError, FieldError};
use regex::Regex;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::OnceLock;

fn re(cell: &'static OnceLock<Regex>, pat: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pat).unwrap_or_else(|_| unreachable!("constant regex")))
}

const SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const QNAME: &str = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";

pub fn is_subdomain(s: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    s.len() <= 253 && re(&R, SUBDOMAIN).is_match(s)
}

pub fn is_label(s: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    s.len() <= 63 && re(&R, LABEL).is_match(s)
}

fn is_qname(s: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, QNAME).is_match(s)
}

/// Error messages for an object name (empty when valid).
pub fn name_errors(name: &str, label: bool, field: &str) -> Vec<FieldError> {
    let v = json!(name);
    let mut errs = vec![];
    if label {
        if name.len() > 63 {
            errs.push(FieldError::invalid(
                field,
                &v,
                "must be no more than 63 characters",
            ));
        }
        static R: OnceLock<Regex> = OnceLock::new();
        if !re(&R, LABEL).is_match(name) {
            errs.push(FieldError::invalid(field, &v, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"));
        }
    } else {
        if name.len() > 253 {
            errs.push(FieldError::invalid(
                field,
                &v,
                "must be no more than 253 characters",
            ));
        }
        static R: OnceLock<Regex> = OnceLock::new();
        if !re(&R, SUBDOMAIN).is_match(name) {
            errs.push(FieldError::invalid(field, &v, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
        }
    }
    errs
}

/// Validate a qualified key (`prefix/name`) as used by labels and annotations.
pub fn key_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if !is_subdomain(p) {
            return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    if !is_qname(name) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

pub fn label_value_error(v: &str) -> Option<String> {
    if v.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    if !v.is_empty() && !is_qname(v) {
        return Some("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    None
}

/// Validate metadata labels and annotations.
pub fn meta_errors(obj: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    let meta = &obj["metadata"];
    match &meta["labels"] {
        Value::Null => {}
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(e) = key_error(k) {
                    errs.push(FieldError::invalid("metadata.labels", &json!(k), &e));
                }
                match v.as_str() {
                    Some(s) => {
                        if let Some(e) = label_value_error(s) {
                            errs.push(FieldError::invalid("metadata.labels", &json!(s), &e));
                        }
                    }
                    None => errs.push(FieldError::invalid(
                        "metadata.labels",
                        v,
                        "must be a string",
                    )),
                }
            }
        }
        other => errs.push(FieldError::invalid(
            "metadata.labels",
            other,
            "must be an object",
        )),
    }
    match &meta["annotations"] {
        Value::Null => {}
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(e) = key_error(&k.to_lowercase()) {
                    errs.push(FieldError::invalid("metadata.annotations", &json!(k), &e));
                }
                if !v.is_string() {
                    errs.push(FieldError::invalid(
                        "metadata.annotations",
                        v,
                        "must be a string",
                    ));
                }
            }
        }
        other => errs.push(FieldError::invalid(
            "metadata.annotations",
            other,
            "must be an object",
        )),
    }
    if let Some(f) = meta.get("finalizers")
        && !f.is_null()
        && !f.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    {
        errs.push(FieldError::invalid(
            "metadata.finalizers",
            f,
            "must be a list of strings",
        ));
    }
    if let Some(f) = meta.get("ownerReferences")
        && !f.is_null()
    {
        match f.as_array() {
            Some(a) => {
                for (i, o) in a.iter().enumerate() {
                    for k in ["apiVersion", "kind", "name", "uid"] {
                        if o[k].as_str().unwrap_or("").is_empty() {
                            errs.push(FieldError::required(
                                &format!("metadata.ownerReferences[{i}].{k}"),
                                "",
                            ));
                        }
                    }
                }
            }
            None => errs.push(FieldError::invalid(
                "metadata.ownerReferences",
                f,
                "must be a list",
            )),
        }
    }
    errs
}

/// 5 random lowercase alphanumeric characters (like apiserver's generateName suffix).
pub fn rand_suffix(n: usize) -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| CHARS[fastrand::usize(..CHARS.len())] as char)
        .collect()
}

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| jiff::Timestamp::now().to_string())
}

/// Percent-decode a query component.
pub fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match h {
                    Some(c) => {
                        out.push(c);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for part in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        m.insert(url_decode(k), url_decode(v));
    }
    m
}

// ---------------------------------------------------------------- selectors

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

/// Parse a `.spec.replicas`-style JSON path into segments.
pub fn json_path(p: &str) -> Vec<String> {
    p.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> &'a Value {
    let mut cur = v;
    for p in path {
        cur = &cur[p.as_str()];
    }
    cur
}

pub fn set_path(v: &mut Value, path: &[String], new: Value) {
    let mut cur = v;
    for p in path {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Some(m) = cur.as_object_mut() else { return };
        cur = m.entry(p.clone()).or_insert(Value::Null);
    }
    *cur = new;
}

/// A string field of `metadata`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

/// A stable short hash (FNV-1a, 64 bit).
pub fn fnv64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Encode a hash with the "safe" alphabet used for pod-template-hash values.
pub fn safe_encode(mut h: u64, n: usize) -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut s = String::new();
    for _ in 0..n {
        s.push(CHARS[(h % CHARS.len() as u64) as usize] as char);
        h /= CHARS.len() as u64;
    }
    s
}

pub fn hex_encode(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

pub fn hex_decode(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

/// ConfigMap/Secret data keys and values.
pub fn data_key_errors(obj: &Value) -> Vec<FieldError> {
    static R: OnceLock<Regex> = OnceLock::new();
    let r = re(&R, r"^[-._a-zA-Z0-9]+$");
    let secret = obj["kind"] == "Secret";
    let mut errs = vec![];
    for field in ["data", "binaryData", "stringData"] {
        match &obj[field] {
            Value::Null => {}
            Value::Object(m) => {
                for (k, v) in m {
                    let path = format!("{field}[{k}]");
                    if k.len() > 253 || !r.is_match(k) {
                        errs.push(FieldError::invalid(&path, &json!(k), "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
                    }
                    match v.as_str() {
                        None => errs.push(FieldError::invalid(&path, v, "must be a string")),
                        Some(s) if (secret && field == "data") || field == "binaryData" => {
                            if base64_decode(s).is_none() {
                                errs.push(FieldError::invalid(
                                    &path,
                                    &json!("<value omitted>"),
                                    "illegal base64 data",
                                ));
                            }
                        }
                        Some(_) => {}
                    }
                }
            }
            other => errs.push(FieldError::invalid(field, other, "must be an object")),
        }
    }
    errs
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        out.push(B64[(n >> 18) as usize & 63] as char);
        out.push(B64[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            B64[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            B64[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return None;
    }
    Some(out)
}
