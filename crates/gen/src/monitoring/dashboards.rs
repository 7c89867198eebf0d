//! The Grafana dashboards: the pool (the memcached mixin's panels, per pool and per pod),
//! the proxy, and the operator. Each is a dashboard JSON model (schema 39, Grafana 10 and
//! later) with a Prometheus data source variable, so it imports anywhere; Grafana's
//! dashboard sidecar loads them from ConfigMaps labelled `grafana_dashboard: "1"`.
//!
//! The queries read the same series as the alerts: the exporter's, labelled by the pool's
//! ServiceMonitor (`namespace`, `service` = the Memcached's name, `pod`), the kubelet's
//! cAdvisor series for the proxy's containers (as kube-prometheus scrapes them), and the
//! operator's own. [`queries`] lists every one, for the tests.

use serde_json::{Value, json};

/// A panel: its title, what it shows, its unit and its queries (`(expr, legend)`).
struct Panel {
    title: &'static str,
    description: &'static str,
    unit: &'static str,
    kind: &'static str,
    targets: Vec<(String, &'static str)>,
}

fn timeseries(
    title: &'static str,
    description: &'static str,
    unit: &'static str,
    targets: Vec<(String, &'static str)>,
) -> Panel {
    Panel {
        title,
        description,
        unit,
        kind: "timeseries",
        targets,
    }
}

fn stat(title: &'static str, description: &'static str, unit: &'static str, expr: String) -> Panel {
    Panel {
        title,
        description,
        unit,
        kind: "stat",
        targets: vec![(expr, "")],
    }
}

/// A row of panels under a title.
struct Row {
    title: &'static str,
    panels: Vec<Panel>,
}

/// A template variable: a query variable over one label of a selector.
struct Var {
    name: &'static str,
    label: &'static str,
    /// `label_values(SELECTOR, LABEL)`.
    selector: String,
    of: &'static str,
    /// "All" as any value (`.+`), for labels only the dashboard's own metrics carry; else
    /// "All" is the values found (a label every scraped process has, such as `job`).
    all_is_any: bool,
}

pub struct Dashboard {
    /// The file name (without `.json`) and the ConfigMap's.
    pub file: &'static str,
    pub uid: &'static str,
    pub title: &'static str,
    vars: Vec<Var>,
    rows: Vec<Row>,
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

impl Dashboard {
    /// The dashboard's JSON model.
    pub fn model(&self) -> Value {
        let mut panels = vec![];
        let mut id = 1;
        let mut y = 0;
        for row in &self.rows {
            panels.push(json!({
                "type": "row", "id": id, "title": row.title, "collapsed": false,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
            }));
            id += 1;
            y += 1;
            // Three panels across, eight units high.
            for (i, p) in row.panels.iter().enumerate() {
                let targets: Vec<Value> = p
                    .targets
                    .iter()
                    .enumerate()
                    .map(|(j, (expr, legend))| {
                        json!({
                            "datasource": datasource(),
                            "expr": expr,
                            "legendFormat": if legend.is_empty() { "__auto" } else { legend },
                            "refId": char::from(b'A' + j as u8).to_string(),
                        })
                    })
                    .collect();
                let mut panel = json!({
                    "type": p.kind, "id": id, "title": p.title, "description": p.description,
                    "datasource": datasource(),
                    "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i / 3) * 8},
                    "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                    "targets": targets,
                });
                if p.kind == "timeseries" {
                    panel["options"] = json!({
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": true},
                        "tooltip": {"mode": "multi", "sort": "desc"},
                    });
                }
                panels.push(panel);
                id += 1;
            }
            y += row.panels.len().div_ceil(3) * 8;
        }
        let mut list = vec![json!({
            "name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0,
        })];
        for v in &self.vars {
            let query = format!("label_values({}, {})", v.selector, v.of);
            let mut var = json!({
                "name": v.name, "label": v.label, "type": "query",
                "datasource": datasource(),
                "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                "definition": query,
                "includeAll": true, "multi": true,
                "current": {}, "refresh": 2, "sort": 1, "hide": 0,
            });
            if v.all_is_any {
                var["allValue"] = json!(".+");
            }
            list.push(var);
        }
        json!({
            "uid": self.uid,
            "title": self.title,
            "description": super::GENERATED,
            "tags": ["memcached", "memcached-operator"],
            "editable": true,
            "schemaVersion": 39,
            "time": {"from": "now-1h", "to": "now"},
            "refresh": "30s",
            "timezone": "",
            "graphTooltip": 1,
            "templating": {"list": list},
            "annotations": {"list": []},
            "panels": panels,
        })
    }

    /// Every query: the panels' (`title: expr`) and the variables' selectors.
    pub fn queries(&self) -> Vec<(String, String)> {
        let mut out = vec![];
        for row in &self.rows {
            for p in &row.panels {
                for (expr, _) in &p.targets {
                    out.push((format!("{} / {}", self.title, p.title), expr.clone()));
                }
            }
        }
        for v in &self.vars {
            out.push((
                format!("{} / variable {}", self.title, v.name),
                v.selector.clone(),
            ));
        }
        out
    }
}

/// The pool's selector: the chosen namespaces, pools and pods.
const POD: &str = r#"namespace=~"$namespace", service=~"$pool", pod=~"$pod""#;

fn rate(metric: &str, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!("rate({metric}{{{POD}{extra}}}[$__rate_interval])")
}

fn gauge(metric: &str) -> String {
    format!("{metric}{{{POD}}}")
}

/// A gauge (with its legend) and its limit, each summed per pool.
fn per_pool_and_limit(
    (used, legend): (&str, &'static str),
    limit: &str,
) -> Vec<(String, &'static str)> {
    let sum = |m: &str| format!("sum by (namespace, service) ({})", gauge(m));
    vec![
        (sum(used), legend),
        (sum(limit), "limit {{namespace}}/{{service}}"),
    ]
}

/// `used` as a fraction of `limit`, both summed `by`.
fn of(by: &str, used: &str, limit: &str) -> String {
    format!(
        "sum by ({by}) ({}) / sum by ({by}) ({})",
        gauge(used),
        gauge(limit)
    )
}

fn pool() -> Dashboard {
    let hits = |by: &str| {
        format!(
            "sum by ({by}) ({}) / sum by ({by}) ({})",
            rate("memcached_commands_total", r#"command="get", status="hit""#),
            rate("memcached_commands_total", r#"command="get""#)
        )
    };
    let by_pool = "namespace, service";
    let by_pod = "namespace, pod";
    let sum = |by: &str, e: String| format!("sum by ({by}) ({e})");
    Dashboard {
        file: "memcached-pool",
        uid: "memcached-operator-pool",
        title: "Memcached / Pool",
        vars: vec![
            Var {
                name: "namespace",
                label: "Namespace",
                selector: "memcached_up".into(),
                of: "namespace",
                all_is_any: true,
            },
            Var {
                name: "pool",
                label: "Memcached",
                selector: r#"memcached_up{namespace=~"$namespace"}"#.into(),
                of: "service",
                all_is_any: true,
            },
            Var {
                name: "pod",
                label: "Pod",
                selector: r#"memcached_up{namespace=~"$namespace", service=~"$pool"}"#.into(),
                of: "pod",
                all_is_any: true,
            },
        ],
        rows: vec![
            Row {
                title: "Pools",
                panels: vec![
                    stat(
                        "Hit ratio",
                        "Gets answered from the cache, over the chosen pools.",
                        "percentunit",
                        hits("namespace"),
                    ),
                    stat(
                        "Pods up",
                        "memcached processes answering their exporter, of the pods scraped.",
                        "short",
                        format!(
                            "sum({}) / count({})",
                            gauge("memcached_up"),
                            gauge("memcached_up")
                        ),
                    ),
                    stat(
                        "Items",
                        "Items held, over the chosen pools.",
                        "short",
                        format!("sum({})", gauge("memcached_current_items")),
                    ),
                    timeseries(
                        "Hit ratio",
                        "Gets answered from the cache, per pool.",
                        "percentunit",
                        vec![(hits(by_pool), "{{namespace}}/{{service}}")],
                    ),
                    timeseries(
                        "Commands",
                        "Commands a second, by command and outcome.",
                        "ops",
                        vec![(
                            sum("command, status", rate("memcached_commands_total", "")),
                            "{{command}} {{status}}",
                        )],
                    ),
                    timeseries(
                        "Evictions",
                        "Unexpired items evicted a second (the pool is full), per pool.",
                        "ops",
                        vec![(
                            sum(by_pool, rate("memcached_items_evicted_total", "")),
                            "{{namespace}}/{{service}}",
                        )],
                    ),
                    timeseries(
                        "Memory",
                        "Bytes used by items, and the limit (-m), per pool.",
                        "bytes",
                        per_pool_and_limit(
                            ("memcached_current_bytes", "used {{namespace}}/{{service}}"),
                            "memcached_limit_bytes",
                        ),
                    ),
                    timeseries(
                        "Connections",
                        "Open connections, and the limit (-c), per pool.",
                        "short",
                        per_pool_and_limit(
                            (
                                "memcached_current_connections",
                                "open {{namespace}}/{{service}}",
                            ),
                            "memcached_max_connections",
                        ),
                    ),
                    timeseries(
                        "Network",
                        "Bytes read from and written to clients a second, per pool.",
                        "Bps",
                        vec![
                            (
                                sum(by_pool, rate("memcached_read_bytes_total", "")),
                                "in {{namespace}}/{{service}}",
                            ),
                            (
                                sum(by_pool, rate("memcached_written_bytes_total", "")),
                                "out {{namespace}}/{{service}}",
                            ),
                        ],
                    ),
                ],
            },
            Row {
                title: "Pods",
                panels: vec![
                    timeseries(
                        "Hit ratio",
                        "Gets answered from the cache, per pod.",
                        "percentunit",
                        vec![(hits(by_pod), "{{pod}}")],
                    ),
                    timeseries(
                        "Commands",
                        "Commands a second, per pod.",
                        "ops",
                        vec![(sum(by_pod, rate("memcached_commands_total", "")), "{{pod}}")],
                    ),
                    timeseries(
                        "Evictions",
                        "Unexpired items evicted a second, per pod.",
                        "ops",
                        vec![(
                            sum(by_pod, rate("memcached_items_evicted_total", "")),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Memory used",
                        "Bytes used by items, of the limit (-m), per pod.",
                        "percentunit",
                        vec![(
                            of(by_pod, "memcached_current_bytes", "memcached_limit_bytes"),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Connections used",
                        "Open connections, of the limit (-c), per pod.",
                        "percentunit",
                        vec![(
                            of(
                                by_pod,
                                "memcached_current_connections",
                                "memcached_max_connections",
                            ),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Items",
                        "Items held, per pod.",
                        "short",
                        vec![(sum(by_pod, gauge("memcached_current_items")), "{{pod}}")],
                    ),
                    timeseries(
                        "Out of memory",
                        "Items refused a second for want of memory, per pod.",
                        "ops",
                        vec![(
                            sum(by_pod, rate("memcached_slab_items_outofmemory_total", "")),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Uptime",
                        "Since memcached started (a drop is a restart, with an empty cache).",
                        "s",
                        vec![(sum(by_pod, gauge("memcached_uptime_seconds")), "{{pod}}")],
                    ),
                    timeseries(
                        "Connections refused",
                        "Connections refused a second at the limit (-c), per pod.",
                        "ops",
                        vec![(
                            sum(by_pod, rate("memcached_connections_rejected_total", "")),
                            "{{pod}}",
                        )],
                    ),
                ],
            },
        ],
    }
}

fn proxy() -> Dashboard {
    // The proxy's pods are NAME-proxy-…; their container is `proxy`.
    let c = r#"namespace=~"$namespace", pod=~"$pool-proxy-.+", container="proxy""#;
    let pods = r#"namespace=~"$namespace", pod=~"$pool-proxy-.+""#;
    Dashboard {
        file: "memcached-proxy",
        uid: "memcached-operator-proxy",
        title: "Memcached / Proxy",
        vars: vec![
            Var {
                name: "namespace",
                label: "Namespace",
                selector: "memcached_up".into(),
                of: "namespace",
                all_is_any: true,
            },
            Var {
                name: "pool",
                label: "Memcached",
                selector: r#"memcached_up{namespace=~"$namespace"}"#.into(),
                of: "service",
                all_is_any: true,
            },
        ],
        rows: vec![
            Row {
                title: "Proxy",
                panels: vec![
                    stat(
                        "Proxies not ready",
                        "Pools whose proxy is not Ready (the operator's ProxyReady condition): pods not Ready, or not yet loaded with the current backends.",
                        "short",
                        r#"count(memcached_operator_pool_problem{condition="ProxyReady", namespace=~"$namespace", memcached=~"$pool"}) or vector(0)"#.into(),
                    ),
                    timeseries(
                        "Not ready, by reason",
                        "The proxy's ProxyReady condition while False, per pool and reason.",
                        "short",
                        vec![(
                            r#"max by (namespace, memcached, reason) (memcached_operator_pool_problem{condition="ProxyReady", namespace=~"$namespace", memcached=~"$pool"})"#.into(),
                            "{{namespace}}/{{memcached}} {{reason}}",
                        )],
                    ),
                    timeseries(
                        "Pool hit ratio",
                        "Gets answered from the cache by the pool behind the proxy.",
                        "percentunit",
                        vec![(
                            format!(
                                "sum by (namespace, service) ({}) / sum by (namespace, service) ({})",
                                r#"rate(memcached_commands_total{namespace=~"$namespace", service=~"$pool", command="get", status="hit"}[$__rate_interval])"#,
                                r#"rate(memcached_commands_total{namespace=~"$namespace", service=~"$pool", command="get"}[$__rate_interval])"#
                            ),
                            "{{namespace}}/{{service}}",
                        )],
                    ),
                ],
            },
            Row {
                title: "Proxy pods",
                panels: vec![
                    timeseries(
                        "CPU",
                        "CPU used by each proxy container (cAdvisor).",
                        "short",
                        vec![(
                            format!("sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{{{c}}}[$__rate_interval]))"),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Memory",
                        "Working set of each proxy container (cAdvisor).",
                        "bytes",
                        vec![(
                            format!("sum by (namespace, pod) (container_memory_working_set_bytes{{{c}}})"),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Network",
                        "Bytes received and sent a second by each proxy pod (cAdvisor): clients and backends together.",
                        "Bps",
                        vec![
                            (
                                format!("sum by (namespace, pod) (rate(container_network_receive_bytes_total{{{pods}}}[$__rate_interval]))"),
                                "in {{pod}}",
                            ),
                            (
                                format!("sum by (namespace, pod) (rate(container_network_transmit_bytes_total{{{pods}}}[$__rate_interval]))"),
                                "out {{pod}}",
                            ),
                        ],
                    ),
                ],
            },
        ],
    }
}

fn operator() -> Dashboard {
    let j = r#"job=~"$job""#;
    let c = r#"job=~"$job", controller="memcached""#;
    Dashboard {
        file: "memcached-operator",
        uid: "memcached-operator-operator",
        title: "Memcached / Operator",
        vars: vec![Var {
            name: "job",
            label: "Operator",
            selector: "memcached_operator_managed_instances".into(),
            of: "job",
            // Every process Prometheus scrapes has a job: "All" is the operators found.
            all_is_any: false,
        }],
        rows: vec![
            Row {
                title: "Pools",
                panels: vec![
                    stat(
                        "Memcacheds",
                        "Memcacheds the operator manages (its cache, the leader's count).",
                        "short",
                        format!("max(memcached_operator_managed_instances{{{j}}})"),
                    ),
                    stat(
                        "Pools with a problem",
                        "Memcacheds with a condition in its unhealthy state.",
                        "short",
                        format!(
                            "count(count by (namespace, memcached) (memcached_operator_pool_problem{{{j}}})) or vector(0)"
                        ),
                    ),
                    timeseries(
                        "Problems",
                        "Memcacheds with a condition in its unhealthy state, by condition and reason.",
                        "short",
                        vec![(
                            format!(
                                "count by (condition, reason) (memcached_operator_pool_problem{{{j}}})"
                            ),
                            "{{condition}} {{reason}}",
                        )],
                    ),
                ],
            },
            Row {
                title: "Reconciles",
                panels: vec![
                    timeseries(
                        "Reconciles",
                        "Reconciles a second, by result.",
                        "ops",
                        vec![(
                            format!(
                                "sum by (result) (rate(controller_runtime_reconcile_total{{{c}}}[$__rate_interval]))"
                            ),
                            "{{result}}",
                        )],
                    ),
                    timeseries(
                        "Errors",
                        "Failed reconciles a second.",
                        "ops",
                        vec![(
                            format!(
                                "sum(rate(controller_runtime_reconcile_errors_total{{{c}}}[$__rate_interval]))"
                            ),
                            "errors",
                        )],
                    ),
                    timeseries(
                        "Duration",
                        "How long a reconcile takes: the median and the 99th percentile.",
                        "s",
                        vec![
                            (
                                format!(
                                    "histogram_quantile(0.5, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket{{{c}}}[$__rate_interval])))"
                                ),
                                "p50",
                            ),
                            (
                                format!(
                                    "histogram_quantile(0.99, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket{{{c}}}[$__rate_interval])))"
                                ),
                                "p99",
                            ),
                        ],
                    ),
                    timeseries(
                        "Work queue",
                        "Memcacheds waiting for a reconcile, and the queue's adds and retries a second.",
                        "short",
                        vec![
                            (
                                format!("max(workqueue_depth{{{j}, name=\"memcached\"}})"),
                                "depth",
                            ),
                            (
                                format!(
                                    "sum(rate(workqueue_adds_total{{{j}, name=\"memcached\"}}[$__rate_interval]))"
                                ),
                                "adds/s",
                            ),
                            (
                                format!(
                                    "sum(rate(workqueue_retries_total{{{j}, name=\"memcached\"}}[$__rate_interval]))"
                                ),
                                "retries/s",
                            ),
                        ],
                    ),
                    timeseries(
                        "Workers",
                        "Reconciles running at once, and the most allowed (--max-concurrent-reconciles).",
                        "short",
                        vec![
                            (
                                format!("sum(controller_runtime_active_workers{{{c}}})"),
                                "active",
                            ),
                            (
                                format!("max(controller_runtime_max_concurrent_reconciles{{{c}}})"),
                                "max",
                            ),
                        ],
                    ),
                ],
            },
            Row {
                title: "Replicas",
                panels: vec![
                    timeseries(
                        "Leader",
                        "Which replica holds the Lease (1).",
                        "short",
                        vec![(
                            format!("max by (pod) (leader_election_master_status{{{j}}})"),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "CPU",
                        "CPU used by each replica.",
                        "short",
                        vec![(
                            format!(
                                "sum by (pod) (rate(process_cpu_seconds_total{{{j}}}[$__rate_interval]))"
                            ),
                            "{{pod}}",
                        )],
                    ),
                    timeseries(
                        "Memory",
                        "Resident memory of each replica.",
                        "bytes",
                        vec![(
                            format!("sum by (pod) (process_resident_memory_bytes{{{j}}})"),
                            "{{pod}}",
                        )],
                    ),
                ],
            },
        ],
    }
}

/// The dashboards.
pub fn dashboards() -> Vec<Dashboard> {
    vec![pool(), proxy(), operator()]
}

/// Every query of every dashboard (`source`, `expr`), Grafana's variables as written.
pub fn queries() -> Vec<(String, String)> {
    dashboards().iter().flat_map(Dashboard::queries).collect()
}
