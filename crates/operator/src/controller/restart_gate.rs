//! The restart gate of in-place TLS reloads: which pods' reload agents reported renewed
//! files they could not load ([`reload_failures`]), and the restart of such a pod, one at
//! a time and only while the rest of the pool is whole ([`restart_failed_reload`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::DeleteParams;
use kube::runtime::events::{Event, EventType};
use kube::{Api, ResourceExt};
use memcached_api::Memcached;
use tracing::warn;

use super::context::{Context, Error, object_key};
use super::events::{EVENT_NOTE_MAX, truncate};
use crate::builders;
use crate::cached::CachedPod;
use crate::informer::Index;
use crate::status::ReloadFailure;

/// Pods of `name` whose TLS reload agent reported renewed files it could not load, sorted
/// by name; none when the certificate is not reloaded in place.
pub(super) fn reload_failures(
    mc: &Memcached,
    pods: &Index<CachedPod>,
    namespace: &str,
    name: &str,
) -> Vec<ReloadFailure> {
    if !mc.spec.tls_reloads_in_place() {
        return Vec::new();
    }
    let mut failed: Vec<_> = pods
        .get(&format!("{namespace}/{name}"))
        .iter()
        .filter(|p| !p.ended)
        .filter_map(|p| {
            let (code, reason) = p.tls_reload_failure.clone()?;
            Some(ReloadFailure {
                pod: p.name_any(),
                restart: code == builders::TLS_AGENT_RELOAD_FAILED,
                reason,
            })
        })
        .collect();
    failed.sort();
    failed
}

/// A Warning event about `mc` naming the pod of `failure` as its related object: warnings
/// repeat as a series per (object, reason, related), so each pod's failure keeps its note.
pub(super) fn publish_reload_failure(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
    failure: &ReloadFailure,
    reason: &str,
    action: &str,
    note: String,
) {
    ctx.events.publish_event(
        mc,
        Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(truncate(note, EVENT_NOTE_MAX)),
            action: action.to_string(),
            secondary: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Pod".to_string()),
                name: Some(failure.pod.clone()),
                namespace: Some(namespace.to_string()),
                ..ObjectReference::default()
            }),
        },
    );
}

/// How long past its deletion time a pod may stay Terminating before the gate stops
/// waiting for it: a pod on a lost node is never confirmed gone by its kubelet (the node
/// lifecycle controller leaves it Terminating until the node returns or is deleted), and
/// must not hold every later restart of the pool.
pub const STUCK_TERMINATING: Duration = Duration::from_secs(300);

/// The first pod to restart for a failed reload, with its uid, if the gate is open: the
/// rest of the pool is whole, that is no pod of the pool is being deleted (a replacement,
/// a drain, an eviction; a pod Terminating [`STUCK_TERMINATING`] past its deletion time
/// is taken as gone), the pool has `size` pods, and every pod that reported no failure is
/// Ready. Pure: `now` is the clock.
pub fn pod_to_restart<'f>(
    size: i32,
    pods: &[impl std::ops::Deref<Target = CachedPod>],
    failures: &'f [ReloadFailure],
    now: jiff::Timestamp,
) -> Option<(&'f ReloadFailure, String)> {
    let failure = failures.iter().find(|f| f.restart)?;
    let stuck = |p: &CachedPod| {
        p.metadata.deletion_timestamp.as_ref().is_some_and(|at| {
            now.duration_since(at.0)
                > jiff::SignedDuration::try_from(STUCK_TERMINATING).unwrap_or_default()
        })
    };
    let live: Vec<&CachedPod> = pods
        .iter()
        .map(|p| &**p)
        .filter(|p| !p.ended && !stuck(p))
        .collect();
    let deleting = live.iter().any(|p| p.metadata.deletion_timestamp.is_some());
    let others_ready = live
        .iter()
        .filter(|p| !failures.iter().any(|f| f.pod == p.name_any()))
        .all(|p| p.ready);
    let whole = i32::try_from(live.len()).unwrap_or(i32::MAX) >= size;
    if deleting || !others_ready || !whole {
        return None;
    }
    let uid = live
        .iter()
        .find(|p| p.name_any() == failure.pod)
        .and_then(|p| p.metadata.uid.clone())?;
    Some((failure, uid))
}

/// Restarts the first pod whose memcached refused its renewed certificate, after the
/// status has named it, and only while the rest of the pool is whole
/// ([`pod_to_restart`]). So pods are restarted one at a time, each after the previous
/// one's replacement serves, and files memcached cannot load at all (whose replacement
/// pods never start) cost one pod, not the pool. The pod is deleted with its uid as a
/// precondition (a pod of that name made since is left alone); its Deployment makes a new
/// one, which loads the certificate as memcached starts.
pub(super) async fn restart_failed_reload(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
    failures: &[ReloadFailure],
) -> Result<(), Error> {
    let pods = ctx.pod_index.get(&format!("{namespace}/{}", mc.name_any()));
    let Some((failure, uid)) =
        pod_to_restart(mc.spec.size, &pods, failures, jiff::Timestamp::now())
    else {
        return Ok(());
    };
    let pod = &failure.pod;
    let reason = &failure.reason;
    let note = format!(
        "Pod {pod} could not load the renewed TLS certificate ({reason}); restarting it so memcached loads it as it starts"
    );
    warn!(object = %object_key(mc), pod, reason, "TLS certificate reload failed: restarting the pod");
    publish_reload_failure(
        ctx,
        mc,
        namespace,
        failure,
        "CertificateReloadFailed",
        "RestartPod",
        note,
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(pod, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or another pod of that name now.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: "Pod".into(),
            object: format!("{namespace}/{pod}"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, ready: bool, deleted_at: Option<jiff::Timestamp>) -> CachedPod {
        let mut pod = CachedPod {
            ready,
            ..CachedPod::default()
        };
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod.metadata.deletion_timestamp = deleted_at.map(Time);
        pod
    }

    fn failure(pod: &str) -> ReloadFailure {
        ReloadFailure {
            pod: pod.into(),
            restart: true,
            reason: "Error loading the certificate".into(),
        }
    }

    #[test]
    fn a_pod_stuck_terminating_on_a_lost_node_does_not_hold_the_gate() {
        let now = jiff::Timestamp::now();
        let failures = [failure("a")];
        let whole = [
            pod("a", true, None),
            pod("b", true, None),
            pod("c", true, None),
        ];
        let restart = pod_to_restart(3, &whole.iter().collect::<Vec<_>>(), &failures, now);
        assert_eq!(
            restart.map(|(f, uid)| (f.pod.clone(), uid)),
            Some(("a".into(), "uid-a".into()))
        );

        // A pod being replaced holds the gate shut ...
        let since = |secs: i64| now - jiff::SignedDuration::from_secs(secs);
        let replacing = [
            pod("a", true, None),
            pod("b", true, None),
            pod("c", false, Some(since(10))),
            pod("d", true, None),
        ];
        let pods: Vec<_> = replacing.iter().collect();
        assert!(pod_to_restart(3, &pods, &failures, now).is_none());
        // ... but not once it has been Terminating for longer than a kubelet would take.
        let stuck = [
            pod("a", true, None),
            pod("b", true, None),
            pod(
                "c",
                false,
                Some(since(STUCK_TERMINATING.as_secs() as i64 + 60)),
            ),
            pod("d", true, None),
        ];
        let pods: Vec<_> = stuck.iter().collect();
        assert!(pod_to_restart(3, &pods, &failures, now).is_some());
        // Its replacement must still be there and Ready: the pool is whole without it.
        let pods: Vec<_> = stuck[..3].iter().collect();
        assert!(pod_to_restart(3, &pods, &failures, now).is_none());
    }
}
