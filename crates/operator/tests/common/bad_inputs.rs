//! The bad-input table shared by the tests that feed bad Memcacheds to an API server: the
//! in-memory one (`bad_input.rs`) and the real control plane with the webhooks registered
//! (`real_cluster.rs`).

use serde_json::{Value, json};

/// A well-formed sha256 hex digest.
pub const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A Memcached in `default` with `spec` (tests on a real server move it to their namespace).
pub fn memcached(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
}

/// Objects the CRD schema (or the API server's own checks) rejects, with what the error
/// must name.
pub fn schema_rejects() -> Vec<(&'static str, Value, u16, Vec<&'static str>)> {
    let mut wrong_kind = memcached("wrong-kind", json!({"size": 1}));
    wrong_kind["kind"] = json!("Redis");
    let mut wrong_version = memcached("wrong-version", json!({"size": 1}));
    wrong_version["apiVersion"] = json!("memcached.cache.example.com/v2");
    vec![
        (
            "unparseable quantity",
            memcached(
                "qty",
                json!({"size": 1, "resources": {"requests": {"memory": "abc"}}}),
            ),
            422,
            vec!["spec.resources.requests.memory", "should match"],
        ),
        (
            "negative size",
            memcached("neg", json!({"size": -1})),
            422,
            vec!["spec.size", "greater than or equal to 0"],
        ),
        (
            "huge size",
            memcached("huge", json!({"size": 101})),
            422,
            vec!["spec.size", "less than or equal to 100"],
        ),
        (
            "size beyond int32",
            memcached("int64", json!({"size": 99_999_999_999i64})),
            422,
            vec!["spec.size"],
        ),
        (
            "size as a word",
            memcached("word", json!({"size": "three"})),
            422,
            vec!["spec.size", "must be of type integer"],
        ),
        (
            "fractional size",
            memcached("frac", json!({"size": 2.5})),
            422,
            vec!["spec.size", "integer"],
        ),
        (
            "boolean size",
            memcached("bool", json!({"size": true})),
            422,
            vec!["spec.size", "integer"],
        ),
        (
            "missing size",
            memcached("nosize", json!({"containerPort": 11211})),
            422,
            vec!["spec.size", "Required value"],
        ),
        (
            "port 0",
            memcached("port0", json!({"size": 1, "containerPort": 0})),
            422,
            vec!["spec.containerPort", "greater than or equal to 1"],
        ),
        (
            "port 70000",
            memcached("port70000", json!({"size": 1, "containerPort": 70000})),
            422,
            vec!["spec.containerPort", "less than or equal to 65535"],
        ),
        (
            "port as a string",
            memcached("portstr", json!({"size": 1, "containerPort": "11211"})),
            422,
            vec!["spec.containerPort", "integer"],
        ),
        (
            "image with spaces",
            memcached("img-space", json!({"size": 1, "image": "memcached 1.6"})),
            422,
            vec!["spec.image", "should match"],
        ),
        (
            "image with an uppercase path",
            memcached(
                "img-upper",
                json!({"size": 1, "image": "team/Memcached:1.6"}),
            ),
            422,
            vec!["spec.image", "should match"],
        ),
        (
            "image with a bad tag",
            memcached("img-tag", json!({"size": 1, "image": "memcached:-1.6"})),
            422,
            vec!["spec.image", "should match"],
        ),
        (
            "image with a short digest",
            memcached(
                "img-digest",
                json!({"size": 1, "image": "memcached@sha256:abc"}),
            ),
            422,
            vec!["spec.image", "should match"],
        ),
        (
            "image with a scheme",
            memcached(
                "img-scheme",
                json!({"size": 1, "image": "https://registry.example.com/memcached"}),
            ),
            422,
            vec!["spec.image", "should match"],
        ),
        (
            "empty image",
            memcached("img-empty", json!({"size": 1, "image": ""})),
            422,
            vec!["spec.image", "at least 1 chars"],
        ),
        (
            "image as a number",
            memcached("img-num", json!({"size": 1, "image": 42})),
            422,
            vec!["spec.image", "string"],
        ),
        (
            "null spec",
            memcached("nullspec", Value::Null),
            422,
            vec!["spec"],
        ),
        (
            "spec as a list",
            memcached("listspec", json!([1, 2])),
            422,
            vec!["spec", "object"],
        ),
        (
            "uppercase name",
            memcached("Memcached-Sample", json!({"size": 1})),
            422,
            vec!["metadata.name"],
        ),
        (
            "name with an underscore",
            memcached("my_cache", json!({"size": 1})),
            422,
            vec!["metadata.name"],
        ),
        (
            "no proxy pods",
            memcached(
                "proxy0",
                json!({"size": 1, "proxy": {"enabled": true, "replicas": 0}}),
            ),
            422,
            vec!["spec.proxy.replicas", "greater than or equal to 1"],
        ),
        (
            "four copies",
            memcached(
                "copies4",
                json!({"size": 4, "proxy": {"enabled": true, "copies": 4}}),
            ),
            422,
            vec!["spec.proxy.copies", "less than or equal to 3"],
        ),
        (
            "a gutter of no time",
            memcached(
                "gutter0",
                json!({"size": 1, "proxy": {"enabled": true, "gutter": {"enabled": true, "ttlSeconds": 0}}}),
            ),
            422,
            vec!["spec.proxy.gutter.ttlSeconds", "greater than or equal to 1"],
        ),
        (
            "proxy image with a space",
            memcached(
                "proxyimg",
                json!({"size": 1, "proxy": {"image": "memcached 1.6"}}),
            ),
            422,
            vec!["spec.proxy.image", "should match"],
        ),
        (
            "client verification of a kind memcached has not",
            memcached(
                "verify-once",
                json!({"size": 1, "tls": {"secretName": "certs", "clientAuth": {"verify": "Once"}}}),
            ),
            422,
            vec!["spec.tls.clientAuth.verify", "Unsupported value"],
        ),
        (
            "stop delay of an hour",
            memcached(
                "delay-hour",
                json!({"size": 1, "gracefulShutdown": {"preStopDelaySeconds": 3600}}),
            ),
            422,
            vec![
                "spec.gracefulShutdown.preStopDelaySeconds",
                "less than or equal to 600",
            ],
        ),
        (
            "extstore page of 4 GiB",
            memcached(
                "ext-page-huge",
                json!({"size": 1, "extstore": {"enabled": true, "pageSizeMiB": 4096}}),
            ),
            422,
            vec!["spec.extstore.pageSizeMiB", "less than or equal to 1024"],
        ),
        (
            "no extstore threads",
            memcached(
                "ext-threads0",
                json!({"size": 1, "extstore": {"enabled": true, "threads": 0}}),
            ),
            422,
            vec!["spec.extstore.threads", "greater than or equal to 1"],
        ),
        (
            "negative minReadySeconds",
            memcached(
                "min-ready-neg",
                json!({"size": 1, "rollout": {"minReadySeconds": -1}}),
            ),
            422,
            vec!["spec.rollout.minReadySeconds", "greater than or equal to 0"],
        ),
        (
            "unknown TLS rotation",
            memcached(
                "tls-rotation",
                json!({"size": 1, "tls": {"secretName": "certs", "rotation": "Reload"}}),
            ),
            422,
            vec!["spec.tls.rotation", "Reload"],
        ),
        ("wrong kind", wrong_kind, 400, vec!["kind", "Redis"]),
        (
            "wrong apiVersion",
            wrong_version,
            400,
            vec!["memcached.cache.example.com/v2"],
        ),
    ]
}

/// Objects the schema lets through that the operator must refuse: `(name, spec, field)`.
pub fn schema_passes_operator_refuses() -> Vec<(String, Value, &'static str)> {
    vec![
        (
            format!("m{}", "x".repeat(63)),
            json!({"size": 2}),
            "metadata.name",
        ),
        (
            format!("m{}", "x".repeat(54)),
            json!({"size": 2}),
            "metadata.name",
        ),
        ("my.cache".into(), json!({"size": 2}), "metadata.name"),
        ("1cache".into(), json!({"size": 2}), "metadata.name"),
        // Memcached `cache`'s headless Service is `cache-headless`.
        ("cache-headless".into(), json!({"size": 2}), "metadata.name"),
        (
            "maxitemsize-odd".into(),
            json!({"size": 1, "config": {"maxItemSize": "1500k"}}),
            "spec.config.maxItemSize",
        ),
        (
            "extra-arg-space".into(),
            json!({"size": 1, "config": {"extraArgs": ["-R 30"]}}),
            "spec.config.extraArgs[0]",
        ),
        (
            "port-clash".into(),
            json!({"size": 2, "containerPort": 9150}),
            "spec.containerPort",
        ),
        (
            "md5-digest".into(),
            json!({"size": 2, "image": format!("memcached@md5:{}", &SHA[..32])}),
            "spec.image",
        ),
        (
            "short-digest".into(),
            json!({"size": 2, "image": format!("memcached@sha256:{}", &SHA[..40])}),
            "spec.image",
        ),
        (
            "upper-digest".into(),
            json!({"size": 2, "image": format!("memcached@sha256:{}", SHA.to_uppercase())}),
            "spec.image",
        ),
        (
            "bad-registry-port".into(),
            json!({"size": 2, "image": "registry.example.com:99999/memcached:1"}),
            "spec.image",
        ),
        (
            "image-id".into(),
            json!({"size": 2, "image": SHA}),
            "spec.image",
        ),
        (
            "proxy-digest".into(),
            json!({"size": 2, "proxy": {"image": format!("memcached@sha256:{}", &SHA[..40])}}),
            "spec.proxy.image",
        ),
        (
            "warm-up-with-copies".into(),
            json!({"size": 4, "proxy": {"enabled": true, "copies": 2, "image": "memcached:1.6.38",
                   "warmUp": {"enabled": true}}}),
            "spec.proxy.warmUp.enabled",
        ),
        (
            "warm-up-stock-image".into(),
            json!({"size": 2, "proxy": {"enabled": true, "warmUp": {"enabled": true}}}),
            "spec.proxy.image",
        ),
        (
            "gutter-with-copies".into(),
            json!({"size": 4, "proxy": {"enabled": true, "copies": 2, "gutter": {"enabled": true}}}),
            "spec.proxy.gutter.enabled",
        ),
        (
            "gutter-over-the-limit".into(),
            json!({"size": 2, "proxy": {"enabled": true, "gutter": {"enabled": true, "memoryMiB": 256},
                   "resources": {"limits": {"memory": "256Mi"}}}}),
            "spec.proxy.gutter.memoryMiB",
        ),
        (
            "zones-not-one-per-copy".into(),
            json!({"size": 6, "proxy": {"enabled": true, "copies": 3, "zones": ["zone-a", "zone-b"]}}),
            "spec.proxy.zones",
        ),
        (
            "zones-twice".into(),
            json!({"size": 4, "proxy": {"enabled": true, "copies": 2, "zones": ["zone-a", "zone-a"]}}),
            "spec.proxy.zones[1]",
        ),
        (
            "zone-not-a-label".into(),
            json!({"size": 4, "proxy": {"enabled": true, "copies": 2, "zones": ["zone a", "zone-b"]}}),
            "spec.proxy.zones[0]",
        ),
        (
            "proxy-with-sasl".into(),
            json!({"size": 2, "proxy": {"enabled": true}, "sasl": {"secretName": "pwdb"}}),
            "spec.proxy.enabled",
        ),
        // memcached refuses to start with these extstore settings (storage.c, extstore.c).
        (
            "ext-page-odd".into(),
            json!({"size": 1, "extstore": {"enabled": true, "pageSizeMiB": 63}}),
            "spec.extstore.pageSizeMiB",
        ),
        (
            "ext-wbuf-uneven".into(),
            json!({"size": 1, "extstore": {"enabled": true, "pageSizeMiB": 64, "writeBufferMiB": 6}}),
            "spec.extstore.writeBufferMiB",
        ),
        (
            "ext-size-under-a-page".into(),
            json!({"size": 1, "extstore": {"enabled": true, "size": "10Mi"}}),
            "spec.extstore.size",
        ),
        // memcached's default item size limit is 1 MiB (`-I 1m`): no item reaches it.
        (
            "ext-item-size-max".into(),
            json!({"size": 1, "extstore": {"enabled": true, "itemSizeBytes": 1_048_576}}),
            "spec.extstore.itemSizeBytes",
        ),
        // A memory limit below what memcached's flags make it use: OOM-killed as it fills.
        (
            "ext-memory-limit-under-buffers".into(),
            json!({"size": 1, "extstore": {"enabled": true, "writeBufferMiB": 64},
                   "resources": {"limits": {"memory": "32Mi"}}}),
            "spec.resources.limits[memory]",
        ),
        (
            "memory-limit-under-cache".into(),
            json!({"size": 1, "config": {"memoryMiB": 256},
                   "resources": {"limits": {"memory": "128Mi"}}}),
            "spec.resources.limits[memory]",
        ),
        (
            "network-policy-without-clients".into(),
            json!({"size": 1, "networkPolicy": {"enabled": true}}),
            "spec.networkPolicy.from",
        ),
        (
            "client-ca-name".into(),
            json!({"size": 1, "tls": {"secretName": "certs", "clientAuth": {"caSecretName": "Client_CA"}}}),
            "spec.tls.clientAuth.caSecretName",
        ),
        // memcached would be killed in the middle of its own delay.
        (
            "grace-within-delay".into(),
            json!({"size": 1, "gracefulShutdown": {"preStopDelaySeconds": 30,
                   "terminationGracePeriodSeconds": 30}}),
            "spec.gracefulShutdown.terminationGracePeriodSeconds",
        ),
        // Outside the restricted Pod Security Standard.
        (
            "pod-runs-as-root".into(),
            json!({"size": 1, "podSecurityContext": {"runAsUser": 0}}),
            "spec.podSecurityContext.runAsUser",
        ),
        (
            "container-escalates".into(),
            json!({"size": 1, "containerSecurityContext": {"allowPrivilegeEscalation": true}}),
            "spec.containerSecurityContext.allowPrivilegeEscalation",
        ),
        // The autoscaler's bounds, its targets, and a size it would not keep.
        (
            "autoscaling-max-below-min".into(),
            json!({"size": 3, "autoscaling": {"minReplicas": 3, "maxReplicas": 2,
                   "targetCPUUtilizationPercentage": 70}}),
            "spec.autoscaling.maxReplicas",
        ),
        (
            "autoscaling-without-target".into(),
            json!({"size": 2, "autoscaling": {"maxReplicas": 4}}),
            "spec.autoscaling.targetCPUUtilizationPercentage",
        ),
        (
            "autoscaling-cpu-without-request".into(),
            json!({"size": 2, "autoscaling": {"maxReplicas": 4, "targetCPUUtilizationPercentage": 70},
                   "resources": {"limits": {"memory": "256Mi"}}}),
            "spec.autoscaling.targetCPUUtilizationPercentage",
        ),
        (
            "autoscaling-size-outside".into(),
            json!({"size": 9, "autoscaling": {"minReplicas": 2, "maxReplicas": 4,
                   "targetCPUUtilizationPercentage": 70}}),
            "spec.size",
        ),
        // The operator cannot send flush_all to a pool that wants credentials or TLS.
        (
            "flush-with-sasl".into(),
            json!({"size": 1, "sasl": {"secretName": "auth"}, "flush": {"requestedAt": "now"}}),
            "spec.flush",
        ),
        (
            "service-label-of-the-operator".into(),
            json!({"size": 1, "service": {"labels": {"app.kubernetes.io/instance": "other"}}}),
            "spec.service.labels[app.kubernetes.io/instance]",
        ),
    ]
}

/// Memcacheds that the CRD schema and the operator's own rules let through but whose
/// children Kubernetes refuses: fields passed through to the pods, checked by the API
/// server's rules for the Deployment. Each names the Memcached's field the refusal must be
/// reported on and words of the API server's own message.
pub fn children_refused() -> Vec<(&'static str, Value, &'static str, &'static str)> {
    let required_node_term = |expression: Value| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}})
    };
    vec![
        (
            "cpu-over-limit",
            json!({"size": 1, "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}),
            "spec.resources.requests",
            "must be less than or equal to cpu limit",
        ),
        (
            "proxy-cpu-over-limit",
            json!({"size": 1, "proxy": {"enabled": true,
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}),
            "spec.proxy.resources.requests",
            "must be less than or equal to cpu limit",
        ),
        (
            "toleration-bogus",
            json!({"size": 1, "tolerations": [{"key": "k", "operator": "Bogus", "value": "v"}]}),
            "spec.tolerations[0].operator",
            "Unsupported value: \"Bogus\"",
        ),
        (
            "toleration-exists-value",
            json!({"size": 1, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}),
            "spec.tolerations[0].operator",
            "must be empty",
        ),
        (
            "toleration-effect",
            json!({"size": 1, "tolerations": [{"key": "k", "operator": "Exists", "effect": "Sometimes"}]}),
            "spec.tolerations[0].effect",
            "Unsupported value: \"Sometimes\"",
        ),
        (
            "memory-negative",
            json!({"size": 1, "resources": {"limits": {"memory": "-1Gi"}}}),
            "spec.resources.limits[memory]",
            "must be greater than or equal to 0",
        ),
        (
            "resource-name",
            json!({"size": 1, "resources": {"requests": {"bogus": "1"}}}),
            "spec.resources.requests[bogus]",
            "must be a standard resource",
        ),
        (
            "node-selector-value",
            json!({"size": 1, "nodeSelector": {"disk": "fast ssd!"}}),
            "spec.nodeSelector",
            "a valid label must be",
        ),
        (
            "pod-label-key",
            json!({"size": 1, "podLabels": {"bad key!": "x"}}),
            "spec.podLabels",
            "name part must consist of",
        ),
        (
            "pod-annotation-key",
            json!({"size": 1, "podAnnotations": {"a/b/c": "x"}}),
            "spec.podAnnotations",
            "must consist of alphanumeric characters",
        ),
        (
            "affinity-operator",
            json!({"size": 1, "affinity": required_node_term(json!({"key": "zone", "operator": "Near", "values": ["a"]}))}),
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator",
            "\"Near\"",
        ),
        (
            "affinity-topology-key",
            json!({"size": 1, "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ""}]}}}),
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
            "Required value",
        ),
        (
            "priority-class",
            json!({"size": 1, "priorityClassName": "Not_A_Name"}),
            "spec.priorityClassName",
            "a lowercase RFC 1123 subdomain",
        ),
        (
            "service-label-key",
            json!({"size": 1, "service": {"labels": {"bad key!": "x"}}}),
            "spec.service.labels",
            "name part must consist of",
        ),
        (
            "service-annotation-key",
            json!({"size": 1, "proxy": {"enabled": true}, "service": {"annotations": {"a/b/c": "x"}}}),
            "spec.service.annotations",
            "must consist of alphanumeric characters",
        ),
        (
            "seccomp-localhost-without-profile",
            json!({"size": 1, "podSecurityContext": {"seccompProfile": {"type": "Localhost"}}}),
            "spec.podSecurityContext.seccompProfile.localhostProfile",
            "Required value",
        ),
        (
            "network-policy-cidr",
            json!({"size": 1, "networkPolicy": {"enabled": true,
                   "from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}}),
            "spec.networkPolicy.from[0].ipBlock.cidr",
            "must be a valid CIDR",
        ),
        (
            "container-negative-uid",
            json!({"size": 1, "containerSecurityContext": {"runAsUser": -5}}),
            "spec.containerSecurityContext.runAsUser",
            "must be between 0 and 2147483647",
        ),
    ]
}
