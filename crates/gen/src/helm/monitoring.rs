//! The chart's alerts (`templates/prometheusrule.yaml`, from `config/prometheus/alerts.yaml`,
//! thresholds from `prometheusRule.thresholds`) and dashboards (`templates/dashboards.yaml`,
//! the ConfigMaps `config/grafana` generates, their JSON in the chart's `files/dashboards`).

use serde_json::json;

use super::tpl::{Cond, T, tpl};
use super::{Template, release_meta, when};
use crate::manifests::{self, Error};
use crate::monitoring;

/// Where the chart keeps the dashboards' JSON.
pub(super) const DASHBOARD_DIR: &str = "files/dashboards";

/// `{{- with EXPR }}` the map's YAML below the entries `{{- end }}`, at their indentation.
fn merged_map(expr: &str) -> T {
    T::Raw(format!(
        "{{{{- with {expr} }}}}\n{{{{- toYaml . | nindent {{indent}} }}}}\n{{{{- end }}}}"
    ))
}

pub(super) fn prometheus_rule_template() -> Result<Template, Error> {
    let mut rule = T::from(manifests::prometheus_rule());
    release_meta(&mut rule, true);
    rule.at(&["metadata", "labels"])
        .set("+values", merged_map("$.Values.prometheusRule.labels"));
    rule.at(&["spec"])
        .set("groups", T::from(monitoring::helm_groups()));
    Ok(Template {
        path: "templates/prometheusrule.yaml",
        comment: "The alerts (config/prometheus/alerts.yaml), thresholds from prometheusRule.thresholds.",
        preamble: "",
        docs: vec![when(rule, "$.Values.prometheusRule.enabled")],
    })
}

pub(super) fn dashboards_template() -> Result<Template, Error> {
    let docs = monitoring::dashboards::dashboards()
        .iter()
        .map(|d| {
            let mut cm = T::from(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": d.file, "labels": manifests::labels()},
                "data": {},
            }));
            release_meta(&mut cm, true);
            let meta = cm.at(&["metadata"]);
            meta.at(&["labels"])
                .set("+values", merged_map("$.Values.dashboards.labels"));
            meta.set_when(
                "annotations",
                T::Yaml(".".into()),
                Cond::With("$.Values.dashboards.annotations".into()),
            );
            cm.at(&["data"]).set(
                &format!("{}.json", d.file),
                tpl(format!(
                    "{{{{ $.Files.Get \"{DASHBOARD_DIR}/{}.json\" | toJson }}}}",
                    d.file
                )),
            );
            when(cm, "$.Values.dashboards.enabled")
        })
        .collect();
    Ok(Template {
        path: "templates/dashboards.yaml",
        comment: "The Grafana dashboards (config/grafana), for Grafana's dashboard sidecar.",
        preamble: "",
        docs,
    })
}
