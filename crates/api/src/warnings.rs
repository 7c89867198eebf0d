//! Warnings for risky but legal choices (one pod, an unpinned image, a privileged port, a
//! port change that moves the Service): the admission webhook returns them on create and
//! update, and kubectl prints them. What is refused instead is [`crate::validation`]'s.

use crate::Memcached;
use crate::image::ImageReference;

/// Warnings for risky but legal choices, shown by kubectl on create and update.
/// `default_image` is the operator's `--memcached-image`, used when `spec.image` is unset.
pub fn warnings(mc: &Memcached, default_image: &str) -> Vec<String> {
    let mut out = Vec::new();
    match mc.spec.size {
        0 => out.push(
            "spec.size: 0 runs no memcached pods; the Service stays, with no endpoints".into(),
        ),
        1 => out.push(
            "spec.size: 1 runs a single memcached pod: no redundancy, and the whole cache is lost whenever that pod restarts or moves".into(),
        ),
        _ => {}
    }
    if (1..1024).contains(&mc.spec.container_port) {
        out.push(format!(
            "spec.containerPort: {} is a privileged port; memcached runs as a non-root user with all capabilities dropped, so it starts only where the container runtime allows unprivileged low ports",
            mc.spec.container_port
        ));
    }
    if let Some(other) = mc
        .metadata
        .name
        .as_deref()
        .and_then(|n| n.strip_suffix("-proxy"))
    {
        out.push(format!(
            "metadata.name: the proxy of a Memcached named {other:?} has this name too (Deployment, Service, budget); if both exist, the one created second is Degraded until the other goes"
        ));
    }
    if let Some(tls) = &mc.spec.tls
        && mc.spec.sasl.is_some()
        && tls.rotation.unwrap_or_default() == crate::TlsRotation::InPlace
    {
        out.push(
            "spec.tls.rotation: InPlace acts as Restart with spec.sasl: SASL makes memcached speak only the binary protocol, which cannot reload a certificate, so a renewed certificate rolls the pods".into(),
        );
    }
    if let Some(policy) = mc.spec.network_policy_enabled()
        && mc.spec.exporter_enabled()
        && policy.metrics_from.is_empty()
    {
        out.push(
            "spec.networkPolicy.metricsFrom: empty while the exporter runs, so nothing may scrape it; list Prometheus' pods".into(),
        );
    }
    if let Some(autoscaling) = &mc.spec.autoscaling
        && autoscaling.target_memory_utilization_percentage.is_some()
    {
        out.push(
            "spec.autoscaling.targetMemoryUtilizationPercentage: memcached keeps the memory it has taken up to its cache size, so a memory target scales the pool up as it fills and seldom down; a CPU target follows the load".into(),
        );
    }
    if mc.spec.flush.is_some() && mc.spec.network_policy_enabled().is_some() {
        out.push(
            "spec.flush: the operator connects to each pod's memcached port; admit the operator's pods in spec.networkPolicy.from, or the flush cannot reach them".into(),
        );
    }
    if let Some(autoscaling) = &mc.spec.autoscaling
        && mc.spec.size == 0
    {
        out.push(format!(
            "spec.size: 0 pauses the autoscaler (an HPA leaves a target of 0 alone); set it between {} and {} to resume",
            autoscaling.min_replicas, autoscaling.max_replicas
        ));
    }
    if let Some(shutdown) = &mc.spec.graceful_shutdown
        && shutdown.pre_stop_delay_seconds > mc.spec.min_ready_seconds()
        && mc.spec.size > 1
    {
        out.push(format!(
            "spec.gracefulShutdown.preStopDelaySeconds: {} is longer than a rollout step (spec.rollout.minReadySeconds {}): the next old pod is deleted while the last one still waits, so several pods may be stopping at once, each keeping its memory on its node until it exits",
            shutdown.pre_stop_delay_seconds,
            mc.spec.min_ready_seconds()
        ));
    }
    if let Some(proxy) = mc.spec.proxy_enabled()
        && proxy.copies > 1
    {
        out.push(format!(
            "spec.proxy.copies: with {} copies, gets/cas and incr/decr are not consistent across copies (each copy has its own CAS values and counters); use plain get/set/delete through the proxy",
            proxy.copies
        ));
    }
    if let Some(proxy) = mc.spec.proxy_enabled()
        && proxy.copies > mc.spec.size.max(1)
    {
        out.push(format!(
            "spec.proxy.copies: {} copies need at least {} pods; with spec.size {} each key is on at most {} of them",
            proxy.copies,
            proxy.copies,
            mc.spec.size,
            mc.spec.size.max(1)
        ));
    }
    if let Some(proxy) = mc.spec.proxy_enabled()
        && proxy.zoned()
        && proxy.replicas < proxy.copies
    {
        out.push(format!(
            "spec.proxy.replicas: {} proxy pods for {} zones (spec.proxy.zones): clients in a zone without a proxy pod read from another zone's copy, across zones",
            proxy.replicas, proxy.copies
        ));
    }
    if let Some(proxy) = mc.spec.proxy_enabled()
        && proxy.zoned()
        && mc.spec.size % proxy.copies != 0
    {
        out.push(format!(
            "spec.size: {} pods do not share evenly over {} zones (spec.proxy.zones): some zones hold one pod fewer, and their copy's ring is one slot shorter",
            mc.spec.size, proxy.copies
        ));
    }
    if let Some(proxy) = mc.spec.proxy_enabled()
        && proxy.warm_up_enabled()
    {
        let delay = mc
            .spec
            .graceful_shutdown
            .as_ref()
            .map_or(0, |s| s.pre_stop_delay_seconds);
        if delay < crate::WARM_UP_PRE_STOP_SECONDS {
            out.push(format!(
                "spec.proxy.warmUp: a replaced pod is read from only while it stops (spec.gracefulShutdown.preStopDelaySeconds, {delay} s), and the proxies take up to {} s to load the change; set it to {} or more to warm for a minute",
                crate::PROXY_PROPAGATION_SECONDS,
                crate::WARM_UP_PRE_STOP_SECONDS
            ));
        }
    }
    let (field, image) = match mc.spec.image.as_deref() {
        Some(image) if !image.is_empty() => ("spec.image", image),
        _ => (
            "spec.image (unset, so the operator's default)",
            default_image,
        ),
    };
    if let Ok(reference) = ImageReference::parse(image)
        && reference.digest.is_none()
    {
        match reference.tag.as_deref() {
            None => out.push(format!(
                "{field}: {image:?} has no tag, which means \"latest\": pods may run different versions and a restart may upgrade silently; pin a version such as {:?}",
                crate::DEFAULT_IMAGE
            )),
            Some("latest") => out.push(format!(
                "{field}: {image:?} uses the \"latest\" tag: pods may run different versions and a restart may upgrade silently; pin a version such as {:?}",
                crate::DEFAULT_IMAGE
            )),
            Some(_) => {}
        }
    }
    out
}

/// [`warnings`] of the new object plus those about the change itself.
pub fn update_warnings(old: &Memcached, new: &Memcached, default_image: &str) -> Vec<String> {
    let mut out = warnings(new, default_image);
    if old.spec.container_port != new.spec.container_port {
        out.push(format!(
            "spec.containerPort: changing {} to {} replaces every pod (each starts with an empty cache) and moves the Service port; clients must follow",
            old.spec.container_port, new.spec.container_port
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemcachedSpec;
    use crate::validation::validate_update;

    fn mc(name: &str, size: i32) -> Memcached {
        Memcached::new(name, MemcachedSpec::with_size(size))
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn warnings_cover_risky_choices() {
        assert!(warnings(&mc("x", 3), crate::DEFAULT_IMAGE).is_empty());
        assert!(warnings(&mc("x", 1), crate::DEFAULT_IMAGE)[0].contains("no redundancy"));
        assert!(warnings(&mc("x", 0), crate::DEFAULT_IMAGE)[0].contains("no memcached pods"));
        let mut m = mc("x", 3);
        m.spec.image = Some("memcached".into());
        assert!(warnings(&m, crate::DEFAULT_IMAGE)[0].contains("no tag"));
        m.spec.image = Some("memcached:latest".into());
        assert!(warnings(&m, crate::DEFAULT_IMAGE)[0].contains("latest"));
        m.spec.image = Some(format!("memcached:latest@sha256:{SHA}"));
        assert!(
            warnings(&m, crate::DEFAULT_IMAGE).is_empty(),
            "a digest pins it"
        );
        m.spec.image = None;
        assert!(warnings(&m, "memcached")[0].contains("operator's default"));
        m.spec.container_port = 80;
        assert!(warnings(&m, crate::DEFAULT_IMAGE)[0].contains("privileged"));
        let old = mc("x", 3);
        assert!(
            update_warnings(&old, &m, crate::DEFAULT_IMAGE)
                .iter()
                .any(|w| w.contains("moves the Service port"))
        );
        assert_eq!(validate_update(&old, &m), Ok(()));

        let mut warm = mc("x", 3);
        warm.spec.proxy = Some(Box::new(crate::ProxySpec {
            image: Some("memcached:1.6.38-patched".into()),
            warm_up: Some(crate::WarmUpSpec { enabled: true }),
            ..crate::ProxySpec::default()
        }));
        let short = warnings(&warm, crate::DEFAULT_IMAGE);
        assert!(
            short.len() == 1 && short[0].contains("spec.gracefulShutdown.preStopDelaySeconds, 0 s"),
            "{short:?}"
        );
        warm.spec.graceful_shutdown = Some(crate::GracefulShutdownSpec {
            pre_stop_delay_seconds: crate::WARM_UP_PRE_STOP_SECONDS,
            termination_grace_period_seconds: None,
        });
        assert!(
            warnings(&warm, crate::DEFAULT_IMAGE)
                .iter()
                .all(|w| !w.contains("spec.proxy.warmUp")),
            "long enough"
        );
        assert_eq!(crate::validation::validate(&warm), Ok(()));

        let mut stopping = mc("x", 3);
        stopping.spec.graceful_shutdown = Some(crate::GracefulShutdownSpec {
            pre_stop_delay_seconds: 30,
            termination_grace_period_seconds: None,
        });
        assert!(
            warnings(&stopping, crate::DEFAULT_IMAGE).is_empty(),
            "a delay within a rollout step (30 s) is quiet"
        );
        stopping.spec.graceful_shutdown = Some(crate::GracefulShutdownSpec {
            pre_stop_delay_seconds: 31,
            termination_grace_period_seconds: None,
        });
        assert!(
            warnings(&stopping, crate::DEFAULT_IMAGE)[0]
                .contains("several pods may be stopping at once")
        );

        let mut both = mc("x", 3);
        both.spec.tls = Some(crate::TlsSpec::secret("certs"));
        both.spec.sasl = Some(crate::SaslSpec {
            secret_name: "auth".into(),
        });
        assert!(
            warnings(&both, crate::DEFAULT_IMAGE)
                .iter()
                .any(|w| w.contains("acts as Restart")),
            "{:?}",
            warnings(&both, crate::DEFAULT_IMAGE)
        );

        let named = mc("cache-proxy", 3);
        assert!(warnings(&named, crate::DEFAULT_IMAGE)[0].contains("\"cache\""));
        let mut replicated = mc("x", 1);
        replicated.spec.proxy = Some(Box::new(crate::ProxySpec {
            copies: 2,
            ..crate::ProxySpec::default()
        }));
        let said = warnings(&replicated, crate::DEFAULT_IMAGE);
        assert!(said.iter().any(|w| w.contains("cas")), "{said:?}");
        assert!(
            said.iter().any(|w| w.contains("need at least 2 pods")),
            "{said:?}"
        );

        // Zones: fewer proxy pods than zones, and a size the zones do not share evenly.
        let zoned = |size: i32, replicas: i32| {
            let mut m = mc("x", size);
            m.spec.proxy = Some(Box::new(crate::ProxySpec {
                copies: 3,
                replicas,
                zones: vec!["a".into(), "b".into(), "c".into()],
                ..crate::ProxySpec::default()
            }));
            warnings(&m, crate::DEFAULT_IMAGE)
        };
        let about = |said: &[String], field: &str| said.iter().any(|w| w.starts_with(field));
        let even = zoned(6, 3);
        assert!(
            !about(&even, "spec.proxy.replicas") && !about(&even, "spec.size"),
            "{even:?}"
        );
        let few = zoned(6, 2);
        assert!(
            about(&few, "spec.proxy.replicas: 2 proxy pods for 3 zones"),
            "{few:?}"
        );
        let uneven = zoned(7, 3);
        assert!(
            about(&uneven, "spec.size: 7 pods do not share evenly"),
            "{uneven:?}"
        );
    }
}
