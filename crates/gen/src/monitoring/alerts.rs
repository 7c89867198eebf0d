//! The alerts (a PrometheusRule): the memcached mixin's (grafana/jsonnet-libs
//! `memcached-mixin`: `MemcachedDown`, `MemcachedConnectionLimitApproaching` at 80 % and
//! 95 %, `MemcachedOutOfMemoryErrors`), then evictions, restarts, a low hit ratio, the
//! proxy, and the operator's own health.
//!
//! The memcached alerts read the exporter sidecar's metrics as the pool's ServiceMonitor
//! labels them (`namespace`, `service` = the Memcached's name, `pod`); the operator's read
//! its own (`memcached_operator_pool_problem`, controller-runtime's families). The
//! exporter v0.15.3 does not export the proxy's own statistics (`stats proxy`), so the
//! proxy's alert is the operator's `ProxyReady` condition: proxies not Ready, or not yet
//! loaded with the pool's current backends.
//!
//! Every threshold is a value ([`AlertThresholds`]): `config/prometheus` has the defaults,
//! the chart takes `prometheusRule.thresholds`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The thresholds of the alerts. Durations are Prometheus durations (`15m`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AlertThresholds {
    /// `MemcachedDown`: how long the exporter must report memcached down.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub down_for: String,
    /// `MemcachedConnectionLimitApproaching` (warning): connections in use, % of `-c`.
    #[schemars(range(min = 1, max = 100))]
    pub connections_warning_percent: u32,
    /// `MemcachedConnectionLimitApproaching` (critical): connections in use, % of `-c`.
    #[schemars(range(min = 1, max = 100))]
    pub connections_critical_percent: u32,
    /// `MemcachedConnectionLimitApproaching`: how long above the threshold.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub connections_for: String,
    /// `MemcachedOutOfMemoryErrors`: how long memcached must keep refusing items for want of
    /// memory.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub out_of_memory_for: String,
    /// `MemcachedEvictions`: evictions per second of a pod above which the pool is too small
    /// for what it holds.
    #[schemars(range(min = 0))]
    pub evictions_per_second: f64,
    /// `MemcachedEvictions`: how long above the rate.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub evictions_for: String,
    /// `MemcachedRestarted`: a memcached process that restarted within this window (its
    /// uptime went back; its cache started empty).
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub restart_window: String,
    /// `MemcachedHitRatioLow`: the pool's get hit ratio (0–1) below which it fires.
    #[schemars(range(min = 0, max = 1))]
    pub hit_ratio_min: f64,
    /// `MemcachedHitRatioLow`: only while the pool serves more gets per second than this.
    #[schemars(range(min = 0))]
    pub hit_ratio_min_gets_per_second: f64,
    /// `MemcachedHitRatioLow`: how long below the ratio.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub hit_ratio_for: String,
    /// `MemcachedProxyNotReady`: how long the proxy may stay not Ready (a new ring reaches
    /// the proxies within about 100 s).
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub proxy_not_ready_for: String,
    /// `MemcachedOperatorReconcileErrors`: how long reconciles must keep failing.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub reconcile_errors_for: String,
    /// `MemcachedPoolDegraded`: how long a pool may stay `Degraded`.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub degraded_for: String,
    /// `MemcachedPoolNotReady`: how long a pool may stay not `Ready` (a paced rollout of a
    /// large pool takes a while).
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub not_ready_for: String,
    /// `MemcachedOperatorNoLeader`: how long no replica may hold the Lease.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h|d|w|y)$"))]
    pub no_leader_for: String,
}

impl Default for AlertThresholds {
    fn default() -> Self {
        Self {
            down_for: "15m".into(),
            connections_warning_percent: 80,
            connections_critical_percent: 95,
            connections_for: "15m".into(),
            out_of_memory_for: "15m".into(),
            evictions_per_second: 10.0,
            evictions_for: "15m".into(),
            restart_window: "15m".into(),
            hit_ratio_min: 0.5,
            hit_ratio_min_gets_per_second: 1.0,
            hit_ratio_for: "30m".into(),
            proxy_not_ready_for: "10m".into(),
            reconcile_errors_for: "15m".into(),
            degraded_for: "15m".into(),
            not_ready_for: "30m".into(),
            no_leader_for: "5m".into(),
        }
    }
}

/// The Lease's name (the operator's `--leader-election-id` default).
const LEASE: &str = "memcached-operator.cache.example.com";

/// A threshold as rule text: the number or duration itself, or (in the chart) the
/// template that reads it from the values.
pub type Param<'a> = &'a dyn Fn(&str) -> String;

/// The defaults as rule text (numbers without a needless `.0`, as Helm prints them).
pub fn default_param(key: &str) -> String {
    let defaults = serde_json::to_value(AlertThresholds::default()).unwrap_or(Value::Null);
    match &defaults[key] {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => panic!("no alert threshold {key}: {other}"),
    }
}

struct Alert {
    name: &'static str,
    expr: String,
    for_: String,
    severity: &'static str,
    summary: &'static str,
    description: String,
}

/// The rule groups (Prometheus' rule-file format, `spec.groups` of a PrometheusRule).
pub fn groups(p: Param) -> Value {
    let pod = "namespace, service, pod";
    let memcached = vec![
        Alert {
            name: "MemcachedDown",
            expr: "memcached_up == 0".into(),
            for_: p("downFor"),
            severity: "critical",
            summary: "memcached is down.",
            description: "memcached in {{ $labels.namespace }}/{{ $labels.pod }} (Memcached {{ $labels.service }}) does not answer its exporter; its keys miss.".into(),
        },
        Alert {
            name: "MemcachedConnectionLimitApproaching",
            expr: format!(
                "(sum by ({pod}) (memcached_current_connections) / sum by ({pod}) (memcached_max_connections)) * 100 > {}",
                p("connectionsWarningPercent")
            ),
            for_: p("connectionsFor"),
            severity: "warning",
            summary: "memcached is approaching its connection limit.",
            description: "memcached in {{ $labels.namespace }}/{{ $labels.pod }} uses {{ printf \"%.0f\" $value }}% of its connections (spec.config.maxConnections); beyond the limit it refuses clients.".into(),
        },
        Alert {
            name: "MemcachedConnectionLimitApproaching",
            expr: format!(
                "(sum by ({pod}) (memcached_current_connections) / sum by ({pod}) (memcached_max_connections)) * 100 > {}",
                p("connectionsCriticalPercent")
            ),
            for_: p("connectionsFor"),
            severity: "critical",
            summary: "memcached is about to refuse connections.",
            description: "memcached in {{ $labels.namespace }}/{{ $labels.pod }} uses {{ printf \"%.0f\" $value }}% of its connections (spec.config.maxConnections); beyond the limit it refuses clients.".into(),
        },
        Alert {
            name: "MemcachedOutOfMemoryErrors",
            expr: format!(
                "sum by ({pod}) (rate(memcached_slab_items_outofmemory_total[5m])) > 0"
            ),
            for_: p("outOfMemoryFor"),
            severity: "warning",
            summary: "memcached refuses items for want of memory.",
            description: "memcached in {{ $labels.namespace }}/{{ $labels.pod }} cannot store items ({{ printf \"%.2f\" $value }} a second) because no memory could be freed for them; raise spec.config.memoryMib or the pool's size.".into(),
        },
        Alert {
            name: "MemcachedEvictions",
            expr: format!(
                "sum by ({pod}) (rate(memcached_items_evicted_total[5m])) > {}",
                p("evictionsPerSecond")
            ),
            for_: p("evictionsFor"),
            severity: "warning",
            summary: "memcached evicts live items.",
            description: "memcached in {{ $labels.namespace }}/{{ $labels.pod }} evicts {{ printf \"%.1f\" $value }} unexpired items a second: the pool is smaller than what its clients keep in it.".into(),
        },
        Alert {
            name: "MemcachedRestarted",
            expr: format!(
                "resets(memcached_uptime_seconds[{}]) > 0",
                p("restartWindow")
            ),
            for_: "0m".into(),
            severity: "warning",
            summary: "memcached restarted and lost its cache.",
            description: format!(
                "memcached in {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} restarted in its pod within the last {} (its uptime went back); it started with an empty cache.",
                p("restartWindow")
            ),
        },
        Alert {
            name: "MemcachedHitRatioLow",
            expr: format!(
                "(sum by (namespace, service) (rate(memcached_commands_total{{command=\"get\",status=\"hit\"}}[5m])) / sum by (namespace, service) (rate(memcached_commands_total{{command=\"get\"}}[5m]))) < {} and sum by (namespace, service) (rate(memcached_commands_total{{command=\"get\"}}[5m])) > {}",
                p("hitRatioMin"),
                p("hitRatioMinGetsPerSecond")
            ),
            for_: p("hitRatioFor"),
            severity: "warning",
            summary: "The pool's hit ratio is low.",
            description: "Memcached {{ $labels.namespace }}/{{ $labels.service }} answers {{ $value | humanizePercentage }} of its gets from the cache.".into(),
        },
        Alert {
            name: "MemcachedProxyNotReady",
            expr: "max by (namespace, memcached, reason) (memcached_operator_pool_problem{condition=\"ProxyReady\"}) == 1".into(),
            for_: p("proxyNotReadyFor"),
            severity: "warning",
            summary: "The pool's proxy is not ready.",
            description: "The proxy of Memcached {{ $labels.namespace }}/{{ $labels.memcached }} is not Ready ({{ $labels.reason }}): its pods are not all Ready, or they have not loaded the pool's current backends.".into(),
        },
    ];
    let operator = vec![
        Alert {
            name: "MemcachedOperatorReconcileErrors",
            expr: "sum by (namespace, pod) (rate(controller_runtime_reconcile_errors_total{controller=\"memcached\"}[5m])) > 0".into(),
            for_: p("reconcileErrorsFor"),
            severity: "warning",
            summary: "The memcached operator's reconciles fail.",
            description: "The memcached operator {{ $labels.namespace }}/{{ $labels.pod }} fails {{ printf \"%.2f\" $value }} reconciles a second; its events and the pools' Degraded condition say why.".into(),
        },
        Alert {
            name: "MemcachedPoolDegraded",
            expr: "max by (namespace, memcached, reason) (memcached_operator_pool_problem{condition=\"Degraded\"}) == 1".into(),
            for_: p("degradedFor"),
            severity: "warning",
            summary: "A Memcached is Degraded.",
            description: "The operator cannot make Memcached {{ $labels.namespace }}/{{ $labels.memcached }} match its spec ({{ $labels.reason }}): kubectl describe memcached -n {{ $labels.namespace }} {{ $labels.memcached }}.".into(),
        },
        Alert {
            name: "MemcachedPoolNotReady",
            expr: "max by (namespace, memcached, reason) (memcached_operator_pool_problem{condition=\"Ready\"}) == 1".into(),
            for_: p("notReadyFor"),
            severity: "warning",
            summary: "A Memcached is not Ready.",
            description: "Memcached {{ $labels.namespace }}/{{ $labels.memcached }} has not been Ready ({{ $labels.reason }}) for a long time: kubectl describe memcached -n {{ $labels.namespace }} {{ $labels.memcached }}.".into(),
        },
        Alert {
            name: "MemcachedOperatorNoLeader",
            expr: format!("max by (namespace) (leader_election_master_status{{name=\"{LEASE}\"}}) == 0"),
            for_: p("noLeaderFor"),
            severity: "critical",
            summary: "No memcached operator replica leads.",
            description: "No replica of the memcached operator in {{ $labels.namespace }} holds the Lease: nothing reconciles the pools (they keep serving).".into(),
        },
    ];
    let group = |name: &str, alerts: Vec<Alert>| {
        let rules: Vec<Value> = alerts
            .into_iter()
            .map(|a| {
                json!({
                    "alert": a.name,
                    "expr": a.expr,
                    "for": a.for_,
                    "labels": {"severity": a.severity},
                    "annotations": {"summary": a.summary, "description": a.description},
                })
            })
            .collect();
        json!({"name": name, "rules": rules})
    };
    json!([
        group("memcached", memcached),
        group("memcached-operator", operator)
    ])
}
