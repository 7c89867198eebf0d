//! The proxy on a real node, on each pinned version: the operator (in-process, scoped to its
//! namespace) runs a Memcached with `spec.proxy` on envtest's real node (containerd, runc,
//! the pinned kubelet and kube-proxy; memcached 1.6.38 built with its proxy, `make node`).
//!
//! - Keys set through the Service `NAME-proxy`, on its ClusterIP from the host (kube-proxy
//!   picks a proxy pod per connection), are each on exactly one of the pool's pods (read on
//!   each pod's IP), spread over all of them, and read back through the Service.
//! - The scale-up (3 → 4) is measured: from the moment the operator's write of the new
//!   ConfigMap `NAME-proxy` is seen, until each proxy pod routes keys to the new pod
//!   (keys set on that proxy's own pod IP land on the new pod). The ConfigMap reaches the
//!   pods through the kubelet's own propagation (its defaults: the pod resync every 60 s
//!   with jitter, the ConfigMap watched), then the proxy's own check of its file (every
//!   second). Every measured time must be within `PROPAGATION_WINDOW`, the time the
//!   operator reports `ProxyReady=False` (`Propagating`) for after a change, so that
//!   `ProxyReady=True` means what it says. Each time is printed (`PROPAGATION ...`).
//! - A pod replaced (deleted, as an eviction would) warms up (`spec.proxy.warmUp`, the
//!   patched memcached of `make memcached-proxy`): measured the same way, until a key of
//!   its slot read through each proxy pod is written back to the replacement; then every
//!   key of the slot reads back through the Service (where without warm-up each would
//!   miss) and the replacement holds them all, while the replaced pod still stops.
//! - When the control plane stops, nothing of the node is left on the host.
//!
//! Runs as root, one real node at a time (envtest's host lock).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube, Options, REAL_NODE_KEY, leftovers};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt};
use memcached_api::{Memcached, ProxyBackend};
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::proxy::{self, PROPAGATION_WINDOW};
use serde_json::json;

mod common;
use common::cluster::apply_crd;
use common::wait_for_within;

/// Pods scheduled, started and Ready on the loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(240);
/// How long a proxy may take to route to a new pod before the test gives up measuring: far
/// past the window, so that a slow propagation is measured, not cut off.
const MEASURE_LIMIT: Duration = Duration::from_secs(400);
const NAME: &str = "cache";
const PORT: u16 = 11211;
/// The sizes the pool is grown through, one measurement per step and proxy pod (one step,
/// and the replacement after it: each waits up to the kubelet's ~90 s propagation, and the
/// suite's time counts in CI).
const SIZES: [i32; 2] = [3, 4];
/// The replaced pod's `preStop` delay: it serves this long after its deletion, through the
/// replacement's start and the proxies' loading of the warm-up.
const STOPPING_SECONDS: i32 = 170;

/// One real node per test binary at a time (the host allows one).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn try_request(addr: SocketAddr, request: &str) -> std::io::Result<Vec<String>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request.as_bytes())?;
    let mut lines = Vec::new();
    for line in BufReader::new(s).lines() {
        let line = line?;
        let last = line == "END" || line.starts_with("SERVER_ERROR") || line == "ERROR";
        lines.push(line);
        if last {
            break;
        }
    }
    Ok(lines)
}

/// `set`s every key (value: the key) on one connection to `addr`; returns the answers.
fn set_keys(addr: SocketAddr, keys: &[String]) -> std::io::Result<Vec<String>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = String::new();
    for k in keys {
        req.push_str(&format!("set {k} 0 0 {}\r\n{k}\r\n", k.len()));
    }
    s.write_all(req.as_bytes())?;
    BufReader::new(s).lines().take(keys.len()).collect()
}

/// The keys of `keys` that `addr` holds (one multi-get per 50 keys).
fn held(addr: SocketAddr, keys: &[String]) -> std::io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for chunk in keys.chunks(50) {
        let lines = try_request(addr, &format!("get {}\r\n", chunk.join(" ")))?;
        for l in lines {
            if let Some(rest) = l.strip_prefix("VALUE ")
                && let Some(k) = rest.split(' ').next()
            {
                out.insert(k.to_string());
            }
        }
    }
    Ok(out)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

fn addr_of(backend: &ProxyBackend) -> SocketAddr {
    backend
        .address
        .parse()
        .unwrap_or_else(|e| panic!("backend address {}: {e}", backend.address))
}

/// The backends of the ConfigMap's `backends.json` (vacant slots included).
fn config_backends(cm: &ConfigMap) -> Vec<ProxyBackend> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(proxy::BACKENDS_KEY))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

fn config_version(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get(proxy::CONFIG_KEY))
        .and_then(|t| t.lines().next())
        .unwrap_or_default()
        .to_string()
}

/// Every version of the ConfigMap the operator wrote, with when this test saw it.
type Writes = Arc<Mutex<Vec<(Instant, String, Vec<ProxyBackend>)>>>;

fn record_writes(client: Client, ns: &str) -> (Writes, tokio::task::JoinHandle<()>) {
    let writes: Writes = Arc::default();
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let cfg =
        watcher::Config::default().fields(&format!("metadata.name={}", proxy::proxy_name(NAME)));
    let w = writes.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, cfg).boxed();
        while let Some(e) = events.next().await {
            let cm = match e {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => cm,
                _ => continue,
            };
            let version = config_version(&cm);
            let mut w = w.lock().unwrap();
            if w.last().is_none_or(|(_, v, _)| *v != version) {
                w.push((Instant::now(), version, config_backends(&cm)));
            }
        }
    });
    (writes, task)
}

async fn ready_proxy_pods(pods: &Api<Pod>) -> Vec<(String, SocketAddr)> {
    let selector = proxy::proxy_selector_labels(NAME)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip: Ipv4Addr = status.pod_ip?.parse().ok()?;
            let name = p.metadata.name?;
            ready.then(|| (name, SocketAddr::from((ip, PORT))))
        })
        .collect()
}

/// The first ring the operator wrote (after the `skip` first writes) from which `pick`
/// takes a backend: when this test saw it, and that backend.
async fn first_written(
    writes: &Writes,
    skip: usize,
    what: &str,
    pick: impl Fn(&[ProxyBackend]) -> Option<ProxyBackend>,
) -> (Instant, ProxyBackend) {
    wait_for_within(&format!("the operator writes {what}"), CONVERGE, || async {
        let w = writes.lock().unwrap();
        w.iter()
            .skip(skip)
            .find_map(|(at, _, backends)| Some((*at, pick(backends)?)))
    })
    .await
}

/// The first ring with `size` pods: when this test saw it, and the pod of its last slot.
async fn ring_written(writes: &Writes, skip: usize, size: i32) -> (Instant, ProxyBackend) {
    first_written(writes, skip, &format!("a ring of {size}"), |backends| {
        let live: Vec<&ProxyBackend> = backends.iter().filter(|b| !b.is_vacant()).collect();
        let last = live.iter().max_by_key(|b| b.slot)?;
        (live.len() == size as usize).then(|| (*last).clone())
    })
    .await
}

/// The first ring with another pod in `replaced`'s slot, warming up from it: when this test
/// saw it, and that pod.
async fn warm_ring_written(
    writes: &Writes,
    skip: usize,
    replaced: &str,
) -> (Instant, ProxyBackend) {
    let what = format!("a ring warming up from {replaced}");
    first_written(writes, skip, &what, |backends| {
        backends
            .iter()
            .find(|b| {
                !b.is_vacant()
                    && b.pod != replaced
                    && b.warm_from.as_ref().is_some_and(|f| f.pod == replaced)
            })
            .cloned()
    })
    .await
}

/// Reads a key of the warming slot (`slot_keys`, one per proxy pod) through each proxy pod
/// (on its pod IP) until the proxy has written it back to `successor`, so it reads the
/// slot from the replacement and its misses from the replaced pod; how long after
/// `written_at` each did.
async fn until_warmed(
    proxies: Vec<(String, SocketAddr)>,
    successor: &ProxyBackend,
    slot_keys: &[String],
    written_at: Instant,
    version: &envtest::Version,
) -> Vec<Measured> {
    let successor_addr = addr_of(successor);
    let mut measured = Vec::new();
    let mut probe = 0u32;
    let mut pending: Vec<(String, SocketAddr, String)> = proxies
        .into_iter()
        .zip(slot_keys)
        .map(|((name, addr), key)| (name, addr, key.clone()))
        .collect();
    // Bounded by the caller (the replaced pod's life).
    while !pending.is_empty() {
        let mut still = Vec::new();
        probe += 1;
        for (name, addr, key) in pending {
            let k = vec![key.clone()];
            let read = blocking(move || held(addr, &k)).await;
            let k = vec![key.clone()];
            let landed = blocking(move || held(successor_addr, &k)).await;
            if probe.is_multiple_of(20) {
                eprintln!(
                    "WARM-PROBE {:.0} s: {key} through {name}: {read:?}, on the replacement: {landed:?}",
                    written_at.elapsed().as_secs_f64()
                );
            }
            match (read, landed) {
                (Ok(read), Ok(landed)) if !landed.is_empty() => {
                    assert_eq!(read.len(), 1, "{key} hit through {name}");
                    let seconds = written_at.elapsed().as_secs_f64();
                    eprintln!(
                        "PROPAGATION kube={version} step=warm-up proxy={name} seconds={seconds:.1}"
                    );
                    measured.push(Measured {
                        step: "warm-up".to_string(),
                        proxy: name,
                        seconds,
                    });
                }
                _ => still.push((name, addr, key)),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    measured
}

/// Probes each proxy pod (on its pod IP) until keys set through it land on `new_pod`; how
/// long after `written_at` each did.
async fn until_routed(
    proxies: Vec<(String, SocketAddr)>,
    new_pod: &ProxyBackend,
    written_at: Instant,
    step: &str,
    version: &envtest::Version,
) -> Vec<Measured> {
    let new_addr = addr_of(new_pod);
    let mut measured = Vec::new();
    let mut pending = proxies;
    let mut probe = 0u32;
    while !pending.is_empty() {
        assert!(
            written_at.elapsed() < MEASURE_LIMIT,
            "proxies {pending:?} did not route to the new pod {} within {MEASURE_LIMIT:?} of \
             the ConfigMap's write",
            new_pod.pod
        );
        let mut still = Vec::new();
        for (name, addr) in pending {
            probe += 1;
            // 60 fresh keys: with n slots, none on the last one has odds ((n-1)/n)^60.
            let fresh: Vec<String> = (0..60)
                .map(|i| format!("probe-{step}-{probe}-{i}"))
                .collect();
            let f = fresh.clone();
            let set = blocking(move || set_keys(addr, &f)).await;
            let landed = blocking(move || held(new_addr, &fresh)).await;
            match (set, landed) {
                (Ok(_), Ok(landed)) if !landed.is_empty() => {
                    let seconds = written_at.elapsed().as_secs_f64();
                    eprintln!(
                        "PROPAGATION kube={version} step={step} proxy={name} seconds={seconds:.1}"
                    );
                    measured.push(Measured {
                        step: step.to_string(),
                        proxy: name,
                        seconds,
                    });
                }
                _ => still.push((name, addr)),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    measured
}

struct Measured {
    step: String,
    proxy: String,
    seconds: f64,
}

on_both_versions! {
async fn keys_spread_through_the_proxy_service_and_the_proxies_load_each_new_ring_within_the_window(kube: Kube) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::start(Options {
        nodes: 1,
        real_node: true,
        ..Options::new(kube)
    })
    .await
    .unwrap_or_else(|e| panic!("control plane with a real node: {e}"));
    let node = cp.real_node().expect("the real node").clone();
    let client = cp.client().await.unwrap();
    apply_crd(&client, &Memcached::crd()).await;
    let ns = cp.namespace("real-node-proxy").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(controller::run(
        client.clone(),
        ControllerConfig {
            namespace: Some(ns.clone()),
            ..ControllerConfig::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    let (writes, watching) = record_writes(client.clone(), &ns);

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let apply = |size: i32| {
        let mcs = mcs.clone();
        let image = node.memcached_image.clone();
        async move {
            let mc = json!({
                "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                "metadata": {"name": NAME},
                "spec": {
                    "size": size,
                    "image": image,
                    "config": {"memoryMiB": 16, "threads": 1},
                    "nodeSelector": {REAL_NODE_KEY: "true"},
                    "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                    "gracefulShutdown": {"preStopDelaySeconds": STOPPING_SECONDS},
                    "proxy": {"enabled": true, "replicas": 2, "image": image, "warmUp": {"enabled": true}},
                },
            });
            mcs.patch(NAME, &PatchParams::apply("test").force(), &Patch::Apply(&mc))
                .await
                .unwrap_or_else(|e| panic!("applying size {size}: {e}"));
        }
    };
    // The proxy's status once `size` pods are in the ring and both proxy pods are Ready.
    let converged = |size: i32| {
        let mcs = mcs.clone();
        async move {
            wait_for_within(&format!("{size} backends and 2 Ready proxies"), CONVERGE, || async {
                let mc = mcs.get_opt(NAME).await.ok().flatten()?;
                let proxy = mc.status.as_ref()?.proxy.clone()?;
                (proxy.backends.len() == size as usize && proxy.ready_replicas == 2)
                    .then_some(proxy)
            })
            .await
        }
    };

    apply(SIZES[0]).await;
    let status = converged(SIZES[0]).await;
    // The proxies may have started before the pool's last pod was Ready (unlike kwok's
    // pods, real ones turn Ready one by one), and then load the full ring as any later
    // one: wait for it (measured as `create`, not counted in the summary).
    let (written_at, last) = ring_written(&writes, 0, SIZES[0]).await;
    let proxies = ready_proxy_pods(&pods).await;
    let created = until_routed(proxies, &last, written_at, "create", cp.version()).await;
    for b in &status.backends {
        let pod = pods.get(&b.pod).await.unwrap();
        assert_eq!(
            pod.spec.and_then(|s| s.node_name).as_deref(),
            Some(node.name.as_str()),
            "pool pod {} runs on the real node",
            b.pod
        );
    }

    // Through the Service: kube-proxy sends each connection to one of the proxy pods.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service = wait_for_within("the proxy Service", CONVERGE, || async {
        services.get_opt(&proxy::proxy_name(NAME)).await.ok().flatten()
    })
    .await;
    let cluster_ip: Ipv4Addr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP")
        .parse()
        .unwrap();
    let via_service = SocketAddr::from((cluster_ip, PORT));
    let keys: Vec<String> = (0..600).map(|i| format!("spread-{i}")).collect();
    let deadline = Instant::now() + CONVERGE;
    for chunk in keys.chunks(20) {
        loop {
            let c = chunk.to_vec();
            match blocking(move || set_keys(via_service, &c)).await {
                Ok(answers) if answers.iter().all(|a| a == "STORED") => break,
                other => assert!(
                    Instant::now() < deadline,
                    "setting keys through {via_service} (Service {}): {other:?}",
                    proxy::proxy_name(NAME)
                ),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let mut on_pods = BTreeMap::new();
    for b in &status.backends {
        let (addr, k) = (addr_of(b), keys.clone());
        on_pods.insert(b.pod.clone(), blocking(move || held(addr, &k)).await.unwrap());
    }
    let counts: BTreeMap<&String, usize> = on_pods.iter().map(|(p, k)| (p, k.len())).collect();
    eprintln!("keys per pool pod, set through {via_service}: {counts:?}");
    let mut seen = BTreeSet::new();
    for (pod, held) in &on_pods {
        for k in held {
            assert!(seen.insert(k.clone()), "key {k} is on two pods (one is {pod})");
        }
        // 600 keys over 3 pods: 200 each expected; 120 is far outside chance.
        assert!(held.len() >= 120, "keys per pod are uneven: {counts:?}");
    }
    assert_eq!(seen.len(), keys.len(), "every key set through the Service is on a pool pod");
    let k = keys.clone();
    let back = blocking(move || held(via_service, &k)).await.unwrap();
    assert_eq!(back.len(), keys.len(), "every key reads back through the Service");

    // Each scale-up: from the operator's write of the new ring to each proxy routing to the
    // new pod.
    let mut measured: Vec<Measured> = Vec::new();
    for step in SIZES.windows(2) {
        let (from, to) = (step[0], step[1]);
        let proxies = ready_proxy_pods(&pods).await;
        assert_eq!(proxies.len(), 2, "two Ready proxy pods: {proxies:?}");
        let written_before = writes.lock().unwrap().len();
        apply(to).await;
        let (written_at, new_pod) = ring_written(&writes, written_before, to).await;
        assert_eq!(new_pod.slot, from, "the new pod takes the slot at the end");
        let label = format!("{from}->{to}");
        measured.extend(until_routed(proxies, &new_pod, written_at, &label, cp.version()).await);
        converged(to).await;
    }

    // The pod of slot 1 replaced: its slot warms up from it while it stops.
    let status = converged(SIZES[1]).await;
    let replaced = status
        .backends
        .iter()
        .find(|b| b.slot == 1)
        .cloned()
        .expect("a pod in slot 1");
    // The keys of its slot: those it holds that the proxies read from it (a key that moved
    // to the new slot at 3 -> 4 is still held here, but read from the new slot, where it
    // misses).
    let (addr, k) = (addr_of(&replaced), keys.clone());
    let on_pod: Vec<String> = blocking(move || held(addr, &k)).await.unwrap().into_iter().collect();
    let k = on_pod.clone();
    let through = blocking(move || held(via_service, &k)).await.unwrap();
    let slot_keys: Vec<String> = on_pod.into_iter().filter(|k| through.contains(k)).collect();
    // 600 keys over 4 slots: 150 expected.
    assert!(slot_keys.len() >= 60, "{} keys in slot 1", slot_keys.len());
    let proxies = ready_proxy_pods(&pods).await;
    assert_eq!(proxies.len(), 2, "two Ready proxy pods: {proxies:?}");
    let written_before = writes.lock().unwrap().len();
    pods.delete(&replaced.pod, &Default::default()).await.expect("delete pod");
    let deleted_at = Instant::now();
    let (written_at, successor) = warm_ring_written(&writes, written_before, &replaced.pod).await;
    let warmed = until_warmed(proxies, &successor, &slot_keys, written_at, cp.version());
    // Within the replaced pod's life (then nothing can warm up any more), so that the
    // writes below are printed when it fails.
    let warmed = tokio::time::timeout(Duration::from_secs(STOPPING_SECONDS as u64), warmed).await;
    // The operator's writes since the deletion, for a failure's reader.
    for (at, version, backends) in writes.lock().unwrap().iter().skip(written_before) {
        let slots: Vec<String> = backends
            .iter()
            .map(|b| match &b.warm_from {
                Some(w) => format!("{}<-{}", b.pod, w.pod),
                None => b.pod.clone(),
            })
            .collect();
        eprintln!(
            "WRITE {:+.1} s after the deletion: {version} {slots:?}",
            at.duration_since(deleted_at).as_secs_f64()
        );
    }
    measured.extend(warmed.unwrap_or_else(|_| {
        panic!("the proxies did not warm up while the replaced pod served ({STOPPING_SECONDS} s)")
    }));
    let k = slot_keys.clone();
    let hits = blocking(move || held(via_service, &k)).await.unwrap().len();
    let (addr, k) = (addr_of(&successor), slot_keys.clone());
    let on_successor = wait_for_within("the written-back values on the replacement", CONVERGE, || {
        let k = k.clone();
        async move {
            let want = k.len();
            let on = blocking(move || held(addr, &k)).await.ok()?;
            (on.len() == want).then_some(on.len())
        }
    })
    .await;
    eprintln!(
        "WARM-UP kube={} slot keys={} hits through the Service={hits} written back={on_successor} \
         {:.1} s after the deletion",
        cp.version(),
        slot_keys.len(),
        deleted_at.elapsed().as_secs_f64()
    );
    assert_eq!(hits, slot_keys.len(), "every key of the replaced pod's slot hits through the Service");
    assert!(
        deleted_at.elapsed() < Duration::from_secs(STOPPING_SECONDS as u64),
        "the replaced pod's keys were read from it while it stopped"
    );

    // Keys set before the growth whose slot did not move still hit through the Service, the
    // replaced slot's included.
    let k = keys.clone();
    let hits = blocking(move || held(via_service, &k)).await.unwrap().len();
    eprintln!("after 3 -> 4 and a replacement, {hits} of {} keys still hit", keys.len());
    // Jump hashing keeps 3/4 of the keys in place; far fewer means keys moved between old pods
    // or the replaced slot's were lost.
    assert!(hits >= keys.len() * 6 / 10, "{hits} of {} keys still hit", keys.len());

    let mut seconds: Vec<f64> = measured.iter().map(|m| m.seconds).collect();
    seconds.sort_by(f64::total_cmp);
    eprintln!(
        "PROPAGATION-SUMMARY kube={} n={} min={:.1} median={:.1} max={:.1} window={:?}",
        cp.version(),
        seconds.len(),
        seconds[0],
        seconds[seconds.len() / 2],
        seconds[seconds.len() - 1],
        PROPAGATION_WINDOW
    );
    for m in measured.iter().chain(&created) {
        assert!(
            m.seconds < PROPAGATION_WINDOW.as_secs_f64(),
            "proxy {} loaded the ring of {} after {:.1} s, past the {PROPAGATION_WINDOW:?} \
             for which ProxyReady says it is still propagating",
            m.proxy,
            m.step,
            m.seconds
        );
    }

    watching.abort();
    let _ = stop.send(());
    let _ = operator.await;
    drop(cp);
    let left = leftovers(&node);
    assert!(left.is_empty(), "left on the host: {left:#?}");
}
}
