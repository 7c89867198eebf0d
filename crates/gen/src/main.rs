//! The `memcached-operator-gen` binary: writes `config/` (`manifests`), the Helm chart
//! (`helm-chart`) and the OLM bundle (`bundle`) from the operator's code (`make manifests`,
//! `make bundle`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use memcached_operator_gen::{helm, manifests, olm};

#[derive(Parser, Debug)]
#[command(
    name = "memcached-operator-gen",
    version,
    about = "Writes the Memcached operator's deployment files from its code"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write the Kubebuilder-style config/ tree (CRD, RBAC, manager, webhook, ...) from code.
    Manifests {
        /// Directory to write into.
        #[arg(long, default_value = "config")]
        dir: PathBuf,
    },
    /// Write the Helm chart (charts/memcached-operator) from code, as `manifests` writes config/.
    HelmChart {
        /// Directory to write into.
        #[arg(long, default_value = "charts/memcached-operator")]
        dir: PathBuf,
    },
    /// Write the OLM bundle (bundle/ and bundle.Dockerfile under --dir) from code.
    Bundle {
        /// The repository's root.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Repository of the operator's image (tagged with the version); the TLS reload
        /// agent's is the same with `-tls-agent` (tagged with the agent's own version).
        #[arg(long, default_value = manifests::IMAGE_REPOSITORY)]
        image_repository: String,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Manifests { dir } => report_written(&dir, manifests::write(&dir)),
        Command::HelmChart { dir } => report_written(&dir, helm::write(&dir)),
        Command::Bundle {
            dir,
            image_repository,
        } => report_written(&dir, olm::write(&dir, &image_repository)),
    }
}

fn report_written(dir: &Path, result: Result<Vec<PathBuf>, manifests::Error>) -> ExitCode {
    match result {
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
    }
}
