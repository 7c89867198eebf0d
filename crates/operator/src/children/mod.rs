//! The one list of what a Memcached owns: [`CHILDREN`].
//!
//! Each kind of child is described once: its name, its pure builder (which also says
//! whether this Memcached has it), and its [`Kind`] (and so its cache, its API and the verbs
//! the operator needs on it). Everything that must know a pool's children walks this list:
//! the reconciler applies, deletes and checks drift and ownership through one apply path
//! (`controller::apply`), the validating webhook dry-runs the same children
//! (`webhook::dry_run`), RBAC is generated from their kinds ([`crate::rbac::manager_rules`]),
//! and where a Memcached's fields land in each child is found by building it
//! ([`origins`]). Adding a child is one entry here and one builder.

pub mod origins;

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ApiResource;
use memcached_api::{Memcached, ProxyBackend};
use serde_json::Value;

use crate::builders::{self, BuildError, BuildSettings, SecretVersions, ServiceMonitor};
use crate::proxy;
use crate::rbac::Rule;

/// The kinds of object a Memcached may own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Deployment,
    Service,
    PodDisruptionBudget,
    ConfigMap,
    ServiceMonitor,
    NetworkPolicy,
    HorizontalPodAutoscaler,
}

/// The CustomResourceDefinition of the Prometheus Operator's ServiceMonitor: while it
/// exists, ServiceMonitors are watched and managed (see `informer::WhileServed`).
pub const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";

impl Kind {
    /// The kind's name, as Kubernetes and the reconcile's events name it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::Service => "Service",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
            Kind::ConfigMap => "ConfigMap",
            Kind::ServiceMonitor => "ServiceMonitor",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
        }
    }

    /// Its API (group, version, plural).
    pub fn api_resource(self) -> ApiResource {
        match self {
            Kind::Deployment => ApiResource::erase::<Deployment>(&()),
            Kind::Service => ApiResource::erase::<Service>(&()),
            Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
            Kind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
            Kind::ServiceMonitor => ApiResource::erase::<ServiceMonitor>(&()),
            Kind::NetworkPolicy => ApiResource::erase::<NetworkPolicy>(&()),
            Kind::HorizontalPodAutoscaler => ApiResource::erase::<HorizontalPodAutoscaler>(&()),
        }
    }

    /// Whether every cluster serves it; the children of a kind that is not served are
    /// neither applied nor deleted (and their dry run is skipped).
    pub const fn always_served(self) -> bool {
        !matches!(self, Kind::ServiceMonitor)
    }

    /// The RBAC rule the controller needs for it: server-side apply (`patch`, and `create`,
    /// which the API server checks when the apply creates the object), `delete` for a child
    /// that goes when the spec no longer wants it, `get` to look for an object of a child's
    /// name before creating it, and the informer's `list` and `watch`.
    pub const fn rule(self) -> Rule {
        let verbs: &[&str] = &["create", "delete", "get", "list", "patch", "watch"];
        let (api_groups, resources): (&[&str], &[&str]) = match self {
            Kind::Deployment => (&["apps"], &["deployments"]),
            Kind::Service => (&[""], &["services"]),
            Kind::PodDisruptionBudget => (&["policy"], &["poddisruptionbudgets"]),
            Kind::ConfigMap => (&[""], &["configmaps"]),
            Kind::ServiceMonitor => (&["monitoring.coreos.com"], &["servicemonitors"]),
            Kind::NetworkPolicy => (&["networking.k8s.io"], &["networkpolicies"]),
            Kind::HorizontalPodAutoscaler => (&["autoscaling"], &["horizontalpodautoscalers"]),
        };
        Rule {
            api_groups,
            resources,
            verbs,
            resource_names: &[],
        }
    }
}

/// A child's desired state, of its kind.
#[derive(Clone, Debug, PartialEq)]
// A few per reconcile, each moved once into its apply: the sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Desired {
    Deployment(Deployment),
    Service(Service),
    PodDisruptionBudget(PodDisruptionBudget),
    ConfigMap(ConfigMap),
    ServiceMonitor(ServiceMonitor),
    NetworkPolicy(NetworkPolicy),
    HorizontalPodAutoscaler(HorizontalPodAutoscaler),
}

impl Desired {
    pub fn kind(&self) -> Kind {
        match self {
            Desired::Deployment(_) => Kind::Deployment,
            Desired::Service(_) => Kind::Service,
            Desired::PodDisruptionBudget(_) => Kind::PodDisruptionBudget,
            Desired::ConfigMap(_) => Kind::ConfigMap,
            Desired::ServiceMonitor(_) => Kind::ServiceMonitor,
            Desired::NetworkPolicy(_) => Kind::NetworkPolicy,
            Desired::HorizontalPodAutoscaler(_) => Kind::HorizontalPodAutoscaler,
        }
    }

    /// The object as it is applied.
    pub fn to_json(&self) -> serde_json::Result<Value> {
        match self {
            Desired::Deployment(o) => serde_json::to_value(o),
            Desired::Service(o) => serde_json::to_value(o),
            Desired::PodDisruptionBudget(o) => serde_json::to_value(o),
            Desired::ConfigMap(o) => serde_json::to_value(o),
            Desired::ServiceMonitor(o) => serde_json::to_value(o),
            Desired::NetworkPolicy(o) => serde_json::to_value(o),
            Desired::HorizontalPodAutoscaler(o) => serde_json::to_value(o),
        }
    }
}

/// What the builders need besides the Memcached itself.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The operator's settings (default images).
    pub settings: &'a BuildSettings,
    /// Digests of the Secrets the pods mount (none in the webhook's dry run).
    pub secrets: &'a SecretVersions,
    /// The proxy's backends, from the pool's pods (none in the webhook's dry run).
    pub backends: &'a [ProxyBackend],
    /// The pool's Services as they stand.
    pub services: LiveServices,
}

/// A pool's client Services as they stand, which decide the form they keep. A pool has one
/// Service, `NAME`, headless; earlier releases created `NAME` with a cluster IP, which a
/// Service keeps for life, and `NAME-headless` beside it. Such a pool keeps both as they
/// are (clients may hold the cluster IP or resolve either name) until `NAME` is deleted:
/// then `NAME` is created headless. `NAME-headless` is kept while it exists and is never
/// created beside a headless `NAME`; deleting it is the user's call, once no client
/// resolves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveServices {
    /// `NAME` is ours and has a cluster IP.
    pub cluster_ip: bool,
    /// `NAME-headless` of ours exists.
    pub headless: bool,
}

impl LiveServices {
    /// From the live `NAME`'s and `NAME-headless`'s specs (as the API server returned
    /// them; `None` where the Service is not there or not ours).
    pub fn of(name: Option<&Value>, headless: Option<&Value>) -> Self {
        let cluster_ip = name
            .and_then(|spec| spec.get("clusterIP"))
            .and_then(Value::as_str)
            .is_some_and(|ip| !ip.is_empty() && ip != "None");
        Self {
            cluster_ip,
            headless: headless.is_some(),
        }
    }
}

/// How a change to a child is told in the reconcile's event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// "Created Service NAME", "Updated Service NAME to the desired spec".
    Plain,
    /// The pool's size: "Created Deployment NAME with 3 replicas", "Scaled Deployment NAME
    /// from 3 to 5 replicas".
    Replicas,
}

/// What a child keeps of its live form when only the operator changed (an upgrade of the
/// operator, a new default image of a helper): see `controller::rollout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Nothing: the child is what its builder says.
    Nothing,
    /// A pool's Deployment: the live form of its pod helpers (the TLS reload agent, the
    /// exporter, the Secrets' and extstore's volumes) until its template changes for a
    /// reason of its own, and the live memcached image until a fleet-wide rollout slot is
    /// free.
    PodHelpers,
}

/// One entry of the list: a kind of child a Memcached may own.
#[derive(Clone, Copy, Debug)]
pub struct Child {
    /// How errors and refusals name it ("Service", "proxy Deployment"): its kind, and what it
    /// is for where two children of one kind must be told apart.
    pub role: &'static str,
    pub kind: Kind,
    /// Its name, from the Memcached's.
    pub name: fn(&str) -> String,
    /// Its desired state for a Memcached, or `None` when that Memcached has no such child
    /// (then an existing one of ours is deleted). Pure.
    pub build: fn(&Memcached, &Inputs<'_>) -> Result<Option<Desired>, BuildError>,
    pub report: Report,
    pub keep: Keep,
}

/// The role of the proxy's Deployment, in errors and in the webhook's refusals.
pub const PROXY_DEPLOYMENT: &str = "proxy Deployment";

/// Every child a Memcached may own, in the order the reconcile's event names them.
pub static CHILDREN: &[Child] = &[
    // The pool: memcached pods, `spec.size` of them.
    Child {
        role: "Deployment",
        kind: Kind::Deployment,
        name: |name| name.to_string(),
        build: |mc, inputs| {
            builders::desired_deployment_with(mc, inputs.settings, inputs.secrets)
                .map(|d| Some(Desired::Deployment(d)))
        },
        report: Report::Replicas,
        keep: Keep::PodHelpers,
    },
    // The client Service: headless, DNS names every ready pod (an earlier release's
    // ClusterIP `NAME` keeps its form; see `LiveServices`).
    Child {
        role: "Service",
        kind: Kind::Service,
        name: |name| name.to_string(),
        build: |mc, inputs| {
            if inputs.services.cluster_ip {
                builders::desired_cluster_ip_service(mc)
            } else {
                builders::desired_service(mc)
            }
            .map(|s| Some(Desired::Service(s)))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // An earlier release's `NAME-headless`, kept where it stands (never created beside a
    // headless `NAME`; never deleted by the operator while the Memcached lives).
    Child {
        role: "Service",
        kind: Kind::Service,
        name: builders::headless_name,
        build: |mc, inputs| {
            let services = inputs.services;
            if !(services.cluster_ip || services.headless) {
                return Ok(None);
            }
            builders::desired_headless_service(mc).map(|s| Some(Desired::Service(s)))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // One voluntary disruption at a time, from two pods.
    Child {
        role: "PodDisruptionBudget",
        kind: Kind::PodDisruptionBudget,
        name: |name| name.to_string(),
        build: |mc, _| builders::desired_pdb(mc).map(|p| p.map(Desired::PodDisruptionBudget)),
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // The exporter's scrape, where the Prometheus Operator is installed.
    Child {
        role: "ServiceMonitor",
        kind: Kind::ServiceMonitor,
        name: |name| name.to_string(),
        build: |mc, _| {
            builders::desired_service_monitor(mc).map(|m| m.map(Desired::ServiceMonitor))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // memcached's proxy in front of the pool (`spec.proxy`).
    Child {
        role: PROXY_DEPLOYMENT,
        kind: Kind::Deployment,
        name: proxy::proxy_name,
        build: |mc, inputs| {
            proxy::desired_proxy_deployment(mc, inputs.settings).map(|d| d.map(Desired::Deployment))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    Child {
        role: "Service",
        kind: Kind::Service,
        name: proxy::proxy_name,
        build: |mc, _| proxy::desired_proxy_service(mc).map(|s| s.map(Desired::Service)),
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    Child {
        role: "PodDisruptionBudget",
        kind: Kind::PodDisruptionBudget,
        name: proxy::proxy_name,
        build: |mc, _| proxy::desired_proxy_pdb(mc).map(|p| p.map(Desired::PodDisruptionBudget)),
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // The proxy's routes: the pool's pods as backends.
    Child {
        role: "ConfigMap",
        kind: Kind::ConfigMap,
        name: proxy::proxy_name,
        build: |mc, inputs| {
            proxy::desired_proxy_config_map(mc, inputs.backends)
                .map(|c| c.map(|(config_map, _)| Desired::ConfigMap(config_map)))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // Who may reach the pool's pods and the proxy's (`spec.networkPolicy`).
    Child {
        role: "NetworkPolicy",
        kind: Kind::NetworkPolicy,
        name: |name| name.to_string(),
        build: |mc, _| builders::desired_network_policy(mc).map(|p| p.map(Desired::NetworkPolicy)),
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    Child {
        role: "NetworkPolicy",
        kind: Kind::NetworkPolicy,
        name: proxy::proxy_name,
        build: |mc, _| {
            proxy::desired_proxy_network_policy(mc).map(|p| p.map(Desired::NetworkPolicy))
        },
        report: Report::Plain,
        keep: Keep::Nothing,
    },
    // What sizes the pool while `spec.autoscaling` is set.
    Child {
        role: "HorizontalPodAutoscaler",
        kind: Kind::HorizontalPodAutoscaler,
        name: |name| name.to_string(),
        build: |mc, _| builders::desired_hpa(mc).map(|h| h.map(Desired::HorizontalPodAutoscaler)),
        report: Report::Plain,
        keep: Keep::Nothing,
    },
];

/// One child of one Memcached: its entry, its name, and its desired state (`None`: this
/// Memcached has no such child).
#[derive(Clone, Debug)]
pub struct Planned<'c> {
    pub child: &'c Child,
    pub name: String,
    pub desired: Option<Desired>,
}

/// A child that cannot be built (only for objects that never came from the API server).
#[derive(Debug, thiserror::Error)]
#[error("building the desired {role}: {source}")]
pub struct PlanError {
    pub role: &'static str,
    pub source: BuildError,
}

/// Every child of `children` for `mc`, in the list's order.
pub fn plan<'c>(
    children: &'c [Child],
    mc: &Memcached,
    inputs: &Inputs<'_>,
) -> Result<Vec<Planned<'c>>, PlanError> {
    let name = builders::name_of(mc).map_err(|source| PlanError {
        role: "Memcached",
        source,
    })?;
    children
        .iter()
        .map(|child| {
            let desired = (child.build)(mc, inputs).map_err(|source| PlanError {
                role: child.role,
                source,
            })?;
            Ok(Planned {
                child,
                name: (child.name)(name),
                desired,
            })
        })
        .collect()
}

/// The kinds of `children`, each once.
pub fn kinds(children: &[Child]) -> BTreeSet<Kind> {
    children.iter().map(|c| c.kind).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcached_api::MemcachedSpec;

    fn memcached(edit: impl FnOnce(&mut MemcachedSpec)) -> Memcached {
        let mut mc = Memcached::new("cache", MemcachedSpec::with_size(3));
        mc.metadata.namespace = Some("default".into());
        mc.metadata.uid = Some("uid-1".into());
        edit(&mut mc.spec);
        mc
    }

    fn planned(mc: &Memcached) -> Vec<(String, String, bool)> {
        planned_with(mc, LiveServices::default())
    }

    /// Every child of `mc` with the default settings and the client Services as `services`.
    fn plans(mc: &Memcached, services: LiveServices) -> Vec<Planned<'static>> {
        let inputs = Inputs {
            settings: &BuildSettings::default(),
            secrets: &SecretVersions::default(),
            backends: &[],
            services,
        };
        plan(CHILDREN, mc, &inputs).expect("builds")
    }

    fn planned_with(mc: &Memcached, services: LiveServices) -> Vec<(String, String, bool)> {
        plans(mc, services)
            .into_iter()
            .map(|p| {
                // Each child is named as its entry says, and of its entry's kind.
                if let Some(desired) = &p.desired {
                    assert_eq!(desired.kind(), p.child.kind, "{}", p.child.role);
                    let json = desired.to_json().expect("json");
                    assert_eq!(json["metadata"]["name"], p.name.as_str());
                    assert_eq!(json["kind"], p.child.kind.name());
                }
                (p.child.role.to_string(), p.name, p.desired.is_some())
            })
            .collect()
    }

    fn wanted(planned: Vec<(String, String, bool)>) -> Vec<String> {
        planned
            .into_iter()
            .filter(|(_, _, wanted)| *wanted)
            .map(|(role, name, _)| format!("{role} {name}"))
            .collect()
    }

    fn service_spec(mc: &Memcached, services: LiveServices, name: &str) -> Option<Value> {
        plans(mc, services)
            .into_iter()
            .find(|p| p.child.kind == Kind::Service && p.name == name)
            .and_then(|p| p.desired)
            .map(|d| d.to_json().expect("json")["spec"].clone())
    }

    #[test]
    fn the_seed_sample_has_its_deployment_one_headless_service_and_budget() {
        let mc = memcached(|_| {});
        assert_eq!(
            wanted(planned(&mc)),
            [
                "Deployment cache",
                "Service cache",
                "PodDisruptionBudget cache"
            ]
        );
        let spec = service_spec(&mc, LiveServices::default(), "cache").expect("wanted");
        assert_eq!(spec["clusterIP"], "None");
        assert_eq!(spec["ports"][0]["port"], 11211);
    }

    #[test]
    fn a_pool_of_an_earlier_release_keeps_its_cluster_ip_service_and_headless_one() {
        let mc = memcached(|_| {});
        // `NAME` as an earlier release created it, as the API server returns it.
        let live = serde_json::json!({"type": "ClusterIP", "clusterIP": "10.96.0.12",
            "clusterIPs": ["10.96.0.12"], "ports": [{"port": 11211}]});
        let earlier = LiveServices::of(Some(&live), None);
        assert_eq!(
            earlier,
            LiveServices {
                cluster_ip: true,
                headless: false
            }
        );
        assert_eq!(
            wanted(planned_with(&mc, earlier)),
            [
                "Deployment cache",
                "Service cache",
                "Service cache-headless",
                "PodDisruptionBudget cache"
            ]
        );
        let spec = service_spec(&mc, earlier, "cache").expect("wanted");
        assert_eq!(spec.get("clusterIP"), None, "{spec}");
        // The object the earlier release applied, so the same hash: nothing to apply.
        assert_eq!(
            Desired::Service(builders::desired_cluster_ip_service(&mc).expect("builds"))
                .to_json()
                .expect("json"),
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": serde_json::to_value(
                    builders::desired_service(&mc).expect("builds").metadata
                ).expect("json"),
                "spec": {"type": "ClusterIP",
                    "selector": {"app.kubernetes.io/name": "memcached",
                        "app.kubernetes.io/instance": "cache"},
                    "ports": [{"name": "memcached", "port": 11211,
                        "targetPort": "memcached", "protocol": "TCP"}]},
            })
        );
        // `NAME` deleted (or headless already): headless from now on, and the earlier
        // `NAME-headless` kept while it exists, never created again once deleted.
        let migrated = LiveServices::of(
            Some(&serde_json::json!({"clusterIP": "None"})),
            Some(&serde_json::json!({"clusterIP": "None"})),
        );
        assert_eq!(
            wanted(planned_with(&mc, migrated)),
            [
                "Deployment cache",
                "Service cache",
                "Service cache-headless",
                "PodDisruptionBudget cache"
            ]
        );
        let spec = service_spec(&mc, migrated, "cache").expect("wanted");
        assert_eq!(spec["clusterIP"], "None");
        let gone = LiveServices::of(None, None);
        assert_eq!(
            wanted(planned_with(&mc, gone)),
            [
                "Deployment cache",
                "Service cache",
                "PodDisruptionBudget cache"
            ]
        );
    }

    #[test]
    fn every_child_exists_when_every_feature_is_on() {
        let earlier = LiveServices {
            cluster_ip: true,
            headless: true,
        };
        let all = planned_with(
            &memcached(|s| {
                s.exporter = Some(memcached_api::ExporterSpec {
                    enabled: true,
                    image: None,
                });
                s.proxy = Some(Box::new(memcached_api::ProxySpec {
                    enabled: true,
                    ..memcached_api::ProxySpec::default()
                }));
                s.network_policy = Some(Box::new(memcached_api::NetworkPolicySpec {
                    enabled: true,
                    from: vec![Default::default()],
                    metrics_from: Vec::new(),
                }));
                s.autoscaling = Some(memcached_api::AutoscalingSpec {
                    min_replicas: 1,
                    max_replicas: 5,
                    target_cpu_utilization_percentage: Some(70),
                    target_memory_utilization_percentage: None,
                    scale_down_stabilization_seconds: 600,
                });
            }),
            earlier,
        );
        assert!(all.iter().all(|(_, _, wanted)| *wanted), "{all:?}");
        // No two children share a kind and a name.
        let mut seen = BTreeSet::new();
        for (p, entry) in all.iter().zip(CHILDREN) {
            assert!(seen.insert((entry.kind, p.1.clone())), "{p:?} twice");
        }
    }

    #[test]
    fn rules_cover_the_reads_of_each_kind() {
        assert!(Kind::Deployment.rule().verbs.contains(&"watch"));
        assert!(Kind::ServiceMonitor.rule().verbs.contains(&"get"));
    }
}
