//! What the controller counts about itself: reconciles, failures and concurrency
//! ([`ReconcileCounters`], read by tests and benchmarks), and its Prometheus metrics
//! ([`Telemetry`]: controller-runtime's families and the operator's own).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use manager::ControllerMetrics;
use memcached_api::Memcached;
use prometheus_client::metrics::gauge::Gauge;

use super::CONTROLLER_NAME;

/// How many reconciles ran, how they ended, and how many ran at once.
#[derive(Debug, Default)]
pub struct ReconcileCounters {
    reconciles: AtomicU64,
    failures: AtomicU64,
    in_flight: Mutex<HashSet<ObjectRef<Memcached>>>,
    max_in_flight: AtomicU64,
    same_object_overlaps: AtomicU64,
    /// Children compared field by field with their desired state (see
    /// [`crate::cached::Verified`]).
    pub(super) drift_checks: AtomicU64,
    /// Reconciles started per object, when asked for ([`ReconcileCounters::per_object`]):
    /// lets a test tell which object a reconcile was for. Off by default, since it keeps
    /// an entry for every object ever reconciled.
    started_per_object: Option<Mutex<HashMap<ObjectRef<Memcached>, u64>>>,
}

impl ReconcileCounters {
    /// Counters that also count the reconciles started for each object
    /// ([`ReconcileCounters::started_for`]).
    pub fn per_object() -> Self {
        Self {
            started_per_object: Some(Mutex::default()),
            ..Self::default()
        }
    }

    /// Reconciles started for `key` (always 0 unless made with
    /// [`ReconcileCounters::per_object`]).
    pub fn started_for(&self, key: &ObjectRef<Memcached>) -> u64 {
        self.started_per_object.as_ref().map_or(0, |m| {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(key)
                .copied()
                .unwrap_or(0)
        })
    }

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

    pub(super) fn start(&self, key: &ObjectRef<Memcached>) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if !in_flight.insert(key.clone()) {
            self.same_object_overlaps.fetch_add(1, Ordering::Relaxed);
        }
        self.max_in_flight
            .fetch_max(in_flight.len() as u64, Ordering::Relaxed);
        if let Some(per_object) = &self.started_per_object {
            *per_object
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.clone())
                .or_default() += 1;
        }
    }

    pub(super) fn finish(&self, key: &ObjectRef<Memcached>, failed: bool) {
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

/// Prometheus metrics of the controller: controller-runtime's families (through
/// [`ControllerMetrics`]) and the operator's own.
#[derive(Clone, Debug)]
pub struct Telemetry {
    pub controller: ControllerMetrics,
    /// `memcached_operator_managed_instances`: Memcacheds in the cache, all scopes together.
    pub managed_instances: Gauge,
    /// Keys waiting for a reconcile (the work queue's content, for `workqueue_depth`).
    pending: Arc<Mutex<HashSet<ObjectRef<Memcached>>>>,
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

    pub(super) fn queued(&self, key: ObjectRef<Memcached>) {
        self.controller.queue_add();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.insert(key);
        self.controller.set_queue_depth(pending.len() as i64);
    }

    pub(super) fn started(&self, key: &ObjectRef<Memcached>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.remove(key);
        self.controller.set_queue_depth(pending.len() as i64);
    }

    pub(super) fn instances_due(&self) -> bool {
        let now = std::time::Instant::now();
        let mut last = self.instances_at.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            return false;
        }
        *last = Some(now);
        true
    }

    pub(super) fn set_instances(&self, scope: &str, count: usize) {
        let mut by_scope = self
            .instances_by_scope
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        by_scope.insert(scope.to_string(), count as i64);
        self.managed_instances.set(by_scope.values().sum());
    }
}
