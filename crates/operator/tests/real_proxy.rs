//! The proxy configuration the operator renders, run by real memcached processes on
//! loopback: memcached 1.6.38 built with its proxy from Debian's source package
//! (`make memcached-proxy`, which `make test` and `.ci/run` run; Debian's binary package
//! has no proxy). Backends and proxy are that binary; the configuration is
//! `proxy::render` of `proxy::membership`, exactly what the ConfigMap holds, and it is
//! replaced the way the kubelet replaces a mounted ConfigMap (a new file renamed over the
//! old), so the reload the proxy does by itself is the one that runs in the pods.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memcached_api::ProxyBackend;
use memcached_operator::proxy::{self, PoolPod};

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
    start_with_env(args, port, &[])
}

/// [`start`], with `env` in memcached's environment.
fn start_with_env(args: &[String], port: u16, env: &[(&str, &str)]) -> Running {
    let mut cmd = Command::new(binary());
    cmd.args(args).args(["-l", "127.0.0.1"]);
    cmd.envs(env.iter().copied());
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

/// The pod of the backend on `port`.
fn pod(port: u16, ready: bool) -> PoolPod {
    PoolPod {
        name: format!("cache-{port}"),
        ip: Some("127.0.0.1".into()),
        ready,
        zone: None,
        created: None,
    }
}

fn ready(ports: &[u16]) -> Vec<PoolPod> {
    ports.iter().map(|p| pod(*p, true)).collect()
}

/// The rings the operator computes from `previous` for a pool of `size` with `pods`,
/// rendered and written as the kubelet updates the ConfigMap.
fn configure(
    dir: &ConfigDir,
    previous: &[ProxyBackend],
    pods: &[PoolPod],
    size: i32,
    copies: i32,
) -> Vec<ProxyBackend> {
    configure_warm(dir, previous, pods, &[], None, size, copies)
}

/// `configure`, with the slots' predecessors in `warm` and a gutter keeping values for
/// `gutter_ttl` seconds (see `proxy::render_warm`).
fn configure_warm(
    dir: &ConfigDir,
    previous: &[ProxyBackend],
    pods: &[PoolPod],
    warm: &[ProxyBackend],
    gutter_ttl: Option<i32>,
    size: i32,
    copies: i32,
) -> Vec<ProxyBackend> {
    let mut backends = proxy::membership(previous, pods, &[], size, copies, &[], 0).backends;
    // The backends differ by port only, as pods differ by IP in a cluster.
    for b in backends.iter_mut().filter(|b| !b.is_vacant()) {
        b.address = format!("127.0.0.1:{}", b.pod.trim_start_matches("cache-"));
    }
    let file = dir.file();
    // A shorter warm ring is the ring before a scale-out.
    let ring = |bs: &[ProxyBackend]| bs.iter().map(|b| b.slot + 1).max().unwrap_or(0);
    let moved_from = (ring(warm) < ring(&backends)).then(|| ring(warm));
    let (text, _) = proxy::render_warm(
        "test/pool",
        &backends,
        warm,
        moved_from,
        copies,
        gutter_ttl,
        &file.to_string_lossy(),
    );
    dir.write(&text);
    backends
}

/// `configure`, then waits until the proxy on `port` has loaded it.
fn reconfigure(
    dir: &ConfigDir,
    port: u16,
    previous: &[ProxyBackend],
    pods: &[PoolPod],
    size: i32,
    copies: i32,
) -> Vec<ProxyBackend> {
    let before = stat(port, "proxy_config_reloads");
    let backends = configure(dir, previous, pods, size, copies);
    wait_for_reload(port, before);
    backends
}

fn start_proxy(dir: &ConfigDir) -> Running {
    let port = free_port();
    let args = proxy::proxy_args(i32::from(port), &dir.file().to_string_lossy());
    start(&args[1..], port)
}

/// A proxy that also loads the warm-up route, written into `dir` as the ConfigMap holds it.
fn start_warm_proxy(dir: &ConfigDir) -> Running {
    start_proxy_with(dir, None)
}

/// [`start_warm_proxy`], with the gutter's route and `gutter_mib` of cache for it when
/// given.
fn start_proxy_with(dir: &ConfigDir, gutter_mib: Option<i32>) -> Running {
    let warm = dir.0.join(proxy::WARM_KEY);
    std::fs::write(&warm, proxy::WARM_ROUTE).expect("write warm.lua");
    set_mode(&warm, 0o644);
    let gutter = dir.0.join(proxy::GUTTER_KEY);
    std::fs::write(&gutter, proxy::GUTTER_ROUTE).expect("write gutter.lua");
    set_mode(&gutter, 0o644);
    let gutter = gutter.to_string_lossy().to_string();
    let port = free_port();
    let args = proxy::proxy_args_with(
        i32::from(port),
        &dir.file().to_string_lossy(),
        Some(&warm.to_string_lossy()),
        gutter_mib.map(|mib| (gutter.as_str(), mib)),
    );
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

    fn delete(&mut self, key: &str) -> std::io::Result<String> {
        self.writer
            .write_all(format!("delete {key}\r\n").as_bytes())?;
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

/// Waits until the proxy on `port` has loaded one more configuration than `before` (a
/// generous deadline: it reloads within seconds, later on a machine busy with other suites).
fn wait_for_reload(port: u16, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
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

/// Which backend (by port) holds each key, read from the backends directly.
fn homes(ports: &[u16]) -> Vec<Option<u16>> {
    let mut conns: Vec<(u16, Conn)> = ports.iter().map(|p| (*p, Conn::open(*p))).collect();
    (0..KEYS)
        .map(|i| {
            let mut home = None;
            for (port, conn) in conns.iter_mut() {
                if matches!(conn.get(&key(i)).expect("get"), Reply::Hit(_)) {
                    assert_eq!(home, None, "{} on two backends", key(i));
                    home = Some(*port);
                }
            }
            home
        })
        .collect()
}

#[test]
fn keys_are_sharded_evenly_and_only_the_new_slots_keys_move_when_the_pool_grows() {
    let backends: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let first = configure(&dir, &[], &ready(&ports[..3]), 3, 1);
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
    reconfigure(&dir, proxy.port, &first, &ready(&ports), 4, 1);
    let (hit, miss, error) = hits(proxy.port);
    assert_eq!(error, 0);
    // Set again, the keys that moved land on the new backend: all of them, and no other.
    set_all(proxy.port);
    let landed = stat(ports[3], "curr_items") as usize;
    println!(
        "after growing 3 → 4: {hit} of {KEYS} keys still hit ({:.1} %); the {miss} that moved all went to the new backend ({landed} there)",
        hit as f64 * 100.0 / KEYS as f64
    );
    assert_eq!(landed, miss, "a key that moved went to the new slot");
    assert!(
        (0.2..=0.3).contains(&(miss as f64 / KEYS as f64)),
        "{miss} of {KEYS} keys moved, not about a quarter"
    );
}

fn signal(r: &Running, sig: i32) {
    // SAFETY: kill(2) sends a signal to our own child; no memory is involved.
    let rc = unsafe { libc::kill(r.child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signal {sig} to memcached on {}", r.port);
}

/// Keys deleted or overwritten while a backend is paused.
const MODIFIED: usize = 900;

/// Through the proxy on `port`, deletes the even keys of the first [`MODIFIED`] and
/// overwrites the odd ones; whether the proxy acknowledged each.
fn modify(port: u16) -> Vec<bool> {
    let mut conn = Conn::open(port);
    (0..MODIFIED)
        .map(|i| {
            let reply = if i % 2 == 0 {
                conn.delete(&key(i))
            } else {
                conn.set(&key(i), &format!("new{i}"))
            };
            let reply = reply.unwrap_or_else(|e| panic!("{}: {e}", key(i)));
            matches!(reply.as_str(), "DELETED" | "NOT_FOUND" | "STORED")
        })
        .collect()
}

/// Reads the modified keys back through the proxy on `port`: how many acknowledged
/// changes do not show, as `(stale, lost)` (stale: the value from before; lost: an
/// overwrite that misses).
fn unseen_changes(port: u16, acked: &[bool]) -> (usize, usize) {
    let mut conn = Conn::open(port);
    let (mut stale, mut lost) = (0, 0);
    for i in (0..acked.len()).filter(|i| acked[*i]) {
        match conn.get(&key(i)).expect("get") {
            Reply::Hit(v) if v == format!("v{i}") => stale += 1,
            Reply::Miss if i % 2 == 1 => lost += 1,
            Reply::Error(e) => panic!("{}: {e}", key(i)),
            Reply::Hit(_) | Reply::Miss => {}
        }
    }
    (stale, lost)
}

/// Waits until the proxy on `port` reads `key(i)` from its backend again.
fn wait_until_read(port: u16, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Conn::open(port).get(&key(i)).expect("get") != Reply::Hit(format!("v{i}")) {
        assert!(
            Instant::now() < deadline,
            "the proxy did not read {} from its backend again",
            key(i)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_backend_that_stops_answering_for_a_while_serves_no_stale_value() {
    let backends: Vec<Running> = (0..3).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let rings = configure(&dir, &[], &ready(&ports), 3, 1);
    let proxy = start_proxy(&dir);
    set_all(proxy.port);
    let home = homes(&ports);
    let paused = &backends[1];
    let on_paused = |i: &usize| home[*i] == Some(paused.port);
    let probe = (MODIFIED..KEYS)
        .find(on_paused)
        .expect("a key on the paused backend");
    let modified_there = (0..MODIFIED).filter(on_paused).count();

    // Paused (SIGSTOP: it accepts connections and answers nothing, as a pod whose probe
    // times out). Its pod is no longer Ready but lives: the rings do not change.
    signal(paused, libc::SIGSTOP);
    let not_ready = [
        pod(ports[0], true),
        pod(ports[1], false),
        pod(ports[2], true),
    ];
    assert_eq!(configure(&dir, &rings, &not_ready, 3, 1), rings);
    let acked = modify(proxy.port);
    let failed = acked.iter().filter(|a| !**a).count();
    signal(paused, libc::SIGCONT);
    wait_until_read(proxy.port, probe);
    let (stale, lost) = unseen_changes(proxy.port, &acked);
    println!(
        "a backend paused: {MODIFIED} keys deleted or overwritten through the proxy meanwhile, {modified_there} of them on it; {failed} requests failed; after: {stale} stale reads, {lost} lost writes"
    );
    assert_eq!(
        (stale, lost),
        (0, 0),
        "an acknowledged change does not show"
    );
    assert!(
        failed <= modified_there,
        "only requests for the paused backend's keys fail ({failed})"
    );
    assert!(
        (0..MODIFIED).filter(|i| !on_paused(i)).all(|i| acked[i]),
        "every request for another backend's keys succeeds"
    );

    // The check sees stale values when there are some: the same pause under a ring of
    // the Ready pods only (what the operator did before), rebuilt when the pod is Ready
    // again. The keys of the paused pod are written to another pod meanwhile, and read
    // from the paused one after.
    set_all(proxy.port);
    signal(paused, libc::SIGSTOP);
    let ready_only = [pod(ports[0], true), pod(ports[2], true)];
    reconfigure(&dir, proxy.port, &[], &ready_only, 2, 1);
    let acked = modify(proxy.port);
    signal(paused, libc::SIGCONT);
    reconfigure(&dir, proxy.port, &[], &ready(&ports), 3, 1);
    wait_until_read(proxy.port, probe);
    let (stale, lost) = unseen_changes(proxy.port, &acked);
    println!(
        "the same with a ring of the Ready pods only: {stale} stale reads, {lost} lost writes"
    );
    assert!(
        stale > 0,
        "a ring that follows readiness serves stale values"
    );
}

#[test]
fn a_replaced_backend_takes_its_slot_and_no_other_key_moves() {
    let mut backends: Vec<Running> = (0..3).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let rings = configure(&dir, &[], &ready(&ports), 3, 1);
    let proxy = start_proxy(&dir);
    set_all(proxy.port);
    let home = homes(&ports);
    let gone = ports[1];
    let theirs = home.iter().filter(|h| **h == Some(gone)).count();
    let slot = rings
        .iter()
        .position(|b| b.pod == format!("cache-{gone}"))
        .expect("in the ring");

    // Deleted: its slot stays, vacant, and the others' keys stay where they are.
    drop(backends.remove(1));
    let vacant = reconfigure(
        &dir,
        proxy.port,
        &rings,
        &ready(&[ports[0], ports[2]]),
        3,
        1,
    );
    assert!(vacant[slot].is_vacant(), "{vacant:?}");
    let others_hit = |port: u16| {
        let mut conn = Conn::open(port);
        (0..KEYS)
            .filter(|i| home[*i] != Some(gone))
            .filter(|i| conn.get(&key(*i)).expect("get") == Reply::Hit(format!("v{i}")))
            .count()
    };
    let others = KEYS - theirs;
    let meanwhile = others_hit(proxy.port);
    assert_eq!(meanwhile, others, "a key of another backend moved");
    // Its replacement elsewhere, once Ready, takes the slot.
    let newcomer = backend(free_port());
    let replaced = reconfigure(
        &dir,
        proxy.port,
        &vacant,
        &ready(&[ports[0], newcomer.port, ports[2]]),
        3,
        1,
    );
    assert_eq!(replaced[slot].pod, format!("cache-{}", newcomer.port));

    let still = others_hit(proxy.port);
    // Set again, the replaced pod's keys all land on its replacement, and only those.
    set_all(proxy.port);
    let landed = stat(newcomer.port, "curr_items") as usize;
    println!(
        "a backend replaced by another at another address: {meanwhile} then {still} of the {others} keys of the other backends still hit (slot vacant, then taken); the {theirs} keys of the replaced one land on its replacement ({landed} there)"
    );
    assert_eq!(still, others, "a key of another backend moved");
    assert_eq!(
        landed, theirs,
        "the replacement serves the replaced pod's keys"
    );
}

#[test]
fn a_lost_backend_gives_misses_and_comes_back() {
    let mut backends: Vec<Running> = (0..3).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    configure(&dir, &[], &ready(&ports), 3, 1);
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
    let assigned = configure(&dir, &[], &ready(&ports), 4, 2);
    assert_eq!(
        assigned.iter().filter(|b| b.copy == 1).count(),
        2,
        "{assigned:?}"
    );
    let proxy = start_proxy(&dir);
    set_all(proxy.port);
    // A write answers with the first copy's STORED; the other copy's may still be on its
    // way: wait for it, within a bound.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let items: u64 = ports.iter().map(|p| stat(*p, "curr_items")).sum();
        if items == 2 * KEYS as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every key is written to both copies: {items} items for {KEYS} keys"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    drop(backends.remove(0));
    assert_eq!(
        hits(proxy.port),
        (KEYS, 0, 0),
        "every key is still read, from its other copy"
    );
    // The pod deleted: its slot vacant in its copy, every key is still read.
    let vacant = reconfigure(&dir, proxy.port, &assigned, &ready(&ports[1..]), 4, 2);
    assert_eq!(
        vacant.iter().filter(|b| b.is_vacant()).count(),
        1,
        "{vacant:?}"
    );
    assert_eq!(
        hits(proxy.port),
        (KEYS, 0, 0),
        "every key is still read past the vacant slot"
    );
}

#[test]
fn a_reload_under_load_drops_no_connection() {
    let backends: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let ports: Vec<u16> = backends.iter().map(|b| b.port).collect();
    let dir = ConfigDir::new();
    let mut current = configure(&dir, &[], &ready(&ports[..3]), 3, 1);
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
        current = configure(&dir, &current, &ready(pool), pool.len() as i32, 1);
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

/// Keys of the rolling-update load, drawn with a Zipf distribution.
const ZIPF_KEYS: usize = 5_000;
/// Its exponent: the hottest key is asked about 500 times as often as the 1,000th.
const ZIPF_S: f64 = 0.9;
/// Requests per point of the hit-ratio curve.
const WINDOW: usize = 500;
/// Windows of the steady state: the cache-aside load from an empty pool, 4 times as many
/// requests as keys; its last 5 windows are the steady hit ratio.
const WINDOWS_STEADY: usize = 40;
/// Windows while a slot's old pod still runs (and is read through with warm-up: twice as
/// many requests as keys), then after it has gone.
const WINDOWS_WITH_OLD: usize = 20;
const WINDOWS_AFTER: usize = 4;

/// A seeded generator (xorshift64*) and the Zipf distribution's cumulative weights.
struct Zipf {
    state: u64,
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(seed: u64) -> Zipf {
        let weights: Vec<f64> = (1..=ZIPF_KEYS).map(|k| (k as f64).powf(-ZIPF_S)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        Zipf { state: seed, cdf }
    }

    fn next(&mut self) -> usize {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let u = (self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|c| *c < u).min(ZIPF_KEYS - 1)
    }
}

/// The value of key `k`: 100 B to 2 KiB, and for one key in 50 from 20 to 100 KiB, more
/// than the proxy's 16 KiB read buffer, so a value read back crosses reads.
fn zipf_value(k: usize) -> String {
    let h = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    let len = if k % 50 == 7 {
        20_000 + (h % 80_000) as usize
    } else {
        100 + (h % 1_948) as usize
    };
    let letter = (b'a' + (k % 26) as u8) as char;
    format!("{k}:{}", letter.to_string().repeat(len))
}

/// The cache-aside client's tally, and the proxy's count of failures of its backends.
#[derive(Default)]
struct Tally {
    ratios: Vec<f64>,
    errors: usize,
    wrong: usize,
    backend_failures: u64,
}

impl Tally {
    /// `windows` windows of the load: get, and on a miss set the value (as a cache-aside
    /// client does after reading its database); every hit must be the key's value.
    fn run(&mut self, conn: &mut Conn, zipf: &mut Zipf, windows: usize) {
        for _ in 0..windows {
            let mut hits = 0;
            for _ in 0..WINDOW {
                let k = zipf.next();
                let key = format!("zipf-{k}");
                match conn.get(&key) {
                    Ok(Reply::Hit(v)) if v == zipf_value(k) => hits += 1,
                    Ok(Reply::Hit(_)) => self.wrong += 1,
                    Ok(Reply::Miss) => match conn.set(&key, &zipf_value(k)) {
                        Ok(answer) if answer == "STORED" => {}
                        _ => self.errors += 1,
                    },
                    _ => self.errors += 1,
                }
            }
            self.ratios.push(hits as f64 / WINDOW as f64);
        }
    }
}

/// The cache-aside load through the proxy on `port` from an empty pool until its steady
/// state: the connection and the key generator to go on with, and the steady hit ratio
/// (the mean of the last 5 windows).
fn steady_state(port: u16) -> (Conn, Zipf, f64) {
    let mut conn = Conn::open(port);
    let mut zipf = Zipf::new(0x5eed);
    let mut tally = Tally::default();
    tally.run(&mut conn, &mut zipf, WINDOWS_STEADY);
    let last = &tally.ratios[WINDOWS_STEADY - 5..];
    (conn, zipf, last.iter().sum::<f64>() / last.len() as f64)
}

/// A pool of 4 behind a proxy that loads the warm-up route, after the steady state of the
/// cache-aside load.
struct Loaded {
    conn: Conn,
    proxy: Running,
    pods: Vec<Running>,
    backends: Vec<ProxyBackend>,
    dir: ConfigDir,
    zipf: Zipf,
    /// The steady hit ratio.
    steady: f64,
    /// The gutter's TTL, with one.
    gutter_ttl: Option<i32>,
}

impl Loaded {
    fn new() -> Loaded {
        Loaded::with_gutter(false)
    }

    /// A pool of 4 whose proxy has the default gutter (`spec.proxy.gutter`) when `gutter`.
    fn with_gutter(gutter: bool) -> Loaded {
        let defaults = memcached_api::GutterSpec::default();
        let gutter_ttl = gutter.then_some(defaults.ttl_seconds);
        let pods: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
        let dir = ConfigDir::new();
        let ports: Vec<u16> = pods.iter().map(|p| p.port).collect();
        let backends = configure_warm(&dir, &[], &ready(&ports), &[], gutter_ttl, 4, 1);
        let proxy = start_proxy_with(&dir, gutter.then_some(defaults.memory_mib));
        let (conn, zipf, steady) = steady_state(proxy.port);
        Loaded {
            conn,
            proxy,
            pods,
            backends,
            dir,
            zipf,
            steady,
            gutter_ttl,
        }
    }

    fn live(&self) -> Vec<PoolPod> {
        ready(&self.pods.iter().map(|p| p.port).collect::<Vec<_>>())
    }

    /// Renders the ring for the live pods of a pool of `size`, warming from `warm`, and
    /// waits until the proxy has loaded it.
    fn configure(&mut self, warm: &[ProxyBackend], size: i32) {
        let before = stat(self.proxy.port, "proxy_config_reloads");
        self.backends = configure_warm(
            &self.dir,
            &self.backends,
            &self.live(),
            warm,
            self.gutter_ttl,
            size,
            1,
        );
        wait_for_reload(self.proxy.port, before);
    }

    fn run(&mut self, tally: &mut Tally, windows: usize) {
        tally.run(&mut self.conn, &mut self.zipf, windows);
    }

    fn finish(self, mut tally: Tally) -> (f64, Tally) {
        let port = self.proxy.port;
        tally.backend_failures =
            stat(port, "proxy_backend_failed") + stat(port, "proxy_backend_marked_bad");
        (self.steady, tally)
    }
}

/// A rolling update of a 4-pod pool behind the proxy, the way the Deployment rolls it (a
/// new pod starts, the old one is deleted and the new one takes its slot, the old one stops
/// once its grace is over), under a cache-aside load with Zipf-distributed keys. Returns the
/// steady hit ratio and the tally of the roll. With `warm`, each new pod's slot warms up from
/// the old pod while it still runs (`proxy::render_warm`).
fn rolling_update(warm: bool) -> (f64, Tally) {
    let mut pool = Loaded::new();
    let mut roll = Tally::default();
    // The Deployment deletes the old pod of the highest slot first (its deletion cost).
    for slot in (0..4).rev() {
        let old_port = pool
            .backends
            .iter()
            .find(|b| b.slot == slot)
            .and_then(|b| b.pod.trim_start_matches("cache-").parse::<u16>().ok())
            .expect("a pod in the slot");
        let old_at = pool
            .pods
            .iter()
            .position(|p| p.port == old_port)
            .expect("old pod");
        let old = pool.pods.remove(old_at);
        pool.pods.push(backend(free_port()));
        // The ring as it is, the old pod in its slot and the other slots vacant.
        let warm_from: Vec<ProxyBackend> = pool
            .backends
            .iter()
            .filter(|_| warm)
            .map(|b| ProxyBackend {
                pod: if b.slot == slot {
                    b.pod.clone()
                } else {
                    String::new()
                },
                address: if b.slot == slot {
                    b.address.clone()
                } else {
                    String::new()
                },
                ..b.clone()
            })
            .collect();
        pool.configure(&warm_from, 4);
        pool.run(&mut roll, WINDOWS_WITH_OLD);
        // The old pod's grace is over: it leaves the configuration (without warm-up it
        // already has) and stops.
        if warm {
            pool.configure(&[], 4);
        }
        drop(old);
        pool.run(&mut roll, WINDOWS_AFTER);
    }
    pool.finish(roll)
}

/// The pool grown from 4 pods to 5 under the same load: a fifth of the keys move to the new
/// slot. With `warm`, they are read from the previous ring for as long as an old pod is
/// read through in `rolling_update`, then the previous ring is dropped.
fn scale_out(warm: bool) -> (f64, Tally) {
    let mut pool = Loaded::new();
    let mut grown = Tally::default();
    let previous = if warm { pool.backends.clone() } else { vec![] };
    pool.pods.push(backend(free_port()));
    pool.configure(&previous, 5);
    pool.run(&mut grown, WINDOWS_WITH_OLD);
    if warm {
        pool.configure(&[], 5);
    }
    pool.run(&mut grown, WINDOWS_AFTER);
    pool.finish(grown)
}

/// The runs of `scenario` without and with warm-up compared: printed, written as CSV to
/// `$csv_var` when set (for `hack/memcached/warm-rollout-plot.py`), and asserted: nothing
/// failed and no value read was wrong in either; with warm-up no window fell below 90 % of
/// the steady hit ratio, while without it one did (so the scenario costs misses at all).
fn compare_warm_up(what: &str, csv_var: &str, scenario: fn(bool) -> (f64, Tally)) {
    let (steady_plain, plain) = scenario(false);
    let (steady_warm, warm) = scenario(true);
    let min = |t: &Tally| t.ratios.iter().copied().fold(1.0, f64::min);
    let mean = |t: &Tally| t.ratios.iter().sum::<f64>() / t.ratios.len() as f64;
    println!(
        "{what}: hit ratio per {WINDOW} requests, steady {steady_plain:.3}, without warm-up:\n{}",
        curve(&plain)
    );
    println!("steady {steady_warm:.3}, with warm-up:\n{}", curve(&warm));
    println!(
        "{what}: lowest window {:.3} without, {:.3} with warm-up; mean {:.3} without, {:.3} with",
        min(&plain),
        min(&warm),
        mean(&plain),
        mean(&warm)
    );
    write_csv(csv_var, (steady_plain, &plain), (steady_warm, &warm));
    for (run, t) in [("without", &plain), ("with", &warm)] {
        // A write-back that sent less than the value it announced would desynchronize the
        // new pod's connection: its requests time out and the proxy counts the failures.
        assert_eq!(
            (t.errors, t.wrong, t.backend_failures),
            (0, 0, 0),
            "{what}: errors, wrong values and backend failures {run} warm-up"
        );
    }
    assert_eq!(steady_plain, steady_warm, "the same load before the {what}");
    assert!(
        min(&warm) >= 0.9 * steady_warm,
        "{what} with warm-up: a window fell to {:.3}, under 90 % of {steady_warm:.3}",
        min(&warm)
    );
    assert!(
        min(&plain) < 0.9 * steady_plain,
        "{what} without warm-up should cost misses: lowest window {:.3}",
        min(&plain)
    );
}

/// A run's hit ratios, one per window.
fn curve(t: &Tally) -> String {
    t.ratios
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The hit ratios of a run without and one with, window by window, as CSV in the file
/// `$var` names, when set (for `hack/memcached/warm-rollout-plot.py`).
fn write_csv(var: &str, without: (f64, &Tally), with: (f64, &Tally)) {
    let Some(path) = std::env::var_os(var) else {
        return;
    };
    let mut csv = "request,steady_without,without,steady_with,with\n".to_string();
    for (i, (p, w)) in without.1.ratios.iter().zip(&with.1.ratios).enumerate() {
        let _ = writeln!(
            csv,
            "{},{:.4},{p:.4},{:.4},{w:.4}",
            (i + 1) * WINDOW,
            without.0,
            with.0
        );
    }
    std::fs::write(&path, csv).expect("write the CSV");
}

/// One raw request and its answer's lines up to `last` (a line starting with it).
fn raw(port: u16, request: &str, last: &str) -> Vec<String> {
    let mut conn = Conn::open(port);
    conn.writer.write_all(request.as_bytes()).expect("send");
    let mut lines = Vec::new();
    loop {
        let line = conn.line().expect("answer");
        let done = line.starts_with(last);
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// `mg KEY v f t` on the backend at `port` once it holds the key (within 10 s): the header
/// and the value.
fn added_to(port: u16, key: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = raw(port, &format!("mg {key} v f t\r\nmn\r\n"), "MN");
        if lines.first().is_some_and(|l| l.starts_with("VA ")) || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The warm-up route on an idle proxy, key by key: a miss of the new pod is answered from
/// the pod it replaces and added to the new pod, with its flags and remaining TTL (the add
/// is not awaited by the answer: polled for); a value the new pod has is never read from
/// the old one nor overwritten; a delete reaches both, so the old value does not come back.
#[test]
fn a_warming_slot_answers_a_miss_from_the_old_pod_and_adds_it_to_the_new_one() {
    let (old, new) = (backend(free_port()), backend(free_port()));
    raw(old.port, "set k1 7 300 5\r\nold-1\r\n", "STORED");
    raw(old.port, "set k2 0 0 5\r\nold-2\r\n", "STORED");
    raw(new.port, "set k2 0 0 5\r\nnew-2\r\n", "STORED");
    raw(old.port, "set k3 0 0 5\r\nold-3\r\n", "STORED");
    raw(old.port, "set k4 0 0 5\r\nold-4\r\n", "STORED");
    let dir = ConfigDir::new();
    let predecessor = ProxyBackend {
        zone: None,
        copy: 1,
        slot: 0,
        pod: format!("cache-{}", old.port),
        address: format!("127.0.0.1:{}", old.port),
        warm_from: None,
        grown_from: None,
    };
    configure_warm(&dir, &[], &ready(&[new.port]), &[predecessor], None, 1, 1);
    let proxy = start_warm_proxy(&dir);
    let mut conn = Conn::open(proxy.port);

    assert_eq!(conn.get("k1").expect("get"), Reply::Hit("old-1".into()));
    let added = added_to(new.port, "k1");
    let header = added.first().cloned().unwrap_or_default();
    let ttl: i64 = header
        .split(' ')
        .find_map(|t| t.strip_prefix('t')?.parse().ok())
        .unwrap_or(-1);
    assert!(
        header.starts_with("VA 5 ") && header.contains(" f7") && (250..=300).contains(&ttl),
        "k1 added to the new pod, with its flags and TTL: {added:?}"
    );
    assert_eq!(added.get(1).map(String::as_str), Some("old-1"));
    // The new pod's own value wins, and stays.
    assert_eq!(conn.get("k2").expect("get"), Reply::Hit("new-2".into()));
    assert_eq!(raw(new.port, "get k2\r\n", "END")[1], "new-2");
    // Deleted through the proxy: gone from both, not read back from the old pod.
    assert_eq!(conn.delete("k3").expect("delete"), "NOT_FOUND");
    assert_eq!(conn.get("k3").expect("get"), Reply::Miss);
    assert_eq!(raw(old.port, "get k3\r\n", "END"), ["END"]);
    // Meta reads warm up the same way.
    conn.writer.write_all(b"mg k4 v\r\n").expect("send");
    assert_eq!(
        (conn.line().ok(), conn.line().ok()),
        (Some("VA 5".into()), Some("old-4".into()))
    );
    assert_eq!(
        added_to(new.port, "k4").get(1).map(String::as_str),
        Some("old-4")
    );
    assert_eq!(stat(proxy.port, "proxy_backend_failed"), 0);
    // A proxy without the warm-up route (started before warm-up was turned on) loads the
    // same routes and serves them plainly.
    let plain = start_proxy(&dir);
    raw(old.port, "set k5 0 0 5\r\nold-5\r\n", "STORED");
    assert_eq!(Conn::open(plain.port).get("k5").expect("get"), Reply::Miss);
    assert_eq!(
        Conn::open(plain.port).get("k1").expect("get"),
        Reply::Hit("old-1".into())
    );
    // Warm-up turned off: the ConfigMap loses the route's file and the routes are plain; a
    // proxy started with it reloads them (until its pod is replaced) and serves on.
    std::fs::remove_file(dir.0.join(proxy::WARM_KEY)).expect("remove warm.lua");
    let before = stat(proxy.port, "proxy_config_reloads");
    configure(&dir, &[], &ready(&[new.port]), 1, 1);
    wait_for_reload(proxy.port, before);
    assert_eq!(conn.get("k5").expect("get"), Reply::Miss);
    assert_eq!(
        Conn::open(proxy.port).get("k1").expect("get"),
        Reply::Hit("old-1".into())
    );
}

/// Warm rollouts, with real memcached and the real proxy (ours, with the two fixes of
/// `hack/memcached/proxy-read-fixes.patch`): during a rolling update of every pod, each
/// slot's new pod is read first and, on a miss, the pod it replaces, whose value is answered
/// and added to the new pod. The hit ratio never falls below 90 % of its steady value,
/// while without warm-up it does at each step; no value read is ever wrong (the values
/// of 20–100 KiB are written back whole), and nothing fails.
#[test]
fn a_rolling_update_with_warm_up_keeps_the_hit_ratio() {
    compare_warm_up("rolling update", "WARM_ROLLOUT_CSV", rolling_update);
}

/// The same for a scale-out from 4 pods to 5: the keys that move to the new slot are read
/// from where they lived before (the previous ring) and added to the new pod.
#[test]
fn a_scale_out_with_warm_up_keeps_the_hit_ratio() {
    compare_warm_up("scale-out", "WARM_SCALE_OUT_CSV", scale_out);
}

/// The gutter (`spec.proxy.gutter`) on an idle proxy, key by key, its pod killed: a read
/// of a key of the failed pod is a miss, not an error; a write fails for the client (as
/// without a gutter) but its value is kept in the proxy's own cache and read back, with
/// the gutter's TTL in place of the client's, and gone once that has passed; a delete and
/// an incr are made there too; a `touch` does not reach it. Once the pod is back
/// (restarted, empty) its keys are read from it, and a write it takes drops the key from
/// the gutter, so a later failure cannot bring back the older value.
#[test]
fn a_failed_pods_keys_are_kept_in_the_gutter_for_its_ttl() {
    let pod = backend(free_port());
    let port = pod.port;
    let dir = ConfigDir::new();
    configure_warm(&dir, &[], &ready(&[port]), &[], Some(2), 1, 1);
    let proxy = start_proxy_with(&dir, Some(8));
    let mut conn = Conn::open(proxy.port);
    assert_eq!(conn.set("k1", "on-pod").expect("set"), "STORED");
    assert_eq!(stat(proxy.port, "curr_items"), 0, "not in the gutter");

    drop(pod);
    let failed = "SERVER_ERROR backend failure";
    assert_eq!(conn.get("k1").expect("get"), Reply::Miss);
    assert_eq!(conn.set("k1", "gutter").expect("set"), failed);
    assert_eq!(conn.get("k1").expect("get"), Reply::Hit("gutter".into()));
    let header = raw(proxy.port, "mg k1 t\r\n", "HD");
    let ttl: i64 = header[0]
        .split(' ')
        .find_map(|t| t.strip_prefix('t')?.parse().ok())
        .unwrap_or(-1);
    assert!((1..=2).contains(&ttl), "the gutter's TTL: {header:?}");
    assert_eq!(raw(proxy.port, "touch k1 300\r\n", "")[0], failed);
    // A meta read's own TTL (a touch) and a meta arithmetic's creation TTL are held to
    // the gutter's.
    let ttl_of = |header: &str| -> i64 {
        header
            .split(' ')
            .find_map(|t| t.strip_prefix('t')?.parse().ok())
            .unwrap_or(-1)
    };
    let touched = raw(proxy.port, "mg k1 T300 t\r\n", "HD");
    assert!((1..=2).contains(&ttl_of(&touched[0])), "{touched:?}");
    assert_eq!(raw(proxy.port, "ma c N300\r\n", "")[0], failed);
    let created = raw(proxy.port, "mg c t v\r\nmn\r\n", "MN");
    assert!(
        created[0].starts_with("VA ") && (1..=2).contains(&ttl_of(&created[0])),
        "{created:?}"
    );
    assert_eq!(conn.delete("k1").expect("delete"), failed);
    assert_eq!(
        conn.get("k1").expect("get"),
        Reply::Miss,
        "deleted in the gutter"
    );
    assert_eq!(conn.set("n", "5").expect("set"), failed);
    assert_eq!(raw(proxy.port, "incr n 3\r\n", "")[0], failed);
    assert_eq!(conn.get("n").expect("get"), Reply::Hit("8".into()));
    assert_eq!(conn.set("k2", "short").expect("set"), failed);
    assert_eq!(conn.get("k2").expect("get"), Reply::Hit("short".into()));
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(
        conn.get("k2").expect("get"),
        Reply::Miss,
        "gone from the gutter after its TTL"
    );
    assert_eq!(conn.set("k3", "gutter").expect("set"), failed);

    // The pod restarted at its address, empty: the proxy reconnects by itself, and its
    // keys are read from it, not from the gutter.
    let back_again = |port: u16| {
        let back = backend(port);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Conn::open(proxy.port).set("probe", "x").ok().as_deref() != Some("STORED") {
            assert!(
                Instant::now() < deadline,
                "the proxy did not use the pod again"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        back
    };
    let back = back_again(port);
    assert_eq!(conn.get("k3").expect("get"), Reply::Miss);

    // A write the pod takes drops the key from the gutter, so when the pod fails again the
    // gutter's older value does not come back (a longer TTL, so that it would).
    let before = stat(proxy.port, "proxy_config_reloads");
    configure_warm(&dir, &[], &ready(&[port]), &[], Some(60), 1, 1);
    wait_for_reload(proxy.port, before);
    drop(back);
    assert_eq!(conn.set("k4", "gutter").expect("set"), failed);
    assert_eq!(conn.get("k4").expect("get"), Reply::Hit("gutter".into()));
    let back = back_again(port);
    assert_eq!(conn.set("k4", "on-pod").expect("set"), "STORED");
    drop(back);
    assert_eq!(conn.get("k4").expect("get"), Reply::Miss);
}

/// Windows with a pool pod failed (before Kubernetes replaces it), then replaced.
const WINDOWS_FAILED: usize = 30;
const WINDOWS_REPLACED: usize = 10;

/// A pod of a 4-pod pool killed under the cache-aside load: `WINDOWS_FAILED` windows while
/// it is still in the ring (as a pod on a lost node is until it is deleted), then its
/// replacement takes the slot for `WINDOWS_REPLACED` windows. With `gutter`, the proxy has
/// the default gutter.
fn failed_pod(gutter: bool) -> (f64, Tally) {
    let mut pool = Loaded::with_gutter(gutter);
    let mut failed = Tally::default();
    let port = pool
        .backends
        .iter()
        .find(|b| b.slot == 1)
        .and_then(|b| b.pod.trim_start_matches("cache-").parse::<u16>().ok())
        .expect("a pod in slot 1");
    let at = pool
        .pods
        .iter()
        .position(|p| p.port == port)
        .expect("the pod");
    drop(pool.pods.remove(at));
    pool.run(&mut failed, WINDOWS_FAILED);
    pool.pods.push(backend(free_port()));
    pool.configure(&[], 4);
    pool.run(&mut failed, WINDOWS_REPLACED);
    pool.finish(failed)
}

/// The gutter, with real memcached and the real proxy: while a pod of the pool is down,
/// the keys of its slot are kept in the proxies' own caches for the gutter's TTL, so the
/// hit ratio comes back to within 90 % of its steady value after a few windows, while
/// without a gutter the reads of those keys miss for as long as the pod is down. Either
/// way the writes of those keys fail for the client. No value read is ever wrong, before
/// or after the replacement takes the slot.
#[test]
fn a_failed_pod_with_a_gutter_keeps_the_hit_ratio() {
    let (steady_plain, plain) = failed_pod(false);
    let (steady_gutter, gutter) = failed_pod(true);
    // The last 10 windows with the pod down.
    let late = |t: &Tally| {
        t.ratios[WINDOWS_FAILED - 10..WINDOWS_FAILED]
            .iter()
            .sum::<f64>()
            / 10.0
    };
    println!(
        "a failed pod: hit ratio per {WINDOW} requests, steady {steady_plain:.3}, without a gutter ({} errors):\n{}",
        plain.errors,
        curve(&plain)
    );
    println!(
        "steady {steady_gutter:.3}, with a gutter ({} errors):\n{}",
        gutter.errors,
        curve(&gutter)
    );
    println!(
        "a failed pod: last 10 windows while down {:.3} without, {:.3} with a gutter",
        late(&plain),
        late(&gutter)
    );
    write_csv(
        "GUTTER_CSV",
        (steady_plain, &plain),
        (steady_gutter, &gutter),
    );
    assert_eq!(
        steady_plain, steady_gutter,
        "the same load before the failure"
    );
    assert_eq!((plain.wrong, gutter.wrong), (0, 0), "wrong values read");
    assert!(
        plain.errors > 0 && gutter.errors > 0,
        "the failed pod's writes fail for the client, with a gutter too"
    );
    assert!(
        late(&gutter) >= 0.9 * steady_gutter,
        "with a gutter: {:.3} while the pod is down, under 90 % of {steady_gutter:.3}",
        late(&gutter)
    );
    assert!(
        late(&plain) < 0.9 * steady_plain,
        "without a gutter the failed pod costs misses: {:.3}",
        late(&plain)
    );
}

/// Warm-up and the gutter together, as a pool with both renders them: a warming slot's
/// miss is still answered from the old pod; with both pods killed, a write of the slot
/// fails for the client, is kept in the gutter and read back from it.
#[test]
fn warm_up_and_the_gutter_work_together() {
    let (old, new) = (backend(free_port()), backend(free_port()));
    raw(old.port, "set k1 0 0 5\r\nold-1\r\n", "STORED");
    let dir = ConfigDir::new();
    let predecessor = ProxyBackend {
        zone: None,
        copy: 1,
        slot: 0,
        pod: format!("cache-{}", old.port),
        address: format!("127.0.0.1:{}", old.port),
        warm_from: None,
        grown_from: None,
    };
    configure_warm(
        &dir,
        &[],
        &ready(&[new.port]),
        &[predecessor],
        Some(30),
        1,
        1,
    );
    let proxy = start_proxy_with(&dir, Some(8));
    let mut conn = Conn::open(proxy.port);
    assert_eq!(conn.get("k1").expect("get"), Reply::Hit("old-1".into()));
    assert_eq!(
        added_to(new.port, "k1").get(1).map(String::as_str),
        Some("old-1")
    );

    drop(new);
    drop(old);
    assert_eq!(
        conn.set("k2", "gutter").expect("set"),
        "SERVER_ERROR backend failure"
    );
    assert_eq!(conn.get("k2").expect("get"), Reply::Hit("gutter".into()));
    assert_eq!(stat(proxy.port, "proxy_config_reload_fails"), 0);
}

/// The rings the operator computes for `pods` (each with its zone) in `copies` copies tied
/// to `zones` (none: not tied), rendered into `dir`.
fn configure_zoned(
    dir: &ConfigDir,
    pods: &[PoolPod],
    copies: i32,
    zones: &[String],
) -> Vec<ProxyBackend> {
    let size = pods.len() as i32;
    let mut backends = proxy::membership(&[], pods, &[], size, copies, zones, 0).backends;
    for b in &mut backends {
        b.address = format!("127.0.0.1:{}", b.pod.trim_start_matches("cache-"));
    }
    let file = dir.file();
    let (text, _) = proxy::render("test/pool", &backends, copies, &file.to_string_lossy());
    dir.write(&text);
    backends
}

/// A proxy reading the routes in `dir`, its pod in `zone` (its environment variable).
fn start_proxy_in(dir: &ConfigDir, zone: &str) -> Running {
    let port = free_port();
    let args = proxy::proxy_args(i32::from(port), &dir.file().to_string_lossy());
    start_with_env(&args[1..], port, &[(proxy::ZONE_ENV, zone)])
}

/// The zones of the zone-loss runs; the proxy is in the first.
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
/// Pods per zone in the zone-loss runs.
const PODS_PER_ZONE: usize = 4;

/// How a zone-loss run went: the steady hit ratio, the tally while the zone is lost, and
/// at steady state the reads that reached another zone's pods and the client's misses
/// over the same windows.
struct ZoneLoss {
    steady: f64,
    lost: Tally,
    reads_elsewhere: u64,
    misses: usize,
}

/// A pool of 12 pods, 4 in each of 3 zones, behind a proxy in zone-a, under the
/// cache-aside load; then every pod of zone-a is killed (a lost zone: the pods are still
/// in the rings, as they are until Kubernetes deletes them). With `zoned`, 3 copies, one
/// per zone (`spec.proxy.zones`); without, one copy sharded over the 12 pods.
fn zone_loss(zoned: bool) -> ZoneLoss {
    let mut pods: Vec<Running> = (0..ZONES.len() * PODS_PER_ZONE)
        .map(|_| backend(free_port()))
        .collect();
    let zone_of = |i: usize| ZONES[i % ZONES.len()];
    let members: Vec<PoolPod> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| PoolPod {
            zone: Some(zone_of(i).to_string()),
            ..pod(p.port, true)
        })
        .collect();
    let (copies, zones): (i32, Vec<String>) = if zoned {
        (3, ZONES.iter().map(|z| z.to_string()).collect())
    } else {
        (1, Vec::new())
    };
    let dir = ConfigDir::new();
    let backends = configure_zoned(&dir, &members, copies, &zones);
    if zoned {
        for (copy, zone) in ZONES.iter().enumerate() {
            let ring: Vec<&ProxyBackend> = backends
                .iter()
                .filter(|b| b.copy == copy as i32 + 1)
                .collect();
            assert_eq!(ring.len(), PODS_PER_ZONE, "{backends:?}");
            assert!(ring.iter().all(|b| b.zone.as_deref() == Some(zone)));
        }
    }
    let proxy = start_proxy_in(&dir, ZONES[0]);

    let (mut conn, mut zipf, steady) = steady_state(proxy.port);

    // Where the reads go at steady state: the gets each pod outside zone-a answers.
    let elsewhere = |pods: &[Running]| -> u64 {
        pods.iter()
            .enumerate()
            .filter(|(i, _)| zone_of(*i) != ZONES[0])
            .map(|(_, p)| stat(p.port, "cmd_get"))
            .sum()
    };
    let before = elsewhere(&pods);
    let mut local = Tally::default();
    local.run(&mut conn, &mut zipf, 5);
    let reads_elsewhere = elsewhere(&pods) - before;
    let misses = local
        .ratios
        .iter()
        .map(|r| WINDOW - (r * WINDOW as f64).round() as usize)
        .sum();

    // Zone-a is lost.
    let mut i = 0;
    pods.retain(|_| {
        i += 1;
        zone_of(i - 1) != ZONES[0]
    });
    let mut lost = Tally::default();
    lost.run(&mut conn, &mut zipf, WINDOWS_FAILED);
    lost.backend_failures =
        stat(proxy.port, "proxy_backend_failed") + stat(proxy.port, "proxy_backend_marked_bad");
    ZoneLoss {
        steady,
        lost,
        reads_elsewhere,
        misses,
    }
}

/// Zone-aware copies, with real memcached and the real proxy: a proxy reads its own zone's
/// copy (the other zones' pods see only the reads that missed there), and when its whole
/// zone is lost, every key keeps being read from the other zones' copies, with no miss and
/// no failed write; with one copy sharded over the same 12 pods, the lost zone's third of
/// the keys miss and their writes fail.
#[test]
fn with_zone_copies_losing_a_zone_costs_no_misses() {
    let plain = zone_loss(false);
    let zoned = zone_loss(true);
    let mean = |t: &Tally| t.ratios.iter().sum::<f64>() / t.ratios.len() as f64;
    let min = |t: &Tally| t.ratios.iter().copied().fold(1.0, f64::min);
    println!(
        "zone-a lost: hit ratio per {WINDOW} requests, steady {:.3}, one copy ({} errors):\n{}",
        plain.steady,
        plain.lost.errors,
        curve(&plain.lost)
    );
    println!(
        "steady {:.3}, a copy per zone ({} errors):\n{}",
        zoned.steady,
        zoned.lost.errors,
        curve(&zoned.lost)
    );
    println!(
        "zone-a lost: mean {:.3} one copy, {:.3} zone copies; lowest window {:.3}, {:.3}; at steady state the zone copies' proxy sent {} reads to other zones for {} misses in {} requests",
        mean(&plain.lost),
        mean(&zoned.lost),
        min(&plain.lost),
        min(&zoned.lost),
        zoned.reads_elsewhere,
        zoned.misses,
        5 * WINDOW
    );
    write_csv(
        "ZONES_CSV",
        (plain.steady, &plain.lost),
        (zoned.steady, &zoned.lost),
    );
    assert_eq!(
        (plain.lost.wrong, zoned.lost.wrong),
        (0, 0),
        "wrong values read"
    );
    // Reads stay in the proxy's zone: another zone is asked only after a miss there (at
    // most once per other zone).
    assert!(
        zoned.reads_elsewhere <= 2 * zoned.misses as u64,
        "{} reads reached other zones for {} misses",
        zoned.reads_elsewhere,
        zoned.misses
    );
    assert!(zoned.lost.backend_failures > 0, "zone-a's pods failed");
    assert_eq!(zoned.lost.errors, 0, "with zone copies no write failed");
    assert!(
        min(&zoned.lost) >= 0.95 * zoned.steady,
        "with zone copies a window fell to {:.3}, under 95 % of {:.3}",
        min(&zoned.lost),
        zoned.steady
    );
    assert!(
        plain.lost.errors > 0 && mean(&plain.lost) < 0.9 * plain.steady,
        "with one copy the lost zone costs misses and failed writes: mean {:.3}, {} errors",
        mean(&plain.lost),
        plain.lost.errors
    );
}

/// A proxy pod whose zone is unknown (its environment variable empty: the pod has no zone
/// label), or none of the copies', loads the zoned routes and serves from every zone's copy.
#[test]
fn zoned_routes_load_without_a_zone() {
    let pods: Vec<Running> = (0..3).map(|_| backend(free_port())).collect();
    let members: Vec<PoolPod> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| PoolPod {
            zone: Some(ZONES[i].to_string()),
            ..pod(p.port, true)
        })
        .collect();
    let zones: Vec<String> = ZONES.iter().map(|z| z.to_string()).collect();
    let dir = ConfigDir::new();
    configure_zoned(&dir, &members, 3, &zones);
    let text = std::fs::read_to_string(dir.file()).expect("the routes");
    assert!(text.contains("set_zones"), "{text}");
    let proxy = start_proxy_in(&dir, "");
    let mut conn = Conn::open(proxy.port);
    assert_eq!(conn.set("k", "v").expect("set"), "STORED");
    assert_eq!(conn.get("k").expect("get"), Reply::Hit("v".into()));
    // Nor does a zone that is none of the copies'.
    let other = start_proxy_in(&dir, "zone-x");
    assert_eq!(
        Conn::open(other.port).get("k").expect("get"),
        Reply::Hit("v".into())
    );
    // Written to every zone's pod.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pods.iter().map(|p| stat(p.port, "curr_items")).sum::<u64>() < 3 {
        assert!(Instant::now() < deadline, "the key reaches every zone");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scale-out warming up from the ring before it, as the operator renders it (the
/// previous ring, and the moved ring telling the keys of the new slot apart): every
/// `incr` and `append` sent through the proxy is applied once, to the moved keys' former
/// pods and to every other key's own pod, so each key reads back exactly once changed;
/// a moved key is read from its former pod and written back to the new one.
#[test]
fn a_scale_out_changes_every_key_once_while_it_warms_up() {
    const N: usize = 400;
    let mut pods: Vec<Running> = (0..4).map(|_| backend(free_port())).collect();
    let dir = ConfigDir::new();
    let ports = |pods: &[Running]| pods.iter().map(|p| p.port).collect::<Vec<_>>();
    let before = configure(&dir, &[], &ready(&ports(&pods)), 4, 1);
    let proxy = start_warm_proxy(&dir);
    let mut conn = Conn::open(proxy.port);
    let command = |conn: &mut Conn, request: String| -> String {
        conn.writer.write_all(request.as_bytes()).expect("send");
        conn.line().expect("answer")
    };
    for i in 0..N {
        assert_eq!(conn.set(&format!("n-{i}"), "10").expect("set"), "STORED");
        assert_eq!(conn.set(&format!("s-{i}"), "v").expect("set"), "STORED");
    }
    pods.push(backend(free_port()));
    let reloads = stat(proxy.port, "proxy_config_reloads");
    let after = configure_warm(&dir, &before, &ready(&ports(&pods)), &before, None, 5, 1);
    assert_eq!(after.len(), 5);
    wait_for_reload(proxy.port, reloads);
    let new = pods[4].port;

    let (mut not_found, mut not_stored) = (0, 0);
    for i in 0..N {
        match command(&mut conn, format!("incr n-{i} 1\r\n")).as_str() {
            "11" => {}
            "NOT_FOUND" => not_found += 1,
            other => panic!("incr n-{i}: {other}"),
        }
        match command(&mut conn, format!("append s-{i} 0 0 1\r\nx\r\n")).as_str() {
            "STORED" => {}
            "NOT_STORED" => not_stored += 1,
            other => panic!("append s-{i}: {other}"),
        }
    }
    // The moved keys: on the new pod nothing yet (its answer is the client's), changed on
    // their former pods.
    for moved in [not_found, not_stored] {
        assert!(
            (N / 10..N / 3).contains(&moved),
            "{moved} of {N} keys moved to the fifth slot"
        );
    }
    let moved = (not_found + not_stored) as u64;
    assert_eq!(
        stat(new, "curr_items"),
        0,
        "nothing written to the new pod yet"
    );
    for i in 0..N {
        assert_eq!(
            conn.get(&format!("n-{i}")).expect("get"),
            Reply::Hit("11".into()),
            "n-{i}"
        );
        assert_eq!(
            conn.get(&format!("s-{i}")).expect("get"),
            Reply::Hit("vx".into()),
            "s-{i}"
        );
    }
    // Read once, the moved keys were written back to the new pod (not awaited).
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(new, "curr_items") < moved {
        assert!(
            Instant::now() < deadline,
            "the moved keys are written back to the new pod"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stat(new, "curr_items"), moved);
}
