//! What kube-apiserver checks of every object's names and metadata: DNS-1123 names,
//! qualified label and annotation keys, label values, finalizers, ownerReferences, and the
//! keys and values of ConfigMap and Secret data. Custom resources' own fields are checked
//! against their schema (`schema`).

use crate::error::FieldError;
use crate::util::{base64_decode, re};
use regex::Regex;
use serde_json::{Value, json};
use std::sync::OnceLock;

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
