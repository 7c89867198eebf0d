//! Request decoding: the body (JSON or YAML, checked against the URL's kind and namespace),
//! the query parameters of writes (fieldManager, dryRun, DeleteOptions) and the `Accept`
//! variants (PartialObjectMetadata, Table).

use super::Query;
use super::route::ResRoute;
use crate::error::{ApiError, FieldError};
use crate::registry::ResourceType;
use crate::store::DeleteOpts;
use crate::util::meta_str;
use http::{HeaderMap, header};
use serde_json::{Value, json};

pub(super) fn content_type(h: &HeaderMap) -> String {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_lowercase()
}

pub(super) fn parse_body(h: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type(h);
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad_request("the body of the request was empty"));
    }
    let v: Value = if ct.contains("yaml") {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => serde_yaml::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        }
    } else if ct.contains("protobuf") || ct.contains("cbor") {
        return Err(ApiError::unsupported_media(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        ));
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (not a valid JSON document): {e}"
            ))
        })?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    Ok(v)
}

/// Check apiVersion/kind/metadata of a body against the URL; fill them in when absent.
pub(super) fn check_type(
    rt: &ResourceType,
    version: &str,
    obj: &mut Value,
    require: bool,
) -> Result<(), ApiError> {
    let want_av = rt.api_version(version);
    match obj.get("apiVersion") {
        Some(Value::String(av)) if !av.is_empty() => {
            if *av != want_av {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        None | Some(Value::Null) if !require => {}
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "Object 'apiVersion' is missing in the request body",
            ));
        }
        Some(_) => return Err(ApiError::bad_request("apiVersion must be a string")),
    }
    match obj.get("kind") {
        Some(Value::String(k)) if !k.is_empty() => {
            if *k != rt.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({}) for {want_av}, Resource={}",
                    rt.kind, rt.plural
                )));
            }
        }
        None | Some(Value::Null) if !require => {}
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "Object 'Kind' is missing in the request body",
            ));
        }
        Some(_) => return Err(ApiError::bad_request("kind must be a string")),
    }
    obj["apiVersion"] = json!(want_av);
    obj["kind"] = json!(rt.kind);
    match &obj["metadata"] {
        Value::Null => {
            obj["metadata"] = json!({});
        }
        Value::Object(m) => {
            for k in [
                "name",
                "namespace",
                "generateName",
                "resourceVersion",
                "uid",
            ] {
                if let Some(v) = m.get(k)
                    && !v.is_string()
                    && !v.is_null()
                {
                    return Err(ApiError::bad_request(format!(
                        "metadata.{k} must be a string"
                    )));
                }
            }
        }
        _ => return Err(ApiError::bad_request("metadata must be an object")),
    }
    Ok(())
}

pub(super) fn check_ns(rt: &ResourceType, r: &ResRoute, obj: &Value) -> Result<(), ApiError> {
    let body_ns = meta_str(obj, "namespace");
    if rt.namespaced && !body_ns.is_empty() && Some(body_ns) != r.ns.as_deref() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

pub(super) fn manager(q: &Query, headers: &HeaderMap) -> Result<String, ApiError> {
    if let Some(m) = q.get("fieldManager") {
        if m.len() > 128 {
            return Err(ApiError::invalid(
                "PatchOptions.meta.k8s.io",
                "meta.k8s.io",
                "PatchOptions",
                "",
                vec![FieldError::invalid(
                    "fieldManager",
                    &json!(m),
                    "must be at most 128 characters",
                )],
            ));
        }
        if !m.is_empty() {
            return Ok(m.clone());
        }
    }
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    Ok(ua.split('/').next().unwrap_or("unknown").to_string())
}

pub(super) fn dry_run(q: &Query) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(o) => Err(ApiError::bad_request(format!(
            "Invalid dry run value: {o}; only \"All\" is supported"
        ))),
    }
}

pub(super) fn delete_opts(q: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let mut o = DeleteOpts::default();
    if !body.iter().all(|b| b.is_ascii_whitespace()) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if let Some(p) = v["propagationPolicy"].as_str() {
            o.propagation = Some(p.to_string());
        }
        if v["orphanDependents"].as_bool() == Some(true) && o.propagation.is_none() {
            o.propagation = Some("Orphan".into());
        }
        o.precondition_uid = v["preconditions"]["uid"].as_str().map(str::to_string);
        o.precondition_rv = v["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        if let Some(d) = v["dryRun"].as_array() {
            o.dry_run = d.iter().any(|x| x.as_str() == Some("All"));
        }
    }
    if let Some(p) = q.get("propagationPolicy") {
        o.propagation = Some(p.clone());
    }
    if q.get("orphanDependents").map(String::as_str) == Some("true") && o.propagation.is_none() {
        o.propagation = Some("Orphan".into());
    }
    if dry_run(q)? {
        o.dry_run = true;
    }
    Ok(o)
}

pub(super) fn wants_partial(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

pub(super) fn wants_table(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}
