//! A process contender (ours, or the peer as generated or tuned) as a child process with its
//! flags and log file, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::target::Target;
use super::{Args, Contender};
use crate::Result;

/// A contender's process, killed on drop.
pub(super) struct Process {
    pub(super) child: Child,
    pub(super) log: PathBuf,
}

impl Process {
    pub(super) fn spawn(
        args: &Args,
        target: &Target,
        who: Contender,
        ns: &str,
        dir: &Path,
    ) -> Result<Process> {
        let log = dir.join(format!("{}-{ns}.log", who.tag()));
        let file = std::fs::File::create(&log)?;
        let resync = format!("{}ms", args.resync_period.as_millis());
        let mut cmd = match who {
            Contender::Ours => {
                let bin = match &args.operator_bin {
                    Some(b) => b.clone(),
                    None => crate::sibling_binary("memcached-operator")?,
                };
                let mut cmd = Command::new(bin);
                cmd.arg("run")
                    .arg("--metrics-bind-address=0")
                    .arg("--health-probe-bind-address=0")
                    .arg(format!("--namespace={ns}"))
                    .arg(format!("--resync-period={resync}"))
                    .env("ENABLE_WEBHOOKS", "false")
                    .env("RUST_LOG", "warn");
                cmd
            }
            Contender::Peer | Contender::PeerTuned => {
                let bin = match &args.peer_bin {
                    Some(b) => b.clone(),
                    None => memcached_operator_root().join("bench/peer/bin/memcached-peer"),
                };
                if !bin.exists() {
                    return Err(format!(
                        "{} is missing: build it with bench/peer/build.sh",
                        bin.display()
                    )
                    .into());
                }
                let mut cmd = Command::new(bin);
                cmd.arg(format!("--namespace={ns}"))
                    .arg(format!("--sync-period={resync}"))
                    .arg("--zap-log-level=error");
                if who == Contender::PeerTuned {
                    cmd.args([
                        "--max-concurrent-reconciles=16",
                        "--kube-api-qps=1000",
                        "--kube-api-burst=2000",
                        "--user-agent=tuned",
                    ]);
                } else {
                    cmd.arg("--user-agent=generated");
                }
                cmd
            }
            _ => return Err("a bound is not a process".into()),
        };
        cmd.env("KUBECONFIG", &target.kubeconfig)
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .stdout(file.try_clone()?)
            .stderr(file);
        Ok(Process {
            child: cmd.spawn()?,
            log,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("the contender exited ({status}):\n{text}").into());
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The repository (this crate is `crates/bench`).
pub(super) fn memcached_operator_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}
