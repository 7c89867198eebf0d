//! The restart gate of in-place TLS reloads: which pods' reload agents reported renewed
//! files they could not load ([`reload_failures`]), and the restart of such a pod, one at
//! a time and only while the rest of the pool is whole ([`restart_failed_reload`]).

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

/// Restarts the first pod whose memcached refused its renewed certificate, after the
/// status has named it, and only while the rest of the pool is whole: no pod of the pool
/// is being deleted (a replacement, a drain, an eviction), the pool has `size` pods, and
/// every pod that reported no failure is Ready. So pods are restarted one at a time, each
/// after the previous one's replacement serves, and files memcached cannot load at all
/// (whose replacement pods never start) cost one pod, not the pool. The pod is deleted
/// with its uid as a precondition (a pod of that name made since is left alone); its
/// Deployment makes a new one, which loads the certificate as memcached starts.
pub(super) async fn restart_failed_reload(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
    failures: &[ReloadFailure],
) -> Result<(), Error> {
    let Some(failure) = failures.iter().find(|f| f.restart) else {
        return Ok(());
    };
    let pods = ctx.pod_index.get(&format!("{namespace}/{}", mc.name_any()));
    let live: Vec<_> = pods.iter().filter(|p| !p.ended).collect();
    let deleting = live.iter().any(|p| p.metadata.deletion_timestamp.is_some());
    let others_ready = live
        .iter()
        .filter(|p| !failures.iter().any(|f| f.pod == p.name_any()))
        .all(|p| p.ready);
    let whole = i32::try_from(live.len()).unwrap_or(i32::MAX) >= mc.spec.size;
    if deleting || !others_ready || !whole {
        return Ok(());
    }
    let pod = &failure.pod;
    let reason = &failure.reason;
    let Some(uid) = live
        .iter()
        .find(|p| p.name_any() == *pod)
        .and_then(|p| p.metadata.uid.clone())
    else {
        return Ok(());
    };
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
