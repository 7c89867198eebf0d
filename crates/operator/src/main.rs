//! The `memcached-operator` binary: `run` (the controller against a cluster), `crd` (print
//! the CRD) and `tls-reload-agent` (the sidecar in memcached pods). What the image ships;
//! the generators (`crates/gen`) and the demo (`crates/demo`) are binaries of their own.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use memcached_operator::{cmd, crd, tls_agent};
use tracing::error;

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
    Run(Box<cmd::RunArgs>),
    /// Print the Memcached CustomResourceDefinition as YAML.
    Crd,
    // Pools created by releases before 0.2.0 run the agent as this subcommand of the
    // operator's image they were created with (an upgrade keeps their agent as it runs:
    // controller::rollout); new pools run the agent's own image. The agent itself is the
    // memcached-tls-agent crate.
    /// The TLS reload agent (a sidecar in memcached pods): has memcached load a renewed
    /// certificate in place when the mounted files change.
    TlsReloadAgent(tls_agent::AgentArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The agent needs no async runtime (one blocking loop, a few MiB).
    if let Command::TlsReloadAgent(args) = cli.command {
        return tls_agent::run(args);
    }
    let mut runtime = match &cli.command {
        Command::Run(args) if args.worker_threads == 0 => {
            tokio::runtime::Builder::new_current_thread()
        }
        Command::Run(args) => {
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.worker_threads(usize::from(args.worker_threads));
            runtime
        }
        // `crd` does no async work.
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let run = matches!(cli.command, Command::Run(_));
    match runtime.enable_all().build() {
        Ok(runtime) => {
            let code = runtime.block_on(command(cli.command));
            if run {
                // `run` exits at once: what still runs is dropped, blocking work (a DNS
                // lookup) included, not waited for (a leader that lost its Lease must stop
                // writing before another replica takes it over).
                runtime.shutdown_background();
            }
            code
        }
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn command(command: Command) -> ExitCode {
    match command {
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
        Command::TlsReloadAgent(args) => tls_agent::run(args),
        Command::Run(args) => match cmd::run(*args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("{e}");
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
