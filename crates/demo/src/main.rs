//! The `memcached-demo` binary: the operator against the in-memory API server (`make demo`),
//! applying the seed sample, scaling it, repairing drift and deleting it, narrated. It needs
//! no cluster and is not shipped: the operator's binary carries neither it nor apisim.

mod demo;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Run the operator against the in-memory API server: apply the seed sample, scale it,
/// repair drift and delete it, printing what happens.
#[derive(Parser, Debug)]
#[command(name = "memcached-demo", version)]
struct Cli {
    /// Longest wait for any one step, in seconds.
    #[arg(long, default_value_t = 60)]
    step_timeout: u64,
}

fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo runs the in-memory API server and the operator.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The demo narrates; the operator's own logs are there with RUST_LOG=info.
    init_logging("warn");
    let step_timeout = Duration::from_secs(cli.step_timeout);
    match runtime.block_on(demo::run(std::io::stdout(), step_timeout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}
