//! Garbage collection and namespace cleanup, as kube-controller-manager does them: dependents
//! whose owners are gone, the `orphan` and `foregroundDeletion` finalizers, and the contents
//! of a terminating namespace; run by a background task after deletions.

use super::{DeleteOpts, Event, State, WriteCtx};
use crate::Inner;
use crate::registry::{ResKey, ResourceType};
use crate::util::meta_str;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::broadcast;

/// The background task: a garbage-collection pass after every change that may need one
/// (a deletion, or an object marked for deletion).
pub(crate) async fn run(weak: std::sync::Weak<Inner>, mut rx: broadcast::Receiver<Arc<Event>>) {
    loop {
        let mut relevant = false;
        match rx.recv().await {
            Ok(ev) => relevant |= gc_relevant(&ev),
            Err(broadcast::error::RecvError::Lagged(_)) => relevant = true,
            Err(broadcast::error::RecvError::Closed) => return,
        }
        loop {
            match rx.try_recv() {
                Ok(ev) => relevant |= gc_relevant(&ev),
                Err(broadcast::error::TryRecvError::Lagged(_)) => relevant = true,
                Err(broadcast::error::TryRecvError::Closed) => return,
                Err(broadcast::error::TryRecvError::Empty) => break,
            }
        }
        if relevant {
            let Some(inner) = weak.upgrade() else { return };
            inner.gc_now();
        }
    }
}

fn gc_relevant(ev: &Event) -> bool {
    ev.etype == "DELETED" || !ev.obj["metadata"]["deletionTimestamp"].is_null()
}

impl Inner {
    /// Run garbage-collection steps until nothing changes (bounded, so a dependent that
    /// can never be updated cannot spin the task; the next deletion retries).
    pub fn gc_now(&self) {
        for _ in 0..1000 {
            let changed = self.state.lock().gc_step();
            if !changed {
                break;
            }
        }
    }
}

impl State {
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
