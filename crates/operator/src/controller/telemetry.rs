//! What the controller counts about itself: reconciles, failures and concurrency
//! ([`ReconcileCounters`], read by tests and benchmarks), and its Prometheus metrics
//! ([`Telemetry`]: controller-runtime's families and the operator's own).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::reflector::ObjectRef;
use manager::ControllerMetrics;
use memcached_api::{Memcached, condition};
use prometheus_client::metrics::family::Family;
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
    /// `memcached_operator_pool_problem`: see [`Telemetry::set_problems`].
    problems: Family<ProblemLabels, Gauge>,
    /// The series of `problems` each pool has now (condition and reason; the namespace and
    /// name are the key's), to remove them when they clear. Not the labels themselves: at
    /// 10,000 new pools, each Ready and Available False until its pods are, a second copy
    /// of every series' labels was about 3 MB (`tests/decode_cost.rs`: 1,502 bytes a new
    /// pool against 1,212).
    problems_by_pool: Arc<Mutex<HashMap<ObjectRef<Memcached>, Vec<Problem>>>>,
    /// Keys waiting for a reconcile (the work queue's content, for `workqueue_depth`).
    /// Filed by a hash of the key (seeded per process), not a third copy of every queued
    /// key: a collision only undercounts the gauge.
    pending: Arc<Mutex<(HashSet<u64>, RandomState)>>,
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
        let problems = Family::<ProblemLabels, Gauge>::default();
        metrics.register(
            "memcached_operator_pool_problem",
            "1 for each condition of a Memcached in its unhealthy state (Ready, Available, \
             ProxyReady or CertificatesReloaded False; Degraded True), with its reason; a \
             healthy pool has no series",
            problems.clone(),
        );
        Self {
            controller: metrics.controller(CONTROLLER_NAME),
            managed_instances,
            problems,
            problems_by_pool: Arc::default(),
            pending: Arc::default(),
            instances_by_scope: Arc::default(),
            instances_at: Arc::default(),
        }
    }

    pub(super) fn queued(&self, key: &ObjectRef<Memcached>) {
        self.controller.queue_add();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let (keys, hasher) = &mut *pending;
        keys.insert(hasher.hash_one(key));
        self.controller.set_queue_depth(keys.len() as i64);
    }

    pub(super) fn started(&self, key: &ObjectRef<Memcached>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let (keys, hasher) = &mut *pending;
        keys.remove(&hasher.hash_one(key));
        self.controller.set_queue_depth(keys.len() as i64);
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

    /// The pool's series of `memcached_operator_pool_problem`, from the conditions of the
    /// status this reconcile computed (written now or paced: the conditions that change the
    /// meaning are never held), replacing its earlier ones.
    pub fn set_problems(&self, key: &ObjectRef<Memcached>, conditions: &[Condition]) {
        let now: Vec<Problem> = unhealthy(conditions)
            .map(|(condition, c)| (condition, c.reason.clone()))
            .collect();
        let mut by_pool = self
            .problems_by_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = if now.is_empty() {
            by_pool.remove(key).unwrap_or_default()
        } else {
            by_pool.insert(key.clone(), now.clone()).unwrap_or_default()
        };
        for gone in before.iter().filter(|p| !now.contains(p)) {
            self.problems.remove(&labels(key, gone));
        }
        for problem in &now {
            self.problems.get_or_create(&labels(key, problem)).set(1);
        }
    }

    /// Removes the series of pools for which `exists` is false (deleted ones: a deleted
    /// pool is not reconciled again).
    pub(super) fn prune_problems(&self, exists: impl Fn(&ObjectRef<Memcached>) -> bool) {
        let mut by_pool = self
            .problems_by_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        by_pool.retain(|key, problems| {
            let keep = exists(key);
            if !keep {
                for problem in problems.iter() {
                    self.problems.remove(&labels(key, problem));
                }
            }
            keep
        });
    }

    /// Removes every pool's series (the controller stopped: this replica no longer speaks
    /// for the pools, the next leader does).
    pub fn clear_problems(&self) {
        self.prune_problems(|_| false);
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

/// `namespace`, `memcached`, `condition`, `reason`.
type ProblemLabels = [(&'static str, String); 4];

/// A condition in its unhealthy state, and its reason.
type Problem = (&'static str, String);

/// The series of `pool`'s `problem`.
fn labels(pool: &ObjectRef<Memcached>, (condition, reason): &Problem) -> ProblemLabels {
    [
        ("namespace", pool.namespace.clone().unwrap_or_default()),
        ("memcached", pool.name.clone()),
        ("condition", condition.to_string()),
        ("reason", reason.clone()),
    ]
}

/// The conditions in their unhealthy state, each with its type.
fn unhealthy(conditions: &[Condition]) -> impl Iterator<Item = (&'static str, &Condition)> {
    conditions.iter().filter_map(|c| {
        let (type_, unhealthy) = match c.type_.as_str() {
            condition::DEGRADED => (condition::DEGRADED, "True"),
            condition::READY => (condition::READY, "False"),
            condition::AVAILABLE => (condition::AVAILABLE, "False"),
            condition::PROXY_READY => (condition::PROXY_READY, "False"),
            condition::CERTIFICATES_RELOADED => (condition::CERTIFICATES_RELOADED, "False"),
            _ => return None,
        };
        (c.status == unhealthy).then_some((type_, c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Default::default(),
            ),
            observed_generation: None,
        }
    }

    fn exposed(metrics: &manager::Metrics) -> Vec<String> {
        let mut lines: Vec<String> = metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("memcached_operator_pool_problem{"))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn a_pool_has_problem_series_while_unhealthy_and_none_once_healthy_or_gone() {
        let metrics = manager::Metrics::new();
        let t = Telemetry::register(&metrics);
        let a = ObjectRef::<Memcached>::new("a").within("ns");
        let b = ObjectRef::<Memcached>::new("b").within("ns");
        t.set_problems(
            &a,
            &[
                cond("Available", "False", "MinimumReplicasUnavailable"),
                cond("Progressing", "True", "Scaling"),
                cond("Degraded", "True", "SecretNotFound"),
                cond("Ready", "False", "Degraded"),
            ],
        );
        t.set_problems(&b, &[cond("Degraded", "True", "InvalidSpec")]);
        assert_eq!(
            exposed(&metrics),
            [
                r#"memcached_operator_pool_problem{namespace="ns",memcached="a",condition="Available",reason="MinimumReplicasUnavailable"} 1"#,
                r#"memcached_operator_pool_problem{namespace="ns",memcached="a",condition="Degraded",reason="SecretNotFound"} 1"#,
                r#"memcached_operator_pool_problem{namespace="ns",memcached="a",condition="Ready",reason="Degraded"} 1"#,
                r#"memcached_operator_pool_problem{namespace="ns",memcached="b",condition="Degraded",reason="InvalidSpec"} 1"#,
            ]
        );
        // The reason changes: the old series goes.
        t.set_problems(
            &a,
            &[
                cond("Available", "True", "MinimumReplicasAvailable"),
                cond("Degraded", "False", "AsExpected"),
                cond("Ready", "False", "Progressing"),
            ],
        );
        assert_eq!(
            exposed(&metrics),
            [
                r#"memcached_operator_pool_problem{namespace="ns",memcached="a",condition="Ready",reason="Progressing"} 1"#,
                r#"memcached_operator_pool_problem{namespace="ns",memcached="b",condition="Degraded",reason="InvalidSpec"} 1"#,
            ]
        );
        t.set_problems(&a, &[cond("Ready", "True", "Ready")]);
        t.prune_problems(|key| key != &b);
        assert!(exposed(&metrics).is_empty(), "{:?}", exposed(&metrics));
    }

    /// `workqueue_depth` counts each key waiting once, however often it was woken.
    #[test]
    fn the_queue_depth_counts_each_waiting_key_once() {
        let metrics = manager::Metrics::new();
        let t = Telemetry::register(&metrics);
        let depth = || -> Vec<String> {
            metrics
                .encode()
                .lines()
                .filter(|l| l.starts_with("workqueue_depth{"))
                .filter_map(|l| l.rsplit(' ').next().map(str::to_string))
                .collect()
        };
        let a = ObjectRef::<Memcached>::new("a").within("ns");
        let b = ObjectRef::<Memcached>::new("b").within("ns");
        t.queued(&a);
        t.queued(&a);
        t.queued(&b);
        assert_eq!(depth(), ["2"]);
        t.started(&a);
        assert_eq!(depth(), ["1"]);
        t.started(&a);
        t.started(&b);
        assert_eq!(depth(), ["0"]);
    }
}
