//! Kubernetes' field errors (`spec.size: Invalid value: -1: must be between 0 and 100`): the
//! shape of every refusal, whether from [`crate::validation`] or from the operator's own checks
//! of a request, and the `metav1.StatusCause` reason each maps to.

use std::fmt;

/// One problem with a Memcached, naming the field and the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `metadata.name` or `spec.size`.
    pub field: String,
    /// The rule that was broken, readable by a person, in Kubernetes' style
    /// (`Invalid value: -1: must be between 0 and 100`).
    pub message: String,
}

impl FieldError {
    /// A field error with a free-form message.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// `field: Invalid value: <value>: <detail>` (strings are shown quoted).
    pub fn invalid(
        field: impl Into<String>,
        value: impl fmt::Debug,
        detail: impl fmt::Display,
    ) -> Self {
        Self::new(field, format!("Invalid value: {value:?}: {detail}"))
    }

    /// `field: Required value[: <detail>]`.
    pub fn required(field: impl Into<String>, detail: impl fmt::Display) -> Self {
        let detail = detail.to_string();
        if detail.is_empty() {
            Self::new(field, "Required value")
        } else {
            Self::new(field, format!("Required value: {detail}"))
        }
    }

    /// `field: Forbidden: <detail>`.
    pub fn forbidden(field: impl Into<String>, detail: impl fmt::Display) -> Self {
        Self::new(field, format!("Forbidden: {detail}"))
    }

    /// `field: Unsupported value: <value>: supported values: "a", "b"`.
    pub fn not_supported(
        field: impl Into<String>,
        value: impl fmt::Debug,
        supported: &[&str],
    ) -> Self {
        let supported: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self::new(
            field,
            format!(
                "Unsupported value: {value:?}: supported values: {}",
                supported.join(", ")
            ),
        )
    }

    /// The `metav1.StatusCause` reason for this error (`FieldValueInvalid`, ...).
    pub fn reason(&self) -> &'static str {
        let m = self.message.as_str();
        if m.starts_with("Required value") {
            "FieldValueRequired"
        } else if m.starts_with("Forbidden") {
            "FieldValueForbidden"
        } else if m.starts_with("Unsupported value") {
            "FieldValueNotSupported"
        } else if m.starts_with("Too long") {
            "FieldValueTooLong"
        } else {
            "FieldValueInvalid"
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Everything wrong with one object; empty means valid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Ok when empty.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}
