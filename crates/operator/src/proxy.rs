//! memcached's built-in proxy in front of a pool (`spec.proxy`): the desired Deployment,
//! Service, PodDisruptionBudget and ConfigMap, and the route configuration rendered into the
//! ConfigMap. Pure, like [`crate::builders`].
//!
//! **One endpoint.** Clients connect to the Service `NAME-proxy`. The client Service `NAME`
//! keeps selecting the memcached pods, so turning the proxy on changes nothing for the
//! clients already connected there (or hashing over `status.endpoints`), and turning it off
//! again breaks no one who did not move.
//!
//! **Routes.** The configuration uses the route library built into memcached
//! (`-o proxy_config=routelib,proxy_arg=FILE`). The pool's Ready pods are the backends of a
//! consistent-hash ring (`mcp.dist_ring_hash` in `ketama` mode: 160 points per backend
//! hashed from its `ip:port`, so a backend's place on the ring does not depend on the others or on their
//! order, and growing 3 pods to 4 moves about a quarter of the keys; libketama's ring, so a
//! client hashing with libketama over `status.endpoints` would agree). With `copies` of 2
//! or 3 the pods are split into that many rings; writes go to every ring and answer with
//! the first success (`route_allfastest`), reads go to one ring and fall over to the next
//! on a miss or an error (`route_failover`).
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
/// The backends as JSON in the ConfigMap: which pod is in which copy, so the next
/// rendering keeps every pod in its copy (see [`assign`]).
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

/// A Ready pod of the pool, as the proxy needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyPod {
    pub name: String,
    pub ip: String,
}

/// The backends of the proxy: every Ready pod of `ready` in one of `copies` copies, each
/// pod that was in `previous` staying in its copy (so a change of the pool moves only the
/// keys of the pods that came or went), each new pod (in name order) joining the copy with
/// the fewest pods, the lowest copy on a tie. With fewer Ready pods than copies, some
/// copies are empty. Sorted by copy, then pod.
pub fn assign(
    previous: &[ProxyBackend],
    ready: &[ReadyPod],
    copies: i32,
    port: i32,
) -> Vec<ProxyBackend> {
    let copies = copies.clamp(1, memcached_api::MAX_PROXY_COPIES);
    let was: BTreeMap<&str, i32> = previous
        .iter()
        .filter(|b| (1..=copies).contains(&b.copy))
        .map(|b| (b.pod.as_str(), b.copy))
        .collect();
    let mut sizes = vec![0usize; copies as usize];
    let mut out = Vec::with_capacity(ready.len());
    let mut newcomers: Vec<&ReadyPod> = Vec::new();
    let mut seen = BTreeSet::new();
    for pod in ready {
        if !seen.insert(pod.name.as_str()) {
            continue;
        }
        match was.get(pod.name.as_str()) {
            Some(&copy) => {
                sizes[(copy - 1) as usize] += 1;
                out.push((copy, pod));
            }
            None => newcomers.push(pod),
        }
    }
    newcomers.sort_by(|a, b| a.name.cmp(&b.name));
    for pod in newcomers {
        let (index, _) = sizes
            .iter()
            .enumerate()
            .min_by_key(|&(i, n)| (*n, i))
            .unwrap_or((0, &0));
        sizes[index] += 1;
        out.push((index as i32 + 1, pod));
    }
    // Copies that differ by more than one pod (`copies` was raised, or the pods of one copy
    // went) are evened out by moving as few pods as possible: the last by name of the
    // biggest copy to the smallest.
    loop {
        let big = (0..sizes.len())
            .max_by_key(|&i| (sizes[i], usize::MAX - i))
            .unwrap_or(0);
        let small = (0..sizes.len()).min_by_key(|&i| (sizes[i], i)).unwrap_or(0);
        if sizes[big] <= sizes[small] + 1 {
            break;
        }
        let moved = out
            .iter()
            .enumerate()
            .filter(|(_, (copy, _))| *copy == big as i32 + 1)
            .max_by(|a, b| a.1.1.name.cmp(&b.1.1.name))
            .map(|(at, _)| at);
        let Some(at) = moved else { break };
        out[at].0 = small as i32 + 1;
        sizes[big] -= 1;
        sizes[small] += 1;
    }
    let mut backends: Vec<ProxyBackend> = out
        .into_iter()
        .map(|(copy, pod)| ProxyBackend {
            copy,
            pod: pod.name.clone(),
            address: crate::status::endpoint(&pod.ip, port),
        })
        .collect();
    backends.sort();
    backends
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
         -- pool's Ready pods. Edits are overwritten."
    );
    let _ = writeln!(body, "local path = {}", lua_string(file));
    let groups: Vec<Vec<&ProxyBackend>> = (1..=copies.max(1))
        .map(|copy| backends.iter().filter(|b| b.copy == copy).collect())
        .filter(|group: &Vec<&ProxyBackend>| !group.is_empty())
        .collect();
    let pool = |out: &mut String, indent: &str, group: &[&ProxyBackend]| {
        // libketama's ring (`omode = "ketama"`: 160 points per backend from MD5 of
        // `ip:port-N`, keys hashed with MD5 too). memcached 1.6.38's default ring mode
        // writes every point of a backend into one slot, which sends nearly every key to one
        // backend (`tests/real_proxy.rs` caught it).
        let _ = writeln!(
            out,
            "{indent}options = {{ dist = mcp.dist_ring_hash, omode = \"ketama\", hash = mcp.dist_ring_hash.hash }},"
        );
        let _ = writeln!(out, "{indent}backends = {{");
        if group.is_empty() {
            // No Ready pod: one backend marked down, so the proxy starts and answers
            // every request with an error instead of refusing the configuration.
            let _ = writeln!(
                out,
                "{indent}    {{ label = \"no-ready-pods\", host = \"127.0.0.1\", port = \"1\", down = true }},"
            );
        }
        for b in group {
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
        pool(
            &mut body,
            "        ",
            groups.first().map(Vec::as_slice).unwrap_or_default(),
        );
        body.push_str("    },\n}\nroutes{\n");
        reads(&mut body, "route_direct{ child = \"pool\" }");
        body.push_str("    default = route_direct{ child = \"pool\" },\n}\n");
    } else {
        body.push_str("    set_copies = {\n");
        for group in &groups {
            body.push_str("        {\n");
            pool(&mut body, "            ", group);
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

/// The backends recorded in a ConfigMap's data (its JSON text as cached), or none.
pub fn recorded_backends(data_json: &str) -> Vec<ProxyBackend> {
    serde_json::from_str::<BTreeMap<String, String>>(data_json)
        .ok()
        .and_then(|data| serde_json::from_str(data.get(BACKENDS_KEY)?).ok())
        .unwrap_or_default()
}

/// `spec.proxy`'s copies, 1 when unset.
pub fn copies(proxy: Option<&ProxySpec>) -> i32 {
    proxy.map_or(1, |p| p.copies.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> Vec<ReadyPod> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| ReadyPod {
                name: n.to_string(),
                ip: format!("10.0.0.{}", i + 1),
            })
            .collect()
    }

    fn copy_of(backends: &[ProxyBackend], pod: &str) -> Option<i32> {
        backends.iter().find(|b| b.pod == pod).map(|b| b.copy)
    }

    #[test]
    fn pods_keep_their_copy_and_newcomers_fill_the_smallest() {
        let first = assign(&[], &pods(&["c", "a", "d", "b"]), 2, 11211);
        // In name order, alternating: a→1, b→2, c→1, d→2.
        assert_eq!(copy_of(&first, "a"), Some(1));
        assert_eq!(copy_of(&first, "b"), Some(2));
        assert_eq!(copy_of(&first, "c"), Some(1));
        assert_eq!(copy_of(&first, "d"), Some(2));
        // "b" is replaced by "0new", which sorts first: the others stay where they were,
        // and the newcomer takes the copy "b" left.
        let second = assign(&first, &pods(&["a", "c", "d", "0new"]), 2, 11211);
        assert_eq!(copy_of(&second, "a"), Some(1));
        assert_eq!(copy_of(&second, "c"), Some(1));
        assert_eq!(copy_of(&second, "d"), Some(2));
        assert_eq!(copy_of(&second, "0new"), Some(2));
        // Copies raised from 1 to 2 on a running pool: half the pods move, the last by name.
        let single = assign(&[], &pods(&["a", "b", "c", "d"]), 1, 11211);
        let raised = assign(&single, &pods(&["a", "b", "c", "d"]), 2, 11211);
        let copies: Vec<i32> = ["a", "b", "c", "d"]
            .iter()
            .filter_map(|p| copy_of(&raised, p))
            .collect();
        assert_eq!(copies, [1, 1, 2, 2], "{raised:?}");
        // Both pods of copy 2 go: one of copy 1 moves over, so each copy has a pod.
        let survivors = assign(&raised, &pods(&["a", "b"]), 2, 11211);
        let mut per_copy: Vec<i32> = survivors.iter().map(|b| b.copy).collect();
        per_copy.sort();
        assert_eq!(per_copy, [1, 2], "{survivors:?}");
        // Stable: assigning again changes nothing.
        assert_eq!(assign(&survivors, &pods(&["a", "b"]), 2, 11211), survivors);
        // One copy: everyone in copy 1, whatever came before.
        let one = assign(&second, &pods(&["a", "c"]), 1, 11211);
        assert!(one.iter().all(|b| b.copy == 1), "{one:?}");
    }

    #[test]
    fn the_rendering_depends_on_the_backends_not_on_their_order() {
        let a = assign(&[], &pods(&["a", "b", "c"]), 1, 11211);
        let mut shuffled = pods(&["a", "b", "c"]);
        shuffled.reverse();
        let b = assign(&[], &shuffled, 1, 11211);
        let (_, va) = render("ns/x", &a, 1, "/f");
        let (text, vb) = render("ns/x", &b, 1, "/f");
        assert_eq!(va, vb);
        assert_eq!(va.len(), 16);
        assert!(text.starts_with(&format!("-- version {vb}\n")), "{text}");
        // The addresses are the same, the IPs differ by pod: only names and IPs matter.
        let mut other = a.clone();
        other[0].address = "10.9.9.9:11211".into();
        assert_ne!(render("ns/x", &other, 1, "/f").1, va);
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
