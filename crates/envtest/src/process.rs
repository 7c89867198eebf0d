//! The control plane's processes: started from one long-lived thread so that the kernel's
//! parent-death signal (which follows the thread that forked, not the process) fires only
//! when the test binary itself exits or dies; logs in `<dir>/<name>.log`.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::{Error, io_err};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A number unique in this test binary (namespace and directory names).
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("envtest-spawner".into())
            .spawn(move || {
                // Lives as long as the process: the channel's sender is in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("envtest: cannot start the spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// PIDs of every running control-plane process, killed at exit (for the shared planes,
/// which are never dropped).
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn kill_all_at_exit() {
    let pids = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        // SAFETY: kill(2) on a PID we started; no memory is touched.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    for dir in std::mem::take(&mut *DIRS.lock().unwrap_or_else(|e| e.into_inner())) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Registers (once) the exit hook that stops the shared control planes.
pub(crate) fn stop_at_exit() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(kill_all_at_exit);
        }
    });
}

pub(crate) fn remove_dir_at_exit(dir: &Path) {
    DIRS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
}

/// One running component, which can be stopped and started again as it was.
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    binary: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<(String, std::ffi::OsString)>,
}

impl Process {
    pub(crate) fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<Process, Error> {
        Self::spawn_with_env(name, binary, args, dir, &[])
    }

    /// [`Process::spawn`] with extra environment variables.
    pub(crate) fn spawn_with_env(
        name: &str,
        binary: &Path,
        args: &[String],
        dir: &Path,
        env: &[(&str, std::ffi::OsString)],
    ) -> Result<Process, Error> {
        let log = dir.join(format!("{name}.log"));
        std::fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let mut p = Process {
            name: name.to_string(),
            child: None,
            log,
            binary: binary.to_path_buf(),
            args: args.to_vec(),
            dir: dir.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        p.start()?;
        Ok(p)
    }

    /// Starts the process (again, after [`Process::kill`]): the same binary and flags, its
    /// output appended to its log.
    pub(crate) fn start(&mut self) -> Result<(), Error> {
        if self.child.is_some() {
            return Ok(());
        }
        let (binary, args, dir, log, env) =
            (&self.binary, &self.args, &self.dir, &self.log, &self.env);
        let out = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
            .map_err(io_err(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("opening {}", log.display())))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_os_str())))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((cmd, tx))
            .map_err(|_| Error::Shared("the envtest spawner thread is gone".into()))?;
        let child = rx
            .recv()
            .map_err(|_| Error::Shared("the envtest spawner thread is gone".into()))?
            .map_err(io_err(format!("starting {}", binary.display())))?;
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        self.child = Some(child);
        Ok(())
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The component's name and, while it runs, its process id.
    pub(crate) fn pid(&self) -> (String, Option<u32>) {
        (self.name.clone(), self.child.as_ref().map(Child::id))
    }

    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            return Err(Error::Component {
                component: self.name.clone(),
                problem: format!("exited during start-up ({status})"),
                tail: tail(&self.log, 30),
                log: self.log.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            LIVE.lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|p| *p != pid);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file (for error messages).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let s = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
