//! A real Kubernetes control plane for tests, like controller-runtime's envtest, plus the
//! parts envtest leaves out: kube-controller-manager (Deployments → ReplicaSets → Pods, garbage
//! collection), kube-scheduler, and kwok's fake nodes, whose pods turn Running and Ready with
//! an IP without a kubelet.
//!
//! The binaries come from `hack/controlplane` (`make controlplane`): every Kubernetes version
//! pinned there is built into `bin/k8s-vX.Y.Z/`, kwok into `bin/kwok-vA.B.C/`. A test asks for
//! [`Kube::Oldest`] or [`Kube::Newest`] of the pinned versions.
//!
//! ```no_run
//! # async fn demo() -> Result<(), envtest::Error> {
//! let cp = envtest::ControlPlane::shared(envtest::Kube::Newest)?; // one per test binary
//! let client = cp.client().await?;
//! let ns = cp.namespace("my-test").await?; // each test in its own namespace
//! # Ok(()) }
//! ```
//!
//! Every process is started on loopback with free ports, its own certificates and a data
//! directory under the system's temp dir (with a real node, the API server listens on the
//! node's address instead, where its pods reach it; see `node`). An owned [`ControlPlane`] stops its processes when
//! dropped; the shared ones stop when the test binary exits. Each process is also told by the
//! kernel to die with the test binary (`PR_SET_PDEATHSIG`), so a crashed or killed test leaves
//! no process behind (but a real node's containers and their shims, which the next real node
//! removes).
//!
//! This file starts and stops the control plane; `process` runs its processes, `certs`
//! makes its certificates, `workloads` creates kwok's nodes, `node` runs the real node
//! ([`Options::real_node`]: containerd and the kubelet, `make node`), `binaries` and `versions`
//! find what is pinned, `kubeconfig` writes and reads kubeconfigs, `audit` reads the log.
pub mod audit;
mod binaries;
mod certs;
mod error;
mod kubeconfig;
mod node;
mod process;
mod sockets;
mod versions;
mod workloads;

use std::collections::HashMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use binaries::require;
use kubeconfig::{User, config_from_kubeconfig, kubeconfig_yaml};

pub use binaries::{bin_root, k8s_bin_dir, kubectl_path, tool_path};
pub use error::Error;
pub(crate) use error::io_err;
pub use kubeconfig::client_from_kubeconfig;
pub use node::{
    REAL_NODE_HOST_LOCK, REAL_NODE_KEY, REAL_NODE_NAME, REAL_NODE_START_TIMEOUT, REAL_NODE_WAIT,
    RealNodeHostLock, RealNodeInfo, leftovers, real_node_record, take_real_node_host_lock,
};
pub use process::Process;
pub use sockets::established_connections;
pub use versions::{Kube, Version, pinned_kube_versions, repo_root};

/// How long the whole control plane may take to start before [`ControlPlane::start`] fails.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The Services' cluster IPs (`--service-cluster-ip-range`); a real node routes them to its
/// pods through kube-proxy.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// The annotation kwok manages nodes by.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// What to start.
#[derive(Clone, Debug)]
pub struct Options {
    /// Which of the pinned Kubernetes versions.
    pub kube: Kube,
    /// kube-controller-manager, kube-scheduler and kwok with [`Options::nodes`] fake nodes:
    /// needed for pods, ReplicaSets and garbage collection; without them only etcd and
    /// kube-apiserver run (envtest's default).
    pub workloads: bool,
    /// Fake nodes, spread over zones `zone-a`, `zone-b`, `zone-c`.
    pub nodes: usize,
    /// Whether the nodes carry zone and region labels (a cluster without them: bare metal,
    /// most small clusters).
    pub zones: bool,
    /// Extra flags for kube-apiserver.
    pub apiserver_args: Vec<String>,
    /// Where the binaries are, instead of [`bin_root`].
    pub bin_root: Option<PathBuf>,
    /// One real node (needs [`Options::workloads`] and root; built by `make node`):
    /// containerd and the pinned kubelet, running pods from locally built images. Beside
    /// kwok nodes ([`Options::nodes`] > 0) it is tainted, and runs only the pods that
    /// tolerate [`REAL_NODE_KEY`]; alone, it runs every pod. See [`ControlPlane::real_node`].
    pub real_node: bool,
}

impl Options {
    pub fn new(kube: Kube) -> Self {
        Options {
            kube,
            workloads: true,
            nodes: 3,
            zones: true,
            apiserver_args: Vec::new(),
            bin_root: None,
            real_node: false,
        }
    }
}

/// A running control plane. See the crate docs.
pub struct ControlPlane {
    version: Version,
    k8s_bin: PathBuf,
    dir: PathBuf,
    url: String,
    kubeconfig: PathBuf,
    ca_pem: String,
    processes: Mutex<Vec<Process>>,
    real_node: Mutex<Option<node::RealNode>>,
    real_node_info: Option<RealNodeInfo>,
    started_in: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("version", &self.version)
            .field("url", &self.url)
            .field("dir", &self.dir)
            .finish()
    }
}

fn free_port() -> Result<u16, Error> {
    free_port_on(Ipv4Addr::LOCALHOST)
}

fn free_port_on(ip: Ipv4Addr) -> Result<u16, Error> {
    let l = TcpListener::bind((ip, 0)).map_err(io_err(format!("binding a free port on {ip}")))?;
    let port = l
        .local_addr()
        .map_err(io_err("reading a bound port"))?
        .port();
    Ok(port)
}

static SHARED: OnceLock<Mutex<HashMap<Kube, Result<&'static ControlPlane, String>>>> =
    OnceLock::new();

impl ControlPlane {
    /// The control plane of this test binary for `kube` (with workloads and 3 nodes), started
    /// by the first test that asks and stopped when the binary exits. Tests share it, so each
    /// works in its own namespace ([`ControlPlane::namespace`]) and scopes anything
    /// cluster-wide it registers (webhook configurations: a namespace selector).
    pub fn shared(kube: Kube) -> Result<&'static ControlPlane, Error> {
        let map = SHARED.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = map.get(&kube) {
            return r.clone().map_err(Error::Shared);
        }
        // Started on a thread of its own, with its own runtime: the caller may be inside any
        // test's runtime, and the control plane outlives every one of them.
        let started = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("runtime: {e}"))?;
            rt.block_on(ControlPlane::start(Options::new(kube)))
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("starting the control plane panicked".to_string()));
        let r = started.map(|cp| {
            process::stop_at_exit();
            process::remove_dir_at_exit(&cp.dir);
            &*Box::leak(Box::new(cp))
        });
        map.insert(kube, r.clone());
        r.map_err(Error::Shared)
    }

    /// Starts a control plane of its own (stopped on drop).
    pub async fn start(opts: Options) -> Result<ControlPlane, Error> {
        let begin = Instant::now();
        let version = opts.kube.resolve()?;
        let k8s_dir_name = format!("k8s-{version}");
        let root = opts.bin_root.clone().unwrap_or_else(bin_root);
        let k8s_bin = root.join(&k8s_dir_name);
        let etcd = require(&k8s_bin.join("etcd"), &k8s_dir_name)?;
        let apiserver = require(&k8s_bin.join("kube-apiserver"), &k8s_dir_name)?;
        let kwok_dir = root.join(versions::kwok_dir_name()?);
        let (kcm, scheduler, kwok) = if opts.workloads {
            (
                Some(require(
                    &k8s_bin.join("kube-controller-manager"),
                    &k8s_dir_name,
                )?),
                Some(require(&k8s_bin.join("kube-scheduler"), &k8s_dir_name)?),
                Some(require(&kwok_dir.join("kwok"), "kwok")?),
            )
        } else {
            (None, None, None)
        };

        let dir = std::env::temp_dir().join(format!(
            "envtest-{}-{}-{}",
            version,
            std::process::id(),
            process::next_id()
        ));
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        // A real node's network comes first: the API server listens on the node's address,
        // where the pods reach it (see `api_ip` below). Dropped on any error from here on,
        // which removes what it made.
        let mut real_node = if opts.real_node {
            if !opts.workloads {
                return Err(Error::RealNode(
                    "a real node needs the workloads (kube-controller-manager, kube-scheduler)"
                        .into(),
                ));
            }
            Some(
                node::RealNode::prepare(node::NodeInputs {
                    bin_root: &root,
                    version: &version,
                    dir: &dir,
                    tainted: opts.nodes > 0,
                })
                .await?,
            )
        } else {
            None
        };
        // Where the API server listens: loopback, or with a real node the node's address
        // (on its bridge, the pods' gateway), which the host reaches as well. The
        // `kubernetes` Service then names it (the endpoint reconciler), and kube-proxy sends
        // the Service's ClusterIP (10.96.0.1:443, what the kubelet gives pods in
        // KUBERNETES_SERVICE_HOST and _PORT) there: a pod's in-cluster configuration works.
        let api_ip = real_node
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |n| n.info().node_ip);
        let pki = certs::Pki::generate(&[api_ip.to_string()])?;
        let write = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let p = dir.join(name);
            std::fs::write(&p, contents).map_err(io_err(format!("writing {}", p.display())))?;
            Ok(p)
        };
        let ca_crt = write("ca.crt", &pki.ca_pem)?;
        pki.write_ca_key(&dir)?;
        let serving_crt = write("apiserver.crt", &pki.serving_cert_pem)?;
        let serving_key = write("apiserver.key", &pki.serving_key_pem)?;
        let sa_key = write("sa.key", &pki.sa_key_pem)?;
        let sa_pub = write("sa.pub", &pki.sa_pub_pem)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let api_port = free_port_on(api_ip)?;
        let url = format!("https://{api_ip}:{api_port}");
        let kubeconfig = write(
            "admin.kubeconfig",
            &kubeconfig_yaml(
                &url,
                &pki.ca_pem,
                User::Cert(&pki.admin_cert_pem, &pki.admin_key_pem),
            ),
        )?;

        let mut cp = ControlPlane {
            version: version.clone(),
            k8s_bin: k8s_bin.clone(),
            dir: dir.clone(),
            url: url.clone(),
            kubeconfig: kubeconfig.clone(),
            ca_pem: pki.ca_pem.clone(),
            processes: Mutex::new(Vec::new()),
            real_node: Mutex::new(None),
            real_node_info: real_node.as_ref().map(|n| n.info().clone()),
            started_in: Duration::ZERO,
        };

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        cp.spawn(
            "etcd",
            &etcd,
            &[
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;

        // Every request is logged (metadata only) with who made it and from which program,
        // so a test can count what one client did, as the server saw it.
        let audit_policy = write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )?;
        let audit_log = dir.join("audit.log");
        let mut apiserver_args = vec![
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-maxsize=0".into(),
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={api_ip}"),
            format!("--advertise-address={api_ip}"),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving_crt.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_crt.display()),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if real_node.is_none() {
            // The `kubernetes` Service's endpoints would name a loopback address, which the
            // server itself refuses; nothing here needs them. With a real node they name the
            // node's address (the default reconciler, `lease`), for the pods.
            apiserver_args.push("--endpoint-reconciler-type=none".into());
        } else {
            // The API server reaches the kubelet (logs, exec) at the node's address, as the
            // admin, whom the kubelet asks the API server about.
            let admin_crt = write("admin.crt", &pki.admin_cert_pem)?;
            let admin_key = write("admin.key", &pki.admin_key_pem)?;
            apiserver_args.extend([
                "--kubelet-preferred-address-types=InternalIP".into(),
                format!("--kubelet-client-certificate={}", admin_crt.display()),
                format!("--kubelet-client-key={}", admin_key.display()),
            ]);
        }
        apiserver_args.extend(opts.apiserver_args.iter().cloned());
        cp.spawn("kube-apiserver", &apiserver, &apiserver_args)?;

        let client = cp.client().await?;
        cp.wait_ready(&client, begin).await?;

        if let (Some(kcm), Some(scheduler), Some(kwok)) = (kcm, scheduler, kwok) {
            cp.spawn(
                "kube-controller-manager",
                &kcm,
                &[
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    format!("--root-ca-file={}", ca_crt.display()),
                    format!("--service-account-private-key-file={}", sa_key.display()),
                    "--use-service-account-credentials=false".into(),
                    // kwokctl's setting: the controllers are not what a test measures.
                    "--kube-api-qps=5000".into(),
                    "--kube-api-burst=10000".into(),
                    "--concurrent-deployment-syncs=16".into(),
                    "--concurrent-replicaset-syncs=16".into(),
                    "--concurrent-gc-syncs=32".into(),
                ],
            )?;
            let sched_config = write(
                "scheduler.yaml",
                &serde_json::to_string_pretty(&json!({
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": kubeconfig.display().to_string(),
                        "qps": 5000, "burst": 10000,
                    },
                    "leaderElection": {"leaderElect": false},
                }))
                .map_err(|e| Error::Kubeconfig(e.to_string()))?,
            )?;
            cp.spawn(
                "kube-scheduler",
                &scheduler,
                &[
                    format!("--config={}", sched_config.display()),
                    "--secure-port=0".into(),
                ],
            )?;
            let kwok_port = free_port()?;
            cp.spawn(
                "kwok",
                &kwok,
                &[
                    format!("--kubeconfig={}", kubeconfig.display()),
                    format!("--config={}", kwok_dir.join("stages.yaml").display()),
                    format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
                    "--cidr=10.244.0.1/16".into(),
                    "--node-ip=10.0.0.1".into(),
                    "--node-lease-duration-seconds=40".into(),
                    format!("--server-address=127.0.0.1:{kwok_port}"),
                ],
            )?;
            cp.create_nodes(&client, opts.nodes, opts.zones).await?;
            cp.wait_workloads_ready(&client, opts.nodes, begin).await?;
            if let Some(mut node) = real_node.take() {
                // Owned by the control plane from here on: stopped first when it stops.
                let started = node.start(&kubeconfig, &ca_crt, &client).await;
                *cp.real_node.lock().unwrap_or_else(|e| e.into_inner()) = Some(node);
                started?;
            }
        }
        cp.started_in = begin.elapsed();
        tracing::info!(version = %cp.version, url = %cp.url, started_in = ?cp.started_in, "control plane ready");
        Ok(cp)
    }

    fn spawn(&self, name: &str, binary: &Path, args: &[String]) -> Result<(), Error> {
        let p = Process::spawn(name, binary, args, &self.dir)?;
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p);
        Ok(())
    }

    /// Fails with the component's log when one of the processes has exited.
    fn check_alive(&self) -> Result<(), Error> {
        let mut procs = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        Ok(())
    }

    async fn wait_ready(&self, client: &Client, begin: Instant) -> Result<(), Error> {
        loop {
            self.check_alive()?;
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if begin.elapsed() > START_TIMEOUT {
                return Err(self.component_error("kube-apiserver", "did not become ready"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn component_error(&self, component: &str, problem: &str) -> Error {
        let log = self.dir.join(format!("{component}.log"));
        Error::Component {
            component: component.to_string(),
            problem: problem.to_string(),
            tail: process::tail(&log, 30),
            log,
        }
    }

    /// The running components (etcd, kube-apiserver, …, kwok) and their process ids, for
    /// accounting their CPU and memory (the benchmarks).
    pub fn component_pids(&self) -> Vec<(String, u32)> {
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|p| match p.pid() {
                (name, Some(pid)) => Some((name, pid)),
                _ => None,
            })
            .collect()
    }

    /// Stops the component `name` (`kube-apiserver`, `etcd`, `kube-controller-manager`,
    /// `kube-scheduler`, `kwok`) as a crash would (SIGKILL); its data and flags are kept
    /// for [`ControlPlane::start_component`]. On a shared control plane this stops it for
    /// every test of the binary: a test that stops one starts a control plane of its own.
    pub fn stop_component(&self, name: &str) -> Result<(), Error> {
        let mut procs = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        let p = procs
            .iter_mut()
            .find(|p| p.name() == name)
            .ok_or_else(|| Error::NoComponent(name.to_string()))?;
        p.kill();
        Ok(())
    }

    /// Starts the component `name` stopped by [`ControlPlane::stop_component`] again, with
    /// the same binary, flags, ports and data directory (its log continues); for
    /// kube-apiserver, returns once it answers `/readyz` again.
    pub async fn start_component(&self, name: &str) -> Result<(), Error> {
        {
            let mut procs = self.processes.lock().unwrap_or_else(|e| e.into_inner());
            let p = procs
                .iter_mut()
                .find(|p| p.name() == name)
                .ok_or_else(|| Error::NoComponent(name.to_string()))?;
            p.start()?;
        }
        if name == "kube-apiserver" {
            let client = self.client().await?;
            self.wait_ready(&client, Instant::now()).await?;
        }
        Ok(())
    }

    /// The Kubernetes version this control plane runs.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// How long [`ControlPlane::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// `https://127.0.0.1:PORT` (with a real node, `https://<node address>:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA, PEM (the `caBundle` of a webhook served with a certificate of
    /// [`ControlPlane::serving_cert`]).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig with cluster-admin rights (a client certificate in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory of this control plane's files and logs (`<component>.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory with this version's kubectl and server binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.k8s_bin
    }

    /// A cluster-admin client.
    pub async fn client(&self) -> Result<Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// A client acting as `user` in `groups` (impersonation by the admin): what RBAC allows
    /// that identity, the API server decides.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<Client, Error> {
        let mut config = config_from_kubeconfig(&self.kubeconfig).await?;
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        Ok(Client::try_from(config)?)
    }

    /// Writes a kubeconfig that authenticates with `token` (a ServiceAccount's, say) and
    /// returns its path.
    pub fn kubeconfig_for_token(&self, name: &str, token: &str) -> Result<PathBuf, Error> {
        let p = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(
            &p,
            kubeconfig_yaml(&self.url, &self.ca_pem, User::Token(token)),
        )
        .map_err(io_err(format!("writing {}", p.display())))?;
        Ok(p)
    }

    /// A `kubectl` command for this control plane (the pinned kubectl, admin kubeconfig).
    pub fn kubectl(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.k8s_bin.join("kubectl"));
        c.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        c
    }

    /// Creates a namespace named `prefix-N` (unique in this control plane) and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, Error> {
        let client = self.client().await?;
        let name = format!("{prefix}-{}", process::next_id());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        // Pods cannot be created before kube-controller-manager gives the namespace its
        // `default` ServiceAccount.
        let sas: Api<ServiceAccount> = Api::namespaced(client, &name);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sas.get_opt("default").await?.is_none() {
            if Instant::now() > deadline {
                return Err(Error::Timeout(
                    format!("the default ServiceAccount of {name}"),
                    Duration::from_secs(30),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(name)
    }

    /// The API server's audit log (one JSON event per request, metadata level): see
    /// [`audit::read`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Every request the API server has logged so far.
    pub fn audit(&self) -> Result<Vec<audit::Request>, Error> {
        audit::read(&self.audit_log())
    }

    /// The API server's own `/metrics` text.
    pub async fn metrics(&self) -> Result<String, Error> {
        let client = self.client().await?;
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Ok(client.request_text(req).await?)
    }

    /// A serving certificate (PEM cert, PEM key) for `names`, signed by the cluster CA, for a
    /// webhook server the API server must trust.
    pub fn serving_cert(&self, names: &[&str]) -> Result<(String, String), Error> {
        certs::serving_cert_from_ca_pem(&self.dir, names)
    }

    /// The real node ([`Options::real_node`]), when this control plane has one.
    pub fn real_node(&self) -> Option<&RealNodeInfo> {
        self.real_node_info.as_ref()
    }

    /// Stops every process (SIGKILL: the data is thrown away) and removes the directory;
    /// the real node first, with everything it made on the host.
    pub fn stop(&self) {
        drop(
            self.real_node
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let mut procs = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        for p in procs.iter_mut().rev() {
            p.kill();
        }
        procs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
