//! PATCH requests: JSON, merge and strategic merge patches applied to the served object,
//! server-side apply (which may create the object), and patches through `/scale`.

use super::decode::{check_ns, check_type, content_type, dry_run, manager, parse_body};
use super::field_validation::{
    apply_unknown_error, drop_unknown, field_validation, go_format, strict_patch_error,
    with_warnings,
};
use super::route::ResRoute;
use super::scale::scale_write;
use super::{Query, json_response, present};
use crate::error::{ApiError, FieldError};
use crate::registry::ResourceType;
use crate::store::{Managed, WriteCtx};
use crate::util::{self, meta_str};
use crate::{Inner, ResponseBody, apply, patch};
use http::{HeaderMap, Response};
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) fn patch_request(
    inner: &Arc<Inner>,
    headers: &HeaderMap,
    rt: &ResourceType,
    r: &ResRoute,
    name: &str,
    q: &Query,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let ct = content_type(headers);
    let version = r.version.as_str();
    let ns = r.ns.clone().unwrap_or_default();
    let sub = r.sub.clone().unwrap_or_default();
    let dry = dry_run(q)?;
    let accepted = if rt.crd {
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    } else {
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
    };
    let unsupported = || {
        ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format - accepted media types include: {accepted}"
        ))
    };
    if ct == "application/apply-patch+yaml" {
        let mgr = q
            .get("fieldManager")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "PatchOptions.meta.k8s.io",
                    "meta.k8s.io",
                    "PatchOptions",
                    "",
                    vec![FieldError::required(
                        "fieldManager",
                        "is required for apply patch",
                    )],
                )
            })?;
        if sub == "scale" {
            return Err(unsupported());
        }
        let force = q.get("force").map(String::as_str) == Some("true");
        let mut applied = parse_body(headers, body)?;
        check_type(rt, version, &mut applied, true)?;
        if let Some(e) = apply_unknown_error(rt, version, &applied) {
            return Err(e);
        }
        check_ns(rt, r, &applied)?;
        let body_name = meta_str(&applied, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        util::meta_mut(&mut applied).insert("name".into(), json!(name));
        let ctx = WriteCtx {
            dry_run: dry,
            managed: Managed::Keep,
            version: version.to_string(),
        };
        let mut st = inner.state.lock();
        let live = st
            .get(&rt.key(), if rt.namespaced { &ns } else { "" }, name)
            .cloned();
        let av = rt.api_version(version);
        return match live {
            None => {
                if !sub.is_empty() {
                    return Err(ApiError::not_found(&rt.group, &rt.plural, name));
                }
                let obj = patch::with_list_keys(crate::store::cr_list_keys(rt, version), || {
                    apply::server_side_apply(None, &applied, mgr, force, &av, "", rt.status)
                })?;
                let out = st.create(rt, r.ns.as_deref(), obj, &ctx)?;
                Ok(json_response(201, &present(&out, rt, version)))
            }
            Some(live) => {
                let live = present(&live, rt, version);
                let obj = patch::with_list_keys(crate::store::cr_list_keys(rt, version), || {
                    apply::server_side_apply(
                        Some(&live),
                        &applied,
                        mgr,
                        force,
                        &av,
                        &sub,
                        rt.status,
                    )
                })?;
                let out = st.update(rt, &ns, name, &sub, obj, &ctx)?;
                Ok(json_response(200, &present(&out, rt, version)))
            }
        };
    }
    let fv = field_validation(q)?;
    let ctx = WriteCtx {
        dry_run: dry,
        managed: Managed::Update(manager(q, headers)?),
        version: version.to_string(),
    };
    let apply_patch = |doc: &mut Value| -> Result<(), ApiError> {
        match ct.as_str() {
            "application/json-patch+json" => patch::json_patch(doc, body),
            "application/merge-patch+json" => {
                let p: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(doc, &p);
                Ok(())
            }
            "application/strategic-merge-patch+json" if !rt.crd => {
                let p: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                if !p.is_object() {
                    return Err(ApiError::bad_request(
                        "strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic_merge(doc, &p);
                Ok(())
            }
            _ => Err(unsupported()),
        }
    };
    let mut st = inner.state.lock();
    if sub == "scale" {
        return scale_write(&mut st, rt, &ns, name, Some(&apply_patch), None, &ctx);
    }
    let cur = st
        .get(&rt.key(), if rt.namespaced { &ns } else { "" }, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    let mut doc = present(&cur, rt, version);
    apply_patch(&mut doc)?;
    if !doc.is_object() {
        return Err(ApiError::bad_request("patch result is not an object"));
    }
    match &doc["metadata"] {
        Value::Object(_) => {}
        Value::Null => doc["metadata"] = json!({}),
        _ => return Err(ApiError::bad_request("metadata must be an object")),
    }
    check_type(rt, version, &mut doc, false)?;
    let warnings = drop_unknown(rt, version, &mut doc, fv, |p| {
        let value = if ct == "application/strategic-merge-patch+json" {
            serde_json::from_slice(body)
                .map(|v: Value| go_format(&v))
                .unwrap_or_default()
        } else {
            // the patched object, unknown fields included
            let mut d = present(&cur, rt, version);
            let _ = apply_patch(&mut d);
            d.to_string()
        };
        strict_patch_error(value, p)
    })?;
    let out = st.update(rt, &ns, name, &sub, doc, &ctx)?;
    Ok(with_warnings(
        json_response(200, &present(&out, rt, version)),
        &warnings,
    ))
}
