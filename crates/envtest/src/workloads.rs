//! The workload half of a control plane ([`Options::workloads`](crate::Options)): kwok's
//! fake nodes (zones, pod ranges, room for benchmarks) created, then the wait until they are
//! Ready and kube-controller-manager runs.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::{ControlPlane, Error, KWOK_NODE_ANNOTATION, START_TIMEOUT};

impl ControlPlane {
    pub(crate) async fn create_nodes(
        &self,
        client: &Client,
        n: usize,
        zones: bool,
    ) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        for i in 0..n {
            let zone = ["zone-a", "zone-b", "zone-c"][i % 3];
            let name = format!("kwok-node-{i}");
            let node: Node = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", "type": "kwok",
                        "topology.kubernetes.io/zone": zone,
                        "topology.kubernetes.io/region": "envtest",
                    },
                },
                // Each node its own pod range, from which kwok gives its pods their IPs.
                "spec": {"podCIDR": format!("10.{}.0.0/16", 100 + i), "podCIDRs": [format!("10.{}.0.0/16", 100 + i)]},
                "status": {
                    // Room for benchmarks: 5,000 size-3 Memcacheds (100m CPU and ~133 MiB
                    // each pod) on three nodes; node disk for extstore's emptyDirs.
                    "allocatable": {"cpu": "4000", "memory": "32Ti", "pods": "20000",
                                    "ephemeral-storage": "1Pi"},
                    "capacity": {"cpu": "4000", "memory": "32Ti", "pods": "20000",
                                 "ephemeral-storage": "1Pi"},
                },
            }))
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
            let mut node = node;
            if !zones && let Some(labels) = node.metadata.labels.as_mut() {
                labels.retain(|k, _| !k.starts_with("topology.kubernetes.io/"));
            }
            nodes.create(&PostParams::default(), &node).await?;
        }
        Ok(())
    }

    pub(crate) async fn wait_workloads_ready(
        &self,
        client: &Client,
        nodes: usize,
        begin: Instant,
    ) -> Result<(), Error> {
        let node_api: Api<Node> = Api::all(client.clone());
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        loop {
            self.check_alive()?;
            let ready = node_api
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|n| {
                            n.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                })
                        })
                        .count()
                })
                .unwrap_or(0);
            // kube-controller-manager's service-account controller is running once `default`
            // has its ServiceAccount (pods cannot be created before that).
            let controllers = sas.get_opt("default").await.ok().flatten().is_some();
            if ready >= nodes && controllers {
                return Ok(());
            }
            if begin.elapsed() > START_TIMEOUT {
                let who = if controllers {
                    "kwok"
                } else {
                    "kube-controller-manager"
                };
                return Err(self.component_error(
                    who,
                    &format!(
                        "was not ready within {START_TIMEOUT:?} ({ready} of {nodes} nodes Ready, default ServiceAccount {})",
                        if controllers { "present" } else { "missing" }
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
