//! The deletion costs of a proxied pool's pods (`controller.kubernetes.io/pod-deletion-cost`,
//! computed with the proxy's slots by [`crate::proxy::membership`]): which pods' annotation
//! differs from its cost ([`to_annotate`], pure), and the merge patches that set it
//! ([`annotate`]). Only a differing annotation is written, so a converged pool costs no
//! request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::debug;

use super::context::{Context, Error};
use crate::builders::FIELD_MANAGER;
use crate::cached::CachedPod;
use crate::proxy::DELETION_COST_ANNOTATION;

/// The pods of `pods` (as cached) whose annotation is not their cost in `costs`, with the
/// value to write, sorted by pod. Pods being deleted are left alone.
pub(super) fn to_annotate(
    pods: &[std::sync::Arc<CachedPod>],
    costs: &BTreeMap<String, i32>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let name = p.name_any();
            let want = costs.get(&name)?.to_string();
            (p.deletion_cost.as_deref() != Some(want.as_str())).then_some((name, want))
        })
        .collect();
    out.sort();
    out
}

/// Sets the deletion cost of each pod of the Memcached `namespace/name` whose annotation
/// differs from `costs`. A pod gone meanwhile is skipped.
pub(super) async fn annotate(
    ctx: &Context,
    namespace: &str,
    name: &str,
    costs: &BTreeMap<String, i32>,
) -> Result<(), Error> {
    if costs.is_empty() {
        return Ok(());
    }
    let pods = ctx.pod_index.get(&format!("{namespace}/{name}"));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    for (pod, cost) in to_annotate(&pods, costs) {
        let patch = serde_json::json!({
            "metadata": {"annotations": {DELETION_COST_ANNOTATION: cost}}
        });
        match api.patch(&pod, &params, &Patch::Merge(&patch)).await {
            Ok(_) => debug!(pod, cost, "deletion cost set"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(Error::Patch {
                    kind: "Pod",
                    object: format!("{namespace}/{pod}"),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::Arc;

    fn pod(name: &str, cost: Option<&str>) -> Arc<CachedPod> {
        let mut pod = CachedPod {
            deletion_cost: cost.map(str::to_string),
            ..CachedPod::default()
        };
        pod.metadata.name = Some(name.into());
        Arc::new(pod)
    }

    #[test]
    fn only_pods_whose_annotation_differs_are_written() {
        let costs = BTreeMap::from([
            ("a".to_string(), 1000),
            ("b".to_string(), 999),
            ("c".to_string(), 998),
        ]);
        let mut deleting = (*pod("c", None)).clone();
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let pods = vec![
            pod("a", Some("1000")),
            pod("b", Some("5")),
            Arc::new(deleting),
            pod("outside", Some("7")),
            pod("d", None),
        ];
        assert_eq!(
            to_annotate(&pods, &costs),
            [("b".to_string(), "999".to_string())],
            "a is right, c is going, the others have no slot"
        );
        assert_eq!(to_annotate(&[pod("a", None)], &costs).len(), 1);
        assert!(to_annotate(&pods, &BTreeMap::new()).is_empty());
    }
}
