//! The real node, on each pinned version: a pod that tolerates its taint runs the locally
//! built memcached under containerd, runc and the pinned kubelet, on a bridge, and answers on
//! its pod IP from the host, and through a Service on its ClusterIP (kube-proxy); the pod's
//! in-cluster configuration (the `kubernetes` Service's address the kubelet gives it, its
//! projected ServiceAccount token and CA) reaches the API server from its network namespace;
//! a pod that does not tolerate the taint is not scheduled there; a second real node on the host
//! waits for the first and names it; and once the control plane stops, nothing of the node
//! is left on the host (no process, mount, cgroup, bridge, veth, CNI cache entry, log link
//! or KUBE-* iptables chain), even when the test binary that started it was killed: the
//! next real node removes it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use envtest::{
    ControlPlane, Kube, Options, REAL_NODE_KEY, client_from_kubeconfig, leftovers,
    real_node_record, take_real_node_host_lock,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Pod, PodCondition, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Long enough for a loaded 2-core machine: the kubelet's sync, the sandbox, the container.
const CONVERGE: Duration = Duration::from_secs(180);

fn net_devices() -> BTreeSet<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Sends memcached text-protocol lines and reads `n` lines of the answer.
fn memcached(addr: (Ipv4Addr, u16), request: &str, n: usize) -> Vec<String> {
    try_memcached(addr, request, n)
        .unwrap_or_else(|e| panic!("memcached at {addr:?}, {request:?}: {e}"))
}

fn try_memcached(addr: (Ipv4Addr, u16), request: &str, n: usize) -> std::io::Result<Vec<String>> {
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request.as_bytes())?;
    BufReader::new(s).lines().take(n).collect()
}

fn memcached_pod(image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "memcached", "labels": {"app": "memcached"}},
        "spec": {
            "nodeSelector": {REAL_NODE_KEY: "true"},
            "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "memcached",
                "image": image,
                "args": ["-m", "64", "-p", "11211"],
                "ports": [{"containerPort": 11211}],
                "readinessProbe": {"tcpSocket": {"port": 11211}, "periodSeconds": 1},
                "securityContext": {
                    "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }],
        },
    }))
    .unwrap()
}

/// [`memcached`] at a ClusterIP, tried until kube-proxy has programmed it (its rules follow
/// the Service and its EndpointSlice within a sync, `minSyncPeriod` 1 s).
async fn through_cluster_ip(addr: (Ipv4Addr, u16), request: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let request = request.to_string();
        let tried = tokio::task::spawn_blocking(move || try_memcached(addr, &request, n))
            .await
            .unwrap();
        match tried {
            Ok(lines) if lines.len() == n => return lines,
            other => assert!(
                Instant::now() < deadline,
                "nothing answered at {addr:?} within {CONVERGE:?}: {:?}",
                other
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn running_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let pod = pods.get(name).await.unwrap();
        let status = pod.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready && status.pod_ip.is_some() {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} was not Ready with an IP within {CONVERGE:?}: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The first process of the container `container_id` (containerd's id) of the pod `pod_uid`,
/// found in the node's cgroups (cgroupfs: `<cgroup>/kubepods/…/pod<uid>/<id>`).
fn container_pid(cgroup: &str, pod_uid: &str, container_id: &str) -> Option<u32> {
    fn find(dir: &std::path::Path, pod: &str, id: &str, in_pod: bool) -> Option<u32> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if in_pod && name == id {
                let procs = std::fs::read_to_string(path.join("cgroup.procs")).ok()?;
                return procs.lines().next()?.trim().parse().ok();
            }
            if let Some(pid) = find(&path, pod, id, in_pod || name == pod) {
                return Some(pid);
            }
        }
        None
    }
    let pod = format!("pod{pod_uid}");
    std::fs::read_dir("/sys/fs/cgroup")
        .ok()?
        .flatten()
        .map(|h| h.path().join(cgroup))
        .chain([std::path::Path::new("/sys/fs/cgroup").join(cgroup)])
        .find_map(|top| find(&top, &pod, container_id, false))
}

/// What a client in the pod's container sees: its environment's `KUBERNETES_SERVICE_HOST`
/// and `_PORT`, and its projected ServiceAccount token and CA, read through the process's
/// root.
fn in_cluster_config(pid: u32) -> (String, String, String, Vec<u8>) {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env = |key: &str| {
        environ
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{key} in the container's environment"))
            .to_string()
    };
    let secrets = format!("/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount");
    let token = std::fs::read_to_string(format!("{secrets}/token")).unwrap();
    let ca = std::fs::read(format!("{secrets}/ca.crt")).unwrap();
    (
        env("KUBERNETES_SERVICE_HOST"),
        env("KUBERNETES_SERVICE_PORT"),
        token,
        ca,
    )
}

/// Who the API server says the pod's ServiceAccount token is (a SelfSubjectReview), asked
/// from inside the network namespace of process `pid` at `host:port`, trusting the pod's CA
/// only: what `kube::Config::incluster()` does in the pod.
fn whoami_from_the_pod(pid: u32) -> Result<String, String> {
    let (host, port, token, ca) = in_cluster_config(pid);
    assert_eq!(
        (host.as_str(), port.as_str()),
        ("10.96.0.1", "443"),
        "the kubelet gives pods the `kubernetes` Service's address"
    );
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let netns =
            std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
        // SAFETY: setns(2) on a descriptor we own; moves only this thread, which ends here.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        // One thread: every socket of the client is made in the pod's network namespace.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let mut config = kube::Config::new(
                format!("https://{host}:{port}")
                    .parse()
                    .map_err(|e| format!("{e}"))?,
            );
            config.root_cert = Some(vec![
                pem_der(&ca).ok_or("no certificate in the pod's ca.crt")?,
            ]);
            config.auth_info.token = Some(token.trim().to_string().into());
            config.connect_timeout = Some(Duration::from_secs(10));
            let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
            let review: SelfSubjectReview =
                serde_json::from_value(json!({"metadata": {}})).map_err(|e| e.to_string())?;
            let answer = Api::<SelfSubjectReview>::all(client)
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| e.to_string())?;
            answer
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .ok_or_else(|| "no user in the review".to_string())
        })
    })
    .join()
    .unwrap()
}

/// The DER of the first certificate of a PEM file.
fn pem_der(pem: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    let text = std::str::from_utf8(pem).ok()?;
    let body = text
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)?
        .split("-----END CERTIFICATE-----")
        .next()?;
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

/// The containerd id of the pod's first container.
fn statuses_id(pod: &Pod) -> String {
    let status = pod.status.as_ref().unwrap();
    let id = status.container_statuses.as_ref().unwrap()[0]
        .container_id
        .clone()
        .expect("a container id");
    id.strip_prefix("containerd://").unwrap_or(&id).to_string()
}

/// One real node at a time: the check for network devices left behind compares the host's
/// devices before and after.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The scheduler's verdict on a pod (its `PodScheduled` condition, once it has one).
async fn scheduled_condition(pods: &Api<Pod>, name: &str) -> PodCondition {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let pod = pods.get(name).await.unwrap();
        let condition = pod
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"));
        if let Some(c) = condition {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the scheduler did not decide on pod {name} within {CONVERGE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn memcached_on_the_real_node_newest() {
    memcached_runs_on_the_real_node_and_answers_on_its_pod_ip_then_nothing_is_left(Kube::Newest)
        .await;
}

#[tokio::test]
async fn memcached_on_the_real_node_oldest() {
    memcached_runs_on_the_real_node_and_answers_on_its_pod_ip_then_nothing_is_left(Kube::Oldest)
        .await;
}

async fn memcached_runs_on_the_real_node_and_answers_on_its_pod_ip_then_nothing_is_left(
    kube: Kube,
) {
    let _one = ONE_AT_A_TIME.lock().await;
    let devices_before = net_devices();
    let cp = ControlPlane::start(Options {
        nodes: 1,
        real_node: true,
        ..Options::new(kube)
    })
    .await
    .expect("control plane with a real node starts");
    let node = cp.real_node().expect("the real node").clone();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace("real-node").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let memcached_pod = memcached_pod(&node.memcached_image);
    pods.create(&PostParams::default(), &memcached_pod)
        .await
        .unwrap();
    // Without the toleration the same pod may not go there: the scheduler says why.
    let mut untolerated = memcached_pod.clone();
    untolerated.metadata.name = Some("untolerated".into());
    untolerated.spec.as_mut().unwrap().tolerations = None;
    pods.create(&PostParams::default(), &untolerated)
        .await
        .unwrap();

    let pod = running_pod(&pods, "memcached").await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(node.name.as_str()));
    let ip: Ipv4Addr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap()
        .parse()
        .unwrap();
    let subnet = node.pod_subnet.trim_end_matches("0/24");
    assert!(
        ip.to_string().starts_with(subnet),
        "the pod's IP {ip} is on the node's bridge ({})",
        node.pod_subnet
    );
    // memcached itself answers, at the pod's address: a value set is read back.
    let version = memcached((ip, 11211), "version\r\n", 1);
    assert!(
        version
            .first()
            .is_some_and(|l| l.starts_with("VERSION 1.6")),
        "memcached's version: {version:?}"
    );
    let got = memcached(
        (ip, 11211),
        "set greeting 0 0 5\r\nhello\r\nget greeting\r\n",
        4,
    );
    assert_eq!(got, ["STORED", "VALUE greeting 0 5", "hello", "END"]);
    // The kubelet's own account: the container started once and runs.
    let statuses = pod.status.as_ref().unwrap().container_statuses.clone();
    let status = &statuses.unwrap()[0];
    assert_eq!(status.restart_count, 0);
    assert!(status.state.as_ref().unwrap().running.is_some());

    // Through a Service: kube-proxy's rules send the ClusterIP to the pod, from the host.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "memcached"},
        "spec": {
            "selector": {"app": "memcached"},
            "ports": [{"port": 11211, "targetPort": 11211}],
        },
    }))
    .unwrap();
    let service = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let cluster_ip: Ipv4Addr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP")
        .parse()
        .unwrap();
    let got = through_cluster_ip((cluster_ip, 11211), "get greeting\r\n", 3).await;
    assert_eq!(
        got,
        ["VALUE greeting 0 5", "hello", "END"],
        "the value set on the pod, read through the Service's ClusterIP {cluster_ip}"
    );
    let got = memcached((cluster_ip, 11211), "set via-service 0 0 2\r\nok\r\n", 1);
    assert_eq!(got, ["STORED"]);
    let got = memcached((ip, 11211), "get via-service\r\n", 3);
    assert_eq!(got, ["VALUE via-service 0 2", "ok", "END"]);

    // The API server from the pod, as an in-cluster client reaches it: the `kubernetes`
    // Service names the node's address (the API server's endpoint reconciler), and its
    // ClusterIP, from the pod's network namespace, answers with the pod's own token.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the `kubernetes` Service's EndpointSlice");
    let addresses: Vec<String> = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.clone())
        .collect();
    assert_eq!(
        addresses,
        [node.node_ip.to_string()],
        "the API server's endpoint is the node's address"
    );
    let container_id = statuses_id(&pod);
    let uid = pod.metadata.uid.clone().unwrap();
    let pid = container_pid(&node.cgroup, &uid, &container_id)
        .unwrap_or_else(|| panic!("the memcached container's process ({container_id})"));
    let deadline = Instant::now() + CONVERGE;
    let user = loop {
        // kube-proxy programs the Service's rules within a sync of its endpoints.
        match whoami_from_the_pod(pid) {
            Ok(user) => break user,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the pod did not reach the API server at 10.96.0.1:443 within {CONVERGE:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(user, format!("system:serviceaccount:{ns}:default"));

    // A second real node on this host waits for this one, and names it when it gives up.
    let second = take_real_node_host_lock(Duration::from_secs(1)).await;
    let err = second
        .expect_err("the host's real-node lock is held")
        .to_string();
    assert!(
        err.contains(&format!("process {}", std::process::id())),
        "the error names the holder: {err}"
    );

    let scheduled = scheduled_condition(&pods, "untolerated").await;
    assert_eq!(
        (scheduled.status.as_str(), scheduled.reason.as_deref()),
        ("False", Some("Unschedulable")),
        "a pod without the toleration stays off the real node: {scheduled:?}"
    );
    assert!(
        scheduled
            .message
            .as_deref()
            .is_some_and(|m| m.contains("untolerated taint")),
        "the scheduler names a taint as the reason: {scheduled:?}"
    );

    drop(cp);
    let left = leftovers(&node);
    assert!(left.is_empty(), "left on the host: {left:#?}");
    let added: Vec<String> = net_devices().difference(&devices_before).cloned().collect();
    assert!(added.is_empty(), "network devices left: {added:?}");
}

/// A test binary killed with its real node running (SIGKILL: no drop) takes containerd and
/// the kubelet with it, but its shims and containers stay; the next real node removes them
/// and everything else the dead one made.
#[tokio::test]
async fn a_killed_binary_s_real_node_is_removed_by_the_next_real_node() {
    let _one = ONE_AT_A_TIME.lock().await;
    let devices_before = net_devices();
    let work = std::env::temp_dir().join(format!("real-node-killed-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let kubeconfig = work.join("kubeconfig");
    let log = std::fs::File::create(work.join("dev-cluster.log")).unwrap();
    let mut dev_cluster = std::process::Command::new(env!("CARGO_BIN_EXE_dev-cluster"))
        .args([
            "--kube",
            "newest",
            "--nodes",
            "1",
            "--real-node",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .arg("--audit-log")
        .arg(work.join("audit.log"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + CONVERGE;
    while !kubeconfig.exists() {
        assert!(
            dev_cluster.try_wait().unwrap().is_none() && Instant::now() < deadline,
            "dev-cluster --real-node did not start: {}",
            std::fs::read_to_string(work.join("dev-cluster.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let record = std::fs::read_dir("/run")
        .unwrap()
        .flatten()
        .map(|e| e.path().join("node"))
        .find(|p| {
            p.parent().and_then(|d| d.file_name()).is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("envtest-{}-", dev_cluster.id()))
            })
        })
        .expect("dev-cluster's real node record in /run");
    let dead = real_node_record(&record).expect("a readable record");
    let client = client_from_kubeconfig(&kubeconfig).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(
        &PostParams::default(),
        &memcached_pod(&dead.memcached_image),
    )
    .await
    .unwrap();
    running_pod(&pods, "memcached").await;

    dev_cluster.kill().unwrap();
    dev_cluster.wait().unwrap();
    let left = leftovers(&dead);
    assert!(
        left.iter().any(|l| l.starts_with("processes in cgroup")),
        "the killed binary's containers outlive it: {left:#?}"
    );

    let cp = ControlPlane::start(Options {
        nodes: 1,
        real_node: true,
        ..Options::new(Kube::Newest)
    })
    .await
    .expect("the next real node starts");
    let left = leftovers(&dead);
    assert!(
        left.is_empty(),
        "left of the killed binary's node: {left:#?}"
    );
    let node = cp.real_node().unwrap().clone();
    drop(cp);
    let left = leftovers(&node);
    assert!(left.is_empty(), "left on the host: {left:#?}");
    let added: Vec<String> = net_devices().difference(&devices_before).cloned().collect();
    assert!(added.is_empty(), "network devices left: {added:?}");
    // The killed binary's control plane files (its processes died with it).
    if let Some(cp_dir) = dead.dirs.first().and_then(|d| d.parent()) {
        let _ = std::fs::remove_dir_all(cp_dir);
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Alone (no kwok nodes: `make dev-cluster NODE=real`), the real node is untainted and takes
/// every pod: a pod with neither toleration nor node selector runs memcached there.
#[tokio::test]
async fn alone_the_real_node_runs_every_pod() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::start(Options {
        nodes: 0,
        real_node: true,
        ..Options::new(Kube::Newest)
    })
    .await
    .expect("control plane with only a real node starts");
    let node = cp.real_node().expect("the real node").clone();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace("alone").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let mut plain = memcached_pod(&node.memcached_image);
    let spec = plain.spec.as_mut().unwrap();
    spec.tolerations = None;
    spec.node_selector = None;
    pods.create(&PostParams::default(), &plain).await.unwrap();
    let pod = running_pod(&pods, "memcached").await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name.as_str())
    );
    let ip: Ipv4Addr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap()
        .parse()
        .unwrap();
    let got = memcached((ip, 11211), "set k 0 0 1\r\nv\r\nget k\r\n", 4);
    assert_eq!(got, ["STORED", "VALUE k 0 1", "v", "END"]);
    drop(cp);
    let left = leftovers(&node);
    assert!(left.is_empty(), "left on the host: {left:#?}");
}
