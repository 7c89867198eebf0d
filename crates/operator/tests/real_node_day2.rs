//! Day-2 operations on the real node (crates/envtest: containerd, runc, the pinned kubelet),
//! on each pinned version, with the operator in-process as in real_node.rs and memcached
//! 1.6.38 in the node's image. The kubelet, the scheduler, the PV controller and the API
//! server decide; memcached's own `stats` say what it did.
//! - extstore on an `emptyDir` (the default): a pool written past its memory (`-m`) serves
//!   the values back from its file (`get_extstore`), intact; then filled until memcached's
//!   stats say every page of the file was written and recycled, the file at its full size
//!   in the volume's directory on the host (not in the container's root). The kubelet
//!   measures the volume (its stats summary, what its eviction manager reads) and does not
//!   evict the pod, whose `sizeLimit` the operator set with room beyond the file; a pod of
//!   the same template with a `sizeLimit` below the file is evicted by the same kubelet
//!   ("Usage of EmptyDir volume "extstore" exceeds the limit"), in a pass that sees the
//!   pool's full volume too. No restart.
//! - extstore on a generic ephemeral volume (`storageClassName`): the claim is made with
//!   the pod and bound to a pre-created local PV, the pool written past its memory and
//!   filled as above, the file in that PV's directory, written by memcached's user through
//!   the kubelet's `fsGroup`; deleting the pool deletes the claim.
//! - `kubectl drain` of the node (the cluster's only node) evicts one pod of a pool of two
//!   and is refused the second by the API server for the pool's PodDisruptionBudget (drain
//!   times out saying so); the pod left keeps serving what was set on it, the status says 1
//!   ready; after `kubectl uncordon` the pool is back to 2 Ready pods, in its status too.
//! - `gracefulShutdown`: a deleted pod of a pool with a `preStopDelaySeconds` of 20 leaves
//!   its Service's EndpointSlices (no longer ready) while the Pod is still there, being
//!   deleted, and memcached on its IP still answers what was set on it (the kubelet's
//!   `preStop` sleep holds its SIGTERM back); the Pod object lasts at least the delay after
//!   the deletion.
//! - `flush`: a flush on demand empties the pods of a pool one after the other by name, at
//!   least the pause apart, each receiving one `flush_all` (memcached's `cmd_flush`), with
//!   no restart; `status.flush` is complete; a later change of the spec flushes nothing.
//!
//! Needs root and `make node`. Runs under the host lock (`flock /tmp/real-node.lock`) like
//! the other real-node suites.

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use envtest::Kube;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use memcached_api::{
    ExtstoreSpec, GracefulShutdownSpec, Memcached, MemcachedConfig, MemcachedSpec, RolloutSpec,
};
use serde_json::json;

mod common;
use common::process::TempDir;
use common::real_node::{
    CONVERGE, Env, Text, assert_no_restarts, blocking, plain, poll, stat, try_connect,
};
use common::{big_value, volume_bytes};

/// One real node at a time in this binary (and, across binaries, `flock /tmp/real-node.lock`).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1024 * 1024;
/// The pools' cache (`-m`), the smallest that holds a few of the values below.
const MEMORY_MIB: i32 = 16;
/// Values well above `ext_item_size` (512 bytes), so that memcached moves them to disk.
const VALUE: usize = 16 * 1024;
/// The extstore file: 16 pages of 2 MiB (memcached's smallest), so that a few passes over
/// it are quick.
const EXTSTORE_SIZE: &str = "32Mi";
/// How long the kubelet may take to measure a volume (its volume stats are refreshed every
/// minute) and its eviction manager to act on it (every 10 s), on a loaded machine.
const KUBELET_SEES: Duration = Duration::from_secs(300);

/// A pool of one pod on the real node with extstore on `storage_class`'s generic ephemeral
/// volume, or on an `emptyDir` without one.
fn extstore_pool(env: &Env, storage_class: Option<&str>) -> MemcachedSpec {
    let mut spec = MemcachedSpec {
        config: Some(MemcachedConfig {
            memory_mib: MEMORY_MIB,
            ..MemcachedConfig::default()
        }),
        extstore: Some(Box::new(ExtstoreSpec {
            size: EXTSTORE_SIZE.into(),
            storage_class_name: storage_class.map(String::from),
            page_size_mib: 2,
            write_buffer_mib: 2,
            ..ExtstoreSpec::default()
        })),
        rollout: Some(RolloutSpec {
            min_ready_seconds: 0,
            ..Default::default()
        }),
        ..MemcachedSpec::with_size(1)
    };
    env.on_the_real_node(&mut spec);
    spec
}

/// Writes twice the pool's memory in values of [`VALUE`] bytes to memcached at `ip`, then
/// reads every one back: memcached must have written some to its extstore file and served
/// them from it (`get_extstore`), every value read back intact, more than its memory's
/// worth of them read back in all. memcached's flusher moves values to the file in the
/// background; a writer that outruns it has items evicted from memory instead (a cache, not
/// a store), so every value missing must be one memcached counted as evicted. Returns
/// memcached's stats after the reads.
fn written_past_memory_and_read_back(ip: Ipv4Addr) -> HashMap<String, String> {
    let count = 2 * MEMORY_MIB as usize * MIB as usize / VALUE;
    let mut c = plain(ip);
    let mut evictions = 0;
    for batch in (0..count).collect::<Vec<_>>().chunks(64) {
        let items: Vec<(String, Vec<u8>)> = batch
            .iter()
            .map(|&i| (format!("ext:{i}"), big_value(i, VALUE)))
            .collect();
        c.try_set_many(&items)
            .unwrap_or_else(|e| panic!("memcached at {ip}: {e}"));
        // Paced as a client that backs off: once memcached has evicted, the next batch
        // waits (a second at most) for its flusher to write more to the file.
        let stats = c.stats("");
        if stat(&stats, "evictions") > evictions {
            evictions = stat(&stats, "evictions");
            let written = stat(&stats, "extstore_bytes_written");
            let until = Instant::now() + Duration::from_secs(1);
            while stat(&c.stats(""), "extstore_bytes_written") == written && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let before = c.stats("");
    let (mut misses, mut wrong) = (0, 0);
    for i in 0..count {
        match c.get_bytes(&format!("ext:{i}")) {
            None => misses += 1,
            Some(v) if v != big_value(i, VALUE) => wrong += 1,
            Some(_) => {}
        }
    }
    let after = c.stats("");
    let from_disk = stat(&after, "get_extstore") - stat(&before, "get_extstore");
    println!(
        "{count} values of {VALUE} bytes written to a pool of {MEMORY_MIB} MiB: {from_disk} read \
         back from extstore, {misses} missing, {wrong} wrong; extstore_objects_written {}, \
         extstore_bytes_written {}, evictions {}, slab_reassign_evictions_nomem {}",
        stat(&after, "extstore_objects_written"),
        stat(&after, "extstore_bytes_written"),
        stat(&after, "evictions"),
        stat(&after, "slab_reassign_evictions_nomem"),
    );
    assert_eq!(wrong, 0, "of {count} values read back, {wrong} differ");
    assert!(
        stat(&after, "extstore_objects_written") > 0,
        "nothing was written to extstore: {after:?}"
    );
    assert!(from_disk > 0, "no value was read from the file: {after:?}");
    let hits = (count - misses) as u64;
    assert!(
        hits * VALUE as u64 > MEMORY_MIB as u64 * MIB,
        "more than the memory's worth of values is read back: {hits} of {count} were \
         ({after:?})"
    );
    assert_eq!(
        misses as u64,
        stat(&after, "slab_reassign_evictions_nomem") + stat(&after, "evictions"),
        "every missing value was dropped by memcached itself: {after:?}"
    );
    after
}

/// Writes values of [`VALUE`] bytes (`fill:N`) to memcached over `c` until its own stats
/// say every page of its extstore file was written and then recycled (page evictions and
/// reclaims at least the page count): the file is then at its full size. How fast does not
/// matter: values the flusher did not keep up with are evicted from memory, and writing
/// goes on. `sample` runs after every batch. Returns the last stats and how many values
/// were written; an error of the connection ends it.
fn try_fill_until_full(
    c: &mut Text<TcpStream>,
    mut sample: impl FnMut(),
) -> std::io::Result<(HashMap<String, String>, usize)> {
    let mut written = 0u64;
    for batch in 0usize.. {
        let items: Vec<(String, Vec<u8>)> = (0..64)
            .map(|j| {
                let i = batch * 64 + j;
                (format!("fill:{i}"), big_value(i, VALUE))
            })
            .collect();
        c.try_set_many(&items)?;
        sample();
        written += (64 * VALUE) as u64;
        let stats = c.try_stats("")?;
        let pages = stat(&stats, "extstore_pages_free") + stat(&stats, "extstore_pages_used");
        let recycled =
            stat(&stats, "extstore_page_evictions") + stat(&stats, "extstore_page_reclaims");
        if pages > 0 && recycled >= pages {
            return Ok((stats, (batch + 1) * 64));
        }
        // Not a timing assertion: a bound on the work, far above the few passes over the
        // file this takes, so that a memcached that never fills its file fails the test.
        assert!(
            written < 50 * stat(&stats, "extstore_limit_maxbytes").max(MIB),
            "{} MiB written and extstore is still not full: {stats:?}",
            written / MIB
        );
    }
    unreachable!("the loop returns or fails")
}

/// [`try_fill_until_full`] on a pod that must stay up; then the last values written are
/// read back, intact.
fn fill_until_full(ip: Ipv4Addr, sample: impl FnMut()) -> HashMap<String, String> {
    let mut c = plain(ip);
    let (stats, count) =
        try_fill_until_full(&mut c, sample).unwrap_or_else(|e| panic!("memcached at {ip}: {e}"));
    for i in count - 64..count {
        assert_eq!(
            c.get_bytes(&format!("fill:{i}")),
            Some(big_value(i, VALUE)),
            "fill:{i}, among the last written, is read back after the file filled"
        );
    }
    println!(
        "filled: {} MiB in {count} values; extstore_pages_used {}, extstore_page_evictions {}, \
         extstore_page_reclaims {}, extstore_limit_maxbytes {}",
        count * VALUE / MIB as usize,
        stat(&stats, "extstore_pages_used"),
        stat(&stats, "extstore_page_evictions"),
        stat(&stats, "extstore_page_reclaims"),
        stat(&stats, "extstore_limit_maxbytes"),
    );
    stats
}

/// The pool's only pod (it is Ready: [`Env::ready_pool`]).
async fn only_pod(env: &Env, name: &str) -> (Pod, Ipv4Addr) {
    let pool = env.ready_pool(name, 1).await;
    let (pod, ip) = pool.into_iter().next().expect("one pod");
    let pods: Api<Pod> = env.api();
    (pods.get(&pod).await.unwrap(), ip)
}

/// The kubelet's measure of volume `volume` of pod `pod` in its stats summary (what its
/// eviction manager compares with an `emptyDir`'s `sizeLimit`), through the API server's
/// node proxy.
async fn kubelet_volume_used(env: &Env, pod: &str, volume: &str) -> Option<u64> {
    let request = http::Request::get(format!(
        "/api/v1/nodes/{}/proxy/stats/summary",
        env.node.name
    ))
    .body(Vec::new())
    .ok()?;
    let summary: serde_json::Value = env.client.request(request).await.ok()?;
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == pod && p["podRef"]["namespace"] == env.ns.as_str())?
        ["volume"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == volume)?["usedBytes"]
        .as_u64()
}

/// Waits until the kubelet's stats summary measures at least `bytes` in `pod`'s volume
/// `volume`; returns its measure. Fails at once if the kubelet evicts the pod instead.
async fn kubelet_measured(env: &Env, pod: &str, volume: &str, bytes: u64) -> u64 {
    poll(
        &format!("the kubelet measuring {bytes} bytes or more in {pod}'s volume {volume}"),
        KUBELET_SEES,
        || async {
            let evictions = evicted(env, pod).await.unwrap_or_default();
            assert!(
                evictions.is_empty(),
                "the kubelet evicted {pod}: {evictions:?}"
            );
            kubelet_volume_used(env, pod, volume)
                .await
                .filter(|used| *used >= bytes)
        },
    )
    .await
}

/// The messages of the `Evicted` events the kubelet recorded for pod `pod`; `None` when the
/// events cannot be listed.
async fn evicted(env: &Env, pod: &str) -> Option<Vec<String>> {
    let events: Api<Event> = env.api();
    let selector = format!("involvedObject.kind=Pod,involvedObject.name={pod},reason=Evicted");
    let list = events
        .list(&ListParams::default().fields(&selector))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .map(|e| e.message.unwrap_or_default())
            .collect(),
    )
}

/// Asserts that the pod is the one that ran before (same UID), Running, not evicted and
/// not being deleted, and that none of its containers restarted.
async fn assert_still_running(env: &Env, before: &Pod) {
    let pods: Api<Pod> = env.api();
    let name = before.name_any();
    let now = pods.get(&name).await.unwrap();
    let status = now.status.clone().unwrap_or_default();
    assert_eq!(now.uid(), before.uid(), "{name} is the same pod");
    assert!(
        now.metadata.deletion_timestamp.is_none(),
        "{name} is being deleted"
    );
    assert_eq!(
        (status.phase.as_deref(), status.reason.as_deref()),
        (Some("Running"), None),
        "{name}: {:?}",
        status.message
    );
    let restarts: Vec<_> = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .map(|c| (name.clone(), c.name, c.restart_count))
        .collect();
    assert_no_restarts(&restarts, 1);
}

// ---------------------------------------------------------------------------------------
// 1. extstore on an emptyDir

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extstore_on_an_empty_dir_newest() {
    extstore_on_an_empty_dir(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extstore_on_an_empty_dir_oldest() {
    extstore_on_an_empty_dir(Kube::Oldest).await;
}

async fn extstore_on_an_empty_dir(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let env = Env::start(kube, "ext-dir").await;
    let memcacheds: Api<Memcached> = env.api();
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new("ext", extstore_pool(&env, None)),
        )
        .await
        .unwrap();
    let (pod, ip) = only_pod(&env, "ext").await;
    let name = pod.name_any();
    let limit = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == "extstore")
        .and_then(|v| v.empty_dir.as_ref()?.size_limit.clone())
        .expect("the extstore emptyDir has a sizeLimit");

    blocking(|| written_past_memory_and_read_back(ip));

    // The volume as the kubelet made it, in its root directory on the host.
    let volume = env.node.dirs[0]
        .join("kubelet/pods")
        .join(pod.uid().expect("a UID"))
        .join("volumes/kubernetes.io~empty-dir/extstore");
    let mut peak = 0;
    let stats = blocking(|| fill_until_full(ip, || peak = peak.max(volume_bytes(&volume))));
    let file = volume.join("data");
    let len = std::fs::metadata(&file)
        .unwrap_or_else(|e| panic!("the extstore file in the emptyDir, {}: {e}", file.display()))
        .len();
    assert_eq!(
        len,
        stat(&stats, "extstore_limit_maxbytes"),
        "the file in the emptyDir ({}) is memcached's, at its full size",
        file.display()
    );
    peak = peak.max(volume_bytes(&volume));

    // The kubelet measures the full file; its eviction manager compares that with the
    // operator's sizeLimit every 10 s.
    let measured = kubelet_measured(&env, &name, "extstore", len).await;
    println!(
        "{kube:?}: the file {len} bytes, the volume at most {peak} bytes on the host, the \
         kubelet measures {measured}; sizeLimit {}",
        limit.0
    );

    // A pod of the pool's own template whose limit is below the file: the same kubelet
    // evicts it once it measures its full file, in a pass that also sees the pool's.
    let deployments: Api<Deployment> = env.api();
    let pods: Api<Pod> = env.api();
    let mut spec = deployments
        .get("ext")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.template.spec)
        .expect("the Deployment's pod template");
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(dir) = v.empty_dir.as_mut().filter(|_| v.name == "extstore") {
            dir.size_limit = Some(Quantity(format!("{}Mi", len / MIB / 2)));
        }
    }
    let over = Pod {
        metadata: ObjectMeta {
            name: Some("over-its-limit".into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &over).await.unwrap();
    let over_ip: Ipv4Addr = poll("over-its-limit Ready with an IP", CONVERGE, || async {
        let p = pods.get("over-its-limit").await.ok()?;
        let status = p.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())?;
        status.pod_ip?.parse().ok()
    })
    .await;
    // It may be evicted while it is filled: the connection's end is expected then.
    let filled = blocking(|| {
        let mut c = Text(std::io::BufReader::new(try_connect(over_ip)?));
        try_fill_until_full(&mut c, || {})
    });
    // The kubelet's record of it: an `Evicted` event naming the volume and its limit. (The
    // pod's own status need not say so: memcached exits 0 on the kubelet's SIGTERM, and
    // the kubelet of v1.37.2 reported such a pod `Succeeded`, without the reason `Evicted`.)
    let message = poll(
        "the kubelet evicting over-its-limit (an Evicted event)",
        KUBELET_SEES,
        || async { evicted(&env, "over-its-limit").await?.into_iter().next() },
    )
    .await;
    println!(
        "{kube:?}: over-its-limit evicted ({message}); its fill ended with {:?}",
        filled.map(|(_, n)| n)
    );
    assert!(
        message.contains("EmptyDir volume \"extstore\" exceeds the limit"),
        "evicted for its extstore emptyDir: {message}"
    );
    poll("over-its-limit stopped", CONVERGE, || async {
        let phase = pods.get("over-its-limit").await.ok()?.status?.phase?;
        (phase == "Succeeded" || phase == "Failed").then_some(())
    })
    .await;

    // The pool's pod, whose full volume the kubelet measured before that pass: still the
    // same pod, running, never restarted, serving what it holds.
    assert_still_running(&env, &pod).await;
    assert_eq!(
        evicted(&env, &name).await,
        Some(Vec::new()),
        "the kubelet evicted the pool's pod"
    );
    let now = kubelet_volume_used(&env, &name, "extstore").await;
    assert!(
        now.is_some_and(|used| used >= len),
        "the kubelet still measures the pool's full file ({len} bytes): {now:?}"
    );
    let still = only_pod(&env, "ext").await;
    assert_eq!(still.1, ip, "the same pod at the same address");
    blocking(|| {
        let mut c = plain(ip);
        let count = stat(&c.stats(""), "curr_items");
        assert!(count > 0, "the pool still holds its items");
    });
    println!(
        "{kube:?}: extstore on an emptyDir in {:?}",
        started.elapsed()
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 2. extstore on a generic ephemeral volume

/// There is no CSI driver on the real node. As users of local volumes do, the test makes a
/// StorageClass with no provisioner that binds when a pod is scheduled
/// (`WaitForFirstConsumer`) and `local` PersistentVolumes on directories of the node (here
/// under a temporary directory of the host), pinned to it by node affinity: the ephemeral
/// volume controller makes the pod's claim, the scheduler picks a PV on the pod's node, the
/// PV controller binds it, and the kubelet mounts it (and gives it the pod's `fsGroup`).
/// Returns the PVs' names and directories.
async fn local_volumes(
    env: &Env,
    class: &str,
    dir: &TempDir,
    count: usize,
) -> BTreeMap<String, PathBuf> {
    let classes: Api<StorageClass> = Api::all(env.client.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .unwrap();
    classes.create(&PostParams::default(), &sc).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let mut made = BTreeMap::new();
    for i in 0..count {
        let name = format!("{class}-{i}");
        let path = dir.path().join(&name);
        std::fs::create_dir_all(&path).unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "local": {"path": path.display().to_string()},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In",
                     "values": [env.node.name]}]}]}},
            },
        }))
        .unwrap();
        pvs.create(&PostParams::default(), &pv).await.unwrap();
        made.insert(name, path);
    }
    made
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extstore_on_a_generic_ephemeral_volume_newest() {
    extstore_on_a_generic_ephemeral_volume(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extstore_on_a_generic_ephemeral_volume_oldest() {
    extstore_on_a_generic_ephemeral_volume(Kube::Oldest).await;
}

async fn extstore_on_a_generic_ephemeral_volume(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let env = Env::start(kube, "ext-pvc").await;
    let dir = TempDir::new("local-pv");
    let class = format!("local-{}", env.ns);
    let volumes = local_volumes(&env, &class, &dir, 2).await;
    let memcacheds: Api<Memcached> = env.api();
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new("ext", extstore_pool(&env, Some(&class))),
        )
        .await
        .unwrap();
    let (pod, ip) = only_pod(&env, "ext").await;
    let name = pod.name_any();

    // The claim the ephemeral volume controller made for the pod (`POD-VOLUME`), owned by
    // the pod, bound to one of the local PVs.
    let claims: Api<PersistentVolumeClaim> = env.api();
    let claim_name = format!("{name}-extstore");
    let claim = claims.get(&claim_name).await.unwrap();
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.kind == "Pod" && o.name == name && o.controller == Some(true)),
        "{claim_name} is owned by its pod: {:?}",
        claim.owner_references()
    );
    assert_eq!(
        claim.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Bound")
    );
    let pv = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .expect("the claim names its PV");
    let volume = volumes
        .get(&pv)
        .unwrap_or_else(|| panic!("{claim_name} is bound to {pv}, not a local PV of the test"))
        .clone();

    blocking(|| written_past_memory_and_read_back(ip));
    let stats = blocking(|| fill_until_full(ip, || {}));
    let file = volume.join("data");
    let meta = std::fs::metadata(&file)
        .unwrap_or_else(|e| panic!("the extstore file in {pv}'s directory: {e}"));
    assert_eq!(
        meta.len(),
        stat(&stats, "extstore_limit_maxbytes"),
        "the file in {pv}'s directory ({}) is memcached's, at its full size",
        file.display()
    );
    assert_eq!(meta.uid(), 11211, "memcached's user (11211) wrote it");
    // The test made the directory root's, 0755: memcached could write in it because the
    // kubelet gave it the pod's fsGroup.
    let dir_meta = std::fs::metadata(&volume).unwrap();
    assert_eq!(
        (dir_meta.gid(), dir_meta.mode() & 0o070),
        (11211, 0o070),
        "{pv}'s directory belongs to the pod's fsGroup (11211), which may write in it"
    );
    println!(
        "{kube:?}: the file {} bytes in {pv}'s directory; the volume {} bytes",
        meta.len(),
        volume_bytes(&volume)
    );
    assert_still_running(&env, &pod).await;

    // Deleting the pool deletes its pod, and with it the claim; the PV is released.
    memcacheds
        .delete("ext", &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    poll(
        &format!("{claim_name} deleted with its pod, {pv} released"),
        CONVERGE,
        || async {
            let gone = claims.get_opt(&claim_name).await.ok()?.is_none();
            let phase = pvs.get(&pv).await.ok()?.status?.phase?;
            (gone && phase == "Released").then_some(())
        },
    )
    .await;
    println!(
        "{kube:?}: extstore on a generic ephemeral volume in {:?}",
        started.elapsed()
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 3. kubectl drain and the PodDisruptionBudget

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_honours_the_pod_disruption_budget_newest() {
    drain_honours_the_pod_disruption_budget(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_honours_the_pod_disruption_budget_oldest() {
    drain_honours_the_pod_disruption_budget(Kube::Oldest).await;
}

async fn drain_honours_the_pod_disruption_budget(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    // The real node is the cluster's only node: an evicted pod's replacement has nowhere
    // to go while it is cordoned.
    let env = Env::alone(kube, "drain").await;
    let memcacheds: Api<Memcached> = env.api();
    let pods: Api<Pod> = env.api();
    let mut spec = MemcachedSpec {
        rollout: Some(RolloutSpec {
            min_ready_seconds: 0,
            ..Default::default()
        }),
        ..MemcachedSpec::with_size(2)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(&PostParams::default(), &Memcached::new("drained", spec))
        .await
        .unwrap();
    let pool = env.ready_pool("drained", 2).await;
    for (pod, ip) in &pool {
        blocking(|| plain(*ip).set("owner", pod));
    }
    // The operator's budget as the disruption controller counts it: both pods healthy.
    let pdbs: Api<PodDisruptionBudget> = env.api();
    let allowed = poll(
        "the PodDisruptionBudget counting 2 healthy pods of 2",
        CONVERGE,
        || async {
            let status = pdbs.get("drained").await.ok()?.status?;
            (status.current_healthy == 2 && status.expected_pods == 2)
                .then_some(status.disruptions_allowed)
        },
    )
    .await;
    println!("{kube:?}: the budget allows {allowed} disruption(s)");

    let node = env.node.name.clone();
    let drain_started = Instant::now();
    let drain = blocking(|| {
        env.cp
            .kubectl()
            .args([
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=60s",
            ])
            .output()
            .expect("kubectl runs")
    });
    let (stdout, stderr) = (
        String::from_utf8_lossy(&drain.stdout),
        String::from_utf8_lossy(&drain.stderr),
    );
    println!(
        "{kube:?}: kubectl drain ended after {:?} ({}):\n{stdout}\n{stderr}",
        drain_started.elapsed(),
        drain.status
    );
    assert!(
        !drain.status.success(),
        "drain succeeded though the budget allows one pod of two to go"
    );
    assert!(
        stderr.contains("would violate the pod's disruption budget")
            && stderr.contains("global timeout reached"),
        "drain timed out on an eviction the API server refused for the budget: {stderr}"
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    let unschedulable = nodes
        .get(&node)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.unschedulable);
    assert_eq!(unschedulable, Some(true), "the node stays cordoned");

    // One pod evicted (gone), the other still serving what was set on it.
    let (kept, ip) = poll("one of the two pods gone", CONVERGE, || async {
        let mut left = Vec::new();
        for (pod, ip) in &pool {
            if let Some(p) = pods.get_opt(pod).await.ok()? {
                left.push((p, *ip));
            }
        }
        (left.len() == 1).then(|| left.remove(0))
    })
    .await;
    let kept_name = kept.name_any();
    assert!(
        stderr.contains(&format!("pods/\"{kept_name}\"")),
        "the refused eviction is the kept pod's: {stderr}"
    );
    assert_eq!(
        blocking(|| plain(ip).get("owner")).as_deref(),
        Some(kept_name.as_str()),
        "{kept_name} at {ip} keeps serving its value"
    );
    assert_still_running(&env, &kept).await;
    // The evicted pod's replacement waits: the scheduler finds no node for it.
    poll(
        "the replacement pod unschedulable while the node is cordoned",
        CONVERGE,
        || async {
            let list = pods
                .list(
                    &kube::api::ListParams::default().labels("app.kubernetes.io/instance=drained"),
                )
                .await
                .ok()?;
            list.items
                .iter()
                .filter(|p| p.name_any() != kept_name)
                .any(|p| {
                    p.status
                        .iter()
                        .flat_map(|s| s.conditions.iter().flatten())
                        .any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                })
                .then_some(())
        },
    )
    .await;
    // The status says so: one ready, the kept pod's endpoint alone.
    poll(
        "status: 1 ready replica, the kept pod's endpoint alone",
        CONVERGE,
        || async {
            let status = memcacheds.get("drained").await.ok()?.status?;
            (status.ready_replicas == 1 && status.endpoints == vec![format!("{ip}:11211")])
                .then_some(())
        },
    )
    .await;

    let uncordon = blocking(|| {
        env.cp
            .kubectl()
            .args(["uncordon", &node])
            .output()
            .expect("kubectl runs")
    });
    assert!(
        uncordon.status.success(),
        "kubectl uncordon: {}",
        String::from_utf8_lossy(&uncordon.stderr)
    );
    let after = env.ready_pool("drained", 2).await;
    assert_eq!(
        after.get(&kept_name),
        Some(&ip),
        "the kept pod stays: {after:?}"
    );
    let status = memcacheds
        .get("drained")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    let mut endpoints: Vec<String> = after.values().map(|ip| format!("{ip}:11211")).collect();
    endpoints.sort();
    let mut reported = status.endpoints.clone();
    reported.sort();
    assert_eq!(
        (status.ready_replicas, reported),
        (2, endpoints),
        "the status names both pods again"
    );
    for (pod, ip) in &after {
        blocking(|| {
            let mut c = plain(*ip);
            c.set("after", pod);
            assert_eq!(c.get("after").as_deref(), Some(pod.as_str()), "{pod}");
        });
    }
    assert_eq!(
        blocking(|| plain(ip).get("owner")).as_deref(),
        Some(kept_name.as_str()),
        "{kept_name} kept its value throughout"
    );
    println!("{kube:?}: drain and uncordon in {:?}", started.elapsed());
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// 4. gracefulShutdown: a deleted pod serves on, out of the endpoints

/// The pool's `spec.gracefulShutdown.preStopDelaySeconds`.
const PRE_STOP_DELAY: i32 = 20;

/// The conditions of the endpoint at `ip` in the EndpointSlices of the Service `service`:
/// `Some(None)` when they do not list it, `None` when they cannot be listed.
async fn endpoint_at(env: &Env, service: &str, ip: Ipv4Addr) -> Option<Option<EndpointConditions>> {
    let slices = env
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .ok()?;
    let ip = ip.to_string();
    Some(
        slices
            .items
            .into_iter()
            .flat_map(|s| s.endpoints)
            .find(|e| e.addresses.contains(&ip))
            .map(|e| e.conditions.unwrap_or_default()),
    )
}

/// `get key` on a new connection to memcached at `ip`.
fn get_anew(ip: Ipv4Addr, key: &str) -> std::io::Result<Option<String>> {
    Text(BufReader::new(try_connect(ip)?)).try_get(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_serves_out_of_the_endpoints_newest() {
    a_deleted_pod_serves_out_of_the_endpoints(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_serves_out_of_the_endpoints_oldest() {
    a_deleted_pod_serves_out_of_the_endpoints(Kube::Oldest).await;
}

/// The kubelet runs the pool's `preStop` sleep on a deleted pod: the pod leaves its
/// Service's endpoints (the EndpointSlice controller no longer counts it ready) while
/// memcached, not yet sent SIGTERM, still answers on the pod's IP; the Pod object lasts at
/// least the delay after its deletion.
async fn a_deleted_pod_serves_out_of_the_endpoints(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let env = Env::start(kube, "graceful").await;
    let memcacheds: Api<Memcached> = env.api();
    let pods: Api<Pod> = env.api();
    let mut spec = MemcachedSpec {
        graceful_shutdown: Some(GracefulShutdownSpec {
            pre_stop_delay_seconds: PRE_STOP_DELAY,
            termination_grace_period_seconds: None,
        }),
        rollout: Some(RolloutSpec {
            min_ready_seconds: 0,
            ..Default::default()
        }),
        ..MemcachedSpec::with_size(1)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(&PostParams::default(), &Memcached::new("graceful", spec))
        .await
        .expect("creating the pool");
    let (pod, ip) = only_pod(&env, "graceful").await;
    let name = pod.name_any();
    let pod_spec = pod.spec.clone().unwrap_or_default();
    let sleeps: Vec<(String, i64)> = pod_spec
        .containers
        .iter()
        .filter_map(|c| {
            let sleep = c.lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref()?;
            Some((c.name.clone(), sleep.seconds))
        })
        .collect();
    assert_eq!(
        (pod_spec.termination_grace_period_seconds, sleeps),
        (
            Some(i64::from(PRE_STOP_DELAY) + 30),
            vec![("memcached".to_string(), i64::from(PRE_STOP_DELAY))]
        ),
        "{name}: the grace period and memcached's preStop sleep"
    );
    blocking(|| plain(ip).set("owner", &name));
    poll(
        &format!("the EndpointSlices of graceful listing {name} ({ip}) ready"),
        CONVERGE,
        || async {
            let conditions = endpoint_at(&env, "graceful", ip).await??;
            (conditions.ready == Some(true)).then_some(())
        },
    )
    .await;

    // Deleted with the pod's own grace period, as a rollout, a drain or a user would.
    let deleting = Instant::now();
    pods.delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the pod");
    let (out_after, conditions) = poll(
        &format!("{name} ({ip}) no longer ready in the EndpointSlices of graceful"),
        CONVERGE,
        || async {
            let conditions = endpoint_at(&env, "graceful", ip).await?;
            if conditions.as_ref().is_some_and(|c| c.ready == Some(true)) {
                return None;
            }
            let out_after = deleting.elapsed();
            let now = pods
                .get_opt(&name)
                .await
                .ok()?
                .unwrap_or_else(|| panic!("{name} was gone when it left the endpoints"));
            assert!(
                now.uid() == pod.uid() && now.metadata.deletion_timestamp.is_some(),
                "{name} is the deleted pod, being deleted: {:?}",
                now.metadata
            );
            Some((out_after, conditions))
        },
    )
    .await;
    // At that moment memcached, whose SIGTERM waits for the sleep, still answers.
    let answer = blocking(|| get_anew(ip, "owner"));
    println!(
        "{kube:?}: {name} out of the endpoints {out_after:?} after its deletion ({conditions:?}); \
         memcached at {ip} then answered {answer:?} ({:?} after the deletion)",
        deleting.elapsed()
    );
    match answer {
        Ok(Some(value)) => assert_eq!(value, name, "the value set on {name}"),
        other => panic!(
            "memcached at {ip} answers while {name} is out of the endpoints and being deleted: \
             {other:?}"
        ),
    }

    // Until the Pod object is gone: memcached answers through the sleep, then stops.
    let deadline = Instant::now() + CONVERGE;
    let mut answered_until = deleting.elapsed();
    let mut stopped = None;
    let gone_after = loop {
        let now = pods.get_opt(&name).await.expect("reading the pod");
        if now.is_none() {
            break deleting.elapsed();
        }
        if stopped.is_none() {
            let probe = deleting.elapsed();
            match blocking(|| get_anew(ip, "owner")) {
                Ok(Some(value)) if value == name => answered_until = deleting.elapsed(),
                other => stopped = Some((probe, other)),
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} still there {CONVERGE:?} after its deletion"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "{kube:?}: memcached at {ip} answered until {answered_until:?} after the deletion, then \
         {stopped:?}; {name} gone {gone_after:?} after it"
    );
    // Lower bounds the sleep guarantees, counted from before the delete request: the
    // kubelet sends SIGTERM only after it, so every probe started within the delay (less a
    // margin for the probe itself) was answered, and the Pod was gone only after it.
    let delay = Duration::from_secs(PRE_STOP_DELAY as u64);
    if let Some((probe, failure)) = &stopped {
        assert!(
            *probe + Duration::from_secs(2) >= delay,
            "memcached at {ip} stopped answering {probe:?} after {name}'s deletion, within \
             its preStop sleep of {PRE_STOP_DELAY} s: {failure:?}"
        );
    }
    assert!(
        gone_after >= delay,
        "{name} lasted {gone_after:?} after its deletion, less than its preStop sleep of \
         {PRE_STOP_DELAY} s"
    );
    println!(
        "{kube:?}: a deleted pod serving out of the endpoints in {:?}",
        started.elapsed()
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// The flush on demand.

/// Seconds between two pods flushed.
const FLUSH_PAUSE: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_flush_empties_each_pod_in_turn_newest() {
    a_paced_flush_empties_each_pod_in_turn(Kube::Newest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_flush_empties_each_pod_in_turn_oldest() {
    a_paced_flush_empties_each_pod_in_turn(Kube::Oldest).await;
}

/// `spec.flush`: each pod's memcached loses what it held, one pod after the other by name
/// with at least the pause between two, each receiving exactly one `flush_all` (memcached's
/// own `cmd_flush`), what is written after its turn kept; no pod restarted or replaced;
/// `status.flush` lists them and says when it was done. A later change of the spec, the
/// request unchanged, flushes nothing.
async fn a_paced_flush_empties_each_pod_in_turn(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = Env::start(kube, "flush").await;
    let memcacheds: Api<Memcached> = env.api();
    let pods: Api<Pod> = env.api();
    let mut spec = MemcachedSpec {
        rollout: Some(RolloutSpec {
            min_ready_seconds: 0,
            ..Default::default()
        }),
        ..MemcachedSpec::with_size(3)
    };
    env.on_the_real_node(&mut spec);
    memcacheds
        .create(
            &PostParams::default(),
            &Memcached::new("flushed", spec.clone()),
        )
        .await
        .expect("creating the pool");
    let pool = env.ready_pool("flushed", 3).await;
    let mut uids = BTreeMap::new();
    for (name, ip) in &pool {
        blocking(|| plain(*ip).set("poisoned", name));
        uids.insert(name.clone(), pods.get(name).await.expect("pod").uid());
    }

    spec.flush = Some(memcached_api::FlushSpec {
        requested_at: "2026-11-27T19:00:00Z".into(),
        pause_seconds: FLUSH_PAUSE,
    });
    let requested = Instant::now();
    memcacheds
        .replace("flushed", &PostParams::default(), &{
            let mut mc = memcacheds.get("flushed").await.expect("the pool");
            mc.spec = spec.clone();
            mc
        })
        .await
        .expect("requesting the flush");
    // When each pod's value went; a value written on a pod once its turn is over stays.
    let seen = std::sync::Mutex::new(BTreeMap::<String, Duration>::new());
    let status = poll("the flush done in status.flush", CONVERGE, || async {
        for (name, ip) in &pool {
            if seen.lock().ok()?.contains_key(name) {
                continue;
            }
            if blocking(|| get_anew(*ip, "poisoned")).ok()?.is_none() {
                seen.lock().ok()?.insert(name.clone(), requested.elapsed());
                blocking(|| plain(*ip).set("after", name));
            }
        }
        let flush = memcacheds.get("flushed").await.ok()?.status?.flush?;
        let all = seen.lock().ok()?.len() == pool.len();
        (flush.completion_time.is_some() && all).then_some(flush)
    })
    .await;
    let emptied = seen.into_inner().expect("the times");
    println!("{kube:?}: emptied {emptied:?}; status.flush {status:?}");
    let names: Vec<String> = pool.keys().cloned().collect();
    assert_eq!(status.flushed, names, "every pod, by name");
    let mut order: Vec<(&Duration, &String)> = emptied.iter().map(|(n, t)| (t, n)).collect();
    order.sort();
    assert_eq!(
        order.iter().map(|(_, n)| (*n).clone()).collect::<Vec<_>>(),
        names,
        "emptied in the order of their names: {emptied:?}"
    );
    // Polled every few hundred milliseconds: a gap is seen at most that much short.
    for pair in order.windows(2) {
        let gap = pair[1].0.saturating_sub(*pair[0].0);
        assert!(
            gap + Duration::from_secs(1) >= Duration::from_secs(FLUSH_PAUSE as u64),
            "at least the pause between {} and {}: {emptied:?}",
            pair[0].1,
            pair[1].1
        );
    }
    for (name, ip) in &pool {
        let stats = blocking(|| plain(*ip).stats(""));
        assert_eq!(stat(&stats, "cmd_flush"), 1, "{name}: one flush_all");
        assert_eq!(
            blocking(|| get_anew(*ip, "after")).expect("get"),
            Some(name.clone()),
            "{name}: what was written after its turn stays"
        );
        assert_eq!(
            pods.get(name).await.expect("pod").uid(),
            uids[name],
            "{name} is the same pod"
        );
    }
    assert_no_restarts(&env.restarts("flushed").await, 3);

    // Any other change leaves the flush done: nothing flushed again.
    let mut mc = memcacheds.get("flushed").await.expect("the pool");
    mc.spec.rollout = Some(RolloutSpec {
        min_ready_seconds: 1,
        ..Default::default()
    });
    let generation = memcacheds
        .replace("flushed", &PostParams::default(), &mc)
        .await
        .expect("another change")
        .metadata
        .generation;
    poll("the change reconciled", CONVERGE, || async {
        let status = memcacheds.get("flushed").await.ok()?.status?;
        (status.observed_generation == generation).then_some(())
    })
    .await;
    for (name, ip) in &pool {
        let stats = blocking(|| plain(*ip).stats(""));
        assert_eq!(stat(&stats, "cmd_flush"), 1, "{name}: still one flush_all");
    }
    env.stop().await;
}
