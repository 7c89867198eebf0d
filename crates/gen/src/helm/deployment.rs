//! The chart's operator Deployment (`templates/deployment.yaml`): `config/manager` with
//! `config/default`'s webhook patch, its image, replicas, resources, placement and flags
//! from the values.

use serde_json::{Value, json};

use super::tpl::{self, Cond, T, tpl};
use super::{Template, WEBHOOK_SECRET, always, cond, release_meta, to_value};
use crate::manifests::{self, Error};

const IMAGE: &str = "{{ include \"memcached-operator.image\" $ }}";
const TLS_AGENT_IMAGE: &str = "{{ include \"memcached-operator.tlsAgentImage\" $ }}";

/// `{{- with EXPR }}` the YAML of EXPR merged into the surrounding map or list.
fn merged(expr: &str) -> T {
    T::Raw(format!(
        "{{{{- with {expr} }}}}\n{{{{- toYaml . | nindent {{indent}} }}}}\n{{{{- end }}}}"
    ))
}

const METRICS_ADDRESS: &str = "--metrics-bind-address={{ if $.Values.metrics.enabled }}:{{ $.Values.metrics.port }}{{ else }}0{{ end }}";

pub(super) fn deployment_template() -> Result<Template, Error> {
    let patch = T::from(manifests::manager_webhook_patch());
    let mut patch = patch;
    let webhook_volumes = patch.at(&["spec", "template", "spec", "volumes"]).clone();
    let patched = patch.at(&["spec", "template", "spec", "containers", "0"]);
    let webhook_ports = patched.at(&["ports"]).clone();
    let webhook_mounts = patched.at(&["volumeMounts"]).clone();

    let mut d = T::from(to_value("Deployment", &manifests::manager_deployment()?)?);
    release_meta(&mut d, true);
    d.at(&["spec"])
        .set("replicas", tpl("{{ $.Values.replicaCount }}"));
    let template = d.at(&["spec", "template"]);
    template
        .at(&["metadata", "annotations"])
        .set("", merged("$.Values.podAnnotations"));
    template
        .at(&["metadata", "labels"])
        .set("", merged("$.Values.podLabels"));
    let pod = template.at(&["spec"]);
    pod.set(
        "securityContext",
        T::Yaml("$.Values.podSecurityContext".into()),
    );
    pod.set(
        "serviceAccountName",
        tpl("{{ include \"memcached-operator.serviceAccountName\" $ }}"),
    );
    for key in [
        "imagePullSecrets",
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
    ] {
        pod.set_when(
            key,
            T::Yaml(".".into()),
            Cond::With(format!("$.Values.{key}")),
        );
    }
    pod.set_when(
        "priorityClassName",
        tpl("{{ . }}"),
        Cond::With("$.Values.priorityClassName".into()),
    );
    if let T::List(mut items) = webhook_volumes {
        for item in items.iter_mut() {
            item.value
                .at(&["secret"])
                .set("secretName", tpl(WEBHOOK_SECRET));
        }
        pod.set_when("volumes", T::List(items), cond("$.Values.webhook.enabled"));
    }

    let container = pod.at(&["containers", "0"]);
    container.set("image", tpl(IMAGE));
    container.set("imagePullPolicy", tpl("{{ $.Values.image.pullPolicy }}"));
    container.set("resources", T::Yaml("$.Values.resources".into()));
    container.set(
        "securityContext",
        T::Yaml("$.Values.securityContext".into()),
    );
    let args = container.at(&["args"]);
    args.items_when(
        |a| *a == T::V(json!("--leader-elect")),
        cond("$.Values.leaderElection.enabled"),
    );
    if let T::List(items) = args {
        for item in items.iter_mut() {
            if let T::V(Value::String(a)) = &item.value
                && a.starts_with("--metrics-bind-address=")
            {
                item.value = tpl(METRICS_ADDRESS);
            }
        }
    }
    args.push(
        tpl("--namespace={{ join \",\" . }}"),
        Cond::With("$.Values.watchNamespaces".into()),
    );
    args.push(merged("$.Values.extraArgs"), Cond::Always);

    let env = container.at(&["env"]);
    if let T::List(items) = env {
        for item in items.iter_mut() {
            if item.value.get_mut(&["name"]) == Some(&mut T::V(json!("TLS_AGENT_IMAGE"))) {
                item.value.set("value", tpl(TLS_AGENT_IMAGE));
            }
        }
    }
    env.push(
        T::V(json!({"name": "ENABLE_WEBHOOKS", "value": "false"})),
        cond("not $.Values.webhook.enabled"),
    );

    let ports = container.at(&["ports"]);
    ports.items_when(
        |p| {
            let mut p = p.clone();
            p.get_mut(&["name"]) == Some(&mut T::V(json!("https")))
        },
        cond("$.Values.metrics.enabled"),
    );
    if let T::List(items) = ports {
        for item in items.iter_mut() {
            if item.cond != Cond::Always {
                item.value
                    .set("containerPort", tpl("{{ $.Values.metrics.port }}"));
            }
        }
    }
    // First, where kustomize's strategic merge puts the patch's port.
    if let (T::List(webhook), T::List(items)) = (webhook_ports, ports) {
        let webhook = webhook.into_iter().map(|item| tpl::Item {
            value: item.value,
            cond: cond("$.Values.webhook.enabled"),
        });
        items.splice(0..0, webhook);
    }
    container.set_when(
        "volumeMounts",
        webhook_mounts,
        cond("$.Values.webhook.enabled"),
    );

    Ok(Template {
        path: "templates/deployment.yaml",
        comment: "The operator (config/manager with config/default's webhook patch).",
        preamble: "{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}\n\
                   {{- fail \"replicaCount > 1 needs leaderElection.enabled: operators without leader election would all reconcile\" }}\n\
                   {{- end }}\n",
        docs: vec![always(d)],
    })
}
