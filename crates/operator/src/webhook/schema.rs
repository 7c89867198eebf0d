//! What the webhooks read from the generated CRD schema: the defaults it declares (which
//! the defaulting webhook applies) and the fields of `spec` (which decoding accepts), so
//! neither can drift from the CRD.

use std::sync::OnceLock;

use kube::CustomResourceExt;
use memcached_api::{Memcached, VERSION};
use serde_json::Value;

/// The defaults the generated CRD schema declares, as `(JSON pointer, value)` pairs below
/// the root (today: `/spec/containerPort` = 11211).
pub fn schema_defaults() -> &'static [(String, Value)] {
    static DEFAULTS: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    DEFAULTS.get_or_init(|| {
        let mut out = Vec::new();
        if let Some(schema) = crd_schema() {
            collect_defaults(&schema, "", &mut out);
        }
        out
    })
}

fn collect_defaults(schema: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, sub) in props {
        if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status")
        {
            continue;
        }
        let pointer = format!("{path}/{key}");
        if let Some(default) = sub.get("default") {
            out.push((pointer.clone(), default.clone()));
        }
        collect_defaults(sub, &pointer, out);
    }
}

/// Applies [`schema_defaults`] as the API server's structural defaulting does: a default
/// fills a field that is absent or null, inside objects that exist.
pub fn apply_schema_defaults(object: &mut Value) {
    for (pointer, default) in schema_defaults() {
        let Some((parent, key)) = pointer.rsplit_once('/') else {
            continue;
        };
        let parent = if parent.is_empty() {
            Some(&mut *object)
        } else {
            object.pointer_mut(parent)
        };
        if let Some(Value::Object(map)) = parent {
            match map.get(key) {
                None | Some(Value::Null) => {
                    map.insert(key.to_string(), default.clone());
                }
                Some(_) => {}
            }
        }
    }
}

/// The fields of `spec`, as the generated CRD schema declares them (so a field added to
/// the Rust types is known here without another list to keep).
pub(super) fn spec_fields() -> &'static [String] {
    static FIELDS: OnceLock<Vec<String>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        crd_schema()
            .as_ref()
            .and_then(|s| s.pointer("/properties/spec/properties"))
            .and_then(Value::as_object)
            .map(|props| props.keys().cloned().collect())
            .unwrap_or_default()
    })
}

/// The generated CRD's schema of the served version, as JSON.
fn crd_schema() -> Option<Value> {
    Memcached::crd()
        .spec
        .versions
        .iter()
        .find(|v| v.name == VERSION)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_defaults_are_exactly_the_crds() {
        // Nested defaults apply only inside objects the user wrote (`spec.config`,
        // `spec.exporter`, `spec.proxy`, `spec.extstore`, `spec.rollout`, `spec.gracefulShutdown`, `spec.networkPolicy`, `spec.autoscaling`, `spec.flush`), as the API server's structural defaulting does.
        let want: Vec<(String, Value)> = [
            // One pod at least, and ten minutes before a pod is removed.
            ("/spec/autoscaling/minReplicas", Value::from(1)),
            (
                "/spec/autoscaling/scaleDownStabilizationSeconds",
                Value::from(600),
            ),
            ("/spec/config/maxConnections", Value::from(1024)),
            ("/spec/config/maxItemSize", Value::from("1m")),
            ("/spec/config/memoryMiB", Value::from(64)),
            ("/spec/config/threads", Value::from(4)),
            ("/spec/config/verbosity", Value::from(1)),
            ("/spec/containerPort", Value::from(11211)),
            ("/spec/exporter/enabled", Value::from(false)),
            // memcached's own extstore defaults, and a 1 GiB file.
            ("/spec/extstore/enabled", Value::from(false)),
            ("/spec/extstore/itemSizeBytes", Value::from(512)),
            ("/spec/extstore/pageSizeMiB", Value::from(64)),
            ("/spec/extstore/size", Value::from("1Gi")),
            ("/spec/extstore/threads", Value::from(1)),
            ("/spec/extstore/writeBufferMiB", Value::from(4)),
            // Half a minute between two pods flushed.
            ("/spec/flush/pauseSeconds", Value::from(30)),
            // No delay unless one is given.
            ("/spec/gracefulShutdown/preStopDelaySeconds", Value::from(0)),
            ("/spec/networkPolicy/enabled", Value::from(false)),
            ("/spec/proxy/copies", Value::from(1)),
            ("/spec/proxy/enabled", Value::from(false)),
            // A gutter of 32 MiB per proxy pod, holding values 10 s.
            ("/spec/proxy/gutter/enabled", Value::from(false)),
            ("/spec/proxy/gutter/memoryMiB", Value::from(32)),
            ("/spec/proxy/gutter/ttlSeconds", Value::from(10)),
            ("/spec/proxy/replicas", Value::from(2)),
            ("/spec/proxy/warmUp/enabled", Value::from(false)),
            ("/spec/rollout/minReadySeconds", Value::from(30)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(schema_defaults(), want.as_slice());
    }

    #[test]
    fn defaults_fill_absent_and_null_fields_only() {
        let mut v = serde_json::json!({"spec": {"size": 1}});
        apply_schema_defaults(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"spec": {"size": 1, "containerPort": 11211}})
        );
        let mut v = serde_json::json!({"spec": {"size": 1, "containerPort": null}});
        apply_schema_defaults(&mut v);
        assert_eq!(v["spec"]["containerPort"], 11211);
        let mut v = serde_json::json!({"spec": {"containerPort": 1}});
        apply_schema_defaults(&mut v);
        assert_eq!(v["spec"]["containerPort"], 1);
        let mut v = serde_json::json!({"spec": null});
        apply_schema_defaults(&mut v);
        assert_eq!(v, serde_json::json!({"spec": null}));
    }
}
