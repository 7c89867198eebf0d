//! `bench`: the benchmarks of memcached-operator, kept out of the shipped binary.
//!
//! - `bench operator`: the operator against the fewest API writes that do its job (the
//!   raw-write bound), its steady state, latency and memory, on the in-memory API server
//!   or a real cluster.
//! - `bench side-by-side`: the operator and the seeds' Go operator (`bench/peer`, on
//!   controller-runtime) on the same real control plane, with the same Memcacheds.
//!
//! Results and commands: BENCHMARKS.md.
//!
//! This file also holds what both share at the root: the error type, progress logging and
//! namespace creation; `measure` has their measurements and number formatting.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

mod latency;
mod measure;
mod operator;
mod side_by_side;

#[derive(Parser)]
#[command(name = "bench", about = "Benchmarks of memcached-operator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convergence against the raw-write bound, steady-state requests, latency and memory
    /// (the in-memory API server, or a cluster with --kubeconfig).
    Operator(Box<operator::BenchArgs>),
    /// The operator and the seeds' Go operator side by side on a real control plane.
    SideBySide(Box<side_by_side::Args>),
    /// The proxy's hop and the webhook's admission with its children's dry run.
    Latency(latency::Args),
}

/// `name` next to this binary (cargo builds every binary of the workspace into one
/// directory), for the contenders run as processes.
pub(crate) fn sibling_binary(
    name: &str,
) -> Result<PathBuf, Box<dyn std::error::Error + Send + Sync>> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    if !path.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release -p memcached-operator` (or pass its path)",
            path.display()
        )
        .into());
    }
    Ok(path)
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T, E = BoxError> = std::result::Result<T, E>;

pub(crate) fn log(msg: impl AsRef<str>) {
    eprintln!(
        "[bench {}] {}",
        jiff::Timestamp::now().strftime("%H:%M:%S"),
        msg.as_ref()
    );
}

pub(crate) async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Operator(args) => operator::run(*args).await,
            Command::SideBySide(args) => side_by_side::run(*args).await,
            Command::Latency(args) => latency::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
