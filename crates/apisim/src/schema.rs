//! Structural-schema handling for custom resources: defaulting, pruning, validation.

use crate::error::{FieldError, show};
use regex::Regex;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

fn preserve(s: &Value) -> bool {
    s["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

fn int_or_string(s: &Value) -> bool {
    s["x-kubernetes-int-or-string"].as_bool() == Some(true)
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// Apply defaults and prune unknown fields (root: skips apiVersion/kind/metadata).
pub fn default_and_prune(
    schema: &Value,
    v: &mut Value,
    root: bool,
    path: &str,
    pruned: &mut Vec<String>,
) {
    match v {
        Value::Object(m) => {
            let props = schema["properties"].as_object();
            let addl = &schema["additionalProperties"];
            // defaults
            if let Some(props) = props {
                for (k, ps) in props {
                    if root && (k == "apiVersion" || k == "kind" || k == "metadata") {
                        continue;
                    }
                    if !m.contains_key(k)
                        && let Some(d) = ps.get("default")
                    {
                        m.insert(k.clone(), d.clone());
                    }
                }
            }
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if root && (k == "apiVersion" || k == "kind" || k == "metadata") {
                    continue;
                }
                let sub = props.and_then(|p| p.get(&k));
                match sub {
                    Some(ps) => {
                        if let Some(c) = m.get_mut(&k) {
                            default_and_prune(ps, c, false, &join(path, &k), pruned);
                        }
                    }
                    None => {
                        if addl.is_object() {
                            if let Some(c) = m.get_mut(&k) {
                                default_and_prune(addl, c, false, &join(path, &k), pruned);
                            }
                        } else if addl.as_bool() == Some(true) || preserve(schema) {
                            // keep as is
                        } else {
                            m.remove(&k);
                            pruned.push(join(path, &k));
                        }
                    }
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, it) in a.iter_mut().enumerate() {
                    default_and_prune(items, it, false, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

fn regex_cached(p: &str) -> Option<Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
    let c = CACHE.get_or_init(Default::default);
    let mut g = c.lock().unwrap_or_else(|e| e.into_inner());
    g.entry(p.to_string())
        .or_insert_with(|| Regex::new(p).ok())
        .clone()
}

/// A schema bound as apiserver prints it (`0`, not `0.0`).
fn num(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Validate a value against a schema, collecting field errors.
pub fn validate(schema: &Value, v: &Value, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        if schema["nullable"].as_bool() == Some(true) || schema.get("type").is_none() {
            return;
        }
        errs.push(FieldError::other(
            "FieldValueTypeInvalid",
            path,
            format!(
                "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema["type"].as_str().unwrap_or("object")
            ),
        ));
        return;
    }
    if int_or_string(schema) {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errs.push(FieldError::other(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: {}: {path} in body must be of type int-or-string: \"{}\"",
                    show(v),
                    type_name(v)
                ),
            ));
            return;
        }
        // A string goes on to the string keywords below (`pattern` on a quantity), as in
        // the real server; an integer has none to meet.
        if !v.is_string() {
            return;
        }
    }
    if let Some(t) = schema["type"].as_str() {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            _ => true,
        };
        if !ok {
            errs.push(FieldError::other(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: {}: {path} in body must be of type {t}: \"{}\"",
                    show(v),
                    type_name(v)
                ),
            ));
            return;
        }
        if t == "integer" {
            let (lo, hi) = match schema["format"].as_str() {
                Some("int32") => (i32::MIN as f64, i32::MAX as f64),
                _ => (i64::MIN as f64, i64::MAX as f64),
            };
            if let Some(f) = v.as_f64()
                && (f < lo || f > hi)
            {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be within {} range",
                        schema["format"].as_str().unwrap_or("int64")
                    ),
                ));
            }
        }
    }
    if let Some(en) = schema["enum"].as_array()
        && !en.contains(v)
    {
        let sup: Vec<String> = en.iter().map(|e| e.to_string()).collect();
        errs.push(FieldError::other(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                show(v),
                sup.join(", ")
            ),
        ));
    }
    if let Some(n) = v.as_f64() {
        let excl_min = schema["exclusiveMinimum"].as_bool() == Some(true);
        let excl_max = schema["exclusiveMaximum"].as_bool() == Some(true);
        if let Some(min) = schema["minimum"].as_f64() {
            if excl_min && n <= min {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be greater than {}",
                        num(&schema["minimum"])
                    ),
                ));
            } else if !excl_min && n < min {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be greater than or equal to {}",
                        num(&schema["minimum"])
                    ),
                ));
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            if excl_max && n >= max {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be less than {}",
                        num(&schema["maximum"])
                    ),
                ));
            } else if !excl_max && n > max {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be less than or equal to {}",
                        num(&schema["maximum"])
                    ),
                ));
            }
        }
    }
    if let Some(s) = v.as_str() {
        let len = s.chars().count() as u64;
        if let Some(max) = schema["maxLength"].as_u64()
            && len > max
        {
            errs.push(FieldError::other(
                "FieldValueTooLong",
                path,
                format!("Too long: may not be more than {max} bytes"),
            ));
        }
        if let Some(min) = schema["minLength"].as_u64()
            && len < min
        {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some(p) = schema["pattern"].as_str()
            && let Some(re) = regex_cached(p)
            && !re.is_match(s)
        {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!("{path} in body should match '{p}'"),
            ));
        }
    }
    if let Some(a) = v.as_array() {
        if let Some(max) = schema["maxItems"].as_u64()
            && a.len() as u64 > max
        {
            errs.push(FieldError::other(
                "FieldValueTooMany",
                path,
                format!("Too many: {}: must have at most {max} items", a.len()),
            ));
        }
        if let Some(min) = schema["minItems"].as_u64()
            && (a.len() as u64) < min
        {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!("{path} in body should have at least {min} items"),
            ));
        }
        if let Some(items) = schema.get("items") {
            for (i, it) in a.iter().enumerate() {
                validate(items, it, &format!("{path}[{i}]"), false, errs);
            }
        }
    }
    if let Some(m) = v.as_object() {
        if let Some(req) = schema["required"].as_array() {
            for r in req.iter().filter_map(Value::as_str) {
                if !m.contains_key(r) {
                    errs.push(FieldError::required(&join(path, r), ""));
                }
            }
        }
        let props = schema["properties"].as_object();
        for (k, c) in m {
            if root && (k == "apiVersion" || k == "kind" || k == "metadata") {
                continue;
            }
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(ps, c, &join(path, k), false, errs),
                None => {
                    if schema["additionalProperties"].is_object() {
                        validate(
                            &schema["additionalProperties"],
                            c,
                            &join(path, k),
                            false,
                            errs,
                        );
                    }
                }
            }
        }
        if let Some(max) = schema["maxProperties"].as_u64()
            && m.len() as u64 > max
        {
            errs.push(FieldError::other(
                "FieldValueTooMany",
                path,
                format!("Too many: {}: must have at most {max} items", m.len()),
            ));
        }
    }
}

/// Default, prune and validate a custom resource. Returns field errors and pruned paths.
pub fn process(schema: &Value, obj: &mut Value) -> (Vec<FieldError>, Vec<String>) {
    let mut pruned = vec![];
    default_and_prune(schema, obj, true, "", &mut pruned);
    let mut errs = vec![];
    validate(schema, obj, "", true, &mut errs);
    (errs, pruned)
}

/// An empty object schema that keeps everything (used when a CRD version has no schema).
pub fn permissive() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// List field name -> first map key, for `x-kubernetes-list-type: map` lists in a schema.
pub fn list_keys(schema: &Value) -> std::collections::HashMap<String, String> {
    fn rec(s: &Value, out: &mut std::collections::HashMap<String, String>) {
        if let Some(props) = s["properties"].as_object() {
            for (name, ps) in props {
                if ps["x-kubernetes-list-type"] == "map"
                    && let Some(k) = ps["x-kubernetes-list-map-keys"]
                        .as_array()
                        .and_then(|a| a.first())
                        .and_then(Value::as_str)
                {
                    out.insert(name.clone(), k.to_string());
                }
                rec(ps, out);
            }
        }
        if let Some(items) = s.get("items") {
            rec(items, out);
        }
        if s["additionalProperties"].is_object() {
            rec(&s["additionalProperties"], out);
        }
    }
    let mut out = std::collections::HashMap::new();
    rec(schema, &mut out);
    out
}
