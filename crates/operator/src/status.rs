//! Observed state → `status`: a pure function of the Memcached, its Deployment (from the
//! cache), its pod names and any problem found while reconciling. Conditions keep their
//! `lastTransitionTime` unless their status flips, so an unchanged world gives an
//! identical status and no write.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use memcached_api::{Memcached, MemcachedStatus, ProxyBackend, ProxyStatus, condition};

use crate::builders::selector_string;

/// Something that keeps the operator from making the pool match its spec; reported as the
/// `Degraded` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase reason, e.g. `InvalidSpec`.
    pub reason: String,
    /// What is wrong, readable by a person.
    pub message: String,
}

/// One pod, as the status needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedPod {
    pub name: String,
    /// `status.podIP`, once assigned.
    pub ip: Option<String>,
    /// The pod's `Ready` condition is `True`.
    pub ready: bool,
    /// Its `topology.kubernetes.io/zone` label (copied from its node when it was
    /// scheduled, where the API server does that).
    pub zone: Option<String>,
    /// Its `creationTimestamp`.
    pub created: Option<jiff::Timestamp>,
}

impl ObservedPod {
    /// A pod with a name only (not ready, no IP).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

/// `ip:port` of a pod, the IP in brackets when it is IPv6 (as in `status.endpoints` and
/// the proxy's backends).
pub fn endpoint(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// What the reconciler saw, as plain values.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    pub deployment: Option<&'a Deployment>,
    /// The pods of this Memcached that are not being deleted, in any order.
    pub pods: Vec<ObservedPod>,
    pub problem: Option<Problem>,
    /// The proxy, when it runs and was reconciled this time (`None` keeps the proxy's
    /// status and condition as they were).
    pub proxy: Option<ObservedProxy<'a>>,
    /// Pods whose TLS reload agent reported renewed files it could not load, sorted by pod.
    pub reload_failures: Vec<ReloadFailure>,
    /// The operator's new default memcached image waits for a fleet-wide rollout slot: how
    /// many pools may roll at once (not how many do: the message stays the same while it
    /// waits, and so does the status).
    pub rollout_waiting: Option<usize>,
    /// The flush on demand's progress as of this reconcile (`None` keeps the status's).
    pub flush: Option<memcached_api::FlushStatus>,
}

/// A pod whose TLS reload agent reported renewed certificate files it could not load.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReloadFailure {
    pub pod: String,
    /// memcached refused the files (its TLS may be broken): the pod is restarted. Else the
    /// agent refused them itself and memcached keeps serving the certificate it has.
    pub restart: bool,
    /// The agent's reason.
    pub reason: String,
}

/// The proxy as the reconciler left it.
#[derive(Clone, Debug, Default)]
pub struct ObservedProxy<'a> {
    pub deployment: Option<&'a Deployment>,
    /// The backends of the configuration written, vacant slots included.
    pub backends: Vec<ProxyBackend>,
    /// Its version.
    pub version: String,
    /// How long after a change of its backends the proxies may still run the previous
    /// configuration ([`crate::proxy::PROPAGATION_WINDOW`]).
    pub propagation: std::time::Duration,
}

/// `ProxyReady`'s reason while the proxies may still run an older configuration.
pub const PROXY_PROPAGATING: &str = "Propagating";

/// The proxy's status and `ProxyReady` condition (its transition time unset).
fn proxy_status(
    mc: &Memcached,
    observed: &ObservedProxy<'_>,
    pods: &[ObservedPod],
    now: jiff::Timestamp,
) -> (ProxyStatus, Condition) {
    let wanted = mc.spec.proxy_enabled().map_or(0, |p| p.replicas);
    let (replicas, ready) = observed.deployment.map_or((0, 0), |d| {
        let r = rollout(d);
        (r.replicas, r.ready)
    });
    let previous = mc.status.as_ref().and_then(|s| s.proxy.as_ref());
    // When the configuration last changed under running proxies. The first one is read by
    // the proxies as they start, so it needs no propagation.
    let changed_at = match previous {
        None => None,
        Some(p) if p.config_version == observed.version => p.config_changed_at.clone(),
        Some(_) => Some(Time(now)),
    };
    let window =
        jiff::SignedDuration::try_from(observed.propagation).unwrap_or(jiff::SignedDuration::ZERO);
    let propagating = changed_at
        .as_ref()
        .is_some_and(|t| now.duration_since(t.0) < window);
    let (vacant, members): (Vec<&ProxyBackend>, Vec<&ProxyBackend>) =
        observed.backends.iter().partition(|b| b.is_vacant());
    let n = members.len();
    // Pods stay in the rings while not Ready (the proxy fails over from them by itself).
    let answering = members
        .iter()
        .filter(|b| pods.iter().any(|p| p.name == b.pod && p.ready))
        .count();
    // With zones, Ready pods outside the rings whose zone is not one of them (no zone
    // label: the API server copies it from the node from Kubernetes 1.35 on).
    let zoneless = mc
        .spec
        .proxy_enabled()
        .filter(|p| p.zoned())
        .map_or(0, |p| {
            pods.iter()
                .filter(|pod| pod.ready && !members.iter().any(|b| b.pod == pod.name))
                .filter(|pod| !pod.zone.as_ref().is_some_and(|z| p.zones.contains(z)))
                .count()
        });
    let zoneless_note = format!(
        "{zoneless} Ready pods wait outside the rings: their {} label is missing or not one of spec.proxy.zones (the API server copies it from the node from Kubernetes 1.35 on)",
        memcached_api::ZONE_LABEL
    );
    let version = &observed.version;
    let condition = if ready == 0 {
        cond(
            condition::PROXY_READY,
            false,
            "ProxyUnavailable",
            format!("0 of {wanted} proxy pods ready"),
        )
    } else if answering == 0 {
        let message = if n == 0 && zoneless > 0 {
            format!(
                "no memcached pod is in the proxy's routes: {zoneless_note}; the proxy answers every request with an error"
            )
        } else if n == 0 {
            "no memcached pod is in the proxy's routes (a pod joins when it is first Ready): the proxy answers every request with an error"
                .to_string()
        } else {
            format!(
                "none of the {n} memcached pods in the proxy's routes is Ready: the proxy answers every request with an error or a miss"
            )
        };
        cond(condition::PROXY_READY, false, "NoBackends", message)
    } else if propagating {
        cond(
            condition::PROXY_READY,
            false,
            PROXY_PROPAGATING,
            format!(
                "configuration {version} with {n} backends written; the proxies load it once the kubelet updates their mounted ConfigMap (usually within {} s), until then they may route to the previous backends",
                observed.propagation.as_secs()
            ),
        )
    } else {
        let mut message = format!(
            "{ready} of {wanted} proxy pods ready, routing to {n} backends (configuration {version})"
        );
        if answering < n {
            let _ = write!(
                message,
                "; {} not Ready (their keys fail or miss until they answer again)",
                n - answering
            );
        }
        if !vacant.is_empty() {
            let _ = write!(
                message,
                "; {} slots vacant (their keys miss until a new pod takes them)",
                vacant.len()
            );
        }
        if zoneless > 0 {
            let _ = write!(message, "; {zoneless_note}");
        }
        let warming = observed
            .backends
            .iter()
            .filter(|b| b.warm_from.is_some())
            .count();
        if warming > 0 {
            let _ = write!(
                message,
                "; {warming} slots warming up (their misses read from the stopping pods they replace)"
            );
        }
        let grown: Vec<&memcached_api::GrownFrom> = observed
            .backends
            .iter()
            .filter_map(|b| b.grown_from.as_ref())
            .collect();
        if let Some(first) = grown.first() {
            let _ = write!(
                message,
                "; {} slots added by a scale-out warming up until {} (their misses read from the ring of {} slots before it)",
                grown.len(),
                first.until,
                first.slots
            );
        }
        cond(condition::PROXY_READY, true, "Configured", message)
    };
    (
        ProxyStatus {
            replicas,
            ready_replicas: ready,
            backends: members.into_iter().cloned().collect(),
            config_version: observed.version.clone(),
            config_changed_at: changed_at,
        },
        condition,
    )
}

/// `Progressing`'s reason while a pool waits to roll to the operator's new default image.
pub const WAITING_FOR_ROLLOUT_SLOT: &str = "WaitingForRolloutSlot";

/// The reason kube-controller-manager gives a Deployment whose rollout made no progress
/// within its `progressDeadlineSeconds` (pods that crash or never become ready).
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

struct Rollout {
    replicas: i32,
    updated: i32,
    ready: i32,
    observed: bool,
    /// The Deployment's own message when its rollout is stuck.
    stuck: Option<String>,
}

fn rollout(deployment: &Deployment) -> Rollout {
    let status = deployment.status.clone().unwrap_or_default();
    let observed = match (status.observed_generation, deployment.metadata.generation) {
        (Some(seen), Some(current)) => seen >= current,
        (_, None) => true,
        (None, Some(_)) => false,
    };
    let stuck = status
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED)
        })
        .map(|c| c.message.clone().unwrap_or_default());
    Rollout {
        replicas: status.replicas.unwrap_or(0),
        updated: status.updated_replicas.unwrap_or(0),
        ready: status.ready_replicas.unwrap_or(0),
        observed,
        stuck,
    }
}

/// How a rollout is paced, for `Progressing`'s message: each new pod Ready for
/// `minReadySeconds` before the next old one goes.
fn pace(mc: &Memcached) -> String {
    match mc.spec.min_ready_seconds() {
        0 => String::new(),
        s => format!("; each new pod must stay Ready {s}s before the next old one is replaced"),
    }
}

fn cond(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: None,
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
    }
}

/// The status `mc` should have, given what was observed at `now`.
pub fn desired_status(
    mc: &Memcached,
    observed: &Observed<'_>,
    now: jiff::Timestamp,
) -> MemcachedStatus {
    let size = mc.spec.size;
    let name = mc.metadata.name.clone().unwrap_or_default();
    let mut pods = observed.pods.clone();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods.dedup_by(|a, b| a.name == b.name);
    let nodes: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
    let port = mc.spec.container_port;
    let endpoints: Vec<String> = pods
        .iter()
        .filter(|p| p.ready)
        .filter_map(|p| p.ip.as_deref())
        .map(|ip| endpoint(ip, port))
        .collect();

    // Whether the Deployment's rollout of its current template is done.
    let mut rollout_done = false;
    let (replicas, ready, available_cond, progressing_cond, stuck) = match observed.deployment {
        None => (
            0,
            0,
            cond(
                condition::AVAILABLE,
                false,
                "DeploymentMissing",
                "the Deployment does not exist yet".into(),
            ),
            cond(
                condition::PROGRESSING,
                observed.problem.is_none(),
                if observed.problem.is_none() {
                    "Creating"
                } else {
                    "Blocked"
                },
                if observed.problem.is_none() {
                    "creating the Deployment".into()
                } else {
                    "waiting for the problem to be fixed".into()
                },
            ),
            None,
        ),
        Some(deployment) => {
            let mut r = rollout(deployment);
            // Ready pods as the pod cache has them (the pods `status.endpoints` lists): the
            // Deployment's count follows the pods through two more controllers (ReplicaSet,
            // then Deployment), a second or more behind under load, and a pool that serves
            // is reported as soon as its pods do. The higher count is the one reported.
            let ready_pods =
                i32::try_from(pods.iter().filter(|p| p.ready).count()).unwrap_or(i32::MAX);
            let serving = r.ready.max(ready_pods);
            // For the rollout's end it counts only when the cache holds as many live pods
            // as the Deployment (then they are the same pods, all updated when it says so).
            if usize::try_from(r.replicas).is_ok_and(|n| n == pods.len()) {
                r.ready = serving;
            }
            // The pool serves at full size once `size` pods are Ready. The Deployment's own
            // count of available pods lags that by `minReadySeconds`, a pace for replacing
            // old pods that says nothing about whether the pool serves.
            let available = serving >= size;
            let available_cond = cond(
                condition::AVAILABLE,
                available,
                if available {
                    "MinimumReplicasAvailable"
                } else {
                    "MinimumReplicasUnavailable"
                },
                format!("{}/{} pods ready", serving, size),
            );
            // Done when only updated pods remain and all are Ready. While old pods remain, a
            // new one waits out `minReadySeconds` before the next old one goes (the rollout
            // keeps a pod beyond `size` until then); once none remains, that wait guards
            // nothing, so a new or scaled pool is done as soon as its pods are Ready.
            let done = r.observed && r.updated >= size && r.replicas == size && r.ready >= size;
            rollout_done = done;
            let (reason, message) = if done {
                ("RolloutComplete", format!("{size} pods updated and ready"))
            } else if !r.observed {
                (
                    "DeploymentUpdated",
                    "the Deployment controller has not yet seen the change".to_string(),
                )
            } else if r.replicas < size && r.updated >= r.replicas {
                ("ScalingUp", format!("{} of {size} pods exist", r.replicas))
            } else if r.replicas > size && r.updated >= r.replicas {
                (
                    "ScalingDown",
                    format!("{} pods exist, {size} wanted", r.replicas),
                )
            } else if r.updated < size || r.replicas > r.updated {
                // Old pods remain: replaced one at a time, each new pod first Ready for
                // minReadySeconds.
                (
                    "RollingUpdate",
                    format!("{} of {size} pods updated{}", r.updated.min(size), pace(mc)),
                )
            } else {
                (
                    "WaitingForReadyPods",
                    format!("{} of {size} pods ready", serving),
                )
            };
            // The Deployment controller gave up waiting for this rollout.
            let stuck = r.stuck.clone().filter(|_| r.observed && !done);
            let progressing_cond = match (&stuck, observed.rollout_waiting) {
                (Some(why), _) => cond(
                    condition::PROGRESSING,
                    false,
                    PROGRESS_DEADLINE_EXCEEDED,
                    format!("{message}; the rollout is stuck: {why}"),
                ),
                (None, Some(max)) if done => cond(
                    condition::PROGRESSING,
                    true,
                    WAITING_FOR_ROLLOUT_SLOT,
                    format!(
                        "the operator's new default memcached image waits for a rollout slot: \
                         at most {max} pools roll at once (--max-concurrent-pool-rollouts)"
                    ),
                ),
                (None, _) => cond(condition::PROGRESSING, !done, reason, message),
            };
            (r.replicas, serving, available_cond, progressing_cond, stuck)
        }
    };
    let degraded_cond = match (&observed.problem, stuck) {
        (Some(p), _) => cond(condition::DEGRADED, true, &p.reason, p.message.clone()),
        (None, Some(why)) => cond(
            condition::DEGRADED,
            true,
            PROGRESS_DEADLINE_EXCEEDED,
            format!(
                "the rollout of Deployment {name} made no progress: {why} (pods crash or never become ready: kubectl describe pods -l app.kubernetes.io/instance={name})"
            ),
        ),
        (None, None) => cond(
            condition::DEGRADED,
            false,
            "AsExpected",
            "no problems found".into(),
        ),
    };

    let previous = mc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let generation = mc.metadata.generation;
    // The proxy's part: computed afresh when it was reconciled, else carried over.
    let (proxy, proxy_cond) = match (mc.spec.proxy_enabled(), &observed.proxy) {
        (None, _) => (None, None),
        (Some(_), Some(seen)) => {
            let (status, cond) = proxy_status(mc, seen, &observed.pods, now);
            (Some(status), Some(cond))
        }
        (Some(_), None) => (
            mc.status.as_ref().and_then(|s| s.proxy.clone()),
            previous
                .iter()
                .find(|c| c.type_ == condition::PROXY_READY)
                .cloned(),
        ),
    };
    let reload_cond = mc
        .spec
        .tls_reloads_in_place()
        .then(|| match observed.reload_failures.first() {
            Some(failure) => {
                let others = match observed.reload_failures.len() - 1 {
                    0 => String::new(),
                    n => format!(" ({n} more pods report the same)"),
                };
                let (reason, then) = if failure.restart {
                    (
                        "ReloadFailed",
                        "it is restarted, one pod at a time while the others are Ready, to load it as it starts",
                    )
                } else {
                    (
                        "CertificateInvalid",
                        "memcached keeps serving the certificate it has; fix the Secret",
                    )
                };
                cond(
                    condition::CERTIFICATES_RELOADED,
                    false,
                    reason,
                    format!(
                        "pod {} could not load the renewed certificate ({}); {then}{others}",
                        failure.pod, failure.reason
                    ),
                )
            }
            None => cond(
                condition::CERTIFICATES_RELOADED,
                true,
                "InPlace",
                "each pod's reload agent loads a renewed certificate without a restart".into(),
            ),
        });
    let ready_cond = ready_condition(
        &available_cond,
        &progressing_cond,
        &degraded_cond,
        proxy_cond.as_ref(),
    );
    let conditions = [available_cond, progressing_cond, degraded_cond]
        .into_iter()
        .chain(proxy_cond)
        .chain(reload_cond)
        .chain([ready_cond])
        .map(|mut c| {
            c.observed_generation = generation;
            c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
                Some(p) if p.status == c.status => p.last_transition_time.clone(),
                _ => Time(now),
            };
            c
        })
        .collect();

    MemcachedStatus {
        nodes,
        endpoints,
        replicas,
        ready_replicas: ready,
        observed_generation: generation,
        selector: Some(selector_string(&name)),
        conditions,
        proxy,
        size_managed_by: mc
            .spec
            .autoscaling
            .as_ref()
            .map(|_| format!("HorizontalPodAutoscaler/{name}")),
        restarted_at: restarted_at(mc, observed, rollout_done),
        flush: observed
            .flush
            .clone()
            .or_else(|| mc.status.as_ref().and_then(|s| s.flush.clone())),
    }
}

/// `status.restartedAt`: the requested restart (`spec.rollout.restartedAt`) once the
/// Deployment has rolled out the template that carries it (the Deployment is the one this
/// reconcile applied or found current, so a rollout seen done is that template's), else
/// what the status said before.
fn restarted_at(mc: &Memcached, observed: &Observed<'_>, rollout_done: bool) -> Option<String> {
    let requested = mc
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.restarted_at.clone());
    let before = mc.status.as_ref().and_then(|s| s.restarted_at.clone());
    if rollout_done && observed.problem.is_none() && requested.is_some() {
        requested
    } else {
        before
    }
}

/// The `Ready` condition from the others (see [`condition::READY`]): True when the pool
/// serves as its spec says, else False with the reason of the first condition that is not
/// as it should be.
fn ready_condition(
    available: &Condition,
    progressing: &Condition,
    degraded: &Condition,
    proxy: Option<&Condition>,
) -> Condition {
    // A new default image waiting for a rollout slot is the operator's change, not the
    // spec's: the pool serves its spec meanwhile.
    let settled = progressing.status == "False" || progressing.reason == WAITING_FOR_ROLLOUT_SLOT;
    let blocking = [
        (degraded.status == "True").then_some(degraded),
        (available.status != "True").then_some(available),
        (!settled).then_some(progressing),
        proxy.filter(|p| p.status != "True"),
    ]
    .into_iter()
    .flatten()
    .next();
    match blocking {
        Some(c) => cond(
            condition::READY,
            false,
            &c.reason,
            format!("{} is {}: {}", c.type_, c.status, c.message),
        ),
        None => cond(
            condition::READY,
            true,
            "Ready",
            format!(
                "{}{}",
                available.message,
                if proxy.is_some() {
                    "; the proxy is configured"
                } else {
                    ""
                }
            ),
        ),
    }
}

/// Whether `want` only adds to what `live` says: pods listed, counts and messages moved,
/// endpoints added. Not when a condition turns (changes its status), a problem appears or
/// changes (`Degraded`, `CertificatesReloaded`: their reason or message), a pod leaves the
/// endpoints (a client reading them must stop using it), or the observed generation, the
/// selector or the proxy's part changes. The operator writes such progress at most once per
/// interval per pool (`controller::pacing`).
pub fn progress_only(live: &MemcachedStatus, want: &MemcachedStatus) -> bool {
    let problem =
        |type_: &str| type_ == condition::DEGRADED || type_ == condition::CERTIFICATES_RELOADED;
    live.observed_generation == want.observed_generation
        && live.selector == want.selector
        && live.proxy == want.proxy
        && live.flush == want.flush
        && live.size_managed_by == want.size_managed_by
        && live.endpoints.iter().all(|e| want.endpoints.contains(e))
        && live.conditions.len() == want.conditions.len()
        && live.conditions.iter().zip(&want.conditions).all(|(l, w)| {
            l.type_ == w.type_
                && l.status == w.status
                && (!problem(&w.type_) || (l.reason == w.reason && l.message == w.message))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use memcached_api::MemcachedSpec;

    fn mc(size: i32, generation: i64) -> Memcached {
        let mut mc = Memcached::new("m", MemcachedSpec::with_size(size));
        mc.metadata.generation = Some(generation);
        mc
    }

    fn deployment(
        generation: i64,
        seen: i64,
        replicas: i32,
        updated: i32,
        ready: i32,
    ) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(generation);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(seen),
            replicas: Some(replicas),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            ..DeploymentStatus::default()
        });
        d
    }

    fn status_of<'a>(s: &'a MemcachedStatus, t: &str) -> (&'a str, &'a str) {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .expect("condition present");
        (c.status.as_str(), c.reason.as_str())
    }

    fn t(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).expect("valid time")
    }

    /// A rollout's pace is in `Progressing`'s message, and pods Ready but not yet for
    /// `minReadySeconds` keep the pool Progressing.
    #[test]
    fn progressing_says_how_the_rollout_is_paced() {
        let m = mc(3, 2);
        let mut rolling = deployment(2, 2, 4, 1, 3);
        let observed = |d: &Deployment| {
            desired_status(
                &m,
                &Observed {
                    deployment: Some(d),
                    ..Observed::default()
                },
                t(100),
            )
        };
        let progressing = |s: &MemcachedStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == condition::PROGRESSING)
                .map(|c| (c.status.clone(), c.message.clone()))
                .expect("Progressing")
        };
        assert_eq!(
            progressing(&observed(&rolling)),
            (
                "True".to_string(),
                "1 of 3 pods updated; each new pod must stay Ready 30s before the next old one is replaced".to_string()
            )
        );
        // The last new pod Ready but not yet for 30 s: the last old pod is still there.
        rolling = deployment(2, 2, 4, 3, 4);
        if let Some(s) = rolling.status.as_mut() {
            s.available_replicas = Some(3);
        }
        let (status, message) = progressing(&observed(&rolling));
        assert_eq!(status, "True");
        assert!(message.starts_with("3 of 3 pods updated"), "{message}");
        // A new pool whose pods are Ready serves: Available, and nothing is left to
        // replace, so the 30 s the Deployment counts before calling them available do not
        // keep it Progressing.
        let mut created = deployment(1, 1, 3, 3, 3);
        if let Some(s) = created.status.as_mut() {
            s.available_replicas = Some(0);
        }
        let s = observed(&created);
        assert_eq!(progressing(&s).0, "False");
        assert_eq!(
            status_of(&s, condition::AVAILABLE),
            ("True", "MinimumReplicasAvailable")
        );
    }

    #[test]
    fn table_of_rollout_states() {
        // (size, deployment (gen, seen, replicas, updated, ready), Available, Progressing reason)
        let cases = [
            (
                3,
                None,
                ("False", "DeploymentMissing"),
                ("True", "Creating"),
            ),
            (
                3,
                Some((1, 1, 3, 3, 3)),
                ("True", "MinimumReplicasAvailable"),
                ("False", "RolloutComplete"),
            ),
            (
                3,
                Some((1, 1, 3, 3, 1)),
                ("False", "MinimumReplicasUnavailable"),
                ("True", "WaitingForReadyPods"),
            ),
            (
                5,
                Some((2, 1, 3, 3, 3)),
                ("False", "MinimumReplicasUnavailable"),
                ("True", "DeploymentUpdated"),
            ),
            (
                5,
                Some((2, 2, 3, 3, 3)),
                ("False", "MinimumReplicasUnavailable"),
                ("True", "ScalingUp"),
            ),
            (
                1,
                Some((2, 2, 3, 3, 3)),
                ("True", "MinimumReplicasAvailable"),
                ("True", "ScalingDown"),
            ),
            (
                3,
                Some((2, 2, 4, 1, 3)),
                ("True", "MinimumReplicasAvailable"),
                ("True", "RollingUpdate"),
            ),
            (
                0,
                Some((2, 2, 0, 0, 0)),
                ("True", "MinimumReplicasAvailable"),
                ("False", "RolloutComplete"),
            ),
        ];
        for (size, dep, available, progressing) in cases {
            let dep = dep.map(|(g, s, r, u, rd)| deployment(g, s, r, u, rd));
            let observed = Observed {
                deployment: dep.as_ref(),
                ..Observed::default()
            };
            let s = desired_status(&mc(size, 1), &observed, t(100));
            assert_eq!(
                status_of(&s, condition::AVAILABLE),
                available,
                "size {size} {dep:?}"
            );
            assert_eq!(
                status_of(&s, condition::PROGRESSING),
                progressing,
                "size {size} {dep:?}"
            );
            assert_eq!(status_of(&s, condition::DEGRADED), ("False", "AsExpected"));
            // Ready: the pool serves as its spec says, or the first reason it does not.
            let ready = match (available.0, progressing.0) {
                ("True", "False") => ("True", "Ready"),
                ("True", _) => ("False", progressing.1),
                _ => ("False", available.1),
            };
            assert_eq!(
                status_of(&s, condition::READY),
                ready,
                "size {size} {dep:?}"
            );
        }
    }

    #[test]
    fn ready_is_false_while_degraded_and_true_while_only_the_operator_waits() {
        let d = deployment(1, 1, 3, 3, 3);
        let problem = Problem {
            reason: "InvalidSpec".into(),
            message: "spec.size: must be at least 0".into(),
        };
        let s = desired_status(
            &mc(3, 4),
            &Observed {
                deployment: Some(&d),
                problem: Some(problem),
                ..Observed::default()
            },
            t(100),
        );
        assert_eq!(status_of(&s, condition::READY), ("False", "InvalidSpec"));
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("Ready");
        assert!(
            ready.message.starts_with("Degraded is True: "),
            "{}",
            ready.message
        );
        assert_eq!(ready.observed_generation, Some(4));
        // A new default image waiting for a rollout slot: the pool serves its spec.
        let s = desired_status(
            &mc(3, 4),
            &Observed {
                deployment: Some(&d),
                rollout_waiting: Some(1),
                flush: None,
                ..Observed::default()
            },
            t(100),
        );
        assert_eq!(
            status_of(&s, condition::PROGRESSING),
            ("True", WAITING_FOR_ROLLOUT_SLOT)
        );
        assert_eq!(status_of(&s, condition::READY), ("True", "Ready"));
    }

    #[test]
    fn nodes_are_sorted_pod_names_and_counts_come_from_the_deployment() {
        let d = deployment(1, 1, 3, 3, 2);
        let observed = Observed {
            deployment: Some(&d),
            pods: vec![
                ObservedPod {
                    zone: None,
                    created: None,
                    name: "m-abc-3".into(),
                    ip: Some("10.0.0.3".into()),
                    ready: true,
                },
                ObservedPod::named("m-abc-1"),
                ObservedPod {
                    zone: None,
                    created: None,
                    name: "m-abc-2".into(),
                    ip: Some("fd00::2".into()),
                    ready: true,
                },
            ],
            problem: None,
            proxy: None,
            reload_failures: Vec::new(),
            rollout_waiting: None,
            flush: None,
        };
        let s = desired_status(&mc(3, 4), &observed, t(100));
        assert_eq!(s.nodes, ["m-abc-1", "m-abc-2", "m-abc-3"]);
        assert_eq!(
            s.endpoints,
            ["[fd00::2]:11211", "10.0.0.3:11211"],
            "ready pods with an IP, in pod-name order"
        );
        assert_eq!(
            (s.replicas, s.ready_replicas, s.observed_generation),
            (3, 2, Some(4))
        );
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(4))
        );
        assert_eq!(
            s.selector.as_deref(),
            Some("app.kubernetes.io/instance=m,app.kubernetes.io/name=memcached")
        );
    }

    #[test]
    fn transition_time_changes_only_when_a_condition_flips() {
        let d = deployment(1, 1, 3, 3, 3);
        let observed = Observed {
            deployment: Some(&d),
            ..Observed::default()
        };
        let mut m = mc(3, 1);
        let first = desired_status(&m, &observed, t(100));
        m.status = Some(first.clone());
        let again = desired_status(&m, &observed, t(200));
        assert_eq!(first, again, "an unchanged world gives an identical status");

        let degraded = Observed {
            problem: Some(Problem {
                reason: "InvalidSpec".into(),
                message: "spec.size: too big".into(),
            }),
            ..observed.clone()
        };
        let flipped = desired_status(&m, &degraded, t(300));
        let when = |s: &MemcachedStatus, ty: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ty)
                .map(|c| c.last_transition_time.0)
        };
        assert_eq!(when(&flipped, condition::DEGRADED), Some(t(300)));
        assert_eq!(when(&flipped, condition::AVAILABLE), Some(t(100)));
        assert_eq!(
            status_of(&flipped, condition::DEGRADED),
            ("True", "InvalidSpec")
        );
    }

    #[test]
    fn proxy_ready_waits_for_pods_backends_and_the_kubelet() {
        let pool = deployment(1, 1, 3, 3, 3);
        let mut m = mc(3, 1);
        m.spec.proxy = Some(Box::new(memcached_api::ProxySpec::default()));
        let backend = |pod: &str| ProxyBackend {
            zone: None,
            copy: 1,
            slot: pod.len() as i32 - 1,
            pod: pod.into(),
            address: format!("10.0.0.{}:11211", pod.len()),
            warm_from: None,
            grown_from: None,
        };
        // The pods of the backends, Ready unless named in `not_ready`.
        let pods_of = |backends: &[ProxyBackend], not_ready: &[&str]| -> Vec<ObservedPod> {
            backends
                .iter()
                .filter(|b| !b.is_vacant())
                .map(|b| ObservedPod {
                    zone: None,
                    created: None,
                    name: b.pod.clone(),
                    ip: Some("10.0.0.1".into()),
                    ready: !not_ready.contains(&b.pod.as_str()),
                })
                .collect()
        };
        let at_with = |m: &Memcached,
                       proxy: &Deployment,
                       backends: Vec<ProxyBackend>,
                       not_ready: &[&str],
                       v: &str,
                       now| {
            let observed = Observed {
                deployment: Some(&pool),
                pods: pods_of(&backends, not_ready),
                problem: None,
                proxy: Some(ObservedProxy {
                    deployment: Some(proxy),
                    backends,
                    version: v.into(),
                    propagation: crate::proxy::PROPAGATION_WINDOW,
                }),
                reload_failures: Vec::new(),
                rollout_waiting: None,
                flush: None,
            };
            desired_status(m, &observed, now)
        };
        let at = |m: &Memcached, proxy: &Deployment, backends: Vec<ProxyBackend>, v: &str, now| {
            at_with(m, proxy, backends, &[], v, now)
        };
        let starting = deployment(1, 1, 2, 2, 0);
        let up = deployment(1, 1, 2, 2, 2);

        let s = at(&m, &starting, vec![backend("a")], "v1", t(100));
        assert_eq!(
            status_of(&s, condition::PROXY_READY),
            ("False", "ProxyUnavailable")
        );
        let s = at(&m, &up, vec![], "v0", t(100));
        assert_eq!(
            status_of(&s, condition::PROXY_READY),
            ("False", "NoBackends")
        );

        // The first configuration is read by the proxies as they start: ready at once.
        let first = at(&m, &up, vec![backend("a")], "v1", t(100));
        assert_eq!(
            status_of(&first, condition::PROXY_READY),
            ("True", "Configured")
        );
        let proxy = first.proxy.clone().expect("proxy status");
        assert_eq!((proxy.replicas, proxy.ready_replicas), (2, 2));
        assert_eq!(proxy.config_changed_at, None);
        m.status = Some(first);

        // A new configuration under running proxies: catching up for the window.
        let changed = at(&m, &up, vec![backend("a"), backend("bb")], "v2", t(200));
        assert_eq!(
            status_of(&changed, condition::PROXY_READY),
            ("False", PROXY_PROPAGATING)
        );
        // The pool serves, but the proxies have not all loaded its routes: not Ready.
        assert_eq!(
            status_of(&changed, condition::READY),
            ("False", PROXY_PROPAGATING)
        );
        assert_eq!(
            changed
                .proxy
                .as_ref()
                .and_then(|p| p.config_changed_at.clone()),
            Some(Time(t(200)))
        );
        m.status = Some(changed);
        let window = crate::proxy::PROPAGATION_WINDOW.as_secs() as i64;
        let still = at(
            &m,
            &up,
            vec![backend("a"), backend("bb")],
            "v2",
            t(200 + window - 1),
        );
        assert_eq!(
            status_of(&still, condition::PROXY_READY),
            ("False", PROXY_PROPAGATING)
        );
        let done = at(
            &m,
            &up,
            vec![backend("a"), backend("bb")],
            "v2",
            t(200 + window),
        );
        assert_eq!(
            status_of(&done, condition::PROXY_READY),
            ("True", "Configured")
        );
        assert_eq!(status_of(&done, condition::READY), ("True", "Ready"));

        // Not reconciled this time (a problem was recorded): carried over unchanged.
        m.status = Some(done.clone());
        let carried = desired_status(
            &m,
            &Observed {
                deployment: Some(&pool),
                ..Observed::default()
            },
            t(900),
        );
        assert_eq!(carried.proxy, done.proxy);
        assert_eq!(
            status_of(&carried, condition::PROXY_READY),
            ("True", "Configured")
        );

        // A pod in the routes that is not Ready stays there, and is told; with none Ready,
        // the proxy has nothing to answer with.
        m.status = Some(done.clone());
        let two = vec![backend("a"), backend("bb")];
        let flapping = at_with(&m, &up, two.clone(), &["bb"], "v2", t(1000));
        assert_eq!(
            status_of(&flapping, condition::PROXY_READY),
            ("True", "Configured")
        );
        assert_eq!(
            flapping.proxy.as_ref().map(|p| p.backends.clone()),
            Some(two.clone())
        );
        let message = &flapping
            .conditions
            .iter()
            .find(|c| c.type_ == condition::PROXY_READY);
        assert!(
            message.is_some_and(|c| c.message.contains("1 not Ready")),
            "{message:?}"
        );
        let none = at_with(&m, &up, two, &["a", "bb"], "v2", t(1000));
        assert_eq!(
            status_of(&none, condition::PROXY_READY),
            ("False", "NoBackends")
        );
        // A vacant slot is in the routes, not in status.proxy.backends.
        let vacant = ProxyBackend {
            copy: 1,
            slot: 1,
            ..ProxyBackend::default()
        };
        let with_vacancy = at(&m, &up, vec![backend("a"), vacant], "v2", t(1000));
        assert_eq!(
            with_vacancy.proxy.as_ref().map(|p| p.backends.clone()),
            Some(vec![backend("a")])
        );
        let message = &with_vacancy
            .conditions
            .iter()
            .find(|c| c.type_ == condition::PROXY_READY);
        assert!(
            message.is_some_and(|c| c.message.contains("1 slots vacant")),
            "{message:?}"
        );

        // Switched off: no proxy status, no condition.
        m.spec.proxy = None;
        let off = at(&m, &up, vec![backend("a")], "v2", t(1000));
        assert!(off.proxy.is_none());
        assert!(
            off.conditions
                .iter()
                .all(|c| c.type_ != condition::PROXY_READY)
        );
    }

    /// The pods' readiness in the cache counts as soon as it is seen, before the Deployment
    /// controller counts it, when the cache and the Deployment agree on the pods.
    #[test]
    fn a_pool_is_available_when_its_pods_are_ready_before_the_deployment_counts_them() {
        let m = mc(3, 1);
        let pods = |n: usize, ready: usize| -> Vec<ObservedPod> {
            (0..n)
                .map(|i| ObservedPod {
                    zone: None,
                    created: None,
                    name: format!("m-{i}"),
                    ip: Some(format!("10.0.0.{i}")),
                    ready: i < ready,
                })
                .collect()
        };
        let with = |d: &Deployment, pods: Vec<ObservedPod>| {
            desired_status(
                &m,
                &Observed {
                    deployment: Some(d),
                    pods,
                    ..Observed::default()
                },
                t(100),
            )
        };
        let counted_two = deployment(1, 1, 3, 3, 2);
        let s = with(&counted_two, pods(3, 3));
        assert_eq!(s.ready_replicas, 3);
        assert_eq!(status_of(&s, condition::AVAILABLE).0, "True");
        assert_eq!(
            status_of(&s, condition::PROGRESSING),
            ("False", "RolloutComplete")
        );
        assert_eq!(status_of(&s, condition::READY).0, "True");
        // The cache holds a pod the Deployment no longer counts (an old one whose deletion
        // is not seen yet): its count is not mixed with the Deployment's.
        let s = with(&counted_two, pods(4, 3));
        assert_eq!(
            status_of(&s, condition::PROGRESSING),
            ("True", "WaitingForReadyPods")
        );
        // What serves is counted all the same: the Ready pods the endpoints list.
        assert_eq!(s.ready_replicas, 3);
        assert_eq!(s.endpoints.len(), 3);
        assert_eq!(status_of(&s, condition::AVAILABLE).0, "True");
        // The Deployment's count is fresher: it stands.
        let s = with(&deployment(1, 1, 3, 3, 3), pods(3, 2));
        assert_eq!(status_of(&s, condition::AVAILABLE).0, "True");
    }

    /// A new pool of 3 on its way up, step by step: which steps only add to what the last
    /// status said (written at most once per interval) and which are written at once.
    #[test]
    fn progress_is_what_only_adds_and_a_turn_or_a_loss_is_not() {
        let m = mc(3, 1);
        let pod = |i: usize, ready: bool| ObservedPod {
            zone: None,
            created: None,
            name: format!("m-{i}"),
            ip: Some(format!("10.0.0.{i}")),
            ready,
        };
        let step = |d: &Deployment, ready: usize| {
            let pods = (0..3).map(|i| pod(i, i < ready)).collect();
            let mut m = m.clone();
            let status = |m: &Memcached| {
                desired_status(
                    m,
                    &Observed {
                        deployment: Some(d),
                        pods: if d.status.as_ref().and_then(|s| s.replicas) == Some(0) {
                            Vec::new()
                        } else {
                            pods
                        },
                        ..Observed::default()
                    },
                    t(100),
                )
            };
            m.status = Some(status(&m));
            m
        };
        let created = step(&deployment(1, 0, 0, 0, 0), 0);
        let scaling = step(&deployment(1, 1, 3, 3, 0), 0);
        let one = step(&deployment(1, 1, 3, 3, 1), 1);
        let two = step(&deployment(1, 1, 3, 3, 2), 2);
        let three = step(&deployment(1, 1, 3, 3, 3), 3);
        let s = |m: &Memcached| m.status.clone().unwrap_or_default();
        assert!(progress_only(&s(&created), &s(&scaling)), "pods listed");
        assert!(progress_only(&s(&scaling), &s(&one)), "a first pod Ready");
        assert!(progress_only(&s(&one), &s(&two)), "a second");
        assert!(
            !progress_only(&s(&two), &s(&three)),
            "the pool turns Available and Ready"
        );
        assert!(
            !progress_only(&s(&two), &s(&one)),
            "a pod leaves the endpoints"
        );
        let mut moved = s(&one);
        moved.observed_generation = Some(2);
        assert!(!progress_only(&s(&one), &moved), "a new generation");
        let mut problem = s(&one);
        if let Some(c) = problem
            .conditions
            .iter_mut()
            .find(|c| c.type_ == condition::DEGRADED)
        {
            c.message = "another problem".into();
        }
        assert!(!progress_only(&s(&one), &problem), "a problem's message");
    }
}
