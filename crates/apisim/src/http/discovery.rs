//! Discovery: the root path list, `/version`, the health endpoints, `/api`, `/apis` and the
//! group and group-version documents, and the 404 of a resource the server does not serve.

use super::route::Route;
use super::{full, json_response};
use crate::error::ApiError;
use crate::{Inner, ResponseBody};
use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use serde_json::json;

pub(super) fn discovery(
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

pub(super) const NOT_FOUND_RESOURCE: &str = "the server could not find the requested resource";

pub(super) fn not_found_resource() -> ApiError {
    ApiError::new(404, NOT_FOUND_RESOURCE).with_details(json!({}))
}
