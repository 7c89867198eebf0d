//! `metav1.Status` errors.

use serde_json::{Value, json};

/// An API error, rendered as a `metav1.Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

/// The Kubernetes `reason` for an HTTP status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// `resource.group` the way apiserver messages name a resource.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason_for(code).to_string(),
            message: message.into(),
            details: None,
        }
    }
    pub fn with_details(mut self, d: Value) -> Self {
        self.details = Some(d);
        self
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(400, m)
    }
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            format!("{} \"{}\" not found", qualified(plural, group), name),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            format!("{} \"{}\" already exists", qualified(plural, group), name),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}));
        e.reason = "AlreadyExists".into();
        e
    }
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(plural, group),
                name
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(403, m)
    }
    pub fn method_not_allowed(m: impl Into<String>) -> Self {
        Self::new(405, m)
    }
    pub fn expired(m: impl Into<String>) -> Self {
        Self::new(410, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(500, m)
    }
    pub fn unsupported_media(m: impl Into<String>) -> Self {
        Self::new(415, m)
    }
    /// 422 Invalid with field causes: `(reason, field, message)`.
    pub fn invalid(
        kind_qualified: &str,
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<FieldError>,
    ) -> Self {
        let msgs: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
        let joined = if msgs.len() == 1 {
            msgs[0].clone()
        } else {
            format!("[{}]", msgs.join(", "))
        };
        let c: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.to_string(), "field": c.field}))
            .collect();
        Self::new(
            422,
            format!("{kind_qualified} \"{name}\" is invalid: {joined}"),
        )
        .with_details(json!({"name": name, "group": group, "kind": kind, "causes": c}))
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            v["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// One field error (a `StatusCause`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub reason: &'static str,
    pub field: String,
    /// The text after `field: `.
    pub detail: String,
}

impl FieldError {
    pub fn invalid(field: &str, value: &Value, msg: &str) -> Self {
        FieldError {
            reason: "FieldValueInvalid",
            field: field.to_string(),
            detail: format!("Invalid value: {}: {}", show(value), msg),
        }
    }
    pub fn required(field: &str, msg: &str) -> Self {
        FieldError {
            reason: "FieldValueRequired",
            field: field.to_string(),
            detail: if msg.is_empty() {
                "Required value".to_string()
            } else {
                format!("Required value: {msg}")
            },
        }
    }
    pub fn other(reason: &'static str, field: &str, detail: String) -> Self {
        FieldError {
            reason,
            field: field.to_string(),
            detail,
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Render a value the way apiserver error messages do (strings quoted).
pub fn show(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}
