//! The chart's metrics Service and ServiceMonitor (`templates/metrics.yaml`, from
//! `config/default` and `config/prometheus`) and the NetworkPolicies of the operator's pod
//! (`templates/networkpolicy.yaml`, from `config/network-policy`).

use super::tpl::{Cond, T, tpl};
use super::{Template, release_meta, to_value, when};
use crate::manifests::{self, Error};

pub(super) fn metrics_template() -> Result<Template, Error> {
    let mut svc = T::from(to_value("Service", &manifests::metrics_service()?)?);
    release_meta(&mut svc, true);
    let port = svc.at(&["spec", "ports", "0"]);
    port.set("port", tpl("{{ $.Values.metrics.port }}"));
    port.set("targetPort", tpl("{{ $.Values.metrics.port }}"));
    let mut monitor = T::from(manifests::service_monitor());
    release_meta(&mut monitor, true);
    Ok(Template {
        path: "templates/metrics.yaml",
        comment: "The metrics Service, and the Prometheus Operator's ServiceMonitor (config/prometheus).",
        preamble: "{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}\n\
                   {{- fail \"metrics.serviceMonitor.enabled needs metrics.enabled: there is no metrics endpoint to scrape\" }}\n\
                   {{- end }}\n",
        docs: vec![
            when(svc, "$.Values.metrics.enabled"),
            when(
                monitor,
                "and $.Values.metrics.enabled $.Values.metrics.serviceMonitor.enabled",
            ),
        ],
    })
}

pub(super) fn network_policy_template() -> Result<Template, Error> {
    let [metrics, webhook] = manifests::network_policies()?;
    let mut metrics = T::from(to_value("NetworkPolicy", &metrics)?);
    release_meta(&mut metrics, true);
    metrics
        .at(&["spec", "ingress", "0", "ports", "0"])
        .set("port", tpl("{{ $.Values.metrics.port }}"));
    let mut webhook = T::from(to_value("NetworkPolicy", &webhook)?);
    release_meta(&mut webhook, true);
    // Only the API server, where the user can say who that is.
    webhook.at(&["spec", "ingress", "0"]).set_when(
        "from",
        T::Yaml(".".into()),
        Cond::With("$.Values.networkPolicy.webhookFrom".into()),
    );
    Ok(Template {
        path: "templates/networkpolicy.yaml",
        comment: "NetworkPolicies of the operator's pod (config/network-policy).",
        preamble: "",
        docs: vec![
            when(
                metrics,
                "and $.Values.networkPolicy.enabled $.Values.metrics.enabled",
            ),
            when(
                webhook,
                "and $.Values.networkPolicy.enabled $.Values.webhook.enabled",
            ),
        ],
    })
}
