//! Whether the memory the builder gives memcached's container holds what a real memcached,
//! started with the builder's own flags, uses at its worst. `pool_memory_mib` (request =
//! limit: the cache `-m`, 25%, 48 MiB and the connections' buffers, plus extstore's write
//! buffers) is compared with the process's peak resident set (`VmHWM`) after:
//!
//! - as many connections as memcached accepts under its `-c`, each in the middle of a
//!   request: a line without its end keeps the connection's read buffer (16 KiB, its first
//!   page written); over TLS that line's record is whole and the next one is not, which
//!   also keeps OpenSSL's record buffer;
//! - a fill to eviction: tiny items (the most items, so the largest hash table, through its
//!   expansions to the size that many items make it), items near `-I`, or 2 KiB values that
//!   go to extstore's file;
//! - then one item of every size: memcached gives a slab class with no page its first page
//!   even when `-m` is used up (slabs.c, `do_slabs_newslab`), so its slabs may exceed `-m`
//!   by a page (1 MiB) per class (38 more classes at `-I 1m`).
//!
//! It prints the table of BENCHMARKS.md ("Memory headroom of the derived limit"):
//! `cargo test -p memcached-operator --test real_memcached_memory -- --nocapture`.
//! It runs memcached 1.6.38, as `make memcached-proxy` builds it (the image runs 1.6.39),
//! and fails naming that command when it is missing; Debian's 1.6.18 measures the same
//! within 1.5 MiB, with one difference only under extstore (BENCHMARKS.md).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use memcached_api::{ExtstoreSpec, Memcached, MemcachedConfig, MemcachedSpec, TlsSpec};
use memcached_operator::builders;

mod common;
use common::process::{TempDir, free_port, recent_memcached};
use common::real_node::{Text, stat};
use common::tls::TlsStream;

const MIB: u64 = 1024 * 1024;
/// How long any one condition may take (a fill, a listener, an expansion): only a failing
/// test waits it out.
const DEADLINE: Duration = Duration::from_secs(300);
/// Connections that fill the cache and read its stats, opened before the held ones.
const FILLERS: usize = 4;

// ---------------------------------------------------------------------------------------
// The memcached process

/// `memcached -V`'s version.
fn version(binary: &str) -> String {
    let out = Command::new(binary)
        .arg("-V")
        .output()
        .unwrap_or_else(|e| panic!("{binary} -V: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("memcached ")
        .to_string()
}

struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Starts `args` (argv[0] replaced by `binary`). Without a `-l` of the builder's it
    /// listens on loopback only; as root it runs as `nobody` (memcached refuses root
    /// without `-u`; in the pod it runs as UID 11211).
    fn start(binary: &str, args: &[String], dir: &Path) -> Running {
        let mut argv = args[1..].to_vec();
        if !argv.iter().any(|a| a == "-l") {
            argv.extend(["-l".to_string(), "127.0.0.1".to_string()]);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            argv.extend(["-u".to_string(), "nobody".to_string()]);
        }
        let log = dir.join("memcached.log");
        let out = std::fs::File::create(&log).expect("memcached's log file");
        let err = out.try_clone().expect("memcached's log file");
        let child = Command::new(binary)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{binary} starts: {e}"));
        Running { child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("memcached exited ({status}): {}", self.output());
        }
    }

    /// Waits until something listens on `port`, failing if memcached exits.
    fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + DEADLINE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "memcached did not listen on {port} within {DEADLINE:?}: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A field of /proc/PID/status in KiB (`VmHWM`: the peak resident set; `VmRSS`: now).
    fn status_kib(&self, field: &str) -> u64 {
        let path = format!("/proc/{}/status", self.child.id());
        let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{path} has no {field}: {status}"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces `from` by `to` in every argument, failing unless it occurs somewhere (so a
/// change of the builder's output does not make the rewrite, and the test, silently moot).
fn rewrite(args: &mut [String], from: &str, to: &str) {
    assert!(
        args.iter().any(|a| a.contains(from)),
        "{from:?} is not in {args:?}"
    );
    for arg in args.iter_mut() {
        *arg = arg.replace(from, to);
    }
}

/// The test's own open-file limit raised to cover `needed` descriptors (one per connection
/// it holds), up to the hard limit; fails naming the limit when that is too low.
fn raise_open_files(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit fill or read the struct they are given.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0,
        "getrlimit"
    );
    if limit.rlim_cur < needed {
        limit.rlim_cur = limit.rlim_max.min(needed);
        // SAFETY: as above.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
    assert!(
        limit.rlim_cur >= needed,
        "the test holds {needed} connections but may open {} files: raise the hard limit (ulimit -Hn {needed})",
        limit.rlim_cur
    );
}

// ---------------------------------------------------------------------------------------
// The cases

#[derive(Clone, Copy, PartialEq, Debug)]
enum Load {
    /// 1-byte values: the most items per MiB, so the largest hash table.
    Tiny,
    /// Values just under `-I`.
    Large,
    /// 2 KiB values (above `ext_item_size`), moved to extstore's file.
    Extstore,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Held {
    Plain,
    Tls,
}

struct Case {
    memory_mib: i32,
    load: Load,
    held: Held,
}

impl Case {
    fn name(&self) -> String {
        let load = match self.load {
            Load::Tiny => "tiny items",
            Load::Large => "items near -I",
            Load::Extstore => "extstore, 2 KiB values",
        };
        let held = match self.held {
            Held::Plain => "plain",
            Held::Tls => "TLS",
        };
        format!("{load}, {held} connections")
    }

    /// The spec: the defaults (`-c 1024`, `-t 4`, `-I 1m`) with this cache, TLS and
    /// extstore (its defaults: 1 GiB file, 64 MiB pages, six 4 MiB write buffers).
    fn spec(&self, port: u16) -> MemcachedSpec {
        let spec = MemcachedSpec {
            container_port: i32::from(port),
            config: Some(MemcachedConfig {
                memory_mib: self.memory_mib,
                ..MemcachedConfig::default()
            }),
            tls: (self.held == Held::Tls).then(|| TlsSpec::secret("certs")),
            extstore: (self.load == Load::Extstore).then(Box::<ExtstoreSpec>::default),
            ..MemcachedSpec::with_size(1)
        };
        let mut mc = Memcached::new("headroom", spec.clone());
        mc.metadata.namespace = Some("default".into());
        memcached_api::validation::validate(&mc).expect("a valid spec");
        spec
    }
}

/// What one case measured.
struct Row {
    version: String,
    memory_mib: i32,
    load: Load,
    case: String,
    held: u64,
    hash_power: (u64, u64),
    items: u64,
    evictions: u64,
    slab_mib: f64,
    idle_mib: f64,
    /// What holding the connections added to the resident set.
    held_mib: f64,
    /// The peak after the fill, before one item of every size.
    filled_mib: f64,
    peak_mib: f64,
    limit_mib: i64,
}

impl Row {
    fn margin_percent(&self) -> f64 {
        let limit = self.limit_mib as f64;
        (limit - self.peak_mib) / limit * 100.0
    }
}

fn run(binary: &str, case: &Case) -> Row {
    let dir = TempDir::new("headroom");
    // memcached runs as `nobody` in a root test run: it reads the key and writes extstore's
    // file here.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod the temp dir");
    let port = free_port();
    let spec = case.spec(port);
    let limit_mib = builders::pool_memory_mib(&spec);
    let config = spec.config();
    let item_max = usize::try_from(
        memcached_api::validation::parse_item_size(&config.max_item_size).expect("-I parses"),
    )
    .expect("-I fits");

    let mut args = builders::pool_args(&spec);
    // Fills go to a plain port: the TLS case's loopback listener for the reload agent.
    let mut fill_port = port;
    if case.held == Held::Tls {
        let admin = free_port();
        write_certificate(dir.path());
        rewrite(
            &mut args,
            builders::TLS_DIR,
            &dir.path().display().to_string(),
        );
        rewrite(
            &mut args,
            &format!("*:{port},notls:127.0.0.1:{}", memcached_api::TLS_ADMIN_PORT),
            &format!("127.0.0.1:{port},notls:127.0.0.1:{admin}"),
        );
        fill_port = admin;
    }
    if case.load == Load::Extstore {
        let file = dir.path().join("extstore");
        rewrite(
            &mut args,
            builders::EXTSTORE_FILE,
            &file.display().to_string(),
        );
    }
    let mut memcached = Running::start(binary, &args, dir.path());
    memcached.wait_listening(port);
    memcached.wait_listening(fill_port);
    let idle_kib = memcached.status_kib("VmRSS");

    let mut stats = plain(fill_port);
    let start_power = stat(&stats.stats(""), "hash_power_level");

    // The fillers first, then every connection memcached still accepts.
    let fillers: Vec<TcpStream> = (0..FILLERS).map(|_| connect(fill_port)).collect();
    let held = match case.held {
        Held::Plain => (hold_plain(port), Vec::new()),
        Held::Tls => (Vec::new(), hold_tls(port)),
    };
    memcached.assert_running();
    let held_kib = memcached.status_kib("VmRSS");
    let connections = stat(&stats.stats(""), "curr_connections");
    let max = u64::try_from(config.max_connections).expect("-c");
    // memcached keeps some descriptors for itself (listeners, its threads' pipes, files).
    assert!(
        connections + 48 >= max,
        "{}: memcached took {connections} connections of -c {max}",
        case.name()
    );

    fill(&mut stats, fillers, case, item_max);
    memcached.assert_running();
    let filled_kib = memcached.status_kib("VmHWM");
    every_size(&mut stats, item_max);

    // The hash table's expansion (a background thread moves the items to a table twice
    // the size, holding both) has run to its end.
    let deadline = Instant::now() + DEADLINE;
    let after = loop {
        let s = stats.stats("");
        if stat(&s, "hash_is_expanding") == 0 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the hash table still expanding after {DEADLINE:?}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let slabs = stats.stats("slabs");
    memcached.assert_running();
    let peak_kib = memcached.status_kib("VmHWM");
    drop(held);

    Row {
        version: version(binary),
        memory_mib: case.memory_mib,
        load: case.load,
        case: case.name(),
        held: connections,
        hash_power: (start_power, stat(&after, "hash_power_level")),
        items: stat(&after, "curr_items"),
        evictions: stat(&after, "evictions"),
        slab_mib: stat(&slabs, "total_malloced") as f64 / MIB as f64,
        idle_mib: idle_kib as f64 / 1024.0,
        held_mib: held_kib.saturating_sub(idle_kib) as f64 / 1024.0,
        filled_mib: filled_kib as f64 / 1024.0,
        peak_mib: peak_kib as f64 / 1024.0,
        limit_mib,
    }
}

// ---------------------------------------------------------------------------------------
// Connections

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to memcached on {port}: {e}"));
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    stream
}

fn plain(port: u16) -> Text<TcpStream> {
    Text(BufReader::new(connect(port)))
}

/// Part of a request: memcached keeps a read buffer for the connection until the rest
/// arrives (a line without its end, short enough not to be taken for a huge multiget).
const PARTIAL: &[u8] = b"get held:";

/// Plain connections until memcached refuses one ("ERROR Too many open connections", then
/// closed), each left in the middle of a request.
fn hold_plain(port: u16) -> Vec<TcpStream> {
    let mut held = Vec::new();
    loop {
        let stream = connect(port);
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let accepted = reader.get_mut().write_all(b"version\r\n").is_ok()
            && reader.read_line(&mut line).is_ok()
            && line.starts_with("VERSION ");
        if !accepted {
            return held;
        }
        let mut stream = reader.into_inner();
        stream.write_all(PARTIAL).expect("a partial request");
        held.push(stream);
    }
}

/// TLS connections until memcached refuses one (it answers the handshake with its plain
/// error), each left with a partial request in a whole record and then part of a record.
fn hold_tls(port: u16) -> Vec<TlsStream> {
    let mut held = Vec::new();
    loop {
        let Ok((mut stream, _)) = common::tls::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        else {
            return held;
        };
        stream
            .conn
            .writer()
            .write_all(PARTIAL)
            .expect("a partial request");
        while stream.conn.wants_write() {
            stream
                .conn
                .write_tls(&mut stream.sock)
                .expect("the partial request's record");
        }
        stream.conn.writer().write_all(b"0").expect("a record");
        let mut record = Vec::new();
        while stream.conn.wants_write() {
            stream.conn.write_tls(&mut record).expect("a record");
        }
        stream
            .sock
            .write_all(&record[..record.len() - 1])
            .expect("part of a record");
        held.push(stream);
    }
}

/// A self-signed certificate as the Secret's `tls.crt` and `tls.key` in `dir`.
fn write_certificate(dir: &Path) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["memcached.test".to_string()]).expect("rcgen");
    for (name, contents) in [
        ("tls.crt", certified.cert.pem()),
        ("tls.key", certified.signing_key.serialize_pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write the certificate");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod the certificate");
    }
}

// ---------------------------------------------------------------------------------------
// Filling

/// Sets per round trip of one filler, and the value's length.
fn batch_shape(load: Load, item_max: usize) -> (usize, usize) {
    match load {
        Load::Tiny => (4096, 1),
        // Room for the item's header and key under `-I`.
        Load::Large => (4, item_max - 1024),
        Load::Extstore => (256, 2048),
    }
}

/// Fills through `fillers` (one thread each, pipelining `noreply` sets) until memcached has
/// evicted a tenth of what it holds (and, with extstore, has written twice the cache to its
/// file); then sets a few items at a time until its hash table is as large as that many
/// items make it.
fn fill(stats: &mut Text<TcpStream>, fillers: Vec<TcpStream>, case: &Case, item_max: usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let (per_batch, value_len) = batch_shape(case.load, item_max);
    let threads: Vec<_> = fillers
        .into_iter()
        .enumerate()
        .map(|(tag, stream)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sets = Sets::new(stream, format!("{tag}"), value_len);
                while !stop.load(Ordering::Relaxed) {
                    sets.send(per_batch);
                }
                sets
            })
        })
        .collect();
    let cache = u64::try_from(case.memory_mib).expect("-m") * MIB;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = stats.stats("");
        let evicted = stat(&s, "evictions");
        let mut done = evicted > 0 && evicted * 10 >= stat(&s, "curr_items");
        if case.load == Load::Extstore {
            done = done && stat(&s, "extstore_bytes_written") >= 2 * cache;
        }
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: not filled to eviction within {DEADLINE:?}: {s:?}",
            case.name()
        );
        assert!(threads.iter().all(|t| !t.is_finished()), "a filler stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let mut sets: Vec<Sets> = threads
        .into_iter()
        .map(|t| t.join().expect("a filler"))
        .collect();

    // memcached starts an expansion on an insert that finds more than 1.5 items per bucket
    // and no expansion running; a fast fill passes several thresholds during one.
    let sets = &mut sets[0];
    loop {
        let s = stats.stats("");
        if stat(&s, "hash_is_expanding") == 0 {
            let buckets = 1u64 << stat(&s, "hash_power_level");
            if 2 * stat(&s, "curr_items") <= 3 * buckets {
                return;
            }
            sets.send(16);
        }
        assert!(
            Instant::now() < deadline,
            "{}: the hash table not expanded to its items within {DEADLINE:?}: {s:?}",
            case.name()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `noreply` sets of one value under keys of one prefix, sent in batches.
struct Sets {
    reader: BufReader<TcpStream>,
    prefix: String,
    value: Vec<u8>,
    batch: Vec<u8>,
    next: u64,
}

impl Sets {
    fn new(stream: TcpStream, prefix: String, value_len: usize) -> Sets {
        Sets {
            reader: BufReader::new(stream),
            prefix,
            value: vec![b'v'; value_len],
            batch: Vec::new(),
            next: 0,
        }
    }

    /// `count` sets in one write, and a `version` after them whose answer is awaited.
    fn send(&mut self, count: usize) {
        self.batch.clear();
        for _ in 0..count {
            write!(
                self.batch,
                "set {}:{:x} 0 0 {} noreply\r\n",
                self.prefix,
                self.next,
                self.value.len()
            )
            .expect("a command");
            self.batch.extend_from_slice(&self.value);
            self.batch.extend_from_slice(b"\r\n");
            self.next += 1;
        }
        self.batch.extend_from_slice(b"version\r\n");
        self.reader
            .get_mut()
            .write_all(&self.batch)
            .expect("a batch of sets");
        // memcached answers errors even to `noreply` (e.g. out of memory while extstore's
        // flusher is behind); the sets are a load, not a record: only the end matters.
        let mut line = String::new();
        loop {
            line.clear();
            self.reader
                .read_line(&mut line)
                .expect("memcached's answer");
            assert!(!line.is_empty(), "memcached closed a filler's connection");
            if line.starts_with("VERSION ") {
                return;
            }
        }
    }
}

/// One item of every size from 16 bytes to `-I` (steps of 1/8, finer than memcached's slab
/// factor 1.25), so every slab class holds at least one page.
fn every_size(stats: &mut Text<TcpStream>, item_max: usize) {
    let mut len = 16usize;
    while len < item_max - 1024 {
        let cmd = format!("set size:{len} 0 0 {len}\r\n");
        let stream = stats.0.get_mut();
        stream.write_all(cmd.as_bytes()).expect("a set");
        stream.write_all(&vec![b's'; len]).expect("a value");
        stream.write_all(b"\r\n").expect("a set");
        let answer = stats.line();
        assert!(
            answer == "STORED" || answer.starts_with("SERVER_ERROR out of memory"),
            "set size:{len}: {answer}"
        );
        len += len / 8;
    }
}

// ---------------------------------------------------------------------------------------
// The measurement

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| memcached | -m MiB | case | connections (RSS MiB) | hash power | items | evictions | idle RSS MiB | peak RSS MiB, filled | slabs MiB, every size | peak RSS MiB | limit MiB | margin |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} ({:.1}) | {}→{} | {} | {} | {:.1} | {:.1} | {:.0} | {:.1} | {} | {:.1}% |\n",
            r.version,
            r.memory_mib,
            r.case,
            r.held,
            r.held_mib,
            r.hash_power.0,
            r.hash_power.1,
            r.items,
            r.evictions,
            r.idle_mib,
            r.filled_mib,
            r.slab_mib,
            r.peak_mib,
            r.limit_mib,
            r.margin_percent()
        ));
    }
    out
}

#[test]
fn the_derived_memory_limit_holds_a_full_memcached_at_its_peak() {
    let max_connections = u64::try_from(memcached_api::DEFAULT_MAX_CONNECTIONS).expect("-c");
    raise_open_files(max_connections + 64);
    let binary = recent_memcached();
    let mut cases = Vec::new();
    for memory_mib in [64, 256] {
        for (load, held) in [
            (Load::Tiny, Held::Plain),
            (Load::Tiny, Held::Tls),
            (Load::Large, Held::Plain),
            (Load::Extstore, Held::Plain),
        ] {
            cases.push(Case {
                memory_mib,
                load,
                held,
            });
        }
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    for case in &cases {
        let t = Instant::now();
        let row = run(&binary, case);
        eprintln!(
            "memcached {} -m {}, {}: {:.1} s",
            row.version,
            row.memory_mib,
            row.case,
            t.elapsed().as_secs_f64()
        );
        rows.push(row);
    }
    println!(
        "\n{}(measured in {:.0} s)",
        table(&rows),
        started.elapsed().as_secs_f64()
    );

    let mut failures = Vec::new();
    for r in &rows {
        let what = format!("memcached {} -m {}, {}", r.version, r.memory_mib, r.case);
        if r.peak_mib > r.limit_mib as f64 {
            failures.push(format!(
                "{what}: peak RSS {:.1} MiB over the derived limit of {} MiB",
                r.peak_mib, r.limit_mib
            ));
        }
        if r.load == Load::Tiny && r.hash_power.1 <= r.hash_power.0 {
            failures.push(format!(
                "{what}: the hash table never expanded (power {} to {})",
                r.hash_power.0, r.hash_power.1
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
