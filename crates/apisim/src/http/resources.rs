//! The resource routes: get, list (selectors, pagination, Tables), watch, create, update,
//! delete and deletecollection of one kind, after checking that the route names a served
//! kind, scope and subresource.

use super::decode::{
    check_ns, check_type, delete_opts, dry_run, manager, parse_body, wants_partial, wants_table,
};
use super::discovery::not_found_resource;
use super::field_validation::{
    drop_unknown, field_validation, strict_decoding_error, with_warnings,
};
use super::patch_request::patch_request;
use super::route::{ResRoute, is_watch};
use super::scale::{scale_of, scale_write};
use super::{Query, json_response, partial, present};
use crate::error::{ApiError, FieldError};
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Managed, WriteCtx};
use crate::util::{self, meta_str};
use crate::validation;
use crate::{Inner, ResponseBody};
use http::{HeaderMap, Method, Response};
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) fn resource_request(
    inner: &Arc<Inner>,
    method: &Method,
    headers: &HeaderMap,
    r: ResRoute,
    q: &Query,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let rt = {
        let st = inner.state.lock();
        st.reg
            .find(&r.group, &r.version, &r.plural)
            .cloned()
            .ok_or_else(not_found_resource)?
    };
    if (rt.namespaced && r.ns.is_none() && (r.name.is_some() || *method == Method::POST))
        || (!rt.namespaced && r.ns.is_some())
    {
        return Err(not_found_resource());
    }
    if let Some(ns) = &r.ns
        && !validation::is_label(ns)
    {
        return Err(ApiError::not_found("", "namespaces", ns));
    }
    if rt.create_only && (*method != Method::POST || r.name.is_some()) {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    match r.sub.as_deref() {
        None => {}
        Some("status") if rt.status => {}
        Some("scale") if rt.scale.is_some() => {}
        Some(_) => return Err(not_found_resource()),
    }
    let version = r.version.clone();
    let ns = r.ns.clone().unwrap_or_default();
    let name = r.name.clone();
    match (method.clone(), name) {
        (Method::GET | Method::HEAD, Some(name)) => {
            let st = inner.state.lock();
            let obj = st
                .get(&rt.key(), &ns, &name)
                .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, &name))?;
            if r.sub.as_deref() == Some("scale") {
                return Ok(json_response(200, &scale_of(&rt, obj)));
            }
            if wants_partial(headers) {
                return Ok(json_response(200, &partial(obj)));
            }
            let o = present(obj, &rt, &version);
            if wants_table(headers) {
                return Ok(json_response(
                    200,
                    &crate::table::table(&rt, &[o], &st.rv.to_string(), None),
                ));
            }
            Ok(json_response(200, &o))
        }
        (Method::GET | Method::HEAD, None) => {
            if is_watch(q) {
                return crate::watch::start(
                    wants_partial(headers),
                    inner.clone(),
                    rt,
                    version,
                    r.ns.clone(),
                    q,
                );
            }
            list(inner, headers, &rt, &version, r.ns.as_deref(), q)
        }
        (Method::POST, None) => {
            let mut obj = parse_body(headers, body)?;
            check_type(&rt, &version, &mut obj, false)?;
            check_ns(&rt, &r, &obj)?;
            if !meta_str(&obj, "resourceVersion").is_empty() {
                return Err(ApiError::internal(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            if rt.create_only {
                let st = inner.state.lock();
                let out = crate::review::review(&st, &rt, obj)?;
                return Ok(json_response(201, &out));
            }
            let warnings = drop_unknown(&rt, &version, &mut obj, field_validation(q)?, |p| {
                strict_decoding_error(&rt, &version, p)
            })?;
            let ctx = WriteCtx {
                dry_run: dry_run(q)?,
                managed: Managed::Update(manager(q, headers)?),
                version: version.clone(),
            };
            let out = inner.state.lock().create(&rt, r.ns.as_deref(), obj, &ctx)?;
            Ok(with_warnings(
                json_response(201, &present(&out, &rt, &version)),
                &warnings,
            ))
        }
        (Method::PUT, Some(name)) => {
            let mut obj = parse_body(headers, body)?;
            let ctx = WriteCtx {
                dry_run: dry_run(q)?,
                managed: Managed::Update(manager(q, headers)?),
                version: version.clone(),
            };
            if r.sub.as_deref() == Some("scale") {
                let mut st = inner.state.lock();
                return scale_write(&mut st, &rt, &ns, &name, None, Some(obj), &ctx);
            }
            check_type(&rt, &version, &mut obj, false)?;
            let warnings = drop_unknown(&rt, &version, &mut obj, field_validation(q)?, |p| {
                strict_decoding_error(&rt, &version, p)
            })?;
            check_ns(&rt, &r, &obj)?;
            if rt.crd && meta_str(&obj, "resourceVersion").is_empty() {
                // custom resources don't allow unconditional updates
                return Err(ApiError::invalid(
                    &rt.kind_qualified(),
                    &rt.group,
                    &rt.kind,
                    &name,
                    vec![FieldError::invalid(
                        "metadata.resourceVersion",
                        &json!("0x0"),
                        "must be specified for an update",
                    )],
                ));
            }
            let sub = r.sub.clone().unwrap_or_default();
            let out = inner
                .state
                .lock()
                .update(&rt, &ns, &name, &sub, obj, &ctx)?;
            Ok(with_warnings(
                json_response(200, &present(&out, &rt, &version)),
                &warnings,
            ))
        }
        (Method::PATCH, Some(name)) => patch_request(inner, headers, &rt, &r, &name, q, body),
        (Method::DELETE, Some(name)) => {
            let opts = delete_opts(q, body)?;
            let mut st = inner.state.lock();
            let out = st.delete(&rt, &ns, &name, &opts)?;
            let removed = !opts.dry_run
                && st
                    .get(&rt.key(), if rt.namespaced { &ns } else { "" }, &name)
                    .is_none();
            drop(st);
            // like kube-apiserver: most kinds answer an immediate deletion with a Status,
            // pods, services and custom resources with the deleted object
            let returns_object =
                rt.crd || (rt.group.is_empty() && (rt.plural == "pods" || rt.plural == "services"));
            if removed && !returns_object {
                return Ok(json_response(
                    200,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": out["metadata"]["uid"]},
                    }),
                ));
            }
            Ok(json_response(200, &present(&out, &rt, &version)))
        }
        (Method::DELETE, None) => {
            let opts = delete_opts(q, body)?;
            let ls =
                LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
            let fs = FieldSelector::parse(
                q.get("fieldSelector").map(String::as_str).unwrap_or(""),
                &rt.group,
                &rt.plural,
            )?;
            let mut st = inner.state.lock();
            let targets: Vec<Arc<Value>> = st
                .list(&rt.key(), r.ns.as_deref())
                .into_iter()
                .filter(|o| ls.matches(o) && fs.matches(o))
                .collect();
            let mut items = vec![];
            for o in targets {
                if let Ok(d) =
                    st.delete(&rt, meta_str(&o, "namespace"), meta_str(&o, "name"), &opts)
                {
                    items.push(present(&d, &rt, &version));
                }
            }
            let v = json!({
                "kind": rt.list_kind, "apiVersion": rt.api_version(&version),
                "metadata": {"resourceVersion": st.rv.to_string()}, "items": items,
            });
            Ok(json_response(200, &v))
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

fn list(
    inner: &Inner,
    headers: &HeaderMap,
    rt: &ResourceType,
    version: &str,
    ns: Option<&str>,
    q: &Query,
) -> Result<Response<ResponseBody>, ApiError> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fs = FieldSelector::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &rt.group,
        &rt.plural,
    )?;
    let limit: usize = match q.get("limit").map(String::as_str) {
        None | Some("") | Some("0") => 0,
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
    };
    let start: Option<(String, String)> = match q.get("continue").map(String::as_str) {
        None | Some("") => None,
        Some(c) => {
            let d = util::hex_decode(c).ok_or_else(|| {
                ApiError::bad_request("continue key is not valid: illegal base64 data")
            })?;
            let mut it = d.splitn(3, '\0');
            match (it.next(), it.next(), it.next()) {
                (Some(_rv), Some(n), Some(name)) => Some((n.to_string(), name.to_string())),
                _ => return Err(ApiError::bad_request("continue key is not valid")),
            }
        }
    };
    // only Arc clones under the lock; filtering and copying happen after
    let (rv, all) = {
        let st = inner.state.lock();
        (st.rv.to_string(), st.list(&rt.key(), ns))
    };
    let mut matched = all
        .into_iter()
        .filter(|o| {
            start.as_ref().is_none_or(|(sn, sname)| {
                (meta_str(o, "namespace"), meta_str(o, "name")) > (sn.as_str(), sname.as_str())
            })
        })
        .filter(|o| ls.matches(o) && fs.matches(o));
    let mut items = vec![];
    let mut cont = None;
    let mut remaining = 0usize;
    for o in matched.by_ref() {
        if limit > 0 && items.len() == limit {
            remaining = 1;
            break;
        }
        items.push(present(&o, rt, version));
    }
    if remaining > 0 {
        remaining += matched.count();
        if let Some(last) = items.last() {
            cont = Some(util::hex_encode(&format!(
                "{rv}\0{}\0{}",
                meta_str(last, "namespace"),
                meta_str(last, "name")
            )));
        }
    }
    if wants_table(headers) {
        return Ok(json_response(
            200,
            &crate::table::table(rt, &items, &rv, cont.as_deref()),
        ));
    }
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    if wants_partial(headers) {
        let items: Vec<Value> = items.iter().map(partial).collect();
        let v = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
        return Ok(json_response(200, &v));
    }
    let v = json!({"kind": rt.list_kind, "apiVersion": rt.api_version(version), "metadata": meta, "items": items});
    Ok(json_response(200, &v))
}
