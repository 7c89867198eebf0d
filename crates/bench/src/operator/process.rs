//! The operator under test as a child process (this binary's sibling, or `--operator-bin`),
//! started with the bench's flags, waited for until its caches sync, and killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::BenchArgs;
use super::env::Env;
use crate::Result;
use crate::measure::memory_kib;

/// The operator as a child process, killed on drop.
pub(super) struct Operator {
    pub(super) child: Child,
    pub(super) log: PathBuf,
}

impl Operator {
    pub(super) async fn start(
        args: &BenchArgs,
        env: &Env,
        dir: &Path,
        reconciles: u16,
    ) -> Result<Operator> {
        let bin = match &args.operator_bin {
            Some(bin) => bin.clone(),
            None => crate::sibling_binary("memcached-operator")?,
        };
        let log = dir.join(format!(
            "operator-{}.log",
            jiff::Timestamp::now().as_millisecond()
        ));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--metrics-bind-address=0")
            .arg("--health-probe-bind-address=0")
            .arg(format!(
                "--resync-period={}ms",
                args.resync_period.as_millis()
            ))
            .arg(format!("--max-concurrent-reconciles={reconciles}"))
            .args(&args.operator_args)
            .env("KUBECONFIG", &env.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OPERATOR_LOG")
                    .unwrap_or_else(|_| "warn,memcached_operator::cmd=info".into()),
            )
            // Out of a cluster there is no serving certificate; the webhooks are not measured.
            .env("ENABLE_WEBHOOKS", "false")
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            // The operator logs to stdout, its start-up errors go to stderr.
            .stdout(file.try_clone()?)
            .stderr(file);
        // On a cluster it watches the phase's namespaces (comma-separated), nothing else,
        // unless it is to watch them all.
        if env.cluster && !args.cluster_wide {
            cmd.arg(format!("--namespace={}", env.namespaces.join(",")));
        }
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("caches synced") {
                break;
            }
            if let Some(status) = child.try_wait()? {
                return Err(format!(
                    "the operator exited ({status}) before its caches synced:\n{text}"
                )
                .into());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(
                    format!("the operator's caches did not sync within 20s:\n{text}").into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Operator { child, log })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn memory(&self) -> (u64, u64) {
        memory_kib(self.pid())
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("the operator exited ({status}):\n{text}").into());
        }
        Ok(())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
