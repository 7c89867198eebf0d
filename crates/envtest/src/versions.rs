//! The pinned versions: every `hack/controlplane/k8s-vX.Y/go.mod` pins one Kubernetes
//! release; `hack/controlplane/kwok/go.mod` pins kwok.

use std::path::{Path, PathBuf};

use crate::{Error, io_err};

/// The repository's root (where `hack/` and `bin/` are).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| here.join("../.."))
}

/// A Kubernetes release, `vMAJOR.MINOR.PATCH`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.trim().trim_start_matches('v').split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = it.next().map(|p| p.parse().ok()).unwrap_or(Some(0))?;
        Some(Version {
            major,
            minor,
            patch,
        })
    }

    /// `vMAJOR.MINOR`.
    pub fn minor_tag(&self) -> String {
        format!("v{}.{}", self.major, self.minor)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Which pinned Kubernetes version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kube {
    /// The oldest pinned: the floor the operator supports.
    Oldest,
    /// The newest pinned.
    Newest,
}

impl Kube {
    pub fn resolve(self) -> Result<Version, Error> {
        let versions = pinned_kube_versions()?;
        let v = match self {
            Kube::Oldest => versions.first(),
            Kube::Newest => versions.last(),
        };
        v.cloned()
            .ok_or_else(|| Error::NoPins(repo_root().join("hack/controlplane")))
    }
}

fn module_version(go_mod: &Path, module: &str) -> Result<Option<Version>, Error> {
    let text =
        std::fs::read_to_string(go_mod).map_err(io_err(format!("reading {}", go_mod.display())))?;
    Ok(text.lines().find_map(|line| {
        let line = line.trim().trim_start_matches("require").trim();
        let rest = line.strip_prefix(module)?.trim();
        rest.split_whitespace().next().and_then(Version::parse)
    }))
}

/// Every Kubernetes version pinned in `hack/controlplane`, oldest first.
pub fn pinned_kube_versions() -> Result<Vec<Version>, Error> {
    let dir = repo_root().join("hack/controlplane");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io_err(format!("reading {}", dir.display())))? {
        let entry = entry.map_err(io_err(format!("reading {}", dir.display())))?;
        if !entry.file_name().to_string_lossy().starts_with("k8s-v") {
            continue;
        }
        if let Some(v) = module_version(&entry.path().join("go.mod"), "k8s.io/kubernetes ")? {
            out.push(v);
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::NoPins(dir));
    }
    Ok(out)
}

/// `kwok-vA.B.C`, from the kwok pin: its directory under [`bin_root`].
pub(crate) fn kwok_dir_name() -> Result<String, Error> {
    let go_mod = repo_root().join("hack/controlplane/kwok/go.mod");
    let v = module_version(&go_mod, "sigs.k8s.io/kwok ")?
        .ok_or_else(|| Error::NoPins(go_mod.clone()))?;
    Ok(format!("kwok-{v}"))
}

/// `containerd-vA.B.C`, from the node's runtime pin (`hack/node/runtime/go.mod`): the
/// directory under [`bin_root`](crate::bin_root) with containerd, its shim, runc, ctr and
/// the CNI plugins.
pub(crate) fn containerd_dir_name() -> Result<String, Error> {
    let go_mod = repo_root().join("hack/node/runtime/go.mod");
    let v = module_version(&go_mod, "github.com/containerd/containerd/v2 ")?
        .ok_or_else(|| Error::NoPins(go_mod.clone()))?;
    Ok(format!("containerd-{v}"))
}
