//! The defaults kube-apiserver fills into built-in kinds on create and update (pod specs,
//! Deployments and ReplicaSets, Services, Secrets' stringData, namespaces' labels); custom
//! resources are defaulted from their schema instead.

use crate::registry::ResourceType;
use crate::util::{self, meta_mut, meta_str};
use serde_json::{Value, json};

pub(super) fn builtin_defaults(rt: &ResourceType, obj: &mut Value) {
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
                    let ip = format!("10.96.{}.{}", fastrand::u8(0..=255), fastrand::u8(1..=254));
                    spec["clusterIP"] = json!(ip);
                    spec["clusterIPs"] = json!([ip]);
                } else if spec["clusterIPs"].is_null() {
                    spec["clusterIPs"] = json!([spec["clusterIP"].clone()]);
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
