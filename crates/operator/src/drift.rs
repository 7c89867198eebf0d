//! Deciding whether an owned object needs a write. An object is converged when the last
//! apply was of exactly this desired object (same hash annotation) and every field we set
//! still has the value the server stores for it (the desired JSON, in the server's normal
//! form, is a subset of the live one). Fields the server or other controllers add (defaults,
//! status, their own labels) are not drift.
//!
//! The server does not store our JSON verbatim: it omits a `false` boolean and empty maps
//! and lists, writes quantities canonically (`0.5` → `500m`, `1024Mi` → `1Gi`), drops fields
//! its version does not know, and a mutating webhook may rewrite anything. Rather than
//! mirroring those rules (and their changes between versions), the server is asked: its
//! answer to an apply of the desired object, cut to the desired object's shape, is that
//! object's normal form ([`NormalForm`]), remembered per child and desired state
//! ([`NormalForms`]) as the few places where it differs.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

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

/// A stable hash of the desired object's JSON form: the first 8 bytes of its SHA-256, so
/// the annotation written by one build of the operator is recognised by the next (Rust's
/// `DefaultHasher` may change between releases, and every child would be re-applied).
pub fn desired_hash_value<T: Serialize>(desired: &T) -> u64 {
    let json = serde_json::to_string(desired).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, json.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
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

/// Whether two leaves are the same value (numbers compared as [`is_subset`] does).
fn same_leaf(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// Whether `live` (from the cache) already matches `desired`, so applying it again would
/// change nothing. Both are JSON trees; `desired` must carry its hash annotation and be in
/// the server's normal form (see [`NormalForm`]) for the answer to hold on a real server.
pub fn is_converged(desired: &Value, live: Option<&Value>) -> bool {
    let Some(live) = live else { return false };
    same_applied_hash(desired, live) && is_subset(desired, live)
}

/// Whether `live` was last applied from the desired state `desired` is (the same hash
/// annotation, which `desired` must carry).
pub fn same_applied_hash(desired: &Value, live: &Value) -> bool {
    let desired_hash = applied_hash(desired);
    desired_hash.is_some() && desired_hash == applied_hash(live)
}

fn applied_hash(object: &Value) -> Option<&Value> {
    object
        .pointer("/metadata/annotations")?
        .get(APPLIED_HASH_ANNOTATION)
}

/// One step into a JSON tree.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Key(Box<str>),
    Index(usize),
}

/// Where the server's form of a desired object differs from it: the value the server
/// stores at `path` instead of ours, `None` where it stores nothing.
#[derive(Clone, Debug, PartialEq)]
struct Rewrite {
    path: Vec<Step>,
    to: Option<Value>,
}

/// The server's normal form of one desired object, as the few places where it differs from
/// the object itself (usually none; a `false` the server omits is one), so that remembering
/// it costs next to nothing.
///
/// Learned from the object the server stored (or would store, in a dry run) when it was
/// applied, cut to the desired object's shape: the keys the desired object has, with the
/// server's value where it differs and absent where the server dropped them; lists of the
/// same length element by element. A list the server holds with another length (items other
/// managers or a webhook added to ours) is taken whole, as the server has it: ours cannot be
/// told apart from theirs, and the server's whole list is what an apply leaves in place.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NormalForm(Vec<Rewrite>);

impl NormalForm {
    /// The normal form of `desired`, from `stored`: the object as the server stored it
    /// (or would, in a dry run) on an apply of `desired`.
    pub fn learn(desired: &Value, stored: &Value) -> Self {
        let mut rewrites = Vec::new();
        diff(desired, stored, &mut Vec::new(), &mut rewrites);
        NormalForm(rewrites)
    }

    /// `desired` as the server stores it. `None` when this form does not fit `desired` (it
    /// was learned from another desired object).
    pub fn of(&self, desired: &Value) -> Option<Value> {
        let mut normal = desired.clone();
        for rewrite in &self.0 {
            let (last, parents) = rewrite.path.split_last()?;
            let mut at = &mut normal;
            for step in parents {
                at = match step {
                    Step::Key(k) => at.get_mut(&**k)?,
                    Step::Index(i) => at.get_mut(*i)?,
                };
            }
            match (last, &rewrite.to, at) {
                (Step::Key(k), Some(v), Value::Object(m)) => {
                    *m.get_mut(&**k)? = v.clone();
                }
                (Step::Key(k), None, Value::Object(m)) => {
                    m.remove(&**k)?;
                }
                (Step::Index(i), Some(v), Value::Array(a)) => *a.get_mut(*i)? = v.clone(),
                _ => return None,
            }
        }
        Some(normal)
    }

    /// Whether the server stores the desired object as it is.
    pub fn is_verbatim(&self) -> bool {
        self.0.is_empty()
    }
}

/// Records in `out` where `stored` differs from `desired`, within `desired`'s shape.
fn diff(desired: &Value, stored: &Value, path: &mut Vec<Step>, out: &mut Vec<Rewrite>) {
    match (desired, stored) {
        // `null` means "not set": nothing to compare.
        (Value::Null, _) => {}
        (Value::Object(d), Value::Object(s)) => {
            for (k, dv) in d {
                if dv.is_null() {
                    continue;
                }
                path.push(Step::Key(k.as_str().into()));
                match s.get(k) {
                    Some(sv) => diff(dv, sv, path, out),
                    None => out.push(Rewrite {
                        path: path.clone(),
                        to: None,
                    }),
                }
                path.pop();
            }
        }
        (Value::Array(d), Value::Array(s)) if d.len() == s.len() => {
            for (i, (dv, sv)) in d.iter().zip(s).enumerate() {
                path.push(Step::Index(i));
                diff(dv, sv, path, out);
                path.pop();
            }
        }
        (d, s) if same_leaf(d, s) => {}
        (_, s) => out.push(Rewrite {
            path: path.clone(),
            to: Some(s.clone()),
        }),
    }
}

/// A 64-bit key for the normal forms' map (an owner, a child).
pub fn key(parts: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// One child's learned normal form.
struct Learned {
    child: u64,
    /// The hash of the desired state it is the normal form of.
    desired: u64,
    form: NormalForm,
}

/// The normal forms learned, one per child (the latest desired state's), grouped by owner so
/// that an owner's go with it: memory stays proportional to the children that exist.
#[derive(Default)]
pub struct NormalForms(Mutex<HashMap<u64, Vec<Learned>>>);

impl NormalForms {
    /// The normal form of `child`'s desired state hashed as `desired`, if learned.
    pub fn get(&self, owner: u64, child: u64, desired: u64) -> Option<NormalForm> {
        let forms = self.0.lock().unwrap_or_else(|e| e.into_inner());
        forms
            .get(&owner)?
            .iter()
            .find(|l| l.child == child && l.desired == desired)
            .map(|l| l.form.clone())
    }

    /// Remembers `form` for `child`'s desired state hashed as `desired`, in place of the
    /// one it had.
    pub fn record(&self, owner: u64, child: u64, desired: u64, form: NormalForm) {
        let mut forms = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let children = forms.entry(owner).or_default();
        let learned = Learned {
            child,
            desired,
            form,
        };
        match children.iter_mut().find(|l| l.child == child) {
            Some(slot) => *slot = learned,
            None => children.push(learned),
        }
    }

    /// Forgets `child` (deleted).
    pub fn forget_child(&self, owner: u64, child: u64) {
        let mut forms = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(children) = forms.get_mut(&owner) {
            children.retain(|l| l.child != child);
            if children.is_empty() {
                forms.remove(&owner);
            }
        }
    }

    /// Forgets every child of `owner` (deleted).
    pub fn forget_owner(&self, owner: u64) {
        let mut forms = self.0.lock().unwrap_or_else(|e| e.into_inner());
        forms.remove(&owner);
    }

    /// Children whose normal form is remembered.
    pub fn len(&self) -> usize {
        let forms = self.0.lock().unwrap_or_else(|e| e.into_inner());
        forms.values().map(Vec::len).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The applied-hash annotation is SHA-256's first 8 bytes of the desired JSON: the
    /// value below is `printf '{"a":1}' | sha256sum`, so any build of the operator, on any
    /// toolchain, writes and recognises the same annotation.
    #[test]
    fn the_desired_hash_is_stable_across_builds() {
        assert_eq!(
            desired_hash(&serde_json::json!({"a": 1})),
            "015abd7f5cc57a2d"
        );
    }

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

    fn with_hash(mut object: Value) -> Value {
        let hash = desired_hash(&object);
        object["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!(hash);
        object
    }

    /// The headless Service and what kube-apiserver stores for it: `publishNotReadyAddresses:
    /// false` omitted, defaults and allocations added.
    #[test]
    fn an_omitted_false_is_the_normal_form_and_not_drift() {
        let desired = with_hash(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "m-headless", "annotations": {}},
            "spec": {"type": "ClusterIP", "clusterIP": "None", "publishNotReadyAddresses": false,
                "ports": [{"name": "memcached", "port": 11211, "protocol": "TCP",
                    "targetPort": "memcached"}]},
        }));
        let annotations = desired["metadata"]["annotations"].clone();
        let stored = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "m-headless", "annotations": annotations, "uid": "u",
                "resourceVersion": "812"},
            "spec": {"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"],
                "internalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
                "ports": [{"name": "memcached", "port": 11211, "protocol": "TCP",
                    "targetPort": "memcached"}]},
        });
        assert!(
            !is_converged(&desired, Some(&stored)),
            "the defect: never converged"
        );

        let form = NormalForm::learn(&desired, &stored);
        assert!(!form.is_verbatim());
        let normal = form.of(&desired).unwrap_or_default();
        let mut want = desired.clone();
        if let Some(spec) = want["spec"].as_object_mut() {
            spec.remove("publishNotReadyAddresses");
        }
        assert_eq!(normal, want);
        assert!(is_converged(&normal, Some(&stored)));

        // Drift is still drift.
        let mut edited = stored.clone();
        edited["spec"]["ports"][0]["port"] = json!(11212);
        assert!(!is_converged(&normal, Some(&edited)));
    }

    /// Quantities as users write them and empty maps and lists, against what a real
    /// kube-apiserver stores for them: canonical quantities, no empty collections.
    #[test]
    fn canonical_quantities_and_dropped_empty_collections_are_the_normal_form() {
        let desired = with_hash(json!({
            "metadata": {"name": "m", "annotations": {}},
            "spec": {"replicas": 3, "template": {"spec": {
                "nodeSelector": {}, "tolerations": [],
                "containers": [{"name": "memcached", "resources": {
                    "requests": {"cpu": "0.5", "memory": "1024Mi"},
                    "limits": {"memory": "1024Mi"}}}]}}},
        }));
        let annotations = desired["metadata"]["annotations"].clone();
        let stored = json!({
            "metadata": {"name": "m", "annotations": annotations, "generation": 1},
            "spec": {"replicas": 3, "revisionHistoryLimit": 10, "template": {"spec": {
                "dnsPolicy": "ClusterFirst",
                "containers": [{"name": "memcached", "imagePullPolicy": "IfNotPresent",
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"memory": "1Gi"}}}]}}},
        });
        let normal = NormalForm::learn(&desired, &stored)
            .of(&desired)
            .unwrap_or_default();
        assert_eq!(
            normal,
            json!({
                "metadata": {"name": "m", "annotations": annotations},
                "spec": {"replicas": 3, "template": {"spec": {
                    "containers": [{"name": "memcached", "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"memory": "1Gi"}}}]}}},
            })
        );
        assert!(is_converged(&normal, Some(&stored)));
    }

    #[test]
    fn a_verbatim_store_has_nothing_to_remember() {
        let desired = with_hash(json!({"metadata": {"annotations": {}},
            "spec": {"replicas": 3, "ports": [{"port": 11211}], "unset": null}}));
        let mut stored = desired.clone();
        stored["spec"]["revisionHistoryLimit"] = json!(10);
        stored["spec"]["ports"][0]["protocol"] = json!("TCP");
        let form = NormalForm::learn(&desired, &stored);
        assert!(form.is_verbatim());
        assert_eq!(form.of(&desired), Some(desired));
    }

    #[test]
    fn a_list_another_manager_added_to_is_taken_as_the_server_has_it() {
        let desired = with_hash(json!({"metadata": {"annotations": {}},
            "spec": {"containers": [{"name": "memcached"}]}}));
        let mut stored = desired.clone();
        stored["spec"]["containers"] = json!([{"name": "memcached", "image": "m"},
            {"name": "injected-sidecar", "image": "s"}]);
        let normal = NormalForm::learn(&desired, &stored)
            .of(&desired)
            .unwrap_or_default();
        assert_eq!(normal["spec"]["containers"], stored["spec"]["containers"]);
        assert!(is_converged(&normal, Some(&stored)));
        let mut removed = stored.clone();
        removed["spec"]["containers"] = json!([{"name": "memcached", "image": "m"}]);
        assert!(!is_converged(&normal, Some(&removed)));
    }

    #[test]
    fn a_form_does_not_fit_another_desired_object() {
        let desired = json!({"spec": {"a": false, "b": {"c": 1}}});
        let form = NormalForm::learn(&desired, &json!({"spec": {"b": {"c": 2}}}));
        assert_eq!(form.of(&desired), Some(json!({"spec": {"b": {"c": 2}}})));
        assert_eq!(form.of(&json!({"spec": {"b": {"c": 1}}})), None);
        assert_eq!(form.of(&json!({"spec": {"a": false, "b": 1}})), None);
    }

    #[test]
    fn normal_forms_are_kept_per_child_and_desired_state_and_go_with_their_owner() {
        let forms = NormalForms::default();
        let form = NormalForm::learn(&json!({"a": false}), &json!({}));
        let (owner, other) = (key(("ns", "m")), key(("ns", "n")));
        let (svc, pdb) = (key(("Service", "m")), key(("PodDisruptionBudget", "m")));
        forms.record(owner, svc, 1, form.clone());
        forms.record(owner, pdb, 7, NormalForm::default());
        forms.record(other, svc, 1, NormalForm::default());
        assert_eq!(forms.get(owner, svc, 1), Some(form.clone()));
        assert_eq!(forms.get(owner, svc, 2), None, "another desired state");
        assert_eq!(forms.get(other, svc, 1), Some(NormalForm::default()));

        // A new desired state replaces the child's form: one per child.
        forms.record(owner, svc, 2, NormalForm::default());
        assert_eq!(forms.get(owner, svc, 1), None);
        assert_eq!(forms.len(), 3);

        forms.forget_child(owner, pdb);
        assert_eq!((forms.get(owner, pdb, 7), forms.len()), (None, 2));
        forms.forget_owner(owner);
        assert_eq!((forms.get(owner, svc, 2), forms.len()), (None, 1));
        forms.forget_owner(other);
        assert!(forms.is_empty());
    }
}
