//! PodDisruptionBudget statuses as the disruption controller reports them: expected and
//! healthy pods, and how many disruptions are allowed.

use super::{Sim, deleting, pod_ready, resolve};
use crate::registry::ResourceType;
use crate::store::{State, WriteCtx};
use crate::util::meta_str;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

impl Sim {
    /// What the disruption controller reports: expected/healthy pods and allowed disruptions.
    pub(super) fn pdb_status(
        st: &mut State,
        pdbrt: &ResourceType,
        prt: &ResourceType,
        by_label: &HashMap<(String, String), Vec<Arc<Value>>>,
        pdb: &Value,
        ctx: &WriteCtx,
    ) {
        let ns = meta_str(pdb, "namespace").to_string();
        let sel = crate::selectors::LabelSelector::from_object(&pdb["spec"]["selector"]);
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
    pub(super) fn pods_by_label(
        st: &State,
        prt: &ResourceType,
    ) -> HashMap<(String, String), Vec<Arc<Value>>> {
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
}
