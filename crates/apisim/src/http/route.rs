//! Parsing a request path into a route (discovery documents, or a resource with its
//! namespace, name and subresource) and naming the verb it asks for, as kube-apiserver's
//! RequestInfo does.

use super::Query;
use crate::util;
use http::Method;

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
pub(super) enum Route {
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

pub(super) fn parse_route(path: &str) -> Route {
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

pub(super) fn is_watch(q: &Query) -> bool {
    matches!(q.get("watch").map(String::as_str), Some("true" | "1"))
}

pub(super) fn verb_of(method: &Method, r: &ResRoute, q: &Query) -> &'static str {
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
