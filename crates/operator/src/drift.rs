//! Deciding whether an owned object needs a write. An object is converged when the last
//! apply was of exactly this desired object (same hash annotation) and every field we set
//! still has our value (the desired JSON is a subset of the live one). Fields the server or
//! other controllers add (defaults, status, their own labels) are not drift.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Serialize;
use serde_json::Value;

use crate::builders::APPLIED_HASH_ANNOTATION;

/// A stable hash of the desired object's JSON form, as its annotation shows it.
pub fn desired_hash<T: Serialize>(desired: &T) -> String {
    annotation_value(desired_hash_value(desired))
}

/// A desired-state hash as the applied-hash annotation shows it.
pub fn annotation_value(hash: u64) -> String {
    format!("{hash:016x}")
}

/// A stable hash of the desired object's JSON form.
pub fn desired_hash_value<T: Serialize>(desired: &T) -> u64 {
    let json = serde_json::to_string(desired).unwrap_or_default();
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    hasher.finish()
}

/// Whether every field of `desired` is present in `live` with the same value. Objects are
/// compared key by key (extra keys in `live` are fine); arrays must have the same length
/// and match element by element; a `null` in `desired` means "not set" and always matches.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Null, _) => true,
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || l.get(k).is_some_and(|lv| is_subset(dv, lv))),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| is_subset(dv, lv))
        }
        (Value::Number(d), Value::Number(l)) => d.as_f64() == l.as_f64(),
        (d, l) => d == l,
    }
}

/// Whether `live` (from the cache) already matches `desired`, so applying it again would
/// change nothing. Both are JSON trees; `desired` must carry its hash annotation.
pub fn is_converged(desired: &Value, live: Option<&Value>) -> bool {
    let Some(live) = live else { return false };
    let desired_hash = applied_hash(desired);
    desired_hash.is_some() && desired_hash == applied_hash(live) && is_subset(desired, live)
}

fn applied_hash(object: &Value) -> Option<&Value> {
    object
        .pointer("/metadata/annotations")?
        .get(APPLIED_HASH_ANNOTATION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_live_fields_are_not_drift() {
        let desired = json!({"spec": {"replicas": 3, "template": {"containers": [{"name": "m"}]}}});
        let live = json!({"spec": {"replicas": 3, "revisionHistoryLimit": 10,
            "template": {"containers": [{"name": "m", "imagePullPolicy": "IfNotPresent"}]}},
            "status": {"readyReplicas": 1}});
        assert!(is_subset(&desired, &live));
    }

    #[test]
    fn changed_or_missing_fields_are_drift() {
        let desired = json!({"spec": {"replicas": 3, "ports": [{"port": 11211}]}});
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 1, "ports": [{"port": 11211}]}})
        ));
        assert!(!is_subset(&desired, &json!({"spec": {"replicas": 3}})));
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 3, "ports": []}})
        ));
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 3, "ports": [{"port": 11211}, {"port": 9150}]}})
        ));
    }

    #[test]
    fn converged_needs_the_same_hash_and_no_drift() {
        let mut desired = json!({"metadata": {"annotations": {}}, "spec": {"replicas": 3}});
        let hash = desired_hash(&desired);
        desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!(hash);
        let live = desired.clone();
        assert!(is_converged(&desired, Some(&live)));
        assert!(!is_converged(&desired, None));
        let mut other_hash = live.clone();
        other_hash["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("0");
        assert!(!is_converged(&desired, Some(&other_hash)));
        let mut scaled_by_hand = live;
        scaled_by_hand["spec"]["replicas"] = json!(1);
        assert!(!is_converged(&desired, Some(&scaled_by_hand)));
    }
}
