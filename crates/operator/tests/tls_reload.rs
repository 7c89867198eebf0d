//! A pod whose TLS reload agent reports that memcached refused a renewed certificate is
//! named in the status (`CertificatesReloaded=False`) and in an event, and only then
//! restarted; its Deployment replaces it. Files the agent refused itself (memcached never
//! saw them and keeps its certificate) are reported and the pod left running. The kubelet's part (the agent's container ending
//! with exit code 3 and a termination message) is played by a patch of the pod's status,
//! in the shape the kubelet writes for a native sidecar. With client authentication, a new
//! CA rolls the pods while a renewed certificate does not.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use memcached_api::{Memcached, MemcachedSpec, TlsSpec, condition};
use memcached_operator::controller::{self, ControllerConfig};
use serde_json::json;

mod common;
use common::cluster::{Cluster, Server};
use common::wait_for;

const REASON: &str = "Error loading the certificate chain: key values mismatch";

on_every_server! {
    async fn a_refused_reload_is_reported_then_the_pod_restarted(server: Server) {
        let (cluster, stop_tx, task) = start(server, "tls-reload-refused").await;
        let memcacheds = create_pool(&cluster, "reload").await;

        // Every status the operator writes, in order (a poll could miss a short one).
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let recorder = {
            let seen = seen.clone();
            let stream = watcher(
                memcacheds.clone(),
                watcher::Config::default().fields("metadata.name=reload"),
            );
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    if let watcher::Event::Apply(m) | watcher::Event::InitApply(m) = event
                        && let Some(c) = m.condition(condition::CERTIFICATES_RELOADED)
                    {
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        seen.push((c.status.clone(), c.message.clone()));
                    }
                }
            })
        };

        let pods: Api<Pod> = cluster.api();
        let selector = ListParams::default().labels("app.kubernetes.io/instance=reload");
        let before = wait_for("3 pods ready and reloads in place", || async {
            let m = memcacheds.get("reload").await.ok()?;
            let status = m.status.as_ref()?;
            let reloads = m.condition(condition::CERTIFICATES_RELOADED)?;
            (status.ready_replicas == 3 && reloads.status == "True")
                .then(|| status.nodes.clone())
        })
        .await;
        let events: Api<Event> = cluster.api();

        // Files the agent refused itself (exit 4): reported, and the pod left running, as
        // memcached keeps serving the certificate it has.
        let kept = before[1].clone();
        let kept_uid = pods.get(&kept).await.expect("pod").uid();
        let mismatch = "memcached could not load the certificate in /etc/memcached/tls: tls.key does not match the certificate in tls.crt";
        pods.patch_status(&kept, &PatchParams::default(), &Patch::Merge(&agent_ended(4, mismatch)))
            .await
            .expect("pod status patched");
        let message = wait_for("CertificatesReloaded=False, CertificateInvalid", || async {
            let m = memcacheds.get("reload").await.ok()?;
            let c = m.condition(condition::CERTIFICATES_RELOADED)?;
            (c.status == "False" && c.reason == "CertificateInvalid").then(|| c.message.clone())
        })
        .await;
        assert!(message.contains(&kept) && message.contains("does not match"), "{message}");
        let related = common::event_with_reason(&events, "CertificateInvalid")
            .await
            .related
            .and_then(|r| r.name);
        assert_eq!(related.as_deref(), Some(kept.as_str()));
        assert_eq!(pods.get(&kept).await.expect("still there").uid(), kept_uid);
        // The agent loaded fixed files and exited 0: no longer a failure.
        pods.patch_status(&kept, &PatchParams::default(), &Patch::Merge(&agent_ended(0, "")))
            .await
            .expect("pod status patched");
        wait_for("CertificatesReloaded=True again", || async {
            let m = memcacheds.get("reload").await.ok()?;
            let c = m.condition(condition::CERTIFICATES_RELOADED)?;
            (c.status == "True").then_some(())
        })
        .await;
        assert_eq!(pods.get(&kept).await.expect("still there").uid(), kept_uid);

        let victim = before[0].clone();
        let victim_uid = pods.get(&victim).await.expect("pod").uid();

        // memcached refused the files (exit 3): reported, then the pod restarted.
        let sidecar = agent_ended(
            3,
            &format!("memcached could not load the certificate in /etc/memcached/tls: memcached refused the certificate: {REASON}"),
        );
        pods.patch_status(&victim, &PatchParams::default(), &Patch::Merge(&sidecar))
            .await
            .expect("pod status patched");

        // Reported: the condition names the pod and memcached's reason, and so does an event.
        let event = common::event_with_reason(&events, "CertificateReloadFailed").await;
        let note = event.note.unwrap_or_default();
        let related = event.related.and_then(|r| r.name);
        assert!(note.contains(&victim) && note.contains(REASON), "{note}");
        assert_eq!(related.as_deref(), Some(victim.as_str()), "the event's related object");
        // Then restarted: the pod is gone and the Deployment made another.
        let after = wait_for("the pod replaced and 3 ready again", || async {
            let list = pods.list(&selector).await.ok()?;
            let gone = list.items.iter().all(|p| p.uid() != victim_uid);
            let m = memcacheds.get("reload").await.ok()?;
            let status = m.status.as_ref()?;
            let reloads = m.condition(condition::CERTIFICATES_RELOADED)?;
            (gone
                && status.ready_replicas == 3
                && status.nodes.len() == 3
                && reloads.status == "True")
                .then(|| status.nodes.clone())
        })
        .await;
        assert_eq!(after.len(), 3);
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let failed = seen
            .iter()
            .find(|(status, message)| status == "False" && message.contains(&victim))
            .unwrap_or_else(|| panic!("CertificatesReloaded never False for {victim}: {seen:?}"));
        assert!(failed.1.contains(&victim) && failed.1.contains(REASON), "{failed:?}");
        // The other pods were left alone.
        for pod in &before[1..] {
            assert!(after.contains(pod), "{pod} kept: {after:?}");
        }

        recorder.abort();
        let _ = stop_tx.send(());
        let _ = task.await;
    }
}

/// A cluster with the `certs` TLS Secret and the controller running on it.
async fn start(
    server: Server,
    test: &str,
) -> (
    Cluster,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let cluster = Cluster::start(
        server,
        test,
        |b| b.pod_ready_delay(Duration::from_millis(50)),
        false,
    )
    .await;
    let secrets: Api<Secret> = cluster.api();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("certs".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [("tls.crt", "cert"), ("tls.key", "key")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret created");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = ControllerConfig {
        namespace: cluster.watch_namespace(),
        ..ControllerConfig::default()
    };
    let task = tokio::spawn(controller::run(cluster.client.clone(), config, async {
        let _ = stop_rx.await;
    }));
    (cluster, stop_tx, task)
}

/// A TLS pool of 3 whose certificate is reloaded in place (rollouts unpaced).
async fn create_pool(cluster: &Cluster, name: &str) -> Api<Memcached> {
    let memcacheds: Api<Memcached> = cluster.api();
    let mut mc = Memcached::new(
        name,
        MemcachedSpec {
            tls: Some(TlsSpec::secret("certs")),
            ..MemcachedSpec::with_size(3)
        },
    );
    mc.spec.rollout = Some(memcached_api::RolloutSpec {
        min_ready_seconds: 0,
        ..Default::default()
    });
    memcacheds
        .create(&PostParams::default(), &mc)
        .await
        .expect("Memcached created");
    memcacheds
}

/// The kubelet's record of the reload agent's last run, as a pod status patch.
fn agent_ended(code: i32, message: &str) -> serde_json::Value {
    json!({"status": {"initContainerStatuses": [{
        "name": "tls-reload-agent", "ready": true, "restartCount": 1, "started": true,
        "image": "controller:latest", "imageID": "",
        "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}},
        "lastState": {"terminated": {"exitCode": code, "reason": "Error",
            "message": message,
            "startedAt": "2026-11-25T00:00:00Z", "finishedAt": "2026-11-25T00:00:01Z"}},
    }]}})
}

on_every_server! {
    /// Two pods whose memcached refused the files: restarted one at a time, the second only
    /// once the first one's replacement is Ready (read from the order of pod events).
    async fn failed_reloads_restart_one_pod_at_a_time(server: Server) {
        let (cluster, stop_tx, task) = start(server, "tls-reload-one-at-a-time").await;
        let memcacheds = create_pool(&cluster, "pace").await;
        let before = wait_for("3 pods ready", || async {
            let status = memcacheds.get("pace").await.ok()?.status?;
            (status.ready_replicas == 3).then_some(status.nodes)
        })
        .await;

        // Every change of the pool's pods, in order: (name, deleted or being deleted, Ready).
        let pods: Api<Pod> = cluster.api();
        let seen: Arc<Mutex<Vec<(String, bool, bool)>>> = Arc::default();
        let recorder = {
            let seen = seen.clone();
            let stream = watcher(
                pods.clone(),
                watcher::Config::default().labels("app.kubernetes.io/instance=pace"),
            );
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    let (pod, gone) = match event {
                        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                            let gone = p.metadata.deletion_timestamp.is_some();
                            (p, gone)
                        }
                        watcher::Event::Delete(p) => (p, true),
                        _ => continue,
                    };
                    let ready = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    seen.push((pod.name_any(), gone, ready));
                }
            })
        };

        let refused = agent_ended(3, &format!("memcached refused the certificate: {REASON}"));
        for pod in &before[..2] {
            pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&refused))
                .await
                .expect("pod status patched");
        }
        let after = wait_for("both pods replaced and 3 ready", || async {
            let status = memcacheds.get("pace").await.ok()?.status?;
            (status.ready_replicas == 3
                && status.nodes.len() == 3
                && !status.nodes.contains(&before[0])
                && !status.nodes.contains(&before[1]))
            .then_some(status.nodes)
        })
        .await;
        assert!(after.contains(&before[2]), "the third pod kept: {after:?}");

        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let gone_at = |name: &str| {
            seen.iter()
                .position(|(n, gone, _)| n == name && *gone)
                .unwrap_or_else(|| panic!("{name} never deleted: {seen:?}"))
        };
        let (first, second) = {
            let (a, b) = (gone_at(&before[0]), gone_at(&before[1]));
            (a.min(b), a.max(b))
        };
        let replacement_ready = seen[first..second]
            .iter()
            .any(|(n, gone, ready)| !before.contains(n) && !gone && *ready);
        assert!(
            replacement_ready,
            "the second pod was deleted before the first one's replacement was Ready: {seen:?}"
        );

        recorder.abort();
        let _ = stop_tx.send(());
        let _ = task.await;
    }
}

/// The config hash of the pod template of Deployment `name`.
async fn template_hash(cluster: &Cluster, name: &str) -> Option<String> {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = cluster.api();
    deployments
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec)
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("memcached.cache.example.com/config-hash").cloned())
}

on_every_server! {
    /// With client authentication and the CA in the TLS Secret: a pool without `ca.crt` is
    /// reported on `spec.tls.clientAuth`; once it is there the pool runs; a renewed
    /// certificate leaves the pod template as it is (the agent reloads it in place) and a
    /// new CA changes it (memcached would go on trusting the old CA until it restarts).
    async fn a_new_client_ca_rolls_the_pods_and_a_renewed_certificate_does_not(server: Server) {
        let (cluster, stop_tx, task) = start(server, "tls-client-ca").await;
        let memcacheds: Api<Memcached> = cluster.api();
        let mut mc = Memcached::new(
            "mutual",
            MemcachedSpec {
                tls: Some(TlsSpec {
                    client_auth: Some(memcached_api::ClientAuthSpec::default()),
                    ..TlsSpec::secret("certs")
                }),
                ..MemcachedSpec::with_size(1)
            },
        );
        mc.spec.rollout = Some(memcached_api::RolloutSpec { min_ready_seconds: 0, ..Default::default() });
        memcacheds
            .create(&PostParams::default(), &mc)
            .await
            .expect("Memcached created");
        let message = wait_for("the missing ca.crt reported", || async {
            let mc = memcacheds.get("mutual").await.ok()?;
            let ready = mc.condition(condition::READY)?;
            (ready.reason == "SecretInvalid").then(|| ready.message.clone())
        })
        .await;
        assert!(
            message.contains("spec.tls.clientAuth") && message.contains("ca.crt"),
            "{message}"
        );

        let secrets: Api<Secret> = cluster.api();
        let write = |cert: &str, ca: &str| {
            let data: std::collections::BTreeMap<&str, ByteString> =
                [("tls.crt", cert), ("tls.key", "key"), ("ca.crt", ca)]
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v.as_bytes().to_vec())))
                    .collect();
            json!({ "data": data })
        };
        secrets
            .patch("certs", &PatchParams::default(), &Patch::Merge(write("cert", "ca-1")))
            .await
            .expect("ca.crt added");
        let first = wait_for("the Deployment", || template_hash(&cluster, "mutual")).await;

        secrets
            .patch("certs", &PatchParams::default(), &Patch::Merge(write("renewed", "ca-1")))
            .await
            .expect("certificate renewed");
        // A change the operator must react to, after the renewal: proof it read the Secret.
        memcacheds
            .patch(
                "mutual",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": 2}})),
            )
            .await
            .expect("scaled");
        wait_for("the scale applied", || async {
            let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = cluster.api();
            let d = deployments.get("mutual").await.ok()?;
            (d.spec?.replicas == Some(2)).then_some(())
        })
        .await;
        assert_eq!(
            template_hash(&cluster, "mutual").await.as_ref(),
            Some(&first),
            "a renewed certificate reloads in place"
        );

        secrets
            .patch("certs", &PatchParams::default(), &Patch::Merge(write("renewed", "ca-2")))
            .await
            .expect("new CA");
        wait_for("a new CA rolls the pods", || async {
            template_hash(&cluster, "mutual")
                .await
                .filter(|hash| *hash != first)
        })
        .await;
        let _ = stop_tx.send(());
        let _ = task.await;
    }
}
