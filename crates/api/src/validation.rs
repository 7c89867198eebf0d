//! The API's rules for a Memcached beyond what the CRD schema expresses: names, ports, image
//! and quantity fields, the proxy's and pass-through fields, and which features combine.
//! It applies memcached's own rules too, which [`crate::memcached_rules`] states.
//!
//! Shared by the reconciler (which reports a `Degraded` condition) and the validating
//! admission webhook (which rejects the request), so both give the same answer in the same
//! words. Messages follow Kubernetes' field errors: `spec.size: Invalid value: -1: must be
//! between 0 and 100`.
//!
//! No field is immutable: the Deployment's selector (the one immutable thing downstream)
//! depends only on `metadata.name`, which Kubernetes already keeps fixed, and size, port
//! and image are all changed by a rolling update. Risky but legal choices (one pod, an
//! unpinned image, a port change that moves the Service) get [`crate::warnings`] instead.

use crate::memcached_rules;
use crate::quantity::QUANTITY_PATTERN;
use crate::{EXPORTER_PORT, MAX_SIZE, Memcached, MemcachedSpec};

// Kept at their old paths so callers outside this crate keep compiling; new code names
// the module that owns them.
pub use crate::field_error::{FieldError, ValidationErrors};
pub use crate::image::{ImageReference, MAX_IMAGE_NAME_LENGTH, MAX_TAG_LENGTH};
pub use crate::memcached_rules::{
    EXTSTORE_WRITE_BUFFERS, ITEM_SIZE_STEP, MANAGED_FLAGS, MAX_ITEM_SIZE, MIN_ITEM_SIZE,
    parse_item_size,
};
pub use crate::quantity::{is_quantity, parse_quantity_bytes};
pub use crate::warnings::{update_warnings, warnings};

/// Longest Memcached name accepted. Child objects are named `<name>` and `<name>-<suffix>`
/// with suffixes up to 9 characters (`-headless`), and each must be a DNS-1035 label
/// (63 characters); the name is also the `app.kubernetes.io/instance` label value.
pub const MAX_NAME_LENGTH: usize = 54;
/// Characters the API server appends to `metadata.generateName`.
pub const GENERATED_SUFFIX_LENGTH: usize = 5;

/// A port the memcached container may not listen on, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservedPort {
    pub port: i32,
    pub purpose: &'static str,
}

/// Ports other containers of the memcached pod use or will use. Containers of a pod share
/// one network namespace, so `spec.containerPort` may not take any of them.
pub const RESERVED_PORTS: &[ReservedPort] = &[ReservedPort {
    port: EXPORTER_PORT,
    purpose: "the memcached exporter sidecar's metrics port (memcached_exporter's default)",
}];

const DNS1035_RULE: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_dns1035_chars(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Checks that `name` is a DNS-1035 label no longer than [`MAX_NAME_LENGTH`], so that the
/// Service, Deployment and label values derived from it are valid.
pub fn validate_name(name: &str) -> Result<(), FieldError> {
    const FIELD: &str = "metadata.name";
    if name.is_empty() {
        return Err(FieldError::required(
            FIELD,
            "name or generateName is required",
        ));
    }
    if name.len() > MAX_NAME_LENGTH {
        return Err(FieldError::invalid(
            FIELD,
            name,
            format!(
                "must be no more than {MAX_NAME_LENGTH} characters (is {}), so that child names such as \"<name>-headless\" stay valid DNS-1035 labels (63 characters)",
                name.len()
            ),
        ));
    }
    let bytes = name.as_bytes();
    let starts_with_letter = bytes.first().is_some_and(u8::is_ascii_lowercase);
    let ends_alnum = bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if !is_dns1035_chars(bytes) || !starts_with_letter || !ends_alnum {
        return Err(FieldError::invalid(
            FIELD,
            name,
            format!("{DNS1035_RULE}; the name is used for the Service, which must be one"),
        ));
    }
    if let Some(other) = name.strip_suffix(HEADLESS_SUFFIX) {
        return Err(FieldError::invalid(
            FIELD,
            name,
            format!(
                "must not end in \"{HEADLESS_SUFFIX}\": the headless Service of a Memcached named \"{other}\" has this name, and the two would fight over it"
            ),
        ));
    }
    Ok(())
}

/// The suffix of a Memcached's headless Service (`NAME-headless`); no Memcached may be
/// named so, or its client Service would be another's headless one.
pub const HEADLESS_SUFFIX: &str = "-headless";

/// Checks a `metadata.generateName` prefix: with the 5 characters the API server appends
/// it must make a name [`validate_name`] accepts.
pub fn validate_generate_name(prefix: &str) -> Result<(), FieldError> {
    const FIELD: &str = "metadata.generateName";
    let max = MAX_NAME_LENGTH - GENERATED_SUFFIX_LENGTH;
    if prefix.len() > max {
        return Err(FieldError::invalid(
            FIELD,
            prefix,
            format!(
                "must be no more than {max} characters (is {}): with the {GENERATED_SUFFIX_LENGTH} generated characters the name must stay within {MAX_NAME_LENGTH}",
                prefix.len()
            ),
        ));
    }
    let bytes = prefix.as_bytes();
    if !is_dns1035_chars(bytes) || !bytes.first().is_some_and(u8::is_ascii_lowercase) {
        return Err(FieldError::invalid(
            FIELD,
            prefix,
            format!("with the generated suffix it must make a DNS-1035 label: {DNS1035_RULE}"),
        ));
    }
    Ok(())
}

/// The name checks of [`validate`]: `metadata.name`, or `metadata.generateName` when the
/// name is still to be generated.
pub fn validate_metadata(mc: &Memcached) -> Vec<FieldError> {
    let name = mc.metadata.name.as_deref().unwrap_or_default();
    let generate = mc.metadata.generate_name.as_deref().unwrap_or_default();
    let result = if name.is_empty() && !generate.is_empty() {
        validate_generate_name(generate)
    } else {
        validate_name(name)
    };
    result.err().into_iter().collect()
}

/// The spec checks of [`validate`], each naming its field.
pub fn validate_spec(spec: &MemcachedSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !(0..=MAX_SIZE).contains(&spec.size) {
        errors.push(FieldError::invalid(
            "spec.size",
            spec.size,
            format!("must be between 0 and {MAX_SIZE}"),
        ));
    }
    if !(1..=65535).contains(&spec.container_port) {
        errors.push(FieldError::invalid(
            "spec.containerPort",
            spec.container_port,
            "must be between 1 and 65535, inclusive",
        ));
    } else if let Some(reserved) = RESERVED_PORTS
        .iter()
        .find(|r| r.port == spec.container_port)
    {
        errors.push(FieldError::invalid(
            "spec.containerPort",
            spec.container_port,
            format!(
                "is reserved for {} in the same pod; choose another port",
                reserved.purpose
            ),
        ));
    }
    if let Some(image) = spec.image.as_deref()
        && let Err(reason) = validate_image(image)
    {
        errors.push(FieldError::invalid("spec.image", image, reason));
    }
    if let Some(config) = &spec.config {
        errors.extend(validate_config(config));
    }
    if let Some(resources) = &spec.resources {
        errors.extend(validate_quantities("spec.resources", resources));
    }
    if let Some(labels) = &spec.pod_labels {
        for key in labels
            .keys()
            .filter(|k| OPERATOR_LABELS.contains(&k.as_str()))
        {
            errors.push(FieldError::invalid(
                format!("spec.podLabels[{key}]"),
                key,
                "is set by the operator (it selects the pods) and cannot be overridden",
            ));
        }
    }
    if let Some(exporter) = &spec.exporter
        && let Some(image) = exporter.image.as_deref()
        && let Err(reason) = validate_image(image)
    {
        errors.push(FieldError::invalid("spec.exporter.image", image, reason));
    }
    for (field, secret) in [
        (
            "spec.sasl.secretName",
            spec.sasl.as_ref().map(|s| &s.secret_name),
        ),
        (
            "spec.tls.secretName",
            spec.tls.as_ref().map(|t| &t.secret_name),
        ),
        (
            "spec.tls.clientAuth.caSecretName",
            spec.tls
                .as_ref()
                .and_then(|t| t.client_auth.as_ref())
                .and_then(|c| c.ca_secret_name.as_ref()),
        ),
    ] {
        if let Some(name) = secret
            && !is_dns1123_subdomain(name)
        {
            errors.push(FieldError::invalid(
                field,
                name,
                "must be a Secret name: a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)",
            ));
        }
    }
    if let Some(proxy) = &spec.proxy {
        errors.extend(validate_proxy(proxy, spec));
    }
    if let Some(rollout) = &spec.rollout
        && !(0..=crate::MAX_MIN_READY_SECONDS).contains(&rollout.min_ready_seconds)
    {
        errors.push(FieldError::invalid(
            "spec.rollout.minReadySeconds",
            rollout.min_ready_seconds,
            format!(
                "must be between 0 and {}, inclusive",
                crate::MAX_MIN_READY_SECONDS
            ),
        ));
    }
    if let Some(at) = spec
        .rollout
        .as_ref()
        .and_then(|r| r.restarted_at.as_deref())
        && !(1..=64).contains(&at.chars().count())
    {
        errors.push(FieldError::invalid(
            "spec.rollout.restartedAt",
            at,
            "must be 1 to 64 characters (a timestamp, say: each new value restarts the pods once)",
        ));
    }
    if spec.tls_reloads_in_place() && spec.container_port == crate::TLS_ADMIN_PORT {
        errors.push(FieldError::invalid(
            "spec.containerPort",
            spec.container_port,
            "is memcached's loopback-only listener for the TLS reload agent (spec.tls.rotation InPlace); choose another port",
        ));
    }
    if let Some(extstore) = &spec.extstore {
        errors.extend(validate_extstore(extstore, spec));
    }
    errors.extend(validate_memory(spec));
    if let Some(service) = &spec.service {
        errors.extend(validate_service_metadata(service));
    }
    if let Some(policy) = spec.network_policy_enabled()
        && policy.from.is_empty()
    {
        errors.push(FieldError::required(
            "spec.networkPolicy.from",
            "the clients allowed to memcached's port: at least one peer (`{namespaceSelector: {}}` admits every pod of the cluster); without one only the pool's proxy could reach it",
        ));
    }
    if let Some(shutdown) = &spec.graceful_shutdown {
        errors.extend(validate_graceful_shutdown(shutdown));
    }
    if let Some(autoscaling) = &spec.autoscaling {
        errors.extend(validate_autoscaling(autoscaling, spec));
    }
    if let Some(flush) = &spec.flush {
        errors.extend(validate_flush(flush, spec));
    }
    if let Some(context) = &spec.pod_security_context {
        errors.extend(crate::pod_security::check_pod(
            "spec.podSecurityContext",
            context,
        ));
    }
    if let Some(context) = &spec.container_security_context {
        errors.extend(crate::pod_security::check_container(
            "spec.containerSecurityContext",
            context,
        ));
    }
    if spec.exporter_enabled() && (spec.sasl.is_some() || spec.tls.is_some()) {
        errors.push(FieldError::invalid(
            "spec.exporter.enabled",
            true,
            "the memcached exporter cannot authenticate with SASL or speak TLS to memcached; disable the exporter or the SASL/TLS settings",
        ));
    }
    errors
}

/// The annotation domain the operator keeps for its own keys on its children.
pub const OPERATOR_ANNOTATION_PREFIX: &str = "memcached.cache.example.com/";

/// Checks `spec.service`: the operator's labels and annotations stay its own. The keys'
/// and values' syntax is the API server's to judge (the webhook's dry run of the
/// Services names these fields in its refusal).
fn validate_service_metadata(service: &crate::ServiceMetadataSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for key in service
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| OPERATOR_LABELS.contains(&k.as_str()))
    {
        errors.push(FieldError::invalid(
            format!("spec.service.labels[{key}]"),
            key,
            "is set by the operator (it names the pool) and cannot be overridden",
        ));
    }
    for key in service
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(OPERATOR_ANNOTATION_PREFIX))
    {
        errors.push(FieldError::invalid(
            format!("spec.service.annotations[{key}]"),
            key,
            format!("the {OPERATOR_ANNOTATION_PREFIX} annotations are the operator's own"),
        ));
    }
    errors
}

/// Checks `spec.gracefulShutdown`: its ranges, and a grace period that outlasts the delay
/// (the kubelet kills the containers when the grace period ends, delay or not).
fn validate_graceful_shutdown(shutdown: &crate::GracefulShutdownSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let delay = shutdown.pre_stop_delay_seconds;
    if !(0..=crate::MAX_PRE_STOP_DELAY_SECONDS).contains(&delay) {
        errors.push(FieldError::invalid(
            "spec.gracefulShutdown.preStopDelaySeconds",
            delay,
            format!(
                "must be between 0 and {}, inclusive",
                crate::MAX_PRE_STOP_DELAY_SECONDS
            ),
        ));
    }
    if let Some(grace) = shutdown.termination_grace_period_seconds {
        if !(1..=crate::MAX_TERMINATION_GRACE_SECONDS).contains(&grace) {
            errors.push(FieldError::invalid(
                "spec.gracefulShutdown.terminationGracePeriodSeconds",
                grace,
                format!(
                    "must be between 1 and {}, inclusive",
                    crate::MAX_TERMINATION_GRACE_SECONDS
                ),
            ));
        } else if grace <= delay {
            errors.push(FieldError::invalid(
                "spec.gracefulShutdown.terminationGracePeriodSeconds",
                grace,
                format!(
                    "must be longer than spec.gracefulShutdown.preStopDelaySeconds ({delay}): the grace period counts from the deletion, the delay included, and the kubelet kills memcached when it ends"
                ),
            ));
        }
    }
    errors
}

/// Checks `spec.flush`: its ranges, and a pool the operator can send `flush_all` to (memcached's
/// text protocol on the pods' port, without credentials).
fn validate_flush(flush: &crate::FlushSpec, spec: &MemcachedSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let length = flush.requested_at.chars().count();
    if !(1..=64).contains(&length) {
        errors.push(FieldError::invalid(
            "spec.flush.requestedAt",
            &flush.requested_at,
            "must be 1 to 64 characters",
        ));
    }
    if !(0..=crate::MAX_FLUSH_PAUSE_SECONDS).contains(&flush.pause_seconds) {
        errors.push(FieldError::invalid(
            "spec.flush.pauseSeconds",
            flush.pause_seconds,
            format!(
                "must be between 0 and {}, inclusive",
                crate::MAX_FLUSH_PAUSE_SECONDS
            ),
        ));
    }
    let why = if spec.sasl.is_some() {
        Some(
            "spec.sasl: memcached then speaks only the binary protocol, with credentials the operator does not hold",
        )
    } else if spec.tls.is_some() {
        Some("spec.tls: the operator does not yet speak TLS to the pods")
    } else {
        None
    };
    if let Some(why) = why {
        errors.push(FieldError::forbidden(
            "spec.flush",
            format!("the operator sends flush_all to each pod over memcached's text protocol; not with {why}"),
        ));
    }
    errors
}

/// Checks `spec.autoscaling`: its ranges, a target to scale on, a request of the resource
/// each target is a percentage of, and a `spec.size` the autoscaler would keep (0 pauses it,
/// as it does any HPA's target).
fn validate_autoscaling(
    autoscaling: &crate::AutoscalingSpec,
    spec: &MemcachedSpec,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let (min, max) = (autoscaling.min_replicas, autoscaling.max_replicas);
    for (field, value) in [("minReplicas", min), ("maxReplicas", max)] {
        if !(1..=MAX_SIZE).contains(&value) {
            errors.push(FieldError::invalid(
                format!("spec.autoscaling.{field}"),
                value,
                format!("must be between 1 and {MAX_SIZE}, inclusive"),
            ));
        }
    }
    if max < min {
        errors.push(FieldError::invalid(
            "spec.autoscaling.maxReplicas",
            max,
            format!("must be at least spec.autoscaling.minReplicas ({min})"),
        ));
    }
    let targets = [
        (
            "targetCPUUtilizationPercentage",
            autoscaling.target_cpu_utilization_percentage,
            "cpu",
        ),
        (
            "targetMemoryUtilizationPercentage",
            autoscaling.target_memory_utilization_percentage,
            "memory",
        ),
    ];
    if targets.iter().all(|(_, target, _)| target.is_none()) {
        errors.push(FieldError::required(
            "spec.autoscaling.targetCPUUtilizationPercentage",
            "a target to scale on: targetCPUUtilizationPercentage and/or targetMemoryUtilizationPercentage",
        ));
    }
    for (field, target, resource) in targets {
        let Some(target) = target else { continue };
        if !(1..=crate::MAX_UTILIZATION_PERCENTAGE).contains(&target) {
            errors.push(FieldError::invalid(
                format!("spec.autoscaling.{field}"),
                target,
                format!(
                    "must be between 1 and {}, inclusive",
                    crate::MAX_UTILIZATION_PERCENTAGE
                ),
            ));
        }
        // Unset resources are derived, with a CPU and a memory request; a request left out
        // of resources the user wrote is their limit's, when there is one.
        let requested = spec.resources.as_ref().is_none_or(|r| {
            [&r.requests, &r.limits]
                .into_iter()
                .flatten()
                .any(|m| m.contains_key(resource))
        });
        if !requested {
            errors.push(FieldError::invalid(
                format!("spec.autoscaling.{field}"),
                target,
                format!(
                    "is a percentage of memcached's {resource} request, and spec.resources requests no {resource}"
                ),
            ));
        }
    }
    let window = autoscaling.scale_down_stabilization_seconds;
    if !(0..=crate::MAX_SCALE_DOWN_STABILIZATION_SECONDS).contains(&window) {
        errors.push(FieldError::invalid(
            "spec.autoscaling.scaleDownStabilizationSeconds",
            window,
            format!(
                "must be between 0 and {}, inclusive",
                crate::MAX_SCALE_DOWN_STABILIZATION_SECONDS
            ),
        ));
    }
    if spec.size != 0 && min <= max && !(min..=max).contains(&spec.size) {
        errors.push(FieldError::invalid(
            "spec.size",
            spec.size,
            format!(
                "must be between spec.autoscaling.minReplicas ({min}) and maxReplicas ({max}) while the autoscaler sizes the pool (0 pauses it)"
            ),
        ));
    }
    errors
}

/// Checks the quantities of `resources` (at `field`) against [`QUANTITY_PATTERN`].
fn validate_quantities(
    field: &str,
    resources: &k8s_openapi::api::core::v1::ResourceRequirements,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (list, quantities) in [
        ("requests", &resources.requests),
        ("limits", &resources.limits),
    ] {
        for (name, quantity) in quantities.iter().flatten() {
            if !is_quantity(&quantity.0) {
                errors.push(FieldError::invalid(
                    format!("{field}.{list}[{name}]"),
                    &quantity.0,
                    format!(
                        "quantities must match the regular expression '{}'",
                        QUANTITY_PATTERN
                    ),
                ));
            }
        }
    }
    errors
}

/// Whether `value` is a valid label value that is not empty.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// What a proxy pod needs besides its gutter's cache memory, MiB (its default memory limit
/// without a gutter, 128 MiB, holds the proxy's own 8 MiB and its connections with room).
const GUTTER_OVERHEAD_MIB: u64 = 64;

/// Checks `spec.proxy`. Its fields are checked whether or not it is enabled, so that
/// switching it on never meets an error left from before.
fn validate_proxy(proxy: &crate::ProxySpec, spec: &MemcachedSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !(1..=crate::MAX_PROXY_REPLICAS).contains(&proxy.replicas) {
        errors.push(FieldError::invalid(
            "spec.proxy.replicas",
            proxy.replicas,
            format!(
                "must be between 1 and {}: the proxy holds no data, so one pod per node that runs clients is plenty",
                crate::MAX_PROXY_REPLICAS
            ),
        ));
    }
    if !(1..=crate::MAX_PROXY_COPIES).contains(&proxy.copies) {
        errors.push(FieldError::invalid(
            "spec.proxy.copies",
            proxy.copies,
            format!(
                "must be between 1 (keys sharded over the pool) and {} (each key on that many pods)",
                crate::MAX_PROXY_COPIES
            ),
        ));
    }
    if let Some(image) = proxy.image.as_deref()
        && let Err(reason) = validate_image(image)
    {
        errors.push(FieldError::invalid("spec.proxy.image", image, reason));
    }
    if let Some(resources) = &proxy.resources {
        errors.extend(validate_quantities("spec.proxy.resources", resources));
    }
    if !proxy.zones.is_empty() && (proxy.copies < 2 || proxy.zones.len() != proxy.copies as usize) {
        errors.push(FieldError::invalid(
            "spec.proxy.zones",
            proxy.zones.join(","),
            format!(
                "{} zones for {} copies (spec.proxy.copies): each copy lives in one zone, so list one zone per copy, with 2 or 3 copies",
                proxy.zones.len(),
                proxy.copies
            ),
        ));
    }
    for (i, zone) in proxy.zones.iter().enumerate() {
        let field = format!("spec.proxy.zones[{i}]");
        if !is_label_value(zone) {
            errors.push(FieldError::invalid(
                field,
                zone,
                "must be a zone as nodes carry it in their topology.kubernetes.io/zone label: 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        } else if proxy.zones[..i].contains(zone) {
            errors.push(FieldError::invalid(
                field,
                zone,
                "is listed twice: each copy lives in a zone of its own",
            ));
        }
    }
    if proxy.warm_up_enabled() && proxy.copies > 1 {
        errors.push(FieldError::invalid(
            "spec.proxy.warmUp.enabled",
            true,
            format!(
                "warm-up works with one copy of each key (spec.proxy.copies is {}): with copies, a replaced pod's keys are still read from the other copies",
                proxy.copies
            ),
        ));
    }
    if proxy.warm_up_enabled() && proxy.image.is_none() {
        errors.push(FieldError::required(
            "spec.proxy.image",
            "spec.proxy.warmUp needs a proxy image whose memcached copies whole values into a new request: memcached up to 1.6.45 may truncate a large value read from a pipelined connection when it is written back (the operator's repository builds one with hack/memcached/proxy-read-fixes.patch)",
        ));
    }
    if let Some(gutter) = &proxy.gutter {
        if !(8..=4096).contains(&gutter.memory_mib) {
            errors.push(FieldError::invalid(
                "spec.proxy.gutter.memoryMiB",
                gutter.memory_mib,
                "must be between 8 and 4096 (MiB of cache in each proxy pod)",
            ));
        }
        if !(1..=3600).contains(&gutter.ttl_seconds) {
            errors.push(FieldError::invalid(
                "spec.proxy.gutter.ttlSeconds",
                gutter.ttl_seconds,
                "must be between 1 and 3600: the gutter holds a failed pod's keys for a short while",
            ));
        }
        if gutter.enabled && proxy.copies > 1 {
            errors.push(FieldError::invalid(
                "spec.proxy.gutter.enabled",
                true,
                format!(
                    "the gutter works with one copy of each key (spec.proxy.copies is {}): with copies, a failed pod's keys are read from the other copies",
                    proxy.copies
                ),
            ));
        }
        // The gutter fills the proxy's cache up to memoryMiB: a limit below it would have
        // the proxy killed for its memory once the gutter is full.
        let limit = proxy
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| crate::quantity::parse_quantity_bytes(&q.0));
        if let Some(limit) = limit
            && gutter.enabled
            && limit < (gutter.memory_mib.max(0) as u64 + GUTTER_OVERHEAD_MIB) << 20
        {
            errors.push(FieldError::invalid(
                "spec.proxy.gutter.memoryMiB",
                gutter.memory_mib,
                format!(
                    "does not fit the proxy's memory limit (spec.proxy.resources.limits.memory, {} MiB): the proxy needs the gutter's memory and {GUTTER_OVERHEAD_MIB} MiB more",
                    limit >> 20
                ),
            ));
        }
    }
    if proxy.enabled && spec.tls.is_some() {
        errors.push(FieldError::invalid(
            "spec.proxy.enabled",
            true,
            "the proxy does not yet speak TLS to the pool or to clients; disable the proxy or spec.tls",
        ));
    }
    if proxy.enabled && spec.sasl.is_some() {
        errors.push(FieldError::invalid(
            "spec.proxy.enabled",
            true,
            "memcached's proxy cannot authenticate to a pool with SASL; disable the proxy or spec.sasl",
        ));
    }
    errors
}

/// Checks `spec.extstore`, whether or not it is enabled, so that switching it on never meets
/// an error left from before: its ranges and the StorageClass name here, memcached's own
/// rules (pages, write buffers, UDP) in [`memcached_rules`]; the memory its write buffers
/// need is [`validate_memory`]'s.
fn validate_extstore(ext: &crate::ExtstoreSpec, spec: &MemcachedSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut range = |field: &str, value: i32, min: i32, max: i32| {
        let ok = (min..=max).contains(&value);
        if !ok {
            errors.push(FieldError::invalid(
                format!("spec.extstore.{field}"),
                value,
                format!("must be between {min} and {max}, inclusive"),
            ));
        }
        ok
    };
    let page_ok = range("pageSizeMiB", ext.page_size_mib, 2, 1024);
    let wbuf_ok = range("writeBufferMiB", ext.write_buffer_mib, 2, 256);
    range("threads", ext.threads, 1, 64);
    let item_ok = range("itemSizeBytes", ext.item_size_bytes, 1, i32::MAX);
    if let Some(age) = ext.item_age_seconds {
        range("itemAgeSeconds", age, 0, i32::MAX);
    }
    // memcached's rules are checked only on values within range: out of range, the range
    // error already names the field.
    for (field, value, ok) in [
        ("pageSizeMiB", ext.page_size_mib, page_ok),
        ("writeBufferMiB", ext.write_buffer_mib, wbuf_ok),
    ] {
        if ok && let Err(reason) = memcached_rules::check_extstore_alignment(value) {
            errors.push(FieldError::invalid(
                format!("spec.extstore.{field}"),
                value,
                reason,
            ));
        }
    }
    if page_ok
        && wbuf_ok
        && let Err(reason) = memcached_rules::check_write_buffer_divides_page(
            ext.page_size_mib,
            ext.write_buffer_mib,
        )
    {
        errors.push(FieldError::invalid(
            "spec.extstore.writeBufferMiB",
            ext.write_buffer_mib,
            reason,
        ));
    }
    let config = spec.config();
    if wbuf_ok
        && let Err(reason) = memcached_rules::check_write_buffer_holds_items(
            ext.write_buffer_mib,
            &config.max_item_size,
        )
    {
        errors.push(FieldError::invalid(
            "spec.extstore.writeBufferMiB",
            ext.write_buffer_mib,
            reason,
        ));
    }
    if item_ok
        && let Err(reason) =
            memcached_rules::check_extstore_item_size(ext.item_size_bytes, &config.max_item_size)
    {
        errors.push(FieldError::invalid(
            "spec.extstore.itemSizeBytes",
            ext.item_size_bytes,
            reason,
        ));
    }
    match parse_quantity_bytes(&ext.size) {
        None => errors.push(FieldError::invalid(
            "spec.extstore.size",
            &ext.size,
            "must be a quantity of bytes such as 512Mi, 4Gi or 10G",
        )),
        Some(bytes) if page_ok => {
            if let Err(reason) = memcached_rules::check_extstore_pages(bytes, ext.page_size_mib) {
                errors.push(FieldError::invalid("spec.extstore.size", &ext.size, reason));
            }
        }
        Some(_) => {}
    }
    if let Some(class) = ext.storage_class_name.as_deref()
        && !is_dns1123_subdomain(class)
    {
        errors.push(FieldError::invalid(
            "spec.extstore.storageClassName",
            class,
            "must be a StorageClass name: a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)",
        ));
    }
    if ext.enabled {
        for arg in memcached_rules::udp_flags(&config.extra_args) {
            errors.push(FieldError::invalid(
                "spec.config.extraArgs",
                arg,
                memcached_rules::UDP_WITH_EXTSTORE,
            ));
        }
    }
    errors
}

/// Checks the memory of `spec.resources` against what memcached's flags make it use
/// ([`memcached_rules::memory_floor_mib`]: the cache, plus extstore's write buffers when
/// extstore is on). The limit always: below it memcached is OOM-killed once its cache fills,
/// and the pod loses that cache. The request only with extstore, as it always was: without,
/// a request below the cache is a choice (a pod that may be evicted under node memory
/// pressure, never killed for its own use) that pools admitted before may have made.
fn validate_memory(spec: &MemcachedSpec) -> Vec<FieldError> {
    let Some(resources) = &spec.resources else {
        return Vec::new();
    };
    let config = spec.config();
    let write_buffers = spec.extstore_enabled().map(|e| e.write_buffer_mib);
    let mut errors = Vec::new();
    for (list, quantities, checked) in [
        ("requests", &resources.requests, write_buffers.is_some()),
        ("limits", &resources.limits, true),
    ] {
        if let Some(memory) = quantities.as_ref().and_then(|q| q.get("memory"))
            && checked
            && let Some(bytes) = parse_quantity_bytes(&memory.0)
            && let Err(reason) =
                memcached_rules::check_memory_floor(bytes, config.memory_mib, write_buffers)
        {
            let reason = if list == "limits" {
                format!(
                    "{reason}; below it memcached is OOM-killed as it fills its cache, and the pod's cache is lost"
                )
            } else {
                reason
            };
            errors.push(FieldError::invalid(
                format!("spec.resources.{list}[memory]"),
                &memory.0,
                reason,
            ));
        }
    }
    errors
}

/// Labels the operator sets on every pod; `spec.podLabels` may not override them.
pub const OPERATOR_LABELS: [&str; 4] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
];

fn is_dns1123_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
        })
}

/// The checks of `spec.config` (ranges, item size, extra flags).
pub fn validate_config(config: &crate::MemcachedConfig) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut range = |field: &str, value: i32, min: i32, max: i32| {
        if !(min..=max).contains(&value) {
            errors.push(FieldError::invalid(
                format!("spec.config.{field}"),
                value,
                format!("must be between {min} and {max}, inclusive"),
            ));
        }
    };
    range("memoryMiB", config.memory_mib, 8, 65536);
    range("maxConnections", config.max_connections, 16, 65536);
    range("threads", config.threads, 1, 64);
    range("verbosity", config.verbosity, 0, 3);
    // memcached's rule is checked only with both values within range: out of range, the
    // range error already names the field.
    if (1..=64).contains(&config.threads)
        && config.max_connections >= 16
        && let Err(reason) =
            memcached_rules::check_connections(config.threads, config.max_connections)
    {
        errors.push(FieldError::invalid(
            "spec.config.maxConnections",
            config.max_connections,
            reason,
        ));
    }
    if let Err(reason) = memcached_rules::check_item_size(&config.max_item_size, config.memory_mib)
    {
        errors.push(FieldError::invalid(
            "spec.config.maxItemSize",
            &config.max_item_size,
            reason,
        ));
    }
    for (i, arg) in config.extra_args.iter().enumerate() {
        if memcached_rules::is_managed_flag(arg) {
            errors.push(FieldError::invalid(
                format!("spec.config.extraArgs[{i}]"),
                arg,
                "sets a flag the operator manages; use the matching spec field (config.memoryMiB, maxConnections, threads, maxItemSize, verbosity, containerPort, sasl, tls, extstore) instead",
            ));
        } else if arg.is_empty() || arg.len() > 256 || arg.chars().any(char::is_control) {
            errors.push(FieldError::invalid(
                format!("spec.config.extraArgs[{i}]"),
                arg,
                "must be 1 to 256 characters without control characters",
            ));
        } else if arg.chars().any(char::is_whitespace) {
            errors.push(FieldError::invalid(
                format!("spec.config.extraArgs[{i}]"),
                arg,
                "must not contain spaces: each element is one argument (no shell splits them), so write [\"-R\", \"30\"], not [\"-R 30\"]",
            ));
        }
    }
    errors
}

/// Validates what the reconciler needs before it creates anything for `mc`.
pub fn validate(mc: &Memcached) -> Result<(), ValidationErrors> {
    let mut errors = validate_metadata(mc);
    errors.extend(validate_spec(&mc.spec));
    ValidationErrors(errors).into_result()
}

/// Validates an update: [`validate`] of the new object, and one rule about transitions:
/// while `spec.autoscaling` is set before and after, `spec.size` is the autoscaler's (it
/// writes it through the scale subresource, which this webhook does not see), so an update
/// of the object that changes it would fight the autoscaler and is refused. No field is
/// immutable (see the module documentation).
pub fn validate_update(old: &Memcached, new: &Memcached) -> Result<(), ValidationErrors> {
    let mut errors = match validate(new) {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    };
    if old.spec.autoscaling.is_some()
        && new.spec.autoscaling.is_some()
        && old.spec.size != new.spec.size
    {
        errors.push(FieldError::forbidden(
            "spec.size",
            format!(
                "the HorizontalPodAutoscaler sizes the pool while spec.autoscaling is set (it is {}); change spec.autoscaling's bounds, or remove spec.autoscaling to size the pool by hand (`kubectl scale` goes to the autoscaler's target and is overridden by it)",
                old.spec.size
            ),
        ));
    }
    ValidationErrors(errors).into_result()
}

/// Checks an image reference (see [`ImageReference::parse`]); the error is the reason,
/// without the image itself.
pub fn validate_image(image: &str) -> Result<(), String> {
    ImageReference::parse(image).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemcachedSpec;

    fn mc(name: &str, size: i32) -> Memcached {
        Memcached::new(name, MemcachedSpec::with_size(size))
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn autoscaled(size: i32) -> Memcached {
        let mut m = mc("cache", size);
        m.spec.autoscaling = Some(crate::AutoscalingSpec {
            min_replicas: 2,
            max_replicas: 6,
            target_cpu_utilization_percentage: Some(70),
            target_memory_utilization_percentage: None,
            scale_down_stabilization_seconds: 600,
        });
        m
    }

    /// While the autoscaler sizes the pool, an update of the object that changes the size
    /// is refused on `spec.size`; one that changes anything else, or that turns the
    /// autoscaler on or off with a size of its own, is not.
    #[test]
    fn an_update_that_sizes_an_autoscaled_pool_by_hand_is_refused() {
        let old = autoscaled(4);
        let err = validate_update(&old, &autoscaled(5)).expect_err("size changed by hand");
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(err.0[0].field, "spec.size");
        assert!(err.to_string().contains("HorizontalPodAutoscaler"), "{err}");
        let mut other = autoscaled(4);
        other.spec.container_port = 11311;
        assert_eq!(validate_update(&old, &other), Ok(()));
        assert_eq!(validate_update(&old, &mc("cache", 9)), Ok(()));
        assert_eq!(validate_update(&mc("cache", 1), &autoscaled(3)), Ok(()));
        // 0 pauses it, within the bounds or not; a size outside them is refused at once.
        assert_eq!(validate(&autoscaled(0)), Ok(()));
        let err = validate(&autoscaled(7)).expect_err("above maxReplicas");
        assert_eq!(err.0[0].field, "spec.size");
    }

    #[test]
    fn names_that_make_valid_children_pass() {
        for name in [
            "memcached-sample",
            "a",
            "cache-01",
            "headless",
            "headless-cache",
            &"a".repeat(MAX_NAME_LENGTH),
        ] {
            assert_eq!(validate_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_that_break_children_are_rejected_naming_the_field() {
        let too_long = "a".repeat(MAX_NAME_LENGTH + 1);
        for name in [
            "",
            "Cache",
            "1cache",
            "cache-",
            "my.cache",
            "ca_che",
            too_long.as_str(),
            // Memcached `cache` has a headless Service of this name.
            "cache-headless",
        ] {
            let err = validate_name(name).expect_err(name);
            assert_eq!(err.field, "metadata.name");
        }
    }

    #[test]
    fn generate_name_leaves_room_for_the_suffix() {
        assert!(validate_generate_name("cache-").is_ok());
        assert!(validate_generate_name(&"a".repeat(49)).is_ok());
        assert!(validate_generate_name(&"a".repeat(50)).is_err());
        assert!(validate_generate_name("Cache-").is_err());
        assert!(validate_generate_name("-cache").is_err());
        let mut m = mc("", 1);
        m.metadata.name = None;
        m.metadata.generate_name = Some("cache-".into());
        assert_eq!(validate(&m), Ok(()));
        m.metadata.generate_name = None;
        let errors = validate(&m).expect_err("no name");
        assert_eq!(errors.0[0].reason(), "FieldValueRequired");
    }

    #[test]
    fn spec_bounds_are_checked_in_kubernetes_words() {
        let errors = validate(&mc("x", -1)).expect_err("negative size");
        assert_eq!(errors.0[0].field, "spec.size");
        assert_eq!(
            errors.to_string(),
            "spec.size: Invalid value: -1: must be between 0 and 100"
        );
        let errors = validate(&mc("x", MAX_SIZE + 1)).expect_err("huge size");
        assert!(errors.to_string().contains("spec.size"));
        let mut bad_port = mc("x", 1);
        bad_port.spec.container_port = 0;
        assert_eq!(
            validate(&bad_port).expect_err("port").0[0].field,
            "spec.containerPort"
        );
        assert!(validate(&mc("x", 0)).is_ok());
    }

    #[test]
    fn the_exporter_port_is_reserved() {
        let mut m = mc("x", 1);
        m.spec.container_port = EXPORTER_PORT;
        let errors = validate(&m).expect_err("clash");
        assert_eq!(errors.0[0].field, "spec.containerPort");
        assert!(errors.to_string().contains("reserved"), "{errors}");
        assert!(errors.to_string().contains("9150"), "{errors}");
    }

    #[test]
    fn images_with_whitespace_or_scheme_are_rejected() {
        assert!(validate_image("memcached:1.6").is_ok());
        assert!(
            validate_image(&format!(
                "registry.example.com:5000/team/memcached@sha256:{SHA}"
            ))
            .is_ok()
        );
        assert!(validate_image("memcached 1.6").is_err());
        assert!(validate_image("https://memcached").is_err());
        assert!(validate_image("").is_err());
        // Stricter than before: a digest must be a real one.
        assert!(validate_image("registry.example.com:5000/team/memcached@sha256:abc").is_err());
    }

    fn ext(edit: impl FnOnce(&mut crate::ExtstoreSpec)) -> Memcached {
        with(|s| {
            let mut e = crate::ExtstoreSpec::default();
            edit(&mut e);
            s.extstore = Some(Box::new(e));
        })
    }

    /// Each rule of memcached's extstore (storage.c, extstore.c) is refused with the field
    /// named; the values are memcached's, not ours.
    #[test]
    fn extstore_values_memcached_refuses_are_refused_with_the_field_named() {
        let cases: Vec<(Memcached, &str, &str)> = vec![
            (
                ext(|e| e.page_size_mib = 63),
                "spec.extstore.pageSizeMiB",
                "even",
            ),
            (
                ext(|e| e.write_buffer_mib = 3),
                "spec.extstore.writeBufferMiB",
                "even",
            ),
            (
                ext(|e| {
                    e.page_size_mib = 6;
                    e.write_buffer_mib = 4
                }),
                "spec.extstore.writeBufferMiB",
                "divide",
            ),
            (
                ext(|e| e.page_size_mib = 0),
                "spec.extstore.pageSizeMiB",
                "between",
            ),
            (ext(|e| e.threads = 0), "spec.extstore.threads", "between"),
            (
                ext(|e| e.size = "10Mi".into()),
                "spec.extstore.size",
                "one page",
            ),
            (
                ext(|e| e.size = "lots".into()),
                "spec.extstore.size",
                "quantity",
            ),
            (
                ext(|e| {
                    e.size = "8Ti".into();
                    e.page_size_mib = 64
                }),
                "spec.extstore.size",
                "fewer than 65535",
            ),
            (
                ext(|e| e.item_size_bytes = 1024 * 1024),
                "spec.extstore.itemSizeBytes",
                "smaller than",
            ),
            (
                ext(|e| e.storage_class_name = Some("Fast SSD".into())),
                "spec.extstore.storageClassName",
                "StorageClass",
            ),
            (
                {
                    let mut m = ext(|e| e.write_buffer_mib = 2);
                    m.spec.config = cfg(|c| c.max_item_size = "4m".into());
                    m
                },
                "spec.extstore.writeBufferMiB",
                "largest item",
            ),
            (
                {
                    let mut m = ext(|_| {});
                    m.spec.config = cfg(|c| c.extra_args = vec!["-U".into(), "11211".into()]);
                    m
                },
                "spec.config.extraArgs",
                "UDP",
            ),
            (
                {
                    let mut m = ext(|_| {});
                    m.spec.config =
                        cfg(|c| c.extra_args = vec!["-o".into(), "ext_path=/tmp/x:1G".into()]);
                    m
                },
                "spec.config.extraArgs[1]",
                "manages",
            ),
            (
                {
                    let mut m = ext(|_| {});
                    m.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                        requests: Some(std::collections::BTreeMap::from([(
                            "memory".to_string(),
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity("80Mi".into()),
                        )])),
                        ..Default::default()
                    });
                    m
                },
                "spec.resources.requests[memory]",
                "88Mi",
            ),
            (
                with(|s| {
                    s.rollout = Some(crate::RolloutSpec {
                        min_ready_seconds: -1,
                        ..Default::default()
                    })
                }),
                "spec.rollout.minReadySeconds",
                "between 0 and 300",
            ),
            (
                with(|s| {
                    s.tls = Some(crate::TlsSpec::secret("certs"));
                    s.container_port = crate::TLS_ADMIN_PORT;
                }),
                "spec.containerPort",
                "reload agent",
            ),
        ];
        for (m, field, words) in cases {
            let errors = validate(&m).expect_err(field).0;
            assert!(
                errors
                    .iter()
                    .any(|e| e.field == field && e.message.contains(words)),
                "{field} / {words}: {errors:?}"
            );
        }
        // The defaults, and memcached's documented example (1 MiB items, 64 MiB pages).
        assert_eq!(validate(&ext(|_| {})), Ok(()));
        assert_eq!(
            validate(&ext(|e| {
                e.size = "64Mi".into();
                e.item_age_seconds = Some(3600);
                e.storage_class_name = Some("fast-ssd".into());
            })),
            Ok(())
        );
        // Off, a bad value is still refused (switching it on must not meet it later) but
        // UDP and memory are not its business.
        let mut off = ext(|e| e.enabled = false);
        off.spec.config = cfg(|c| c.extra_args = vec!["-U".into(), "11211".into()]);
        assert_eq!(validate(&off), Ok(()));
        // The port is reserved only while the agent runs.
        let restart = with(|s| {
            s.tls = Some(crate::TlsSpec {
                secret_name: "certs".into(),
                rotation: Some(crate::TlsRotation::Restart),
                client_auth: None,
            });
            s.container_port = crate::TLS_ADMIN_PORT;
        });
        assert_eq!(validate(&restart), Ok(()));
    }

    fn ext_and(
        edit_ext: impl FnOnce(&mut crate::ExtstoreSpec),
        edit: impl FnOnce(&mut MemcachedSpec),
    ) -> Memcached {
        let mut m = ext(edit_ext);
        edit(&mut m.spec);
        m
    }

    fn memory(
        requests: Option<&str>,
        limits: Option<&str>,
    ) -> Option<k8s_openapi::api::core::v1::ResourceRequirements> {
        let list = |q: Option<&str>| {
            q.map(|q| {
                std::collections::BTreeMap::from([(
                    "memory".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.into()),
                )])
            })
        };
        Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..Default::default()
        })
    }

    /// A memory limit below what memcached's flags make it use (the cache, and extstore's
    /// six write buffers) gets memcached OOM-killed as it fills: refused, naming the limit,
    /// with or without extstore; the request is held to it with extstore only.
    #[test]
    fn the_memory_limit_covers_the_cache_and_the_write_buffers() {
        let refused = |m: Memcached| validate(&m).expect_err("refused").0;
        // The case: 64 MiB of cache and six 64 MiB write buffers in 32 MiB.
        let errors = refused(ext_and(
            |e| e.write_buffer_mib = 64,
            |s| {
                s.resources = memory(None, Some("32Mi"));
            },
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.resources.limits[memory]");
        assert!(
            errors[0].message.contains("at least 448Mi") && errors[0].message.contains("OOM"),
            "{errors:?}"
        );
        // Without extstore: the cache alone.
        let errors = refused(with(|s| {
            s.config = cfg(|c| c.memory_mib = 256);
            s.resources = memory(None, Some("128Mi"));
        }));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.resources.limits[memory]");
        assert!(errors[0].message.contains("at least 256Mi"), "{errors:?}");
        // Both too small with extstore: each named.
        let errors = refused(ext_and(
            |_| {},
            |s| s.resources = memory(Some("64Mi"), Some("64Mi")),
        ));
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.resources.requests[memory]",
                "spec.resources.limits[memory]"
            ]
        );
        // The floor itself passes, a byte less does not (448Mi = 469762048 bytes).
        let at = |q: &str| {
            ext_and(
                |e| e.write_buffer_mib = 64,
                |s| s.resources = memory(None, Some(q)),
            )
        };
        assert_eq!(validate(&at("448Mi")), Ok(()));
        assert_eq!(validate(&at("469762048")), Ok(()));
        assert!(validate(&at("469762047")).is_err());
        // Without extstore a request below the cache is the pool's choice (it may be
        // evicted under node pressure, never killed for its own use).
        assert_eq!(
            validate(&with(|s| {
                s.config = cfg(|c| c.memory_mib = 256);
                s.resources = memory(Some("32Mi"), Some("256Mi"));
            })),
            Ok(())
        );
        // extstore switched off: its buffers are not allocated, so not counted.
        assert_eq!(
            validate(&ext_and(
                |e| {
                    e.enabled = false;
                    e.write_buffer_mib = 64;
                },
                |s| s.resources = memory(None, Some("64Mi"))
            )),
            Ok(())
        );
        // No memory given: nothing to check (the derived memory covers it).
        assert_eq!(
            validate(&ext_and(|_| {}, |s| s.resources = memory(None, None))),
            Ok(())
        );
    }

    /// Zones: one per copy (2 or 3 copies), each a label value, none twice; each error
    /// names its field.
    #[test]
    fn zones_are_one_label_value_per_copy() {
        let fields = |m: Memcached| -> Vec<String> {
            validate(&m)
                .err()
                .map(|e| e.0.into_iter().map(|e| e.field).collect())
                .unwrap_or_default()
        };
        let zoned = |copies: i32, zones: &[&str]| {
            with(|s| {
                s.proxy = Some(Box::new(crate::ProxySpec {
                    copies,
                    zones: zones.iter().map(|z| z.to_string()).collect(),
                    ..Default::default()
                }));
            })
        };
        assert_eq!(fields(zoned(2, &["a", "b"])), Vec::<String>::new());
        assert_eq!(
            fields(zoned(3, &["eu-west-1a", "eu-west-1b", "eu_1.c"])),
            Vec::<String>::new()
        );
        assert_eq!(fields(zoned(1, &["a"])), ["spec.proxy.zones"]);
        assert_eq!(fields(zoned(3, &["a", "b"])), ["spec.proxy.zones"]);
        assert_eq!(fields(zoned(2, &["a", "a"])), ["spec.proxy.zones[1]"]);
        assert_eq!(
            fields(zoned(2, &["", "-b"])),
            ["spec.proxy.zones[0]", "spec.proxy.zones[1]"]
        );
        assert_eq!(
            fields(zoned(2, &["a", &"z".repeat(64)])),
            ["spec.proxy.zones[1]"]
        );
    }

    /// A gutter is refused with copies, and with a proxy memory limit it does not fit in
    /// (its cache and 64 MiB more), each naming its field; the proxy's default resources
    /// and a limit with room pass.
    #[test]
    fn a_gutter_fits_one_copy_and_the_proxys_memory() {
        let gutter = |edit: fn(&mut crate::ProxySpec)| {
            with(|s| {
                let mut p = crate::ProxySpec {
                    gutter: Some(crate::GutterSpec {
                        enabled: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                edit(&mut p);
                s.proxy = Some(Box::new(p));
            })
        };
        let fields = |m: Memcached| -> Vec<String> {
            validate(&m)
                .err()
                .map(|e| e.0.into_iter().map(|e| e.field).collect())
                .unwrap_or_default()
        };
        assert_eq!(fields(gutter(|_| {})), Vec::<String>::new());

        assert_eq!(
            fields(gutter(|p| p.copies = 2)),
            ["spec.proxy.gutter.enabled"]
        );
        assert_eq!(
            fields(gutter(|p| p.resources = memory(None, Some("95Mi")))),
            ["spec.proxy.gutter.memoryMiB"]
        );
        assert_eq!(
            fields(gutter(|p| p.resources = memory(None, Some("96Mi")))),
            Vec::<String>::new()
        );
        assert_eq!(
            fields(gutter(|p| {
                p.gutter = Some(crate::GutterSpec {
                    enabled: false,
                    ttl_seconds: 0,
                    ..Default::default()
                });
                p.copies = 2;
            })),
            ["spec.proxy.gutter.ttlSeconds"],
            "its fields are checked while it is off, the copies only when on"
        );
    }

    fn with(edit: impl FnOnce(&mut MemcachedSpec)) -> Memcached {
        let mut m = mc("cache", 3);
        edit(&mut m.spec);
        m
    }

    fn cfg(edit: impl FnOnce(&mut crate::MemcachedConfig)) -> Option<crate::MemcachedConfig> {
        let mut c = crate::MemcachedConfig::default();
        edit(&mut c);
        Some(c)
    }

    #[test]
    fn bad_production_settings_are_rejected_naming_the_field() {
        let cases: Vec<(Memcached, &str)> = vec![
            (
                with(|s| s.config = cfg(|c| c.memory_mib = 4)),
                "spec.config.memoryMiB",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_connections = 1)),
                "spec.config.maxConnections",
            ),
            (
                with(|s| s.config = cfg(|c| c.threads = 0)),
                "spec.config.threads",
            ),
            (
                with(|s| s.config = cfg(|c| c.verbosity = 9)),
                "spec.config.verbosity",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "1g".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "12".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "64m".into())),
                "spec.config.maxItemSize",
            ),
            // Values Debian's memcached 1.6 refuses to start with (its own messages:
            // "slab_chunk_max cannot be larger than -I", "must be evenly divisible by
            // slab_chunk_max"); the real-memcached property test holds the rule to it.
            (
                with(|s| {
                    s.config = cfg(|c| {
                        c.max_connections = 16;
                        c.threads = 28;
                    })
                }),
                "spec.config.maxConnections",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "1k".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "256k".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "1500k".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.max_item_size = "1000000".into())),
                "spec.config.maxItemSize",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["-R 30".into()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| {
                    s.config =
                        cfg(|c| c.extra_args = vec!["-o".into(), "slab_chunk_max=16384".into()])
                }),
                "spec.config.extraArgs[1]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["-m".into(), "9".into()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["--memory-limit=9".into()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["-vv".into()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["-c4096".into()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec!["-o".into(), "ssl_key=/x".into()])),
                "spec.config.extraArgs[1]",
            ),
            (
                with(|s| s.config = cfg(|c| c.extra_args = vec![String::new()])),
                "spec.config.extraArgs[0]",
            ),
            (
                with(|s| {
                    s.pod_labels =
                        Some([("app.kubernetes.io/instance".to_string(), "x".to_string())].into())
                }),
                "spec.podLabels[app.kubernetes.io/instance]",
            ),
            (
                with(|s| {
                    s.sasl = Some(crate::SaslSpec {
                        secret_name: "Bad_Name".into(),
                    })
                }),
                "spec.sasl.secretName",
            ),
            (
                with(|s| {
                    s.tls = Some(crate::TlsSpec {
                        secret_name: "-x".into(),
                        rotation: None,
                        client_auth: None,
                    })
                }),
                "spec.tls.secretName",
            ),
            (
                with(|s| {
                    s.exporter = Some(crate::ExporterSpec {
                        enabled: true,
                        image: None,
                    });
                    s.tls = Some(crate::TlsSpec::secret("certs"));
                }),
                "spec.exporter.enabled",
            ),
            (
                with(|s| {
                    s.exporter = Some(crate::ExporterSpec {
                        enabled: true,
                        image: Some("Bad Image".into()),
                    })
                }),
                "spec.exporter.image",
            ),
        ];
        for (m, field) in cases {
            let errors = validate(&m).expect_err(field);
            assert!(
                errors.0.iter().any(|e| e.field == field),
                "{field}: {errors}"
            );
        }
    }

    #[test]
    fn good_production_settings_pass() {
        let good = with(|s| {
            s.config = cfg(|c| {
                c.memory_mib = 4096;
                c.max_connections = 8192;
                c.threads = 8;
                c.max_item_size = "2m".into();
                c.verbosity = 0;
                c.extra_args = vec![
                    "-o".into(),
                    "lru_crawler,lru_maintainer".into(),
                    "-R".into(),
                    "40".into(),
                ];
            });
            s.exporter = Some(crate::ExporterSpec {
                enabled: true,
                image: None,
            });
            s.pod_labels = Some([("tier".to_string(), "gold".to_string())].into());
        });
        assert_eq!(validate(&good), Ok(()));
    }

    fn shutdown(delay: i32, grace: Option<i32>) -> Option<crate::GracefulShutdownSpec> {
        Some(crate::GracefulShutdownSpec {
            pre_stop_delay_seconds: delay,
            termination_grace_period_seconds: grace,
        })
    }

    #[test]
    fn stop_service_and_security_settings_are_checked_naming_the_field() {
        use k8s_openapi::api::core::v1::{
            Capabilities, PodSecurityContext, SeccompProfile, SecurityContext, Sysctl,
        };
        let service = |labels: &[&str], annotations: &[&str]| {
            let map = |keys: &[&str]| {
                Some(
                    keys.iter()
                        .map(|k| (k.to_string(), "x".to_string()))
                        .collect(),
                )
            };
            Some(Box::new(crate::ServiceMetadataSpec {
                labels: map(labels),
                annotations: map(annotations),
            }))
        };
        let cases: Vec<(Memcached, &str, &str)> = vec![
            (
                with(|s| s.graceful_shutdown = shutdown(20, Some(20))),
                "spec.gracefulShutdown.terminationGracePeriodSeconds",
                "must be longer than",
            ),
            (
                with(|s| s.graceful_shutdown = shutdown(-1, None)),
                "spec.gracefulShutdown.preStopDelaySeconds",
                "between 0 and 600",
            ),
            (
                with(|s| s.graceful_shutdown = shutdown(0, Some(0))),
                "spec.gracefulShutdown.terminationGracePeriodSeconds",
                "between 1 and 3600",
            ),
            (
                with(|s| s.service = service(&["app.kubernetes.io/instance"], &[])),
                "spec.service.labels[app.kubernetes.io/instance]",
                "set by the operator",
            ),
            (
                with(|s| s.service = service(&[], &["memcached.cache.example.com/applied-hash"])),
                "spec.service.annotations[memcached.cache.example.com/applied-hash]",
                "the operator's own",
            ),
            (
                with(|s| {
                    s.pod_security_context = Some(Box::new(PodSecurityContext {
                        run_as_user: Some(0),
                        ..Default::default()
                    }))
                }),
                "spec.podSecurityContext.runAsUser",
                "restricted",
            ),
            (
                with(|s| {
                    s.pod_security_context = Some(Box::new(PodSecurityContext {
                        sysctls: Some(vec![Sysctl {
                            name: "net.core.somaxconn".into(),
                            value: "4096".into(),
                        }]),
                        ..Default::default()
                    }))
                }),
                "spec.podSecurityContext.sysctls[0].name",
                "net.ipv4.tcp_syncookies",
            ),
            (
                with(|s| {
                    s.container_security_context = Some(Box::new(SecurityContext {
                        allow_privilege_escalation: Some(true),
                        ..Default::default()
                    }))
                }),
                "spec.containerSecurityContext.allowPrivilegeEscalation",
                "must be false",
            ),
            (
                with(|s| {
                    s.container_security_context = Some(Box::new(SecurityContext {
                        capabilities: Some(Capabilities {
                            add: Some(vec!["NET_BIND_SERVICE".into()]),
                            drop: None,
                        }),
                        ..Default::default()
                    }))
                }),
                "spec.containerSecurityContext.capabilities.drop",
                "must include \"ALL\"",
            ),
            (
                with(|s| {
                    s.container_security_context = Some(Box::new(SecurityContext {
                        capabilities: Some(Capabilities {
                            add: Some(vec!["SYS_ADMIN".into()]),
                            drop: Some(vec!["ALL".into()]),
                        }),
                        ..Default::default()
                    }))
                }),
                "spec.containerSecurityContext.capabilities.add[0]",
                "only NET_BIND_SERVICE",
            ),
            (
                with(|s| {
                    s.container_security_context = Some(Box::new(SecurityContext {
                        seccomp_profile: Some(SeccompProfile {
                            type_: "Unconfined".into(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }))
                }),
                "spec.containerSecurityContext.seccompProfile.type",
                "Unsupported value: \"Unconfined\"",
            ),
            (
                with(|s| {
                    s.container_security_context = Some(Box::new(SecurityContext {
                        privileged: Some(true),
                        ..Default::default()
                    }))
                }),
                "spec.containerSecurityContext.privileged",
                "restricted",
            ),
        ];
        for (m, field, words) in cases {
            let errors = validate(&m).expect_err(field);
            assert!(
                errors
                    .0
                    .iter()
                    .any(|e| e.field == field && e.to_string().contains(words)),
                "{field}: {errors}"
            );
        }
    }

    #[test]
    fn stop_service_and_security_settings_within_the_rules_pass() {
        use k8s_openapi::api::core::v1::{PodSecurityContext, SELinuxOptions, SecurityContext};
        let good = with(|s| {
            s.graceful_shutdown = shutdown(20, Some(21));
            s.service = Some(Box::new(crate::ServiceMetadataSpec {
                labels: Some([("team".to_string(), "cache".to_string())].into()),
                annotations: Some(
                    [("mesh.example.com/inject".to_string(), "false".to_string())].into(),
                ),
            }));
            s.pod_security_context = Some(Box::new(PodSecurityContext {
                run_as_user: Some(1_000_680_000),
                se_linux_options: Some(SELinuxOptions {
                    level: Some("s0:c26,c5".into()),
                    type_: Some("container_t".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }));
            s.container_security_context = Some(Box::new(SecurityContext {
                read_only_root_filesystem: Some(false),
                run_as_non_root: Some(true),
                ..Default::default()
            }));
        });
        assert_eq!(validate(&good), Ok(()));
    }
}
