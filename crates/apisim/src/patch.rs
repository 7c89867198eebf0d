//! Patch semantics: RFC 7386 merge patch, RFC 6902 JSON patch and strategic merge patch,
//! with the list merge keys (a fixed table for built-in kinds, the schema's list-map keys
//! for custom resources) that strategic merge and server-side apply share.

use crate::error::ApiError;
use serde_json::{Value, json};

thread_local! {
    /// For custom resources: list field name -> map key, from the schema's
    /// `x-kubernetes-list-type: map` / `x-kubernetes-list-map-keys` (other lists are atomic).
    static CR_LIST_KEYS: std::cell::RefCell<Option<std::collections::HashMap<String, String>>> =
        const { std::cell::RefCell::new(None) };
}

/// Run `f` with the list-map keys of a custom resource's schema in effect (None: built-in
/// kind, the fixed name table applies).
pub fn with_list_keys<R>(
    keys: Option<std::collections::HashMap<String, String>>,
    f: impl FnOnce() -> R,
) -> R {
    let prev = CR_LIST_KEYS.with(|k| k.replace(keys));
    let r = f();
    CR_LIST_KEYS.with(|k| k.replace(prev));
    r
}

/// The merge key of a list field (strategic merge patch / SSA list-map), by field name.
pub fn merge_key(field: &str, items: &[Value]) -> Option<String> {
    if field != "ownerReferences" {
        let cr = CR_LIST_KEYS.with(|k| k.borrow().as_ref().map(|m| m.get(field).cloned()));
        if let Some(key) = cr {
            return key.filter(|_| items.iter().all(|i| i.is_object()));
        }
    }
    let k = match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => "name",
        "ports" => {
            if items.iter().any(|i| i.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            }
        }
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ownerReferences" => "uid",
        "conditions" => "type",
        "hostAliases" => "ip",
        _ => return None,
    };
    if items.iter().all(|i| i.is_object()) {
        Some(k.to_string())
    } else {
        None
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    // like kube-apiserver: a patch that is JSON but not a valid JSON patch (an unknown op), or
    // that fails to apply (a failed test, a missing path), is 422 with no more detail
    let rejected = || {
        ApiError::new(
            422,
            "the server rejected our request due to an error in our request",
        )
        .with_details(serde_json::json!({}))
    };
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let p: json_patch::Patch = serde_json::from_value(v).map_err(|_| rejected())?;
    json_patch::patch(doc, &p.0).map_err(|_| rejected())
}

/// Approximate strategic merge patch (see the crate docs).
pub fn strategic_merge(doc: &mut Value, patch: &Value) {
    strategic(doc, patch, "");
}

fn strategic(doc: &mut Value, patch: &Value, _field: &str) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut c = p.clone();
        c.remove("$patch");
        *doc = Value::Object(c);
        return;
    }
    if !doc.is_object() {
        *doc = json!({});
    }
    let Some(d) = doc.as_object_mut() else { return };
    // primitive list deletions
    for (k, v) in p {
        if let Some(f) = k.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(cur)), Some(del)) = (d.get_mut(f), v.as_array())
        {
            cur.retain(|x| !del.contains(x));
        }
    }
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            d.remove(k);
            continue;
        }
        match (d.get_mut(k), v) {
            (Some(cur @ Value::Object(_)), Value::Object(_)) => strategic(cur, v, k),
            (Some(Value::Array(cur)), Value::Array(items)) => {
                if let Some(mk) = merge_key(k, items).filter(|_| cur.iter().all(Value::is_object)) {
                    for item in items {
                        let key = &item[mk.as_str()];
                        let pos = cur.iter().position(|c| &c[mk.as_str()] == key);
                        let directive = item.get("$patch").and_then(Value::as_str);
                        match (pos, directive) {
                            (Some(i), Some("delete")) => {
                                cur.remove(i);
                            }
                            (None, Some("delete")) => {}
                            (Some(i), _) => strategic(&mut cur[i], item, k),
                            (None, _) => {
                                let mut n = Value::Null;
                                strategic(&mut n, item, k);
                                cur.push(n);
                            }
                        }
                    }
                } else if k == "finalizers" {
                    for i in items {
                        if !cur.contains(i) {
                            cur.push(i.clone());
                        }
                    }
                } else {
                    *cur = items.iter().map(strip_directives).collect();
                }
            }
            _ => {
                d.insert(k.clone(), strip_directives(v));
            }
        }
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        o => o.clone(),
    }
}
