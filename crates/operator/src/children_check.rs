//! Admission of what a Memcached becomes: the validating webhook builds the children the
//! reconciler would apply (the builders are pure) and asks the API server for a
//! server-side dry run of each, so a Memcached whose Deployment, Services, PDB or
//! ServiceMonitor Kubernetes would refuse is refused at the door, with the Memcached's own
//! field paths in the message (`spec.tolerations[0].operator: Unsupported value: "Bogus"`)
//! instead of being stored and turning `Degraded` afterwards.
//!
//! Why a dry run and not the same rules in Rust: the API server is the only complete and
//! version-exact statement of its rules (pod-template validation is thousands of lines of
//! Go, grows with every release, and differs between the versions we support: v1.35 added
//! toleration operators `Gt`/`Lt` behind a feature gate). Admission policies installed on
//! the cluster (quota, policy engines' webhooks on Deployments) answer the dry run too,
//! and are reported the same way.
//!
//! The cost, and what happens when the API server does not answer:
//! - One apply per child (4–5), sent at once; on a local control plane the whole check
//!   takes a median of 11–15 ms (printed by `tests/admission_children.rs`). It runs only
//!   on create, and on update when the spec changed, so editing labels or finalizers of a
//!   Memcached admitted while the webhook was off is never blocked by its children.
//! - The identity needs what the dry run needs: `patch` on the children's kinds in the
//!   Memcached's namespace, which the reconciler needs anyway (`config/rbac`).
//! - The check gets [`DEFAULT_BUDGET`] (the API server waits [`crate::webhook::TIMEOUT_SECONDS`]
//!   for the whole answer). When it cannot finish (timeout, the API server unreachable or
//!   overloaded, the dry run forbidden to our identity), the answer follows the
//!   [`FailurePolicy`]: `Fail` (the default, as the webhook configurations' own
//!   `failurePolicy`) refuses with the reason and asks to retry; `Ignore` admits with a
//!   warning saying the children were not checked. The reconciler's `Degraded` condition
//!   stays the safety net for whatever was admitted unchecked.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::Status;
use kube::{Api, Client};
use memcached_api::Memcached;
use memcached_api::validation::{FieldError, ValidationErrors};
use serde_json::Value;

use crate::builders::{self, BuildSettings, FIELD_MANAGER};
use crate::controller::PROXY_DEPLOYMENT;
use crate::proxy;

/// Time the dry runs get, well inside the API server's 10 s wait for the webhook.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);

/// What to answer when the children could not be checked (the webhook configurations'
/// `failurePolicy` in Kubernetes' words).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Refuse the Memcached, saying why and asking to retry.
    #[default]
    #[value(name = "Fail")]
    Fail,
    /// Admit it with a warning that its children were not checked.
    #[value(name = "Ignore")]
    Ignore,
}

/// Checks a Memcached's children with server-side dry runs.
#[derive(Clone)]
pub struct ChildrenCheck {
    client: Client,
    settings: BuildSettings,
    policy: FailurePolicy,
    budget: Duration,
}

/// The outcome of a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The API server accepts every child.
    Accepted,
    /// The API server would refuse a child: what is wrong, on the Memcached's fields.
    Refused(ValidationErrors),
    /// The children could not be checked (why); the policy decides.
    Unchecked(String),
}

impl ChildrenCheck {
    /// A check through `client` (the operator's own identity), building children as the
    /// reconciler does with `settings`.
    pub fn new(client: Client, settings: BuildSettings) -> Self {
        Self {
            client,
            settings,
            policy: FailurePolicy::default(),
            budget: DEFAULT_BUDGET,
        }
    }

    /// What to answer when the check cannot be completed.
    pub fn with_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Time the dry runs get.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The failure policy in force.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// Dry-runs every child of `mc` (which must have a name and a namespace) and says
    /// whether the API server would accept them all.
    pub async fn check(&self, mc: &Memcached) -> Verdict {
        let started = Instant::now();
        let verdict = match tokio::time::timeout(self.budget, self.dry_run_children(mc)).await {
            Ok(verdict) => verdict,
            Err(_) => Verdict::Unchecked(format!(
                "the API server did not answer the dry run of its children within {} ms",
                self.budget.as_millis()
            )),
        };
        tracing::debug!(
            name = mc.metadata.name.as_deref().unwrap_or(""),
            namespace = mc.metadata.namespace.as_deref().unwrap_or(""),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            ?verdict,
            "dry run of the children"
        );
        verdict
    }

    async fn dry_run_children(&self, mc: &Memcached) -> Verdict {
        let Some(namespace) = mc.metadata.namespace.clone() else {
            return Verdict::Unchecked("the Memcached has no namespace".to_string());
        };
        let children = match desired_children(mc, &self.settings) {
            Ok(children) => children,
            Err(e) => return Verdict::Unchecked(format!("its children cannot be built: {e}")),
        };
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let answers = futures::future::join_all(children.iter().map(|child| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &namespace, &child.resource);
            let params = &params;
            async move {
                api.patch(&child.name, params, &Patch::Apply(&child.object))
                    .await
            }
        }))
        .await;
        let mut refused = Vec::new();
        let mut unchecked = Vec::new();
        for (child, answer) in children.iter().zip(answers) {
            match answer {
                Ok(_) => {}
                Err(kube::Error::Api(status)) => match classify(child, &status) {
                    Answer::Refused(errors) => refused.extend(errors),
                    Answer::NotServed => {}
                    Answer::Unchecked(why) => unchecked.push(why),
                },
                Err(e) => unchecked.push(format!(
                    "the dry run of {} {:?} failed: {e}",
                    child.kind, child.name
                )),
            }
        }
        if !refused.is_empty() {
            Verdict::Refused(ValidationErrors(refused))
        } else if !unchecked.is_empty() {
            Verdict::Unchecked(unchecked.join("; "))
        } else {
            Verdict::Accepted
        }
    }
}

/// One object the reconciler would apply.
#[derive(Clone, Debug)]
pub struct Child {
    /// Its kind, as the API server names it in messages.
    pub kind: &'static str,
    pub name: String,
    pub resource: ApiResource,
    /// The object as applied.
    pub object: Value,
}

/// Placeholder owner uid for a Memcached not yet stored (the API server does not check
/// that an owner exists; the dry run stores nothing).
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// Every child the reconciler would apply for `mc`: the Deployment, the client and
/// headless Services, the PDB (two pods or more) and the ServiceMonitor (with the
/// exporter). The Secrets' versions are left out of the pod template's hash annotation;
/// nothing else differs from what the reconciler applies.
pub fn desired_children(
    mc: &Memcached,
    settings: &BuildSettings,
) -> Result<Vec<Child>, builders::BuildError> {
    let mut mc = mc.clone();
    if mc.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        mc.metadata.uid = Some(PLACEHOLDER_UID.to_string());
    }
    let mut children = Vec::new();
    let mut push = |kind, resource, object: Value| {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        children.push(Child {
            kind,
            name,
            resource,
            object,
        });
    };
    let json = |v: serde_json::Result<Value>| v.unwrap_or(Value::Null);
    push(
        "Deployment",
        ApiResource::erase::<Deployment>(&()),
        json(serde_json::to_value(builders::desired_deployment(
            &mc, settings,
        )?)),
    );
    let service = ApiResource::erase::<Service>(&());
    push(
        "Service",
        service.clone(),
        json(serde_json::to_value(builders::desired_service(&mc)?)),
    );
    push(
        "Service",
        service,
        json(serde_json::to_value(builders::desired_headless_service(
            &mc,
        )?)),
    );
    if let Some(pdb) = builders::desired_pdb(&mc)? {
        push(
            "PodDisruptionBudget",
            ApiResource::erase::<PodDisruptionBudget>(&()),
            json(serde_json::to_value(pdb)),
        );
    }
    if let Some(monitor) = builders::desired_service_monitor(&mc)? {
        push(
            "ServiceMonitor",
            builders::service_monitor_resource(),
            monitor,
        );
    }
    if let Some(deployment) = proxy::desired_proxy_deployment(&mc, settings)? {
        push(
            PROXY_DEPLOYMENT,
            ApiResource::erase::<Deployment>(&()),
            json(serde_json::to_value(deployment)),
        );
    }
    if let Some(service) = proxy::desired_proxy_service(&mc)? {
        push(
            "Service",
            ApiResource::erase::<Service>(&()),
            json(serde_json::to_value(service)),
        );
    }
    if let Some(pdb) = proxy::desired_proxy_pdb(&mc)? {
        push(
            "PodDisruptionBudget",
            ApiResource::erase::<PodDisruptionBudget>(&()),
            json(serde_json::to_value(pdb)),
        );
    }
    if let Some((config_map, _)) = proxy::desired_proxy_config_map(&mc, &[])? {
        push(
            "ConfigMap",
            ApiResource::erase::<ConfigMap>(&()),
            json(serde_json::to_value(config_map)),
        );
    }
    Ok(children)
}

enum Answer {
    Refused(Vec<FieldError>),
    /// The kind is not served (a ServiceMonitor without the Prometheus Operator): the
    /// reconciler skips it too.
    NotServed,
    Unchecked(String),
}

fn classify(child: &Child, status: &Status) -> Answer {
    if let Some(errors) = refusal(child.kind, &child.name, status) {
        return Answer::Refused(errors.0);
    }
    match status.code {
        404 if child.kind == "ServiceMonitor" => Answer::NotServed,
        403 => Answer::Unchecked(format!(
            "the dry run of {} {:?} was forbidden: {} (the operator needs patch on {} in this namespace, as config/rbac grants)",
            child.kind, child.name, status.message, child.resource.plural
        )),
        _ => Answer::Unchecked(format!(
            "the dry run of {} {:?} failed: {} ({})",
            child.kind, child.name, status.message, status.code
        )),
    }
}

/// When the API server's answer `status` to a write of the child `kind`/`name` says the
/// object itself is wrong, what is wrong as errors on the Memcached's fields; `None` for
/// any other failure (forbidden, conflict, unavailable, …). Used by the webhook for dry
/// runs and by the reconciler for real writes, so both name the same field.
pub fn refusal(kind: &str, name: &str, status: &Status) -> Option<ValidationErrors> {
    let object_is_wrong = match status.code {
        // Invalid (422) and BadRequest (400).
        400 | 422 => true,
        // The server could not even convert the object to its type (a quantity that does
        // not parse): a 500 about the object, not about the server.
        500 => status
            .message
            .contains("unable to convert unstructured object"),
        _ => false,
    };
    object_is_wrong.then(|| ValidationErrors(translate(kind, name, status)))
}

/// Where the builders put the Memcached's fields in each child: (child kind, path in the
/// child, path in the Memcached). Paths are matched whole (`a.b` matches `a.b`, `a.b.c`
/// and `a.b[0]`, never `a.bc`).
const FIELD_ORIGINS: &[(&str, &str, &str)] = &[
    ("Deployment", "spec.replicas", "spec.size"),
    // kube-apiserver reports the template's labels and annotations without `metadata`.
    ("Deployment", "spec.template.labels", "spec.podLabels"),
    (
        "Deployment",
        "spec.template.annotations",
        "spec.podAnnotations",
    ),
    (
        "Deployment",
        "spec.template.metadata.labels",
        "spec.podLabels",
    ),
    (
        "Deployment",
        "spec.template.metadata.annotations",
        "spec.podAnnotations",
    ),
    (
        "Deployment",
        "spec.template.spec.nodeSelector",
        "spec.nodeSelector",
    ),
    (
        "Deployment",
        "spec.template.spec.tolerations",
        "spec.tolerations",
    ),
    ("Deployment", "spec.template.spec.affinity", "spec.affinity"),
    (
        "Deployment",
        "spec.template.spec.priorityClassName",
        "spec.priorityClassName",
    ),
    (
        "Deployment",
        "spec.template.spec.containers[0].resources",
        "spec.resources",
    ),
    (
        "Deployment",
        "spec.template.spec.containers[0].image",
        "spec.image",
    ),
    (
        "Deployment",
        "spec.template.spec.containers[0].ports[0].containerPort",
        "spec.containerPort",
    ),
    (
        "Deployment",
        "spec.template.spec.containers[1].image",
        "spec.exporter.image",
    ),
    ("Service", "spec.ports[0].port", "spec.containerPort"),
    (PROXY_DEPLOYMENT, "spec.replicas", "spec.proxy.replicas"),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.nodeSelector",
        "spec.nodeSelector",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.tolerations",
        "spec.tolerations",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.affinity",
        "spec.affinity",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.priorityClassName",
        "spec.priorityClassName",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.containers[0].resources",
        "spec.proxy.resources",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.containers[0].image",
        "spec.proxy.image",
    ),
    (
        PROXY_DEPLOYMENT,
        "spec.template.spec.containers[0].ports[0].containerPort",
        "spec.containerPort",
    ),
];

/// The Memcached's path for `child_path` in `kind`, if a field of the Memcached lands
/// there.
pub fn memcached_path(kind: &str, child_path: &str) -> Option<String> {
    FIELD_ORIGINS.iter().find_map(|&(k, prefix, origin)| {
        let rest = child_path.strip_prefix(prefix)?;
        (k == kind && (rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')))
            .then(|| format!("{origin}{rest}"))
    })
}

/// The API server's refusal of `child` as errors on the Memcached: each cause with a field
/// that comes from the Memcached is reported on that field with the server's own words;
/// anything else (a field the operator sets, or no field at all) on `spec`, naming the
/// child and its field, so nothing the server said is lost.
fn translate(kind: &str, name: &str, status: &Status) -> Vec<FieldError> {
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    let mut errors: Vec<FieldError> = causes
        .iter()
        .map(|cause| {
            let field = cause.field.trim_start_matches('.');
            match memcached_path(kind, field) {
                Some(path) => FieldError::new(path, cause.message.clone()),
                None if field.is_empty() => FieldError::new(
                    "spec",
                    format!(
                        "the {} {:?} built from it would be refused: {}",
                        kind, name, cause.message
                    ),
                ),
                None => FieldError::new(
                    "spec",
                    format!(
                        "the {} {:?} built from it would be refused: {field}: {}",
                        kind, name, cause.message
                    ),
                ),
            }
        })
        .collect();
    if errors.is_empty() {
        errors.push(FieldError::new(
            "spec",
            format!(
                "the {} {:?} built from it would be refused: {}",
                kind, name, status.message
            ),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_matched_whole() {
        assert_eq!(
            memcached_path("Deployment", "spec.template.spec.tolerations[0].operator"),
            Some("spec.tolerations[0].operator".to_string())
        );
        assert_eq!(
            memcached_path(
                "Deployment",
                "spec.template.spec.containers[0].resources.requests[memory]"
            ),
            Some("spec.resources.requests[memory]".to_string())
        );
        assert_eq!(
            memcached_path("Deployment", "spec.template.spec.containers[0].image"),
            Some("spec.image".to_string())
        );
        // `containers[0].imagePullPolicy` is not `containers[0].image`.
        assert_eq!(
            memcached_path(
                "Deployment",
                "spec.template.spec.containers[0].imagePullPolicy"
            ),
            None
        );
        // The proxy's Deployment carries the proxy's own fields in the same places.
        assert_eq!(
            memcached_path(
                PROXY_DEPLOYMENT,
                "spec.template.spec.containers[0].resources.requests"
            ),
            Some("spec.proxy.resources.requests".to_string())
        );
        assert_eq!(
            memcached_path(PROXY_DEPLOYMENT, "spec.replicas"),
            Some("spec.proxy.replicas".to_string())
        );
        // The same path in another kind is not the Deployment's.
        assert_eq!(
            memcached_path("Service", "spec.template.spec.tolerations"),
            None
        );
    }
}
