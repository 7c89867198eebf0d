//! Re-adopting the children a Memcached left behind when it was deleted with
//! `propagationPolicy: Orphan`: the garbage collector removed their ownerReferences and
//! kept them running, so that a Memcached of the same name created again takes them back
//! as they are (its pods keep their caches warm) instead of refusing them as another
//! application's objects.
//!
//! The evidence that an object without a controller is ours is its `managedFields`: the
//! API server records the field manager of every server-side apply, and only the
//! operator's applies are recorded under its manager ([`FIELD_MANAGER`]), whereas labels
//! can be copied onto any object by anyone. The instance label must still name this
//! Memcached, so that a child left behind by a pool of another name is not taken over
//! under this one's. An object with any controller is never ours to take.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::builders::{FIELD_MANAGER, LABEL_INSTANCE};

/// Whether `meta`, the metadata (with `managedFields`) of a live object of a child's name,
/// is a child the operator created for a Memcached named `instance` and nobody controls
/// now: no controller ownerReference, the instance label naming `instance`, and a
/// server-side apply by the operator's field manager on record.
pub(super) fn ours_to_readopt(meta: &ObjectMeta, instance: &str) -> bool {
    let controlled = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true));
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_INSTANCE))
        .is_some_and(|value| value == instance);
    let applied_by_us = meta.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.operation.as_deref() == Some("Apply")
    });
    !controlled && labelled && applied_by_us
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn meta(value: Value) -> ObjectMeta {
        serde_json::from_value(value).expect("metadata")
    }

    fn orphan() -> Value {
        json!({
            "name": "cache",
            "labels": {LABEL_INSTANCE: "cache", "app.kubernetes.io/name": "memcached"},
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update",
                 "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}},
                {"manager": FIELD_MANAGER, "operation": "Apply",
                 "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
            ],
        })
    }

    #[test]
    fn an_orphaned_child_we_applied_for_this_instance_is_ours() {
        assert!(ours_to_readopt(&meta(orphan()), "cache"));
    }

    #[test]
    fn another_instance_s_child_is_not() {
        assert!(!ours_to_readopt(&meta(orphan()), "other"));
        let mut unlabelled = orphan();
        unlabelled["labels"] = json!({"app.kubernetes.io/name": "memcached"});
        assert!(!ours_to_readopt(&meta(unlabelled), "cache"));
    }

    #[test]
    fn copied_labels_without_our_apply_are_not_evidence() {
        // Another tool's object with our labels: created by `kubectl apply` (client-side,
        // an Update) or by its own server-side apply.
        for (manager, operation) in [
            ("kubectl-client-side-apply", "Update"),
            ("helm", "Apply"),
            (FIELD_MANAGER, "Update"),
        ] {
            let mut copied = orphan();
            copied["managedFields"] = json!([{"manager": manager, "operation": operation,
                "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": {}}]);
            assert!(
                !ours_to_readopt(&meta(copied), "cache"),
                "{manager} {operation}"
            );
        }
        let mut none = orphan();
        none.as_object_mut()
            .expect("object")
            .remove("managedFields");
        assert!(!ours_to_readopt(&meta(none), "cache"));
    }

    #[test]
    fn a_controlled_object_is_never_taken() {
        let mut controlled = orphan();
        controlled["ownerReferences"] = json!([{"apiVersion": "cache.example.com/v1",
            "kind": "Memcached", "name": "cache", "uid": "old", "controller": true}]);
        assert!(!ours_to_readopt(&meta(controlled), "cache"));
        // A mere owner (no controller) does not stop it: the garbage collector of another
        // owner's deletion, say, has nothing to do with who created it.
        let mut owned = orphan();
        owned["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "x", "uid": "u"}]);
        assert!(ours_to_readopt(&meta(owned), "cache"));
    }
}
