//! The errors of starting and using a control plane, each naming what failed (a missing
//! binary with the command that builds it, a component with the tail of its log, a timeout).

use std::path::PathBuf;
use std::time::Duration;

/// Why a control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{binary} is missing ({path}): build the pinned control plane with `{command}`")]
    MissingBinary {
        binary: String,
        path: PathBuf,
        command: String,
    },
    #[error("no Kubernetes version is pinned in {0} (pin one with hack/controlplane/pin.sh)")]
    NoPins(PathBuf),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificates: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{component} {problem}\n--- last lines of {log} ---\n{tail}")]
    Component {
        component: String,
        problem: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{0} did not happen within {1:?}")]
    Timeout(String, Duration),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Shared(String),
    #[error("real node: {0}")]
    RealNode(String),
    #[error("no component {0} in this control plane")]
    NoComponent(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
