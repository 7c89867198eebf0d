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
//! ConfigMap is its business (its sync period, a minute by default, plus its cache's
//! TTL): `ProxyReady` reports the proxy as catching up for [`PROPAGATION_WINDOW`] after
//! the backends change.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PodSecurityContext, PodSpec,
    PodTemplateSpec, ResourceRequirements, SeccompProfile, Service, ServicePort, ServiceSpec,
    Volume,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use memcached_api::{Memcached, ProxyBackend, ProxySpec};
use serde::Deserialize;

use crate::builders::{
    self, BuildError, BuildSettings, CONTAINER_NAME, LABEL_COMPONENT, LABEL_INSTANCE,
    LABEL_MANAGED_BY, LABEL_NAME, MANAGED_BY, MEMCACHED_UID,
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
/// How often the proxy looks at its configuration file.
pub const RELOAD_CHECK_SECONDS: u32 = 1;
/// How long after a change of the backends the proxies are reported as still loading it:
/// the kubelet's default sync period (60 s) plus its ConfigMap cache TTL (60 s by
/// default), plus the proxy's own check. An estimate: the operator cannot see which
/// version a proxy has loaded.
pub const PROPAGATION_WINDOW: Duration = Duration::from_secs(125);

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
    vec![
        "memcached".to_string(),
        "-p".to_string(),
        port.to_string(),
        // The proxy keeps no items: no cache memory beyond memcached's minimum.
        "-m".to_string(),
        "8".to_string(),
        "-o".to_string(),
        format!("proxy_config=routelib,proxy_arg={config_file}"),
    ]
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("100m".to_string())),
            ("memory".to_string(), Quantity("64Mi".to_string())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("128Mi".to_string()),
        )])),
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
    let container = Container {
        name: PROXY_CONTAINER.to_string(),
        image: Some(image),
        command: Some(proxy_args(port, &format!("{CONFIG_DIR}/{CONFIG_KEY}"))),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER_NAME.to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(builders::tcp_probe(CONTAINER_NAME, 1, 5)),
        liveness_probe: Some(builders::tcp_probe(CONTAINER_NAME, 10, 10)),
        resources: Some(proxy.resources.clone().unwrap_or_else(default_resources)),
        security_context: Some(builders::restricted(MEMCACHED_UID)),
        volume_mounts: Some(vec![builders::mount("config", CONFIG_DIR)]),
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
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(proxy_labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
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
                    affinity: spec.affinity.clone(),
                    priority_class_name: spec.priority_class_name.clone(),
                    image_pull_secrets: spec.image_pull_secrets.clone(),
                    topology_spread_constraints: builders::spread_constraints(
                        &selector,
                        spec.topology_spread.unwrap_or_default(),
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
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }))
}

/// The Service `NAME-proxy` in front of the proxy pods, on `spec.containerPort`.
pub fn desired_proxy_service(mc: &Memcached) -> Result<Option<Service>, BuildError> {
    if mc.spec.proxy_enabled().is_none() {
        return Ok(None);
    }
    let name = builders::name_of(mc)?;
    Ok(Some(Service {
        metadata: proxy_metadata(mc)?,
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
            ..ServiceSpec::default()
        }),
        status: None,
    }))
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

/// The annotation the ReplicaSet controller reads to choose which pods go first when it
/// scales down: the lower the cost, the sooner (after pods that are not Ready, which always
/// go first).
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The deletion cost of the member in the first slot; each later slot costs one less, so
/// every member costs more than a pod outside the rings (no annotation: 0).
const DELETION_COST_TOP: i32 = 1000;
/// Slots read back from a ConfigMap beyond this are ignored (the pool never has more pods).
const MAX_SLOT: i32 = memcached_api::MAX_SIZE;

/// A live pod of the pool (neither being deleted nor ended), as membership needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolPod {
    pub name: String,
    pub ip: Option<String>,
    pub ready: bool,
}

/// The proxy's rings, and the deletion cost each of their pods should carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Every slot of every copy's ring, sorted by copy and slot: a pod, or vacant
    /// ([`ProxyBackend::is_vacant`]).
    pub backends: Vec<ProxyBackend>,
    /// `controller.kubernetes.io/pod-deletion-cost` of each pod in the rings, by name.
    pub deletion_costs: BTreeMap<String, i32>,
}

/// How many slots `copy` has in a pool of `size` pods: the pods are dealt to the copies in
/// [`rank`] order (slot 0 of every copy, then slot 1, ...), so copies differ by one pod at
/// most, and the lower copies get the extra ones.
pub fn capacity(size: i32, copies: i32, copy: i32) -> i32 {
    let copies = copies.max(1);
    ((size - (copy - 1) + copies - 1) / copies).max(0)
}

/// The order in which slots are filled as the pool grows, and emptied as it shrinks.
pub fn rank(copy: i32, slot: i32, copies: i32) -> i32 {
    slot * copies.max(1) + (copy - 1)
}

/// The proxy's rings for a pool of `size` pods in `copies` copies, from the rings recorded
/// in the ConfigMap (`recorded`, vacancies included) and the pool's live `pods`.
///
/// - A pod joins when it is first Ready, into the vacant slot of lowest [`rank`] below
///   its copy's [`capacity`]; with none (a rolling update's extra pod), it waits.
/// - It stays in its slot as long as it lives, Ready or not: a pod that stops answering
///   for a while comes back with the values it holds, and any write or delete of its keys
///   meanwhile must not have gone to another pod (the proxy fails over by itself).
/// - It leaves when it is deleted or has ended; its slot stays, vacant, until a new pod
///   takes it, so its replacement serves exactly its keys and no other key moves.
/// - A ring is as long as it was, but no longer than its capacity, unless a pod holds a
///   later slot; so a scale-down that removed the last slots' pods shortens it, and a
///   scale-up lengthens it only as the new pods join.
/// - When the pool has shrunk and a pod beyond its copy's capacity remains while a slot
///   below it is vacant (the ReplicaSet removed another pod than the last, or `copies`
///   changed), the pod of highest rank moves into the vacancy of lowest rank; only once
///   the pool has no more pods than `size`, so a scale-down still under way moves nobody.
///
/// The deletion costs make the ReplicaSet remove the pod of highest rank first.
pub fn membership(
    recorded: &[ProxyBackend],
    pods: &[PoolPod],
    size: i32,
    copies: i32,
    port: i32,
) -> Membership {
    let copies = copies.clamp(1, memcached_api::MAX_PROXY_COPIES);
    let size = size.clamp(0, memcached_api::MAX_SIZE);
    let caps: Vec<i32> = (1..=copies).map(|c| capacity(size, copies, c)).collect();
    let cap = |copy: i32| caps.get((copy - 1) as usize).copied().unwrap_or(0);
    let mut live: BTreeMap<&str, &PoolPod> = BTreeMap::new();
    for pod in pods {
        live.entry(pod.name.as_str()).or_insert(pod);
    }

    // The recorded rings: each live pod keeps its slot (the first record of a pod or a slot
    // wins); each ring's recorded length, vacancies included.
    let mut recorded_len = vec![0i32; copies as usize];
    let mut slots: BTreeMap<(i32, i32), (&str, String)> = BTreeMap::new();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut ordered: Vec<&ProxyBackend> = recorded
        .iter()
        .filter(|b| b.copy >= 1 && (0..MAX_SLOT).contains(&b.slot))
        .collect();
    ordered.sort();
    for b in ordered {
        if let Some(len) = recorded_len.get_mut((b.copy - 1) as usize) {
            *len = (*len).max(b.slot + 1);
        }
        let Some(pod) = live.get(b.pod.as_str()) else {
            continue;
        };
        if placed.contains(pod.name.as_str()) || slots.contains_key(&(b.copy, b.slot)) {
            continue;
        }
        placed.insert(pod.name.as_str());
        let address = pod
            .ip
            .as_deref()
            .map(|ip| crate::status::endpoint(ip, port))
            .unwrap_or_else(|| b.address.clone());
        slots.insert((b.copy, b.slot), (pod.name.as_str(), address));
    }

    let holes = |slots: &BTreeMap<(i32, i32), (&str, String)>| {
        let mut holes: Vec<(i32, i32)> = (1..=copies)
            .flat_map(|c| (0..cap(c)).map(move |s| (c, s)))
            .filter(|at| !slots.contains_key(at))
            .collect();
        holes.sort_by_key(|&(c, s)| rank(c, s, copies));
        holes
    };

    // Pods beyond their copy's capacity move into vacancies, the last first.
    if live.len() <= size as usize {
        let mut beyond: Vec<(i32, i32)> = slots
            .keys()
            .copied()
            .filter(|&(c, s)| c > copies || s >= cap(c))
            .collect();
        beyond.sort_by_key(|&(c, s)| std::cmp::Reverse(rank(c, s, copies)));
        for (hole, from) in holes(&slots).into_iter().zip(beyond) {
            if let Some(member) = slots.remove(&from) {
                slots.insert(hole, member);
            }
        }
    }
    // Pods of copies that no longer exist and found no place leave the rings, and are
    // newcomers again.
    slots.retain(|&(c, _), (name, _)| {
        if c > copies {
            placed.remove(*name);
        }
        c <= copies
    });

    // Newcomers: Ready pods in no ring, in name order, into the remaining vacancies.
    let newcomers: Vec<&PoolPod> = live
        .values()
        .filter(|p| p.ready && p.ip.is_some() && !placed.contains(p.name.as_str()))
        .copied()
        .collect();
    for (hole, pod) in holes(&slots).into_iter().zip(newcomers) {
        let ip = pod.ip.as_deref().unwrap_or_default();
        slots.insert(hole, (pod.name.as_str(), crate::status::endpoint(ip, port)));
    }

    let mut backends = Vec::new();
    let mut deletion_costs = BTreeMap::new();
    for copy in 1..=copies {
        let last = slots
            .range((copy, 0)..(copy + 1, 0))
            .map(|(&(_, s), _)| s + 1)
            .max()
            .unwrap_or(0);
        let kept = recorded_len[(copy - 1) as usize].min(cap(copy));
        for slot in 0..last.max(kept) {
            match slots.get(&(copy, slot)) {
                Some((pod, address)) => {
                    deletion_costs.insert(
                        pod.to_string(),
                        (DELETION_COST_TOP - rank(copy, slot, copies)).max(1),
                    );
                    backends.push(ProxyBackend {
                        copy,
                        slot,
                        pod: pod.to_string(),
                        address: address.clone(),
                    });
                }
                None => backends.push(ProxyBackend {
                    copy,
                    slot,
                    ..ProxyBackend::default()
                }),
            }
        }
    }
    Membership {
        backends,
        deletion_costs,
    }
}

/// A Lua string literal of `s`.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:03}");
                }
            }
        }
    }
    out.push('"');
    out
}

/// The route configuration for `backends` (see the module documentation), naming `file`
/// as its own path for the reload check, and its version (a hash of everything else in
/// it). The first line carries the version.
pub fn render(owner: &str, backends: &[ProxyBackend], copies: i32, file: &str) -> (String, String) {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "-- Proxy routes of the Memcached {owner}, written by memcached-operator from the\n\
         -- pool's pods in their slots. Edits are overwritten."
    );
    let _ = writeln!(body, "local path = {}", lua_string(file));
    // Each copy's ring, position by position: the slot's pod, or nothing (vacant).
    let groups: Vec<(i32, Vec<Option<&ProxyBackend>>)> = (1..=copies.max(1))
        .map(|copy| {
            let mut ring: Vec<Option<&ProxyBackend>> = Vec::new();
            for b in backends
                .iter()
                .filter(|b| b.copy == copy && (0..MAX_SLOT).contains(&b.slot))
            {
                let at = b.slot as usize;
                if ring.len() <= at {
                    ring.resize(at + 1, None);
                }
                if !b.is_vacant() && ring[at].is_none() {
                    ring[at] = Some(b);
                }
            }
            (copy, ring)
        })
        .filter(|(_, ring)| !ring.is_empty())
        .collect();
    let pool = |out: &mut String, indent: &str, copy: i32, ring: &[Option<&ProxyBackend>]| {
        // Jump consistent hashing (memcached's `mcp.dist_jump_hash`, keys hashed with
        // XXH3): a key's backend is its position in this list, and the position depends
        // on the key and the list's length only, never on an address. So the pod that
        // takes a slot serves exactly that slot's keys, and a ring grown by one slot at
        // its end moves 1/(n+1) of the keys, all to the new slot.
        let _ = writeln!(out, "{indent}options = {{ dist = mcp.dist_jump_hash }},");
        let _ = writeln!(out, "{indent}backends = {{");
        if ring.is_empty() {
            // No pod at all: one backend marked down, so the proxy starts and answers
            // every request with an error instead of refusing the configuration.
            let _ = writeln!(
                out,
                "{indent}    {{ label = \"no-ready-pods\", host = \"127.0.0.1\", port = \"1\", down = true }},"
            );
        }
        for (slot, b) in ring.iter().enumerate() {
            let Some(b) = b else {
                // A vacant slot keeps its position (so no other slot's keys move), marked
                // down: its reads miss and its writes fail until a new pod takes it. The
                // label cannot be a pod's (no `:` in pod names).
                let _ = writeln!(
                    out,
                    "{indent}    {{ label = \"vacant:{copy}:{slot}\", host = \"127.0.0.1\", port = \"1\", down = true }},"
                );
                continue;
            };
            let (host, port) = b.address.rsplit_once(':').unwrap_or((&b.address, ""));
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let _ = writeln!(
                out,
                "{indent}    {{ label = {}, host = {}, port = {} }},",
                lua_string(&b.pod),
                lua_string(host),
                lua_string(port)
            );
        }
        let _ = writeln!(out, "{indent}}},");
    };
    // A read that fails (its backend is down) answers a miss, as a client of a lost pod
    // would see: the null route after the real one.
    let reads = |body: &mut String, route: &str| {
        body.push_str("    cmap = {\n");
        for read in ["get", "gets", "gat", "gats", "mg"] {
            let _ = writeln!(
                body,
                "        {read} = route_failover{{ children = {{ {route}, route_null{{}} }} }},"
            );
        }
        body.push_str("    },\n");
    };
    body.push_str("pools{\n");
    if groups.len() <= 1 {
        body.push_str("    pool = {\n");
        let (copy, ring) = groups
            .first()
            .map_or((1, &[][..]), |(c, r)| (*c, r.as_slice()));
        pool(&mut body, "        ", copy, ring);
        body.push_str("    },\n}\nroutes{\n");
        reads(&mut body, "route_direct{ child = \"pool\" }");
        body.push_str("    default = route_direct{ child = \"pool\" },\n}\n");
    } else {
        body.push_str("    set_copies = {\n");
        for (copy, ring) in &groups {
            body.push_str("        {\n");
            pool(&mut body, "            ", *copy, ring);
            body.push_str("        },\n");
        }
        body.push_str("    },\n}\nroutes{\n");
        // One copy answers; a miss or an error there asks the next.
        reads(
            &mut body,
            "route_failover{ children = \"set_copies\", miss = true, shuffle = true }",
        );
        // Writes go to every copy and answer with the first success.
        body.push_str("    default = route_allfastest{ children = \"set_copies\" },\n}\n");
    }
    let version = version_of(&body);
    let _ = write!(
        body,
        "-- Reload when the kubelet has replaced this file with another version.\n\
         mcp.register_cron(\"memcached-operator-reload\", {{\n    \
             every = {RELOAD_CHECK_SECONDS},\n    \
             func = function()\n        \
                 local f = io.open(path, \"r\")\n        \
                 if f == nil then return end\n        \
                 local first = f:read(\"l\")\n        \
                 f:close()\n        \
                 if first ~= nil and first ~= {} then\n            \
                     mcp.schedule_config_reload()\n        \
                 end\n    \
             end,\n\
         }})\n",
        lua_string(&version_line(&version)),
    );
    let text = format!("{}\n{body}", version_line(&version));
    (text, version)
}

fn version_line(version: &str) -> String {
    format!("-- version {version}")
}

fn version_of(body: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The ConfigMap `NAME-proxy` holding the rendered routes for `backends`, and its version.
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
    let (text, version) = render(
        &owner,
        backends,
        proxy.copies,
        &format!("{CONFIG_DIR}/{CONFIG_KEY}"),
    );
    let recorded = serde_json::to_string(backends).unwrap_or_else(|_| "[]".to_string());
    Ok(Some((
        ConfigMap {
            metadata: proxy_metadata(mc)?,
            data: Some(BTreeMap::from([
                (CONFIG_KEY.to_string(), text),
                (BACKENDS_KEY.to_string(), recorded),
            ])),
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

/// A backend as recorded in a ConfigMap: written before slots existed, it has none.
#[derive(Deserialize)]
struct Recorded {
    copy: i32,
    slot: Option<i32>,
    #[serde(default)]
    pod: String,
    #[serde(default)]
    address: String,
}

/// The backends recorded in a ConfigMap's data (its JSON text as cached), or none. A record
/// written before slots existed (one list of Ready pods per copy, sorted by name) gets
/// them in its order.
pub fn recorded_backends(data_json: &str) -> Vec<ProxyBackend> {
    let recorded: Vec<Recorded> = serde_json::from_str::<BTreeMap<String, String>>(data_json)
        .ok()
        .and_then(|data| serde_json::from_str(data.get(BACKENDS_KEY)?).ok())
        .unwrap_or_default();
    let mut next: BTreeMap<i32, i32> = BTreeMap::new();
    recorded
        .into_iter()
        .map(|r| {
            let slot = r.slot.unwrap_or_else(|| {
                let n = next.entry(r.copy).or_insert(0);
                *n += 1;
                *n - 1
            });
            ProxyBackend {
                copy: r.copy,
                slot,
                pod: r.pod,
                address: r.address,
            }
        })
        .collect()
}

/// `spec.proxy`'s copies, 1 when unset.
pub fn copies(proxy: Option<&ProxySpec>) -> i32 {
    proxy.map_or(1, |p| p.copies.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: i32 = 11211;

    /// A pod with an IP of its own.
    fn pod(name: &str, ready: bool) -> PoolPod {
        let n: u32 = name.bytes().map(u32::from).sum();
        PoolPod {
            name: name.to_string(),
            ip: Some(format!("10.0.{}.{}", n / 250, n % 250 + 1)),
            ready,
        }
    }

    fn ready(names: &[&str]) -> Vec<PoolPod> {
        names.iter().map(|n| pod(n, true)).collect()
    }

    /// Copy `copy`'s ring, slot by slot ("" for a vacant slot).
    fn ring(m: &Membership, copy: i32) -> Vec<&str> {
        let slots: Vec<i32> = m
            .backends
            .iter()
            .filter(|b| b.copy == copy)
            .map(|b| b.slot)
            .collect();
        assert_eq!(slots, (0..slots.len() as i32).collect::<Vec<_>>(), "{m:?}");
        m.backends
            .iter()
            .filter(|b| b.copy == copy)
            .map(|b| b.pod.as_str())
            .collect()
    }

    fn cost(m: &Membership, pod: &str) -> Option<i32> {
        m.deletion_costs.get(pod).copied()
    }

    /// The next membership from `m`'s record, and that computing it again changes nothing.
    fn next(m: &Membership, pods: &[PoolPod], size: i32, copies: i32) -> Membership {
        let next = membership(&m.backends, pods, size, copies, PORT);
        assert_eq!(
            membership(&next.backends, pods, size, copies, PORT),
            next,
            "stable"
        );
        next
    }

    #[test]
    fn a_pod_keeps_its_slot_until_it_is_gone_ready_or_not() {
        let empty = Membership::default();
        let first = next(&empty, &ready(&["c", "a", "b"]), 3, 1);
        assert_eq!(ring(&first, 1), ["a", "b", "c"], "newcomers in name order");
        assert_eq!(
            (cost(&first, "a"), cost(&first, "b"), cost(&first, "c")),
            (Some(1000), Some(999), Some(998)),
            "the last slot is the cheapest"
        );

        // b stops being Ready, even loses its IP: nothing changes, not even its address.
        let mut flapping = vec![pod("a", true), pod("b", false), pod("c", true)];
        assert_eq!(next(&first, &flapping, 3, 1), first);
        flapping[1].ip = None;
        assert_eq!(next(&first, &flapping, 3, 1), first);

        // b is deleted: its slot stays, vacant; a pod that is not Ready yet does not join.
        let gone = next(
            &first,
            &[pod("a", true), pod("c", true), pod("d", false)],
            3,
            1,
        );
        assert_eq!(ring(&gone, 1), ["a", "", "c"]);
        assert_eq!(cost(&gone, "d"), None);
        assert!(gone.backends[1].is_vacant() && gone.backends[1].address.is_empty());
        // Once Ready, the replacement takes b's slot and b's cost.
        let replaced = next(&gone, &ready(&["a", "c", "d"]), 3, 1);
        assert_eq!(ring(&replaced, 1), ["a", "d", "c"]);
        assert_eq!(cost(&replaced, "d"), Some(999));
        assert_eq!(replaced.backends[1].address, "10.0.0.101:11211");
        // The last slot's pod is replaced: the ring keeps its length meanwhile.
        let last_gone = next(&replaced, &ready(&["a", "d"]), 3, 1);
        assert_eq!(ring(&last_gone, 1), ["a", "d", ""]);
        let last_back = next(&last_gone, &ready(&["a", "d", "0new"]), 3, 1);
        assert_eq!(ring(&last_back, 1), ["a", "d", "0new"]);
        // An ended or deleted pod is not among the live pods: same as gone.
        let all_gone = next(&last_back, &[], 3, 1);
        assert_eq!(ring(&all_gone, 1), ["", "", ""]);
        assert!(all_gone.deletion_costs.is_empty());
    }

    #[test]
    fn the_ring_grows_as_pods_join_and_shrinks_by_its_last_slots() {
        let three = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        // 3 → 4: no slot until the new pod is Ready, then the fourth.
        let mut pods = vec![
            pod("a", true),
            pod("b", true),
            pod("c", true),
            pod("d", false),
        ];
        assert_eq!(ring(&next(&three, &pods, 4, 1), 1), ["a", "b", "c"]);
        pods[3].ready = true;
        let four = next(&three, &pods, 4, 1);
        assert_eq!(ring(&four, 1), ["a", "b", "c", "d"]);
        assert_eq!(cost(&four, "d"), Some(997));
        // 4 → 3: the ring stays as long as d lives, and loses its last slot when d goes.
        assert_eq!(next(&four, &pods, 3, 1), four);
        let back = next(&four, &ready(&["a", "b", "c"]), 3, 1);
        assert_eq!(ring(&back, 1), ["a", "b", "c"]);

        // A rolling update's extra pod waits for a slot, and takes the one freed.
        let surge = next(&back, &ready(&["a", "b", "c", "e"]), 3, 1);
        assert_eq!(surge, back);
        let rolled = next(&surge, &ready(&["a", "b", "e"]), 3, 1);
        assert_eq!(ring(&rolled, 1), ["a", "b", "e"]);

        // 4 → 2, the ReplicaSet removing b (not Ready, say) and d. While it is under way
        // nobody moves; then c, beyond the capacity, moves into b's slot.
        let halfway = next(&four, &ready(&["a", "c", "d"]), 2, 1);
        assert_eq!(ring(&halfway, 1), ["a", "", "c", "d"]);
        let two = next(&halfway, &ready(&["a", "c"]), 2, 1);
        assert_eq!(ring(&two, 1), ["a", "c"]);
        assert_eq!(cost(&two, "c"), Some(999));
    }

    #[test]
    fn copies_are_filled_slot_by_slot_and_a_change_of_copies_moves_few_pods() {
        let four = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 4, 2);
        assert_eq!(
            (ring(&four, 1), ring(&four, 2)),
            (vec!["a", "c"], vec!["b", "d"])
        );
        let costs: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|p| cost(&four, p))
            .collect();
        assert_eq!(costs, [Some(1000), Some(999), Some(998), Some(997)]);
        // A fifth pod: the third slot of copy 1, the cheapest.
        let five = next(&four, &ready(&["a", "b", "c", "d", "e"]), 5, 2);
        assert_eq!(
            (ring(&five, 1), ring(&five, 2)),
            (vec!["a", "c", "e"], vec!["b", "d"])
        );
        assert_eq!(cost(&five, "e"), Some(996));
        // A pod of copy 2 replaced: the replacement goes to copy 2, same slot.
        let replaced = next(&five, &ready(&["a", "b", "c", "e", "f"]), 5, 2);
        assert_eq!(ring(&replaced, 2), ["b", "f"]);

        // copies 1 → 2 on 4 pods: the last two move to copy 2, the rest stay.
        let single = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 4, 1);
        let raised = next(&single, &ready(&["a", "b", "c", "d"]), 4, 2);
        assert_eq!(
            (ring(&raised, 1), ring(&raised, 2)),
            (vec!["a", "b"], vec!["d", "c"])
        );
        // 2 → 1: copy 2's pods go to the end of copy 1.
        let lowered = next(&four, &ready(&["a", "b", "c", "d"]), 4, 1);
        assert_eq!(ring(&lowered, 1), ["a", "c", "d", "b"]);
        // More copies than pods: the empty copies have no ring.
        let thin = next(&Membership::default(), &ready(&["a"]), 1, 3);
        assert_eq!((ring(&thin, 1), ring(&thin, 2)), (vec!["a"], vec![]));
    }

    #[test]
    fn records_from_before_slots_get_them_in_order() {
        let data = serde_json::json!({
            BACKENDS_KEY: r#"[{"copy":1,"pod":"a","address":"10.0.0.1:11211"},
                             {"copy":1,"pod":"b","address":"10.0.0.2:11211"},
                             {"copy":2,"pod":"c","address":"10.0.0.3:11211"}]"#,
        })
        .to_string();
        let slots: Vec<(i32, i32, String)> = recorded_backends(&data)
            .into_iter()
            .map(|b| (b.copy, b.slot, b.pod))
            .collect();
        assert_eq!(
            slots,
            [(1, 0, "a".into()), (1, 1, "b".into()), (2, 0, "c".into())]
        );
        // And a record with slots reads back as written.
        let m = next(&Membership::default(), &ready(&["a", "b"]), 3, 1);
        let gone = next(&m, &ready(&["a"]), 3, 1);
        let written = serde_json::json!({
            BACKENDS_KEY: serde_json::to_string(&gone.backends).unwrap_or_default(),
        })
        .to_string();
        assert_eq!(recorded_backends(&written), gone.backends);
        assert_eq!(recorded_backends("not json"), []);
    }

    #[test]
    fn the_rendering_follows_the_slots_not_the_order_given() {
        let m = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        let mut shuffled = m.backends.clone();
        shuffled.reverse();
        let (text, version) = render("ns/x", &m.backends, 1, "/f");
        assert_eq!(render("ns/x", &shuffled, 1, "/f").1, version);
        assert_eq!(version.len(), 16);
        assert!(
            text.starts_with(&format!("-- version {version}\n")),
            "{text}"
        );
        assert!(text.contains("dist = mcp.dist_jump_hash"), "{text}");
        let order: Vec<usize> = ["\"a\"", "\"b\"", "\"c\""]
            .iter()
            .filter_map(|label| text.find(&format!("label = {label}")))
            .collect();
        assert!(order.len() == 3 && order.is_sorted(), "slot order: {text}");
        // Another address is another configuration.
        let mut other = m.backends.clone();
        other[0].address = "10.9.9.9:11211".into();
        assert_ne!(render("ns/x", &other, 1, "/f").1, version);
        // A vacant slot keeps its place, down.
        let gone = next(&m, &ready(&["a", "c"]), 3, 1);
        let (text, _) = render("ns/x", &gone.backends, 1, "/f");
        let vacant = text.find("label = \"vacant:1:1\"").unwrap_or_default();
        assert!(
            text.find("label = \"a\"") < Some(vacant) && Some(vacant) < text.find("label = \"c\""),
            "{text}"
        );
        assert!(text.contains("\"vacant:1:1\", host = \"127.0.0.1\", port = \"1\", down = true"));
    }

    fn memcached(proxy: Option<ProxySpec>) -> Memcached {
        let mut mc = Memcached::new(
            "cache",
            memcached_api::MemcachedSpec {
                proxy,
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

    #[test]
    fn lua_strings_are_escaped() {
        assert_eq!(lua_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\010\"");
    }
}
