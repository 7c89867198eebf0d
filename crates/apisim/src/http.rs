//! Routing and request handling.

use crate::error::{ApiError, FieldError};
use crate::faults::{AuditEvent, Fired, RequestInfo};
use crate::fields::{self, FieldPath};
use crate::registry::ResourceType;
use crate::store::{DeleteOpts, Managed, State, WriteCtx};
use crate::util::{self, FieldSelector, LabelSelector, meta_str};
use crate::{Inner, ResponseBody, ServeHandle, patch};
use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

pub type Query = BTreeMap<String, String>;

/// kube-apiserver's request body limit (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

pub fn full(code: u16, body: Bytes, ctype: &str) -> Response<ResponseBody> {
    let mut r = Response::new(Full::new(body).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

pub fn json_response(code: u16, v: &Value) -> Response<ResponseBody> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    full(code, Bytes::from(body), "application/json")
}

pub fn error_response(e: &ApiError) -> Response<ResponseBody> {
    json_response(e.code, &e.to_status())
}

/// The object as served at `version`.
pub fn present(obj: &Value, rt: &ResourceType, version: &str) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), json!(rt.api_version(version)));
        m.insert("kind".into(), json!(rt.kind));
    }
    o
}

#[derive(Debug, Clone)]
pub struct ResRoute {
    pub group: String,
    pub version: String,
    pub ns: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub sub: Option<String>,
}

#[derive(Debug, Clone)]
enum Route {
    Root,
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    Discovery(String, String),
    Resource(ResRoute),
    NotFound,
}

fn parse_route(path: &str) -> Route {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(util::url_decode)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest) = match s.as_slice() {
        [] => return Route::Root,
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["api"] => return Route::Api,
        ["api", v] => return Route::Discovery(String::new(), v.to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis"] => return Route::Apis,
        ["apis", g] => return Route::Group(g.to_string()),
        ["apis", g, v] => return Route::Discovery(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let (ns, r) = if rest.first() == Some(&"namespaces")
        && rest.len() >= 3
        && !(rest.len() == 3 && (rest[2] == "status" || rest[2] == "finalize"))
    {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, sub) = match r {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, sub] => (*p, Some(n.to_string()), Some(sub.to_string())),
        _ => return Route::NotFound,
    };
    Route::Resource(ResRoute {
        group: group.to_string(),
        version: version.to_string(),
        ns,
        plural: plural.to_string(),
        name,
        sub,
    })
}

fn is_watch(q: &Query) -> bool {
    matches!(q.get("watch").map(String::as_str), Some("true" | "1"))
}

fn verb_of(method: &Method, r: &ResRoute, q: &Query) -> &'static str {
    match *method {
        Method::GET if r.name.is_some() => "get",
        Method::GET if is_watch(q) => "watch",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if r.name.is_some() => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

pub async fn handle(
    inner: Arc<Inner>,
    parts: http::request::Parts,
    body: Bytes,
) -> Response<ResponseBody> {
    inner.ensure_background();
    let path = parts.uri.path().to_string();
    let q = util::parse_query(parts.uri.query());
    let route = parse_route(&path);
    let (verb, resource, sub, ns, name) = match &route {
        Route::Resource(r) => (
            verb_of(&parts.method, r, &q).to_string(),
            r.plural.clone(),
            r.sub.clone().unwrap_or_default(),
            r.ns.clone().unwrap_or_default(),
            r.name.clone().unwrap_or_default(),
        ),
        _ => (
            parts.method.as_str().to_lowercase(),
            path.clone(),
            String::new(),
            String::new(),
            String::new(),
        ),
    };
    let counted = if sub.is_empty() {
        resource.clone()
    } else {
        format!("{resource}/{sub}")
    };
    *inner
        .counts
        .lock()
        .entry((verb.clone(), counted.clone()))
        .or_insert(0) += 1;
    let user = user_of(&inner, &parts.headers);
    let latency = *inner.latency.lock();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let info = RequestInfo {
        user: &user,
        verb: &verb,
        resource: &resource,
        subresource: &sub,
        namespace: &ns,
        name: &name,
    };
    let response = match held_or_failed(&inner, &info).await {
        Some(e) => error_response(&e),
        None => respond(&inner, &parts, &path, route, &q, &body),
    };
    if let Some(log) = &inner.audit {
        let user_agent = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        log.lock().push(AuditEvent {
            user,
            user_agent,
            verb,
            resource: counted,
            namespace: ns,
            name,
            code: response.status().as_u16(),
        });
    }
    response
}

/// The user a request is attributed to: the one registered for its bearer token, if any.
fn user_of(inner: &Inner, headers: &HeaderMap) -> String {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    token
        .and_then(|t| {
            inner
                .state
                .lock()
                .tokens
                .get(t)
                .map(|(user, _)| user.clone())
        })
        .unwrap_or_else(|| "system:anonymous".to_string())
}

/// Applies the injected faults: the error of the first that fails the request, or `None`
/// to serve it. A hanging fault holds the request until the faults change, then looks again.
async fn held_or_failed(inner: &Inner, info: &RequestInfo<'_>) -> Option<ApiError> {
    let mut changed = inner.faults_changed.subscribe();
    loop {
        let fired = inner.faults.lock().iter_mut().find_map(|f| f.check(info));
        match fired {
            None => return None,
            Some(Fired::Fail(e)) => return Some(e),
            Some(Fired::Hang) => {
                // The sender lives in `inner`, which this request holds: never closed.
                let _ = changed.changed().await;
            }
        }
    }
}

fn respond(
    inner: &Arc<Inner>,
    parts: &http::request::Parts,
    path: &str,
    route: Route,
    q: &Query,
    body: &Bytes,
) -> Response<ResponseBody> {
    if body.len() > MAX_BODY {
        return error_response(&ApiError::new(
            413,
            format!("Request entity too large: limit is {MAX_BODY}"),
        ));
    }
    // kube-apiserver answers paths outside every API group it serves with a plain-text 404
    let mut segs = path.split('/').filter(|s| !s.is_empty());
    let group = match (segs.next(), segs.next()) {
        (Some("api") | Some("apis"), None) | (Some("api"), _) => Some(String::new()),
        (Some("apis"), Some(g)) => Some(util::url_decode(g)),
        _ => None,
    };
    let res = match route {
        Route::Resource(r) => resource_request(inner, &parts.method, &parts.headers, r, q, body),
        other => discovery(inner, &parts.method, &parts.headers, other),
    };
    match res {
        Ok(r) => r,
        Err(e) if e.code == 404 && e.message == NOT_FOUND_RESOURCE => {
            let served = group.is_some_and(|g| {
                g.is_empty() || inner.state.lock().reg.types.keys().any(|(tg, _)| *tg == g)
            });
            if served {
                error_response(&e)
            } else {
                full(
                    404,
                    Bytes::from_static(b"404 page not found\n"),
                    "text/plain; charset=utf-8",
                )
            }
        }
        Err(e) => error_response(&e),
    }
}

fn discovery(
    inner: &Inner,
    method: &Method,
    _headers: &HeaderMap,
    route: Route,
) -> Result<Response<ResponseBody>, ApiError> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let st = inner.state.lock();
    let v = match route {
        Route::Root => {
            let mut paths = vec![
                "/api".to_string(),
                "/api/v1".into(),
                "/apis".into(),
                "/version".into(),
                "/healthz".into(),
            ];
            for (g, vs) in st.reg.groups() {
                if g.is_empty() {
                    continue;
                }
                paths.push(format!("/apis/{g}"));
                for v in vs {
                    paths.push(format!("/apis/{g}/{v}"));
                }
            }
            json!({"paths": paths})
        }
        Route::Health => {
            return Ok(full(
                200,
                Bytes::from_static(b"ok"),
                "text/plain; charset=utf-8",
            ));
        }
        Route::Version => json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "apisim",
            "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z", "goVersion": "go1.24.2",
            "compiler": "gc", "platform": "linux/amd64"
        }),
        Route::Api => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]
        }),
        Route::Apis => st.reg.group_list(),
        Route::Group(g) => {
            let groups = st.reg.groups();
            let vs = groups
                .get(&g)
                .filter(|_| !g.is_empty())
                .ok_or_else(not_found_resource)?;
            let mut v = st.reg.group_json(&g, vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        }
        Route::Discovery(g, v) => st
            .reg
            .resource_list(&g, &v)
            .ok_or_else(not_found_resource)?,
        Route::Resource(_) | Route::NotFound => return Err(not_found_resource()),
    };
    Ok(json_response(200, &v))
}

const NOT_FOUND_RESOURCE: &str = "the server could not find the requested resource";

fn not_found_resource() -> ApiError {
    ApiError::new(404, NOT_FOUND_RESOURCE).with_details(json!({}))
}

fn content_type(h: &HeaderMap) -> String {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_lowercase()
}

fn parse_body(h: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
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
fn check_type(
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

fn check_ns(rt: &ResourceType, r: &ResRoute, obj: &Value) -> Result<(), ApiError> {
    let body_ns = meta_str(obj, "namespace");
    if rt.namespaced && !body_ns.is_empty() && Some(body_ns) != r.ns.as_deref() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

fn manager(q: &Query, headers: &HeaderMap) -> Result<String, ApiError> {
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

fn dry_run(q: &Query) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(o) => Err(ApiError::bad_request(format!(
            "Invalid dry run value: {o}; only \"All\" is supported"
        ))),
    }
}

/// The `fieldValidation` parameter: what create, update and patch do with unknown fields
/// (kube-apiserver's default is Warn).
#[derive(Clone, Copy, Debug, PartialEq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

fn field_validation(q: &Query) -> Result<FieldValidation, ApiError> {
    match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some(o) => Err(ApiError::bad_request(format!(
            "fieldValidation parameter unsupported: {o}; must be one of Ignore, Warn, Strict"
        ))),
    }
}

fn unknown_field_list(paths: &[FieldPath]) -> String {
    paths
        .iter()
        .map(|p| format!("unknown field \"{}\"", p.decoder()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Drops the unknown fields of a create or update body (or of a patch's result), returning a
/// warning for each (none with Ignore); with Strict refuses them with the error `strict`
/// makes of them instead.
fn drop_unknown(
    rt: &ResourceType,
    version: &str,
    obj: &mut Value,
    fv: FieldValidation,
    strict: impl FnOnce(&[FieldPath]) -> ApiError,
) -> Result<Vec<String>, ApiError> {
    let paths = fields::unknown(rt, version, obj);
    if paths.is_empty() {
        return Ok(vec![]);
    }
    if fv == FieldValidation::Strict {
        return Err(strict(&paths));
    }
    fields::remove(obj, &paths);
    if fv == FieldValidation::Ignore {
        return Ok(vec![]);
    }
    Ok(paths
        .iter()
        .map(|p| format!("unknown field \"{}\"", p.decoder()))
        .collect())
}

/// The Strict answer to a create or update body with unknown fields (400, as the decoder's).
fn strict_decoding_error(rt: &ResourceType, version: &str, paths: &[FieldPath]) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        unknown_field_list(paths),
        kind = rt.kind,
    ))
}

/// The Strict answer to a patch whose result has unknown fields: 422 on the field `patch`,
/// whose value is the patched object (a strategic merge patch: the patch, as Go prints a
/// map).
fn strict_patch_error(value: String, paths: &[FieldPath]) -> ApiError {
    ApiError::invalid(
        "",
        "",
        "",
        "",
        vec![FieldError::invalid(
            "patch",
            &Value::String(value),
            &format!("strict decoding error: {}", unknown_field_list(paths)),
        )],
    )
}

/// A JSON value as Go's `fmt` prints the `map[string]interface{}` it decodes to.
fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            // float64, printed as %v does: exponent from 1e21 up, or for very small values
            Some(f) if f != 0.0 && (f.abs() >= 1e21 || f.abs() < 1e-4) => {
                let s = format!("{f:e}");
                match s.split_once('e') {
                    Some((m, e)) => {
                        let (sign, digits) = match e.strip_prefix('-') {
                            Some(d) => ('-', d),
                            None => ('+', e),
                        };
                        format!("{m}e{sign}{digits:0>2}")
                    }
                    None => s,
                }
            }
            Some(f) => f.to_string(),
            None => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(go_format).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(m) => format!(
            "map[{}]",
            m.iter()
                .map(|(k, v)| format!("{k}:{}", go_format(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

/// Server-side apply's answer to an applied configuration with fields the schema does not
/// declare, whatever `fieldValidation` says: 500 without a reason, naming the object by the
/// namespace and name in the body.
fn apply_unknown_error(rt: &ResourceType, version: &str, applied: &Value) -> Option<ApiError> {
    let paths = fields::unknown_for_apply(rt, version, applied);
    let errs: Vec<String> = paths
        .iter()
        .map(|p| format!("{}: field not declared in schema", p.apply()))
        .collect();
    let errs = match errs.as_slice() {
        [] => return None,
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    let mut e = ApiError::internal(format!(
        "failed to create typed patch object ({}/{}; {}/{version}, Kind={}): {errs}",
        meta_str(applied, "namespace"),
        meta_str(applied, "name"),
        rt.group,
        rt.kind,
    ));
    e.reason = String::new();
    Some(e)
}

/// Adds one `Warning: 299 - "…"` header per warning, as kube-apiserver does.
fn with_warnings(mut r: Response<ResponseBody>, warnings: &[String]) -> Response<ResponseBody> {
    for w in warnings {
        let text = serde_json::to_string(w).unwrap_or_default();
        if let Ok(v) = header::HeaderValue::from_bytes(format!("299 - {text}").as_bytes()) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn wants_partial(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

/// A metadata-only view (`meta.k8s.io/v1` PartialObjectMetadata).
pub fn partial(o: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
}

fn wants_table(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn resource_request(
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
        && !util::is_label(ns)
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
                let out = crate::sim::review(&st, &rt, obj)?;
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

fn delete_opts(q: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
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

fn scale_of(rt: &ResourceType, obj: &Value) -> Value {
    let Some(sp) = &rt.scale else {
        return json!({});
    };
    let spec = util::get_path(obj, &util::json_path(&sp.spec_replicas))
        .as_i64()
        .unwrap_or(0);
    let status = util::get_path(obj, &util::json_path(&sp.status_replicas))
        .as_i64()
        .unwrap_or(0);
    let selector = match &sp.label_selector {
        Some(p) => match util::get_path(obj, &util::json_path(p)) {
            Value::String(s) => s.clone(),
            o @ Value::Object(_) => LabelSelector::from_object(o).to_query(),
            _ => String::new(),
        },
        None => String::new(),
    };
    let m = &obj["metadata"];
    let mut meta = json!({
        "name": m["name"], "uid": m["uid"], "resourceVersion": m["resourceVersion"],
        "creationTimestamp": m["creationTimestamp"],
    });
    if !m["namespace"].is_null() {
        meta["namespace"] = m["namespace"].clone();
    }
    let mut st = json!({"replicas": status});
    if !selector.is_empty() {
        st["selector"] = json!(selector);
    }
    // autoscaling/v1 ScaleSpec.replicas is `omitempty`
    let spec = if spec == 0 {
        json!({})
    } else {
        json!({"replicas": spec})
    };
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta, "spec": spec, "status": st})
}

type PatchFn<'a> = dyn Fn(&mut Value) -> Result<(), ApiError> + 'a;

/// PUT (body = Scale) or PATCH (patch applied to the Scale) on /scale.
fn scale_write(
    st: &mut State,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    patch_fn: Option<&PatchFn<'_>>,
    body: Option<Value>,
    ctx: &WriteCtx,
) -> Result<Response<ResponseBody>, ApiError> {
    let Some(sp) = rt.scale.clone() else {
        return Err(not_found_resource());
    };
    let cur = st
        .get(&rt.key(), ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    let mut scale = scale_of(rt, &cur);
    if let Some(f) = patch_fn {
        f(&mut scale)?;
    }
    if let Some(b) = body {
        let rv = meta_str(&b, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&cur, "resourceVersion") {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name));
        }
        scale = b;
    }
    let replicas = &scale["spec"]["replicas"];
    let n = match replicas {
        Value::Null => 0,
        v => v
            .as_i64()
            .filter(|n| *n >= 0 && *n <= i32::MAX as i64)
            .ok_or_else(|| {
                ApiError::invalid(
                    "Scale.autoscaling",
                    "autoscaling",
                    "Scale",
                    name,
                    vec![FieldError::invalid(
                        "spec.replicas",
                        v,
                        "must be greater than or equal to 0",
                    )],
                )
            })?,
    };
    let mut new = (*cur).clone();
    util::set_path(&mut new, &util::json_path(&sp.spec_replicas), json!(n));
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let out = st.update(rt, ns, name, "", new, ctx)?;
    Ok(json_response(200, &scale_of(rt, &out)))
}

fn patch_request(
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
                    patch::server_side_apply(None, &applied, mgr, force, &av, "", rt.status)
                })?;
                let out = st.create(rt, r.ns.as_deref(), obj, &ctx)?;
                Ok(json_response(201, &present(&out, rt, version)))
            }
            Some(live) => {
                let live = present(&live, rt, version);
                let obj = patch::with_list_keys(crate::store::cr_list_keys(rt, version), || {
                    patch::server_side_apply(
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

// ------------------------------------------------------------------ serving

pub async fn serve(inner: Arc<Inner>) -> std::io::Result<ServeHandle> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    inner.ensure_background();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                acc = listener.accept() => {
                    let Ok((stream, _)) = acc else { continue };
                    let _ = stream.set_nodelay(true);
                    let svc = crate::ApiService { inner: inner.clone() };
                    conns.spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let mut s = svc.clone();
                            tower::Service::call(&mut s, req)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(io, svc)
                            .await;
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(ServeHandle { port, task })
}
