//! The object store: one map per resource, a global resourceVersion, the watch history and
//! the change events every write emits. What writes mean is in the submodules: `write`
//! (create, update, delete), `defaults` (built-in kinds' defaulting), `crds` (the kinds CRDs
//! define) and `gc` (ownerReference garbage collection, finalizers, namespace cleanup).

mod crds;
mod defaults;
pub(crate) mod gc;
mod write;

use crate::registry::{Registry, ResKey, ResourceType};
use crate::schema;
use crate::util::{meta_mut, meta_str};
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
}
