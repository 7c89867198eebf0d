//! The `/scale` subresource: an object's replicas and selector as an `autoscaling/v1`
//! Scale, and writes through it (PUT of a Scale, or a patch applied to the Scale).

use super::discovery::not_found_resource;
use super::json_response;
use crate::ResponseBody;
use crate::error::{ApiError, FieldError};
use crate::registry::ResourceType;
use crate::selectors::LabelSelector;
use crate::store::{State, WriteCtx};
use crate::util::{self, meta_str};
use http::Response;
use serde_json::{Value, json};

pub(super) fn scale_of(rt: &ResourceType, obj: &Value) -> Value {
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

pub(super) type PatchFn<'a> = dyn Fn(&mut Value) -> Result<(), ApiError> + 'a;

/// PUT (body = Scale) or PATCH (patch applied to the Scale) on /scale.
pub(super) fn scale_write(
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
