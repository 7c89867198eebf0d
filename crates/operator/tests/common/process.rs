//! `memcached-operator run` as users run it: a child process of the test, configured by its
//! flags and environment, logging to a file; plus the temporary directories and free ports
//! such a process needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The operator binary. The operator's own tests get it from cargo; the generator's
/// (`crates/gen/tests`), to which cargo gives only their own package's binaries, take
/// `memcached-operator` from the running test's target directory, where `cargo test
/// --workspace` builds it; when it is missing there, the test fails naming the command.
pub fn bin() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_memcached-operator") {
        return PathBuf::from(bin);
    }
    // The test runs as <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe.parent().and_then(Path::parent).map(|profile| {
        profile.join(format!(
            "memcached-operator{}",
            std::env::consts::EXE_SUFFIX
        ))
    });
    match bin {
        Some(bin) if bin.is_file() => bin,
        _ => panic!(
            "the operator binary is not built beside {}: run `cargo build -p memcached-operator` \
             (or `cargo test --workspace`, which builds it)",
            exe.display()
        ),
    }
}

/// The operator of the last release, built by `make previous-release`.
pub fn previous_release() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let commit = std::fs::read_to_string(root.join("hack/previous-release/COMMIT"))
        .expect("hack/previous-release/COMMIT");
    let commit = commit.trim();
    let bin = root
        .join("bin")
        .join(format!("previous-release-{}", &commit[..12]))
        .join("memcached-operator");
    assert!(
        bin.is_file(),
        "{} is missing: build the last release's operator with `make previous-release`",
        bin.display()
    );
    bin
}

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "mc-op-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Debian's `memcached` on the PATH (or in /usr/bin, /usr/local/bin); the tests that run it
/// fail naming the package when it is missing.
pub fn memcached_binary() -> String {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
    {
        let path = format!("{dir}/memcached");
        if Path::new(&path).is_file() {
            return path;
        }
    }
    panic!("memcached is not installed: apt-get install memcached (.ci/run does)");
}

/// memcached 1.6.38 with its proxy, as `make memcached-proxy` builds it into bin/ (the
/// official image runs 1.6.39); the tests that run it fail naming that command when it is
/// missing.
pub fn recent_memcached() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bin/memcached-1.6.38/memcached");
    assert!(
        path.is_file(),
        "{} is missing: make memcached-proxy (hack/memcached/build.sh) builds it",
        path.display()
    );
    path.display().to_string()
}

/// A free TCP port on loopback (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// One `memcached-operator run` process, killed (SIGKILL) when dropped.
pub struct Operator {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Operator {
    /// Starts `memcached-operator run ARGS` with `KUBECONFIG=kubeconfig`, `POD_NAME=name`
    /// (the leader-election identity's prefix), `RUST_LOG=info` and webhooks off, then `env`
    /// on top; its output (logs on stdout, start-up errors on stderr) goes to
    /// `log_dir/<name>.log`.
    pub fn spawn(
        kubeconfig: &Path,
        log_dir: &Path,
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Operator {
        Self::spawn_program(&bin(), kubeconfig, log_dir, name, args, env)
    }

    /// [`Operator::spawn`] of another build of the operator (an earlier release's).
    pub fn spawn_program(
        program: &Path,
        kubeconfig: &Path,
        log_dir: &Path,
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Operator {
        let log = log_dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        let log_file_too = log_file.try_clone().expect("log file");
        let mut cmd = Command::new(program);
        cmd.arg("run")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("ENABLE_WEBHOOKS", "false")
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(log_file)
            .stderr(log_file_too);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let child = cmd.spawn().expect("operator binary starts");
        Operator {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Sends `signal` to this process (never to anything else).
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child's PID; no memory is touched.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// The process's id (to read its /proc entries; signal it with [`Operator::signal`]).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits for the process to exit, failing the test (with its log) after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the log contains `needle`, failing the test (with the log) after
    /// `timeout` or when the process exits first.
    pub async fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logs().contains(needle) {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "{} exited ({status}) before logging {needle:?}:\n{}",
                    self.name,
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not log {needle:?} within {timeout:?}:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything the process has written to stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
