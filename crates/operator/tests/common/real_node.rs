//! What the real-node suites share (crates/envtest's real node: containerd, runc and the
//! pinned kubelet): a control plane with the node, the CRD, a namespace and this build's
//! controller in-process ([`Env`]); waiting for a pool's pods to be Ready on the node; and a
//! client of memcached's text protocol for their pod IPs, reachable from the host on the
//! node's bridge ([`Text`]).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use envtest::{ControlPlane, Kube, Options, REAL_NODE_KEY, RealNodeInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use memcached_api::{Memcached, MemcachedSpec};
use memcached_operator::builders::BuildSettings;
use memcached_operator::controller::{self, ControllerConfig};
use serde_json::json;

use super::cluster::apply_crd;

/// Polls `probe` every half second until it returns `Some`, failing after `timeout`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    super::wait_every(what, timeout, Duration::from_millis(500), probe).await
}

/// Long enough for a loaded 2-core machine: scheduling, sandboxes, images, probes.
pub const CONVERGE: Duration = Duration::from_secs(300);

/// A control plane with a real node, the CRD, a namespace, and the controller watching it
/// with the node's images as its defaults.
pub struct Env {
    pub cp: ControlPlane,
    pub node: RealNodeInfo,
    pub client: Client,
    pub ns: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Env {
    /// [`Env::without_controller`], then the controller.
    pub async fn start(kube: Kube, test: &str) -> Env {
        let mut env = Env::without_controller(kube, test).await;
        env.start_controller();
        env
    }

    /// The real node beside a kwok node (tainted: only the pools placed there with
    /// [`Env::on_the_real_node`] run on it), the CRD and the namespace; no operator yet.
    pub async fn without_controller(kube: Kube, test: &str) -> Env {
        Env::with_nodes(kube, 1, test).await
    }

    /// The real node as the cluster's only node (untainted: every pod runs there, and a pod
    /// it does not run has nowhere else to go), the CRD, the namespace and the controller.
    pub async fn alone(kube: Kube, test: &str) -> Env {
        let mut env = Env::with_nodes(kube, 0, test).await;
        env.start_controller();
        env
    }

    async fn with_nodes(kube: Kube, kwok_nodes: usize, test: &str) -> Env {
        let cp = ControlPlane::start(Options {
            nodes: kwok_nodes,
            real_node: true,
            ..Options::new(kube)
        })
        .await
        .unwrap_or_else(|e| panic!("control plane with a real node (make node): {e}"));
        let node = cp.real_node().expect("the real node").clone();
        let client = cp.client().await.unwrap();
        let ns = cp.namespace(test).await.unwrap();
        apply_crd(&client, &<Memcached as kube::CustomResourceExt>::crd()).await;
        Env {
            cp,
            node,
            client,
            ns,
            stop: None,
            task: None,
        }
    }

    /// This build's controller, in-process, watching the namespace with the node's images
    /// as its defaults.
    pub fn start_controller(&mut self) {
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let config = ControllerConfig {
            namespace: Some(self.ns.clone()),
            build: BuildSettings {
                default_image: self.node.memcached_image.clone(),
                tls_agent_image: self.node.tls_agent_image.clone(),
                default_exporter_image: self.node.exporter_image.clone(),
            },
            ..ControllerConfig::default()
        };
        let task = tokio::spawn(controller::run(self.client.clone(), config, async {
            let _ = stop_rx.await;
        }));
        self.stop = Some(stop);
        self.task = Some(task);
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Stops the controller, then the control plane and the node.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let Env { cp, .. } = self;
        drop(cp);
    }

    /// `spec` placed on the real node: its label selected, its taint tolerated.
    pub fn on_the_real_node(&self, spec: &mut MemcachedSpec) {
        spec.node_selector = Some(BTreeMap::from([(
            REAL_NODE_KEY.to_string(),
            "true".to_string(),
        )]));
        spec.tolerations = Some(vec![
            serde_json::from_value(
                json!({"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}),
            )
            .unwrap(),
        ]);
    }

    /// Waits until the pool `name` has `size` pods, every one Ready (by its probes, the
    /// kubelet's verdict), with an IP, on the real node, none being deleted, and
    /// `status.nodes` names exactly them; returns them (name → IP).
    pub async fn ready_pool(&self, name: &str, size: usize) -> BTreeMap<String, Ipv4Addr> {
        let memcacheds: Api<Memcached> = self.api();
        let pods: Api<Pod> = self.api();
        let selector = format!("app.kubernetes.io/instance={name}");
        let node = self.node.name.clone();
        let (pool, _) = poll(
            &format!("{size} Ready pods of {name} on the real node, named by status.nodes"),
            CONVERGE,
            || async {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                let mut pool = BTreeMap::new();
                for pod in &list.items {
                    let status = pod.status.as_ref()?;
                    let ready = status
                        .conditions
                        .as_ref()?
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let on_node = pod.spec.as_ref()?.node_name.as_deref() == Some(&*node);
                    if !ready || !on_node || pod.metadata.deletion_timestamp.is_some() {
                        return None;
                    }
                    pool.insert(pod.name_any(), status.pod_ip.as_deref()?.parse().ok()?);
                }
                let m = memcacheds.get(name).await.ok()?;
                let status = m.status?;
                let mut nodes = status.nodes.clone();
                nodes.sort();
                (pool.len() == size
                    && status.ready_replicas == size as i32
                    && nodes == pool.keys().cloned().collect::<Vec<_>>())
                .then_some((pool, ()))
            },
        )
        .await;
        pool
    }

    /// Every container's (and native sidecar's) restart count in the pool's pods.
    pub async fn restarts(&self, name: &str) -> Vec<(String, String, i32)> {
        let pods: Api<Pod> = self.api();
        let list = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
            .await
            .unwrap();
        let mut out = Vec::new();
        for pod in list.items {
            let status = pod.status.clone().unwrap_or_default();
            for c in status
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .chain(status.init_container_statuses.unwrap_or_default())
            {
                out.push((pod.name_any(), c.name, c.restart_count));
            }
        }
        out
    }
}

pub fn assert_no_restarts(restarts: &[(String, String, i32)], expected_containers: usize) {
    assert_eq!(
        restarts.len(),
        expected_containers,
        "every container's status is reported: {restarts:?}"
    );
    assert!(
        restarts.iter().all(|(_, _, n)| *n == 0),
        "no container restarted: {restarts:?}"
    );
}

/// Runs blocking client code on this (multi-threaded) runtime's worker.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

// ---------------------------------------------------------------------------------------
// memcached's text protocol, over TCP or TLS

pub struct Text<S: Read + Write>(pub BufReader<S>);

impl<S: Read + Write> Text<S> {
    pub fn try_line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        self.0.read_line(&mut line)?;
        if line.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "memcached closed the connection",
            ));
        }
        Ok(line.trim_end().to_string())
    }

    pub fn line(&mut self) -> String {
        self.try_line().expect("a line from memcached")
    }

    pub fn set(&mut self, key: &str, value: &str) {
        let cmd = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        self.0.get_mut().write_all(cmd.as_bytes()).unwrap();
        assert_eq!(self.line(), "STORED", "set {key}");
    }

    pub fn get(&mut self, key: &str) -> Option<String> {
        self.try_get(key)
            .unwrap_or_else(|e| panic!("get {key}: {e}"))
    }

    /// A value (one line), or `None` on a miss; an error of the connection, or an answer
    /// that is not one, is an error.
    pub fn try_get(&mut self, key: &str) -> std::io::Result<Option<String>> {
        self.0
            .get_mut()
            .write_all(format!("get {key}\r\n").as_bytes())?;
        let header = self.try_line()?;
        if header == "END" {
            return Ok(None);
        }
        if !header.starts_with(&format!("VALUE {key} ")) {
            return Err(std::io::Error::other(format!("get {key}: {header:?}")));
        }
        let value = self.try_line()?;
        let end = self.try_line()?;
        if end != "END" {
            return Err(std::io::Error::other(format!(
                "get {key}: {end:?} after the value"
            )));
        }
        Ok(Some(value))
    }

    /// Sets every item in one write (pipelined), then reads memcached's answers; any
    /// answer but `STORED` is an error.
    pub fn try_set_many(&mut self, items: &[(String, Vec<u8>)]) -> std::io::Result<()> {
        let mut batch = Vec::new();
        for (key, value) in items {
            batch.extend(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
            batch.extend(value);
            batch.extend(b"\r\n");
        }
        self.0.get_mut().write_all(&batch)?;
        for (key, _) in items {
            let answer = self.try_line()?;
            if answer != "STORED" {
                return Err(std::io::Error::other(format!("set {key}: {answer}")));
            }
        }
        Ok(())
    }

    /// A value of any bytes (read by its length), or `None` on a miss.
    pub fn get_bytes(&mut self, key: &str) -> Option<Vec<u8>> {
        self.0
            .get_mut()
            .write_all(format!("get {key}\r\n").as_bytes())
            .unwrap();
        let header = self.line();
        if header == "END" {
            return None;
        }
        let len: usize = header
            .strip_prefix(&format!("VALUE {key} "))
            .and_then(|rest| rest.split(' ').nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("get {key}: {header}"));
        let mut value = vec![0; len + 2];
        self.0.read_exact(&mut value).expect("the value");
        value.truncate(len);
        assert_eq!(self.line(), "END", "get {key}");
        Some(value)
    }

    /// `stats` (or `stats SUB`): memcached's counters by name.
    pub fn try_stats(&mut self, sub: &str) -> std::io::Result<HashMap<String, String>> {
        let cmd = if sub.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {sub}\r\n")
        };
        self.0.get_mut().write_all(cmd.as_bytes())?;
        let mut stats = HashMap::new();
        loop {
            let line = self.try_line()?;
            if line == "END" {
                return Ok(stats);
            }
            let mut parts = line.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("STAT"), Some(name), Some(value)) => {
                    stats.insert(name.to_string(), value.to_string());
                }
                _ => {
                    return Err(std::io::Error::other(format!(
                        "stats {sub}: unexpected {line:?}"
                    )));
                }
            }
        }
    }

    pub fn stats(&mut self, sub: &str) -> HashMap<String, String> {
        self.try_stats(sub)
            .unwrap_or_else(|e| panic!("stats {sub}: {e}"))
    }
}

/// A counter of memcached's `stats` (0 when it does not report it).
pub fn stat(stats: &HashMap<String, String>, name: &str) -> u64 {
    stats.get(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

pub fn try_connect(ip: Ipv4Addr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&SocketAddr::from((ip, 11211)), Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

pub fn connect(ip: Ipv4Addr) -> TcpStream {
    try_connect(ip).unwrap_or_else(|e| panic!("connecting to memcached at {ip}:11211: {e}"))
}

pub fn plain(ip: Ipv4Addr) -> Text<TcpStream> {
    Text(BufReader::new(connect(ip)))
}
