//! `config/manager`: the operator's Namespace and Deployment (`controller-manager`) with the
//! `run` flags, and the kustomize images of the operator and the TLS reload agent.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;

use super::{
    Doc, Error, File, HEALTH_PORT, IMAGE_PLACEHOLDER, Kustomization, METRICS_PORT,
    TLS_AGENT_IMAGE_PLACEHOLDER, object_labels, selector_labels, typed,
};
use memcached_operator::rbac::{BASE_NAMESPACE, SERVICE_ACCOUNT};

/// How long the kubelet lets the manager stop after SIGTERM before killing it: `run`'s
/// `--graceful-shutdown-timeout` (30 s, controller-runtime's) for reconciles in flight,
/// then up to 2 s for the servers, the Lease's release and the exit, with room to spare.
/// (Kubebuilder scaffolds 10 s, which cuts the 30 s short.)
pub const TERMINATION_GRACE_PERIOD_SECONDS: u64 =
    manager::shutdown::DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT.as_secs() + 10;

/// The flags the manager Deployment passes to `memcached-operator`.
pub fn manager_args() -> Vec<String> {
    vec![
        "run".into(),
        "--leader-elect".into(),
        format!("--metrics-bind-address=:{METRICS_PORT}"),
        format!("--health-probe-bind-address=:{HEALTH_PORT}"),
    ]
}

/// The operator's Deployment (`controller-manager`), as Kubebuilder scaffolds it.
pub fn manager_deployment() -> Result<Deployment, Error> {
    let probe = |path: &str, delay: i32, period: i32| {
        json!({
            "httpGet": {"path": path, "port": HEALTH_PORT},
            "initialDelaySeconds": delay,
            "periodSeconds": period,
        })
    };
    typed(
        "Deployment",
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "controller-manager",
                "namespace": BASE_NAMESPACE,
                "labels": object_labels(),
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector_labels()},
                "template": {
                    "metadata": {
                        "annotations": {"kubectl.kubernetes.io/default-container": "manager"},
                        "labels": selector_labels(),
                    },
                    "spec": {
                        "securityContext": {
                            "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [{
                            "name": "manager",
                            "image": IMAGE_PLACEHOLDER,
                            "command": ["/memcached-operator"],
                            "args": manager_args(),
                            "env": [
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                // The TLS reload agent's own image: a kustomize image
                                // (config/manager/kustomizeconfig.yaml), set like the manager's.
                                {"name": "TLS_AGENT_IMAGE", "value": TLS_AGENT_IMAGE_PLACEHOLDER},
                            ],
                            "ports": [
                                {"name": "https", "containerPort": METRICS_PORT, "protocol": "TCP"},
                                {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                            ],
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": true,
                            },
                            "livenessProbe": probe("/healthz", 15, 20),
                            "readinessProbe": probe("/readyz", 5, 10),
                            "resources": {
                                "limits": {"cpu": "500m", "memory": "128Mi"},
                                "requests": {"cpu": "10m", "memory": "64Mi"},
                            },
                        }],
                        "serviceAccountName": SERVICE_ACCOUNT,
                        "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
                    },
                },
            },
        }),
    )
}

pub(super) fn manager_files() -> Result<Vec<File>, Error> {
    let ns: Namespace = typed(
        "Namespace",
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": BASE_NAMESPACE, "labels": object_labels()},
        }),
    )?;
    let image = |placeholder: &str| {
        let (name, tag) = placeholder
            .split_once(':')
            .unwrap_or((placeholder, "latest"));
        json!({"name": name, "newName": name, "newTag": tag})
    };
    // kustomize's images transformer rewrites containers' `image` only; this makes it
    // rewrite the agent's image where the manager is told it, so an overlay's `images:`
    // entry (or `kustomize edit set image`) sets it like the manager's. Only the values
    // naming that image change: the manager's other variables come from fieldRefs.
    let config = json!({
        "images": [{
            "kind": "Deployment",
            "path": "spec/template/spec/containers[]/env[]/value",
        }],
    });
    Ok(vec![
        Doc::new("manager/manager.yaml")
            .comment("The operator. Flags: `memcached-operator run --help`.")
            .object(&ns)?
            .object(&manager_deployment()?)?
            .finish(),
        Doc::new("manager/kustomization.yaml")
            .comment("Two images: the operator's (`controller`, `make deploy IMG=...`) and the TLS reload")
            .comment("agent's (`tls-agent`, TLS_AGENT_IMAGE, `make deploy TLS_AGENT_IMG=...`), which")
            .comment("memcached pods run and pull with their Memcached's spec.imagePullSecrets.")
            .object(&Kustomization {
                images: vec![
                    image(IMAGE_PLACEHOLDER),
                    image(TLS_AGENT_IMAGE_PLACEHOLDER),
                ],
                configurations: vec!["kustomizeconfig.yaml"],
                ..Kustomization::resources(&["manager.yaml"])
            })?
            .finish(),
        Doc::new("manager/kustomizeconfig.yaml")
            .comment("Teaches kustomize's images transformer the TLS reload agent's image in the")
            .comment("manager's environment (TLS_AGENT_IMAGE), so the `tls-agent` image entry sets it.")
            .object(&config)?
            .finish(),
    ])
}
