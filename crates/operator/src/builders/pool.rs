//! The pool's Deployment: memcached's command line and memory, the pod template with its
//! containers (memcached, the exporter, the TLS reload agent), volumes (extstore's with
//! room beyond its file), probes, security and spreading, and the configuration hash that rolls the pods when the configuration
//! (or a mounted Secret) changes.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, DownwardAPIProjection, DownwardAPIVolumeFile,
    EmptyDirVolumeSource, EnvVar, EphemeralVolumeSource, KeyToPath, Lifecycle, LifecycleHandler,
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
    PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    SecretProjection, SecretVolumeSource, SecurityContext, SleepAction, TCPSocketAction,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use memcached_api::validation::EXTSTORE_WRITE_BUFFERS;
use memcached_api::{
    CA_KEY, EXPORTER_PORT, ExtstoreSpec, Memcached, MemcachedConfig, MemcachedSpec, TLS_ADMIN_PORT,
    TlsSpec, TopologySpread,
};

use super::*;

/// The memcached command line for `config` on `port`. The seed ran
/// `memcached -m=64 -o modern -v`, which memcached 1.6 reads as `-m` "=64" (0 MiB) and
/// refuses to start; `-m 64` is what it meant.
pub fn memcached_args(config: &MemcachedConfig, port: i32, sasl: bool, tls: bool) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "memcached".into(),
        "-m".into(),
        config.memory_mib.to_string(),
        "-c".into(),
        config.max_connections.to_string(),
        "-t".into(),
        config.threads.to_string(),
        "-I".into(),
        config.max_item_size.clone(),
        "-p".into(),
        port.to_string(),
        "-o".into(),
        "modern".into(),
    ];
    if config.verbosity > 0 {
        let level = usize::try_from(config.verbosity.min(3)).unwrap_or(1);
        args.push(format!("-{}", "v".repeat(level)));
    }
    if sasl {
        args.push("-S".into());
    }
    if tls {
        args.push("-Z".into());
        args.push("-o".into());
        args.push(format!(
            "ssl_chain_cert={TLS_DIR}/tls.crt,ssl_key={TLS_DIR}/tls.key"
        ));
    }
    args.extend(config.extra_args.iter().cloned());
    args
}

/// Memory for memcached with `config` (and TLS when `tls`), extstore aside: the cache; a
/// quarter of it for the hash table (at most 17% of the cache, while it grows); 48 MiB for
/// the process and the first page of every slab class (memcached gives a class with no page
/// its first 1 MiB page even when the cache is full: 38 classes at the default growth
/// factor); and each connection's buffers, 5 KiB (32 KiB with TLS) for each of `-c`.
/// Measured with a real memcached filled to eviction (`tests/real_memcached_memory.rs`,
/// BENCHMARKS.md "Memory headroom of the derived limit"). Used as both request and limit,
/// so the pod is neither evicted for using what it asked for nor OOM-killed for filling its
/// cache.
pub fn container_memory_mib(config: &MemcachedConfig, tls: bool) -> i64 {
    let m = i64::from(config.memory_mib.max(0));
    let per_connection_kib = if tls { 32 } else { 5 };
    let connections = (i64::from(config.max_connections.max(0)) * per_connection_kib + 1023) / 1024;
    m + (m + 3) / 4 + 48 + connections
}

/// The memory releases up to 0.2 derived for a cache of `memory_mib`: the cache, 25% and
/// 32 MiB, which a full cache of 64 MiB outgrows (116 MiB at its peak, 142 MiB with TLS).
/// A running pool keeps it until its pod template changes for a reason of its own (see
/// `controller::rollout`), so an upgrade of the operator restarts no pod for it.
pub fn earlier_container_memory_mib(memory_mib: i32) -> i64 {
    let m = i64::from(memory_mib.max(0));
    m + (m + 3) / 4 + 32
}

/// Memory of the memcached container of `spec`: [`container_memory_mib`], plus extstore's
/// write buffers when it is on (memcached allocates them at start).
pub fn pool_memory_mib(spec: &MemcachedSpec) -> i64 {
    with_write_buffers(
        spec,
        container_memory_mib(&spec.config(), spec.tls.is_some()),
    )
}

fn with_write_buffers(spec: &MemcachedSpec, memory_mib: i64) -> i64 {
    match spec.extstore_enabled() {
        Some(ext) => memory_mib + EXTSTORE_WRITE_BUFFERS * i64::from(ext.write_buffer_mib.max(0)),
        None => memory_mib,
    }
}

fn default_resources(spec: &MemcachedSpec) -> ResourceRequirements {
    derived_resources(spec, pool_memory_mib(spec))
}

/// The memcached container's resources releases up to 0.2 derived for `spec` (see
/// [`earlier_container_memory_mib`]).
pub fn earlier_default_resources(spec: &MemcachedSpec) -> ResourceRequirements {
    let cache = earlier_container_memory_mib(spec.config().memory_mib);
    derived_resources(spec, with_write_buffers(spec, cache))
}

fn derived_resources(spec: &MemcachedSpec, memory_mib: i64) -> ResourceRequirements {
    let memory = Quantity(format!("{memory_mib}Mi"));
    let mut requests = BTreeMap::from([
        ("cpu".to_string(), Quantity("100m".to_string())),
        ("memory".to_string(), memory.clone()),
    ]);
    // An extstore file on node disk counts against the node's ephemeral storage: ask the
    // scheduler for it, so the pod is not placed where it would be evicted for filling it.
    if let Some(ext) = spec.extstore_enabled()
        && ext.storage_class_name.is_none()
    {
        requests.insert("ephemeral-storage".to_string(), Quantity(ext.size.clone()));
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(BTreeMap::from([("memory".to_string(), memory)])),
        ..ResourceRequirements::default()
    }
}

/// memcached's command line for `spec`: [`memcached_args`], then the listeners when the
/// TLS certificate is reloaded in place (TLS on every address, plus a non-TLS listener on
/// loopback only for the reload agent), then extstore's flags.
pub fn pool_args(spec: &MemcachedSpec) -> Vec<String> {
    let port = spec.container_port;
    let mut args = memcached_args(
        &spec.config(),
        port,
        spec.sasl.is_some(),
        spec.tls.is_some(),
    );
    if let Some(client_auth) = spec.tls.as_ref().and_then(|t| t.client_auth.as_ref()) {
        args.push("-o".into());
        args.push(format!(
            "ssl_ca_cert={TLS_DIR}/{CA_KEY},ssl_verify_mode={}",
            client_auth.verify.unwrap_or_default().ssl_verify_mode()
        ));
    }
    if spec.tls_reloads_in_place() {
        args.push("-l".into());
        args.push(format!("*:{port},notls:127.0.0.1:{TLS_ADMIN_PORT}"));
    }
    if let Some(ext) = spec.extstore_enabled() {
        args.push("-o".into());
        args.push(extstore_options(ext));
    }
    args
}

/// memcached's `-o` value for extstore; `ext_page_size` must come before `ext_path`.
fn extstore_options(ext: &ExtstoreSpec) -> String {
    let mib = memcached_api::validation::parse_quantity_bytes(&ext.size).unwrap_or(0) >> 20;
    let mut options = vec![
        format!("ext_page_size={}", ext.page_size_mib),
        format!("ext_wbuf_size={}", ext.write_buffer_mib),
        format!("ext_threads={}", ext.threads),
        format!("ext_item_size={}", ext.item_size_bytes),
    ];
    if let Some(age) = ext.item_age_seconds {
        options.push(format!("ext_item_age={age}"));
    }
    options.push(format!("ext_path={EXTSTORE_FILE}:{mib}m"));
    options.join(",")
}

pub(crate) fn tcp_probe(port: &str, initial_delay: i32, period: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(port.to_string()),
            host: None,
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        ..Probe::default()
    }
}

pub(crate) fn restricted(uid: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

/// Topology spread of the pods selected by `selector` under `policy`; with `strict_zones`
/// (the pool's pods under `spec.proxy.zones`), an even spread over zones is required
/// whatever the policy.
pub(crate) fn spread_constraints(
    selector: &BTreeMap<String, String>,
    policy: TopologySpread,
    strict_zones: bool,
) -> Option<Vec<TopologySpreadConstraint>> {
    // (across nodes, across zones)
    let (nodes, zones) = match policy {
        TopologySpread::Disabled if strict_zones => (None, "DoNotSchedule"),
        TopologySpread::Disabled => return None,
        TopologySpread::Preferred => (Some("ScheduleAnyway"), "ScheduleAnyway"),
        // The scheduler never places a pod under a `DoNotSchedule` rule on a node that lacks
        // the rule's key: a strict zone rule would leave every pod Pending on a cluster
        // whose nodes carry no zone label.
        TopologySpread::Required => (Some("DoNotSchedule"), "ScheduleAnyway"),
    };
    // Zones named in `spec.proxy.zones` are on nodes with the label.
    let zones = if strict_zones { "DoNotSchedule" } else { zones };
    let constraint = |key: &str, when: &str| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.to_string(),
        when_unsatisfiable: when.to_string(),
        label_selector: Some(LabelSelector {
            match_labels: Some(selector.clone()),
            match_expressions: None,
        }),
        // Count only the pods of the current ReplicaSet, so a rollout is not skewed by the
        // old pods it is replacing.
        match_label_keys: Some(vec!["pod-template-hash".to_string()]),
        ..TopologySpreadConstraint::default()
    };
    Some(
        nodes
            .map(|nodes| constraint("kubernetes.io/hostname", nodes))
            .into_iter()
            .chain([constraint(memcached_api::ZONE_LABEL, zones)])
            .collect(),
    )
}

/// The pool pods' affinity: the user's (`spec.affinity`), and with `zones`
/// (`spec.proxy.zones`) a node in one of them required, in every one of the user's node
/// selector terms (which are alternatives).
pub(crate) fn pool_affinity(user: Option<&Affinity>, zones: &[String]) -> Option<Affinity> {
    if zones.is_empty() {
        return user.cloned();
    }
    let in_zones = NodeSelectorRequirement {
        key: memcached_api::ZONE_LABEL.to_string(),
        operator: "In".to_string(),
        values: Some(zones.to_vec()),
    };
    let mut affinity = user.cloned().unwrap_or_default();
    let node = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = node
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(in_zones.clone());
    }
    Some(affinity)
}

fn exporter_container(mc: &Memcached, settings: &BuildSettings) -> Container {
    let image = mc
        .spec
        .exporter
        .as_ref()
        .and_then(|e| e.image.clone())
        .unwrap_or_else(|| settings.default_exporter_image.clone());
    Container {
        name: EXPORTER_NAME.to_string(),
        image: Some(image),
        args: Some(vec![
            format!("--memcached.address=localhost:{}", mc.spec.container_port),
            format!("--web.listen-address=:{EXPORTER_PORT}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.to_string()),
            container_port: EXPORTER_PORT,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(METRICS_PORT_NAME, 1, 10)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".to_string())),
                ("memory".to_string(), Quantity("32Mi".to_string())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("64Mi".to_string()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted(EXPORTER_UID)),
        ..Container::default()
    }
}

/// A hash of everything that configures the memcached process, the Secrets' contents
/// included: SHA-256 over a fixed encoding, so the same configuration gives the same
/// pod-template annotation under every build of the operator (a change would roll every
/// pool).
pub fn config_hash(args: &[String], secrets: &SecretVersions) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut field = |bytes: &[u8]| {
        ctx.update(&(bytes.len() as u64).to_le_bytes());
        ctx.update(bytes);
    };
    for arg in args {
        field(arg.as_bytes());
    }
    for secret in [&secrets.sasl, &secrets.tls] {
        field(secret.as_deref().unwrap_or("-").as_bytes());
    }
    // Only with client authentication, so every other pool keeps its hash.
    if let Some(ca) = &secrets.client_ca {
        field(ca.as_bytes());
    }
    let digest = ctx.finish();
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// The digest of a Secret's keys, as `SecretVersions` carries it: the reload agent's,
// which must digest the mounted files as the reconciler digests the Secret.
pub use memcached_tls_agent::secret_digest;

/// The Deployment that runs `mc.spec.size` memcached pods, with no Secrets read.
pub fn desired_deployment(
    mc: &Memcached,
    settings: &BuildSettings,
) -> Result<Deployment, BuildError> {
    desired_deployment_with(mc, settings, &SecretVersions::default())
}

/// The Deployment that runs `mc.spec.size` memcached pods; `secrets` are the versions of
/// the SASL and TLS Secrets it mounts.
pub fn desired_deployment_with(
    mc: &Memcached,
    settings: &BuildSettings,
    secrets: &SecretVersions,
) -> Result<Deployment, BuildError> {
    let name = name_of(mc)?;
    let spec = &mc.spec;
    let port = spec.container_port;
    let args = pool_args(spec);
    // The zones the copies live in (`spec.proxy.zones`).
    let zones: &[String] = spec
        .proxy_enabled()
        .filter(|p| p.zoned())
        .map_or(&[], |p| p.zones.as_slice());

    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut env = Vec::new();
    if let Some(sasl) = &spec.sasl {
        volumes.push(sasl_volume(&sasl.secret_name));
        mounts.push(mount("sasl", SASL_DIR));
        env.push(EnvVar {
            name: "MEMCACHED_SASL_PWDB".to_string(),
            value: Some(format!("{SASL_DIR}/{SASL_PWDB_KEY}")),
            value_from: None,
        });
        env.push(EnvVar {
            name: SASL_CONF_PATH_ENV.to_string(),
            value: Some(SASL_DIR.to_string()),
            value_from: None,
        });
    }
    if let Some(tls) = &spec.tls {
        volumes.push(tls_volume(tls));
        mounts.push(mount("tls", TLS_DIR));
    }
    if let Some(ext) = spec.extstore_enabled() {
        volumes.push(extstore_volume(ext));
        mounts.push(VolumeMount {
            name: EXTSTORE_VOLUME.to_string(),
            mount_path: EXTSTORE_DIR.to_string(),
            ..VolumeMount::default()
        });
    }
    // The reload agent loads a renewed certificate in place, so the certificate's contents
    // leave the pod template's hash: a rotation changes no Deployment and restarts no pod.
    let in_place = spec.tls_reloads_in_place();
    let hashed = SecretVersions {
        sasl: secrets.sasl.clone(),
        tls: secrets.tls.clone().filter(|_| !in_place),
        client_ca: secrets.client_ca.clone(),
    };
    let init_containers = in_place.then(|| vec![tls_agent_container(settings)]);
    if in_place {
        volumes.push(Volume {
            name: TLS_AGENT_STATE_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(Quantity("1Mi".to_string())),
            }),
            ..Volume::default()
        });
    }

    let memcached = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(mc.image_or(&settings.default_image).to_string()),
        command: Some(args.clone()),
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER_NAME.to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(CONTAINER_NAME, 1, 5)),
        liveness_probe: Some(tcp_probe(CONTAINER_NAME, 10, 10)),
        resources: Some(
            spec.resources
                .clone()
                .unwrap_or_else(|| default_resources(spec)),
        ),
        security_context: Some(restricted(MEMCACHED_UID)),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Container::default()
    };
    let mut containers = vec![memcached];
    if spec.exporter_enabled() {
        containers.push(exporter_container(mc, settings));
    }

    let mut pod_labels = spec.pod_labels.clone().unwrap_or_default();
    pod_labels.extend(labels(name));
    let mut annotations = spec.pod_annotations.clone().unwrap_or_default();
    annotations.insert(
        CONFIG_HASH_ANNOTATION.to_string(),
        config_hash(&args, &hashed),
    );
    if spec.sasl.is_some() {
        annotations.insert(SASL_CONF_ANNOTATION.to_string(), SASL_CONF.to_string());
    }
    if let Some(at) = spec.rollout.as_ref().and_then(|r| r.restarted_at.as_ref()) {
        annotations.insert(RESTARTED_AT_ANNOTATION.to_string(), at.clone());
    }

    Ok(Deployment {
        metadata: child_metadata(mc, name)?,
        spec: Some(DeploymentSpec {
            replicas: Some(spec.size),
            // A new pod counts as available only after this long Ready, so the next old pod
            // (and its cache) goes only once the new one has had time to fill and to prove
            // it stays up.
            min_ready_seconds: Some(spec.min_ready_seconds()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(name)),
                match_expressions: None,
            },
            strategy: Some(one_pod_at_a_time()),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(with_user_overrides(
                    spec,
                    CONTAINER_NAME,
                    PodSpec {
                        containers,
                        init_containers,
                        enable_service_links: Some(false),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            run_as_user: Some(MEMCACHED_UID),
                            run_as_group: Some(MEMCACHED_UID),
                            // The kubelet makes mounted Secret files root-owned with this group:
                            // with mode 0440 the memcached user reads its TLS key and SASL
                            // database, and no one else in the pod does.
                            fs_group: Some(MEMCACHED_UID),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".to_string(),
                                localhost_profile: None,
                            }),
                            ..PodSecurityContext::default()
                        }),
                        node_selector: spec.node_selector.clone(),
                        tolerations: spec.tolerations.clone(),
                        affinity: pool_affinity(spec.affinity.as_deref(), zones),
                        priority_class_name: spec.priority_class_name.clone(),
                        image_pull_secrets: spec.image_pull_secrets.clone(),
                        topology_spread_constraints: spread_constraints(
                            &selector_labels(name),
                            spec.topology_spread.unwrap_or_default(),
                            !zones.is_empty(),
                        ),
                        volumes: (!volumes.is_empty()).then_some(volumes),
                        ..PodSpec::default()
                    },
                )),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// `pod` with the user's stop and security settings of `spec` applied (none of them set:
/// `pod` as it is, so pools that set none keep their pods through an upgrade): the
/// `preStop` sleep on the container named `main` and the grace period
/// (`spec.gracefulShutdown`), then `spec.podSecurityContext` over the pod's context and
/// `spec.containerSecurityContext` over every container's, field by field. A pod-level
/// `runAsUser` first removes the containers' own, which would override it.
pub(crate) fn with_user_overrides(spec: &MemcachedSpec, main: &str, mut pod: PodSpec) -> PodSpec {
    if let Some(shutdown) = &spec.graceful_shutdown {
        pod.termination_grace_period_seconds = Some(shutdown.grace_seconds());
        if shutdown.pre_stop_delay_seconds > 0
            && let Some(container) = pod.containers.iter_mut().find(|c| c.name == main)
        {
            container.lifecycle = Some(Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    sleep: Some(SleepAction {
                        seconds: i64::from(shutdown.pre_stop_delay_seconds),
                    }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            });
        }
    }
    if let Some(theirs) = &spec.pod_security_context {
        if theirs.run_as_user.is_some() {
            for container in containers(&mut pod) {
                if let Some(context) = container.security_context.as_mut() {
                    context.run_as_user = None;
                }
            }
        }
        pod.security_context = Some(overlay(
            pod.security_context.take().unwrap_or_default(),
            theirs,
        ));
    }
    if let Some(theirs) = &spec.container_security_context {
        for container in containers(&mut pod) {
            container.security_context = Some(overlay(
                container.security_context.take().unwrap_or_default(),
                theirs,
            ));
        }
    }
    pod
}

/// Every container of `pod`, its init containers (the native sidecars) included.
fn containers(pod: &mut PodSpec) -> impl Iterator<Item = &mut Container> {
    let init = pod.init_containers.iter_mut().flatten();
    pod.containers.iter_mut().chain(init)
}

/// `ours` with every field `theirs` sets replaced by `theirs`' (whole fields: a
/// `capabilities` set replaces both its lists).
fn overlay<T: serde::Serialize + serde::de::DeserializeOwned>(ours: T, theirs: &T) -> T {
    let (Ok(serde_json::Value::Object(mut merged)), Ok(serde_json::Value::Object(set))) =
        (serde_json::to_value(&ours), serde_json::to_value(theirs))
    else {
        return ours;
    };
    merged.extend(set.into_iter().filter(|(_, v)| !v.is_null()));
    serde_json::from_value(serde_json::Value::Object(merged)).unwrap_or(ours)
}

/// The TLS reload agent: a native sidecar (an init container that keeps running, started
/// before memcached and stopped after it) from its own image. It watches the
/// mounted certificate and sends `refresh_certs` to memcached's loopback listener.
fn tls_agent_container(settings: &BuildSettings) -> Container {
    Container {
        name: TLS_AGENT_NAME.to_string(),
        image: Some(settings.tls_agent_image.clone()),
        command: Some(vec![
            TLS_AGENT_BINARY.to_string(),
            format!("--cert-dir={TLS_DIR}"),
            format!("--admin-address=127.0.0.1:{TLS_ADMIN_PORT}"),
            format!("--state-dir={TLS_AGENT_STATE_DIR}"),
        ]),
        restart_policy: Some("Always".to_string()),
        // The kubelet shows this file's contents as the reason of a failed reload.
        termination_message_path: Some("/dev/termination-log".to_string()),
        termination_message_policy: Some("File".to_string()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("5m".to_string())),
                ("memory".to_string(), Quantity("16Mi".to_string())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("32Mi".to_string()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted(MEMCACHED_UID)),
        volume_mounts: Some(vec![
            mount("tls", TLS_DIR),
            VolumeMount {
                name: TLS_AGENT_STATE_VOLUME.to_string(),
                mount_path: TLS_AGENT_STATE_DIR.to_string(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

const MIB: u64 = 1024 * 1024;

/// `sizeLimit` of extstore's `emptyDir` for a `spec.extstore.size` of `size_bytes`: twice
/// the size, and 1 MiB. memcached writes at most `size` (whole pages), but the kubelet
/// evicts the pod once the volume's blocks (every entry's `st_blocks`, the directory
/// included) exceed the limit, and a full file takes more blocks than its bytes. Measured
/// with memcached 1.6.38 filled until it recycled pages (Linux 6.18, files of 16 MiB to
/// 1.5 GiB, pages of 2 to 64 MiB): ext4 and overlay on ext4 add a 4 KiB directory block and
/// up to one 4 KiB extent block (a limit of exactly `size` is crossed, and the pod
/// evicted), tmpfs adds nothing, and XFS keeps its speculative preallocation past the end
/// of a growing file for about five minutes after the file stops growing: the file then
/// holds the next power of two above its size, less 64 KiB (2 × size − 64 KiB at a power of
/// two). Twice the size covers that, and the MiB the directory and extent-tree blocks
/// beside it. The limit is a ceiling, not a reservation: the node gives what memcached
/// writes (and, on XFS, the preallocation while it lasts).
pub fn extstore_empty_dir_limit_bytes(size_bytes: u64) -> u64 {
    size_bytes.saturating_mul(2).saturating_add(MIB)
}

/// Storage to claim for a generic ephemeral extstore volume of `spec.extstore.size`
/// `size_bytes`: the size, an eighth of it, and 64 MiB. The claim is the filesystem's size,
/// and memcached (UID 11211, not root) can write only what the filesystem leaves free for
/// others: measured on filesystems made as CSI drivers make them (`mkfs.ext4 -F -m0`,
/// `mkfs.xfs -f`) and with ext4's default 5% reserved for root, the space lost is 16% of a
/// 64 MiB ext4 (21% with the reserve), 6.5% of 1 GiB (11.5%, XFS 10%), 3.9% of 4 GiB (8.9%,
/// XFS 3%), under 2.7% from 16 GiB (under 7.5%, XFS 1.3%). An eighth and 64 MiB cover
/// each of them, the reserve included; without it memcached's writes past the free space
/// fail and the items in them are lost.
pub fn extstore_claim_bytes(size_bytes: u64) -> u64 {
    size_bytes
        .saturating_add(size_bytes.div_ceil(8))
        .saturating_add(64 * MIB)
}

/// A quantity of `bytes` rounded up to whole MiB.
fn mib_quantity(bytes: u64) -> Quantity {
    Quantity(format!("{}Mi", bytes.div_ceil(MIB)))
}

/// extstore's volume: an `emptyDir` limited to [`extstore_empty_dir_limit_bytes`], or,
/// with a StorageClass, a generic ephemeral volume of that class (created and deleted with
/// the pod) claiming [`extstore_claim_bytes`]. Only the volume has this headroom: memcached's
/// `ext_path` and the pod's `ephemeral-storage` request stay `size`, so pools whose spec
/// did not change keep their memcached container. A size that does not parse (refused by
/// the validation before anything is built) is passed through as it is.
fn extstore_volume(ext: &ExtstoreSpec) -> Volume {
    let size = memcached_api::validation::parse_quantity_bytes(&ext.size);
    let volume_size = |headroom: fn(u64) -> u64| {
        size.map_or_else(|| Quantity(ext.size.clone()), |b| mib_quantity(headroom(b)))
    };
    match &ext.storage_class_name {
        None => Volume {
            name: EXTSTORE_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(volume_size(extstore_empty_dir_limit_bytes)),
            }),
            ..Volume::default()
        },
        Some(class) => Volume {
            name: EXTSTORE_VOLUME.to_string(),
            ephemeral: Some(EphemeralVolumeSource {
                volume_claim_template: Some(PersistentVolumeClaimTemplate {
                    metadata: None,
                    spec: PersistentVolumeClaimSpec {
                        access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                        storage_class_name: Some(class.clone()),
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(BTreeMap::from([(
                                "storage".to_string(),
                                volume_size(extstore_claim_bytes),
                            )])),
                            limits: None,
                        }),
                        ..PersistentVolumeClaimSpec::default()
                    },
                }),
            }),
            ..Volume::default()
        },
    }
}

/// The Secret `secret` as volume `name`, with only `keys` in it: a Secret named here may
/// hold more than memcached needs (an Ingress's certificate Secret, say), and what the pod
/// does not mount it cannot leak.
fn secret_volume(name: &str, secret: &str, keys: &[&str]) -> Volume {
    Volume {
        name: name.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            default_mode: Some(0o440),
            items: Some(key_paths(keys)),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The `tls` volume: the certificate and key of `spec.tls.secretName`, and with client
/// authentication the CA's `ca.crt` beside them (from that Secret, or from
/// `clientAuth.caSecretName` through a projected volume), so the reload agent watches one
/// directory and memcached reloads all three with one `refresh_certs`.
fn tls_volume(tls: &TlsSpec) -> Volume {
    let Some(client_auth) = &tls.client_auth else {
        return secret_volume("tls", &tls.secret_name, &TLS_KEYS);
    };
    match client_auth.ca_secret_name.as_deref() {
        None => secret_volume("tls", &tls.secret_name, &TLS_KEYS_WITH_CA),
        Some(ca) if ca == tls.secret_name => {
            secret_volume("tls", &tls.secret_name, &TLS_KEYS_WITH_CA)
        }
        Some(ca) => {
            let source = |name: &str, keys: &[&str]| VolumeProjection {
                secret: Some(SecretProjection {
                    name: name.to_string(),
                    items: Some(key_paths(keys)),
                    optional: None,
                }),
                ..VolumeProjection::default()
            };
            Volume {
                name: "tls".to_string(),
                projected: Some(ProjectedVolumeSource {
                    default_mode: Some(0o440),
                    sources: Some(vec![
                        source(&tls.secret_name, &TLS_KEYS),
                        source(ca, &[CA_KEY]),
                    ]),
                }),
                ..Volume::default()
            }
        }
    }
}

/// A Secret's `keys`, each at its own name.
fn key_paths(keys: &[&str]) -> Vec<KeyToPath> {
    keys.iter()
        .map(|key| KeyToPath {
            key: key.to_string(),
            path: key.to_string(),
            mode: None,
        })
        .collect()
}

/// The `sasl` volume: the Secret's password database and, beside it, memcached's SASL
/// configuration ([`SASL_CONF`], the pod's [`SASL_CONF_ANNOTATION`] through the downward
/// API), in the directory `SASL_CONF_PATH` names.
fn sasl_volume(secret: &str) -> Volume {
    Volume {
        name: "sasl".to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o440),
            sources: Some(vec![
                VolumeProjection {
                    secret: Some(SecretProjection {
                        name: secret.to_string(),
                        items: Some(key_paths(&[SASL_PWDB_KEY])),
                        optional: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: SASL_CONF_FILE.to_string(),
                            field_ref: Some(ObjectFieldSelector {
                                // As the API server defaults it.
                                api_version: Some("v1".to_string()),
                                field_path: format!(
                                    "metadata.annotations['{SASL_CONF_ANNOTATION}']"
                                ),
                            }),
                            mode: None,
                            resource_field_ref: None,
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

pub(crate) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// Replace one pod at a time and never drop below the wanted ready pods: a restarted
/// memcached starts with an empty cache, so a rollout must be gentle (a proxy pod's
/// clients reconnect, which is gentler too).
pub(crate) fn one_pod_at_a_time() -> DeploymentStrategy {
    DeploymentStrategy {
        type_: Some("RollingUpdate".to_string()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }),
    }
}
