//! The kinds CRDs define: a CRD's kind registered (and its status filled in) when the CRD
//! is created or updated, and removed with all its objects when the CRD is deleted.

use super::{ObjKey, State};
use crate::error::{ApiError, FieldError};
use crate::util::{self, meta_str};
use serde_json::{Value, json};
use std::sync::Arc;

impl State {
    pub(super) fn crd_removed(&mut self, crd: &Value) {
        let group = crd["spec"]["group"].as_str().unwrap_or("").to_string();
        let plural = crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let key = (group, plural);
        let Some(rt) = self.reg.types.get(&key).cloned() else {
            return;
        };
        if !rt.crd {
            return;
        }
        let keys: Vec<ObjKey> = self
            .objects
            .get(&key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for (ns, name) in keys {
            self.remove(&rt, &ns, &name);
        }
        self.objects.remove(&key);
        self.reg.types.remove(&key);
    }

    /// Register (or re-register) the kind a CRD defines; fill in its status.
    pub(super) fn crd_apply(&mut self, crd: &mut Value) -> Result<(), ApiError> {
        let name = meta_str(crd, "name").to_string();
        let rt = crate::registry::from_crd(crd).map_err(|errs| {
            ApiError::invalid(
                "CustomResourceDefinition.apiextensions.k8s.io",
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                &name,
                errs,
            )
        })?;
        if let Some(existing) = self.reg.types.get(&rt.key())
            && !existing.crd
        {
            return Err(ApiError::invalid(
                "CustomResourceDefinition.apiextensions.k8s.io",
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                &name,
                vec![FieldError::invalid(
                    "spec.names.plural",
                    &json!(rt.plural),
                    "conflicts with a built-in resource",
                )],
            ));
        }
        let names = crd["spec"]["names"].clone();
        let mut accepted = names.clone();
        if accepted["singular"].is_null() {
            accepted["singular"] = json!(rt.singular);
        }
        if accepted["listKind"].is_null() {
            accepted["listKind"] = json!(rt.list_kind);
        }
        let now = util::now_rfc3339();
        crd["status"] = json!({
            "acceptedNames": accepted,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "storedVersions": [rt.preferred_version()],
        });
        self.reg.types.insert(rt.key(), Arc::new(rt));
        Ok(())
    }
}
