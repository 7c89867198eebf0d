//! Desired state: pure functions from a Memcached (and the operator's settings) to the
//! objects it should own: the Deployment, the client Service, the headless Service, the
//! PodDisruptionBudget and (with the exporter) the ServiceMonitor. No client, no clock, no
//! randomness, so they are unit-tested in microseconds and the reconciler only applies
//! what they return.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EphemeralVolumeSource,
    PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction, TopologySpreadConstraint,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use memcached_api::validation::EXTSTORE_WRITE_BUFFERS;
use memcached_api::{
    EXPORTER_PORT, ExtstoreSpec, Memcached, MemcachedConfig, MemcachedSpec, TLS_ADMIN_PORT,
    TopologySpread,
};

/// Field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "memcached-operator";
/// Value of `app.kubernetes.io/managed-by` on everything the operator creates.
pub const MANAGED_BY: &str = "memcached-operator";
/// Name of the memcached container and of its port (as in the seed).
pub const CONTAINER_NAME: &str = "memcached";
/// Name of the exporter sidecar and of its port.
pub const EXPORTER_NAME: &str = "exporter";
/// Name of the metrics port (exporter) on the pods and the Service.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Annotation holding a hash of the last applied desired object, so a converged object
/// is recognised without a write (see [`crate::drift`]).
pub const APPLIED_HASH_ANNOTATION: &str = "memcached.cache.example.com/applied-hash";
/// Pod template annotation: a hash of the memcached configuration, including the versions
/// of the Secrets it mounts, so a rotated SASL or TLS Secret rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "memcached.cache.example.com/config-hash";
/// UID the memcached images run as (the `memcache` user of the official image).
pub const MEMCACHED_UID: i64 = 11211;
/// UID of the exporter image (`nobody`).
pub const EXPORTER_UID: i64 = 65534;
/// Suffix of the headless Service's name.
pub use memcached_api::validation::HEADLESS_SUFFIX;
/// Key of the SASL password database in its Secret.
pub const SASL_PWDB_KEY: &str = "sasl-pwdb";
const SASL_DIR: &str = "/etc/memcached/sasl";
/// Where the TLS Secret is mounted in the memcached container and the reload agent.
pub use memcached_tls_agent::CERT_DIR as TLS_DIR;
/// Where the extstore volume is mounted, and the file memcached writes in it.
pub const EXTSTORE_DIR: &str = "/var/lib/memcached/extstore";
pub const EXTSTORE_FILE: &str = "/var/lib/memcached/extstore/data";
/// Name of the extstore volume.
pub const EXTSTORE_VOLUME: &str = "extstore";
/// Name of the TLS reload agent's container (a native sidecar).
pub const TLS_AGENT_NAME: &str = "tls-reload-agent";
// The reload agent's contract (crates/tls-agent): its exit codes, which the reconciler
// reads from the container's last termination, and its state directory. The old names
// stay, as the rest of the operator knows them.
pub use memcached_tls_agent::{
    EXIT_CERTIFICATE_INVALID as TLS_AGENT_CERTIFICATE_INVALID,
    EXIT_RELOAD_FAILED as TLS_AGENT_RELOAD_FAILED, STATE_DIR as TLS_AGENT_STATE_DIR,
};
const TLS_AGENT_STATE_VOLUME: &str = "tls-reload-agent";
/// The reload agent's subcommand of the operator binary.
pub const TLS_AGENT_COMMAND: &str = "tls-reload-agent";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";

/// What the builders need besides the Memcached itself.
#[derive(Clone, Debug)]
pub struct BuildSettings {
    /// Image used when the CR does not name one (`--memcached-image`).
    pub default_image: String,
    /// Exporter image used when the CR does not name one.
    pub default_exporter_image: String,
    /// Image of the TLS reload agent: the operator's own (`--tls-agent-image`), whose
    /// binary is at [`TLS_AGENT_BINARY`].
    pub tls_agent_image: String,
}

/// The operator binary in its image (the Dockerfile's `COPY`).
pub const TLS_AGENT_BINARY: &str = "/memcached-operator";
/// The reload agent's image when the operator is not told its own (`make run` outside the
/// cluster): the Makefile's default `IMG`.
pub const DEFAULT_TLS_AGENT_IMAGE: &str = "controller:latest";

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            default_image: memcached_api::DEFAULT_IMAGE.to_string(),
            default_exporter_image: memcached_api::DEFAULT_EXPORTER_IMAGE.to_string(),
            tls_agent_image: DEFAULT_TLS_AGENT_IMAGE.to_string(),
        }
    }
}

/// Digests of the contents of the Secrets the pods mount, as read by the reconciler; part
/// of the config hash, so that a rotated Secret rolls the pods and an edit of a Secret's
/// metadata alone does not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SecretVersions {
    /// [`secret_digest`] of the SASL Secret's password database.
    pub sasl: Option<String>,
    /// [`secret_digest`] of the TLS Secret's certificate and key.
    pub tls: Option<String>,
}

/// Why a desired object cannot be built. Only objects that never came from the API server
/// (no name, no uid) hit these; the reconciler reports them rather than panicking.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("the Memcached has no metadata.{0}")]
    MissingMetadata(&'static str),
}

/// Labels that select the pods of one Memcached. They never change across operator
/// versions, because a Deployment's selector is immutable.
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "memcached".to_string()),
        (LABEL_INSTANCE.to_string(), name.to_string()),
    ])
}

/// The recommended labels put on every object the operator creates for Memcached `name`.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(name);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "cache".to_string());
    labels
}

/// The selector as a string, as the scale subresource reports it for HPA.
pub fn selector_string(name: &str) -> String {
    selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A controller owner reference to `mc` that blocks its deletion until the child is gone
/// under foreground deletion.
pub fn owner_reference(mc: &Memcached) -> Result<OwnerReference, BuildError> {
    Ok(OwnerReference {
        api_version: Memcached::api_version(&()).into_owned(),
        kind: Memcached::kind(&()).into_owned(),
        name: mc
            .metadata
            .name
            .clone()
            .ok_or(BuildError::MissingMetadata("name"))?,
        uid: mc
            .metadata
            .uid
            .clone()
            .ok_or(BuildError::MissingMetadata("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

pub(crate) fn child_metadata(mc: &Memcached, child_name: &str) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(child_name.to_string()),
        namespace: mc.metadata.namespace.clone(),
        labels: Some(labels(name_of(mc)?)),
        owner_references: Some(vec![owner_reference(mc)?]),
        ..ObjectMeta::default()
    })
}

pub(crate) fn name_of(mc: &Memcached) -> Result<&str, BuildError> {
    mc.metadata
        .name
        .as_deref()
        .ok_or(BuildError::MissingMetadata("name"))
}

/// The headless Service's name.
pub fn headless_name(name: &str) -> String {
    format!("{name}{HEADLESS_SUFFIX}")
}

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

/// Memory for a cache of `memory_mib`: the cache plus 25% and 32 MiB for connection
/// buffers, the hash table and the process itself. Used as both request and limit, so the
/// pod is neither evicted for using what it asked for nor OOM-killed for filling its cache.
pub fn container_memory_mib(memory_mib: i32) -> i64 {
    let m = i64::from(memory_mib.max(0));
    m + (m + 3) / 4 + 32
}

/// Memory of the memcached container of `spec`: [`container_memory_mib`] of the cache, plus
/// extstore's write buffers when it is on (memcached allocates them at start).
pub fn pool_memory_mib(spec: &MemcachedSpec) -> i64 {
    let cache = container_memory_mib(spec.config().memory_mib);
    match spec.extstore_enabled() {
        Some(ext) => cache + EXTSTORE_WRITE_BUFFERS * i64::from(ext.write_buffer_mib.max(0)),
        None => cache,
    }
}

fn default_resources(spec: &MemcachedSpec) -> ResourceRequirements {
    let memory = Quantity(format!("{}Mi", pool_memory_mib(spec)));
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

/// Topology spread of the pods selected by `selector` under `policy`.
pub(crate) fn spread_constraints(
    selector: &BTreeMap<String, String>,
    policy: TopologySpread,
) -> Option<Vec<TopologySpreadConstraint>> {
    // (across nodes, across zones)
    let (nodes, zones) = match policy {
        TopologySpread::Disabled => return None,
        TopologySpread::Preferred => ("ScheduleAnyway", "ScheduleAnyway"),
        // The scheduler never places a pod under a `DoNotSchedule` rule on a node that lacks
        // the rule's key: a strict zone rule would leave every pod Pending on a cluster
        // whose nodes carry no zone label.
        TopologySpread::Required => ("DoNotSchedule", "ScheduleAnyway"),
    };
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
    Some(vec![
        constraint("kubernetes.io/hostname", nodes),
        constraint("topology.kubernetes.io/zone", zones),
    ])
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

    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut env = Vec::new();
    if let Some(sasl) = &spec.sasl {
        volumes.push(secret_volume("sasl", &sasl.secret_name));
        mounts.push(mount("sasl", SASL_DIR));
        env.push(EnvVar {
            name: "MEMCACHED_SASL_PWDB".to_string(),
            value: Some(format!("{SASL_DIR}/{SASL_PWDB_KEY}")),
            value_from: None,
        });
    }
    if let Some(tls) = &spec.tls {
        volumes.push(secret_volume("tls", &tls.secret_name));
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
            // Replace one pod at a time and never drop below `size` ready pods: a restarted
            // memcached starts with an empty cache, so a rollout must be gentle.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
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
                    affinity: spec.affinity.clone(),
                    priority_class_name: spec.priority_class_name.clone(),
                    topology_spread_constraints: spread_constraints(
                        &selector_labels(name),
                        spec.topology_spread.unwrap_or_default(),
                    ),
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The TLS reload agent: a native sidecar (an init container that keeps running, started
/// before memcached and stopped after it) from the operator's own image. It watches the
/// mounted certificate and sends `refresh_certs` to memcached's loopback listener.
fn tls_agent_container(settings: &BuildSettings) -> Container {
    Container {
        name: TLS_AGENT_NAME.to_string(),
        image: Some(settings.tls_agent_image.clone()),
        command: Some(vec![
            TLS_AGENT_BINARY.to_string(),
            TLS_AGENT_COMMAND.to_string(),
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

/// extstore's volume: an `emptyDir` limited to the file's size, or, with a StorageClass, a
/// generic ephemeral volume of that class (created and deleted with the pod).
fn extstore_volume(ext: &ExtstoreSpec) -> Volume {
    let size = Quantity(ext.size.clone());
    match &ext.storage_class_name {
        None => Volume {
            name: EXTSTORE_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(size),
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
                            requests: Some(BTreeMap::from([("storage".to_string(), size)])),
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

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
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

fn service_ports(mc: &Memcached) -> Vec<ServicePort> {
    let mut ports = vec![ServicePort {
        name: Some(CONTAINER_NAME.to_string()),
        port: mc.spec.container_port,
        target_port: Some(IntOrString::String(CONTAINER_NAME.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }];
    if mc.spec.exporter_enabled() {
        ports.push(ServicePort {
            name: Some(METRICS_PORT_NAME.to_string()),
            port: EXPORTER_PORT,
            target_port: Some(IntOrString::String(METRICS_PORT_NAME.to_string())),
            protocol: Some("TCP".to_string()),
            ..ServicePort::default()
        });
    }
    ports
}

/// The ClusterIP Service in front of the memcached pods, on `spec.containerPort` (and the
/// exporter's metrics port when it runs).
pub fn desired_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    Ok(Service {
        metadata: child_metadata(mc, name)?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector_labels(name)),
            ports: Some(service_ports(mc)),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// The headless Service `<name>-headless`: DNS returns every ready pod's address, for
/// clients that hash keys over the pods themselves.
pub fn desired_headless_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    let mut ports = service_ports(mc);
    ports.truncate(1);
    Ok(Service {
        metadata: child_metadata(mc, &headless_name(name))?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            cluster_ip: Some("None".to_string()),
            selector: Some(selector_labels(name)),
            ports: Some(ports),
            publish_not_ready_addresses: Some(false),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// A PodDisruptionBudget allowing one voluntary disruption at a time when there are at
/// least two pods; `None` below that (a budget on one pod would block node drains).
pub fn desired_pdb(mc: &Memcached) -> Result<Option<PodDisruptionBudget>, BuildError> {
    let name = name_of(mc)?;
    if mc.spec.size < 2 {
        return Ok(None);
    }
    Ok(Some(PodDisruptionBudget {
        metadata: child_metadata(mc, name)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}

/// A Prometheus Operator ServiceMonitor (`monitoring.coreos.com/v1`), typed as far as the
/// operator needs it: its metadata, and its spec as JSON (the operator writes two fields of
/// it and reads none).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServiceMonitor {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

impl Resource for ServiceMonitor {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ServiceMonitor".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "monitoring.coreos.com".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "servicemonitors".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The Prometheus Operator ServiceMonitor scraping the exporter through the client Service,
/// when the exporter runs.
pub fn desired_service_monitor(mc: &Memcached) -> Result<Option<ServiceMonitor>, BuildError> {
    let name = name_of(mc)?;
    if !mc.spec.exporter_enabled() {
        return Ok(None);
    }
    Ok(Some(ServiceMonitor {
        api_version: ServiceMonitor::api_version(&()).into_owned(),
        kind: ServiceMonitor::kind(&()).into_owned(),
        metadata: child_metadata(mc, name)?,
        spec: serde_json::json!({
            "selector": {"matchLabels": labels(name)},
            "endpoints": [{"port": METRICS_PORT_NAME, "interval": "30s"}],
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcached_api::MemcachedSpec;

    fn sample(size: i32) -> Memcached {
        let mut mc = Memcached::new("memcached-sample", MemcachedSpec::with_size(size));
        mc.metadata.namespace = Some("default".into());
        mc.metadata.uid = Some("uid-1".into());
        mc
    }

    fn container(d: &Deployment) -> &Container {
        &d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod spec")
            .containers[0]
    }

    #[test]
    fn seed_sample_makes_the_seed_deployment() {
        let d = desired_deployment(&sample(3), &BuildSettings::default()).expect("builds");
        assert_eq!(d.metadata.name.as_deref(), Some("memcached-sample"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let c = container(&d);
        assert_eq!(c.name, "memcached");
        assert_eq!(c.image.as_deref(), Some(memcached_api::DEFAULT_IMAGE));
        assert_eq!(
            c.command.as_deref(),
            Some(
                &[
                    "memcached",
                    "-m",
                    "64",
                    "-c",
                    "1024",
                    "-t",
                    "4",
                    "-I",
                    "1m",
                    "-p",
                    "11211",
                    "-o",
                    "modern",
                    "-v"
                ]
                .map(String::from)[..]
            )
        );
        let port = &c.ports.as_ref().expect("ports")[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("memcached"), 11211)
        );
    }

    #[test]
    fn owner_reference_is_a_blocking_controller_reference() {
        let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
        let owners = d.metadata.owner_references.expect("owner refs");
        assert_eq!(owners.len(), 1);
        let o = &owners[0];
        assert_eq!(o.api_version, "memcached.cache.example.com/v1");
        assert_eq!(o.kind, "Memcached");
        assert_eq!(o.uid, "uid-1");
        assert_eq!(
            (o.controller, o.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn pods_run_restricted() {
        let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
        let pod = d
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod");
        let psc = pod.security_context.as_ref().expect("pod security context");
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let sc = container(&d)
            .security_context
            .as_ref()
            .expect("container security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert!(sc.run_as_user.is_some_and(|uid| uid != 0));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        let c = container(&d);
        assert!(c.readiness_probe.is_some() && c.liveness_probe.is_some());
        assert!(
            c.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some()
        );
    }

    #[test]
    fn selector_is_stable_and_a_subset_of_pod_labels() {
        let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
        let spec = d.spec.as_ref().expect("spec");
        let selector = spec.selector.match_labels.clone().expect("match labels");
        assert_eq!(
            selector,
            BTreeMap::from([
                (
                    "app.kubernetes.io/instance".to_string(),
                    "memcached-sample".to_string()
                ),
                (
                    "app.kubernetes.io/name".to_string(),
                    "memcached".to_string()
                ),
            ])
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .expect("labels");
        assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        assert_eq!(
            pod_labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(
            selector_string("memcached-sample"),
            "app.kubernetes.io/instance=memcached-sample,app.kubernetes.io/name=memcached"
        );
    }

    #[test]
    fn image_and_port_follow_the_spec_and_settings() {
        let settings = BuildSettings {
            default_image: "registry.local/memcached:1.6".into(),
            ..BuildSettings::default()
        };
        let mut mc = sample(2);
        let d = desired_deployment(&mc, &settings).expect("builds");
        assert_eq!(
            container(&d).image.as_deref(),
            Some("registry.local/memcached:1.6")
        );
        mc.spec.image = Some("memcached:1.6.38".into());
        mc.spec.container_port = 11311;
        let d = desired_deployment(&mc, &settings).expect("builds");
        assert_eq!(container(&d).image.as_deref(), Some("memcached:1.6.38"));
        assert!(
            container(&d)
                .command
                .as_ref()
                .expect("command")
                .windows(2)
                .any(|w| w == ["-p", "11311"])
        );
        let s = desired_service(&mc).expect("builds");
        let port = &s
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .expect("ports")[0];
        assert_eq!(port.port, 11311);
        assert_eq!(
            port.target_port,
            Some(IntOrString::String("memcached".into()))
        );
    }

    #[test]
    fn service_selects_the_pods_on_port_11211() {
        let s = desired_service(&sample(3)).expect("builds");
        let spec = s.spec.expect("spec");
        assert_eq!(spec.selector, Some(selector_labels("memcached-sample")));
        assert_eq!(spec.ports.expect("ports")[0].port, 11211);
        assert_eq!(s.metadata.owner_references.map(|o| o.len()), Some(1));
    }

    #[test]
    fn an_object_without_uid_is_an_error_not_a_panic() {
        let mut mc = sample(1);
        mc.metadata.uid = None;
        assert_eq!(
            desired_service(&mc).err(),
            Some(BuildError::MissingMetadata("uid"))
        );
    }

    fn with_spec(edit: impl FnOnce(&mut memcached_api::MemcachedSpec)) -> Memcached {
        let mut mc = sample(3);
        edit(&mut mc.spec);
        mc
    }

    fn pod_spec(d: &Deployment) -> &PodSpec {
        d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod spec")
    }

    fn deployment(mc: &Memcached) -> Deployment {
        desired_deployment(mc, &BuildSettings::default()).expect("builds")
    }

    fn config(edit: impl FnOnce(&mut MemcachedConfig)) -> Option<MemcachedConfig> {
        let mut c = MemcachedConfig::default();
        edit(&mut c);
        Some(c)
    }

    fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
        args.windows(2).any(|w| w[0] == flag && w[1] == value)
    }

    #[test]
    fn every_tuning_field_becomes_its_flag() {
        // (what changed, the config, the flag, its value)
        let cases: Vec<(&str, Option<MemcachedConfig>, &str, &str)> = vec![
            ("defaults", None, "-m", "64"),
            ("defaults", None, "-c", "1024"),
            ("defaults", None, "-t", "4"),
            ("defaults", None, "-I", "1m"),
            ("memory", config(|c| c.memory_mib = 2048), "-m", "2048"),
            (
                "connections",
                config(|c| c.max_connections = 4096),
                "-c",
                "4096",
            ),
            ("threads", config(|c| c.threads = 8), "-t", "8"),
            (
                "item size",
                config(|c| c.max_item_size = "4m".into()),
                "-I",
                "4m",
            ),
        ];
        for (what, cfg, flag, value) in cases {
            let mc = with_spec(|s| s.config = cfg);
            let args = container(&deployment(&mc))
                .command
                .clone()
                .expect("command");
            assert!(
                has_pair(&args, flag, value),
                "{what}: {flag} {value} in {args:?}"
            );
            assert_eq!(args[0], "memcached");
        }
    }

    #[test]
    fn verbosity_and_extra_args() {
        for (level, flag) in [
            (0, None),
            (1, Some("-v")),
            (2, Some("-vv")),
            (3, Some("-vvv")),
        ] {
            let args = memcached_args(
                &config(|c| c.verbosity = level).expect("config"),
                11211,
                false,
                false,
            );
            let verbose: Vec<&String> = args.iter().filter(|a| a.starts_with("-v")).collect();
            assert_eq!(
                verbose.first().map(|s| s.as_str()),
                flag,
                "verbosity {level}"
            );
            assert!(verbose.len() <= 1);
        }
        let args = memcached_args(
            &config(|c| c.extra_args = vec!["-o".into(), "lru_crawler".into()]).expect("config"),
            11211,
            false,
            false,
        );
        assert_eq!(
            &args[args.len() - 2..],
            ["-o", "lru_crawler"],
            "extra args come last"
        );
    }

    #[test]
    fn container_memory_follows_the_cache_size_unless_resources_are_given() {
        for (cache, want) in [(64, "112Mi"), (1024, "1312Mi"), (8, "42Mi")] {
            let mc = with_spec(|s| s.config = config(|c| c.memory_mib = cache));
            let r = container(&deployment(&mc))
                .resources
                .clone()
                .expect("resources");
            let req = r.requests.expect("requests");
            let lim = r.limits.expect("limits");
            assert_eq!(
                req.get("memory").map(|q| q.0.as_str()),
                Some(want),
                "cache {cache}"
            );
            assert_eq!(lim.get("memory"), req.get("memory"), "request = limit");
            assert!(
                !lim.contains_key("cpu"),
                "no CPU limit (throttling hurts latency)"
            );
        }
        let custom = ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("1Gi".into()),
            )])),
            ..ResourceRequirements::default()
        };
        let mc = with_spec(|s| s.resources = Some(custom.clone()));
        assert_eq!(container(&deployment(&mc)).resources, Some(custom));
    }

    #[test]
    fn scheduling_fields_pass_through() {
        use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, Toleration};
        let tolerations = vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("cache".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }];
        let affinity = Affinity {
            node_affinity: Some(NodeAffinity::default()),
            ..Affinity::default()
        };
        let mc = with_spec(|s| {
            s.node_selector = Some(BTreeMap::from([("pool".into(), "cache".into())]));
            s.tolerations = Some(tolerations.clone());
            s.affinity = Some(affinity.clone());
            s.priority_class_name = Some("high".into());
            s.pod_annotations = Some(BTreeMap::from([("team".into(), "infra".into())]));
            s.pod_labels = Some(BTreeMap::from([
                ("tier".into(), "gold".into()),
                (LABEL_INSTANCE.into(), "hijack".into()),
            ]));
        });
        let d = deployment(&mc);
        let pod = pod_spec(&d);
        assert_eq!(
            pod.node_selector
                .as_ref()
                .and_then(|n| n.get("pool"))
                .map(String::as_str),
            Some("cache")
        );
        assert_eq!(pod.tolerations.as_ref(), Some(&tolerations));
        assert_eq!(pod.affinity.as_ref(), Some(&affinity));
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
        let meta = d
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.clone())
            .expect("template meta");
        let labels = meta.labels.expect("labels");
        assert_eq!(labels.get("tier").map(String::as_str), Some("gold"));
        assert_eq!(
            labels.get(LABEL_INSTANCE).map(String::as_str),
            Some("memcached-sample"),
            "the operator's selector labels win"
        );
        let annotations = meta.annotations.expect("annotations");
        assert_eq!(annotations.get("team").map(String::as_str), Some("infra"));
        assert!(annotations.contains_key(CONFIG_HASH_ANNOTATION));
    }

    #[test]
    fn topology_spread_by_policy() {
        // (policy, [hostname rule, zone rule])
        let cases = [
            (None, Some(["ScheduleAnyway", "ScheduleAnyway"])),
            (
                Some(TopologySpread::Preferred),
                Some(["ScheduleAnyway", "ScheduleAnyway"]),
            ),
            (
                Some(TopologySpread::Required),
                Some(["DoNotSchedule", "ScheduleAnyway"]),
            ),
            (Some(TopologySpread::Disabled), None),
        ];
        for (policy, when) in cases {
            let mc = with_spec(|s| s.topology_spread = policy);
            let d = deployment(&mc);
            let constraints = pod_spec(&d).topology_spread_constraints.clone();
            match when {
                None => assert!(constraints.is_none(), "{policy:?}"),
                Some(when) => {
                    let c = constraints.expect("constraints");
                    let keys: Vec<&str> = c.iter().map(|c| c.topology_key.as_str()).collect();
                    assert_eq!(
                        keys,
                        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
                    );
                    let rules: Vec<&str> =
                        c.iter().map(|c| c.when_unsatisfiable.as_str()).collect();
                    assert_eq!(rules, when, "{policy:?}");
                    assert!(c.iter().all(|c| c.max_skew == 1));
                    assert!(c.iter().all(|c| {
                        c.label_selector
                            .as_ref()
                            .and_then(|s| s.match_labels.clone())
                            == Some(selector_labels("memcached-sample"))
                    }));
                }
            }
        }
    }

    #[test]
    fn rolling_updates_never_drop_below_size_ready_pods() {
        let d = deployment(&sample(3));
        let strategy = d.spec.and_then(|s| s.strategy).expect("strategy");
        let rolling = strategy.rolling_update.expect("rolling update");
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    }

    #[test]
    fn pdb_only_from_two_pods() {
        for (size, want) in [(0, false), (1, false), (2, true), (5, true)] {
            let pdb = desired_pdb(&sample(size)).expect("builds");
            assert_eq!(pdb.is_some(), want, "size {size}");
            if let Some(pdb) = pdb {
                let spec = pdb.spec.expect("spec");
                assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
                assert_eq!(
                    spec.selector.and_then(|s| s.match_labels),
                    Some(selector_labels("memcached-sample"))
                );
            }
        }
    }

    #[test]
    fn headless_service_exposes_pod_addresses() {
        let s = desired_headless_service(&with_spec(|s| {
            s.exporter = Some(memcached_api::ExporterSpec {
                enabled: true,
                image: None,
            })
        }))
        .expect("builds");
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("memcached-sample-headless")
        );
        assert_eq!(
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_INSTANCE))
                .map(String::as_str),
            Some("memcached-sample"),
            "labelled for the Memcached, not for its own name"
        );
        let spec = s.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        let ports: Vec<i32> = spec.ports.expect("ports").iter().map(|p| p.port).collect();
        assert_eq!(
            ports,
            [11211],
            "memcached only; metrics are scraped via the client Service"
        );
    }

    #[test]
    fn exporter_sidecar_port_and_monitor_only_when_enabled() {
        let off = sample(2);
        assert_eq!(pod_spec(&deployment(&off)).containers.len(), 1);
        assert_eq!(
            desired_service(&off)
                .expect("svc")
                .spec
                .and_then(|s| s.ports)
                .map(|p| p.len()),
            Some(1)
        );
        assert!(desired_service_monitor(&off).expect("builds").is_none());

        let on = with_spec(|s| {
            s.exporter = Some(memcached_api::ExporterSpec {
                enabled: true,
                image: Some("registry.local/exporter:v1".into()),
            })
        });
        let d = deployment(&on);
        let exporter = &pod_spec(&d).containers[1];
        assert_eq!(exporter.name, EXPORTER_NAME);
        assert_eq!(
            exporter.image.as_deref(),
            Some("registry.local/exporter:v1")
        );
        assert_eq!(
            exporter.ports.as_ref().expect("ports")[0].container_port,
            EXPORTER_PORT
        );
        assert!(
            exporter
                .args
                .as_ref()
                .expect("args")
                .contains(&"--memcached.address=localhost:11211".to_string())
        );
        assert_eq!(
            exporter
                .security_context
                .as_ref()
                .and_then(|s| s.read_only_root_filesystem),
            Some(true)
        );
        let ports = desired_service(&on)
            .expect("svc")
            .spec
            .and_then(|s| s.ports)
            .expect("ports");
        assert_eq!(ports[1].name.as_deref(), Some(METRICS_PORT_NAME));
        let monitor = desired_service_monitor(&on)
            .expect("builds")
            .expect("monitor");
        // Its JSON, and so its applied-hash annotation, is what earlier releases applied
        // as an untyped object: upgrading the operator rewrites no ServiceMonitor.
        let before = serde_json::json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": child_metadata(&on, "memcached-sample").expect("metadata"),
            "spec": {
                "selector": {"matchLabels": labels("memcached-sample")},
                "endpoints": [{"port": METRICS_PORT_NAME, "interval": "30s"}],
            },
        });
        assert_eq!(
            crate::drift::desired_hash(&monitor),
            crate::drift::desired_hash(&before)
        );
        let monitor = serde_json::to_value(&monitor).expect("json");
        assert_eq!(monitor["kind"], "ServiceMonitor");
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], METRICS_PORT_NAME);
        assert_eq!(monitor["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    }

    #[test]
    fn sasl_and_tls_mount_their_secrets_and_set_flags() {
        let mc = with_spec(|s| {
            s.sasl = Some(memcached_api::SaslSpec {
                secret_name: "auth".into(),
            });
            s.tls = Some(memcached_api::TlsSpec {
                secret_name: "certs".into(),
                rotation: None,
            });
        });
        let d = deployment(&mc);
        let c = container(&d);
        let args = c.command.clone().expect("command");
        assert!(args.contains(&"-S".to_string()));
        assert!(args.contains(&"-Z".to_string()));
        assert!(
            args.iter()
                .any(|a| a.starts_with("ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key="))
        );
        let env = c.env.clone().expect("env");
        assert_eq!(env[0].name, "MEMCACHED_SASL_PWDB");
        assert_eq!(
            env[0].value.as_deref(),
            Some("/etc/memcached/sasl/sasl-pwdb")
        );
        let volumes = pod_spec(&d).volumes.clone().expect("volumes");
        let secrets: Vec<Option<String>> = volumes
            .iter()
            .map(|v| v.secret.as_ref().and_then(|s| s.secret_name.clone()))
            .collect();
        assert_eq!(
            secrets,
            [Some("auth".to_string()), Some("certs".to_string())]
        );
        let mounts = c.volume_mounts.clone().expect("mounts");
        assert!(mounts.iter().all(|m| m.read_only == Some(true)));

        // Who can read the mounted files, by the kubelet's rules: Secret files are owned by
        // root, with the pod's fsGroup as their group when it is set, and `defaultMode`.
        let pod = pod_spec(&d);
        let sc = pod.security_context.clone().expect("pod security context");
        let uid = sc.run_as_user.expect("runs as a fixed user");
        assert_ne!(uid, 0);
        let process_groups: Vec<i64> = sc.run_as_group.into_iter().chain(sc.fs_group).collect();
        for v in &volumes {
            let mode = v
                .secret
                .as_ref()
                .and_then(|s| s.default_mode)
                .unwrap_or(0o644);
            let group_reads =
                sc.fs_group.is_some_and(|g| process_groups.contains(&g)) && mode & 0o040 != 0;
            let others_read = mode & 0o004 != 0;
            assert!(
                group_reads || others_read,
                "volume {} (mode {mode:o}) is unreadable by UID {uid} in groups {process_groups:?}",
                v.name
            );
            assert!(
                !others_read,
                "volume {}: secrets readable by every user",
                v.name
            );
        }
    }

    #[test]
    fn the_config_hash_changes_with_the_config_and_rotated_secrets_only() {
        let hash = |mc: &Memcached, secrets: &SecretVersions| {
            desired_deployment_with(mc, &BuildSettings::default(), secrets)
                .expect("builds")
                .spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
                .expect("hash")
        };
        let base = sample(3);
        let none = SecretVersions::default();
        assert_eq!(
            hash(&base, &none),
            hash(&sample(5), &none),
            "size does not roll pods"
        );
        let tuned = with_spec(|s| s.config = config(|c| c.threads = 8));
        assert_ne!(hash(&base, &none), hash(&tuned, &none));
        let v1 = SecretVersions {
            sasl: Some("1".into()),
            tls: None,
        };
        let v2 = SecretVersions {
            sasl: Some("2".into()),
            tls: None,
        };
        assert_ne!(
            hash(&base, &v1),
            hash(&base, &v2),
            "a rotated Secret rolls the pods"
        );
    }
    fn template_hash(mc: &Memcached, tls_digest: &str) -> String {
        let secrets = SecretVersions {
            sasl: mc.spec.sasl.as_ref().map(|_| "sasl-1".to_string()),
            tls: Some(tls_digest.to_string()),
        };
        let d = desired_deployment_with(mc, &BuildSettings::default(), &secrets).expect("builds");
        d.spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("config hash")
    }

    fn tls(rotation: Option<memcached_api::TlsRotation>) -> Option<memcached_api::TlsSpec> {
        Some(memcached_api::TlsSpec {
            secret_name: "certs".into(),
            rotation,
        })
    }

    #[test]
    fn tls_in_place_runs_the_reload_agent_and_a_renewal_changes_no_template() {
        use memcached_api::TlsRotation;
        let mc = with_spec(|s| s.tls = tls(None));
        assert_eq!(template_hash(&mc, "cert-1"), template_hash(&mc, "cert-2"));
        let d = deployment(&mc);
        let pod = pod_spec(&d);
        let agents = pod.init_containers.as_ref().expect("the agent");
        assert_eq!(agents.len(), 1);
        let agent = &agents[0];
        assert_eq!(agent.name, "tls-reload-agent");
        // A native sidecar: an init container that keeps running beside memcached.
        assert_eq!(agent.restart_policy.as_deref(), Some("Always"));
        assert_eq!(agent.image.as_deref(), Some("controller:latest"));
        let command = agent.command.clone().expect("command");
        assert_eq!(command[..2], ["/memcached-operator", "tls-reload-agent"]);
        assert!(command.contains(&"--admin-address=127.0.0.1:11299".to_string()));
        let mounts = agent.volume_mounts.clone().expect("mounts");
        assert_eq!(mounts[0].mount_path, "/etc/memcached/tls");
        // memcached: TLS on every address, plain text on loopback only for the agent.
        let args = container(&d).command.clone().expect("command");
        assert!(
            has_pair(&args, "-l", "*:11211,notls:127.0.0.1:11299"),
            "{args:?}"
        );

        // Restart, or SASL (binary protocol only: no refresh_certs), roll on a renewal.
        for mc in [
            with_spec(|s| s.tls = tls(Some(TlsRotation::Restart))),
            with_spec(|s| {
                s.tls = tls(None);
                s.sasl = Some(memcached_api::SaslSpec {
                    secret_name: "auth".into(),
                });
            }),
        ] {
            assert_ne!(template_hash(&mc, "cert-1"), template_hash(&mc, "cert-2"));
            let d = deployment(&mc);
            assert_eq!(pod_spec(&d).init_containers, None);
            let args = container(&d).command.clone().expect("command");
            assert!(!args.iter().any(|a| a == "-l"), "{args:?}");
        }
        // Without TLS there is no agent.
        assert_eq!(pod_spec(&deployment(&sample(3))).init_containers, None);
    }

    #[test]
    fn the_agent_image_follows_the_settings() {
        let settings = BuildSettings {
            tls_agent_image: "registry.local/memcached-operator:v1".into(),
            ..BuildSettings::default()
        };
        let mc = with_spec(|s| s.tls = tls(None));
        let d = desired_deployment(&mc, &settings).expect("builds");
        let agent = &pod_spec(&d).init_containers.as_ref().expect("agent")[0];
        assert_eq!(
            agent.image.as_deref(),
            Some("registry.local/memcached-operator:v1")
        );
    }

    #[test]
    fn rollouts_wait_30_seconds_per_pod_unless_told_otherwise() {
        let min_ready = |mc: &Memcached| deployment(mc).spec.and_then(|s| s.min_ready_seconds);
        assert_eq!(min_ready(&sample(3)), Some(30));
        let mc = with_spec(|s| {
            s.rollout = Some(memcached_api::RolloutSpec {
                min_ready_seconds: 120,
            })
        });
        assert_eq!(min_ready(&mc), Some(120));
    }

    #[test]
    fn extstore_adds_its_volume_flags_and_memory() {
        let mc = with_spec(|s| s.extstore = Some(memcached_api::ExtstoreSpec::default()));
        let d = deployment(&mc);
        let args = container(&d).command.clone().expect("command");
        assert!(
            has_pair(
                &args,
                "-o",
                "ext_page_size=64,ext_wbuf_size=4,ext_threads=1,ext_item_size=512,ext_path=/var/lib/memcached/extstore/data:1024m"
            ),
            "{args:?}"
        );
        let volume = pod_spec(&d)
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "extstore")
            .expect("extstore volume");
        assert_eq!(
            volume.empty_dir.as_ref().and_then(|e| e.size_limit.clone()),
            Some(Quantity("1Gi".into()))
        );
        let mount = container(&d)
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "extstore")
            .expect("mounted");
        assert_eq!(mount.mount_path, "/var/lib/memcached/extstore");
        assert_ne!(mount.read_only, Some(true));
        // 64 MiB of cache + 25 % + 32 MiB, and six 4 MiB write buffers: 136 MiB.
        let resources = container(&d).resources.clone().expect("resources");
        let requests = resources.requests.expect("requests");
        assert_eq!(requests.get("memory"), Some(&Quantity("136Mi".into())));
        assert_eq!(
            requests.get("ephemeral-storage"),
            Some(&Quantity("1Gi".into()))
        );
        assert_eq!(
            resources.limits.expect("limits").get("memory"),
            Some(&Quantity("136Mi".into()))
        );

        // With a StorageClass: a generic ephemeral volume of that class, off the node's disk.
        let mc = with_spec(|s| {
            s.extstore = Some(memcached_api::ExtstoreSpec {
                size: "20Gi".into(),
                storage_class_name: Some("fast-ssd".into()),
                page_size_mib: 32,
                write_buffer_mib: 8,
                threads: 4,
                item_size_bytes: 1024,
                item_age_seconds: Some(600),
                enabled: true,
            })
        });
        let d = deployment(&mc);
        let args = container(&d).command.clone().expect("command");
        assert!(
            has_pair(
                &args,
                "-o",
                "ext_page_size=32,ext_wbuf_size=8,ext_threads=4,ext_item_size=1024,ext_item_age=600,ext_path=/var/lib/memcached/extstore/data:20480m"
            ),
            "{args:?}"
        );
        let volume = pod_spec(&d)
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "extstore")
            .expect("extstore volume");
        let claim = volume
            .ephemeral
            .as_ref()
            .and_then(|e| e.volume_claim_template.as_ref())
            .expect("claim template");
        assert_eq!(claim.spec.storage_class_name.as_deref(), Some("fast-ssd"));
        assert_eq!(
            claim
                .spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage")),
            Some(&Quantity("20Gi".into()))
        );
        let requests = container(&d)
            .resources
            .clone()
            .and_then(|r| r.requests)
            .expect("requests");
        assert_eq!(requests.get("ephemeral-storage"), None);
        assert_eq!(requests.get("memory"), Some(&Quantity("160Mi".into())));

        // Off: nothing of it.
        let mc = with_spec(|s| {
            s.extstore = Some(memcached_api::ExtstoreSpec {
                enabled: false,
                ..memcached_api::ExtstoreSpec::default()
            })
        });
        let d = deployment(&mc);
        assert!(
            !container(&d)
                .command
                .iter()
                .flatten()
                .any(|a| a.contains("ext_"))
        );
        assert!(
            !pod_spec(&d)
                .volumes
                .iter()
                .flatten()
                .any(|v| v.name == "extstore")
        );
    }
}
