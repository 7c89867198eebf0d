//! A cluster for people without one: the pinned control plane with kwok's fake nodes, kept
//! running until interrupted, with its admin kubeconfig written where asked.
//!
//! ```sh
//! make dev-cluster        # in the background; make dev-cluster-down stops it
//! dev-cluster --kube newest --nodes 3 --kubeconfig bin/dev-cluster.kubeconfig
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use envtest::{ControlPlane, Kube, Options};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Which {
    Oldest,
    Newest,
}

#[derive(Parser, Debug)]
#[command(
    about = "Run the pinned Kubernetes control plane with kwok's fake nodes until interrupted"
)]
struct Args {
    /// Which pinned Kubernetes version.
    #[arg(long, value_enum, default_value = "newest")]
    kube: Which,
    /// Fake nodes (zones zone-a, zone-b, zone-c in turn).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Where to write the admin kubeconfig (written once the cluster is ready).
    #[arg(long, default_value = "bin/dev-cluster.kubeconfig")]
    kubeconfig: PathBuf,
    /// Where to link the API server's audit log (every request, metadata level: what
    /// `memcached-operator bench --audit-log` counts).
    #[arg(long, default_value = "bin/dev-cluster.audit.log")]
    audit_log: PathBuf,
    /// Also a real node (containerd and the pinned kubelet, built by `make node`; needs
    /// root). With `--nodes 0` it is the only node and runs every pod; beside kwok nodes,
    /// only the pods that tolerate the taint `envtest/real-node`.
    #[arg(long)]
    real_node: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dev-cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let kube = match args.kube {
            Which::Oldest => Kube::Oldest,
            Which::Newest => Kube::Newest,
        };
        let cp = match ControlPlane::start(Options {
            nodes: args.nodes,
            real_node: args.real_node,
            ..Options::new(kube)
        })
        .await
        {
            Ok(cp) => cp,
            Err(e) => {
                eprintln!("dev-cluster: {e}");
                return ExitCode::FAILURE;
            }
        };
        let kubeconfig = std::env::current_dir()
            .map(|d| d.join(&args.kubeconfig))
            .unwrap_or_else(|_| args.kubeconfig.clone());
        println!(
            "Kubernetes {} at {} with {} kwok nodes (started in {:.1?}); logs in {}\n\
             export KUBECONFIG={} PATH={}:$PATH",
            cp.version(),
            cp.url(),
            args.nodes,
            cp.started_in(),
            cp.dir().display(),
            kubeconfig.display(),
            cp.bin_dir().display(),
        );
        if let Some(node) = cp.real_node() {
            let which = if args.nodes == 0 {
                "every pod runs there".to_string()
            } else {
                format!(
                    "pods that tolerate the taint {}:NoSchedule run there",
                    envtest::REAL_NODE_KEY
                )
            };
            println!(
                "real node {} at {} (pods on {}; {which})\n\
                 memcached image: {}\n\
                 tls-agent image: {}\n\
                 exporter image: {}\n\
                 operator image: {}",
                node.name,
                node.node_ip,
                node.pod_subnet,
                node.memcached_image,
                node.tls_agent_image,
                node.exporter_image,
                node.operator_image,
            );
        }
        let _ = std::fs::remove_file(&args.audit_log);
        if let Err(e) = std::os::unix::fs::symlink(cp.audit_log(), &args.audit_log) {
            eprintln!("dev-cluster: linking {}: {e}", args.audit_log.display());
        }
        // Written last: its appearance tells `make dev-cluster` the cluster is ready.
        let partial = kubeconfig.with_extension("partial");
        if let Err(e) = std::fs::copy(cp.kubeconfig(), &partial)
            .and_then(|_| std::fs::rename(&partial, &kubeconfig))
        {
            eprintln!("dev-cluster: writing {}: {e}", kubeconfig.display());
            return ExitCode::FAILURE;
        }
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("dev-cluster: {e}");
                    return ExitCode::FAILURE;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = std::fs::remove_file(&kubeconfig);
        let _ = std::fs::remove_file(&args.audit_log);
        drop(cp);
        println!("dev-cluster stopped");
        ExitCode::SUCCESS
    })
}
