//! A real node beside kwok's fake ones ([`Options::real_node`](crate::Options)): containerd
//! with runc and a CNI bridge, the pinned kubelet and kube-proxy, all built by `make node`
//! (`hack/node`), running the locally built images (`bin/node-images`: pause, memcached, the
//! TLS reload agent and the operator; nothing is pulled).
//!
//! The node registers as [`REAL_NODE_NAME`], labelled `envtest/real-node=true` and, beside
//! kwok nodes, tainted `envtest/real-node:NoSchedule`, so that only pods which tolerate the
//! taint land there; alone (no kwok nodes), it is untainted and takes every pod.
//! Its pods get addresses on a bridge of their own (`et<pid>-<n>`, `10.199.K.0/24`, the host
//! at `10.199.K.1`, which is also the node's address and where the kubelet listens), so the
//! test reaches a pod at its IP from the host. kube-proxy (iptables mode, the pod subnet as
//! its cluster CIDR) routes the Services' ClusterIPs ([`crate::SERVICE_CIDR`], routed to the
//! bridge) to the node's pods, from the host (tested); from the pods too where the kernel
//! passes bridged traffic through iptables (`br_netfilter`, `bridge-nf-call-iptables=1`, as
//! on this machine kind; not tested).
//!
//! Pods reach the API server as in any cluster: the bridge and its address are made before
//! the control plane starts (`RealNode::prepare`), and the API server listens on that
//! address (only) and advertises it, so its endpoint reconciler points the `kubernetes`
//! Service there and kube-proxy sends `10.96.0.1:443` (what the kubelet gives pods in
//! `KUBERNETES_SERVICE_HOST` and `_PORT`) to it; its serving certificate names that address
//! and `10.96.0.1`. A pod's in-cluster configuration (that address, its projected
//! ServiceAccount token and CA) works unchanged (tested). That path is routed, not bridged
//! (the pod sends to its gateway, the host, whose own address is the endpoint), so it needs
//! neither `br_netfilter` nor `route_localnet`.
//!
//! One real node per host: kube-proxy's iptables chains are the host's, so a real node holds
//! the host's lock ([`REAL_NODE_HOST_LOCK`]) for its whole life; a second one waits for it
//! ([`REAL_NODE_WAIT`]), then fails naming the holder's process id. A real node refuses to
//! start beside KUBE-* chains it did not make.
//!
//! It needs root, cgroup v1 controllers or cgroup v2, and the root mount shared (made so
//! here, as kind's entrypoint does). Everything it creates is its own and is removed when
//! the control plane stops: the processes (containerd, its shims and every container: they
//! live in the cgroup `envtest-<pid>-<n>`), the mounts under its directories, the bridge and
//! the pods' network namespaces and veths, the CNI cache entries, the kubelet's symlinks in
//! `/var/log/containers`, the cgroups, and every KUBE-* iptables chain (`kube-proxy
//! --cleanup`, then the chains it leaves: `KUBE-FIREWALL` and the jumps to it).
//!
//! What it changes on the host and leaves: the root mount's propagation (shared), and what
//! the kubelet sets at start (`vm.overcommit_memory=1`, `kernel.panic=10`,
//! `kernel.panic_on_oops=1`), the directories `/var/log/containers` and
//! `/var/lib/kubelet/device-plugins` (paths the kubelet does not let one move).

use std::collections::BTreeSet;
use std::ffi::{CString, OsString};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use serde_json::json;

use crate::process::{self, Process};
use crate::{Error, Version, io_err, versions};

/// The real node's name.
pub const REAL_NODE_NAME: &str = "real-node";
/// The key of the real node's `NoSchedule` taint and of its label (`=true`): a pod that runs
/// there tolerates the taint and selects the label.
pub const REAL_NODE_KEY: &str = "envtest/real-node";

/// How long the real node may take to register and turn Ready.
pub const REAL_NODE_START_TIMEOUT: Duration = Duration::from_secs(120);

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CNI_CACHE: &str = "/var/lib/cni/results";
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";
/// Where the kubelet's built-in cAdvisor looks for containerd (its `-containerd` flag's
/// default, which the kubelet does not expose): without it, `/metrics/cadvisor` has no
/// `container`, `pod` or `namespace` labels. The node links its own socket there when
/// nothing else is (and removes the link with itself).
const CADVISOR_CONTAINERD_SOCK: &str = "/run/containerd/containerd.sock";

/// What a test needs to know of the real node: its name, the images it holds, where its
/// pods' addresses come from, and what it created on the host (to check that all of it is
/// gone once the control plane stops).
#[derive(Clone, Debug)]
pub struct RealNodeInfo {
    /// The Node's name ([`REAL_NODE_NAME`]).
    pub name: String,
    /// The memcached image (memcached with its proxy and TLS, `make memcached-proxy`), as
    /// pods name it; imported, never pulled.
    pub memcached_image: String,
    /// The TLS reload agent's image (crates/tls-agent, its binary at `/memcached-tls-agent`,
    /// the operator's `--tls-agent-image`); imported, never pulled.
    pub tls_agent_image: String,
    /// The memcached exporter's image (hack/memcached-exporter, the version the operator runs
    /// by default, its binary at `/bin/memcached_exporter` as upstream's); imported, never
    /// pulled.
    pub exporter_image: String,
    /// The operator's image (crates/operator, its binary at `/memcached-operator` as
    /// `config/manager` and the chart run it, user 65532), named
    /// `envtest.local/memcached-operator:VERSION` (VERSION the chart's `appVersion`);
    /// imported, never pulled.
    pub operator_image: String,
    /// The pod sandbox image.
    pub pause_image: String,
    /// The node's address (the bridge's, on the host).
    pub node_ip: Ipv4Addr,
    /// The pods' addresses, `10.199.K.0/24`.
    pub pod_subnet: String,
    /// The bridge (a network device of the host).
    pub bridge: String,
    /// The cgroup every process of the node lives in, under each hierarchy.
    pub cgroup: String,
    /// The node's directories (state, sockets, mounts).
    pub dirs: Vec<PathBuf>,
}

/// The running node: stopped, and everything it made removed, on drop.
pub(crate) struct RealNode {
    info: RealNodeInfo,
    kube_proxy: Option<Process>,
    kubelet: Option<Process>,
    containerd: Option<Process>,
    /// The kube-proxy binary whose `--cleanup` removes its iptables chains on stop.
    kube_proxy_bin: Option<PathBuf>,
    /// What [`RealNode::prepare`] found for [`RealNode::start`]; `None` once started.
    pending: Option<Pending>,
    /// Held until everything above is stopped and removed (a field drops after `drop`).
    _host: Option<RealNodeHostLock>,
}

/// The binaries and directories a prepared node starts with.
struct Pending {
    kubelet: PathBuf,
    containerd: PathBuf,
    ctr: PathBuf,
    runc: PathBuf,
    rt_bin: PathBuf,
    tarballs: Vec<PathBuf>,
    dir: PathBuf,
    run_dir: PathBuf,
    tainted: bool,
}

/// The files of a pinned control plane the node uses, before the control plane runs.
pub(crate) struct NodeInputs<'a> {
    pub bin_root: &'a Path,
    pub version: &'a Version,
    pub dir: &'a Path,
    /// Tainted [`REAL_NODE_KEY`]`:NoSchedule`, so that only pods which tolerate it land
    /// there (when there are kwok nodes beside it); untainted, it takes every pod.
    pub tainted: bool,
}

fn node_err(what: impl Into<String>) -> Error {
    Error::RealNode(what.into())
}

fn require_file(path: PathBuf, command: &str) -> Result<PathBuf, Error> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            binary: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            path,
            command: command.to_string(),
        })
    }
}

/// Runs a command to completion; fails with its output.
fn run(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(io_err(format!("running {:?}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(node_err(format!(
            "{:?} {:?} failed ({}): {}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn cstring(p: &Path) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| node_err(format!("path {p:?}: {e}")))
}

/// The mounted cgroup hierarchies: `/sys/fs/cgroup/<name>` for cgroup v1 (and the hybrid
/// layout's `unified`), or `/sys/fs/cgroup` itself for cgroup v2.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.procs").is_file() {
        return vec![root.to_path_buf()];
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").is_file())
        .collect();
    out.sort();
    out
}

/// Every directory of `cgroup` under every hierarchy, deepest first.
fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, out);
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for h in cgroup_hierarchies() {
        let top = h.join(cgroup);
        if top.is_dir() {
            walk(&top, &mut out);
        }
    }
    out
}

/// The processes in `cgroup` (any hierarchy, any depth).
fn cgroup_pids(cgroup: &str) -> BTreeSet<i32> {
    cgroup_dirs(cgroup)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Mount points under `dir`, deepest first (from this process's mount table).
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    out.dedup();
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(oct) = s.get(i + 1..i + 4)
            && let Ok(v) = u8::from_str_radix(oct, 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(&out)))
}

/// The file whose lock a real node holds for its whole life (see [`RealNodeHostLock`]).
pub const REAL_NODE_HOST_LOCK: &str = "/run/envtest-real-node.lock";

/// How long a real node waits for another one on the host to stop before it fails.
pub const REAL_NODE_WAIT: Duration = Duration::from_secs(30 * 60);

/// One real node per host: kube-proxy's iptables chains, the kubelet's host paths
/// (`/var/lib/kubelet/device-plugins`, `/var/log/containers`) and the check that nothing is
/// left are the host's, not the node's. A real node holds an exclusive lock (flock(2)) on
/// [`REAL_NODE_HOST_LOCK`] from before it picks its subnet until everything it made is
/// removed; the file names the holder's process id. The kernel releases the lock when the
/// holder dies, however it dies.
#[derive(Debug)]
pub struct RealNodeHostLock {
    _file: std::fs::File,
}

/// Takes the host's real-node lock ([`REAL_NODE_HOST_LOCK`]), waiting up to `wait` for the
/// real node that holds it to stop; fails naming the holder's process id. A real node takes
/// it by itself; a test that must keep real nodes off the host for a while takes it too.
pub async fn take_real_node_host_lock(wait: Duration) -> Result<RealNodeHostLock, Error> {
    use std::io::{Seek, Write};
    use std::os::fd::AsRawFd;
    let path = REAL_NODE_HOST_LOCK;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(format!("opening {path}")))?;
    let deadline = Instant::now() + wait;
    let mut logged = false;
    loop {
        // SAFETY: flock(2) on a descriptor we own; released when the file is closed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err(format!("locking {path}"))(e));
        }
        let holder = std::fs::read_to_string(path).unwrap_or_default();
        let holder = holder.trim();
        if Instant::now() >= deadline {
            return Err(node_err(format!(
                "another real node runs on this host (process {holder}, holding {path}); \
                 waited {wait:?} for it to stop"
            )));
        }
        if !logged {
            tracing::warn!(
                holder,
                lock = path,
                "waiting for the host's other real node to stop"
            );
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.set_len(0)
        .and_then(|_| f.rewind())
        .and_then(|_| writeln!(f, "{}", std::process::id()))
        .map_err(io_err(format!("writing {path}")))?;
    Ok(RealNodeHostLock { _file: f })
}

/// The first `K` whose subnet `10.199.K.0/24` no interface of the host uses.
fn free_subnet() -> Result<u8, Error> {
    let addrs = run(Command::new("ip").args(["-4", "-o", "addr", "show"]))?;
    (0..=255u8)
        .find(|k| {
            let prefix = format!(" 10.199.{k}.");
            !addrs.contains(&prefix)
        })
        .ok_or_else(|| node_err("no free subnet in 10.199.0.0/16 for the real node's pods"))
}

impl RealNode {
    /// Takes the host's lock and makes the node's network: its bridge, with the node's
    /// address ([`RealNodeInfo::node_ip`]) on it, and the route of the Services' ClusterIPs.
    /// Done before the control plane starts, so that the API server can listen on the
    /// node's address, which the pods reach. [`RealNode::start`] runs the rest.
    pub(crate) async fn prepare(inputs: NodeInputs<'_>) -> Result<RealNode, Error> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(node_err(
                "a real node needs root (containerd, runc, cgroups, network devices)",
            ));
        }
        let build = format!(
            "make node (or: hack/node/build.sh {} && hack/node/images.sh)",
            inputs.version.minor_tag()
        );
        let node_bin = inputs.bin_root.join(format!("node-{}", inputs.version));
        let kubelet = require_file(node_bin.join("kubelet"), &build)?;
        let kube_proxy = require_file(node_bin.join("kube-proxy"), &build)?;
        require_iptables()?;
        let rt_bin = inputs.bin_root.join(versions::containerd_dir_name()?);
        let containerd = require_file(rt_bin.join("containerd"), &build)?;
        let ctr = require_file(rt_bin.join("ctr"), &build)?;
        let runc = require_file(rt_bin.join("runc"), &build)?;
        require_file(rt_bin.join("containerd-shim-runc-v2"), &build)?;
        for plugin in ["bridge", "host-local", "loopback", "portmap"] {
            require_file(rt_bin.join("cni").join(plugin), &build)?;
        }
        let images = inputs.bin_root.join("node-images");
        let names = std::fs::read_to_string(require_file(images.join("names"), &build)?)
            .map_err(io_err("reading bin/node-images/names"))?;
        let image = |which: &str| {
            names
                .lines()
                .find_map(|l| l.strip_prefix(which)?.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| node_err(format!("bin/node-images/names names no {which} image")))
        };
        let (pause_image, memcached_image) = (image("pause")?, image("memcached")?);
        let tls_agent_image = image("tls-agent")?;
        let exporter_image = image("exporter")?;
        // The operator's image has a name file of its own (hack/node/images.sh builds it
        // apart from the others).
        let operator_image =
            std::fs::read_to_string(require_file(images.join("operator.name"), &build)?)
                .map_err(io_err("reading bin/node-images/operator.name"))?
                .trim()
                .to_string();
        let tarballs = [
            require_file(images.join("pause.tar"), &build)?,
            require_file(images.join("memcached.tar"), &build)?,
            require_file(images.join("tls-agent.tar"), &build)?,
            require_file(images.join("exporter.tar"), &build)?,
            require_file(images.join("operator.tar"), &build)?,
        ];

        // The kubelet's and containerd's mounts must propagate (kind's entrypoint does this).
        // SAFETY: mount(2) with static C strings; changes only the propagation of `/`.
        if unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SHARED,
                std::ptr::null(),
            )
        } != 0
        {
            return Err(io_err("making / a shared mount")(
                std::io::Error::last_os_error(),
            ));
        }

        let id = format!("{}-{}", std::process::id(), process::next_id());
        let dir = inputs.dir.join("node");
        // Sockets: containerd's shims want a directory of at most 42 characters.
        let run_dir = PathBuf::from(format!("/run/envtest-{id}"));
        let cgroup = format!("envtest-{id}");
        let host = take_real_node_host_lock(REAL_NODE_WAIT).await?;
        sweep_dead_nodes(&kube_proxy);
        let chains = kube_chains();
        if !chains.is_empty() {
            return Err(node_err(format!(
                "the host has iptables chains of a kube-proxy or kubelet that is not a real \
                 node's ({}); a real node's kube-proxy would take them over and remove them \
                 when it stops. If they are left by a test, `kube-proxy --cleanup` removes \
                 them",
                chains.join(", ")
            )));
        }
        let k = free_subnet()?;
        let node_ip = Ipv4Addr::new(10, 199, k, 1);
        let mut node = RealNode {
            info: RealNodeInfo {
                name: REAL_NODE_NAME.to_string(),
                memcached_image,
                tls_agent_image,
                exporter_image,
                operator_image,
                pause_image,
                node_ip,
                pod_subnet: format!("10.199.{k}.0/24"),
                // Unique to this node (at most 15 characters: a network device's name).
                bridge: format!("et{id}"),
                cgroup: cgroup.clone(),
                dirs: vec![dir.clone(), run_dir.clone()],
            },
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            kube_proxy_bin: Some(kube_proxy.clone()),
            pending: None,
            _host: Some(host),
        };
        // From here on, dropping `node` removes whatever was made; and should this process
        // die without dropping it, the next real node removes it (see `sweep_dead_nodes`).
        std::fs::create_dir_all(&run_dir)
            .map_err(io_err(format!("creating {}", run_dir.display())))?;
        node.write_record(&run_dir)?;
        let bridge = node.info.bridge.clone();
        run(Command::new("ip").args(["link", "add", &bridge, "type", "bridge"]))?;
        run(Command::new("ip").args(["addr", "add", &format!("{node_ip}/24"), "dev", &bridge]))?;
        run(Command::new("ip").args(["link", "set", &bridge, "up"]))?;
        // ClusterIPs through the bridge, so that the host reaches them without a default
        // route (kube-proxy's DNAT then sends them to a pod); gone with the bridge.
        run(Command::new("ip").args([
            "route",
            "add",
            crate::SERVICE_CIDR,
            "dev",
            &bridge,
            "src",
            &node_ip.to_string(),
        ]))?;
        node.pending = Some(Pending {
            kubelet,
            containerd,
            ctr,
            runc,
            rt_bin,
            tarballs: tarballs.to_vec(),
            dir,
            run_dir,
            tainted: inputs.tainted,
        });
        Ok(node)
    }

    /// Starts containerd, the kubelet (with `kubeconfig` and the cluster CA `ca_crt`) and
    /// kube-proxy on the prepared node, and waits until the node is Ready.
    pub(crate) async fn start(
        &mut self,
        kubeconfig: &Path,
        ca_crt: &Path,
        client: &Client,
    ) -> Result<(), Error> {
        let Pending {
            kubelet,
            containerd,
            ctr,
            runc,
            rt_bin,
            tarballs,
            dir,
            run_dir,
            tainted,
        } = self
            .pending
            .take()
            .ok_or_else(|| node_err("the real node was started twice"))?;
        let node = self;
        let cgroup = node.info.cgroup.clone();
        let bridge = node.info.bridge.clone();
        let node_ip = node.info.node_ip;
        for d in [&dir, &run_dir] {
            std::fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
        }
        for h in cgroup_hierarchies() {
            let mut parent = h.clone();
            for d in [h.join(&cgroup), h.join(&cgroup).join("runtime")] {
                std::fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
                // cgroup v1's cpuset starts empty (no process may join): the parent's CPUs
                // and memory nodes, as the kubelet gives its own cgroups.
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    if let Ok(v) = std::fs::read_to_string(parent.join(f))
                        && std::fs::read_to_string(d.join(f)).is_ok_and(|c| c.trim().is_empty())
                    {
                        std::fs::write(d.join(f), v.trim())
                            .map_err(io_err(format!("writing {}", d.join(f).display())))?;
                    }
                }
                parent = d;
            }
        }
        let write = |name: &str, contents: String| -> Result<PathBuf, Error> {
            let p = dir.join(name);
            std::fs::write(&p, contents).map_err(io_err(format!("writing {}", p.display())))?;
            Ok(p)
        };
        let cni_conf = dir.join("cni");
        std::fs::create_dir_all(&cni_conf).map_err(io_err("creating the CNI config dir"))?;
        let conflist = json!({
            "cniVersion": "1.0.0",
            // The CNI network is named as the bridge: its cache entries in /var/lib/cni are
            // `<name>-<sandbox>-<ifname>`.
            "name": bridge,
            "plugins": [
                {
                    "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": dir.join("ipam").display().to_string(),
                        "ranges": [[{"subnet": node.info.pod_subnet, "gateway": node_ip.to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        write("cni/10-envtest.conflist", conflist.to_string())?;

        let sock = run_dir.join("containerd.sock");
        let containerd_toml = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
# Nothing of containerd's outside these directories: no NRI socket in /run/nri.
disabled_plugins = ["io.containerd.nri.v1.nri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{run}/s"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which a test machine may
  # not grant: the pods' scores are kept at or above containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      Root = "{run}/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            root = dir.join("containerd").display(),
            state = run_dir.join("state").display(),
            sock = sock.display(),
            run = run_dir.display(),
            pause = node.info.pause_image,
            runc = runc.display(),
            cni_bin = rt_bin.join("cni").display(),
            cni_conf = cni_conf.display(),
        );
        let containerd_config = write("containerd.toml", containerd_toml)?;
        // containerd finds its shim on PATH.
        let path = {
            let mut p = OsString::from(rt_bin.as_os_str());
            if let Some(old) = std::env::var_os("PATH") {
                p.push(":");
                p.push(old);
            }
            p
        };
        let containerd_proc = Process::spawn_with_env(
            "containerd",
            &containerd,
            &[format!("--config={}", containerd_config.display())],
            &dir,
            &[("PATH", path.clone())],
        )?;
        // Into the node's cgroup before it starts any shim: the shims and the containers
        // they start are then found (and stopped) there.
        if let (_, Some(pid)) = containerd_proc.pid() {
            for h in cgroup_hierarchies() {
                let procs = h.join(&cgroup).join("runtime").join("cgroup.procs");
                std::fs::write(&procs, pid.to_string()).map_err(io_err(format!(
                    "moving containerd into {}",
                    procs.display()
                )))?;
            }
        }
        node.containerd = Some(containerd_proc);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            node.check_alive()?;
            if Instant::now() > deadline {
                return Err(node.component_error(&dir, "containerd", "did not open its socket"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // cAdvisor's containerd, unless the host has its own there (then the series of
        // this node's containers are unlabelled). A link to a socket gone is a dead node's.
        if std::fs::read_link(CADVISOR_CONTAINERD_SOCK).is_ok_and(|t| !t.exists()) {
            let _ = std::fs::remove_file(CADVISOR_CONTAINERD_SOCK);
        }
        if std::fs::symlink_metadata(CADVISOR_CONTAINERD_SOCK).is_err() {
            let link = Path::new(CADVISOR_CONTAINERD_SOCK);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io_err("creating cAdvisor's containerd directory"))?;
            }
            std::os::unix::fs::symlink(&sock, link)
                .map_err(io_err("linking cAdvisor's containerd socket"))?;
        }
        for tarball in &tarballs {
            run(Command::new(&ctr)
                .arg(format!("--address={}", sock.display()))
                .args(["--namespace=k8s.io", "images", "import"])
                .arg(tarball))?;
        }

        let port = TcpListener::bind((node_ip, 0))
            .and_then(|l| l.local_addr())
            .map_err(io_err("binding a free port on the node's address"))?
            .port();
        let mut kubelet_config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // The API server calls the kubelet (logs, exec) with the admin's certificate.
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": ca_crt.display().to_string()},
            },
            "authorization": {"mode": "Webhook"},
            "address": node_ip.to_string(),
            "port": port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "containerRuntimeEndpoint": format!("unix://{}", sock.display()),
            // cgroup v1 (this machine kind's hybrid layout) is deprecated, not refused.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{cgroup}"),
            "failSwapOn": false,
            "podLogsDir": dir.join("pod-logs").display().to_string(),
            "resolvConf": "/etc/resolv.conf",
            // No iptables chains of the kubelet's on the host (KUBE-FIREWALL, canaries).
            "makeIPTablesUtilChains": false,
            // The images are imported, not pulled: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            // A test machine's disk is often fuller than the default 10 % threshold.
            "evictionHard": {
                "memory.available": "100Mi", "nodefs.available": "1%",
                "nodefs.inodesFree": "1%", "imagefs.available": "1%",
            },
        });
        if tainted {
            kubelet_config["registerWithTaints"] =
                json!([{"key": REAL_NODE_KEY, "effect": "NoSchedule"}]);
        }
        let kubelet_yaml = write("kubelet.yaml", kubelet_config.to_string())?;
        node.kubelet = Some(Process::spawn_with_env(
            "kubelet",
            &kubelet,
            &[
                format!("--config={}", kubelet_yaml.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                format!("--hostname-override={REAL_NODE_NAME}"),
                format!("--node-ip={node_ip}"),
                format!("--node-labels={REAL_NODE_KEY}=true"),
            ],
            &dir,
            &[("PATH", path.clone())],
        )?);
        node.wait_ready(client, &dir).await?;
        let kube_proxy = node
            .kube_proxy_bin
            .clone()
            .ok_or_else(|| node_err("no kube-proxy binary"))?;
        node.start_kube_proxy(&kube_proxy, kubeconfig, &dir, &path)
            .await?;
        Ok(())
    }

    /// Starts kube-proxy in iptables mode for the node's pods and waits until it has
    /// programmed the host once (its `/healthz` answers 200). Its chains are global on the
    /// host: [`RealNode::stop`] removes them.
    async fn start_kube_proxy(
        &mut self,
        kube_proxy: &Path,
        kubeconfig: &Path,
        dir: &Path,
        path: &OsString,
    ) -> Result<(), Error> {
        let free_port = || {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(io_err("binding a free loopback port"))
        };
        let healthz = free_port()?;
        let metrics = free_port()?;
        let config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "hostnameOverride": self.info.name,
            "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
            // Traffic from the node's pods is local; any other is masqueraded to the node.
            "clusterCIDR": self.info.pod_subnet,
            "detectLocalMode": "ClusterCIDR",
            "healthzBindAddress": format!("127.0.0.1:{healthz}"),
            "metricsBindAddress": format!("127.0.0.1:{metrics}"),
            // NodePorts on the node's address only, not on every address of the host.
            "nodePortAddresses": [format!("{}/32", self.info.node_ip)],
            // No sysctl of the host changed: not `route_localnet` (NodePorts on loopback),
            // not conntrack's table size or timeouts (0: leave them as they are).
            "iptables": {"localhostNodePorts": false, "syncPeriod": "30s", "minSyncPeriod": "1s"},
            "conntrack": {
                "maxPerCore": 0, "min": 0,
                "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
            },
        });
        let file = dir.join("kube-proxy.yaml");
        std::fs::write(&file, config.to_string())
            .map_err(io_err(format!("writing {}", file.display())))?;
        self.kube_proxy = Some(Process::spawn_with_env(
            "kube-proxy",
            kube_proxy,
            &[format!("--config={}", file.display())],
            dir,
            &[("PATH", path.clone())],
        )?);
        let deadline = Instant::now() + REAL_NODE_START_TIMEOUT;
        loop {
            self.check_alive()?;
            if http_status(healthz, "/healthz").is_some_and(|s| s == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.component_error(
                    dir,
                    "kube-proxy",
                    &format!("did not program the host within {REAL_NODE_START_TIMEOUT:?}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What the node makes on the host, in `<run_dir>/node`, for [`sweep_dead_nodes`].
    fn write_record(&self, run_dir: &Path) -> Result<(), Error> {
        let mut record = format!(
            "name {}\nmemcached {}\ntls-agent {}\nexporter {}\noperator {}\npause {}\nnode-ip {}\nsubnet {}\nbridge {}\ncgroup {}\n",
            self.info.name,
            self.info.memcached_image,
            self.info.tls_agent_image,
            self.info.exporter_image,
            self.info.operator_image,
            self.info.pause_image,
            self.info.node_ip,
            self.info.pod_subnet,
            self.info.bridge,
            self.info.cgroup
        );
        for d in &self.info.dirs {
            record.push_str(&format!("dir {}\n", d.display()));
        }
        let p = run_dir.join("node");
        std::fs::write(&p, record).map_err(io_err(format!("writing {}", p.display())))
    }

    pub(crate) fn info(&self) -> &RealNodeInfo {
        &self.info
    }

    fn check_alive(&mut self) -> Result<(), Error> {
        for p in [
            self.containerd.as_mut(),
            self.kubelet.as_mut(),
            self.kube_proxy.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            p.check_alive()?;
        }
        Ok(())
    }

    fn component_error(&self, dir: &Path, component: &str, problem: &str) -> Error {
        let log = dir.join(format!("{component}.log"));
        Error::Component {
            component: component.to_string(),
            problem: problem.to_string(),
            tail: process::tail(&log, 30),
            log,
        }
    }

    async fn wait_ready(&mut self, client: &Client, dir: &Path) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + REAL_NODE_START_TIMEOUT;
        loop {
            self.check_alive()?;
            let ready = nodes
                .get_opt(REAL_NODE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status?.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.component_error(
                    dir,
                    "kubelet",
                    &format!("did not register a Ready node within {REAL_NODE_START_TIMEOUT:?}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the node and removes everything it made (see the module docs).
    pub(crate) fn stop(&mut self) {
        if let Some(mut p) = self.kube_proxy.take() {
            p.kill();
        }
        if let Some(mut k) = self.kubelet.take() {
            k.kill();
        }
        if let Some(mut c) = self.containerd.take() {
            c.kill();
        }
        // The shims and every container: killed until the cgroup is empty.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pids = cgroup_pids(&self.info.cgroup);
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) on a process of the node's own cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The sandboxes' ids name their CNI cache entries.
        let sandboxes: Vec<String> = self
            .info
            .dirs
            .iter()
            .map(|d| d.join("state/io.containerd.runtime.v2.task/k8s.io"))
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        // Network namespaces, root filesystems, shm, the kubelet's volumes.
        for d in &self.info.dirs {
            for m in mounts_under(d) {
                if let Ok(c) = cstring(&m) {
                    // SAFETY: umount2(2) of a mount point under the node's own directory.
                    unsafe {
                        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                    }
                }
            }
        }
        // kube-proxy's chains (its own `--cleanup`), then any KUBE-* chain it left (its
        // `--cleanup` of v1.37.2 leaves `KUBE-FIREWALL` and the jumps to it from INPUT and
        // OUTPUT; the kubelet makes none, `makeIPTablesUtilChains: false`): with the host's
        // lock held, every one of them is this node's.
        if let Some(kube_proxy) = &self.kube_proxy_bin {
            match Command::new(kube_proxy).arg("--cleanup").output() {
                Ok(out) if !out.status.success() => tracing::warn!(
                    status = %out.status,
                    stderr = %String::from_utf8_lossy(&out.stderr),
                    "kube-proxy --cleanup failed"
                ),
                Err(e) => tracing::warn!(error = %e, "running kube-proxy --cleanup"),
                Ok(_) => {}
            }
        }
        remove_kube_chains();
        // The veths went with their namespaces; the bridge is the node's own.
        let _ = Command::new("ip")
            .args(["link", "del", &self.info.bridge])
            .output();
        for e in std::fs::read_dir(CNI_CACHE).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.starts_with(&format!("{}-", self.info.bridge))
                || sandboxes
                    .iter()
                    .any(|id| name == format!("cni-loopback-{id}-lo"));
            if ours {
                let _ = std::fs::remove_file(e.path());
            }
        }
        for e in std::fs::read_dir(CONTAINER_LOG_LINKS)
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(target) = std::fs::read_link(e.path())
                && self.info.dirs.iter().any(|d| target.starts_with(d))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if let Ok(target) = std::fs::read_link(CADVISOR_CONTAINERD_SOCK)
            && self.info.dirs.iter().any(|d| target.starts_with(d))
        {
            let _ = std::fs::remove_file(CADVISOR_CONTAINERD_SOCK);
            // The directory too, if the node made it (nothing else is in it).
            let _ = Path::new(CADVISOR_CONTAINERD_SOCK)
                .parent()
                .map(std::fs::remove_dir);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let dirs = cgroup_dirs(&self.info.cgroup);
            if dirs.is_empty() || Instant::now() > deadline {
                break;
            }
            for d in dirs {
                let _ = std::fs::remove_dir(d);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for d in &self.info.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Removes what the real nodes of test binaries that died without stopping them left (a
/// killed binary takes containerd and the kubelet with it, by their parent-death signal,
/// but not the shims and containers): every `/run/envtest-<pid>-<n>/node` record whose
/// process is gone.
fn sweep_dead_nodes(kube_proxy: &Path) {
    for e in std::fs::read_dir("/run").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("envtest-")
            .and_then(|id| id.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        if alive {
            continue;
        }
        if let Some(info) = real_node_record(&e.path().join("node")) {
            tracing::warn!(record = %e.path().display(), "removing the real node of a test binary that died");
            drop(RealNode {
                info,
                kube_proxy: None,
                kubelet: None,
                containerd: None,
                kube_proxy_bin: Some(kube_proxy.to_path_buf()),
                pending: None,
                _host: None,
            });
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The real node a test binary recorded in `/run/envtest-<pid>-<n>/node` (for a test of
/// what a killed binary leaves).
pub fn real_node_record(path: &Path) -> Option<RealNodeInfo> {
    let text = std::fs::read_to_string(path).ok()?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .map(str::to_string)
    };
    Some(RealNodeInfo {
        name: field("name")?,
        memcached_image: field("memcached")?,
        // Not in the records of nodes from before the agent's (the operator's) image.
        tls_agent_image: field("tls-agent").unwrap_or_default(),
        exporter_image: field("exporter").unwrap_or_default(),
        operator_image: field("operator").unwrap_or_default(),
        pause_image: field("pause")?,
        node_ip: field("node-ip")?.parse().ok()?,
        pod_subnet: field("subnet")?,
        bridge: field("bridge")?,
        cgroup: field("cgroup")?,
        dirs: text
            .lines()
            .filter_map(|l| l.strip_prefix("dir "))
            .map(PathBuf::from)
            .collect(),
    })
}

/// What is left on the host of a stopped node: processes in its cgroup, its cgroups, mounts
/// under its directories, its bridge, its directories, and (when no real node runs) any
/// KUBE-* iptables chain. Empty once it is gone.
pub fn leftovers(info: &RealNodeInfo) -> Vec<String> {
    let mut out = Vec::new();
    let pids = cgroup_pids(&info.cgroup);
    if !pids.is_empty() {
        out.push(format!("processes in cgroup {}: {pids:?}", info.cgroup));
    }
    for d in cgroup_dirs(&info.cgroup) {
        out.push(format!("cgroup {}", d.display()));
    }
    for d in &info.dirs {
        for m in mounts_under(d) {
            out.push(format!("mount {}", m.display()));
        }
        if d.exists() {
            out.push(format!("directory {}", d.display()));
        }
    }
    if Path::new("/sys/class/net").join(&info.bridge).exists() {
        out.push(format!("network device {}", info.bridge));
    }
    for e in std::fs::read_dir(CNI_CACHE).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{}-", info.bridge)) {
            out.push(format!("CNI cache entry {}", e.path().display()));
        }
    }
    for e in std::fs::read_dir(CONTAINER_LOG_LINKS)
        .into_iter()
        .flatten()
        .flatten()
    {
        if std::fs::read_link(e.path()).is_ok_and(|t| info.dirs.iter().any(|d| t.starts_with(d))) {
            out.push(format!("log link {}", e.path().display()));
        }
    }
    if std::fs::read_link(CADVISOR_CONTAINERD_SOCK)
        .is_ok_and(|t| info.dirs.iter().any(|d| t.starts_with(d)))
    {
        out.push(format!("link {CADVISOR_CONTAINERD_SOCK}"));
    }
    // The host's KUBE-* chains are the running real node's while one holds the host's
    // lock: they are counted only when none does.
    if !host_lock_held() {
        for chain in kube_chains() {
            out.push(format!("KUBE-* chain: {chain}"));
        }
    }
    // Any process that names the node's directories (a shim outside the cgroup, say).
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if info
            .dirs
            .iter()
            .any(|d| cmdline.contains(&d.display().to_string()))
        {
            out.push(format!(
                "process {}: {cmdline}",
                e.file_name().to_string_lossy()
            ));
        }
    }
    out
}

/// Whether a real node (of any process, this one included) holds the host's lock now.
fn host_lock_held() -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(REAL_NODE_HOST_LOCK) else {
        return false;
    };
    // SAFETY: flock(2) on a descriptor we own; released when it is closed, at once.
    let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    !free
}

/// kube-proxy in iptables mode runs `iptables`, `iptables-save` and `iptables-restore`.
fn require_iptables() -> Result<(), Error> {
    for tool in ["iptables", "iptables-save", "iptables-restore"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(node_err(format!(
                    "`{tool} --version` failed ({}): {}; kube-proxy (iptables mode) needs \
                     Debian's iptables: apt-get install iptables",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Err(e) => {
                return Err(node_err(format!(
                    "{tool}: {e}; kube-proxy (iptables mode) needs Debian's iptables: \
                     apt-get install iptables"
                )));
            }
        }
    }
    Ok(())
}

/// The iptables families whose tables are looked at for KUBE-* chains.
const IPTABLES: [(&str, &str); 2] = [
    ("iptables", "iptables-save"),
    ("ip6tables", "ip6tables-save"),
];

/// Every `KUBE-*` chain of the host, as `iptables <table> <chain>` (and `ip6tables ...`).
fn kube_chains() -> Vec<String> {
    let mut out = Vec::new();
    for (family, save) in IPTABLES {
        let Ok(dump) = Command::new(save).output() else {
            continue;
        };
        let mut table = "";
        for line in std::str::from_utf8(&dump.stdout)
            .unwrap_or_default()
            .lines()
        {
            if let Some(t) = line.strip_prefix('*') {
                table = t;
            } else if let Some(chain) = line.strip_prefix(':')
                && chain.starts_with("KUBE-")
            {
                let name = chain.split(' ').next().unwrap_or(chain);
                out.push(format!("{family} -t {table} {name}"));
            }
        }
    }
    out
}

/// Removes every `KUBE-*` chain of the host and the rules that jump to them (what
/// `kube-proxy --cleanup` leaves, `KUBE-FIREWALL`, or all of them when it could not run).
fn remove_kube_chains() {
    for (family, save) in IPTABLES {
        let Ok(dump) = Command::new(save).output() else {
            continue;
        };
        let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
        let mut table = String::new();
        let mut jumps = Vec::new();
        let mut chains = Vec::new();
        for line in dump.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = t.to_string();
            } else if let Some(chain) = line.strip_prefix(':')
                && chain.starts_with("KUBE-")
            {
                let name = chain.split(' ').next().unwrap_or(chain).to_string();
                chains.push((table.clone(), name));
            } else if let Some(rule) = line.strip_prefix("-A ")
                && !rule.starts_with("KUBE-")
                && rule.contains(" -j KUBE-")
            {
                jumps.push((table.clone(), rule.to_string()));
            }
        }
        for (table, rule) in jumps {
            // iptables-save quotes arguments with spaces (comments): let a shell split them.
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("{family} -w -t {table} -D {rule}"))
                .output();
        }
        for (table, chain) in &chains {
            let _ = Command::new(family)
                .args(["-w", "-t", table, "-F", chain])
                .output();
        }
        for (table, chain) in &chains {
            let _ = Command::new(family)
                .args(["-w", "-t", table, "-X", chain])
                .output();
        }
    }
}

/// The HTTP status of `GET path` on `127.0.0.1:port`, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    std::str::from_utf8(&head[..n])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}
