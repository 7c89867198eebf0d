//! The Memcached controller, in the seed's terms: informers ([`watches`]: kube-runtime
//! watchers and reflector stores) feed the work queue (kube-runtime's `Controller`, which
//! deduplicates keys, never runs two reconciles of one object at once and backs off
//! failures); [`reconcile`] plans a Memcached's children from the one list
//! ([`crate::children`]), applies them only where they differ ([`apply`]) and writes the
//! status only when it changed.
//!
//! Rooms: [`reconcile`] (the orchestration), [`apply`] (the apply, drift and ownership
//! engine), [`events`], [`secrets`], [`restart_gate`] (in-place TLS reloads that failed),
//! [`deletion_costs`] (the proxy's slots marked on the pods for scale-downs),
//! [`watches`] (informers and what wakes a reconcile), [`telemetry`], [`context`].

pub mod apply;
pub mod context;
pub mod deletion_costs;
pub mod events;
pub mod flush;
pub mod pacing;
pub mod queue;
pub mod reconcile;
pub mod restart_gate;
pub mod rollout;
pub mod secrets;
pub mod telemetry;
pub mod watches;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::runtime::controller::{
    Action, Config as ControllerRuntimeConfig, Controller, Error as ControllerError,
};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use memcached_api::Memcached;
use tracing::debug;

pub use context::{Context, Error};
pub use queue::Slots;
use queue::{Next, WorkQueue};
pub use reconcile::{error_policy, reconcile};
pub use rollout::RolloutSlots;
pub use telemetry::{ReconcileCounters, Telemetry};
pub use watches::Caches;

use crate::builders::{BuildSettings, MANAGED_BY};
use crate::children::{self, Child};
use crate::drift::NormalForms;
use crate::triggers;

/// Pools rolling at once for a new default memcached image, unless told otherwise: few
/// enough that the backends behind the fleet's caches feel one cold pool at a time.
pub const DEFAULT_MAX_CONCURRENT_POOL_ROLLOUTS: usize = 2;

/// Name under which the controller reports events and metrics.
pub const CONTROLLER_NAME: &str = "memcached";

/// Per-object retry delays after a failed reconcile: `base * 2^(failures-1)`, capped.
/// 250 ms keeps a transient API error (a 409, a 500 during an upgrade) from being
/// noticeable; the 5 minute cap bounds the load a persistently failing object puts on the
/// API server while still retrying often enough to recover unattended. Reset on success.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Delay before the retry that follows the `failures`-th consecutive failure (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.base.saturating_mul(1u32 << exp).min(self.cap)
    }
}

/// Settings of one controller instance.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Namespace to watch; `None` watches all namespaces.
    pub namespace: Option<String>,
    pub build: BuildSettings,
    /// Reconciles running at once (never two for one object).
    pub concurrency: u16,
    /// The reconcile slots when several controllers (one per watched namespace) share them
    /// (`--max-concurrent-reconciles` bounds the operator, not each namespace); `None`: a
    /// controller of its own with `concurrency` slots.
    pub slots: Option<Arc<Slots>>,
    /// How often a converged object is looked at again, as a safety net for missed events.
    pub resync: Duration,
    /// Window over which status-only changes of a Memcached's children are batched into
    /// one reconcile (see [`crate::triggers`]); zero reconciles on each.
    pub status_batch: Duration,
    /// How often a pool's status is written while it only makes progress (pods listed,
    /// counts); what changes its meaning is written at once (see [`pacing`]). Zero: at once.
    pub status_progress_interval: Duration,
    pub backoff: Backoff,
    /// Reported as the events' `reportingInstance` (the pod name in a cluster).
    pub instance: Option<String>,
    /// Counts of reconciles, shared with whoever wants to read them (tests, metrics).
    pub counters: Arc<ReconcileCounters>,
    /// Prometheus metrics, when the manager serves them.
    pub telemetry: Option<Telemetry>,
    /// How soon a Memcached waiting for a missing Secret is looked at again, besides the
    /// Secret's creation waking it (a look costs no request).
    pub secret_recheck: Duration,
    /// How long after a change of its backends a proxy is reported as still loading it
    /// ([`crate::proxy::PROPAGATION_WINDOW`]).
    pub proxy_propagation: Duration,
    /// How long the slots a scale-out adds keep warming up from the ring before it, after
    /// the proxies have loaded the change (`spec.proxy.warmUp`;
    /// [`crate::proxy::WARM_GROWTH`]): from the change, `proxy_propagation` and this.
    pub proxy_warm_growth: Duration,
    /// The budget of pools rolling at once for a new default memcached image
    /// (`--max-concurrent-pool-rollouts`), shared by the controllers of every watched scope:
    /// see [`rollout`].
    pub rollout_slots: Arc<RolloutSlots>,
    /// How long an event may wait for a free reconcile slot ([`events::EVENT_MAX_HOLD`];
    /// longer only in tests whose backlog outlasts it on a loaded machine).
    pub event_max_hold: Duration,
    /// The children each Memcached owns ([`children::CHILDREN`]; another list only in
    /// tests that add a child).
    pub children: &'static [Child],
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            build: BuildSettings::default(),
            concurrency: 16,
            slots: None,
            resync: Duration::from_secs(300),
            status_batch: Duration::from_secs(1),
            status_progress_interval: Duration::from_secs(5),
            backoff: Backoff::default(),
            instance: None,
            counters: Arc::default(),
            telemetry: None,
            secret_recheck: Duration::from_secs(15),
            proxy_propagation: crate::proxy::PROPAGATION_WINDOW,
            proxy_warm_growth: crate::proxy::WARM_GROWTH,
            rollout_slots: Arc::default(),
            children: children::CHILDREN,
            event_max_hold: events::EVENT_MAX_HOLD,
        }
    }
}

/// Runs the controller on already started `caches` until `shutdown` resolves, then lets
/// in-flight reconciles finish.
pub async fn run_controller(
    client: Client,
    caches: &Caches,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let telemetry = config.telemetry.clone();
    let stopped = telemetry.clone();
    if let Some(t) = &telemetry {
        t.controller
            .set_max_concurrent(i64::from(config.concurrency));
    }
    let queued = move |key: &ObjectRef<Memcached>| {
        if let Some(t) = &telemetry {
            t.queued(key);
        }
    };
    let normal_forms = Arc::new(NormalForms::default());
    let forms = normal_forms.clone();
    let memcacheds = caches
        .memcacheds
        .subscribe()
        // A deleted Memcached's children go, and what was learned about them with it.
        .inspect(move |mc| {
            if let Ok(mc) = mc
                && mc.metadata.deletion_timestamp.is_some()
            {
                forms.forget_owner(apply::owner_key(&ObjectRef::from_obj(mc)));
            }
        });

    let reporter = Reporter {
        controller: MANAGED_BY.to_string(),
        instance: config.instance.clone(),
    };
    config
        .rollout_slots
        .watch(config.namespace.clone(), caches.deployments.store());
    let slots = config
        .slots
        .clone()
        .unwrap_or_else(|| Slots::new(usize::from(config.concurrency)));
    let busy = slots.busy().clone();
    let events = events::Events::start(
        client.clone(),
        reporter,
        busy.clone(),
        config.event_max_hold,
    );
    let ctx = Arc::new(Context::new(
        client,
        config.clone(),
        caches,
        events,
        busy.clone(),
        normal_forms,
    ));

    let woken = futures::stream::select_all([
        watches::child_triggers(caches),
        watches::secret_triggers(caches),
        watches::served_triggers(caches),
    ]);
    let children = triggers::batch(woken, config.status_batch, Some(busy))
        .map(|(key, urgency)| (key, watches::lane_of(urgency)));
    let wakes = futures::stream::select(watches::memcached_lanes(memcacheds), children)
        .inspect(move |(key, _)| queued(key));
    // The queue bounds how many run at once and in which order (see [`queue`]);
    // kube-runtime's runner starts what it releases at once, never two of one object.
    let work = WorkQueue::new(slots);
    let released = work.release(wakes);
    let (w1, w2) = (work.clone(), work.clone());
    Controller::for_stream(
        futures::stream::pending::<Result<Memcached, kube::runtime::watcher::Error>>(),
        caches.memcacheds_for_controller.clone(),
    )
    .reconcile_on(released)
    .with_config(ControllerRuntimeConfig::default().concurrency(0))
    .graceful_shutdown_on(shutdown)
    .run(
        move |mc, ctx| {
            let work = w1.clone();
            async move {
                let key = ObjectRef::from_obj(mc.as_ref());
                let result = reconcile(mc.clone(), ctx.clone()).await;
                let next = match &result {
                    Ok(next) => *next,
                    Err(e) => Next::Recheck(error_policy(&mc, e, &ctx)),
                };
                work.done(&key, next);
                result.map(|_| Action::await_change())
            }
        },
        // Retries are timed by the queue (above), so kube-runtime's own requeue is unused.
        |_, _, _| Action::await_change(),
        ctx,
    )
    .for_each(move |result| {
        match result {
            Ok((obj, _)) => debug!(object = %obj, "reconciled"),
            // Released, but gone from the cache before it ran: nothing to look at again.
            Err(ControllerError::ObjectNotFound(obj)) => {
                if let Some(ns) = &obj.namespace {
                    w2.done(&ObjectRef::new(&obj.name).within(ns), Next::OnChange);
                }
            }
            Err(e) => debug!(error = %e, "reconcile error"),
        }
        futures::future::ready(())
    })
    .await;
    if let Some(t) = stopped {
        t.clear_problems();
    }
}

/// Starts the caches for `config.namespace`, waits for them, and runs the controller until
/// `shutdown` resolves. For callers without leader election (tests, the demo).
pub async fn run(
    client: Client,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let caches = Caches::start(&client, config.namespace.as_deref());
    caches.wait_synced().await;
    run_controller(client, &caches, config, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_base_to_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_millis(250));
        assert_eq!(b.delay(2), Duration::from_millis(500));
        assert_eq!(b.delay(5), Duration::from_secs(4));
        assert_eq!(b.delay(20), Duration::from_secs(300));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }
}
