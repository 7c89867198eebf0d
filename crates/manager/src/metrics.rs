//! Prometheus metrics: one [`prometheus_client`] registry holding the metric families
//! controller-runtime exposes (same names and labels, so existing dashboards work),
//! `process_*` metrics read from `/proc/self` at scrape time, and room for controllers' own.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
pub const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

type OneLabel = [(&'static str, String); 1];
type TwoLabels = [(&'static str, String); 2];
type HistogramFamily = Family<OneLabel, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// Outcome of one reconcile, the `result` label of `controller_runtime_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    /// Reconciled, nothing requeued.
    Success,
    /// The reconciler returned an error (also counts `controller_runtime_reconcile_errors_total`).
    Error,
    /// Requeued at once (rate-limited).
    Requeue,
    /// Requeued after a fixed delay.
    RequeueAfter,
}

impl ReconcileResult {
    /// The label value controller-runtime uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }

    const ALL: [ReconcileResult; 4] = [
        ReconcileResult::Success,
        ReconcileResult::Error,
        ReconcileResult::Requeue,
        ReconcileResult::RequeueAfter,
    ];
}

#[derive(Debug)]
struct Inner {
    registry: RwLock<Registry>,
    reconcile_total: Family<TwoLabels, Counter>,
    reconcile_errors: Family<OneLabel, Counter>,
    reconcile_time: HistogramFamily,
    max_concurrent: Family<OneLabel, Gauge>,
    active_workers: Family<OneLabel, Gauge>,
    workqueue_depth: Family<OneLabel, Gauge>,
    workqueue_adds: Family<OneLabel, Counter>,
    workqueue_retries: Family<OneLabel, Counter>,
    leader_status: Family<OneLabel, Gauge>,
}

/// The process-wide metrics registry. Cheap to clone (an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the registry with all controller-runtime families and the process collector.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconcile_total = Family::<TwoLabels, Counter>::default();
        let reconcile_errors = Family::<OneLabel, Counter>::default();
        let reconcile_time: HistogramFamily =
            Family::new_with_constructor(reconcile_histogram as fn() -> Histogram);
        let max_concurrent = Family::<OneLabel, Gauge>::default();
        let active_workers = Family::<OneLabel, Gauge>::default();
        let workqueue_depth = Family::<OneLabel, Gauge>::default();
        let workqueue_adds = Family::<OneLabel, Counter>::default();
        let workqueue_retries = Family::<OneLabel, Counter>::default();
        let leader_status = Family::<OneLabel, Gauge>::default();

        // prometheus-client appends `_total` to counter names itself.
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active_workers.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            workqueue_depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            workqueue_adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            workqueue_retries.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease",
            leader_status.clone(),
        );
        registry.register_collector(Box::new(ProcessCollector::new()));

        Self {
            inner: Arc::new(Inner {
                registry: RwLock::new(registry),
                reconcile_total,
                reconcile_errors,
                reconcile_time,
                max_concurrent,
                active_workers,
                workqueue_depth,
                workqueue_adds,
                workqueue_retries,
                leader_status,
            }),
        }
    }

    /// Metrics of one controller (label `controller=<name>`; the work queue's `name`
    /// label is the controller name too, as in controller-runtime). Initialises the
    /// controller's series to 0 so they are exported before the first reconcile.
    pub fn controller(&self, name: &str) -> ControllerMetrics {
        let label: OneLabel = [("controller", name.to_string())];
        let queue_label: OneLabel = [("name", name.to_string())];
        let inner = &self.inner;
        for r in ReconcileResult::ALL {
            let _ = inner.reconcile_total.get_or_create(&[
                ("controller", name.to_string()),
                ("result", r.as_str().to_string()),
            ]);
        }
        let _ = inner.reconcile_errors.get_or_create(&label);
        let _ = inner.active_workers.get_or_create(&label);
        let _ = inner.max_concurrent.get_or_create(&label);
        let _ = inner.workqueue_depth.get_or_create(&queue_label);
        let _ = inner.workqueue_adds.get_or_create(&queue_label);
        let _ = inner.workqueue_retries.get_or_create(&queue_label);
        ControllerMetrics {
            inner: Arc::clone(&self.inner),
            label,
            queue_label,
        }
    }

    /// Sets `leader_election_master_status{name}` (1 while leading, 0 otherwise).
    pub fn set_leader(&self, lease_name: &str, leading: bool) {
        self.inner
            .leader_status
            .get_or_create(&[("name", lease_name.to_string())])
            .set(i64::from(leading));
    }

    /// Registers a controller's own metric family. As with [`Registry::register`],
    /// counters get `_total` appended to `name` on export.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry_mut().register(name, help, metric);
    }

    /// Registers a collector called at every scrape.
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry_mut().register_collector(collector);
    }

    /// Write access to the underlying registry (sub-registries, units, ...).
    /// Do not hold the guard across an `.await`.
    pub fn registry_mut(&self) -> RwLockWriteGuard<'_, Registry> {
        self.inner
            .registry
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.inner
            .registry
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Encodes every family in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry()) {
            tracing::error!(%err, "encoding metrics failed");
        }
        out
    }
}

/// Metrics of one controller; cheap to clone.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    inner: Arc<Inner>,
    label: OneLabel,
    queue_label: OneLabel,
}

impl ControllerMetrics {
    /// Marks a reconcile as started: `active_workers` +1 now, and when the returned
    /// timer is finished or dropped, -1 and the elapsed time goes into
    /// `controller_runtime_reconcile_time_seconds`.
    pub fn reconcile_started(&self) -> ReconcileTimer {
        self.inner.active_workers.get_or_create(&self.label).inc();
        ReconcileTimer {
            metrics: self.clone(),
            start: Instant::now(),
        }
    }

    /// Counts a reconcile outcome (errors also count in `..._reconcile_errors_total`).
    pub fn record_result(&self, result: ReconcileResult) {
        let labels: TwoLabels = [
            ("controller", self.label[0].1.clone()),
            ("result", result.as_str().to_string()),
        ];
        self.inner.reconcile_total.get_or_create(&labels).inc();
        if result == ReconcileResult::Error {
            self.inner.reconcile_errors.get_or_create(&self.label).inc();
        }
    }

    /// Counts an item added to the work queue.
    pub fn queue_add(&self) {
        self.inner
            .workqueue_adds
            .get_or_create(&self.queue_label)
            .inc();
    }

    /// Counts a rate-limited re-add (retry) to the work queue.
    pub fn queue_retry(&self) {
        self.inner
            .workqueue_retries
            .get_or_create(&self.queue_label)
            .inc();
    }

    /// Sets the current work queue depth.
    pub fn set_queue_depth(&self, depth: i64) {
        self.inner
            .workqueue_depth
            .get_or_create(&self.queue_label)
            .set(depth);
    }

    /// Sets the configured maximum of concurrent reconciles.
    pub fn set_max_concurrent(&self, max: i64) {
        self.inner
            .max_concurrent
            .get_or_create(&self.label)
            .set(max);
    }
}

/// Running reconcile; see [`ControllerMetrics::reconcile_started`].
#[derive(Debug)]
pub struct ReconcileTimer {
    metrics: ControllerMetrics,
    start: Instant,
}

impl ReconcileTimer {
    /// Ends the reconcile and returns its duration (same as dropping it).
    pub fn finish(self) -> Duration {
        self.start.elapsed()
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let m = &self.metrics;
        m.inner.active_workers.get_or_create(&m.label).dec();
        m.inner
            .reconcile_time
            .get_or_create(&m.label)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// Reads the standard `process_*` metrics from `/proc/self` at scrape time.
#[derive(Debug)]
struct ProcessCollector {
    start_time_seconds: Option<f64>,
}

/// Linux reports CPU times in USER_HZ, which is 100 on every supported platform
/// (the Go client's procfs assumes the same).
const USER_HZ: f64 = 100.0;

impl ProcessCollector {
    fn new() -> Self {
        Self {
            start_time_seconds: process_start_time(),
        }
    }
}

/// Fields of `/proc/self/stat` after the command name, 0-based from field 3 (`state`).
fn stat_fields() -> Option<Vec<String>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_string).collect())
}

fn process_start_time() -> Option<f64> {
    let fields = stat_fields()?;
    // field 22 (starttime) is index 19 counting from field 3.
    let start_ticks: f64 = fields.get(19)?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime + start_ticks / USER_HZ)
}

fn cpu_seconds() -> Option<f64> {
    let fields = stat_fields()?;
    // utime = field 14, stime = field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// A `kB` line of `/proc/self/status` (e.g. `VmRSS:`), in bytes.
fn status_bytes(field: &str) -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Soft limit of open files from `/proc/self/limits`.
fn max_fds() -> Option<i64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn open_fds() -> Option<i64> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count();
    i64::try_from(n).ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(v) = cpu_seconds() {
            let m = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        if let Some(v) = status_bytes("VmRSS:") {
            let m = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        if let Some(v) = self.start_time_seconds {
            let m = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        if let Some(v) = status_bytes("VmSize:") {
            let m = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        if let Some(v) = max_fds() {
            let m = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        if let Some(v) = open_fds() {
            let m = ConstGauge::new(v);
            let e = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    #[test]
    fn exposes_controller_runtime_names_and_labels() {
        let metrics = Metrics::new();
        let c = metrics.controller("memcached");
        c.set_max_concurrent(3);
        c.queue_add();
        c.queue_add();
        c.queue_retry();
        c.set_queue_depth(5);
        {
            let _t = c.reconcile_started();
            c.record_result(ReconcileResult::Success);
        }
        c.record_result(ReconcileResult::Error);
        c.record_result(ReconcileResult::RequeueAfter);
        metrics.set_leader("memcached-operator-lock", true);

        let text = metrics.encode();
        let expect = [
            (
                r#"controller_runtime_reconcile_total{controller="memcached",result="success"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_reconcile_total{controller="memcached",result="error"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_reconcile_total{controller="memcached",result="requeue"}"#,
                0.0,
            ),
            (
                r#"controller_runtime_reconcile_total{controller="memcached",result="requeue_after"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_reconcile_errors_total{controller="memcached"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_reconcile_time_seconds_count{controller="memcached"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_reconcile_time_seconds_bucket{le="60.0",controller="memcached"}"#,
                1.0,
            ),
            (
                r#"controller_runtime_max_concurrent_reconciles{controller="memcached"}"#,
                3.0,
            ),
            (
                r#"controller_runtime_active_workers{controller="memcached"}"#,
                0.0,
            ),
            (r#"workqueue_depth{name="memcached"}"#, 5.0),
            (r#"workqueue_adds_total{name="memcached"}"#, 2.0),
            (r#"workqueue_retries_total{name="memcached"}"#, 1.0),
            (
                r#"leader_election_master_status{name="memcached-operator-lock"}"#,
                1.0,
            ),
        ];
        for (series, value) in expect {
            assert_eq!(
                sample_value(&text, series),
                Some(value),
                "{series} in\n{text}"
            );
        }
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} in\n{text}"
            );
        }
        // No doubled suffixes.
        assert!(!text.contains("_total_total"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn histogram_uses_controller_runtime_buckets() {
        let metrics = Metrics::new();
        let c = metrics.controller("x");
        drop(c.reconcile_started());
        let text = metrics.encode();
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("controller_runtime_reconcile_time_seconds_bucket{"))
            .count();
        assert_eq!(buckets, RECONCILE_TIME_BUCKETS.len() + 1); // + le="+Inf"
    }

    #[test]
    fn active_workers_track_running_reconciles() {
        let metrics = Metrics::new();
        let c = metrics.controller("c");
        let series = r#"controller_runtime_active_workers{controller="c"}"#;
        let t1 = c.reconcile_started();
        let t2 = c.reconcile_started();
        assert_eq!(sample_value(&metrics.encode(), series), Some(2.0));
        t1.finish();
        assert_eq!(sample_value(&metrics.encode(), series), Some(1.0));
        drop(t2);
        assert_eq!(sample_value(&metrics.encode(), series), Some(0.0));
    }

    #[test]
    fn process_metrics_are_plausible() {
        let text = Metrics::new().encode();
        let start = sample_value(&text, "process_start_time_seconds").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start} vs {now}"
        );
        assert!(sample_value(&text, "process_resident_memory_bytes").unwrap() > 1_000_000.0);
        assert!(sample_value(&text, "process_open_fds").unwrap() >= 3.0);
        assert!(sample_value(&text, "process_max_fds").unwrap() >= 64.0);
        assert!(
            sample_value(&text, "process_virtual_memory_bytes").unwrap()
                >= sample_value(&text, "process_resident_memory_bytes").unwrap()
        );
    }

    #[test]
    fn controllers_can_register_their_own_families() {
        let metrics = Metrics::new();
        let c: Counter = Counter::default();
        metrics.register("memcached_pods_created", "Pods created", c.clone());
        c.inc();
        assert_eq!(
            sample_value(&metrics.encode(), "memcached_pods_created_total"),
            Some(1.0)
        );
    }
}
