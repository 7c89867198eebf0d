//! The HTTP front of the server: one request's way through (route, request counts, the
//! user, latency, injected faults, the audit log), the response helpers every route uses,
//! and the hyper server of `ApiServer::serve`. The routes themselves are in the submodules.

mod decode;
mod discovery;
mod field_validation;
mod patch_request;
mod resources;
mod route;
mod scale;

use crate::error::ApiError;
use crate::faults::{AuditEvent, Fired, RequestInfo};
use crate::registry::ResourceType;
use crate::util;
use crate::{Inner, ResponseBody, ServeHandle};
use bytes::Bytes;
use discovery::{NOT_FOUND_RESOURCE, discovery};
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use resources::resource_request;
use route::{Route, parse_route, verb_of};
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

/// A metadata-only view (`meta.k8s.io/v1` PartialObjectMetadata).
pub fn partial(o: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
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
