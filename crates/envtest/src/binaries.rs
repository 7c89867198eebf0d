//! Where the pinned binaries are found: the control plane's (`bin/k8s-vX.Y.Z/`, kwok's
//! `bin/kwok-vA.B.C/`) and the release tools', under `$CONTROLPLANE_BIN` or `<repo>/bin`,
//! with the command that builds one that is missing.

use std::path::{Path, PathBuf};

use crate::{Error, Kube, Version, repo_root};

pub(crate) fn require(path: &Path, version_dir: &str) -> Result<PathBuf, Error> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        let binary = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let command = match version_dir.strip_prefix("k8s-") {
            Some(v) => format!(
                "make controlplane (or: hack/controlplane/build.sh {})",
                Version::parse(v)
                    .map(|v| v.minor_tag())
                    .unwrap_or_else(|| v.to_string())
            ),
            None => "make controlplane (or: hack/controlplane/build.sh)".to_string(),
        };
        Err(Error::MissingBinary {
            binary,
            path: path.to_path_buf(),
            command,
        })
    }
}

/// A pinned release tool built by `make tools` (hack/tools/build.sh): `bin/<name>-v*/<name>`
/// (`helm`, `operator-sdk`).
pub fn tool_path(name: &str) -> Result<PathBuf, Error> {
    let found = std::fs::read_dir(bin_root())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}-v")))
        })
        .map(|dir| dir.join(name))
        .filter(|p| p.is_file())
        .max();
    found.ok_or_else(|| Error::MissingBinary {
        binary: name.to_string(),
        path: bin_root().join(format!("{name}-v*")).join(name),
        command: "make tools (or: hack/tools/build.sh)".to_string(),
    })
}

/// Where the binaries live: `$CONTROLPLANE_BIN` or `<repo>/bin`.
pub fn bin_root() -> PathBuf {
    std::env::var_os("CONTROLPLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("bin"))
}

/// The directory holding kubectl and the other binaries of one pinned version, for a test
/// that runs `kubectl` or puts it on a child's `PATH`.
pub fn k8s_bin_dir(kube: Kube) -> Result<PathBuf, Error> {
    let version = kube.resolve()?;
    let dir = bin_root().join(format!("k8s-{version}"));
    require(&dir.join("kubectl"), &format!("k8s-{version}"))?;
    Ok(dir)
}

/// `kubectl` of the newest pinned version (built by `make controlplane`), for tests that need
/// kubectl without a control plane (kustomize, client-side dry runs).
pub fn kubectl_path() -> Result<PathBuf, Error> {
    Ok(k8s_bin_dir(Kube::Newest)?.join("kubectl"))
}
