//! The raw-write bounds: each operator's own writes made by a bare client (the children our
//! builders or the peer's seed make, then a status write naming the Ready pods).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_api::Memcached;
use memcached_operator::builders::{self, BuildSettings};
use serde_json::{Value, json};

use super::tracker::{Track, lock};
use super::{Args, Contender, SIZE};
use crate::{BoxError, Result};

/// The peer's Deployment and Service for `mc`, as the seed builds them.
pub(super) fn peer_children(mc: &Memcached) -> Result<Vec<(ApiResource, Value)>> {
    let name = mc.name_any();
    let owner = json!([{
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "name": name, "uid": mc.uid().unwrap_or_default(),
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let labels = json!({"app": "memcached", "memcached_cr": name});
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "ownerReferences": owner},
        "spec": {
            "replicas": mc.spec.size,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "memcached", "image": "memcached:1.4.36-alpine",
                "command": ["memcached", "-m=64", "-o", "modern", "-v"],
                "ports": [{"containerPort": 11211, "name": "memcached"}],
            }]}},
        },
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "ownerReferences": owner},
        "spec": {"selector": labels, "ports": [{"port": 11211, "name": name}]},
    });
    Ok(vec![
        (ApiResource::erase::<Deployment>(&()), deployment),
        (
            ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            service,
        ),
    ])
}

/// Our children for `mc`, from the operator's builders: those of `objects` (see
/// `--bound-objects`), in that order.
pub(super) fn our_children(
    mc: &Memcached,
    objects: &[String],
) -> Result<Vec<(ApiResource, Value)>> {
    let settings = BuildSettings::default();
    let service = || ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let mut children = Vec::new();
    for object in objects {
        let child = match object.as_str() {
            "deployment" => (
                ApiResource::erase::<Deployment>(&()),
                serde_json::to_value(builders::desired_deployment(mc, &settings)?)?,
            ),
            "service" => (
                service(),
                serde_json::to_value(builders::desired_service(mc)?)?,
            ),
            "cluster-ip-service" => (
                service(),
                serde_json::to_value(builders::desired_cluster_ip_service(mc)?)?,
            ),
            "headless-service" => (
                service(),
                serde_json::to_value(builders::desired_headless_service(mc)?)?,
            ),
            "pdb" => match builders::desired_pdb(mc)? {
                Some(pdb) => (
                    ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&()),
                    serde_json::to_value(pdb)?,
                ),
                None => continue,
            },
            other => return Err(format!("unknown bound object {other:?}").into()),
        };
        children.push(child);
    }
    Ok(children)
}

/// The raw-write bound: children of every Memcached, then a status write per Memcached as
/// soon as its pods are Ready.
pub(super) async fn bound(
    client: &Client,
    ns: &str,
    crs: &[Memcached],
    who: Contender,
    track: &Arc<Mutex<Track>>,
    args: &Args,
) -> Result<u64> {
    let (concurrency, timeout) = (args.concurrency, args.timeout);
    let pp = PostParams::default();
    let writes = std::sync::atomic::AtomicU64::new(0);
    futures::stream::iter(crs)
        .map(|mc| {
            let (pp, writes) = (&pp, &writes);
            async move {
                let children = if who == Contender::PeerBound {
                    peer_children(mc)?
                } else {
                    our_children(mc, &args.bound_objects)?
                };
                for (resource, object) in children {
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(client.clone(), ns, &resource);
                    api.create(pp, &serde_json::from_value(object)?).await?;
                    writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    let api: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let mut pending: BTreeSet<String> = crs.iter().map(|m| m.name_any()).collect();
    let deadline = Instant::now() + timeout;
    while !pending.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("{} Memcacheds' pods not Ready in time", pending.len()).into());
        }
        let ready: Vec<(String, Vec<String>)> = {
            let t = lock(track);
            pending
                .iter()
                .filter_map(|name| {
                    let pods = t.ready.get(name)?;
                    (pods.len() == SIZE).then(|| (name.clone(), pods.iter().cloned().collect()))
                })
                .collect()
        };
        if ready.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        futures::stream::iter(&ready)
            .map(|(name, pods)| {
                let (api, writes) = (&api, &writes);
                async move {
                    api.patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"nodes": pods}})),
                    )
                    .await?;
                    writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok::<_, BoxError>(())
                }
            })
            .buffer_unordered(concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        for (name, _) in ready {
            pending.remove(&name);
        }
    }
    Ok(writes.into_inner())
}
