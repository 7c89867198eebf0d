//! The object store: one map per resource, a global resourceVersion, the watch history,
//! and the write operations (create / update / delete) with their apiserver semantics.

use crate::error::{ApiError, FieldError};
use crate::patch;
use crate::registry::{Registry, ResKey, ResourceType};
use crate::schema;
use crate::util::{self, meta_mut, meta_str};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// A change, as delivered to watchers.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub key: ResKey,
    pub ns: String,
    pub etype: &'static str,
    pub obj: Arc<Value>,
    pub prev: Option<Arc<Value>>,
    /// The serialized watch line `{"type": etype, "object": obj}`, built once and shared by
    /// every watcher that sees this event unchanged.
    pub line: std::sync::OnceLock<bytes::Bytes>,
}

pub type ObjKey = (String, String);

pub struct State {
    pub rv: u64,
    pub reg: Registry,
    pub objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Value>>>,
    pub history: VecDeque<Arc<Event>>,
    /// Watches from a resourceVersion below this get 410 Expired.
    pub floor: u64,
    pub history_cap: usize,
    pub tx: broadcast::Sender<Arc<Event>>,
    pub tokens: HashMap<String, (String, Vec<String>)>,
    /// uids of all stored objects (owner lookups for GC).
    pub uids: HashSet<String>,
    /// Objects GC has to look at: with ownerReferences or a deletionTimestamp.
    pub gc_candidates: HashSet<(ResKey, ObjKey)>,
}

/// How a write records field managers.
#[derive(Debug, Clone)]
pub enum Managed {
    /// An Update operation by this manager.
    Update(String),
    /// managedFields already computed (server-side apply).
    Keep,
    /// Internal write (simulator, GC): managedFields untouched.
    Internal,
}

#[derive(Debug, Clone)]
pub struct WriteCtx {
    pub dry_run: bool,
    pub managed: Managed,
    pub version: String,
}

impl WriteCtx {
    pub fn internal(version: &str) -> WriteCtx {
        WriteCtx {
            dry_run: false,
            managed: Managed::Internal,
            version: version.to_string(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// The list-map keys of a custom resource's schema (None for built-in kinds).
pub fn cr_list_keys(rt: &ResourceType, version: &str) -> Option<HashMap<String, String>> {
    rt.crd.then(|| {
        rt.schemas
            .get(version)
            .map(schema::list_keys)
            .unwrap_or_default()
    })
}

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
    pub fn new(history_cap: usize, tx: broadcast::Sender<Arc<Event>>) -> State {
        let mut st = State {
            rv: 0,
            reg: Registry::with_builtins(),
            objects: HashMap::new(),
            history: VecDeque::new(),
            floor: 0,
            history_cap: history_cap.max(1),
            tx,
            tokens: HashMap::new(),
            uids: HashSet::new(),
            gc_candidates: HashSet::new(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            if let Some(rt) = st
                .reg
                .types
                .get(&("".to_string(), "namespaces".to_string()))
                .cloned()
            {
                let _ = st.create(&rt, None, obj, &WriteCtx::internal("v1"));
            }
        }
        st
    }

    pub fn rt(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.reg
            .types
            .get(&(group.to_string(), plural.to_string()))
            .cloned()
    }

    pub fn get(&self, key: &ResKey, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(key)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
    }

    pub fn list(&self, key: &ResKey, ns: Option<&str>) -> Vec<Arc<Value>> {
        let Some(m) = self.objects.get(key) else {
            return vec![];
        };
        match ns {
            Some(ns) => m
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => m.values().cloned().collect(),
        }
    }

    fn emit(
        &mut self,
        key: ResKey,
        ns: &str,
        etype: &'static str,
        obj: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let ev = Arc::new(Event {
            rv: self.rv,
            key,
            ns: ns.to_string(),
            etype,
            obj,
            prev,
            line: std::sync::OnceLock::new(),
        });
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_cap {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
        let _ = self.tx.send(ev);
    }

    fn store(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        etype: &'static str,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let arc = Arc::new(obj);
        let okey = (ns.to_string(), name.to_string());
        self.uids.insert(meta_str(&arc, "uid").to_string());
        let candidate = arc["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            || !arc["metadata"]["deletionTimestamp"].is_null();
        if candidate {
            self.gc_candidates.insert((rt.key(), okey.clone()));
        } else {
            self.gc_candidates.remove(&(rt.key(), okey.clone()));
        }
        self.objects
            .entry(rt.key())
            .or_default()
            .insert(okey, arc.clone());
        self.emit(rt.key(), ns, etype, arc.clone(), prev);
        arc
    }

    /// Remove an object for good: DELETED event and hooks.
    pub fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
        let old = self
            .objects
            .get_mut(&rt.key())?
            .remove(&(ns.to_string(), name.to_string()))?;
        self.uids.remove(meta_str(&old, "uid"));
        self.gc_candidates
            .remove(&(rt.key(), (ns.to_string(), name.to_string())));
        self.rv += 1;
        let mut obj = (*old).clone();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let arc = Arc::new(obj.clone());
        self.emit(rt.key(), ns, "DELETED", arc, Some(old));
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            self.crd_removed(&obj);
        }
        Some(obj)
    }

    fn crd_removed(&mut self, crd: &Value) {
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
    fn crd_apply(&mut self, crd: &mut Value) -> Result<(), ApiError> {
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
        let mut errs = util::name_errors(&name, rt.label_name, "metadata.name");
        errs.extend(util::meta_errors(obj));
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
            errs.extend(util::data_key_errors(obj));
        }
        if !errs.is_empty() {
            return Err(Self::invalid(rt, &name, errs));
        }
        Ok(())
    }

    fn builtin_defaults(rt: &ResourceType, obj: &mut Value) {
        fn set(v: &mut Value, k: &str, d: Value) {
            if v.is_object() && v[k].is_null() {
                v[k] = d;
            }
        }
        fn containers(list: &mut Value) {
            let Some(cs) = list.as_array_mut() else {
                return;
            };
            for c in cs.iter_mut().filter(|c| c.is_object()) {
                let image = c["image"].as_str().unwrap_or("").to_string();
                let last = image.rsplit('/').next().unwrap_or("");
                let tag_latest = !last.contains(':') || last.ends_with(":latest");
                let policy = if tag_latest && !image.contains('@') {
                    "Always"
                } else {
                    "IfNotPresent"
                };
                set(c, "imagePullPolicy", json!(policy));
                set(c, "terminationMessagePath", json!("/dev/termination-log"));
                set(c, "terminationMessagePolicy", json!("File"));
                set(c, "resources", json!({}));
                if let Some(ps) = c["ports"].as_array_mut() {
                    for p in ps.iter_mut() {
                        set(p, "protocol", json!("TCP"));
                    }
                }
            }
        }
        fn pod_spec(spec: &mut Value, pod: bool) {
            if !spec.is_object() {
                return;
            }
            set(spec, "restartPolicy", json!("Always"));
            set(spec, "terminationGracePeriodSeconds", json!(30));
            set(spec, "dnsPolicy", json!("ClusterFirst"));
            set(spec, "schedulerName", json!("default-scheduler"));
            set(spec, "securityContext", json!({}));
            if pod {
                set(spec, "serviceAccountName", json!("default"));
                let sa = spec["serviceAccountName"].clone();
                set(spec, "serviceAccount", sa);
                set(spec, "enableServiceLinks", json!(true));
                set(spec, "priority", json!(0));
                set(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
            }
            for k in ["containers", "initContainers"] {
                if let Some(c) = spec.get_mut(k) {
                    containers(c);
                }
            }
        }
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                if obj["status"]["phase"].is_null() {
                    obj["status"] = json!({"phase": "Active"});
                }
                let name = meta_str(obj, "name").to_string();
                let m = meta_mut(obj);
                let labels = m.entry("labels").or_insert(json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
            }
            ("", "pods") => {
                if obj["status"]["phase"].is_null() {
                    obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
                }
                if let Some(spec) = obj.get_mut("spec") {
                    pod_spec(spec, true);
                }
            }
            ("apps", "deployments") | ("apps", "replicasets") => {
                let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
                    return;
                };
                set(spec, "replicas", json!(1));
                if rt.plural == "deployments" {
                    set(
                        spec,
                        "strategy",
                        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
                    );
                    set(spec, "revisionHistoryLimit", json!(10));
                    set(spec, "progressDeadlineSeconds", json!(600));
                }
                if let Some(ps) = spec.pointer_mut("/template/spec") {
                    pod_spec(ps, false);
                }
            }
            ("", "secrets") => {
                if obj["type"].is_null() {
                    obj["type"] = json!("Opaque");
                }
                // like the real server: stringData is merged into data (base64) and dropped
                let all_strings = obj["stringData"]
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string));
                if !all_strings {
                    return;
                }
                if let Some(Value::Object(sd)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    if !obj["data"].is_object() {
                        obj["data"] = json!({});
                    }
                    for (k, v) in sd {
                        let enc = util::base64_encode(v.as_str().unwrap_or("").as_bytes());
                        obj["data"][k] = json!(enc);
                    }
                }
            }
            ("", "services") if obj["spec"].is_object() => {
                let spec = &mut obj["spec"];
                set(spec, "type", json!("ClusterIP"));
                if spec["type"] != "ExternalName" {
                    if spec["clusterIP"].is_null() {
                        let ip =
                            format!("10.96.{}.{}", fastrand::u8(0..=255), fastrand::u8(1..=254));
                        spec["clusterIP"] = json!(ip);
                        spec["clusterIPs"] = json!([ip]);
                    }
                    set(spec, "sessionAffinity", json!("None"));
                    set(spec, "ipFamilies", json!(["IPv4"]));
                    set(spec, "ipFamilyPolicy", json!("SingleStack"));
                    set(spec, "internalTrafficPolicy", json!("Cluster"));
                }
                if let Some(ps) = spec["ports"].as_array_mut() {
                    for p in ps.iter_mut() {
                        set(p, "protocol", json!("TCP"));
                        let port = p["port"].clone();
                        set(p, "targetPort", port);
                    }
                }
            }
            _ => {}
        }
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
        Self::builtin_defaults(rt, &mut obj);
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
                patch::track_update(None, &mut obj, m, &rt.api_version(&ctx.version), "")
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
            }
            Self::builtin_defaults(rt, &mut new);
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
                patch::track_update(Some(old), &mut new, m, &rt.api_version(&ctx.version), sub)
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

    /// One garbage-collection / namespace-cleanup step. Returns true if anything changed.
    ///
    /// Only objects with ownerReferences or a deletionTimestamp are looked at closely, so a
    /// step costs one cheap scan of the store.
    pub fn gc_step(&mut self) -> bool {
        let has_refs = |o: &Value| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        };
        let deleting = |o: &Value| !o["metadata"]["deletionTimestamp"].is_null();
        let cands: Vec<(ResKey, Arc<Value>)> = self
            .gc_candidates
            .iter()
            .filter_map(|(k, (ns, name))| self.get(k, ns, name).map(|v| (k.clone(), v.clone())))
            .collect();
        if cands.is_empty() {
            return false;
        }
        let mut changed = false;
        let bg = DeleteOpts::default();
        for (key, snap) in &cands {
            let Some(rt) = self.reg.types.get(key).cloned() else {
                continue;
            };
            let ns = meta_str(snap, "namespace").to_string();
            let name = meta_str(snap, "name").to_string();
            // re-read: an earlier candidate in this step may have changed or removed it
            let Some(cur) = self.get(key, &ns, &name).cloned() else {
                continue;
            };
            let o = &cur;
            // dependents whose owners are all gone
            if has_refs(o)
                && !deleting(o)
                && o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|r| !self.uids.contains(r["uid"].as_str().unwrap_or("")))
                && self.delete(&rt, &ns, &name, &bg).is_ok()
            {
                changed = true;
                continue;
            }
            if !deleting(o) {
                continue;
            }
            let uid = meta_str(o, "uid").to_string();
            let fins: Vec<String> = o["metadata"]["finalizers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let owns = |d: &Value| {
                d["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|r| r["uid"].as_str() == Some(uid.as_str())))
            };
            let dependents: Vec<(ResKey, Arc<Value>)> =
                cands.iter().filter(|(_, d)| owns(d)).cloned().collect();
            if fins.iter().any(|f| f == "orphan") {
                for (dkey, d) in &dependents {
                    let Some(drt) = self.reg.types.get(dkey).cloned() else {
                        continue;
                    };
                    // re-read: an earlier step may have changed it
                    let Some(cur) = self
                        .get(dkey, meta_str(d, "namespace"), meta_str(d, "name"))
                        .cloned()
                    else {
                        continue;
                    };
                    let mut nd = (*cur).clone();
                    if let Some(rs) = nd["metadata"]["ownerReferences"].as_array_mut() {
                        rs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
                        if rs.is_empty()
                            && let Some(m) = nd["metadata"].as_object_mut()
                        {
                            m.remove("ownerReferences");
                        }
                    }
                    let _ = self.update(
                        &drt,
                        meta_str(d, "namespace"),
                        meta_str(d, "name"),
                        "",
                        nd,
                        &WriteCtx::internal(drt.preferred_version()),
                    );
                }
                self.drop_finalizer(&rt, o, "orphan");
                changed = true;
                continue;
            }
            if fins.iter().any(|f| f == "foregroundDeletion") {
                let mut blocking = 0;
                for (dkey, d) in &dependents {
                    let Some(drt) = self.reg.types.get(dkey).cloned() else {
                        continue;
                    };
                    let blocks = d["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|rs| {
                            rs.iter().any(|r| {
                                r["uid"].as_str() == Some(uid.as_str())
                                    && r["blockOwnerDeletion"].as_bool() == Some(true)
                            })
                        });
                    if blocks {
                        blocking += 1;
                    }
                    if !deleting(d) {
                        let fg = DeleteOpts {
                            propagation: Some("Foreground".into()),
                            ..Default::default()
                        };
                        if self
                            .delete(&drt, meta_str(d, "namespace"), meta_str(d, "name"), &fg)
                            .is_ok()
                        {
                            changed = true;
                        }
                    }
                }
                if blocking == 0 {
                    self.drop_finalizer(&rt, o, "foregroundDeletion");
                    changed = true;
                }
                continue;
            }
            if rt.group.is_empty() && rt.plural == "namespaces" {
                let mut in_ns: Vec<(Arc<ResourceType>, Arc<Value>)> = vec![];
                for k in self.objects.keys() {
                    let Some(t) = self.reg.types.get(k) else {
                        continue;
                    };
                    if !t.namespaced {
                        continue;
                    }
                    for v in self.list(k, Some(&name)) {
                        in_ns.push((t.clone(), v));
                    }
                }
                let remaining = in_ns.len();
                for (drt, d) in in_ns {
                    if !deleting(&d) && self.delete(&drt, &name, meta_str(&d, "name"), &bg).is_ok()
                    {
                        changed = true;
                    }
                }
                if remaining == 0 {
                    self.remove(&rt, "", &name);
                    changed = true;
                }
            }
        }
        changed
    }

    fn drop_finalizer(&mut self, rt: &ResourceType, o: &Value, fin: &str) {
        let mut n = o.clone();
        if let Some(a) = n["metadata"]["finalizers"].as_array_mut() {
            a.retain(|f| f.as_str() != Some(fin));
        }
        let _ = self.update(
            rt,
            meta_str(o, "namespace"),
            meta_str(o, "name"),
            "",
            n,
            &WriteCtx::internal(rt.preferred_version()),
        );
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
