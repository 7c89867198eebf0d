//! Decoding of what the API server sends: the AdmissionReview (a [`BadRequest`] when it is
//! not a usable one) and the Memcached inside it, field by field, so that a malformed
//! object is answered with errors naming its fields rather than a decoding failure.

use axum::http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::{DynamicObject, Status};
use memcached_api::validation::{FieldError, ValidationErrors};
use memcached_api::{GROUP, Memcached, MemcachedSpec, VERSION};
use serde_json::Value;

use super::MAX_BODY_BYTES;
use super::schema::spec_fields;

/// Longest JSON value quoted back in a message.
const MAX_QUOTED: usize = 120;

/// A request that is not a usable AdmissionReview, or that came when the webhook could not
/// take it: answered with this HTTP status (400, 408, 413 or 429) and the message, inside an
/// AdmissionReview body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest {
    pub status: StatusCode,
    pub message: String,
    /// The request's uid, when it could be read.
    pub uid: String,
}

impl BadRequest {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            uid: String::new(),
        }
    }

    /// The AdmissionReview sent back (allowed: false, the status code and message).
    pub fn to_review(&self) -> AdmissionReview<DynamicObject> {
        let mut response = AdmissionResponse::invalid(&self.message);
        response.uid = self.uid.clone();
        let reason = match self.status {
            StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
            StatusCode::REQUEST_TIMEOUT => "Timeout",
            StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
            _ => "BadRequest",
        };
        response.result = Status::failure(&self.message, reason).with_code(self.status.as_u16());
        response.into_review()
    }
}

/// A decoded AdmissionReview: the request (its `object` and `oldObject` left out) and the
/// raw objects, which are checked field by field so a malformed object is answered with
/// field errors rather than a decoding failure.
#[derive(Clone, Debug)]
pub struct DecodedReview {
    pub request: AdmissionRequest<DynamicObject>,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
}

/// Decodes an `admission.k8s.io/v1` AdmissionReview with a request.
pub fn decode_review(body: &[u8]) -> Result<DecodedReview, BadRequest> {
    let bad = |m: String| BadRequest::new(StatusCode::BAD_REQUEST, m);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad(
            "request body is empty: expected an admission.k8s.io/v1 AdmissionReview".into(),
        ));
    }
    let mut value: Value = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "request body is not valid JSON ({e}): expected an admission.k8s.io/v1 AdmissionReview"
        ))
    })?;
    let Some(top) = value.as_object_mut() else {
        return Err(bad(format!(
            "request body is a JSON {}, not an admission.k8s.io/v1 AdmissionReview object",
            type_name(&value)
        )));
    };
    let api_version = top.get("apiVersion").and_then(Value::as_str);
    let kind = top.get("kind").and_then(Value::as_str);
    if api_version != Some("admission.k8s.io/v1") || kind != Some("AdmissionReview") {
        return Err(bad(format!(
            "expected apiVersion \"admission.k8s.io/v1\" and kind \"AdmissionReview\", got apiVersion {} and kind {} (this webhook speaks admission.k8s.io/v1 only)",
            quote(top.get("apiVersion").unwrap_or(&Value::Null)),
            quote(top.get("kind").unwrap_or(&Value::Null)),
        )));
    }
    let uid = top
        .get("request")
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let bad_uid = |m: String| BadRequest {
        uid: uid.clone(),
        ..bad(m)
    };
    let Some(request) = top.get_mut("request").and_then(Value::as_object_mut) else {
        return Err(bad(
            "the AdmissionReview has no request object (it must carry request, not response)"
                .into(),
        ));
    };
    // The objects are checked separately, field by field.
    let object = take_object(request, "object");
    let old_object = take_object(request, "oldObject");
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value)
        .map_err(|e| bad_uid(format!("malformed AdmissionReview request: {e}")))?;
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|e| bad_uid(format!("malformed AdmissionReview: {e}")))?;
    if request.uid.is_empty() {
        return Err(bad_uid(
            "the AdmissionReview request has an empty uid".into(),
        ));
    }
    Ok(DecodedReview {
        request,
        object,
        old_object,
    })
}

fn take_object(request: &mut serde_json::Map<String, Value>, key: &str) -> Option<Value> {
    match request.insert(key.to_string(), Value::Null) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v),
    }
}

/// A request body within [`MAX_BODY_BYTES`], decoded.
pub(super) fn decode_body(body: &[u8]) -> Result<DecodedReview, BadRequest> {
    if body.len() > MAX_BODY_BYTES {
        return Err(too_large(body.len() as u64));
    }
    decode_review(body)
}

/// A request of `length` bytes or more: over [`MAX_BODY_BYTES`].
pub(super) fn too_large(length: u64) -> BadRequest {
    BadRequest::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body too large: {length} bytes or more, the limit is {MAX_BODY_BYTES} bytes (1 MiB: a Memcached's review needs well under that)"
        ),
    )
}

/// An upper estimate of the memory `body` takes once decoded into `serde_json::Value`s,
/// from one pass over its bytes, so that it can be refused before it is decoded: JSON of
/// tiny values packed densely takes up to 90 times its size (each one-key object is a
/// B-tree node of some 600 bytes), ordinary JSON about 2–4 times.
pub fn decoded_size(body: &[u8]) -> usize {
    // What serde_json allocates, rounded up: a Value is 32 bytes, in a Vec whose capacity
    // may be twice its length; a string's bytes take a heap block of at least 32; an
    // object's entry costs its key (24) and value in B-tree nodes at least half full; a
    // non-empty object's first node holds 11 of each.
    const VALUE: usize = 64;
    const STRING: usize = 32;
    const ENTRY: usize = 64;
    const OBJECT: usize = 640;
    let (mut strings, mut commas, mut containers, mut entries, mut objects) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                strings += 1;
            }
            b'{' => {
                containers += 1;
                objects += 1;
            }
            b'[' => containers += 1,
            b',' => commas += 1,
            b':' => entries += 1,
            _ => {}
        }
    }
    // Every value but the first of a container follows a comma.
    let values = commas + containers + 1;
    [
        body.len(),
        strings.saturating_mul(STRING),
        values.saturating_mul(VALUE),
        entries.saturating_mul(ENTRY),
        objects.saturating_mul(OBJECT),
    ]
    .into_iter()
    .fold(0usize, usize::saturating_add)
}

/// Turns a raw object into a Memcached, field by field, collecting every structural
/// problem (wrong apiVersion or kind, unknown fields, wrong types, missing spec or size)
/// as a field error. The semantic rules are
/// [`validation::validate`](memcached_api::validation::validate)'s.
pub fn decode_memcached(object: &Value) -> Result<Memcached, ValidationErrors> {
    let mut errors = Vec::new();
    let Some(top) = object.as_object() else {
        return Err(ValidationErrors(vec![FieldError::invalid(
            "object",
            Json(object),
            format!("must be a Memcached object (is {})", type_name(object)),
        )]));
    };
    let api_version = format!("{GROUP}/{VERSION}");
    match top.get("apiVersion") {
        None | Some(Value::Null) => errors.push(FieldError::required("apiVersion", "")),
        Some(Value::String(s)) if *s == api_version => {}
        Some(v) => errors.push(FieldError::not_supported(
            "apiVersion",
            Json(v),
            &[&api_version],
        )),
    }
    match top.get("kind") {
        None | Some(Value::Null) => errors.push(FieldError::required("kind", "")),
        Some(Value::String(s)) if s == "Memcached" => {}
        Some(v) => errors.push(FieldError::not_supported("kind", Json(v), &["Memcached"])),
    }
    for key in top
        .keys()
        .filter(|k| !TOP_LEVEL_FIELDS.contains(&k.as_str()))
    {
        errors.push(FieldError::forbidden(
            key.clone(),
            format!(
                "unknown field {key:?}; a Memcached has apiVersion, kind, metadata, spec and status"
            ),
        ));
    }
    let metadata = match top.get("metadata") {
        None | Some(Value::Null) => ObjectMeta::default(),
        Some(v) => match serde_json::from_value::<ObjectMeta>(v.clone()) {
            Ok(meta) => meta,
            Err(e) => {
                errors.push(FieldError::invalid(
                    "metadata",
                    Json(v),
                    format!("is not valid object metadata: {e}"),
                ));
                ObjectMeta::default()
            }
        },
    };
    let spec = match top.get("spec") {
        None => {
            errors.push(FieldError::required(
                "spec",
                "a Memcached needs a spec with at least size",
            ));
            None
        }
        Some(Value::Null) => {
            errors.push(FieldError::required(
                "spec",
                "must not be null; a Memcached needs a spec with at least size",
            ));
            None
        }
        Some(Value::Object(spec)) => decode_spec(spec, &mut errors),
        Some(v) => {
            errors.push(FieldError::invalid(
                "spec",
                Json(v),
                format!("must be an object (is {})", type_name(v)),
            ));
            None
        }
    };
    match spec {
        Some(spec) if errors.is_empty() => Ok(Memcached {
            metadata,
            spec,
            status: None,
        }),
        _ => Err(ValidationErrors(errors)),
    }
}

fn decode_spec(
    spec: &serde_json::Map<String, Value>,
    errors: &mut Vec<FieldError>,
) -> Option<MemcachedSpec> {
    let before = errors.len();
    let known = spec_fields();
    for key in spec.keys().filter(|k| !known.contains(k)) {
        errors.push(FieldError::forbidden(
            format!("spec.{key}"),
            format!(
                "unknown field {key:?}; the fields of spec are {}",
                known.join(", ")
            ),
        ));
    }
    let size_rule = format!("must be between 0 and {}", memcached_api::MAX_SIZE);
    let size = match integer(spec, "size", &size_rule) {
        Ok(Some(n)) => {
            i32::try_from(n).map_err(|_| FieldError::invalid("spec.size", n, &size_rule))
        }
        Ok(None) => Err(FieldError::required(
            "spec.size",
            "the number of memcached pods, 0 to 100",
        )),
        Err(e) => Err(e),
    };
    let port_rule = "must be between 1 and 65535, inclusive";
    let container_port = match integer(spec, "containerPort", port_rule) {
        Ok(Some(n)) => {
            i32::try_from(n).map_err(|_| FieldError::invalid("spec.containerPort", n, port_rule))
        }
        Ok(None) => Ok(memcached_api::DEFAULT_CONTAINER_PORT),
        Err(e) => Err(e),
    };
    let image = match spec.get("image") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(FieldError::invalid(
            "spec.image",
            Json(v),
            format!("must be a string (is {})", type_name(v)),
        )),
    };
    let (size, container_port, image) = match (size, container_port, image) {
        (Ok(size), Ok(port), Ok(image)) => (size, port, image),
        (size, port, image) => {
            errors.extend(size.err());
            errors.extend(port.err());
            errors.extend(image.err());
            return None;
        }
    };
    // The remaining fields are typed objects; serde names the first problem precisely.
    let mut rest = spec.clone();
    for handled in ["size", "containerPort", "image"] {
        rest.remove(handled);
    }
    rest.insert("size".into(), Value::from(size));
    let typed = match serde_path_to_error::deserialize::<_, MemcachedSpec>(Value::Object(rest)) {
        Ok(typed) => typed,
        Err(e) => {
            // Named by the field serde stopped at (`spec.tls.rotation`), as the schema
            // would name it, with the value found there.
            let mut field = "spec".to_string();
            let mut pointer = String::new();
            for segment in e.path().iter() {
                match segment {
                    serde_path_to_error::Segment::Map { key } => {
                        field.push_str(&format!(".{key}"));
                        pointer
                            .push_str(&format!("/{}", key.replace('~', "~0").replace('/', "~1")));
                    }
                    serde_path_to_error::Segment::Seq { index } => {
                        field.push_str(&format!("[{index}]"));
                        pointer.push_str(&format!("/{index}"));
                    }
                    _ => {}
                }
            }
            let whole = Value::Object(spec.clone());
            let value = whole.pointer(&pointer).cloned().unwrap_or(whole);
            errors.push(FieldError::invalid(
                field,
                Json(&value),
                e.into_inner().to_string(),
            ));
            return None;
        }
    };
    (errors.len() == before).then_some(MemcachedSpec {
        size,
        container_port,
        image,
        ..typed
    })
}

/// An integer field: `Ok(None)` when absent or null.
fn integer(
    spec: &serde_json::Map<String, Value>,
    key: &str,
    rule: &str,
) -> Result<Option<i64>, FieldError> {
    let field = format!("spec.{key}");
    match spec.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let n = v.as_i64().or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            });
            match n {
                Some(n) => Ok(Some(n)),
                // An integral number too large for i64 (e.g. 1e300 or u64::MAX).
                None if v.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                    Err(FieldError::invalid(field, Json(v), rule))
                }
                None => Err(FieldError::invalid(
                    field,
                    Json(v),
                    format!("must be an integer (is {})", type_name(v)),
                )),
            }
        }
    }
}

const TOP_LEVEL_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "spec", "status"];

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A JSON value as quoted in a message (strings in quotes), cut to a readable length.
fn quote(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > MAX_QUOTED {
        let mut end = MAX_QUOTED;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// Shows a JSON value the way [`FieldError::invalid`] quotes values.
struct Json<'a>(&'a Value);

impl std::fmt::Debug for Json<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&quote(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structural_errors_name_the_field() {
        let err = decode_memcached(&serde_json::json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "x"}, "spec": {"size": "three", "replicas": 3}
        }))
        .expect_err("bad");
        let text = err.to_string();
        assert!(
            text.contains("spec.size: Invalid value: \"three\": must be an integer"),
            "{text}"
        );
        assert!(
            text.contains("spec.replicas: Forbidden: unknown field"),
            "{text}"
        );
        // A nested typed field is named down to where it is wrong, with its value.
        let err = decode_memcached(&serde_json::json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "x"},
            "spec": {"size": 1, "tls": {"secretName": "c", "rotation": "Reload"},
                "tolerations": [{"key": "a"}, {"key": 7}]}
        }))
        .expect_err("bad");
        let text = err.to_string();
        assert!(
            text.contains("spec.tls.rotation: Invalid value: \"Reload\": unknown variant `Reload`"),
            "{text}"
        );
        let err = decode_memcached(&serde_json::json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": "x"},
            "spec": {"size": 1, "tolerations": [{"key": "a"}, {"key": 7}]}
        }))
        .expect_err("bad");
        let text = err.to_string();
        assert!(
            text.contains("spec.tolerations[1].key: Invalid value: 7:"),
            "{text}"
        );
    }
}
