//! memcached's built-in proxy in front of a pool (`spec.proxy`): the desired Deployment,
//! Service, PodDisruptionBudget and ConfigMap, the route configuration rendered into the
//! ConfigMap, and which pod holds which slot of the routes with the deletion cost that
//! follows from it. Pure, like [`crate::builders`].
//!
//! **One endpoint.** Clients connect to the Service `NAME-proxy`. The client Service `NAME`
//! keeps selecting the memcached pods, so turning the proxy on changes nothing for the
//! clients already connected there (or hashing over `status.endpoints`), and turning it off
//! again breaks no one who did not move.
//!
//! **Routes.** The configuration uses the route library built into memcached
//! (`-o proxy_config=routelib,proxy_arg=FILE`). Each copy of the keys is one ring of
//! slots, hashed with jump consistent hashing (`mcp.dist_jump_hash`): a key's slot depends
//! on the key and the ring's length only, so the keys belong to the slot, not to the pod in
//! it. With `copies` of 2 or 3 there are that many rings; writes go to every ring and
//! answer with the first success (`route_allfastest`), reads go to one ring and fall over
//! to the next on a miss or an error (`route_failover`).
//!
//! **Membership** ([`membership`]) follows a pod's life, not its readiness: a pod joins
//! when it is first Ready and leaves when it is deleted or has ended. A pod that stops
//! answering for a while (a slow probe, a paused process) keeps its slot: the writes and
//! deletes of its keys meanwhile fail, and the client knows, where a ring without it would
//! have sent them to another pod and then, once it is back, served the values they
//! replaced. The proxy's own failure detection answers for it meanwhile. A pod that leaves
//! leaves its slot vacant (its keys miss) until a new pod takes it; no other key moves. The
//! slots are recorded with the routes in the ConfigMap ([`BACKENDS_KEY`]), so they survive
//! an operator restart, and the pool's pods carry a deletion cost by slot
//! ([`DELETION_COST_ANNOTATION`]), so that a scale-down removes the last slots, whose keys
//! are the only ones that move.
//!
//! **Reload without restart.** memcached's proxy reloads its configuration on SIGHUP, or
//! when its own Lua asks (`mcp.schedule_config_reload`). The rendered file registers a
//! proxy cron (`mcp.register_cron`) that reads the file's first line once a second and
//! schedules a reload when the version there is not the one loaded. The kubelet replaces
//! the mounted ConfigMap atomically, so the proxy never reads half a file; nothing else
//! runs in the pod (no sidecar, no shared process namespace, no signal), and client
//! connections stay open across a reload. How soon the kubelet updates a mounted
//! ConfigMap is its business (its pod sync, every 60 to 90 s by default): `ProxyReady`
//! reports the proxy as catching up for [`PROPAGATION_WINDOW`] after the backends change.
//!
//! This module holds the proxy's names, labels and desired objects; `slots` decides the
//! membership and its deletion costs, and `routes` renders the configuration.

mod routes;
mod slots;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements,
    SeccompProfile, Service, ServicePort, ServiceSpec, Volume,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use memcached_api::{Memcached, ProxyBackend, ProxySpec};

use crate::builders::{
    self, BuildError, BuildSettings, CONTAINER_NAME, LABEL_COMPONENT, LABEL_INSTANCE,
    LABEL_MANAGED_BY, LABEL_NAME, MANAGED_BY, MEMCACHED_UID,
};

pub use routes::{render, render_warm};
pub use slots::{
    DELETION_COST_ANNOTATION, Membership, PoolPod, capacity, membership, rank, recorded_backends,
    warm_growth,
};

/// Suffix of the proxy's Deployment, Service, PodDisruptionBudget and ConfigMap.
pub const PROXY_SUFFIX: &str = "-proxy";
/// `app.kubernetes.io/name` of the proxy pods (the pool's pods are `memcached`, so no
/// selector of the pool ever matches a proxy pod).
pub const PROXY_APP_NAME: &str = "memcached-proxy";
/// Name of the proxy container.
pub const PROXY_CONTAINER: &str = "proxy";
/// Where the ConfigMap is mounted in the proxy pods.
pub const CONFIG_DIR: &str = "/etc/memcached/proxy";
/// The route configuration's key in the ConfigMap (and file name in [`CONFIG_DIR`]).
pub const CONFIG_KEY: &str = "config.lua";
/// The rings as JSON in the ConfigMap: which pod is in which slot of which copy, vacant
/// slots included, so the next rendering keeps every pod in its slot (see [`membership`]).
pub const BACKENDS_KEY: &str = "backends.json";
/// The warm-up route's start file's key in the ConfigMap (and file name in [`CONFIG_DIR`]).
pub const WARM_KEY: &str = "warm.lua";
/// The warm-up route (`route_warm`, see [`render_warm`]): a start file of the proxy, loaded
/// after memcached's route library. Static, and written only for pools that warm up.
pub const WARM_ROUTE: &str = include_str!("warm.lua");
/// The gutter route's start file's key in the ConfigMap (and file name in [`CONFIG_DIR`]).
pub const GUTTER_KEY: &str = "gutter.lua";
/// The gutter route (`route_gutter`, see [`render_warm`]): a start file of the proxy, loaded
/// after memcached's route library. Static, and written only for pools with a gutter.
pub const GUTTER_ROUTE: &str = include_str!("gutter.lua");
/// How often the proxy looks at its configuration file.
pub const RELOAD_CHECK_SECONDS: u32 = 1;
/// How long the slots a scale-out adds warm up from the ring before it once the proxies
/// have loaded the change (`spec.proxy.warmUp`, [`warm_growth`]): a minute, as a replaced
/// pod's slot does with the advised `preStopDelaySeconds`
/// ([`memcached_api::WARM_UP_PRE_STOP_SECONDS`]).
pub const WARM_GROWTH: Duration = Duration::from_secs(
    (memcached_api::WARM_UP_PRE_STOP_SECONDS - memcached_api::PROXY_PROPAGATION_SECONDS) as u64,
);
/// The proxy pods' environment variable holding their own zone (their
/// `topology.kubernetes.io/zone` label through the downward API; empty without it): the
/// routes read that zone's copy first (`spec.proxy.zones`).
pub const ZONE_ENV: &str = "MEMCACHED_PROXY_ZONE";
/// How long after a change of the backends the proxies are reported as still loading it.
/// The kubelet (its defaults: `configMapAndSecretChangeDetectionStrategy: Watch`, so its
/// copy of the ConfigMap is current and no cache TTL adds to it) rewrites a mounted
/// ConfigMap when it next syncs the pod: every `syncFrequency` (60 s) plus up to 50 %
/// jitter, so at most about 90 s after the write, then the proxy's own check (1 s).
/// Measured on a real node (`tests/real_node_proxy.rs`, the pinned kubelets with their
/// defaults, 2 proxy pods, scale-ups 3 → 4 → 5 → 6; 2 runs on v1.33.13, 3 on v1.37.2)
/// from the ConfigMap's write to each proxy routing keys to the new pod: v1.33.13 2.0 to
/// 86.1 s (median 68.0, 12 loads), v1.37.2 14.1 to 86.6 s (median 63.4, 18 loads). The
/// window keeps about 10 s beyond the kubelet's bound (the former 125 s estimate counted a
/// 60 s cache TTL that the default strategy does not have). Still an estimate: the
/// operator cannot see which version a proxy has loaded.
pub const PROPAGATION_WINDOW: Duration =
    Duration::from_secs(memcached_api::PROXY_PROPAGATION_SECONDS as u64);

/// The name of the proxy's objects of the Memcached `name`.
pub fn proxy_name(name: &str) -> String {
    format!("{name}{PROXY_SUFFIX}")
}

/// Labels that select the proxy pods of Memcached `name`.
pub fn proxy_selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), PROXY_APP_NAME.to_string()),
        (LABEL_INSTANCE.to_string(), name.to_string()),
    ])
}

fn proxy_labels(name: &str) -> BTreeMap<String, String> {
    let mut labels = proxy_selector_labels(name);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "proxy".to_string());
    labels
}

fn proxy_metadata(mc: &Memcached) -> Result<ObjectMeta, BuildError> {
    let name = builders::name_of(mc)?;
    Ok(ObjectMeta {
        name: Some(proxy_name(name)),
        namespace: mc.metadata.namespace.clone(),
        labels: Some(proxy_labels(name)),
        owner_references: Some(vec![builders::owner_reference(mc)?]),
        ..ObjectMeta::default()
    })
}

/// The memcached command line of a proxy listening on `port` with its configuration at
/// `config_file`.
pub fn proxy_args(port: i32, config_file: &str) -> Vec<String> {
    proxy_args_with(port, config_file, None, None)
}

/// [`proxy_args`], with the warm-up route's start file ([`WARM_ROUTE`]) at `warm_file`
/// loaded after the route library when given, and with the gutter (`spec.proxy.gutter`)
/// when given: its route's start file ([`GUTTER_ROUTE`]) and its cache memory in MiB.
pub fn proxy_args_with(
    port: i32,
    config_file: &str,
    warm_file: Option<&str>,
    gutter: Option<(&str, i32)>,
) -> Vec<String> {
    let mut start_files = "routelib".to_string();
    for file in [warm_file, gutter.map(|(file, _)| file)]
        .into_iter()
        .flatten()
    {
        start_files.push(':');
        start_files.push_str(file);
    }
    let gutter_mib = gutter.map(|(_, mib)| mib);
    vec![
        "memcached".to_string(),
        "-p".to_string(),
        port.to_string(),
        // Without a gutter the proxy keeps no items: no cache memory beyond memcached's
        // minimum. With one, its items are the gutter's.
        "-m".to_string(),
        gutter_mib.unwrap_or(8).to_string(),
        "-o".to_string(),
        format!("proxy_config={start_files},proxy_arg={config_file}"),
    ]
}

/// The proxy container's resources when `spec.proxy.resources` is unset: 100m CPU, 64Mi of
/// memory requested and a limit of 128Mi, each grown by the gutter's memory.
fn default_resources(gutter_mib: Option<i32>) -> ResourceRequirements {
    let mib = |base: i32| Quantity(format!("{}Mi", base + gutter_mib.unwrap_or(0).max(0)));
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("100m".to_string())),
            ("memory".to_string(), mib(64)),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), mib(128))])),
        ..ResourceRequirements::default()
    }
}

/// The proxy Deployment, when `spec.proxy.enabled`. The pod template does not depend on
/// the backends: a new configuration is loaded in place, never rolled.
pub fn desired_proxy_deployment(
    mc: &Memcached,
    settings: &BuildSettings,
) -> Result<Option<Deployment>, BuildError> {
    let Some(proxy) = mc.spec.proxy_enabled() else {
        return Ok(None);
    };
    let name = builders::name_of(mc)?;
    let spec = &mc.spec;
    let port = spec.container_port;
    let image = proxy
        .image
        .clone()
        .unwrap_or_else(|| mc.image_or(&settings.default_image).to_string());
    let gutter_mib = proxy.gutter_enabled().map(|g| g.memory_mib);
    let gutter_file = format!("{CONFIG_DIR}/{GUTTER_KEY}");
    let container = Container {
        name: PROXY_CONTAINER.to_string(),
        image: Some(image),
        command: Some(proxy_args_with(
            port,
            &format!("{CONFIG_DIR}/{CONFIG_KEY}"),
            proxy
                .warm_up_enabled()
                .then(|| format!("{CONFIG_DIR}/{WARM_KEY}"))
                .as_deref(),
            gutter_mib.map(|mib| (gutter_file.as_str(), mib)),
        )),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER_NAME.to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(builders::tcp_probe(CONTAINER_NAME, 1, 5)),
        liveness_probe: Some(builders::tcp_probe(CONTAINER_NAME, 10, 10)),
        resources: Some(
            proxy
                .resources
                .clone()
                .unwrap_or_else(|| default_resources(gutter_mib)),
        ),
        security_context: Some(builders::restricted(MEMCACHED_UID)),
        volume_mounts: Some(vec![builders::mount("config", CONFIG_DIR)]),
        // With zones, the pod's own zone, which its routes read first.
        env: proxy.zoned().then(|| {
            vec![EnvVar {
                name: ZONE_ENV.to_string(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.labels['{}']", memcached_api::ZONE_LABEL),
                        api_version: None,
                    }),
                    ..EnvVarSource::default()
                }),
                value: None,
            }]
        }),
        ..Container::default()
    };
    let selector = proxy_selector_labels(name);
    Ok(Some(Deployment {
        metadata: proxy_metadata(mc)?,
        spec: Some(DeploymentSpec {
            replicas: Some(proxy.replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            },
            strategy: Some(builders::one_pod_at_a_time()),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(proxy_labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(builders::with_user_overrides(
                    spec,
                    PROXY_CONTAINER,
                    PodSpec {
                        containers: vec![container],
                        enable_service_links: Some(false),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            run_as_user: Some(MEMCACHED_UID),
                            run_as_group: Some(MEMCACHED_UID),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".to_string(),
                                localhost_profile: None,
                            }),
                            ..PodSecurityContext::default()
                        }),
                        node_selector: spec.node_selector.clone(),
                        tolerations: spec.tolerations.clone(),
                        affinity: spec.affinity.as_deref().cloned(),
                        priority_class_name: spec.priority_class_name.clone(),
                        image_pull_secrets: spec.image_pull_secrets.clone(),
                        topology_spread_constraints: builders::spread_constraints(
                            &selector,
                            spec.topology_spread.unwrap_or_default(),
                            false,
                        ),
                        volumes: Some(vec![Volume {
                            name: "config".to_string(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: proxy_name(name),
                                default_mode: Some(0o444),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        }]),
                        ..PodSpec::default()
                    },
                )),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }))
}

/// The Service `NAME-proxy` in front of the proxy pods, on `spec.containerPort`.
pub fn desired_proxy_service(mc: &Memcached) -> Result<Option<Service>, BuildError> {
    let Some(proxy) = mc.spec.proxy_enabled() else {
        return Ok(None);
    };
    let name = builders::name_of(mc)?;
    Ok(Some(Service {
        metadata: builders::service_metadata(mc, &proxy_name(name), proxy_labels(name))?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(proxy_selector_labels(name)),
            ports: Some(vec![ServicePort {
                name: Some(CONTAINER_NAME.to_string()),
                port: mc.spec.container_port,
                target_port: Some(IntOrString::String(CONTAINER_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            // With zones, clients are sent to a proxy in their own zone where there is
            // one, which reads that zone's copy first.
            traffic_distribution: proxy.zoned().then(|| "PreferClose".to_string()),
            ..ServiceSpec::default()
        }),
        status: None,
    }))
}

/// The NetworkPolicy `NAME-proxy` of the proxy pods, with `spec.networkPolicy` and the
/// proxy: its port from the clients listed, nothing else.
pub fn desired_proxy_network_policy(
    mc: &Memcached,
) -> Result<Option<k8s_openapi::api::networking::v1::NetworkPolicy>, BuildError> {
    let (Some(policy), Some(_)) = (mc.spec.network_policy_enabled(), mc.spec.proxy_enabled())
    else {
        return Ok(None);
    };
    let name = builders::name_of(mc)?;
    Ok(Some(builders::network_policy(
        proxy_metadata(mc)?,
        proxy_selector_labels(name),
        builders::ingress(mc.spec.container_port, policy.from.clone())
            .into_iter()
            .collect(),
    )))
}

/// A budget of one voluntary disruption at a time for two proxy pods or more.
pub fn desired_proxy_pdb(mc: &Memcached) -> Result<Option<PodDisruptionBudget>, BuildError> {
    let Some(proxy) = mc.spec.proxy_enabled() else {
        return Ok(None);
    };
    if proxy.replicas < 2 {
        return Ok(None);
    }
    let name = builders::name_of(mc)?;
    Ok(Some(PodDisruptionBudget {
        metadata: proxy_metadata(mc)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(proxy_selector_labels(name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}

/// The ConfigMap `NAME-proxy` holding the rendered routes for `backends`, and its version.
/// With warm-up, also the warm-up route ([`WARM_KEY`]), and each slot warming up reads its
/// misses from its former pod ([`ProxyBackend::warm_from`]), or from the ring before a
/// scale-out ([`ProxyBackend::grown_from`]: its first slots, whose pods are the same;
/// [`render_warm`]).
pub fn desired_proxy_config_map(
    mc: &Memcached,
    backends: &[ProxyBackend],
) -> Result<Option<(ConfigMap, String)>, BuildError> {
    let Some(proxy) = mc.spec.proxy_enabled() else {
        return Ok(None);
    };
    let name = builders::name_of(mc)?;
    let owner = format!(
        "{}/{name}",
        mc.metadata.namespace.as_deref().unwrap_or_default()
    );
    let warm_up = proxy.warm_up_enabled();
    // The length of the ring before a scale-out whose slots still warm up.
    let grown_from = backends
        .iter()
        .filter(|_| warm_up)
        .filter_map(|b| b.grown_from.as_ref().map(|g| g.slots))
        .min();
    // The ring keys warm up from: each warming slot's former pod in its slot, every other
    // slot vacant, so that it is as long as the ring and hashes each key to the same slot;
    // else the ring before a scale-out (its first slots, whose pods are the same).
    let warm: Vec<ProxyBackend> = if warm_up && backends.iter().any(|b| b.warm_from.is_some()) {
        backends
            .iter()
            .map(|b| {
                let from = b.warm_from.clone().unwrap_or_default();
                ProxyBackend {
                    zone: None,
                    copy: b.copy,
                    slot: b.slot,
                    pod: from.pod,
                    address: from.address,
                    warm_from: None,
                    grown_from: None,
                }
            })
            .collect()
    } else if let Some(from) = grown_from {
        backends
            .iter()
            .filter(|b| b.copy == 1 && b.slot < from)
            .map(|b| ProxyBackend {
                grown_from: None,
                ..b.clone()
            })
            .collect()
    } else {
        Vec::new()
    };
    let (text, version) = render_warm(
        &owner,
        backends,
        &warm,
        grown_from.filter(|_| backends.iter().all(|b| b.warm_from.is_none())),
        proxy.copies,
        proxy.gutter_enabled().map(|g| g.ttl_seconds),
        &format!("{CONFIG_DIR}/{CONFIG_KEY}"),
    );
    let recorded = serde_json::to_string(backends).unwrap_or_else(|_| "[]".to_string());
    let mut data = BTreeMap::from([
        (CONFIG_KEY.to_string(), text),
        (BACKENDS_KEY.to_string(), recorded),
    ]);
    if warm_up {
        data.insert(WARM_KEY.to_string(), WARM_ROUTE.to_string());
    }
    if proxy.gutter_enabled().is_some() {
        data.insert(GUTTER_KEY.to_string(), GUTTER_ROUTE.to_string());
    }
    Ok(Some((
        ConfigMap {
            metadata: proxy_metadata(mc)?,
            data: Some(data),
            ..ConfigMap::default()
        },
        version,
    )))
}

/// The version of the routes [`desired_proxy_config_map`] writes for `backends`, without
/// the proxy: none.
pub fn routes_version(mc: &Memcached, backends: &[ProxyBackend]) -> Option<String> {
    desired_proxy_config_map(mc, backends)
        .ok()
        .flatten()
        .map(|(_, version)| version)
}

/// `spec.proxy`'s copies, 1 when unset.
pub fn copies(proxy: Option<&ProxySpec>) -> i32 {
    proxy.map_or(1, |p| p.copies.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memcached(proxy: Option<ProxySpec>) -> Memcached {
        let mut mc = Memcached::new(
            "cache",
            memcached_api::MemcachedSpec {
                proxy: proxy.map(Box::new),
                ..memcached_api::MemcachedSpec::with_size(3)
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.uid = Some("u".into());
        mc
    }

    #[test]
    fn the_proxy_exists_only_when_enabled_and_never_selects_the_pool() {
        let settings = BuildSettings::default();
        let off = memcached(Some(ProxySpec {
            enabled: false,
            ..ProxySpec::default()
        }));
        assert!(
            desired_proxy_deployment(&off, &settings)
                .ok()
                .flatten()
                .is_none()
        );
        assert!(desired_proxy_service(&off).ok().flatten().is_none());
        assert!(desired_proxy_pdb(&off).ok().flatten().is_none());
        assert!(desired_proxy_config_map(&off, &[]).ok().flatten().is_none());

        let on = memcached(Some(ProxySpec::default()));
        let d = desired_proxy_deployment(&on, &settings)
            .ok()
            .flatten()
            .expect("proxy Deployment");
        let selector = d
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default();
        let pool = builders::selector_labels("cache");
        let pool_pod = builders::labels("cache");
        let proxy_pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let matches = |sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>| {
            sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        };
        assert!(matches(&selector, &proxy_pod));
        assert!(
            !matches(&selector, &pool_pod),
            "the proxy selects no pool pod"
        );
        assert!(!matches(&pool, &proxy_pod), "the pool selects no proxy pod");
        assert_eq!(d.metadata.name.as_deref(), Some("cache-proxy"));
        assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(2));
    }

    /// The proxy's command line and the ConfigMap's keys and routes.
    fn rendered(mc: &Memcached, backends: &[ProxyBackend]) -> (Vec<String>, Vec<String>, String) {
        let settings = BuildSettings::default();
        let command = desired_proxy_deployment(mc, &settings)
            .ok()
            .flatten()
            .and_then(|d| d.spec?.template.spec?.containers.first()?.command.clone())
            .unwrap_or_default();
        let data = desired_proxy_config_map(mc, backends)
            .ok()
            .flatten()
            .and_then(|(cm, _)| cm.data)
            .unwrap_or_default();
        let config = data.get(CONFIG_KEY).cloned().unwrap_or_default();
        (command, data.into_keys().collect(), config)
    }

    #[test]
    fn warm_up_adds_its_route_and_reads_a_warming_slot_from_its_former_pod() {
        let backend = |slot: i32, pod: &str, from: Option<&str>| ProxyBackend {
            zone: None,
            copy: 1,
            slot,
            pod: pod.into(),
            address: format!("10.0.0.{slot}:11211"),
            warm_from: from.map(|p| memcached_api::WarmFrom {
                pod: p.into(),
                address: "10.0.9.9:11211".into(),
            }),
            grown_from: None,
        };
        let steady = [
            backend(0, "a", None),
            backend(1, "b", None),
            backend(2, "c", None),
            backend(3, "e", None),
        ];
        let mut rolling = steady.clone();
        rolling[1] = backend(1, "d", Some("old-b"));

        // Off (the default): no warm-up file, no warm pool, even for a recorded warm-up.
        let off = memcached(Some(ProxySpec::default()));
        let (command, keys, config) = rendered(&off, &rolling);
        assert!(!command.concat().contains(WARM_KEY), "{command:?}");
        assert_eq!(keys, [BACKENDS_KEY, CONFIG_KEY]);
        assert!(
            !config.contains("route_warm") && !config.contains("old-b"),
            "{config}"
        );

        let on = memcached(Some(ProxySpec {
            image: Some("memcached:patched".into()),
            warm_up: Some(memcached_api::WarmUpSpec { enabled: true }),
            ..ProxySpec::default()
        }));
        let (command, keys, config) = rendered(&on, &steady);
        assert!(
            command.contains(&format!(
                "proxy_config=routelib:{CONFIG_DIR}/{WARM_KEY},proxy_arg={CONFIG_DIR}/{CONFIG_KEY}"
            )),
            "{command:?}"
        );
        assert_eq!(keys, [BACKENDS_KEY, CONFIG_KEY, WARM_KEY]);
        // Nothing warming: the plain routes.
        assert_eq!(config, rendered(&off, &steady).2);
        let (_, _, config) = rendered(&on, &rolling);
        assert!(config.contains("route_warm{ child = \"pool\""), "{config}");
        assert!(
            config.contains("label = \"old-b\", host = \"10.0.9.9\", port = \"11211\""),
            "{config}"
        );
        // The warm ring is as long as the ring (so each key hashes to the same slot), its
        // other slots down.
        let warm_pool = config
            .split("warm = {")
            .nth(1)
            .and_then(|rest| rest.split("    },").next())
            .unwrap_or_default();
        let labels: Vec<&str> = warm_pool
            .lines()
            .filter_map(|l| l.split("label = \"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            labels,
            ["cold:1:0", "old-b", "cold:1:2", "cold:1:3"],
            "{config}"
        );
    }
}
