//! The workload simulator, in place of kube-controller-manager and the kubelet: after each
//! relevant change, Deployments get ReplicaSets, ReplicaSets get pods, pods turn Running and
//! Ready after a delay, and statuses follow. Deployment rollouts are in `deployment`,
//! PodDisruptionBudget statuses in `pdb`.

mod deployment;
mod pdb;

use crate::Inner;
use crate::registry::ResourceType;
use crate::store::{DeleteOpts, Event, State, WriteCtx};
use crate::util::meta_str;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

fn relevant(ev: &Event) -> bool {
    (ev.key.0 == "apps" && (ev.key.1 == "deployments" || ev.key.1 == "replicasets"))
        || (ev.key.0.is_empty() && ev.key.1 == "pods")
        || (ev.key.0 == "policy" && ev.key.1 == "poddisruptionbudgets")
}

pub async fn run(weak: Weak<Inner>, mut rx: broadcast::Receiver<Arc<Event>>, delay: Duration) {
    let mut sim = Sim {
        pods_idx: HashMap::new(),
        rs_idx: HashMap::new(),
        ready_at: HashMap::new(),
        delay,
        ip: 0,
    };
    loop {
        let next = sim.ready_at.values().min().copied();
        let mut go = false;
        tokio::select! {
            r = rx.recv() => match r {
                Ok(ev) => go |= relevant(&ev),
                Err(broadcast::error::RecvError::Lagged(_)) => go = true,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => go = true,
        }
        loop {
            match rx.try_recv() {
                Ok(ev) => go |= relevant(&ev),
                Err(broadcast::error::TryRecvError::Lagged(_)) => go = true,
                Err(broadcast::error::TryRecvError::Closed) => return,
                Err(broadcast::error::TryRecvError::Empty) => break,
            }
        }
        if !go {
            continue;
        }
        let started = std::time::Instant::now();
        {
            let Some(inner) = weak.upgrade() else { return };
            let mut st = inner.state.lock();
            sim.reconcile(&mut st);
        }
        // A pass costs O(all objects) and its own writes trigger the next one: pause for
        // twice its cost, so the simulator takes at most a third of a core under load (and
        // the server's requests, which need the same lock, get through).
        tokio::time::sleep(started.elapsed() * 2).await;
    }
}

struct Sim {
    pods_idx: HashMap<String, Vec<Arc<Value>>>,
    rs_idx: HashMap<String, Vec<Arc<Value>>>,
    ready_at: HashMap<String, Instant>,
    delay: Duration,
    ip: u32,
}

fn deleting(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

fn controller_uid(o: &Value) -> Option<&str> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
        .and_then(|r| r["uid"].as_str())
}

fn pod_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A pod's `controller.kubernetes.io/pod-deletion-cost` (0 when unset or not a number).
fn deletion_cost(p: &Value) -> i32 {
    p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Resolve an int-or-percent against a total.
fn resolve(v: &Value, total: i64, round_up: bool, default_pct: i64) -> i64 {
    let pct = |p: i64| {
        if round_up {
            (total * p + 99) / 100
        } else {
            total * p / 100
        }
    };
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0).max(0),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(p) => pct(p),
            None => s.parse().unwrap_or(0),
        },
        _ => pct(default_pct),
    }
}

fn owner_ref(o: &Value, api_version: &str, kind: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": meta_str(o, "name"), "uid": meta_str(o, "uid"), "controller": true, "blockOwnerDeletion": true})
}

impl Sim {
    fn rts(st: &State) -> Option<(Arc<ResourceType>, Arc<ResourceType>, Arc<ResourceType>)> {
        Some((
            st.rt("apps", "deployments")?,
            st.rt("apps", "replicasets")?,
            st.rt("", "pods")?,
        ))
    }

    fn reconcile(&mut self, st: &mut State) {
        let Some((drt, rsrt, prt)) = Self::rts(st) else {
            return;
        };
        let ctx = WriteCtx::internal("v1");
        self.reindex(st, &rsrt, &prt);
        // deployments -> replica sets
        for d in st.list(&drt.key(), None) {
            if !deleting(&d) {
                self.deployment(st, &drt, &rsrt, &prt, &d, &ctx);
            }
        }
        // replica sets -> pods
        for rs in st.list(&rsrt.key(), None) {
            if !deleting(&rs) {
                self.replicaset(st, &rsrt, &prt, &rs, &ctx);
            }
        }
        // pods: Pending -> Running/Ready
        let now = Instant::now();
        let mut seen = std::collections::HashSet::new();
        for p in st.list(&prt.key(), None) {
            let uid = meta_str(&p, "uid").to_string();
            seen.insert(uid.clone());
            if deleting(&p) || p["status"]["phase"] != "Pending" {
                self.ready_at.remove(&uid);
                continue;
            }
            let at = *self.ready_at.entry(uid.clone()).or_insert(now + self.delay);
            if at <= now {
                self.ready_at.remove(&uid);
                self.make_ready(st, &prt, &p, &ctx);
            }
        }
        self.ready_at.retain(|k, _| seen.contains(k));
        // statuses
        self.reindex(st, &rsrt, &prt);
        for rs in st.list(&rsrt.key(), None) {
            self.rs_status(st, &rsrt, &prt, &rs, &ctx);
        }
        for d in st.list(&drt.key(), None) {
            if !deleting(&d) {
                self.deploy_status(st, &drt, &rsrt, &prt, &d, &ctx);
            }
        }
        if let Some(pdbrt) = st.rt("policy", "poddisruptionbudgets") {
            let pdbs = st.list(&pdbrt.key(), None);
            if !pdbs.is_empty() {
                let by_label = Self::pods_by_label(st, &prt);
                for pdb in pdbs {
                    if !deleting(&pdb) {
                        Self::pdb_status(st, &pdbrt, &prt, &by_label, &pdb, &ctx);
                    }
                }
            }
        }
    }

    /// Active objects of a kind grouped by their controller's uid: neither being deleted nor
    /// ended (a pod in phase `Failed` or `Succeeded` no longer counts for its ReplicaSet,
    /// which replaces it, as kube-controller-manager's `FilterActivePods` does).
    fn index(st: &State, rt: &ResourceType) -> HashMap<String, Vec<Arc<Value>>> {
        let mut m: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
        for o in st.list(&rt.key(), None) {
            let phase = o["status"]["phase"].as_str();
            if deleting(&o) || matches!(phase, Some("Failed" | "Succeeded")) {
                continue;
            }
            if let Some(u) = controller_uid(&o) {
                m.entry(u.to_string()).or_default().push(o.clone());
            }
        }
        for v in m.values_mut() {
            v.sort_by_key(|o| {
                (
                    meta_str(o, "creationTimestamp").to_string(),
                    meta_str(o, "resourceVersion").parse::<u64>().unwrap_or(0),
                )
            });
        }
        m
    }

    fn reindex(&mut self, st: &State, rsrt: &ResourceType, prt: &ResourceType) {
        self.pods_idx = Self::index(st, prt);
        self.rs_idx = Self::index(st, rsrt);
    }

    fn owned_pods(&self, owner: &Value) -> Vec<Arc<Value>> {
        self.pods_idx
            .get(meta_str(owner, "uid"))
            .cloned()
            .unwrap_or_default()
    }

    fn owned_rs(&self, d: &Value) -> Vec<Arc<Value>> {
        self.rs_idx
            .get(meta_str(d, "uid"))
            .cloned()
            .unwrap_or_default()
    }

    fn make_ready(&mut self, st: &mut State, prt: &ResourceType, p: &Value, ctx: &WriteCtx) {
        self.ip += 1;
        let ip = format!("10.244.{}.{}", (self.ip / 250) % 256, self.ip % 250 + 1);
        let now = crate::util::now_rfc3339();
        let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
        let statuses: Vec<Value> = p["spec"]["containers"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true, "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}}}))
                    .collect()
            })
            .unwrap_or_default();
        let mut n = p.clone();
        n["status"] = json!({
            "phase": "Running",
            "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
            "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": now, "qosClass": "BestEffort",
            "containerStatuses": statuses,
        });
        let _ = st.update(
            prt,
            meta_str(p, "namespace"),
            meta_str(p, "name"),
            "status",
            n,
            ctx,
        );
    }

    fn replicaset(
        &mut self,
        st: &mut State,
        _rsrt: &ResourceType,
        prt: &ResourceType,
        rs: &Value,
        ctx: &WriteCtx,
    ) {
        let want = rs["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let ns = meta_str(rs, "namespace").to_string();
        let mut pods = self.owned_pods(rs);
        if pods.len() < want {
            let tpl = &rs["spec"]["template"];
            for _ in pods.len()..want {
                let mut spec = tpl["spec"].clone();
                if spec.is_object() && spec["nodeName"].is_null() {
                    spec["nodeName"] = json!("apisim-node");
                }
                let mut meta = json!({
                    "generateName": format!("{}-", meta_str(rs, "name")),
                    "namespace": ns,
                    "ownerReferences": [owner_ref(rs, "apps/v1", "ReplicaSet")],
                });
                if tpl["metadata"]["labels"].is_object() {
                    meta["labels"] = tpl["metadata"]["labels"].clone();
                }
                if tpl["metadata"]["annotations"].is_object() {
                    meta["annotations"] = tpl["metadata"]["annotations"].clone();
                }
                let pod =
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec});
                let _ = st.create(prt, Some(&ns), pod, ctx);
            }
        } else if pods.len() > want {
            // delete not-ready first, then the lowest pod-deletion-cost, then newest (as
            // kube-controller-manager ranks them)
            pods.sort_by(|a, b| {
                pod_ready(a)
                    .cmp(&pod_ready(b))
                    .then_with(|| deletion_cost(a).cmp(&deletion_cost(b)))
                    .then_with(|| {
                        meta_str(b, "creationTimestamp").cmp(meta_str(a, "creationTimestamp"))
                    })
                    .then_with(|| {
                        meta_str(b, "resourceVersion")
                            .len()
                            .cmp(&meta_str(a, "resourceVersion").len())
                    })
                    .then_with(|| {
                        meta_str(b, "resourceVersion").cmp(meta_str(a, "resourceVersion"))
                    })
            });
            for p in pods.iter().take(pods.len() - want) {
                let _ = st.delete(prt, &ns, meta_str(p, "name"), &DeleteOpts::default());
            }
        }
    }

    fn rs_status(
        &mut self,
        st: &mut State,
        rsrt: &ResourceType,
        _prt: &ResourceType,
        rs: &Value,
        ctx: &WriteCtx,
    ) {
        let pods = self.owned_pods(rs);
        let ready = pods.iter().filter(|p| pod_ready(p)).count();
        let mut n = rs.clone();
        n["status"] = json!({
            "replicas": pods.len(), "fullyLabeledReplicas": pods.len(),
            "readyReplicas": ready, "availableReplicas": ready,
            "observedGeneration": rs["metadata"]["generation"],
        });
        if n["status"] != rs["status"] {
            let _ = st.update(
                rsrt,
                meta_str(rs, "namespace"),
                meta_str(rs, "name"),
                "status",
                n,
                ctx,
            );
        }
    }
}
