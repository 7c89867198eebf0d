//! Desired state: pure functions from a Memcached (and the operator's settings) to the
//! Deployment and Service it should own. No client, no clock, no randomness, so they are
//! unit-tested in microseconds and the reconciler only has to apply what they return.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use memcached_api::Memcached;

/// Field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "memcached-operator";
/// Value of `app.kubernetes.io/managed-by` on everything the operator creates.
pub const MANAGED_BY: &str = "memcached-operator";
/// Name of the memcached container and of its port (as in the seed).
pub const CONTAINER_NAME: &str = "memcached";
/// Annotation holding a hash of the last applied desired object, so a converged object
/// is recognised without a write (see [`crate::drift`]).
pub const APPLIED_HASH_ANNOTATION: &str = "memcached.cache.example.com/applied-hash";
/// UID the memcached images run as (the `memcache` user of the official image).
pub const MEMCACHED_UID: i64 = 11211;
/// Cache memory in MiB (`-m`), as in the seed.
pub const CACHE_MEMORY_MIB: i64 = 64;

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";

/// What the builders need besides the Memcached itself.
#[derive(Clone, Debug)]
pub struct BuildSettings {
    /// Image used when the CR does not name one (`--memcached-image`).
    pub default_image: String,
}

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            default_image: memcached_api::DEFAULT_IMAGE.to_string(),
        }
    }
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

/// The recommended labels put on every object the operator creates.
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

fn child_metadata(mc: &Memcached, name: &str) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(name.to_string()),
        namespace: mc.metadata.namespace.clone(),
        labels: Some(labels(name)),
        owner_references: Some(vec![owner_reference(mc)?]),
        ..ObjectMeta::default()
    })
}

fn name_of(mc: &Memcached) -> Result<&str, BuildError> {
    mc.metadata
        .name
        .as_deref()
        .ok_or(BuildError::MissingMetadata("name"))
}

/// The memcached command line. The seed ran `memcached -m=64 -o modern -v`; `-m 64` is the
/// same setting in the form memcached's option parser reads reliably, and `-p` follows
/// `spec.containerPort`.
pub fn memcached_args(port: i32) -> Vec<String> {
    vec![
        "memcached".into(),
        "-m".into(),
        CACHE_MEMORY_MIB.to_string(),
        "-p".into(),
        port.to_string(),
        "-o".into(),
        "modern".into(),
        "-v".into(),
    ]
}

fn tcp_probe(initial_delay: i32, period: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(CONTAINER_NAME.to_string()),
            host: None,
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        ..Probe::default()
    }
}

/// The Deployment that runs `mc.spec.size` memcached pods.
pub fn desired_deployment(
    mc: &Memcached,
    settings: &BuildSettings,
) -> Result<Deployment, BuildError> {
    let name = name_of(mc)?;
    let port = mc.spec.container_port;
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(mc.image_or(&settings.default_image).to_string()),
        command: Some(memcached_args(port)),
        ports: Some(vec![ContainerPort {
            name: Some(CONTAINER_NAME.to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(1, 5)),
        liveness_probe: Some(tcp_probe(10, 10)),
        resources: Some(ResourceRequirements {
            // 64 MiB of cache plus connection buffers and the hash table.
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".to_string())),
                ("memory".to_string(), Quantity("96Mi".to_string())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("128Mi".to_string()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(MEMCACHED_UID),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    Ok(Deployment {
        metadata: child_metadata(mc, name)?,
        spec: Some(DeploymentSpec {
            replicas: Some(mc.spec.size),
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
                    labels: Some(labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(MEMCACHED_UID),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_string(),
                            localhost_profile: None,
                        }),
                        ..PodSecurityContext::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The ClusterIP Service in front of the memcached pods, on `spec.containerPort`.
pub fn desired_service(mc: &Memcached) -> Result<Service, BuildError> {
    let name = name_of(mc)?;
    Ok(Service {
        metadata: child_metadata(mc, name)?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector_labels(name)),
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcached_api::MemcachedSpec;

    fn sample(size: i32) -> Memcached {
        let mut mc = Memcached::new(
            "memcached-sample",
            MemcachedSpec {
                size,
                container_port: 11211,
                image: None,
            },
        );
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
                &["memcached", "-m", "64", "-p", "11211", "-o", "modern", "-v"].map(String::from)[..]
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
}
