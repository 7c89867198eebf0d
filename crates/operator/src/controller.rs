//! The Memcached controller: informers (kube-runtime watchers + reflector stores) feed the
//! work queue (kube-runtime's `Controller`, which deduplicates keys and never runs two
//! reconciles of one object at once); `reconcile` reads the CR and its children from the
//! cache, applies the desired Deployment and Service with server-side apply only when they
//! differ, and writes status only when it changed.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use manager::ControllerMetrics;
use manager::ReconcileResult;
use memcached_api::{Memcached, MemcachedStatus, validation};
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, warn};

use crate::builders::{
    self, APPLIED_HASH_ANNOTATION, BuildError, BuildSettings, FIELD_MANAGER, LABEL_MANAGED_BY,
    MANAGED_BY, SecretVersions,
};
use crate::cached::{
    CacheForm, CachedConfigMap, CachedDeployment, CachedPdb, CachedPod, CachedService,
};
use crate::children_check;
use crate::drift::{self, NormalForm, NormalForms};
use crate::informer::{Index, Informer};
use crate::proxy;
use crate::status::{self, Observed, ObservedPod, ObservedProxy, Problem, ReloadFailure};
use crate::triggers::{self, Busy, Classifier, Urgency};

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
    /// How often a converged object is looked at again, as a safety net for missed events.
    pub resync: Duration,
    /// Window over which status-only changes of a Memcached's children are batched into
    /// one reconcile (see [`crate::triggers`]); zero reconciles on each.
    pub status_batch: Duration,
    pub backoff: Backoff,
    /// Reported as the events' `reportingInstance` (the pod name in a cluster).
    pub instance: Option<String>,
    /// Counts of reconciles, shared with whoever wants to read them (tests, metrics).
    pub counters: Arc<ReconcileCounters>,
    /// Prometheus metrics, when the manager serves them.
    pub telemetry: Option<Telemetry>,
    /// How soon a Memcached waiting for a missing Secret is looked at again (Secrets are
    /// not watched).
    pub secret_recheck: Duration,
}

/// How many reconciles ran, how they ended, and how many ran at once.
#[derive(Debug, Default)]
pub struct ReconcileCounters {
    reconciles: AtomicU64,
    failures: AtomicU64,
    in_flight: Mutex<std::collections::HashSet<ObjectRef<Memcached>>>,
    max_in_flight: AtomicU64,
    same_object_overlaps: AtomicU64,
    /// Children compared field by field with their desired state (see
    /// [`crate::cached::Verified`]).
    drift_checks: AtomicU64,
}

impl ReconcileCounters {
    pub fn reconciles(&self) -> u64 {
        self.reconciles.load(Ordering::Relaxed)
    }
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
    /// Most reconciles seen running at the same moment.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::Relaxed)
    }
    /// Times a reconcile started while another of the same object was running (must be 0).
    pub fn same_object_overlaps(&self) -> u64 {
        self.same_object_overlaps.load(Ordering::Relaxed)
    }
    /// Children whose cached version was compared field by field with their desired state
    /// (a version already found converged with the same desired state is not compared again).
    pub fn drift_checks(&self) -> u64 {
        self.drift_checks.load(Ordering::Relaxed)
    }

    fn start(&self, key: &ObjectRef<Memcached>) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if !in_flight.insert(key.clone()) {
            self.same_object_overlaps.fetch_add(1, Ordering::Relaxed);
        }
        self.max_in_flight
            .fetch_max(in_flight.len() as u64, Ordering::Relaxed);
    }

    fn finish(&self, key: &ObjectRef<Memcached>, failed: bool) {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            build: BuildSettings::default(),
            concurrency: 16,
            resync: Duration::from_secs(300),
            status_batch: Duration::from_secs(1),
            backoff: Backoff::default(),
            instance: None,
            counters: Arc::default(),
            telemetry: None,
            secret_recheck: Duration::from_secs(15),
        }
    }
}

/// Prometheus metrics of the controller: controller-runtime's families (through
/// [`ControllerMetrics`]) and the operator's own.
#[derive(Clone, Debug)]
pub struct Telemetry {
    pub controller: ControllerMetrics,
    /// `memcached_operator_managed_instances`: Memcacheds in the cache, all scopes together.
    pub managed_instances: Gauge,
    /// Keys waiting for a reconcile (the work queue's content, for `workqueue_depth`).
    pending: Arc<Mutex<std::collections::HashSet<ObjectRef<Memcached>>>>,
    instances_by_scope: Arc<Mutex<HashMap<String, i64>>>,
    instances_at: Arc<Mutex<Option<std::time::Instant>>>,
}

impl Telemetry {
    /// Registers the operator's metrics in `metrics` and returns the handles.
    pub fn register(metrics: &manager::Metrics) -> Self {
        let managed_instances = Gauge::default();
        metrics.register(
            "memcached_operator_managed_instances",
            "Memcached objects in the operator's cache",
            managed_instances.clone(),
        );
        Self {
            controller: metrics.controller(CONTROLLER_NAME),
            managed_instances,
            pending: Arc::default(),
            instances_by_scope: Arc::default(),
            instances_at: Arc::default(),
        }
    }

    fn queued(&self, key: ObjectRef<Memcached>) {
        self.controller.queue_add();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.insert(key);
        self.controller.set_queue_depth(pending.len() as i64);
    }

    fn started(&self, key: &ObjectRef<Memcached>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.remove(key);
        self.controller.set_queue_depth(pending.len() as i64);
    }

    fn instances_due(&self) -> bool {
        let now = std::time::Instant::now();
        let mut last = self.instances_at.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            return false;
        }
        *last = Some(now);
        true
    }

    fn set_instances(&self, scope: &str, count: usize) {
        let mut by_scope = self
            .instances_by_scope
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        by_scope.insert(scope.to_string(), count as i64);
        self.managed_instances.set(by_scope.values().sum());
    }
}

/// Why a reconcile failed; each names the object and the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the desired {kind} for {object}: {source}")]
    Build {
        kind: &'static str,
        object: String,
        source: BuildError,
    },
    #[error("applying {kind} {object}: {source}")]
    Apply {
        kind: &'static str,
        object: String,
        source: kube::Error,
    },
    /// The API server refuses the child built from the spec (the validating webhook
    /// refuses such a Memcached; this one was admitted without it).
    #[error("Kubernetes refuses the {kind} {object} built from the spec: {errors}")]
    Refused {
        kind: &'static str,
        object: String,
        errors: validation::ValidationErrors,
    },
    #[error("deleting {kind} {object}: {source}")]
    Delete {
        kind: String,
        object: String,
        source: kube::Error,
    },
    #[error("writing the status of Memcached {object}: {source}")]
    Status { object: String, source: kube::Error },
    #[error("Memcached has no namespace (it is a namespaced kind)")]
    NoNamespace,
    #[error(
        "{kind} {object} is controlled by another owner ({controller}); not taking it over: delete it or rename this Memcached"
    )]
    Conflict {
        kind: &'static str,
        object: String,
        controller: String,
    },
}

/// Shared state of the reconciler: the client for writes and the caches for reads.
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub memcacheds: Store<Memcached>,
    pub deployments: Store<CachedDeployment>,
    pub services: Store<CachedService>,
    pub pdbs: Store<CachedPdb>,
    pub config_maps: Store<CachedConfigMap>,
    /// The pod cache by `namespace/instance` (the pods of one Memcached).
    pub pod_index: Index<CachedPod>,
    events: mpsc::Sender<QueuedEvent>,
    service_monitors: tokio::sync::Mutex<Option<(std::time::Instant, bool)>>,
    failures: Mutex<HashMap<ObjectRef<Memcached>, u32>>,
    /// Reconciles running (status refreshes wait while every slot is taken).
    busy: Busy,
    /// What the server stores for each child's desired state (see [`drift::NormalForm`]).
    normal_forms: Arc<NormalForms>,
}

impl Context {
    fn record_failure(&self, key: ObjectRef<Memcached>) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    fn reset_failures(&self, key: &ObjectRef<Memcached>) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }

    fn publish(&self, mc: &Memcached, type_: EventType, reason: &str, action: &str, note: String) {
        self.publish_event(
            mc,
            Event {
                type_,
                reason: reason.to_string(),
                note: Some(truncate(note, EVENT_NOTE_MAX)),
                action: action.to_string(),
                secondary: None,
            },
        );
    }

    fn publish_event(&self, mc: &Memcached, event: Event) {
        // Events are informational: published off the reconcile's critical path.
        let queued = (event, mc.object_ref(&()), tokio::time::Instant::now());
        if let Err(e) = self.events.try_send(queued) {
            let (event, reference, _) = e.into_inner();
            warn!(
                object = reference.name.as_deref().unwrap_or_default(),
                reason = event.reason,
                "event queue full ({EVENT_QUEUE} waiting) or closed: event dropped"
            );
        }
    }
}

/// An event waiting to be published: what, about which object, since when.
type QueuedEvent = (Event, ObjectReference, tokio::time::Instant);

/// How long an event may be held back while the controller is busy.
const EVENT_MAX_HOLD: Duration = Duration::from_secs(10);
/// Events waiting beyond this many are dropped, as client-go's broadcaster drops them beyond
/// 1,000; here a mass creation of 10,000 Memcacheds still gets every event.
const EVENT_QUEUE: usize = 10_000;

/// Publishes queued events one at a time, oldest first, as client-go's event broadcaster
/// does. Each write competes with the reconciles for the API server, and an event is
/// informational, so while every reconcile slot is taken ([`Busy`]) the next event waits, at
/// most [`EVENT_MAX_HOLD`]; its timestamp is then the time it was published.
///
/// kube-runtime's `Recorder` turns an event into a series of the last one with the same
/// object, type, reason and action seen in the past 6 minutes, keeping that one's note: right
/// for a failure that repeats, wrong for changes (a second scaling would show as the first
/// one counted twice). So warnings go through one shared `Recorder`, and each Normal event
/// (a change, whose note says which) through a fresh one, which also keeps it out of the
/// shared 6-minute cache.
fn spawn_event_publisher(
    client: Client,
    reporter: Reporter,
    busy: Busy,
) -> mpsc::Sender<QueuedEvent> {
    let (tx, mut rx) = mpsc::channel::<QueuedEvent>(EVENT_QUEUE);
    let warnings = Recorder::new(client.clone(), reporter.clone());
    tokio::spawn(async move {
        while let Some((event, reference, queued_at)) = rx.recv().await {
            busy.wait_idle(queued_at, EVENT_MAX_HOLD).await;
            let published = match event.type_ {
                EventType::Warning => warnings.publish(&event, &reference).await,
                EventType::Normal => {
                    Recorder::new(client.clone(), reporter.clone())
                        .publish(&event, &reference)
                        .await
                }
            };
            if let Err(e) = published {
                warn!(error = %e, reason = event.reason, "could not publish event");
            }
        }
    });
    tx
}

/// What one reconcile changed, published as a single event when it ends: a new Memcached
/// gets one "Created Deployment …; Created Service …; …" event instead of one per child,
/// which saves the API server three writes per object.
#[derive(Default)]
struct Changes(Vec<Change>);

struct Change {
    reason: &'static str,
    action: String,
    note: String,
}

/// The API server rejects an event note longer than 1 KiB.
const EVENT_NOTE_MAX: usize = 1024;

impl Changes {
    fn push(&mut self, reason: &'static str, action: String, note: String) {
        self.0.push(Change {
            reason,
            action,
            note,
        });
    }

    /// One Normal event for everything in `self` (none if nothing changed). A single change
    /// keeps its own reason and action; several are reported under the first one's reason
    /// with the action `Reconcile`, their notes joined by "; ".
    fn into_event(self) -> Option<Event> {
        let reason = self.0.first()?.reason.to_string();
        let (action, notes): (Vec<String>, Vec<String>) =
            self.0.into_iter().map(|c| (c.action, c.note)).unzip();
        let action = match <[String; 1]>::try_from(action) {
            Ok([only]) => only,
            Err(_) => "Reconcile".to_string(),
        };
        Some(Event {
            type_: EventType::Normal,
            reason,
            note: Some(truncate(notes.join("; "), EVENT_NOTE_MAX)),
            action,
            secondary: None,
        })
    }
}

/// `text` cut to at most `max` bytes, on a character boundary, marked with "…" when cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

fn object_key(mc: &Memcached) -> String {
    format!("{}/{}", mc.namespace().unwrap_or_default(), mc.name_any())
}

/// `desired` with its hash annotation, and the hash.
fn with_hash<T: Resource + Serialize>(mut desired: T) -> (T, u64) {
    // The hash is computed without the annotation, then added, so it is stable.
    let hash = drift::desired_hash_value(&desired);
    desired
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            APPLIED_HASH_ANNOTATION.to_string(),
            drift::annotation_value(hash),
        );
    (desired, hash)
}

/// What an apply did, for events.
enum Applied<T> {
    Unchanged(Arc<T>),
    Created(T),
    Updated { before: Arc<T>, after: T },
}

/// The Memcached a child belongs to, as the normal forms are filed under.
struct Owner {
    object: ObjectRef<Memcached>,
    key: u64,
    uid: Option<String>,
}

impl Owner {
    fn of(mc: &Memcached) -> Self {
        let object = ObjectRef::from_obj(mc);
        let key = owner_key(&object);
        Owner {
            object,
            key,
            uid: mc.metadata.uid.clone(),
        }
    }

    /// The child's controller, when it is not this Memcached: `Kind name (uid …)`.
    fn other_controller<K: CacheForm>(&self, child: &K) -> Option<String> {
        let controller = child
            .meta_text()
            .owner_references()
            .into_iter()
            .find(|o| o.controller == Some(true))?;
        (Some(&controller.uid) != self.uid.as_ref()).then(|| {
            format!(
                "{} {} (uid {})",
                controller.kind, controller.name, controller.uid
            )
        })
    }
}

fn owner_key(mc: &ObjectRef<Memcached>) -> u64 {
    drift::key((mc.namespace.as_deref(), &mc.name))
}

fn child_key(kind: &str, name: &str) -> u64 {
    drift::key((kind, name))
}

/// Whether `have` (the live child) holds what applying `want` (its desired state, hashed as
/// `hash`) would store, so that applying it would change nothing. The server decides what it
/// stores: the desired state's normal form is the one learned from the server's answer to
/// the last apply; when none was (after a restart), a desired state found verbatim in the
/// child needs none, and otherwise it is learned from `dry_run`, the server's answer to an
/// apply of `want` that stores nothing, but only when the child was last applied from this
/// same desired state (if not, it must be written anyway).
async fn converged<Fut>(
    ctx: &Context,
    owner: &Owner,
    child: u64,
    hash: u64,
    want: &Value,
    have: &Value,
    dry_run: impl FnOnce() -> Fut,
) -> bool
where
    Fut: Future<Output = Result<Option<Value>, kube::Error>>,
{
    if drift::is_converged(want, Some(have)) {
        return true;
    }
    if let Some(form) = ctx.normal_forms.get(owner.key, child, hash) {
        return form
            .of(want)
            .is_some_and(|normal| drift::is_converged(&normal, Some(have)));
    }
    if !drift::same_applied_hash(want, have) {
        return false;
    }
    match dry_run().await {
        Ok(Some(stored)) => {
            let form = NormalForm::learn(want, &stored);
            let normal = form.of(want);
            remember(ctx, owner, child, hash, form);
            normal.is_some_and(|normal| drift::is_converged(&normal, Some(have)))
        }
        Ok(None) => false,
        // A webhook with side effects refuses dry runs, for one: then the apply itself
        // tells (and is what a failure to reach the server is reported by).
        Err(e) => {
            debug!(error = %e, "dry-run apply failed; applying");
            false
        }
    }
}

/// Remembers the normal form of `child`'s desired state, unless its owner is gone or going
/// (its deletion may have been seen while this reconcile ran, and its forms forgotten).
fn remember(ctx: &Context, owner: &Owner, child: u64, hash: u64, form: NormalForm) {
    ctx.normal_forms.record(owner.key, child, hash, form);
    let gone = ctx
        .memcacheds
        .get(&owner.object)
        .is_none_or(|mc| mc.metadata.deletion_timestamp.is_some());
    if gone {
        ctx.normal_forms.forget_owner(owner.key);
    }
}

/// Learns the normal form of `want` from `stored`, the server's answer to applying it.
fn learn_from_answer(
    ctx: &Context,
    owner: &Owner,
    child: u64,
    hash: u64,
    want: Option<&Value>,
    stored: Option<Value>,
) {
    if let (Some(want), Some(stored)) = (want, stored) {
        remember(ctx, owner, child, hash, NormalForm::learn(want, &stored));
    }
}

/// [`apply_if_changed`] for a child that is not always wanted (`None`: nothing to apply).
async fn apply_if_wanted<C: CacheForm>(
    ctx: &Context,
    owner: &Owner,
    cache: &Store<C>,
    desired: Option<C::Full>,
    kind: &'static str,
) -> Result<Option<Applied<C>>, Error> {
    match desired {
        Some(desired) => apply_if_changed(ctx, owner, cache, desired, kind)
            .await
            .map(Some),
        None => Ok(None),
    }
}

async fn apply_if_changed<C: CacheForm>(
    ctx: &Context,
    owner: &Owner,
    cache: &Store<C>,
    desired: C::Full,
    kind: &'static str,
) -> Result<Applied<C>, Error> {
    let (desired, hash) = with_hash(desired);
    let name = desired.name_any();
    let namespace = desired.namespace().ok_or(Error::NoNamespace)?;
    let key = ObjectRef::new(&name).within(&namespace);
    let child = child_key(kind, &name);
    let live = cache.get(&key);
    // Never take over a child another controller owns (a field manager's apply would move
    // the ownerReference and the selector from one pool to the other on every reconcile).
    if let Some(controller) = live
        .as_ref()
        .and_then(|l| owner.other_controller(l.as_ref()))
    {
        return Err(Error::Conflict {
            kind,
            object: format!("{namespace}/{name}"),
            controller,
        });
    }
    // The answers are read straight into the cached form (only what the cache keeps).
    let api: Api<C> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let want = serde_json::to_value(&desired).ok();
    if let Some(live) = live.as_ref() {
        // This version of the child was compared with this desired state before: a resync
        // of a converged child costs one hash, not a JSON comparison.
        if live.verified().holds(hash) {
            return Ok(Applied::Unchanged(live.clone()));
        }
        ctx.config
            .counters
            .drift_checks
            .fetch_add(1, Ordering::Relaxed);
        if let (Some(want), Some(have)) = (want.as_ref(), live.live_json()) {
            let dry_run = || async {
                let stored = api
                    .patch(&name, &params.clone().dry_run(), &Patch::Apply(&desired))
                    .await?;
                Ok(stored.live_json())
            };
            if converged(ctx, owner, child, hash, want, &have, dry_run).await {
                live.verified().record(hash);
                return Ok(Applied::Unchanged(live.clone()));
            }
        }
    }
    let after = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|source| apply_error(kind, &namespace, &name, source))?;
    learn_from_answer(ctx, owner, child, hash, want.as_ref(), after.live_json());
    Ok(match live {
        None => Applied::Created(after),
        Some(before) => Applied::Updated { before, after },
    })
}

/// Index key of a pod: the Memcached it belongs to, as `namespace/instance`.
fn pod_index_key(pod: &CachedPod) -> Option<String> {
    Some(format!(
        "{}/{}",
        pod.metadata.namespace.as_deref()?,
        pod.instance.as_deref()?
    ))
}

/// The live pods of `mc` in the pod cache: neither being deleted nor ended (a Failed or
/// evicted pod stays until garbage-collected, but serves nothing).
fn observed_pods(pods: &Index<CachedPod>, namespace: &str, name: &str) -> Vec<ObservedPod> {
    pods.get(&format!("{namespace}/{name}"))
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !p.ended)
        .map(|p| ObservedPod {
            name: p.name_any(),
            ip: p.ip.clone(),
            ready: p.ready,
        })
        .collect()
}

/// Pods of `name` whose TLS reload agent reported renewed files it could not load, sorted
/// by name; none when the certificate is not reloaded in place.
fn reload_failures(
    mc: &Memcached,
    pods: &Index<CachedPod>,
    namespace: &str,
    name: &str,
) -> Vec<ReloadFailure> {
    if !mc.spec.tls_reloads_in_place() {
        return Vec::new();
    }
    let mut failed: Vec<_> = pods
        .get(&format!("{namespace}/{name}"))
        .iter()
        .filter(|p| !p.ended)
        .filter_map(|p| {
            let (code, reason) = p.tls_reload_failure.clone()?;
            Some(ReloadFailure {
                pod: p.name_any(),
                restart: code == builders::TLS_AGENT_RELOAD_FAILED,
                reason,
            })
        })
        .collect();
    failed.sort();
    failed
}

/// A Warning event about `mc` naming the pod of `failure` as its related object: warnings
/// repeat as a series per (object, reason, related), so each pod's failure keeps its note.
fn publish_reload_failure(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
    failure: &ReloadFailure,
    reason: &str,
    action: &str,
    note: String,
) {
    ctx.publish_event(
        mc,
        Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(truncate(note, EVENT_NOTE_MAX)),
            action: action.to_string(),
            secondary: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Pod".to_string()),
                name: Some(failure.pod.clone()),
                namespace: Some(namespace.to_string()),
                ..ObjectReference::default()
            }),
        },
    );
}

/// Restarts the first pod whose memcached refused its renewed certificate, after the
/// status has named it, and only while the rest of the pool is whole: no pod of the pool
/// is being deleted (a replacement, a drain, an eviction), the pool has `size` pods, and
/// every pod that reported no failure is Ready. So pods are restarted one at a time, each
/// after the previous one's replacement serves, and files memcached cannot load at all
/// (whose replacement pods never start) cost one pod, not the pool. The pod is deleted
/// with its uid as a precondition (a pod of that name made since is left alone); its
/// Deployment makes a new one, which loads the certificate as memcached starts.
async fn restart_failed_reload(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
    failures: &[ReloadFailure],
) -> Result<(), Error> {
    let Some(failure) = failures.iter().find(|f| f.restart) else {
        return Ok(());
    };
    let pods = ctx.pod_index.get(&format!("{namespace}/{}", mc.name_any()));
    let live: Vec<_> = pods.iter().filter(|p| !p.ended).collect();
    let deleting = live.iter().any(|p| p.metadata.deletion_timestamp.is_some());
    let others_ready = live
        .iter()
        .filter(|p| !failures.iter().any(|f| f.pod == p.name_any()))
        .all(|p| p.ready);
    let whole = i32::try_from(live.len()).unwrap_or(i32::MAX) >= mc.spec.size;
    if deleting || !others_ready || !whole {
        return Ok(());
    }
    let pod = &failure.pod;
    let reason = &failure.reason;
    let Some(uid) = live
        .iter()
        .find(|p| p.name_any() == *pod)
        .and_then(|p| p.metadata.uid.clone())
    else {
        return Ok(());
    };
    let note = format!(
        "Pod {pod} could not load the renewed TLS certificate ({reason}); restarting it so memcached loads it as it starts"
    );
    warn!(object = %object_key(mc), pod, reason, "TLS certificate reload failed: restarting the pod");
    publish_reload_failure(
        ctx,
        mc,
        namespace,
        failure,
        "CertificateReloadFailed",
        "RestartPod",
        note,
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(pod, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or another pod of that name now.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: "Pod".into(),
            object: format!("{namespace}/{pod}"),
            source,
        }),
    }
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
        reload_failures: reload_failures(mc, &ctx.pod_index, &namespace, &name),
    };
    let status = status::desired_status(mc, &observed, jiff::Timestamp::now());
    write_status_if_changed(&ctx.client, mc, status).await
}

/// Reconciles one Memcached: idempotent, level-triggered, reads from the caches.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _running = ctx.busy.enter();
    let key = ObjectRef::from_obj(mc.as_ref());
    let telemetry = ctx.config.telemetry.as_ref();
    let timer = telemetry.map(|t| {
        t.started(&key);
        // Counting the cache copies it, so the gauge is refreshed at most once a second.
        if t.instances_due() {
            let scope = ctx.config.namespace.as_deref().unwrap_or("");
            t.set_instances(scope, ctx.memcacheds.state().len());
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
        ctx.publish_event(&mc, event);
    }
    drop(timer);
    counters.finish(&key, result.is_err());
    if let Some(t) = telemetry {
        t.controller.record_result(match &result {
            Err(_) => ReconcileResult::Error,
            Ok(action) if *action == Action::await_change() => ReconcileResult::Success,
            Ok(_) => ReconcileResult::RequeueAfter,
        });
    }
    match &result {
        Ok(_) => ctx.reset_failures(&key),
        Err(err) => {
            // Best effort: surface the failure on the object itself, unless writing the
            // status is what failed.
            // A child Kubernetes refuses is the spec's problem, reported as the
            // webhook's rules are.
            let reason = match err {
                Error::Refused { .. } => "InvalidSpec",
                _ => "ReconcileFailed",
            };
            if !matches!(err, Error::Status { .. }) {
                let problem = Problem {
                    reason: reason.into(),
                    message: err.to_string(),
                };
                if let Err(e) = record_problem(&ctx, &mc, problem).await {
                    debug!(error = %e, "could not record the failure in status");
                }
            }
            ctx.publish(
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
) -> Result<Action, Error> {
    let owner = Owner::of(mc);
    if mc.metadata.deletion_timestamp.is_some() {
        // Owned objects go with the CR through ownerReference garbage collection.
        ctx.normal_forms.forget_owner(owner.key);
        return Ok(Action::await_change());
    }
    let namespace = mc.namespace().ok_or(Error::NoNamespace)?;
    let name = mc.name_any();
    let object = format!("{namespace}/{name}");

    if let Err(errors) = validation::validate(mc) {
        let message = errors.to_string();
        warn!(object, %message, "invalid Memcached: not creating children");
        let problem = Problem {
            reason: "InvalidSpec".into(),
            message: message.clone(),
        };
        if record_problem(ctx, mc, problem).await? {
            ctx.publish(mc, EventType::Warning, "InvalidSpec", "Validate", message);
        }
        // Retrying cannot help: wait for the user to change the object.
        return Ok(Action::await_change());
    }

    // The Secrets the pods mount must exist before the pods are rolled to use them; a
    // missing one is reported, and the running pods are left as they are.
    let secrets = match referenced_secrets(ctx, mc, &namespace).await? {
        Ok(versions) => versions,
        Err(problem) => {
            warn!(object, message = %problem.message, "referenced Secret unusable");
            if record_problem(ctx, mc, problem.clone()).await? {
                ctx.publish(
                    mc,
                    EventType::Warning,
                    &problem.reason,
                    "ReadSecret",
                    problem.message,
                );
            }
            // Secrets are not watched (that would cache every Secret of the namespace), so
            // look again soon.
            return Ok(Action::requeue(ctx.config.secret_recheck));
        }
    };

    let build = |kind: &'static str| {
        let object = object.clone();
        move |source| Error::Build {
            kind,
            object,
            source,
        }
    };
    let desired = builders::desired_deployment_with(mc, &ctx.config.build, &secrets)
        .map_err(build("Deployment"))?;
    let want_replicas = desired.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let service = builders::desired_service(mc).map_err(build("Service"))?;
    let headless = builders::desired_headless_service(mc).map_err(build("Service"))?;
    let pdb = builders::desired_pdb(mc).map_err(build("PodDisruptionBudget"))?;

    // The children do not depend on each other: they are applied at once, so a new
    // Memcached waits for one round trip instead of four. Whatever succeeded is reported
    // even if another failed; the first failure is returned.
    let (deployment, service, headless, pdb) = futures::join!(
        apply_if_changed(ctx, &owner, &ctx.deployments, desired, "Deployment"),
        apply_if_changed(ctx, &owner, &ctx.services, service, "Service"),
        apply_if_changed(ctx, &owner, &ctx.services, headless, "Service"),
        apply_if_wanted(ctx, &owner, &ctx.pdbs, pdb, "PodDisruptionBudget"),
    );
    let deployment = deployment.map(|applied| match applied {
        Applied::Unchanged(live) => live,
        Applied::Created(after) => {
            info!(object, replicas = want_replicas, "created Deployment");
            changes.push(
                "Created",
                "CreateDeployment".into(),
                format!("Created Deployment {name} with {want_replicas} replicas"),
            );
            Arc::new(after)
        }
        Applied::Updated { before, after } => {
            let had = before.replicas.unwrap_or(1);
            if had != want_replicas {
                info!(object, from = had, to = want_replicas, "scaled Deployment");
                changes.push(
                    "Scaled",
                    "ScaleDeployment".into(),
                    format!("Scaled Deployment {name} from {had} to {want_replicas} replicas"),
                );
            } else {
                info!(object, "updated Deployment");
                changes.push(
                    "Updated",
                    "UpdateDeployment".into(),
                    format!("Updated Deployment {name} to the desired spec"),
                );
            }
            Arc::new(after)
        }
    });
    for applied in [&service, &headless].into_iter().flatten() {
        report_child(changes, mc, "Service", applied);
    }
    if let Ok(Some(applied)) = &pdb {
        report_child(changes, mc, "PodDisruptionBudget", applied);
    }
    let deployment = deployment?;
    service?;
    headless?;
    if pdb?.is_none() {
        delete_if_cached(ctx, changes, mc, &ctx.pdbs, &name).await?;
    }

    reconcile_service_monitor(ctx, changes, mc, &owner, &namespace, &name).await?;
    let pods = observed_pods(&ctx.pod_index, &namespace, &name);
    let failures = reload_failures(mc, &ctx.pod_index, &namespace, &name);
    let proxy = reconcile_proxy(ctx, changes, mc, &owner, &namespace, &name, &pods).await?;
    let proxy_deployment = proxy
        .as_ref()
        .and_then(|p| p.deployment.as_ref())
        .map(|d| d.without_spec());
    let deployment = deployment.without_spec();
    let observed = Observed {
        deployment: Some(&deployment),
        pods,
        problem: None,
        proxy: proxy.map(|p| ObservedProxy {
            deployment: proxy_deployment.as_ref(),
            backends: p.backends,
            version: p.version,
        }),
        reload_failures: failures.clone(),
    };
    let now = jiff::Timestamp::now();
    let status = status::desired_status(mc, &observed, now);
    let recheck = proxy_recheck(&status, now);
    if write_status_if_changed(&ctx.client, mc, status).await? {
        debug!(object, "status updated");
        // Files the agent refused itself: reported when the status first says so; the pod
        // keeps serving the certificate it has.
        for failure in failures.iter().filter(|f| !f.restart) {
            publish_reload_failure(
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
    // Reported in the status first (above), then restarted.
    restart_failed_reload(ctx, mc, &namespace, &failures).await?;
    Ok(Action::requeue(
        recheck.map_or(ctx.config.resync, |r| r.min(ctx.config.resync)),
    ))
}

/// When to look again so that `ProxyReady` leaves `Propagating` on time.
fn proxy_recheck(status: &MemcachedStatus, now: jiff::Timestamp) -> Option<Duration> {
    let since = status.proxy.as_ref()?.config_changed_at.as_ref()?.0;
    let elapsed = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    proxy::PROPAGATION_WINDOW
        .checked_sub(elapsed)
        .map(|left| left + Duration::from_secs(1))
}

/// The proxy as [`reconcile_proxy`] left it.
struct ReconciledProxy {
    deployment: Option<Arc<CachedDeployment>>,
    backends: Vec<memcached_api::ProxyBackend>,
    version: String,
}

/// Applies the proxy's ConfigMap (routes to the Ready pods of `pods`), Deployment,
/// Service and budget when `spec.proxy.enabled`; deletes ours when it is not.
async fn reconcile_proxy(
    ctx: &Context,
    changes: &mut Changes,
    mc: &Memcached,
    owner: &Owner,
    namespace: &str,
    name: &str,
    pods: &[ObservedPod],
) -> Result<Option<ReconciledProxy>, Error> {
    let proxy_name = proxy::proxy_name(name);
    let Some(spec) = mc.spec.proxy_enabled() else {
        delete_if_cached(ctx, changes, mc, &ctx.deployments, &proxy_name).await?;
        delete_if_cached(ctx, changes, mc, &ctx.services, &proxy_name).await?;
        delete_if_cached(ctx, changes, mc, &ctx.pdbs, &proxy_name).await?;
        delete_if_cached(ctx, changes, mc, &ctx.config_maps, &proxy_name).await?;
        return Ok(None);
    };
    let object = format!("{namespace}/{name}");
    let build = |kind: &'static str| {
        let object = object.clone();
        move |source| Error::Build {
            kind,
            object,
            source,
        }
    };
    // Each pod stays in the copy the configuration in place gives it.
    let previous = ctx
        .config_maps
        .get(&ObjectRef::new(&proxy_name).within(namespace))
        .filter(|cm| owner.other_controller(cm.as_ref()).is_none())
        .map(|cm| proxy::recorded_backends(cm.spec_json()))
        .unwrap_or_default();
    let ready: Vec<proxy::ReadyPod> = pods
        .iter()
        .filter(|p| p.ready)
        .filter_map(|p| {
            Some(proxy::ReadyPod {
                name: p.name.clone(),
                ip: p.ip.clone()?,
            })
        })
        .collect();
    let backends = proxy::assign(&previous, &ready, spec.copies, mc.spec.container_port);
    let (config_map, version) = proxy::desired_proxy_config_map(mc, &backends)
        .map_err(build("ConfigMap"))?
        .ok_or(Error::NoNamespace)?;
    let deployment =
        proxy::desired_proxy_deployment(mc, &ctx.config.build).map_err(build("Deployment"))?;
    let service = proxy::desired_proxy_service(mc).map_err(build("Service"))?;
    let pdb = proxy::desired_proxy_pdb(mc).map_err(build("PodDisruptionBudget"))?;
    let (config_map, deployment, service, pdb) = futures::join!(
        apply_if_changed(ctx, owner, &ctx.config_maps, config_map, "ConfigMap"),
        apply_if_wanted(ctx, owner, &ctx.deployments, deployment, PROXY_DEPLOYMENT),
        apply_if_wanted(ctx, owner, &ctx.services, service, "Service"),
        apply_if_wanted(ctx, owner, &ctx.pdbs, pdb, "PodDisruptionBudget"),
    );
    if let Ok(applied) = &config_map {
        report_child(changes, mc, "ConfigMap", applied);
    }
    if let Ok(Some(applied)) = &deployment {
        report_child(changes, mc, "Deployment", applied);
    }
    if let Ok(Some(applied)) = &service {
        report_child(changes, mc, "Service", applied);
    }
    if let Ok(Some(applied)) = &pdb {
        report_child(changes, mc, "PodDisruptionBudget", applied);
    }
    config_map?;
    let deployment = deployment?.map(|applied| match applied {
        Applied::Unchanged(live) => live,
        Applied::Created(after) | Applied::Updated { after, .. } => Arc::new(after),
    });
    service?;
    if pdb?.is_none() {
        delete_if_cached(ctx, changes, mc, &ctx.pdbs, &proxy_name).await?;
    }
    Ok(Some(ReconciledProxy {
        deployment,
        backends,
        version,
    }))
}

/// The kind label of the proxy's Deployment in errors and in the children check's table
/// of where each field of the Memcached lands.
pub const PROXY_DEPLOYMENT: &str = "proxy Deployment";

/// How long the answer to "is the Prometheus Operator installed?" is trusted.
const DISCOVERY_TTL: Duration = Duration::from_secs(60);

/// Reads the SASL and TLS Secrets `mc` references. `Ok(Err(problem))` when one is missing
/// or lacks a key; `Err` only for API errors other than NotFound.
async fn referenced_secrets(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
) -> Result<Result<SecretVersions, Problem>, Error> {
    let mut versions = SecretVersions::default();
    let wanted = [
        (
            "spec.sasl.secretName",
            mc.spec.sasl.as_ref().map(|s| s.secret_name.as_str()),
            &[builders::SASL_PWDB_KEY][..],
        ),
        (
            "spec.tls.secretName",
            mc.spec.tls.as_ref().map(|t| t.secret_name.as_str()),
            &["tls.crt", "tls.key"][..],
        ),
    ];
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    for (i, (field, secret, keys)) in wanted.into_iter().enumerate() {
        let Some(secret) = secret else { continue };
        let found = api.get_opt(secret).await.map_err(|source| Error::Apply {
            kind: "Secret",
            object: format!("{namespace}/{secret}"),
            source,
        })?;
        let Some(found) = found else {
            return Ok(Err(Problem {
                reason: "SecretNotFound".into(),
                message: format!(
                    "Secret \"{secret}\" ({field}) not found in namespace {namespace}"
                ),
            }));
        };
        let data = found.data.as_ref();
        if let Some(key) = keys
            .iter()
            .find(|k| data.is_none_or(|d| !d.contains_key(**k)))
        {
            return Ok(Err(Problem {
                reason: "SecretInvalid".into(),
                message: format!("Secret \"{secret}\" ({field}) has no key \"{key}\""),
            }));
        }
        let version = data.map(|d| {
            builders::secret_digest(
                keys.iter()
                    .map(|k| (*k, d.get(*k).map(|v| v.0.as_slice()).unwrap_or_default())),
            )
        });
        if i == 0 {
            versions.sasl = version;
        } else {
            versions.tls = version;
        }
    }
    Ok(Ok(versions))
}

/// Logs and notes for the reconcile's event a child that was created or updated.
fn report_child<T: Resource>(
    changes: &mut Changes,
    mc: &Memcached,
    kind: &str,
    applied: &Applied<T>,
) {
    let (reason, verb, child) = match applied {
        Applied::Unchanged(_) => return,
        Applied::Created(after) => ("Created", "Created", after.meta().name.clone()),
        Applied::Updated { after, .. } => ("Updated", "Updated", after.meta().name.clone()),
    };
    let child = child.unwrap_or_default();
    info!(object = %object_key(mc), kind, child, "{} {kind}", verb.to_lowercase());
    let note = match applied {
        Applied::Updated { .. } => format!("{verb} {kind} {child} to the desired spec"),
        _ => format!("{verb} {kind} {child}"),
    };
    // Actions are imperative, as in `CreateDeployment`.
    let action = verb.trim_end_matches('d');
    changes.push(reason, format!("{action}{kind}"), note);
}

/// Deletes our child `name` of kind `K` if the cache has it (so a resync costs no call).
async fn delete_if_cached<C: CacheForm>(
    ctx: &Context,
    changes: &mut Changes,
    mc: &Memcached,
    cache: &Store<C>,
    name: &str,
) -> Result<(), Error> {
    let namespace = mc.namespace().ok_or(Error::NoNamespace)?;
    let Some(cached) = cache.get(&ObjectRef::new(name).within(&namespace)) else {
        return Ok(());
    };
    let owner = Owner::of(mc);
    // Only ours, and only the version we saw: not another pool's object of the same name,
    // nor one recreated meanwhile.
    if owner.other_controller(cached.as_ref()).is_some() {
        return Ok(());
    }
    let api: Api<C::Full> = Api::namespaced(ctx.client.clone(), &namespace);
    let kind = C::kind(&()).into_owned();
    ctx.normal_forms
        .forget_child(owner.key, child_key(&kind, name));
    let params = DeleteParams {
        preconditions: cached
            .meta()
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            info!(object = %object_key(mc), kind, name, "deleted");
            changes.push(
                "Deleted",
                format!("Delete{kind}"),
                format!("Deleted {kind} {name}: no longer needed"),
            );
            Ok(())
        }
        // Gone already, or replaced by another object of that name since we saw it (the
        // uid precondition failed): the next reconcile sees what is there now.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind,
            object: format!("{namespace}/{name}"),
            source,
        }),
    }
}

/// Whether the API server serves ServiceMonitors (the Prometheus Operator is installed),
/// asked at most once per [`DISCOVERY_TTL`].
async fn service_monitors_served(ctx: &Context) -> bool {
    let mut cached = ctx.service_monitors.lock().await;
    if let Some((at, served)) = *cached
        && at.elapsed() < DISCOVERY_TTL
    {
        return served;
    }
    let served = match ctx
        .client
        .list_api_group_resources("monitoring.coreos.com/v1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.name == "servicemonitors"),
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            debug!(error = %e, "could not ask whether ServiceMonitors are served");
            false
        }
    };
    *cached = Some((std::time::Instant::now(), served));
    served
}

/// A failed apply of the child `kind` `namespace/name`: [`Error::Refused`] on the
/// Memcached's fields when the API server says the object is wrong, else [`Error::Apply`].
fn apply_error(kind: &'static str, namespace: &str, name: &str, source: kube::Error) -> Error {
    if let kube::Error::Api(status) = &source
        && let Some(errors) = children_check::refusal(kind, name, status)
    {
        return Error::Refused {
            kind,
            object: format!("{namespace}/{name}"),
            errors,
        };
    }
    Error::Apply {
        kind,
        object: format!("{namespace}/{name}"),
        source,
    }
}

/// Applies the ServiceMonitor when the exporter runs and the Prometheus Operator is
/// installed; deletes ours when the exporter is switched off.
async fn reconcile_service_monitor(
    ctx: &Context,
    changes: &mut Changes,
    mc: &Memcached,
    owner: &Owner,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
    if !service_monitors_served(ctx).await {
        return Ok(());
    }
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &builders::service_monitor_resource(),
    );
    let err = |source| Error::Apply {
        kind: "ServiceMonitor",
        object: format!("{namespace}/{name}"),
        source,
    };
    let desired = builders::desired_service_monitor(mc).map_err(|source| Error::Build {
        kind: "ServiceMonitor",
        object: format!("{namespace}/{name}"),
        source,
    })?;
    let live = api.get_opt(name).await.map_err(err)?;
    let ours = live.as_ref().is_some_and(|l| {
        l.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(&o.uid) == mc.metadata.uid.as_ref())
    });
    let child = child_key("ServiceMonitor", name);
    match desired {
        Some(mut desired) => {
            let hash = drift::desired_hash_value(&desired);
            desired["metadata"]["annotations"] =
                serde_json::json!({ APPLIED_HASH_ANNOTATION: drift::annotation_value(hash) });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            if let Some(have) = live.as_ref().and_then(|l| serde_json::to_value(l).ok()) {
                let dry_run = || async {
                    let stored = api
                        .patch(name, &params.clone().dry_run(), &Patch::Apply(&desired))
                        .await?;
                    Ok(serde_json::to_value(stored).ok())
                };
                if converged(ctx, owner, child, hash, &desired, &have, dry_run).await {
                    return Ok(());
                }
            }
            let stored = api
                .patch(name, &params, &Patch::Apply(&desired))
                .await
                .map_err(|source| apply_error("ServiceMonitor", namespace, name, source))?;
            let stored = serde_json::to_value(stored).ok();
            learn_from_answer(ctx, owner, child, hash, Some(&desired), stored);
            let verb = if live.is_some() { "Updated" } else { "Created" };
            changes.push(
                verb,
                format!("{}ServiceMonitor", verb.trim_end_matches('d')),
                format!("{verb} ServiceMonitor {name}"),
            );
        }
        None if ours => {
            ctx.normal_forms.forget_child(owner.key, child);
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => return Err(err(source)),
            }
        }
        None => {}
    }
    Ok(())
}

/// Retry a failed object with per-object exponential backoff.
pub fn error_policy(mc: Arc<Memcached>, err: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.record_failure(ObjectRef::from_obj(mc.as_ref()));
    if let Some(t) = &ctx.config.telemetry {
        t.controller.queue_retry();
    }
    let delay = ctx.config.backoff.delay(failures);
    warn!(object = %object_key(&mc), error = %err, failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Maps one of our pods to the Memcached that owns it (by its instance label).
fn pod_owner(pod: &CachedPod) -> Option<ObjectRef<Memcached>> {
    let instance = pod.instance.as_deref()?;
    Some(ObjectRef::new(instance).within(pod.metadata.namespace.as_deref()?))
}

/// Maps an owned child to the Memcached named in its controller ownerReference.
fn controller_owner<K: CacheForm>(child: &K) -> Option<ObjectRef<Memcached>> {
    let owner = child
        .meta_text()
        .owner_references()
        .into_iter()
        .find(|o| o.controller == Some(true) && o.kind == "Memcached")?;
    if owner.api_version != Memcached::api_version(&()) {
        return None;
    }
    Some(ObjectRef::new(&owner.name).within(child.namespace().as_deref()?))
}

/// Drops what the reconciler never reads, to keep the caches small.
fn slim<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// Hash of what the reconciler reads of an owned object's metadata: labels and
/// annotations (the drift check) and ownership. Deletion is seen by the classifier itself.
fn metadata_outcome<K: CacheForm>(obj: &K, hasher: &mut DefaultHasher) {
    obj.meta_text().hash(hasher);
}

/// A Deployment's or budget's metadata and spec (through its generation): a change is
/// drift.
fn spec_by_generation<K: CacheForm>(obj: &K) -> u64 {
    let mut h = DefaultHasher::new();
    metadata_outcome(obj, &mut h);
    obj.meta().generation.hash(&mut h);
    h.finish()
}

/// The Deployment status fields the Memcached's status is computed from.
fn deployment_status(d: &CachedDeployment) -> u64 {
    let mut h = DefaultHasher::new();
    if let Some(s) = &d.status {
        (
            s.observed_generation,
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
        )
            .hash(&mut h);
    }
    h.finish()
}

/// A Service's metadata and spec, or a ConfigMap's metadata and data (neither kind has a
/// generation).
fn service_spec<K>(s: &crate::cached::SpecOnly<K>) -> u64
where
    crate::cached::SpecOnly<K>: CacheForm,
{
    let mut h = DefaultHasher::new();
    metadata_outcome(s, &mut h);
    s.spec_json().hash(&mut h);
    h.finish()
}

/// Status the reconciler never reads (a Service's load balancer, a budget's disruption
/// counts): no change to it triggers anything.
fn unread_status<K>(_: &K) -> u64 {
    0
}

/// A pod's instance label decides which Memcached it counts for.
fn pod_spec(p: &CachedPod) -> u64 {
    let mut h = DefaultHasher::new();
    p.instance.hash(&mut h);
    h.finish()
}

/// What `status.nodes` and `status.endpoints` are made of besides the name: the pod's IP
/// and readiness (not restarts, container states or other conditions), and a reload the TLS
/// agent reported as refused.
fn pod_status(p: &CachedPod) -> u64 {
    let mut h = DefaultHasher::new();
    (&p.ip, p.ready, &p.tls_reload_failure).hash(&mut h);
    h.finish()
}

/// The owners to wake for changes in `children`, with how soon (see [`crate::triggers`]).
fn owner_triggers<K>(
    children: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    mut classifier: Classifier<K>,
    owner: fn(&K) -> Option<ObjectRef<Memcached>>,
) -> BoxStream<'static, (ObjectRef<Memcached>, Urgency)>
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    children
        .filter_map(move |child| {
            let trigger = child.ok().and_then(|child| {
                let urgency = classifier.classify(&child)?;
                Some((owner(&child)?, urgency))
            });
            futures::future::ready(trigger)
        })
        .boxed()
}

/// The informers the controller reads from, for one scope (a namespace or the cluster).
/// They run whether or not this process leads, so a standby takes over with a warm cache.
pub struct Caches {
    pub memcacheds: Informer<Memcached>,
    pub deployments: Informer<CachedDeployment>,
    pub services: Informer<CachedService>,
    pub pdbs: Informer<CachedPdb>,
    pub config_maps: Informer<CachedConfigMap>,
    pub pods: Informer<CachedPod>,
    /// The pod cache by `namespace/instance` (the pods of one Memcached).
    pub pod_index: Index<CachedPod>,
}

impl Caches {
    /// Starts watching `namespace` (`None`: all namespaces). Owned kinds are label-selected
    /// (`app.kubernetes.io/managed-by=memcached-operator`), so the cache holds only ours.
    pub fn start(client: &Client, namespace: Option<&str>) -> Self {
        let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
        let (pods, pod_index) = Informer::start_indexed(
            scoped(client, namespace),
            owned.clone(),
            slim,
            pod_index_key,
        );
        Self {
            memcacheds: Informer::start(
                scoped(client, namespace),
                watcher::Config::default(),
                slim,
            ),
            deployments: Informer::start(scoped(client, namespace), owned.clone(), slim),
            services: Informer::start(scoped(client, namespace), owned.clone(), slim),
            pdbs: Informer::start(scoped(client, namespace), owned.clone(), slim),
            config_maps: Informer::start(scoped(client, namespace), owned.clone(), slim),
            pods,
            pod_index,
        }
    }

    /// Waits until every informer has cached its first full list.
    pub async fn wait_synced(&self) {
        futures::join!(
            self.memcacheds.wait_synced(),
            self.deployments.wait_synced(),
            self.services.wait_synced(),
            self.pdbs.wait_synced(),
            self.config_maps.wait_synced(),
            self.pods.wait_synced()
        );
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
    if let Some(t) = &telemetry {
        t.controller
            .set_max_concurrent(i64::from(config.concurrency));
    }
    let queued = move |key: Option<ObjectRef<Memcached>>| {
        if let (Some(t), Some(key)) = (&telemetry, key.clone()) {
            t.queued(key);
        }
        key
    };
    let q1 = queued.clone();
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
                forms.forget_owner(owner_key(&ObjectRef::from_obj(mc)));
            }
        })
        // Status writes (ours included) and metadata-only edits do not change the outcome.
        .predicate_filter(predicates::generation, Default::default())
        .inspect(move |mc| {
            if let Ok(mc) = mc {
                q1(Some(ObjectRef::from_obj(mc)));
            }
        });

    let reporter = Reporter {
        controller: MANAGED_BY.to_string(),
        instance: config.instance.clone(),
    };
    let busy = Busy::new(usize::from(config.concurrency));
    let ctx = Arc::new(Context {
        events: spawn_event_publisher(client.clone(), reporter, busy.clone()),
        client,
        memcacheds: caches.memcacheds.store(),
        deployments: caches.deployments.store(),
        services: caches.services.store(),
        pdbs: caches.pdbs.store(),
        config_maps: caches.config_maps.store(),
        pod_index: caches.pod_index.clone(),
        service_monitors: tokio::sync::Mutex::new(None),
        failures: Mutex::new(HashMap::new()),
        busy: busy.clone(),
        normal_forms,
        config: config.clone(),
    });

    // Owned objects trigger a reconcile only when something the reconciler reads changed
    // (status churn it never reads, such as a Service's load balancer status or a budget's
    // disruption counts, is filtered); edits and deletions at once, status moves batched.
    let children = futures::stream::select_all([
        owner_triggers(
            caches.deployments.subscribe(),
            Classifier::new(spec_by_generation, deployment_status),
            controller_owner,
        ),
        owner_triggers(
            caches.services.subscribe(),
            Classifier::new(service_spec, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.pdbs.subscribe(),
            Classifier::new(spec_by_generation, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.config_maps.subscribe(),
            Classifier::new(service_spec, unread_status),
            controller_owner,
        ),
        owner_triggers(
            caches.pods.subscribe(),
            Classifier::new(pod_spec, pod_status),
            pod_owner,
        ),
    ]);
    let children = triggers::batch(children, config.status_batch, Some(busy))
        .filter_map(move |key| futures::future::ready(queued(Some(key))));
    Controller::for_stream(memcacheds, caches.memcacheds.store())
        .reconcile_on(children)
        .with_config(ControllerRuntimeConfig::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(object = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile error"),
            }
        })
        .await;
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

    #[test]
    fn one_event_per_reconcile_names_every_change() {
        assert!(
            Changes::default().into_event().is_none(),
            "no change, no event"
        );

        let mut one = Changes::default();
        one.push(
            "Scaled",
            "ScaleDeployment".into(),
            "Scaled Deployment a from 1 to 2 replicas".into(),
        );
        let event = one.into_event().expect("an event");
        assert_eq!(
            (event.reason.as_str(), event.action.as_str()),
            ("Scaled", "ScaleDeployment")
        );

        let mut created = Changes::default();
        created.push(
            "Created",
            "CreateDeployment".into(),
            "Created Deployment a with 3 replicas".into(),
        );
        created.push(
            "Created",
            "CreateService".into(),
            "Created Service a".into(),
        );
        created.push(
            "Created",
            "CreatePodDisruptionBudget".into(),
            "Created PodDisruptionBudget a".into(),
        );
        let event = created.into_event().expect("an event");
        assert_eq!(event.reason, "Created");
        assert_eq!(event.action, "Reconcile");
        assert_eq!(
            event.note.as_deref(),
            Some(
                "Created Deployment a with 3 replicas; Created Service a; \
                 Created PodDisruptionBudget a"
            )
        );
    }

    #[test]
    fn event_notes_fit_the_api_limit_on_a_character_boundary() {
        let long = "é".repeat(EVENT_NOTE_MAX);
        let cut = truncate(long, EVENT_NOTE_MAX);
        assert!(cut.len() <= EVENT_NOTE_MAX, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short".into(), EVENT_NOTE_MAX), "short");
    }
}
