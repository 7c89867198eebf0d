//! The writes and their apiserver semantics: create (generateName, uid, generation),
//! update (status subresource, immutable metadata, resourceVersion conflicts, generation,
//! no-op writes) and delete (preconditions, finalizers, propagation policy), with the
//! validation common to both.

use super::defaults::builtin_defaults;
use super::{DeleteOpts, Managed, State, WriteCtx, cr_list_keys};
use crate::apply;
use crate::error::{ApiError, FieldError};
use crate::patch;
use crate::registry::ResourceType;
use crate::schema;
use crate::util::{self, meta_mut, meta_str};
use crate::validation;
use serde_json::{Value, json};
use std::sync::Arc;

/// Whether two JSON objects have the same members, `skip` aside (compared in place: no copy
/// of either object).
fn same_members(a: &Value, b: &Value, skip: &[&str]) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            let kept = |k: &&String| !skip.contains(&k.as_str());
            a.keys().filter(kept).count() == b.keys().filter(kept).count()
                && a.iter()
                    .filter(|(k, _)| kept(k))
                    .all(|(k, v)| b.get(k) == Some(v))
        }
        _ => a == b,
    }
}

/// Whether a write changes nothing but managedFields and resourceVersion (a no-op write).
fn same_but_bookkeeping(old: &Value, new: &Value) -> bool {
    same_members(old, new, &["metadata"])
        && same_members(
            &old["metadata"],
            &new["metadata"],
            &["managedFields", "resourceVersion"],
        )
}

/// Whether the spec (everything but metadata, status, apiVersion and kind) is unchanged.
fn same_spec(old: &Value, new: &Value) -> bool {
    same_members(old, new, &["metadata", "status", "apiVersion", "kind"])
}

impl State {
    fn invalid(rt: &ResourceType, name: &str, errs: Vec<FieldError>) -> ApiError {
        ApiError::invalid(&rt.kind_qualified(), &rt.group, &rt.kind, name, errs)
    }

    /// Checks common to create and update; schema defaulting/pruning for CRs.
    fn validate_object(
        &self,
        rt: &ResourceType,
        obj: &mut Value,
        ctx: &WriteCtx,
    ) -> Result<(), ApiError> {
        let version = ctx.version.as_str();
        let name = meta_str(obj, "name").to_string();
        let mut errs = validation::name_errors(&name, rt.label_name, "metadata.name");
        errs.extend(validation::meta_errors(obj));
        if rt.crd {
            let permissive;
            let schema = match rt.schemas.get(version) {
                Some(schema) => schema,
                None => {
                    permissive = schema::permissive();
                    &permissive
                }
            };
            // unknown fields are dropped (or refused) before a write gets here
            let (e, _pruned) = schema::process(schema, obj);
            errs.extend(e);
        }
        if rt.group.is_empty() && (rt.plural == "configmaps" || rt.plural == "secrets") {
            errs.extend(validation::data_key_errors(obj));
        }
        if !errs.is_empty() {
            return Err(Self::invalid(rt, &name, errs));
        }
        Ok(())
    }

    pub fn namespace_check(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        match self.get(&("".into(), "namespaces".into()), "", ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if !n["metadata"]["deletionTimestamp"].is_null() => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                crate::error::qualified(&rt.plural, &rt.group),
                name,
                ns
            ))
            .with_details(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}))),
            Some(_) => Ok(()),
        }
    }

    /// Create. `obj` has apiVersion/kind/namespace already checked by the caller.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        mut obj: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        let ns = if rt.namespaced {
            ns.unwrap_or("default")
        } else {
            ""
        };
        {
            let m = meta_mut(&mut obj);
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            let name = m
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if name.is_empty() {
                let gen_name = m
                    .get("generateName")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if gen_name.is_empty() {
                    let e =
                        FieldError::required("metadata.name", "name or generateName is required");
                    return Err(Self::invalid(rt, "", vec![e]));
                }
                let base: String = gen_name.chars().take(58).collect();
                m.insert(
                    "name".into(),
                    json!(format!("{base}{}", util::rand_suffix(5))),
                );
            }
            for k in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(k);
            }
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
            if rt.generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        let name = meta_str(&obj, "name").to_string();
        if rt.status
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        builtin_defaults(rt, &mut obj);
        self.validate_object(rt, &mut obj, ctx)?;
        self.namespace_check(rt, ns, &name)?;
        if self.get(&rt.key(), ns, &name).is_some() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            if ctx.dry_run {
                crate::registry::from_crd(&obj).map_err(|errs| Self::invalid(rt, &name, errs))?;
            } else {
                self.crd_apply(&mut obj)?;
            }
        }
        if let Managed::Update(m) = &ctx.managed {
            let keys = cr_list_keys(rt, &ctx.version);
            patch::with_list_keys(keys, || {
                apply::track_update(None, &mut obj, m, &rt.api_version(&ctx.version), "")
            });
        }
        if ctx.dry_run {
            return Ok(obj);
        }
        let arc = self.store(rt, ns, &name, obj, "ADDED", None);
        Ok((*arc).clone())
    }

    /// Update (PUT or the result of a patch). `sub` is "" or "status".
    pub fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        sub: &str,
        mut new: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        let old_arc = self
            .get(&rt.key(), ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let old: &Value = &old_arc;
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_rv = meta_str(&new, "resourceVersion");
        if !body_rv.is_empty() && body_rv != meta_str(old, "resourceVersion") {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name));
        }
        if sub == "status" {
            let mut merged = old.clone();
            match new.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if matches!(ctx.managed, Managed::Keep) {
                let mf = new["metadata"]["managedFields"].clone();
                meta_mut(&mut merged).insert("managedFields".into(), mf);
            }
            new = merged;
        } else if rt.status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        if !new.is_object() {
            return Err(ApiError::bad_request("object must be a JSON object"));
        }
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        {
            let om = old["metadata"].clone();
            let m = meta_mut(&mut new);
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "generateName",
            ] {
                match om.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            if !matches!(ctx.managed, Managed::Keep) {
                match om.get("managedFields") {
                    Some(v) => m.insert("managedFields".into(), v.clone()),
                    None => m.remove("managedFields"),
                };
            }
        }
        if sub.is_empty() && !rt.crd {
            if rt.group.is_empty() && rt.plural == "services" {
                // an update without clusterIP keeps the allocated one
                for k in ["clusterIP", "clusterIPs"] {
                    if new["spec"].is_object()
                        && new["spec"][k].is_null()
                        && !old["spec"][k].is_null()
                    {
                        new["spec"][k] = old["spec"][k].clone();
                    }
                }
                // A Service keeps its cluster IP (or none, headless) for life.
                let (was, is) = (&old["spec"]["clusterIP"], &new["spec"]["clusterIP"]);
                if !was.is_null() && !is.is_null() && was != is {
                    let name = meta_str(&new, "name").to_string();
                    let err = FieldError::invalid(
                        "spec.clusterIPs[0]",
                        &json!([is]),
                        "may not change once set",
                    );
                    return Err(Self::invalid(rt, &name, vec![err]));
                }
            }
            builtin_defaults(rt, &mut new);
        }
        self.validate_object(rt, &mut new, ctx)?;
        if rt.generation && !same_spec(old, &new) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        if rt.group == "apiextensions.k8s.io"
            && rt.plural == "customresourcedefinitions"
            && sub.is_empty()
            && !ctx.dry_run
        {
            let old_key = crate::registry::from_crd(old).ok().map(|t| t.key());
            let new_key = crate::registry::from_crd(&new).ok().map(|t| t.key());
            if old_key != new_key {
                return Err(Self::invalid(
                    rt,
                    name,
                    vec![FieldError::invalid(
                        "spec.names",
                        &new["spec"]["names"],
                        "field is immutable",
                    )],
                ));
            }
            self.crd_apply(&mut new)?;
        }
        if let Managed::Update(m) = &ctx.managed {
            let keys = cr_list_keys(rt, &ctx.version);
            patch::with_list_keys(keys, || {
                apply::track_update(Some(old), &mut new, m, &rt.api_version(&ctx.version), sub)
            });
        }
        let deleting = !new["metadata"]["deletionTimestamp"].is_null();
        let no_finalizers = new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|a| a.is_empty());
        if ctx.dry_run {
            return Ok(new);
        }
        if deleting && no_finalizers && rt.plural != "namespaces" {
            self.objects
                .entry(rt.key())
                .or_default()
                .insert((ns.to_string(), name.to_string()), Arc::new(new));
            return self
                .remove(rt, ns, name)
                .ok_or_else(|| ApiError::internal("object vanished"));
        }
        if same_but_bookkeeping(old, &new) {
            return Ok(old.clone());
        }
        let arc = self.store(rt, ns, name, new, "MODIFIED", Some(old_arc.clone()));
        Ok((*arc).clone())
    }

    /// Delete: honours finalizers, preconditions and propagation policy.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        let old_arc = self
            .get(&rt.key(), ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let old: &Value = &old_arc;
        if let Some(uid) = &opts.precondition_uid
            && uid != meta_str(old, "uid")
        {
            return Err(ApiError::new(
                409,
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(old, "uid")
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta_str(old, "resourceVersion")
        {
            return Err(ApiError::new(
                409,
                format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(old, "resourceVersion")
                ),
            ));
        }
        if let Some(p) = &opts.propagation
            && !["Background", "Foreground", "Orphan"].contains(&p.as_str())
        {
            return Err(ApiError::invalid(
                &rt.kind_qualified(),
                &rt.group,
                &rt.kind,
                name,
                vec![FieldError::other(
                    "FieldValueNotSupported",
                    "propagationPolicy",
                    format!(
                        "Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                )],
            ));
        }
        if opts.dry_run {
            return Ok(old.clone());
        }
        let mut new = old.clone();
        let mut finalizers: Vec<String> = new["metadata"]["finalizers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let already = !old["metadata"]["deletionTimestamp"].is_null();
        if rt.group.is_empty() && rt.plural == "namespaces" {
            if ["default", "kube-system", "kube-public"].contains(&name) {
                return Err(ApiError::forbidden(format!(
                    "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
                ))
                .with_details(json!({"name": name, "kind": "namespaces"})));
            }
            if already {
                return Ok(old.clone());
            }
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(util::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            new["status"] = json!({"phase": "Terminating"});
            let arc = self.store(rt, ns, name, new, "MODIFIED", Some(old_arc.clone()));
            return Ok((*arc).clone());
        }
        match opts.propagation.as_deref() {
            Some("Foreground") if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
                finalizers.push("foregroundDeletion".into());
            }
            Some("Orphan") if !finalizers.iter().any(|f| f == "orphan") => {
                finalizers.push("orphan".into());
            }
            _ => {}
        }
        if finalizers.is_empty() {
            return self
                .remove(rt, ns, name)
                .ok_or_else(|| ApiError::internal("object vanished"));
        }
        let m = meta_mut(&mut new);
        m.insert("finalizers".into(), json!(finalizers));
        if !already {
            m.insert("deletionTimestamp".into(), json!(util::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            // like kube-apiserver: marking an object for deletion bumps its generation
            if let Some(g) = m
                .get("generation")
                .and_then(Value::as_i64)
                .filter(|g| *g > 0)
            {
                m.insert("generation".into(), json!(g + 1));
            }
        }
        if same_but_bookkeeping(old, &new) {
            return Ok(old.clone());
        }
        let arc = self.store(rt, ns, name, new, "MODIFIED", Some(old_arc.clone()));
        Ok((*arc).clone())
    }
}

#[cfg(test)]
mod compare_tests {
    use super::*;

    #[test]
    fn a_write_that_changes_only_bookkeeping_is_a_no_op_and_specs_compare_in_place() {
        let old = json!({"apiVersion": "v1", "kind": "K",
            "metadata": {"name": "a", "resourceVersion": "1", "managedFields": [{"manager": "x"}]},
            "spec": {"n": 1}, "status": {"s": 1}});
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("2");
        new["metadata"]["managedFields"] = json!([]);
        assert!(same_but_bookkeeping(&old, &new));
        new["metadata"]["labels"] = json!({"l": "v"});
        assert!(!same_but_bookkeeping(&old, &new), "a new label is a change");

        let mut status_only = old.clone();
        status_only["status"] = json!({"s": 2});
        assert!(same_spec(&old, &status_only));
        assert!(!same_but_bookkeeping(&old, &status_only));
        let mut spec = old.clone();
        spec["spec"]["n"] = json!(2);
        assert!(!same_spec(&old, &spec));
        let mut extra = old.clone();
        extra["data"] = json!({});
        assert!(
            !same_spec(&old, &extra),
            "a new top-level field is part of the spec"
        );
    }
}
