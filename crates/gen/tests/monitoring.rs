//! The alerts and dashboards (crates/gen/src/monitoring), checked with Prometheus' own tools
//! built from its module (`make tools`: the pinned promtool, and `promql`, Prometheus'
//! parser): `promtool check rules` passes on the rules as `config/` and the chart ship them
//! (the chart with thresholds changed, which the rules then carry); `promtool test rules`
//! shows every alert firing and silent where it should (tests/monitoring/alerts_test.yaml);
//! every rule and dashboard query parses, and every metric they read is one that something
//! we ship exports: the exporter (hack/memcached-exporter/metrics.txt, scraped from real
//! memcached by tests/real_node.rs), the kubelet's cAdvisor (hack/node/cadvisor-metrics.txt,
//! scraped from the real node's kubelet by the same test) or the operator itself.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use memcached_operator_gen::monitoring::{self, dashboards};
use serde_json::{Value, json};

#[path = "../../operator/tests/common/mod.rs"]
mod common;
use common::process::TempDir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(name: &str) -> Command {
    Command::new(envtest::tool_path(name).unwrap_or_else(|e| panic!("{e}")))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The rule groups of the committed `config/prometheus/alerts.yaml` (tests/manifests.rs
/// holds it to what the generator writes).
fn committed_groups() -> Value {
    let text = std::fs::read_to_string(repo().join("config/prometheus/alerts.yaml"))
        .expect("config/prometheus/alerts.yaml");
    let rule: Value = serde_yaml::from_str(&text).expect("YAML");
    rule["spec"]["groups"].clone()
}

/// Writes `groups` as a Prometheus rule file.
fn rule_file(dir: &Path, name: &str, groups: &Value) -> PathBuf {
    let path = dir.join(name);
    let yaml = serde_yaml::to_string(&json!({ "groups": groups })).expect("YAML");
    std::fs::write(&path, yaml).expect("write rules");
    path
}

fn alerts(groups: &Value) -> Vec<&Value> {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect()
}

#[test]
fn promtool_checks_the_rules_as_config_ships_them() {
    let tmp = TempDir::new("rules-check");
    let rules = rule_file(tmp.path(), "alerts.rules.yaml", &committed_groups());
    let out = run(tool("promtool").arg("check").arg("rules").arg(&rules));
    assert!(
        out.status.success(),
        "promtool check rules:\n{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!(
            "SUCCESS: {} rules found",
            alerts(&committed_groups()).len()
        )),
        "{}",
        text(&out)
    );
}

/// The chart's PrometheusRule with every threshold changed: promtool accepts it, and each
/// changed value is in the rules (and none of the defaults' where a value replaced it).
#[test]
fn the_charts_thresholds_reach_the_rules() {
    let tmp = TempDir::new("rules-helm");
    let helm = envtest::tool_path("helm").unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(helm);
    for (var, dir) in [
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, tmp.path().join(dir));
    }
    let changed = [
        ("downFor", "7m"),
        ("connectionsWarningPercent", "71"),
        ("connectionsCriticalPercent", "93"),
        ("connectionsFor", "8m"),
        ("outOfMemoryFor", "9m"),
        ("evictionsPerSecond", "123.5"),
        ("evictionsFor", "11m"),
        ("restartWindow", "12m"),
        ("hitRatioMin", "0.85"),
        ("hitRatioMinGetsPerSecond", "4.5"),
        ("hitRatioFor", "13m"),
        ("proxyNotReadyFor", "14m"),
        ("reconcileErrorsFor", "16m"),
        ("degradedFor", "17m"),
        ("notReadyFor", "18m"),
        ("noLeaderFor", "19m"),
    ];
    cmd.args(["template", "mc"])
        .arg(repo().join("charts/memcached-operator"))
        .args(["--set", "prometheusRule.enabled=true"]);
    for (key, value) in changed {
        // JSON, so that a number stays one (`--set` makes 0.85 a string).
        let json = if value.ends_with(|c: char| c.is_ascii_digit()) {
            value.to_string()
        } else {
            format!("\"{value}\"")
        };
        cmd.args([
            "--set-json",
            &format!("prometheusRule.thresholds.{key}={json}"),
        ]);
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "helm template:\n{}", text(&out));
    let rendered = String::from_utf8_lossy(&out.stdout).to_string();
    let rule = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .find(|v: &Value| v["kind"] == "PrometheusRule")
        .expect("the chart renders a PrometheusRule");
    let groups = &rule["spec"]["groups"];
    let rules = rule_file(tmp.path(), "helm.rules.yaml", groups);
    let out = run(tool("promtool").arg("check").arg("rules").arg(&rules));
    assert!(
        out.status.success(),
        "promtool check rules:\n{}",
        text(&out)
    );

    let all = serde_json::to_string(groups).expect("JSON");
    for (key, value) in changed {
        let expected = if key.ends_with("For") {
            format!("\"for\":\"{value}\"")
        } else {
            value.to_string()
        };
        assert!(
            all.contains(&expected),
            "{key}={value} is not in the rules: {all}"
        );
    }
    // Prometheus' own templates survive Helm's.
    assert!(all.contains("{{ $labels.namespace }}"), "{all}");
    // Not one default is left where a threshold was changed.
    let defaults = monitoring::prometheus_rule(json!({}));
    assert_ne!(&defaults["spec"]["groups"], groups);
    for (default, alert) in alerts(&defaults["spec"]["groups"])
        .iter()
        .zip(alerts(groups))
    {
        assert_eq!(default["alert"], alert["alert"]);
        assert_eq!(
            default["annotations"]["summary"],
            alert["annotations"]["summary"]
        );
        if default["for"] != "0m" {
            assert_ne!(default["for"], alert["for"], "{}", alert["alert"]);
        }
    }
}

/// Every alert fires, and stays silent, where tests/monitoring/alerts_test.yaml says, and
/// that file tests every alert both ways.
#[test]
fn each_alert_fires_and_stays_silent_when_it_should() {
    let tmp = TempDir::new("rules-test");
    rule_file(tmp.path(), "alerts.rules.yaml", &committed_groups());
    let tests_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/monitoring/alerts_test.yaml");
    let tests_text = std::fs::read_to_string(&tests_src).expect("alerts_test.yaml");
    let tests = tmp.path().join("alerts_test.yaml");
    std::fs::write(&tests, &tests_text).expect("write");
    let out = run(tool("promtool").arg("test").arg("rules").arg(&tests));
    assert!(out.status.success(), "promtool test rules:\n{}", text(&out));

    let cases: Value = serde_yaml::from_str(&tests_text).expect("YAML");
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in cases["tests"].as_array().into_iter().flatten() {
        for t in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = t["alertname"].as_str().unwrap_or_default().to_string();
            if t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let names: BTreeSet<String> = alerts(&committed_groups())
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    assert_eq!(fires, names, "alerts shown firing");
    assert_eq!(silent, names, "alerts shown silent");
}

/// The families something we ship exports (`# TYPE` names), the operator's from its own
/// registry.
fn exported_families() -> BTreeSet<String> {
    let mut families = BTreeSet::new();
    for file in [
        "hack/memcached-exporter/metrics.txt",
        "hack/node/cadvisor-metrics.txt",
    ] {
        let text =
            std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        families.extend(text.lines().map(str::to_string));
    }
    // A family is exported once it has a series: one of each.
    let metrics = operator_metrics_with_a_problem_in("ns");
    families.extend(
        metrics
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
            .map(str::to_string),
    );
    families
}

/// The operator's registry with a series in each family: a leader, a reconcile, and pool
/// `a` of `namespace` Degraded.
fn operator_metrics_with_a_problem_in(namespace: &str) -> manager::Metrics {
    let metrics = manager::Metrics::new();
    let telemetry = memcached_operator::controller::Telemetry::register(&metrics);
    metrics.set_leader("lease", true);
    drop(telemetry.controller.reconcile_started());
    let degraded: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
        serde_json::from_value(json!({
            "type": "Degraded", "status": "True", "reason": "R", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }))
        .expect("a condition");
    telemetry.set_problems(
        &kube::runtime::reflector::ObjectRef::new("a").within(namespace),
        &[degraded],
    );
    metrics
}

/// Whether `name` is a series of one of `families` (a counter's `_total`, a histogram's
/// `_bucket`, `_sum` and `_count`; OpenMetrics names a counter's family without `_total`).
fn exported(name: &str, families: &BTreeSet<String>) -> bool {
    families.contains(name)
        || ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|f| families.contains(f)))
}

/// Every query, parsed by Prometheus' parser: the rules and the dashboards' panels and
/// variables, with Grafana's `$__rate_interval` as a dashboard's first query would have it.
#[test]
fn every_query_parses_and_reads_metrics_that_we_ship() {
    let mut queries: Vec<(String, String)> = alerts(&committed_groups())
        .iter()
        .map(|r| {
            (
                format!("alert {}", r["alert"].as_str().unwrap_or_default()),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    queries.extend(
        dashboards::queries()
            .into_iter()
            .map(|(s, e)| (s, e.replace("$__rate_interval", "5m"))),
    );
    assert!(queries.len() > 40, "{}", queries.len());
    let input = serde_json::to_vec(
        &queries
            .iter()
            .map(|(source, expr)| json!({"source": source, "expr": expr}))
            .collect::<Vec<_>>(),
    )
    .expect("JSON");
    let mut child = tool("promql")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promql");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("write");
    let out = child.wait_with_output().expect("promql");
    assert!(out.status.success(), "promql: {}", text(&out));
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("promql's JSON");
    assert_eq!(results.len(), queries.len());
    let families = exported_families();
    let mut problems = vec![];
    for (r, (source, expr)) in results.iter().zip(&queries) {
        if let Some(e) = r["error"].as_str() {
            problems.push(format!("{source}: does not parse: {e}\n  {expr}"));
            continue;
        }
        let metrics = r["metrics"].as_array().expect("metrics");
        if metrics.is_empty() {
            problems.push(format!("{source}: reads no metric\n  {expr}"));
        }
        for m in metrics.iter().filter_map(Value::as_str) {
            if !exported(m, &families) {
                problems.push(format!(
                    "{source}: reads {m}, which nothing we ship exports"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The dashboards as committed are what the generator writes, and Grafana's sidecar finds
/// them: the JSON files in config/grafana/dashboards and the chart's files/dashboards.
#[test]
fn the_dashboards_are_committed_as_generated() {
    for d in dashboards::dashboards() {
        let want = monitoring::dashboard_file("x", &d).content;
        for dir in [
            "config/grafana/dashboards",
            "charts/memcached-operator/files/dashboards",
        ] {
            let path = repo().join(dir).join(format!("{}.json", d.file));
            let got = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(got, want, "{} (make manifests)", path.display());
        }
        let model = d.model();
        assert_eq!(model["uid"], d.uid);
        let panels = model["panels"].as_array().expect("panels");
        assert!(
            panels
                .iter()
                .all(|p| p["type"] == "row"
                    || p["targets"].as_array().is_some_and(|t| !t.is_empty())),
            "every panel has a query"
        );
        let mut ids: Vec<_> = panels.iter().map(|p| p["id"].as_i64()).collect();
        ids.dedup();
        assert_eq!(ids.len(), panels.len(), "panel ids are distinct");
    }
}

/// The operator's `memcached_operator_pool_problem` names the pool's namespace in its own
/// `namespace` label, which the alerts and dashboards group by: the ServiceMonitor that
/// scrapes the operator must keep it (`honorLabels`), or Prometheus replaces it with the
/// operator's namespace and moves the pool's to `exported_namespace` (seen in the pictures
/// of hack/monitoring/pictures.sh before this was set).
#[test]
fn the_operators_monitor_keeps_the_pools_namespace() {
    let metrics = operator_metrics_with_a_problem_in("pools");
    assert!(
        metrics
            .encode()
            .contains(r#"memcached_operator_pool_problem{namespace="pools""#),
        "the operator exports the pool's namespace as `namespace`"
    );
    let text = std::fs::read_to_string(repo().join("config/prometheus/monitor.yaml"))
        .expect("config/prometheus/monitor.yaml");
    let monitor: Value = serde_yaml::from_str(&text).expect("YAML");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["honorLabels"], true,
        "{monitor}"
    );
}
