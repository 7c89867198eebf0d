//! The `memcached-operator` binary: `run` (the controller against a cluster), `crd` (print
//! the CRD) and `demo` (everything in-process against the in-memory API server).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use memcached_operator::builders::BuildSettings;
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::{crd, demo};
use tracing::{error, info};

#[derive(Parser, Debug)]
#[command(
    name = "memcached-operator",
    version,
    about = "A Kubernetes operator for Memcached"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller against the current kubeconfig or in-cluster config.
    Run(RunArgs),
    /// Print the Memcached CustomResourceDefinition as YAML.
    Crd,
    /// Write the Kubebuilder-style config/ tree (CRD, RBAC, manager, webhook, ...) from code.
    Manifests {
        /// Directory to write into.
        #[arg(long, default_value = "config")]
        dir: std::path::PathBuf,
    },
    /// Run the operator against the in-memory API server: apply the seed sample, scale it,
    /// repair drift and delete it, printing what happens.
    Demo {
        /// Longest wait for any one step, in seconds.
        #[arg(long, default_value_t = 60)]
        step_timeout: u64,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Namespace to watch (repeatable); all namespaces when absent.
    #[arg(long = "namespace", env = "WATCH_NAMESPACE", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Image for Memcacheds that do not name one.
    #[arg(long, env = "MEMCACHED_IMAGE", default_value = memcached_api::DEFAULT_IMAGE)]
    memcached_image: String,
    /// Reconciles running at once (never two for the same object).
    #[arg(long, default_value_t = 4)]
    max_concurrent_reconciles: u16,
    /// Seconds between re-checks of converged objects.
    #[arg(long, default_value_t = 300)]
    resync_period: u64,
}

fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

async fn run(args: RunArgs) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot load a kubeconfig or in-cluster config: {e}"))?;
    let namespaces: Vec<Option<String>> = if args.namespaces.is_empty() {
        vec![None]
    } else {
        args.namespaces.into_iter().map(Some).collect()
    };
    for ns in &namespaces {
        crd::check_installed(&client, ns.as_deref())
            .await
            .map_err(|e| e.to_string())?;
    }
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut controllers = Vec::new();
    for namespace in namespaces {
        info!(
            namespace = namespace.as_deref().unwrap_or("<all>"),
            "starting controller"
        );
        let config = ControllerConfig {
            namespace,
            build: BuildSettings {
                default_image: args.memcached_image.clone(),
            },
            concurrency: args.max_concurrent_reconciles,
            resync: Duration::from_secs(args.resync_period),
            instance: std::env::var("POD_NAME").ok(),
            ..ControllerConfig::default()
        };
        let mut stop = stop_tx.subscribe();
        controllers.push(tokio::spawn(controller::run(
            client.clone(),
            config,
            async move {
                let _ = stop.recv().await;
            },
        )));
    }
    shutdown_signal().await;
    info!("shutting down: letting in-flight reconciles finish");
    let _ = stop_tx.send(());
    for c in controllers {
        let _ = tokio::time::timeout(Duration::from_secs(30), c).await;
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
            return;
        }
    }
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Manifests { dir } => match memcached_operator::manifests::write(&dir) {
            Ok(written) => {
                for path in &written {
                    println!("wrote {}", dir.join(path).display());
                }
                if written.is_empty() {
                    println!("{} is up to date", dir.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Crd => match crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Demo { step_timeout } => {
            // The demo narrates; the operator's own logs are there with RUST_LOG=info.
            init_logging("warn");
            match demo::run(std::io::stdout(), Duration::from_secs(step_timeout)).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            init_logging("info");
            match run(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e}");
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
