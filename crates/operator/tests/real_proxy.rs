//! The proxy configuration the operator renders, run by real memcached processes on
//! loopback: memcached 1.6.38 built with its proxy from Debian's source package
//! (`make memcached-proxy`, which `make test` and `.ci/run` run; Debian's binary package
//! has no proxy). Backends and proxy are that binary; the configuration is
//! `proxy::render` of `proxy::assign`, exactly what the ConfigMap holds, and it is
//! replaced the way the kubelet replaces a mounted ConfigMap (a new file renamed over the
//! old), so the reload the proxy does by itself is the one that runs in the pods.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memcached_api::ProxyBackend;
use memcached_operator::proxy::{self, ReadyPod};

const VERSION: &str = "1.6.38";

fn binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bin")
        .join(format!("memcached-{VERSION}"))
        .join("memcached");
    assert!(
        path.is_file(),
        "{} is missing: make memcached-proxy (hack/memcached/build.sh) builds it",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Starts memcached with `args` on 127.0.0.1:`port` and waits until it accepts.
fn start(args: &[String], port: u16) -> Running {
    let mut cmd = Command::new(binary());
    cmd.args(args).args(["-l", "127.0.0.1"]);
    if as_root() {
        cmd.args(["-u", "nobody"]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memcached starts");
    let mut running = Running { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = running.child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = running.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("memcached {args:?} exited ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    running
}

fn backend(port: u16) -> Running {
    start(
        &[
            "-p".into(),
            port.to_string(),
            "-m".into(),
            "32".into(),
            "-U".into(),
            "0".into(),
        ],
        port,
    )
}

/// A directory the proxy (running as `nobody` under root) can read.
struct ConfigDir(PathBuf);

impl ConfigDir {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("proxy-test-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        set_mode(&dir, 0o755);
        ConfigDir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join(proxy::CONFIG_KEY)
    }

    /// Writes `text` as the kubelet updates a mounted ConfigMap: a new file, then a rename.
    fn write(&self, text: &str) {
        let tmp = self.0.join(".next");
        std::fs::write(&tmp, text).expect("write config");
        set_mode(&tmp, 0o644);
        std::fs::rename(&tmp, self.file()).expect("replace config");
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn pods(ports: &[u16]) -> Vec<ReadyPod> {
    // One pod per port; the pod names sort in port order.
    ports
        .iter()
        .map(|p| ReadyPod {
            name: format!("cache-{p}"),
            ip: "127.0.0.1".into(),
        })
        .collect()
}

/// The rendered configuration for backends on `ports`, keeping `previous`'s copies.
fn configure(
    dir: &ConfigDir,
    previous: &[ProxyBackend],
    ports: &[u16],
    copies: i32,
) -> Vec<ProxyBackend> {
    // The backends differ by port only, as pods differ by IP in a cluster.
    let mut backends = proxy::assign(previous, &pods(ports), copies, 0);
    for b in &mut backends {
        b.address = format!("127.0.0.1:{}", b.pod.trim_start_matches("cache-"));
    }
    let file = dir.file();
    let (text, _) = proxy::render("test/pool", &backends, copies, &file.to_string_lossy());
    dir.write(&text);
    backends
}

fn start_proxy(dir: &ConfigDir) -> Running {
    let port = free_port();
    let args = proxy::proxy_args(i32::from(port), &dir.file().to_string_lossy());
    start(&args[1..], port)
}

/// A text-protocol connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

#[derive(Debug, PartialEq)]
enum Reply {
    Hit(String),
    Miss,
    Error(String),
}

impl Conn {
    fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: stream,
        }
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(line.trim_end().to_string())
    }

    fn set(&mut self, key: &str, value: &str) -> std::io::Result<String> {
        // One write per request: a request split over several segments waits for the
        // peer's delayed acknowledgement (Nagle), 40 ms each.
        let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        self.writer.write_all(request.as_bytes())?;
        self.line()
    }

    fn get(&mut self, key: &str) -> std::io::Result<Reply> {
        self.writer.write_all(format!("get {key}\r\n").as_bytes())?;
        let first = self.line()?;
        if first == "END" {
            return Ok(Reply::Miss);
        }
        if !first.starts_with("VALUE ") {
            return Ok(Reply::Error(first));
        }
        let value = self.line()?;
        let end = self.line()?;
        assert_eq!(end, "END", "after the value of {key}");
        Ok(Reply::Hit(value))
    }

    fn stats(&mut self) -> HashMap<String, String> {
        self.writer.write_all(b"stats\r\n").expect("send stats");
        let mut out = HashMap::new();
        loop {
            let line = self.line().expect("stats line");
            if line == "END" {
                return out;
            }
            let mut parts = line.splitn(3, ' ');
            if let (Some("STAT"), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) {
                out.insert(k.to_string(), v.to_string());
            }
        }
    }
}

fn stat(port: u16, name: &str) -> u64 {
    Conn::open(port)
        .stats()
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no stat {name} on {port}"))
}

/// Waits until the proxy on `port` has loaded one more configuration than `before`.
fn wait_for_reload(port: u16, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let fails = stat(port, "proxy_config_reload_fails");
        assert_eq!(fails, 0, "the proxy refused a rendered configuration");
        if stat(port, "proxy_config_reloads") > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not reload its configuration by itself"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const KEYS: usize = 3000;

fn key(i: usize) -> String {
    format!("key:{i}")
}

fn set_all(port: u16) {
    let mut conn = Conn::open(port);
    for i in 0..KEYS {
        assert_eq!(conn.set(&key(i), &format!("v{i}")).expect("set"), "STORED");
    }
}

fn hits(port: u16) -> (usize, usize, usize) {
    let mut conn = Conn::open(port);
    let (mut hit, mut miss, mut error) = (0, 0, 0);
    for i in 0..KEYS {
        match conn.get(&key(i)).expect("get") {
            Reply::Hit(v) => {
                assert_eq!(v, format!("v{i}"));
                hit += 1;
            }
            Reply::Miss => miss += 1,
            Reply::Error(_) => error += 1,
        }
    }
    (hit, miss, error)
}

#[test]
fn keys_are_sharded_evenly_and_mostly_stay_when_the_pool_grows() {
    let backends: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let first = configure(&dir, &[], &ports[..3], 1);
    let proxy = start_proxy(&dir);

    set_all(proxy.port);
    assert_eq!(
        hits(proxy.port),
        (KEYS, 0, 0),
        "every key set through the proxy is read back through it"
    );
    let items: Vec<u64> = ports[..3].iter().map(|p| stat(*p, "curr_items")).collect();
    assert_eq!(items.iter().sum::<u64>(), KEYS as u64, "{items:?}");
    let even = KEYS as f64 / 3.0;
    for n in &items {
        assert!(
            (*n as f64 - even).abs() <= 0.2 * even,
            "keys per backend {items:?}, more than 20% off {even}"
        );
    }
    println!("3 backends hold {items:?} of {KEYS} keys");

    // Grow to 4 the way the operator does: re-render, the kubelet swaps the file.
    let reloads = stat(proxy.port, "proxy_config_reloads");
    configure(&dir, &first, &ports, 1);
    wait_for_reload(proxy.port, reloads);
    let (hit, miss, error) = hits(proxy.port);
    assert_eq!(error, 0);
    let kept = hit as f64 / KEYS as f64;
    println!(
        "after growing 3 → 4: {hit} of {KEYS} keys still hit ({:.1} %)",
        kept * 100.0
    );
    assert!(
        kept >= 0.65,
        "only {hit} of {KEYS} keys still hit after 3 → 4 ({miss} misses)"
    );
}

#[test]
fn a_lost_backend_gives_misses_and_comes_back() {
    let mut backends: Vec<Running> = (0..3).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    configure(&dir, &[], &ports, 1);
    let proxy = start_proxy(&dir);
    set_all(proxy.port);

    let lost = backends.remove(1);
    let lost_port = lost.port;
    drop(lost);
    let (hit, miss, error) = hits(proxy.port);
    println!("one of 3 backends down: {hit} hits, {miss} misses, {error} errors");
    assert_eq!(
        error, 0,
        "a read of a key on the lost backend is a miss, not an error"
    );
    assert!(miss > 0 && hit > 0, "{hit} hits, {miss} misses");

    // The pod comes back (empty) at the same address: the proxy reconnects by itself.
    let _back = backend(lost_port);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut conn = Conn::open(proxy.port);
        let stored = (0..KEYS).all(|i| {
            conn.set(&key(i), &format!("v{i}"))
                .is_ok_and(|r| r == "STORED")
        });
        if stored && hits(proxy.port) == (KEYS, 0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not use the returned backend again"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn with_two_copies_keys_survive_the_loss_of_a_pod() {
    let mut backends: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let assigned = configure(&dir, &[], &ports, 2);
    assert_eq!(
        assigned.iter().filter(|b| b.copy == 1).count(),
        2,
        "{assigned:?}"
    );
    let proxy = start_proxy(&dir);
    set_all(proxy.port);
    let items: u64 = ports.iter().map(|p| stat(*p, "curr_items")).sum();
    assert_eq!(
        items,
        2 * KEYS as u64,
        "every key is written to both copies"
    );

    drop(backends.remove(0));
    assert_eq!(
        hits(proxy.port),
        (KEYS, 0, 0),
        "every key is still read, from its other copy"
    );
}

#[test]
fn a_reload_under_load_drops_no_connection() {
    let backends: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let mut current = configure(&dir, &[], &ports[..3], 1);
    let proxy = start_proxy(&dir);
    let port = proxy.port;

    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let stop = stop.clone();
            let requests = requests.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut conn = Conn::open(port);
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("load:{c}:{}", i % 500);
                    let stored = conn.set(&k, "x").map_err(|e| format!("set {k}: {e}"))?;
                    if stored != "STORED" {
                        return Err(format!("set {k}: {stored}"));
                    }
                    match conn.get(&k).map_err(|e| format!("get {k}: {e}"))? {
                        Reply::Error(e) => return Err(format!("get {k}: {e}")),
                        Reply::Hit(_) | Reply::Miss => {}
                    }
                    requests.fetch_add(2, Ordering::Relaxed);
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();

    // Five reloads while the clients run: the pool alternates between 3 and 4 pods.
    for round in 0..5 {
        let before = stat(port, "proxy_config_reloads");
        let pool = if round % 2 == 0 {
            &ports[..]
        } else {
            &ports[..3]
        };
        current = configure(&dir, &current, pool, 1);
        wait_for_reload(port, before);
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let outcome = client.join().expect("client thread");
        assert_eq!(outcome, Ok(()), "a client saw an error across the reloads");
    }
    let done = requests.load(Ordering::Relaxed);
    println!("{done} requests on 4 connections across 5 reloads, none failed");
    assert!(done > 100, "the clients ran ({done} requests)");
}

#[test]
fn the_proxy_adds_one_hop_of_latency() {
    let backend = backend(free_port());
    let dir = ConfigDir::new();
    configure(&dir, &[], &[backend.port], 1);
    let proxy = start_proxy(&dir);
    let mut direct = Conn::open(backend.port);
    let mut through = Conn::open(proxy.port);
    assert_eq!(direct.set("hot", "value").expect("set"), "STORED");
    let samples = 5000;
    let time = |conn: &mut Conn| {
        let mut all: Vec<Duration> = (0..samples)
            .map(|_| {
                let start = Instant::now();
                assert_eq!(conn.get("hot").expect("get"), Reply::Hit("value".into()));
                start.elapsed()
            })
            .collect();
        all.sort();
        (all[samples / 2], all[samples * 99 / 100])
    };
    // Warm both paths, then measure (printed, not asserted: a busy machine moves it).
    time(&mut direct);
    time(&mut through);
    let (d50, d99) = time(&mut direct);
    let (p50, p99) = time(&mut through);
    println!(
        "get on loopback, {samples} samples: direct p50 {d50:?} p99 {d99:?}; through the proxy p50 {p50:?} p99 {p99:?}; added p50 {:?}",
        p50.saturating_sub(d50)
    );
}
