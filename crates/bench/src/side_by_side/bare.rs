//! `--bare`: on a control plane with no controllers (etcd and kube-apiserver only), the
//! operator against two bounds of a bare client, all timed until every Memcached has the
//! children the operator plans for it and a status of its generation (no pod ever exists):
//! - `minimal-creates`: per Memcached, a create of the cheapest object of each planned
//!   child's kind and name (a Deployment with one container and the selector labels only, a
//!   headless Service with the selector only, a PodDisruptionBudget with the selector and
//!   `maxUnavailable` only), then one merge patch of the status with `observedGeneration`
//!   alone: the fewest, cheapest requests that create a pool's objects;
//! - `ssa-bound`: per Memcached, a server-side apply of each child as the operator builds it
//!   (`children::plan`, field manager `memcached-operator`, forced), then one merge patch of
//!   the status the operator's own status function computes from the applied Deployment.
//!
//! `C` (`--concurrency`) Memcacheds in flight, each one's requests in sequence.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders::{self, BuildSettings, FIELD_MANAGER, SecretVersions};
use memcached_operator::children::{self, CHILDREN, Desired, Inputs, Kind, LiveServices};
use memcached_operator::status::{self, Observed};
use serde_json::{Value, json};

use super::Contender;
use crate::{BoxError, Result};

/// The children the operator plans for `mc` on a cluster that serves no optional kind (no
/// ServiceMonitor), with default settings and no Secrets: kind, name and desired state. A
/// size-3 pool's: Deployment, Service and PodDisruptionBudget, each named as the Memcached.
pub(super) fn planned(mc: &Memcached) -> Result<Vec<(Kind, String, Desired)>> {
    let settings = BuildSettings::default();
    let secrets = SecretVersions::default();
    let inputs = Inputs {
        settings: &settings,
        secrets: &secrets,
        backends: &[],
        services: LiveServices::default(),
    };
    Ok(children::plan(CHILDREN, mc, &inputs)?
        .into_iter()
        .filter(|p| p.child.kind.always_served())
        .filter_map(|p| p.desired.map(|d| (p.child.kind, p.name, d)))
        .collect())
}

/// The cheapest object of `kind` named `name` for a pool of `size` pods: the fields the
/// API server requires and the pool's selector labels, nothing else.
pub(super) fn minimal(kind: Kind, name: &str, size: i32) -> Result<Value> {
    let labels = builders::selector_labels(name);
    let selector = json!({"matchLabels": labels});
    Ok(match kind {
        Kind::Deployment => json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": size,
                "selector": selector,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [
                        {"name": builders::CONTAINER_NAME, "image": "memcached"}
                    ]},
                },
            },
        }),
        // Headless, as the operator's: no cluster IP to allocate, and no port required.
        Kind::Service => json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": labels},
        }),
        Kind::PodDisruptionBudget => json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"maxUnavailable": 1, "selector": selector},
        }),
        Kind::NetworkPolicy => json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name},
            "spec": {"podSelector": selector},
        }),
        Kind::HorizontalPodAutoscaler => json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name},
            "spec": {
                "maxReplicas": size.max(1),
                "scaleTargetRef": {"apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached", "name": name},
            },
        }),
        Kind::ConfigMap => json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name},
        }),
        Kind::ServiceMonitor => {
            return Err(format!("no minimal ServiceMonitor ({name}): not served here").into());
        }
    })
}

/// One bare bound (`minimal-creates` or `ssa-bound`) over `crs`; returns its writes.
pub(super) async fn bound(
    client: &Client,
    ns: &str,
    crs: &[Memcached],
    who: Contender,
    concurrency: usize,
) -> Result<u64> {
    let writes = AtomicU64::new(0);
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(crs)
        .map(|mc| {
            let (writes, memcacheds) = (&writes, &memcacheds);
            async move {
                let name = mc.name_any();
                let status = match who {
                    Contender::MinimalCreates => {
                        minimal_children(client, ns, mc, writes).await?;
                        json!({"observedGeneration": mc.metadata.generation})
                    }
                    Contender::SsaBound => {
                        let deployment = applied_children(client, ns, mc, writes).await?;
                        let observed = Observed {
                            deployment: deployment.as_ref(),
                            pods: Vec::new(),
                            problem: None,
                            proxy: None,
                            reload_failures: Vec::new(),
                            rollout_waiting: None,
                            flush: None,
                        };
                        serde_json::to_value(status::desired_status(
                            mc,
                            &observed,
                            jiff::Timestamp::now(),
                        ))?
                    }
                    other => return Err(format!("{} is not a bare bound", other.name()).into()),
                };
                memcacheds
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": status })),
                    )
                    .await?;
                writes.fetch_add(1, Ordering::Relaxed);
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(writes.into_inner())
}

/// Creates the minimal form of each planned child of `mc`.
async fn minimal_children(
    client: &Client,
    ns: &str,
    mc: &Memcached,
    writes: &AtomicU64,
) -> Result<()> {
    for (kind, name, _) in planned(mc)? {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &kind.api_resource());
        let object = minimal(kind, &name, mc.spec.size)?;
        api.create(&PostParams::default(), &serde_json::from_value(object)?)
            .await?;
        writes.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Applies each planned child of `mc` server-side, as the operator does; returns the pool's
/// Deployment as the API server answered the apply.
async fn applied_children(
    client: &Client,
    ns: &str,
    mc: &Memcached,
    writes: &AtomicU64,
) -> Result<Option<Deployment>> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let pool = mc.name_any();
    let mut deployment = None;
    for (kind, name, desired) in planned(mc)? {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &kind.api_resource());
        let answer = api
            .patch(&name, &params, &Patch::Apply(desired.to_json()?))
            .await?;
        writes.fetch_add(1, Ordering::Relaxed);
        if kind == Kind::Deployment && name == pool {
            deployment = Some(serde_json::from_value(serde_json::to_value(answer)?)?);
        }
    }
    Ok(deployment)
}

/// A Memcached of `size` as the API server returns it (namespace, uid, generation 1).
#[cfg(test)]
pub(super) fn pool(name: &str, size: i32) -> Memcached {
    let mut mc = super::memcached(name, size as usize).expect("memcached");
    mc.metadata.namespace = Some("ns".into());
    mc.metadata.uid = Some(format!("uid-{name}"));
    mc.metadata.generation = Some(1);
    mc
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    /// A size-3 pool's children, as the operator plans them: its Deployment, its Service and
    /// its PodDisruptionBudget, each named as the Memcached.
    #[test]
    fn a_size_3_pool_plans_deployment_service_and_budget() {
        let planned: Vec<(Kind, String)> = planned(&pool("sbs-00001", 3))
            .expect("plans")
            .into_iter()
            .map(|(kind, name, desired)| {
                assert_eq!(desired.kind(), kind);
                (kind, name)
            })
            .collect();
        assert_eq!(
            planned,
            [
                (Kind::Deployment, "sbs-00001".to_string()),
                (Kind::Service, "sbs-00001".to_string()),
                (Kind::PodDisruptionBudget, "sbs-00001".to_string()),
            ]
        );
        // One pod: no budget.
        let kinds: Vec<Kind> = planned_kinds(&pool("one", 1));
        assert_eq!(kinds, [Kind::Deployment, Kind::Service]);
    }

    fn planned_kinds(mc: &Memcached) -> Vec<Kind> {
        planned(mc)
            .expect("plans")
            .into_iter()
            .map(|(k, ..)| k)
            .collect()
    }

    /// The minimal objects are valid objects of their kind, named as the planned children,
    /// and hold only the selector labels and what the API server requires.
    #[test]
    fn minimal_objects_hold_only_what_is_required() {
        let mc = pool("sbs-00002", 3);
        let selector = json!({
            builders::LABEL_INSTANCE: "sbs-00002",
            "app.kubernetes.io/name": "memcached",
        });
        for (kind, name, _) in planned(&mc).expect("plans") {
            let object = minimal(kind, &name, 3).expect("minimal");
            assert_eq!(object["metadata"], json!({"name": name}), "{object}");
            assert_eq!(object["kind"], kind.name());
            let spec = object["spec"].as_object().expect("spec");
            match kind {
                Kind::Deployment => {
                    let typed: Deployment = serde_json::from_value(object.clone()).expect("typed");
                    let spec_keys: Vec<&String> = spec.keys().collect();
                    assert_eq!(spec_keys, ["replicas", "selector", "template"]);
                    assert_eq!(spec["selector"]["matchLabels"], selector);
                    assert_eq!(spec["template"]["metadata"]["labels"], selector);
                    let pod = typed.spec.expect("spec").template.spec.expect("pod spec");
                    assert_eq!(pod.containers.len(), 1);
                    assert_eq!(
                        serde_json::to_value(&pod.containers[0]).expect("json"),
                        json!({"name": "memcached", "image": "memcached"})
                    );
                }
                Kind::Service => {
                    let _: Service = serde_json::from_value(object.clone()).expect("typed");
                    assert_eq!(
                        object["spec"],
                        json!({"clusterIP": "None", "selector": selector})
                    );
                }
                Kind::PodDisruptionBudget => {
                    let _: PodDisruptionBudget =
                        serde_json::from_value(object.clone()).expect("typed");
                    assert_eq!(
                        object["spec"],
                        json!({"maxUnavailable": 1, "selector": {"matchLabels": selector}})
                    );
                }
                other => panic!("a size-3 pool has no {other:?}"),
            }
        }
        assert!(minimal(Kind::ServiceMonitor, "x", 3).is_err());
    }
}
