//! Synchronous reviews (TokenReview, SubjectAccessReview) and the workload simulator
//! (Deployments → ReplicaSets → Pods, pods turning Ready after a delay).

use crate::Inner;
use crate::error::ApiError;
use crate::registry::ResourceType;
use crate::store::{DeleteOpts, Event, State, WriteCtx};
use crate::util::meta_str;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

// ------------------------------------------------------------------ reviews

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Answer a TokenReview or SubjectAccessReview (nothing is stored).
pub fn review(st: &State, rt: &ResourceType, mut obj: Value) -> Result<Value, ApiError> {
    match rt.kind.as_str() {
        "TokenReview" => {
            let token = obj["spec"]["token"].as_str().unwrap_or("");
            obj["status"] = match st.tokens.get(token) {
                Some((user, groups)) => json!({
                    "authenticated": true,
                    "user": {"username": user, "groups": groups},
                    "audiences": obj["spec"]["audiences"].clone(),
                }),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            Ok(obj)
        }
        "SubjectAccessReview" => {
            let (allowed, reason) = rbac_allows(st, &obj["spec"]);
            obj["status"] = json!({"allowed": allowed, "reason": reason});
            Ok(obj)
        }
        _ => Err(ApiError::method_not_allowed("create only")),
    }
}

fn rbac_allows(st: &State, spec: &Value) -> (bool, String) {
    let user = spec["user"].as_str().unwrap_or("");
    let groups = str_list(&spec["groups"]);
    if groups.iter().any(|g| g == "system:masters") {
        return (true, "system:masters".into());
    }
    let ra = &spec["resourceAttributes"];
    let nra = &spec["nonResourceAttributes"];
    let ns = ra["namespace"].as_str().unwrap_or("");
    let subject_matches = |b: &Value| -> bool {
        b["subjects"].as_array().is_some_and(|subs| {
            subs.iter().any(|s| {
                let name = s["name"].as_str().unwrap_or("");
                match s["kind"].as_str().unwrap_or("") {
                    "User" => name == user,
                    "Group" => groups.iter().any(|g| g == name),
                    "ServiceAccount" => {
                        user == format!(
                            "system:serviceaccount:{}:{}",
                            s["namespace"].as_str().unwrap_or(""),
                            name
                        )
                    }
                    _ => false,
                }
            })
        })
    };
    let rbac = "rbac.authorization.k8s.io".to_string();
    let role_rules = |kind: &str, name: &str, bns: &str| -> Vec<Value> {
        let (plural, rns) = if kind == "ClusterRole" {
            ("clusterroles", "")
        } else {
            ("roles", bns)
        };
        st.get(&(rbac.clone(), plural.into()), rns, name)
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let rule_ok = |rule: &Value| -> bool {
        let verbs = str_list(&rule["verbs"]);
        if nra.is_object() {
            let path = nra["path"].as_str().unwrap_or("");
            let verb = nra["verb"].as_str().unwrap_or("");
            return has(&verbs, verb)
                && str_list(&rule["nonResourceURLs"]).iter().any(|u| {
                    u == "*"
                        || u == path
                        || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                });
        }
        let verb = ra["verb"].as_str().unwrap_or("");
        let group = ra["group"].as_str().unwrap_or("");
        let resource = ra["resource"].as_str().unwrap_or("");
        let sub = ra["subresource"].as_str().unwrap_or("");
        let name = ra["name"].as_str().unwrap_or("");
        let full = if sub.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{sub}")
        };
        let resources = str_list(&rule["resources"]);
        let names = str_list(&rule["resourceNames"]);
        has(&verbs, verb)
            && has(&str_list(&rule["apiGroups"]), group)
            && (resources
                .iter()
                .any(|r| r == "*" || *r == full || (!sub.is_empty() && *r == format!("*/{sub}"))))
            && (names.is_empty() || names.iter().any(|n| n == name))
    };
    for b in st.list(&(rbac.clone(), "clusterrolebindings".into()), None) {
        if subject_matches(&b) {
            let rr = &b["roleRef"];
            if role_rules("ClusterRole", rr["name"].as_str().unwrap_or(""), "")
                .iter()
                .any(rule_ok)
            {
                return (
                    true,
                    format!(
                        "RBAC: allowed by ClusterRoleBinding \"{}\"",
                        meta_str(&b, "name")
                    ),
                );
            }
        }
    }
    if !ns.is_empty() && nra.is_null() {
        for b in st.list(&(rbac.clone(), "rolebindings".into()), Some(ns)) {
            if subject_matches(&b) {
                let rr = &b["roleRef"];
                let kind = rr["kind"].as_str().unwrap_or("Role");
                if role_rules(kind, rr["name"].as_str().unwrap_or(""), ns)
                    .iter()
                    .any(rule_ok)
                {
                    return (
                        true,
                        format!(
                            "RBAC: allowed by RoleBinding \"{}/{}\"",
                            ns,
                            meta_str(&b, "name")
                        ),
                    );
                }
            }
        }
    }
    (false, String::new())
}

// ------------------------------------------------------------------ simulator

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

    /// What the disruption controller reports: expected/healthy pods and allowed disruptions.
    fn pdb_status(
        st: &mut State,
        pdbrt: &ResourceType,
        prt: &ResourceType,
        by_label: &HashMap<(String, String), Vec<Arc<Value>>>,
        pdb: &Value,
        ctx: &WriteCtx,
    ) {
        let ns = meta_str(pdb, "namespace").to_string();
        let sel = crate::util::LabelSelector::from_object(&pdb["spec"]["selector"]);
        // Candidates: the pods carrying the rarest of the selector's matchLabels (every
        // match must carry all of them); without matchLabels, every pod of the namespace.
        let rarest = pdb["spec"]["selector"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?)))
            .map(|kv| {
                by_label
                    .get(&(ns.clone(), kv))
                    .map_or(&[][..], Vec::as_slice)
            })
            .min_by_key(|c| c.len());
        let candidates: Vec<Arc<Value>> = match rarest {
            Some(c) => c.to_vec(),
            None => st.list(&prt.key(), Some(&ns)),
        };
        let pods: Vec<Arc<Value>> = candidates
            .into_iter()
            .filter(|p| !deleting(p) && sel.matches(p))
            .collect();
        let expected = pods.len() as i64;
        let healthy = pods.iter().filter(|p| pod_ready(p)).count() as i64;
        let spec = &pdb["spec"];
        let desired = if !spec["minAvailable"].is_null() {
            resolve(&spec["minAvailable"], expected, true, 0)
        } else if !spec["maxUnavailable"].is_null() {
            (expected - resolve(&spec["maxUnavailable"], expected, true, 0)).max(0)
        } else {
            0
        };
        let allowed = (healthy - desired).max(0);
        let (cs, reason) = if allowed > 0 {
            ("True", "SufficientPods")
        } else {
            ("False", "InsufficientPods")
        };
        let old_c = pdb["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == "DisruptionAllowed"))
            .cloned();
        let cond = match old_c {
            Some(c) if c["status"] == cs && c["reason"] == reason => c,
            _ => json!({"type": "DisruptionAllowed", "status": cs, "reason": reason, "message": "",
                "lastTransitionTime": crate::util::now_rfc3339(), "observedGeneration": pdb["metadata"]["generation"]}),
        };
        let status = json!({
            "observedGeneration": pdb["metadata"]["generation"],
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [cond],
        });
        if pdb["status"] != status {
            let mut n = pdb.clone();
            n["status"] = status;
            let _ = st.update(pdbrt, &ns, meta_str(pdb, "name"), "status", n, ctx);
        }
    }

    /// Non-deleting pods grouped by (namespace, "key=value") for each of their labels.
    fn pods_by_label(st: &State, prt: &ResourceType) -> HashMap<(String, String), Vec<Arc<Value>>> {
        let mut m: HashMap<(String, String), Vec<Arc<Value>>> = HashMap::new();
        for p in st.list(&prt.key(), None) {
            if deleting(&p) {
                continue;
            }
            let ns = meta_str(&p, "namespace");
            for (k, v) in p["metadata"]["labels"].as_object().into_iter().flatten() {
                if let Some(v) = v.as_str() {
                    m.entry((ns.to_string(), format!("{k}={v}")))
                        .or_default()
                        .push(p.clone());
                }
            }
        }
        m
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

    fn template_hash(tpl: &Value) -> String {
        let s = serde_json::to_string(tpl).unwrap_or_default();
        crate::util::safe_encode(crate::util::fnv64(&s), 10)
    }

    fn deployment(
        &mut self,
        st: &mut State,
        _drt: &ResourceType,
        rsrt: &ResourceType,
        _prt: &ResourceType,
        d: &Value,
        ctx: &WriteCtx,
    ) {
        let ns = meta_str(d, "namespace").to_string();
        let want = d["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
        let tpl = d["spec"]["template"].clone();
        let hash = Self::template_hash(&tpl);
        let rss = self.owned_rs(d);
        let new_rs = rss
            .iter()
            .find(|r| r["metadata"]["labels"]["pod-template-hash"] == hash.as_str())
            .cloned();
        let olds: Vec<Arc<Value>> = rss
            .iter()
            .filter(|r| r["metadata"]["labels"]["pod-template-hash"] != hash.as_str())
            .cloned()
            .collect();
        let spec_of = |r: &Value| r["spec"]["replicas"].as_i64().unwrap_or(0);
        let old_total: i64 = olds.iter().map(|r| spec_of(r)).sum();
        let recreate = d["spec"]["strategy"]["type"] == "Recreate";
        let ru = &d["spec"]["strategy"]["rollingUpdate"];
        let mut surge = resolve(&ru["maxSurge"], want, true, 25);
        let unavail = resolve(&ru["maxUnavailable"], want, false, 25);
        if surge == 0 && unavail == 0 {
            surge = 1;
        }
        let new_cur = new_rs.as_deref().map(spec_of).unwrap_or(0);
        let mut new_want = if old_total == 0 {
            want
        } else if recreate {
            0
        } else {
            let all = new_cur + old_total;
            let room = (want + surge - all).max(0);
            (new_cur + room).min(want).max(new_cur.min(want))
        };
        if recreate && old_total == 0 {
            new_want = want;
        }
        // old replica sets scale down
        let mut scale_old: Vec<(Arc<Value>, i64)> = vec![];
        if old_total > 0 {
            if recreate {
                scale_old = olds.iter().map(|r| (r.clone(), 0)).collect();
            } else {
                let ready_all: i64 = rss
                    .iter()
                    .map(|r| self.owned_pods(r).iter().filter(|p| pod_ready(p)).count() as i64)
                    .sum();
                let old_unready: i64 = olds
                    .iter()
                    .map(|r| {
                        (spec_of(r)
                            - self.owned_pods(r).iter().filter(|p| pod_ready(p)).count() as i64)
                            .max(0)
                    })
                    .sum();
                let mut budget = (ready_all - (want - unavail)).max(0) + old_unready;
                // when the desired count went down, old replicas above the target can go as well
                let excess = (new_want + old_total - (want + surge)).max(0);
                budget = budget.max(excess);
                for r in &olds {
                    let cur = spec_of(r);
                    let cut = cur.min(budget);
                    budget -= cut;
                    if cut > 0 {
                        scale_old.push((r.clone(), cur - cut));
                    }
                }
            }
        }
        for (r, n) in scale_old {
            let mut nr = (*r).clone();
            nr["spec"]["replicas"] = json!(n);
            let _ = st.update(rsrt, &ns, meta_str(&r, "name"), "", nr, ctx);
        }
        let revision = rss
            .iter()
            .filter_map(|r| {
                r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                    .as_str()
                    .and_then(|s| s.parse::<i64>().ok())
            })
            .max()
            .unwrap_or(0);
        match new_rs {
            Some(r) => {
                if spec_of(&r) != new_want {
                    let mut nr = (*r).clone();
                    nr["spec"]["replicas"] = json!(new_want);
                    let _ = st.update(rsrt, &ns, meta_str(&r, "name"), "", nr, ctx);
                }
            }
            None => {
                let mut labels = tpl["metadata"]["labels"].clone();
                if !labels.is_object() {
                    labels = json!({});
                }
                labels["pod-template-hash"] = json!(hash);
                let mut rtpl = tpl.clone();
                if !rtpl["metadata"].is_object() {
                    rtpl["metadata"] = json!({});
                }
                rtpl["metadata"]["labels"] = labels.clone();
                let mut sel = d["spec"]["selector"].clone();
                if !sel.is_object() {
                    sel = json!({});
                }
                if !sel["matchLabels"].is_object() {
                    sel["matchLabels"] = json!({});
                }
                sel["matchLabels"]["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": format!("{}-{}", meta_str(d, "name"), hash),
                        "namespace": ns,
                        "labels": labels,
                        "annotations": {"deployment.kubernetes.io/revision": (revision + 1).to_string(), "deployment.kubernetes.io/desired-replicas": want.to_string()},
                        "ownerReferences": [owner_ref(d, "apps/v1", "Deployment")],
                    },
                    "spec": {"replicas": new_want, "selector": sel, "template": rtpl},
                });
                let _ = st.create(rsrt, Some(&ns), rs, ctx);
            }
        }
    }

    fn deploy_status(
        &mut self,
        st: &mut State,
        drt: &ResourceType,
        _rsrt: &ResourceType,
        _prt: &ResourceType,
        d: &Value,
        ctx: &WriteCtx,
    ) {
        let want = d["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
        let hash = Self::template_hash(&d["spec"]["template"]);
        let rss = self.owned_rs(d);
        let mut total = 0i64;
        let mut updated = 0i64;
        let mut ready = 0i64;
        let mut new_name = String::new();
        for r in &rss {
            let pods = self.owned_pods(r);
            total += pods.len() as i64;
            ready += pods.iter().filter(|p| pod_ready(p)).count() as i64;
            if r["metadata"]["labels"]["pod-template-hash"] == hash.as_str() {
                updated += pods.len() as i64;
                new_name = meta_str(r, "name").to_string();
            }
        }
        let ru = &d["spec"]["strategy"]["rollingUpdate"];
        let unavail_allowed = if d["spec"]["strategy"]["type"] == "Recreate" {
            0
        } else {
            resolve(&ru["maxUnavailable"], want, false, 25)
        };
        let available = ready;
        let old_conds: BTreeMap<String, Value> = d["status"]["conditions"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| (c["type"].as_str().unwrap_or("").to_string(), c.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let now = crate::util::now_rfc3339();
        let cond = |t: &str, status: &str, reason: &str, msg: String| -> Value {
            match old_conds.get(t) {
                Some(c) if c["status"] == status && c["reason"] == reason => c.clone(),
                _ => {
                    json!({"type": t, "status": status, "reason": reason, "message": msg, "lastUpdateTime": now, "lastTransitionTime": now})
                }
            }
        };
        let avail_c = if available >= want - unavail_allowed {
            cond(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            cond(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        };
        let done = updated == want && total == want && available >= want;
        let prog_c = if done {
            cond(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_name}\" has successfully progressed."),
            )
        } else {
            cond(
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{new_name}\" is progressing."),
            )
        };
        let mut status = json!({
            "observedGeneration": d["metadata"]["generation"],
            "replicas": total, "updatedReplicas": updated, "readyReplicas": ready,
            "availableReplicas": available,
            "conditions": [avail_c, prog_c],
        });
        let unavailable = (want - available).max(0);
        if unavailable > 0 {
            status["unavailableReplicas"] = json!(unavailable);
        }
        if d["status"] != status {
            let mut n = d.clone();
            n["status"] = status;
            let _ = st.update(
                drt,
                meta_str(d, "namespace"),
                meta_str(d, "name"),
                "status",
                n,
                ctx,
            );
        }
    }
}
