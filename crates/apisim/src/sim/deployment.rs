//! Deployments as kube-controller-manager rolls them out: a ReplicaSet per pod template
//! (named by its hash), scaled up and down within maxSurge / maxUnavailable (or all at once
//! with Recreate), and the Deployment's status and conditions.

use super::{Sim, owner_ref, pod_ready, resolve};
use crate::registry::ResourceType;
use crate::store::{State, WriteCtx};
use crate::util::meta_str;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Sim {
    fn template_hash(tpl: &Value) -> String {
        let s = serde_json::to_string(tpl).unwrap_or_default();
        crate::util::safe_encode(crate::util::fnv64(&s), 10)
    }

    pub(super) fn deployment(
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

    pub(super) fn deploy_status(
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
