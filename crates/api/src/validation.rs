//! Pure validation of a Memcached that the CRD schema cannot express: the name must make
//! valid child object names and label values. Shared by the reconciler (which reports a
//! `Degraded` condition) and, later, the validating webhook.

use std::fmt;

use crate::{MAX_SIZE, Memcached};

/// Longest Memcached name accepted. Child objects are named `<name>` and `<name>-<suffix>`
/// with suffixes up to 9 characters (`-headless`), and each must be a DNS-1035 label
/// (63 characters); the name is also the `app.kubernetes.io/instance` label value.
pub const MAX_NAME_LENGTH: usize = 54;

/// One problem with a Memcached, naming the field and the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `metadata.name` or `spec.size`.
    pub field: String,
    /// The rule that was broken, readable by a person.
    pub message: String,
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
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}

/// Checks that `name` is a DNS-1035 label no longer than [`MAX_NAME_LENGTH`], so that the
/// Service, Deployment and label values derived from it are valid.
pub fn validate_name(name: &str) -> Result<(), FieldError> {
    let err = |message: String| FieldError {
        field: "metadata.name".into(),
        message,
    };
    if name.is_empty() {
        return Err(err("must not be empty".into()));
    }
    if name.len() > MAX_NAME_LENGTH {
        return Err(err(format!(
            "must be no more than {MAX_NAME_LENGTH} characters (is {}), so that child names such as \"<name>-headless\" stay valid DNS-1035 labels",
            name.len()
        )));
    }
    let bytes = name.as_bytes();
    let valid_chars = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let starts_with_letter = bytes[0].is_ascii_lowercase();
    let ends_alnum = bytes[bytes.len() - 1].is_ascii_alphanumeric();
    if !valid_chars || !starts_with_letter || !ends_alnum {
        return Err(err(format!(
            "\"{name}\" must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit), because it names the Service"
        )));
    }
    Ok(())
}

/// Validates what the reconciler needs before it creates anything for `mc`.
pub fn validate(mc: &Memcached) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    match mc.metadata.name.as_deref() {
        Some(name) => {
            if let Err(e) = validate_name(name) {
                errors.push(e);
            }
        }
        None => errors.push(FieldError {
            field: "metadata.name".into(),
            message: "is required".into(),
        }),
    }
    let spec = &mc.spec;
    if !(0..=MAX_SIZE).contains(&spec.size) {
        errors.push(FieldError {
            field: "spec.size".into(),
            message: format!("must be between 0 and {MAX_SIZE} (is {})", spec.size),
        });
    }
    if !(1..=65535).contains(&spec.container_port) {
        errors.push(FieldError {
            field: "spec.containerPort".into(),
            message: format!("must be between 1 and 65535 (is {})", spec.container_port),
        });
    }
    if let Some(image) = spec.image.as_deref()
        && let Err(message) = validate_image(image)
    {
        errors.push(FieldError {
            field: "spec.image".into(),
            message,
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// A light check of an image reference: non-empty, no whitespace or control characters,
/// no scheme, at most 512 characters.
pub fn validate_image(image: &str) -> Result<(), String> {
    if image.is_empty() {
        return Err("must not be empty (omit the field to use the operator's default)".into());
    }
    if image.len() > 512 {
        return Err(format!(
            "must be no more than 512 characters (is {})",
            image.len()
        ));
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{image:?} is not a valid image reference: it contains whitespace"
        ));
    }
    if image.contains("://") {
        return Err(format!(
            "{image:?} is not a valid image reference: drop the URL scheme"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemcachedSpec;

    fn mc(name: &str, size: i32) -> Memcached {
        Memcached::new(
            name,
            MemcachedSpec {
                size,
                container_port: 11211,
                image: None,
            },
        )
    }

    #[test]
    fn names_that_make_valid_children_pass() {
        for name in [
            "memcached-sample",
            "a",
            "cache-01",
            &"a".repeat(MAX_NAME_LENGTH),
        ] {
            assert_eq!(validate_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_that_break_children_are_rejected_naming_the_field() {
        let too_long = "a".repeat(MAX_NAME_LENGTH + 1);
        for name in [
            "",
            "Cache",
            "1cache",
            "cache-",
            "my.cache",
            "ca_che",
            too_long.as_str(),
        ] {
            let err = validate_name(name).expect_err(name);
            assert_eq!(err.field, "metadata.name");
        }
    }

    #[test]
    fn spec_bounds_are_checked() {
        let errors = validate(&mc("x", -1)).expect_err("negative size");
        assert_eq!(errors.0[0].field, "spec.size");
        let errors = validate(&mc("x", MAX_SIZE + 1)).expect_err("huge size");
        assert!(errors.to_string().contains("spec.size"));
        let mut bad_port = mc("x", 1);
        bad_port.spec.container_port = 0;
        assert_eq!(
            validate(&bad_port).expect_err("port").0[0].field,
            "spec.containerPort"
        );
        assert!(validate(&mc("x", 0)).is_ok());
    }

    #[test]
    fn images_with_whitespace_or_scheme_are_rejected() {
        assert!(validate_image("memcached:1.6").is_ok());
        assert!(validate_image("registry.example.com:5000/team/memcached@sha256:abc").is_ok());
        assert!(validate_image("memcached 1.6").is_err());
        assert!(validate_image("https://memcached").is_err());
        assert!(validate_image("").is_err());
    }
}
