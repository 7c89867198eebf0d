//! One reconcile of one Memcached, top to bottom: check the spec, read the Secrets its pods
//! mount, plan its children from the list (pure), apply them through the one apply path,
//! compute the status (pure) and write it if it changed, then mark the proxy's slots on the
//! pods (their deletion costs) and restart a pod whose certificate reload failed.
//! Idempotent and level-triggered: everything is read from the caches; the API server is
//! only written to.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use manager::ReconcileResult;
use memcached_api::{Memcached, MemcachedStatus, validation};
use tokio::time::Instant;
use tracing::{Instrument, debug, warn};

use super::apply::{self, Owner};
use super::context::{Context, Error, object_key};
use super::events::Changes;
use super::queue::Next;
use super::{deletion_costs, flush, restart_gate, secrets};
use crate::builders;
use crate::cached::CachedPod;
use crate::children::{self, Inputs, LiveServices};
use crate::informer::Index;
use crate::proxy;
use crate::status::{self, Observed, ObservedPod, ObservedProxy, Problem};

/// Reconciles one Memcached and reports how it went: one event for what changed, the
/// metrics, and on failure the `Degraded` condition and a Warning event.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Next, Error> {
    let _running = ctx.busy.enter();
    let key = ObjectRef::from_obj(mc.as_ref());
    let telemetry = ctx.config.telemetry.as_ref();
    let timer = telemetry.map(|t| {
        t.started(&key);
        // At most once a second: the pruning looks every pool with a problem series up.
        if t.instances_due() {
            let scope = ctx.config.namespace.as_deref().unwrap_or("");
            t.set_instances(scope, ctx.memcacheds.len());
            t.prune_problems(|key| ctx.memcacheds.get(key).is_some());
        }
        t.controller.reconcile_started()
    });
    let counters = &ctx.config.counters;
    counters.start(&key);
    let span = tracing::info_span!("reconcile", object = %object_key(&mc));
    let mut changes = Changes::default();
    let result = reconcile_inner(&mc, &ctx, &mut changes)
        .instrument(span)
        .await;
    // What was changed is reported even when a later step failed.
    if let Some(event) = changes.into_event() {
        ctx.events.publish_event(&mc, event);
    }
    drop(timer);
    counters.finish(&key, result.is_err());
    if let Some(t) = telemetry {
        t.controller.record_result(match &result {
            Err(_) => ReconcileResult::Error,
            Ok(Next::OnChange) => ReconcileResult::Success,
            Ok(_) => ReconcileResult::RequeueAfter,
        });
    }
    match &result {
        Ok(_) => ctx.reset_failures(&key),
        Err(err) => {
            let reason = err.reason();
            // Best effort: surface the failure on the object itself, unless writing the
            // status is what failed.
            if !matches!(err, Error::Status { .. }) {
                let problem = Problem {
                    reason: reason.into(),
                    message: err.to_string(),
                };
                if let Err(e) = record_problem(&ctx, &mc, problem).await {
                    debug!(error = %e, "could not record the failure in status");
                }
            }
            ctx.events.publish(
                &mc,
                EventType::Warning,
                reason,
                "Reconcile",
                err.to_string(),
            );
        }
    }
    result
}

async fn reconcile_inner(
    mc: &Memcached,
    ctx: &Context,
    changes: &mut Changes,
) -> Result<Next, Error> {
    let owner = Owner::of(mc);
    if mc.metadata.deletion_timestamp.is_some() {
        // Owned objects go with the CR through ownerReference garbage collection.
        ctx.normal_forms.forget_owner(owner.key);
        ctx.flushes.forget(owner.key);
        return Ok(Next::OnChange);
    }
    let namespace = mc.namespace().ok_or(Error::NoNamespace)?;
    let name = mc.name_any();
    let object = format!("{namespace}/{name}");

    // 1. The spec: nothing is created for an invalid one.
    if let Err(errors) = validation::validate(mc) {
        let message = errors.to_string();
        warn!(object, %message, "invalid Memcached: not creating children");
        let problem = Problem {
            reason: "InvalidSpec".into(),
            message: message.clone(),
        };
        if record_problem(ctx, mc, problem).await? {
            ctx.events
                .publish(mc, EventType::Warning, "InvalidSpec", "Validate", message);
        }
        // Retrying cannot help: wait for the user to change the object.
        return Ok(Next::OnChange);
    }

    // 2. The Secrets the pods mount must exist before the pods are rolled to use them; a
    // missing one is reported, and the running pods are left as they are.
    let secrets = match secrets::referenced_secrets(ctx, mc, &namespace).await? {
        Ok(versions) => versions,
        Err(problem) => {
            warn!(object, message = %problem.message, "referenced Secret unusable");
            if record_problem(ctx, mc, problem.clone()).await? {
                ctx.events.publish(
                    mc,
                    EventType::Warning,
                    &problem.reason,
                    "ReadSecret",
                    problem.message,
                );
            }
            // The Secret's creation or change wakes it; a look again costs no request.
            return Ok(Next::Recheck(ctx.config.secret_recheck));
        }
    };

    // 3. The children, from the list: planned (pure), then applied, unwanted ones deleted.
    let pods = observed_pods(&ctx.pod_index, &namespace, &name);
    let (
        proxy::Membership {
            backends,
            deletion_costs,
        },
        warm_until,
    ) = proxy_backends(ctx, mc, &owner, &pods);
    let inputs = Inputs {
        settings: &ctx.config.build,
        secrets: &secrets,
        backends: &backends,
        services: live_services(ctx, &owner, &namespace, &name),
    };
    let plans = children::plan(ctx.config.children, mc, &inputs).map_err(|e| Error::Build {
        kind: e.role,
        object: object.clone(),
        source: e.source,
    })?;
    let applied = match apply::apply_children(ctx, mc, &owner, plans, &inputs, changes).await {
        Ok(applied) => applied,
        Err(e) => {
            // What does not depend on the children still happens (the status, with the
            // failure, is written by `reconcile`): a conflict over one child must not hold
            // the proxy's slots or a pod whose certificate reload failed.
            let failures = restart_gate::reload_failures(mc, &ctx.pod_index, &namespace, &name);
            deletion_costs::annotate(ctx, &namespace, &name, &deletion_costs).await?;
            restart_gate::restart_failed_reload(ctx, mc, &namespace, &failures).await?;
            return Err(e);
        }
    };

    // 4. The flush on demand: one pod at most, at the end of the pause after the last.
    let (flush, flush_recheck) = flush::step(ctx, mc, owner.key, &pods).await;

    // 5. The status, from what the children and pods show.
    let failures = restart_gate::reload_failures(mc, &ctx.pod_index, &namespace, &name);
    let deployment = applied.deployment(&name).map(|d| d.without_spec());
    let proxy_deployment = applied
        .deployment(&proxy::proxy_name(&name))
        .map(|d| d.without_spec());
    let proxy = mc.spec.proxy_enabled().map(|_| ObservedProxy {
        deployment: proxy_deployment.as_ref(),
        version: proxy::routes_version(mc, &backends).unwrap_or_default(),
        backends,
        propagation: ctx.config.proxy_propagation,
    });
    let observed = Observed {
        deployment: deployment.as_ref(),
        pods,
        problem: None,
        proxy,
        reload_failures: failures.clone(),
        rollout_waiting: applied.rollout_waiting,
        flush,
    };
    let now = jiff::Timestamp::now();
    let status = status::desired_status(mc, &observed, now);
    if let Some(t) = &ctx.config.telemetry {
        t.set_problems(&ObjectRef::from_obj(mc), &status.conditions);
    }
    let recheck = proxy_recheck(&status, now, ctx.config.proxy_propagation);
    let recheck = sooner(recheck, flush_recheck);
    // The slots a scale-out added stop warming up then.
    let recheck = sooner(
        recheck,
        warm_until.map(|until| {
            Duration::try_from(until.duration_since(now)).unwrap_or_default()
                + Duration::from_secs(1)
        }),
    );
    // Progress only (pods listed, counts) waits for the pool's interval; a look again then
    // writes it, unless a change of meaning comes first.
    let held = ctx
        .status_pacing
        .hold(owner.key, mc.status.as_ref(), &status, Instant::now());
    let recheck = sooner(recheck, held);
    if held.is_none() && write_status_if_changed(&ctx.client, mc, status).await? {
        ctx.status_pacing.written(owner.key, Instant::now());
        debug!(object, "status updated");
        // Files the agent refused itself: reported when the status first says so; the pod
        // keeps serving the certificate it has.
        for failure in failures.iter().filter(|f| !f.restart) {
            restart_gate::publish_reload_failure(
                ctx,
                mc,
                &namespace,
                failure,
                "CertificateInvalid",
                "Report",
                format!(
                    "Pod {} did not load the renewed TLS certificate ({}); memcached keeps serving the certificate it has",
                    failure.pod, failure.reason
                ),
            );
        }
    }

    // 6. The proxy's slots on the pods, so that a scale-down removes the last ones.
    deletion_costs::annotate(ctx, &namespace, &name, &deletion_costs).await?;

    // 7. Reported in the status first (above), then restarted.
    restart_gate::restart_failed_reload(ctx, mc, &namespace, &failures).await?;
    // A pool waiting for a rollout slot looks again soon (a slot frees when another pool's
    // rollout is done, which does not wake this one).
    let recheck = sooner(
        recheck,
        applied.rollout_waiting.map(|_| ROLLOUT_SLOT_RECHECK),
    );
    Ok(match recheck {
        Some(r) if r < ctx.config.resync => Next::Recheck(r),
        _ => Next::Resync(ctx.config.resync),
    })
}

/// The sooner of two looks again, either of which may not be needed.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How soon a pool waiting for a rollout slot looks again (costs no request: the slots are
/// counted from the caches).
const ROLLOUT_SLOT_RECHECK: Duration = Duration::from_secs(10);

/// The live pods of `mc` in the pod cache: neither being deleted nor ended (a Failed or
/// evicted pod stays until garbage-collected, but serves nothing).
fn observed_pods(pods: &Index<CachedPod>, namespace: &str, name: &str) -> Vec<ObservedPod> {
    cached_pods(pods, namespace, name, |p| {
        p.metadata.deletion_timestamp.is_none() && !p.ended
    })
}

/// The pods of `mc` in the pod cache that are stopping and may still serve: deletion
/// requested, not ended, with an IP (a pod in its `preStop` delay, which the proxies warm
/// its slot's successor from).
fn leaving_pods(pods: &Index<CachedPod>, namespace: &str, name: &str) -> Vec<ObservedPod> {
    cached_pods(pods, namespace, name, |p| {
        p.metadata.deletion_timestamp.is_some() && !p.ended && p.ip.is_some()
    })
}

/// The pods of `mc` in the pod cache that pass `which`.
fn cached_pods(
    pods: &Index<CachedPod>,
    namespace: &str,
    name: &str,
    which: impl Fn(&CachedPod) -> bool,
) -> Vec<ObservedPod> {
    pods.get(&format!("{namespace}/{name}"))
        .iter()
        .filter(|p| which(p))
        .map(|p| ObservedPod {
            name: p.name_any(),
            ip: p.ip.clone(),
            ready: p.ready,
            zone: p.zone.clone(),
            created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        })
        .collect()
}

/// The pool's client Services in the cache: those no other object controls (ours, or
/// orphaned ones of an earlier Memcached of this name, which are taken back as they are).
fn live_services(ctx: &Context, owner: &Owner, namespace: &str, name: &str) -> LiveServices {
    let spec = |service: &str| {
        ctx.services
            .get(&ObjectRef::new(service).within(namespace))
            .filter(|s| owner.other_controller(s.as_ref()).is_none())
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s.spec_json()).ok())
    };
    LiveServices::of(
        spec(name).as_ref(),
        spec(&builders::headless_name(name)).as_ref(),
    )
}

/// The proxy's rings: the live pods of `pods` in their slots, as the configuration in place
/// (our ConfigMap) records them, newcomers joining once Ready (see [`proxy::membership`]);
/// and the deletion cost each pod in them should carry. None without the proxy. With
/// warm-up, the slots a scale-out added warm up from the ring before it
/// ([`proxy::warm_growth`]) until the time returned.
fn proxy_backends(
    ctx: &Context,
    mc: &Memcached,
    owner: &Owner,
    pods: &[ObservedPod],
) -> (proxy::Membership, Option<jiff::Timestamp>) {
    let Some(spec) = mc.spec.proxy_enabled() else {
        return (proxy::Membership::default(), None);
    };
    let namespace = mc.namespace().unwrap_or_default();
    let recorded = ctx
        .config_maps
        .get(&ObjectRef::new(&proxy::proxy_name(&mc.name_any())).within(&namespace))
        .filter(|cm| owner.controls(cm.as_ref()))
        .map(|cm| proxy::recorded_backends(&cm.spec_json()))
        .unwrap_or_default();
    // Stopping pods, which slots warm up from, only with warm-up.
    let leaving = if spec.warm_up_enabled() {
        leaving_pods(&ctx.pod_index, &namespace, &mc.name_any())
    } else {
        Vec::new()
    };
    let mut next = proxy::membership(
        &recorded,
        pods,
        &leaving,
        mc.spec.size,
        spec.copies,
        &spec.zones,
        mc.spec.container_port,
    );
    let warm_until = if spec.warm_up_enabled() && spec.copies == 1 {
        proxy::warm_growth(
            &recorded,
            &mut next,
            pods,
            jiff::Timestamp::now(),
            ctx.config.proxy_propagation,
            ctx.config.proxy_warm_growth,
        )
    } else {
        None
    };
    (next, warm_until)
}

/// When to look again so that `ProxyReady` leaves `Propagating` on time.
fn proxy_recheck(
    status: &MemcachedStatus,
    now: jiff::Timestamp,
    window: Duration,
) -> Option<Duration> {
    let since = status.proxy.as_ref()?.config_changed_at.as_ref()?.0;
    let elapsed = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    window
        .checked_sub(elapsed)
        .map(|left| left + Duration::from_secs(1))
}

async fn write_status_if_changed(
    client: &Client,
    mc: &Memcached,
    status: MemcachedStatus,
) -> Result<bool, Error> {
    if mc.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let namespace = mc.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<Memcached> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &mc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|source| Error::Status {
        object: object_key(mc),
        source,
    })?;
    Ok(true)
}

/// Writes `mc`'s status with `problem` as its `Degraded` condition, the rest computed from
/// the cache as usual. Returns whether the status changed (the caller then emits an event).
async fn record_problem(ctx: &Context, mc: &Memcached, problem: Problem) -> Result<bool, Error> {
    let namespace = mc.namespace().ok_or(Error::NoNamespace)?;
    let name = mc.name_any();
    let deployment = ctx
        .deployments
        .get(&ObjectRef::new(&name).within(&namespace))
        .map(|d| d.without_spec());
    let observed = Observed {
        deployment: deployment.as_ref(),
        pods: observed_pods(&ctx.pod_index, &namespace, &name),
        problem: Some(problem),
        proxy: None,
        reload_failures: restart_gate::reload_failures(mc, &ctx.pod_index, &namespace, &name),
        rollout_waiting: None,
        flush: None,
    };
    let status = status::desired_status(mc, &observed, jiff::Timestamp::now());
    if let Some(t) = &ctx.config.telemetry {
        t.set_problems(&ObjectRef::from_obj(mc), &status.conditions);
    }
    write_status_if_changed(&ctx.client, mc, status).await
}

/// Retries a failed object with per-object exponential backoff: the delay before its next
/// reconcile.
pub fn error_policy(mc: &Memcached, err: &Error, ctx: &Context) -> Duration {
    let failures = ctx.record_failure(ObjectRef::from_obj(mc));
    if let Some(t) = &ctx.config.telemetry {
        t.controller.queue_retry();
    }
    let delay = ctx.config.backoff.delay(failures);
    warn!(object = %object_key(mc), error = %err, failures, retry_in = ?delay, "reconcile failed");
    delay
}
