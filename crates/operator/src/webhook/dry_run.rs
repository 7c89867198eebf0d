//! Admission of what a Memcached becomes: the validating webhook builds the children the
//! reconciler would apply (the same list, [`crate::children::CHILDREN`], and the same pure
//! builders) and asks the API server for a server-side dry run of each, so a Memcached
//! whose Deployment, Services, PDB, ServiceMonitor or proxy Kubernetes would refuse is
//! refused at the door, with the Memcached's own field paths in the message (`spec.tolerations[0].operator: Unsupported value: "Bogus"`)
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
//! - One read of the client Service (whose form depends on it), then one apply per child
//!   (3–5), sent at once; on a local control plane the whole check took a median of
//!   11–15 ms before the read was added (printed by `tests/admission_children.rs`). It runs only
//!   on create, and on update when the spec changed, so editing labels or finalizers of a
//!   Memcached admitted while the webhook was off is never blocked by its children.
//! - The identity needs what the dry run needs: `get` on Services and `patch` on the
//!   children's kinds in the Memcached's namespace, which the reconciler needs anyway
//!   (`config/rbac`).
//! - The checks and their client run on a thread of their own
//!   ([`ChildrenCheck::on_own_thread`]), not on the webhook server's, which a flood of the
//!   port keeps busy: under the flood of `tests/webhook_flood.rs` a check takes 0.1–0.4 s
//!   on its own thread, against 1.5–2.9 s on the server's.
//! - At most [`MAX_DRY_RUNS_IN_FLIGHT`] checks run at once (per [`ChildrenCheck`] and its
//!   clones); beyond that a check is not started ([`Verdict::Busy`]) and the webhook answers
//!   429, which the API server retries after a second, so a flood of reviews cannot turn
//!   into a flood of requests under the operator's identity.
//! - The check gets [`DEFAULT_BUDGET`] (the API server waits [`super::TIMEOUT_SECONDS`]
//!   for the whole answer). When it cannot finish (timeout, the API server unreachable or
//!   overloaded, the dry run forbidden to our identity), the answer follows the
//!   [`FailurePolicy`]: `Fail` (the default, as the webhook configurations' own
//!   `failurePolicy`) refuses with the reason and asks to retry; `Ignore` admits with a
//!   warning saying the children were not checked. The reconciler's `Degraded` condition
//!   stays the safety net for whatever was admitted unchecked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::Status;
use kube::{Api, Client};
use memcached_api::Memcached;
use memcached_api::validation::{FieldError, ValidationErrors};
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::limits::MAX_DRY_RUNS_IN_FLIGHT;
use crate::builders::{BuildSettings, FIELD_MANAGER, SecretVersions};
use crate::children::{self, Child, Inputs, LiveServices, origins};

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
    children: &'static [Child],
    policy: FailurePolicy,
    budget: Duration,
    /// One permit per check that may run at once, shared by the clones.
    in_flight: Arc<Semaphore>,
    /// The number of those permits.
    limit: usize,
    /// Where the dry runs (and so the client's connections) run; the caller's runtime
    /// when `None`.
    runtime: Option<Handle>,
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
    /// Not checked: as many checks as may run at once were running.
    Busy,
}

impl ChildrenCheck {
    /// A check through `client` (the operator's own identity), building children as the
    /// reconciler does with `settings`.
    pub fn new(client: Client, settings: BuildSettings) -> Self {
        Self {
            client,
            settings,
            children: children::CHILDREN,
            policy: FailurePolicy::default(),
            budget: DEFAULT_BUDGET,
            in_flight: Arc::new(Semaphore::new(MAX_DRY_RUNS_IN_FLIGHT)),
            limit: MAX_DRY_RUNS_IN_FLIGHT,
            runtime: None,
        }
    }

    /// A check whose client is made from `config` and whose dry runs run on a thread of
    /// their own (`webhook-dry-run`, a single-threaded runtime, until `shutdown`).
    ///
    /// Why not on the webhook server's thread: a flood of its port keeps that thread busy
    /// with TLS handshakes, and every step of a dry run (the Service read, then the
    /// applies) waited its turn behind them: 1.5–2.9 s per check under the flood of
    /// `tests/webhook_flood.rs`, 11 ms without it, so the API server's own reviews found
    /// every slot taken and ran out of their 10 s. On a thread of their own the dry runs
    /// wait only for the API server.
    pub async fn on_own_thread(
        config: kube::Config,
        settings: BuildSettings,
        shutdown: CancellationToken,
    ) -> Result<Self, String> {
        let runtime = super::server::runtime_thread("webhook-dry-run", move || async move {
            shutdown.cancelled().await
        })
        .await?;
        // The client's request queue is a task of the runtime current when it is made.
        let client = {
            let _entered = runtime.enter();
            crate::client::client(config).map_err(|e| e.to_string())?
        };
        Ok(Self {
            runtime: Some(runtime),
            ..Self::new(client, settings)
        })
    }

    /// How many checks may run at once (at least 1; [`MAX_DRY_RUNS_IN_FLIGHT`] unless
    /// set), shared with the clones made after this call.
    pub fn with_max_in_flight(mut self, checks: usize) -> Self {
        self.limit = checks.max(1);
        self.in_flight = Arc::new(Semaphore::new(self.limit));
        self
    }

    /// What to answer when the check cannot be completed.
    pub fn with_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The children to check (another list than [`children::CHILDREN`] only in tests that
    /// add a child).
    pub fn with_children(mut self, children: &'static [Child]) -> Self {
        self.children = children;
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

    /// How many checks may run at once.
    pub fn max_in_flight(&self) -> usize {
        self.limit
    }

    /// Checks running now (this one's and its clones').
    pub fn in_flight(&self) -> usize {
        // Permits are only taken out, one per running check, and given back.
        self.limit - self.in_flight.available_permits()
    }

    /// Dry-runs every child of `mc` (which must have a name and a namespace) and says
    /// whether the API server would accept them all; [`Verdict::Busy`] at once when as
    /// many checks as may run at once are running.
    pub async fn check(&self, mc: &Memcached) -> Verdict {
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            return Verdict::Busy;
        };
        let started = Instant::now();
        let (this, owned) = (self.clone(), mc.clone());
        let timed = async move {
            // The slot is held while the dry runs run, even if the review is given up.
            let _slot = slot;
            match tokio::time::timeout(this.budget, this.dry_run_children(&owned)).await {
                Ok(verdict) => verdict,
                Err(_) => Verdict::Unchecked(format!(
                    "the API server did not answer the dry run of its children within {} ms",
                    this.budget.as_millis()
                )),
            }
        };
        let verdict = match &self.runtime {
            Some(runtime) => runtime.spawn(timed).await.unwrap_or_else(|e| {
                Verdict::Unchecked(format!("the dry run of its children stopped: {e}"))
            }),
            None => timed.await,
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
        let mut mc = mc.clone();
        if mc.metadata.uid.as_deref().unwrap_or_default().is_empty() {
            mc.metadata.uid = Some(PLACEHOLDER_UID.to_string());
        }
        // The client Service keeps an earlier release's cluster IP (a headless form would be
        // refused: a Service keeps its cluster IP for life), so its form is read first.
        let services = match self.live_services(&mc, &namespace).await {
            Ok(services) => services,
            Err(why) => return Verdict::Unchecked(why),
        };
        // The Secrets' versions and the proxy's backends are left out (their contents do
        // not change what Kubernetes accepts); nothing else differs from what the
        // reconciler applies.
        let inputs = Inputs {
            settings: &self.settings,
            secrets: &SecretVersions::default(),
            backends: &[],
            services,
        };
        let plans = match children::plan(self.children, &mc, &inputs) {
            Ok(plans) => plans,
            Err(e) => return Verdict::Unchecked(format!("its children cannot be built: {e}")),
        };
        let wanted: Vec<(&Child, String, Value)> = plans
            .into_iter()
            .filter_map(|p| {
                let object = p.desired?.to_json().ok()?;
                Some((p.child, p.name, object))
            })
            .collect();
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let answers = futures::future::join_all(wanted.iter().map(|(child, name, object)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &namespace, &child.kind.api_resource());
            let params = &params;
            async move { api.patch(name, params, &Patch::Apply(object)).await }
        }))
        .await;
        let mut refused = Vec::new();
        let mut unchecked = Vec::new();
        for ((child, name, _), answer) in wanted.iter().zip(answers) {
            match answer {
                Ok(_) => {}
                Err(kube::Error::Api(status)) => {
                    match classify(child, &mc, &inputs, name, &status) {
                        Answer::Refused(errors) => refused.extend(errors),
                        Answer::NotServed => {}
                        Answer::Unchecked(why) => unchecked.push(why),
                    }
                }
                Err(e) => unchecked.push(format!(
                    "the dry run of {} {name:?} failed: {e}",
                    child.role
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

    /// The form of `mc`'s client Services, from the live `NAME` (one read): the reconciler
    /// keeps a cluster IP `NAME` has, and `NAME-headless` beside it.
    async fn live_services(&self, mc: &Memcached, namespace: &str) -> Result<LiveServices, String> {
        let name = mc.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        let live = api.get_opt(name).await.map_err(|e| match e {
            kube::Error::Api(status) if status.code == 403 => format!(
                "reading Service {name:?} before the dry run was forbidden: {} (the operator \
                 needs get on services in this namespace, as config/rbac grants)",
                status.message
            ),
            e => format!("reading Service {name:?} before the dry run failed: {e}"),
        })?;
        let spec = live
            .and_then(|s| s.spec)
            .and_then(|spec| serde_json::to_value(spec).ok());
        let services = LiveServices::of(spec.as_ref(), None);
        Ok(LiveServices {
            headless: services.cluster_ip,
            ..services
        })
    }
}

/// Placeholder owner uid for a Memcached not yet stored (the API server does not check
/// that an owner exists; the dry run stores nothing).
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

enum Answer {
    Refused(Vec<FieldError>),
    /// The kind is not served (a ServiceMonitor without the Prometheus Operator): the
    /// reconciler skips it too.
    NotServed,
    Unchecked(String),
}

fn classify(
    child: &Child,
    mc: &Memcached,
    inputs: &Inputs<'_>,
    name: &str,
    status: &Status,
) -> Answer {
    if let Some(errors) = origins::refusal(child, mc, inputs, name, status) {
        return Answer::Refused(errors.0);
    }
    match status.code {
        404 if !child.kind.always_served() => Answer::NotServed,
        403 if origins::is_rbac_denial(status) => Answer::Unchecked(format!(
            "the dry run of {} {name:?} was forbidden: {} (the operator needs patch on {} in this namespace, as config/rbac grants)",
            child.role,
            status.message,
            child.kind.api_resource().plural
        )),
        _ => Answer::Unchecked(format!(
            "the dry run of {} {name:?} failed: {} ({})",
            child.role, status.message, status.code
        )),
    }
}
