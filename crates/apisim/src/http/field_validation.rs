//! The `fieldValidation` parameter: unknown fields of a body (or of a patch's result)
//! dropped with a warning, dropped silently, or refused (Strict), in kube-apiserver's words;
//! and server-side apply's own refusal of undeclared fields.

use super::{Query, ResponseBody};
use crate::error::{ApiError, FieldError};
use crate::fields::{self, FieldPath};
use crate::registry::ResourceType;
use crate::util::meta_str;
use http::{Response, header};
use serde_json::Value;

/// The `fieldValidation` parameter: what create, update and patch do with unknown fields
/// (kube-apiserver's default is Warn).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

pub(super) fn field_validation(q: &Query) -> Result<FieldValidation, ApiError> {
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
pub(super) fn drop_unknown(
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
pub(super) fn strict_decoding_error(
    rt: &ResourceType,
    version: &str,
    paths: &[FieldPath],
) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        unknown_field_list(paths),
        kind = rt.kind,
    ))
}

/// The Strict answer to a patch whose result has unknown fields: 422 on the field `patch`,
/// whose value is the patched object (a strategic merge patch: the patch, as Go prints a
/// map).
pub(super) fn strict_patch_error(value: String, paths: &[FieldPath]) -> ApiError {
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
pub(super) fn go_format(v: &Value) -> String {
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
pub(super) fn apply_unknown_error(
    rt: &ResourceType,
    version: &str,
    applied: &Value,
) -> Option<ApiError> {
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
pub(super) fn with_warnings(
    mut r: Response<ResponseBody>,
    warnings: &[String],
) -> Response<ResponseBody> {
    for w in warnings {
        let text = serde_json::to_string(w).unwrap_or_default();
        if let Ok(v) = header::HeaderValue::from_bytes(format!("299 - {text}").as_bytes()) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}
