//! Kubernetes resource quantities (`resource.Quantity`: `4Gi`, `500m`, `1e9`): the grammar
//! the CRD schema puts on every quantity ([`QUANTITY_PATTERN`]) and their value in bytes.
//! They follow kube-apiserver's parser, but for the one exception [`QUANTITY_PATTERN`] names;
//! nothing here is specific to Memcached.

/// The grammar of a Kubernetes resource quantity (`resource.Quantity`): a signed decimal
/// number with a binary (`Ki`…`Ei`) or decimal (`m`, `k`, `M`…`E`) suffix or an integer
/// exponent (`1e3`). controller-gen's pattern also allows a fractional exponent (`1e1.5`),
/// which kube-apiserver's parser refuses; this one follows the parser, except that it
/// wants a digit in the number: the parser reads `Mi`, `.` or `.e3` as 0, surely a typo (the real server is the
/// oracle in the operator's `tests/admission_children.rs`).
pub const QUANTITY_PATTERN: &str =
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$";

/// Whether `value` is a resource quantity ([`QUANTITY_PATTERN`]), which the API
/// server must parse before it can check anything else of a pod template.
pub fn is_quantity(value: &str) -> bool {
    static PATTERN: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    PATTERN
        .get_or_init(|| regex::Regex::new(QUANTITY_PATTERN).ok())
        .as_ref()
        .is_some_and(|re| re.is_match(value))
}

/// The bytes of a non-negative Kubernetes quantity (`4Gi`, `512M`, `1.5Gi`, `1e9`),
/// rounded down; `None` when it does not parse or is negative or over 2^63.
pub fn parse_quantity_bytes(value: &str) -> Option<u64> {
    if !is_quantity(value) {
        return None;
    }
    let value = value.strip_prefix('+').unwrap_or(value);
    if value.starts_with('-') {
        return None;
    }
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // number = digits / 10^scale
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let scale = u32::try_from(fraction.len()).ok()?;
    let (mul, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e => (1, e.get(1..)?.parse::<i32>().ok()?),
    };
    let exp = exp10 - i32::try_from(scale).ok()?;
    let scaled = digits.checked_mul(mul)?;
    let bytes = if exp >= 0 {
        scaled.checked_mul(10u128.checked_pow(u32::try_from(exp).ok()?)?)?
    } else {
        // Past 10^38 the quotient is 0 (u128 tops out near 3.4e38).
        10u128
            .checked_pow(u32::try_from(-exp).ok()?)
            .map_or(0, |d| scaled / d)
    };
    u64::try_from(bytes).ok().filter(|b| *b <= i64::MAX as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_bytes_as_kubernetes_reads_them() {
        for (q, bytes) in [
            ("1Gi", Some(1u64 << 30)),
            ("512Mi", Some(512 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("10G", Some(10_000_000_000)),
            ("1e9", Some(1_000_000_000)),
            ("2048", Some(2048)),
            ("100m", Some(0)),
            ("+1Ki", Some(1024)),
            ("1000000000u", Some(1000)),
            ("5000000000n", Some(5)),
            ("1e-100", Some(0)),
            ("-1Gi", None),
            ("1GB", None),
            ("", None),
        ] {
            assert_eq!(parse_quantity_bytes(q), bytes, "{q}");
        }
    }
}
