//! Keeps the flags honest: the exact argument list the Deployment builder produces starts a
//! real memcached (Debian's package; `.ci/run` installs it) that reports the configured
//! limits in `stats settings`, and every configuration the validation accepts starts one.
//! Without a `memcached` binary the tests fail, naming the package that provides it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memcached_api::{Memcached, MemcachedConfig, MemcachedSpec};
use memcached_operator::builders::{self, BuildSettings};
use proptest::prelude::*;

mod common;
use common::process::{free_port, memcached_binary};

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` (argv[0] replaced by the binary) on loopback. memcached refuses to run as
/// root without `-u`, so a root test run adds `-u nobody`; in the pod it runs as UID 11211.
fn start(binary: &str, args: &[String]) -> Running {
    let mut cmd = Command::new(binary);
    cmd.args(&args[1..]).args(["-l", "127.0.0.1"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "nobody"]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memcached starts");
    Running(child)
}

fn stats_settings(port: u16, running: &mut Running) -> std::collections::HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        if let Ok(Some(status)) = running.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = running.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("memcached exited ({status}): {err}");
        }
        assert!(
            Instant::now() < deadline,
            "memcached did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(b"stats settings\r\n").expect("send");
    let mut out = std::collections::HashMap::new();
    for line in BufReader::new(stream).lines() {
        let line = line.expect("read");
        if line == "END" {
            break;
        }
        let mut parts = line.splitn(3, ' ');
        if let (Some("STAT"), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(k.to_string(), v.to_string());
        }
    }
    out
}

fn deployment_args(config: Option<MemcachedConfig>, port: u16) -> Vec<String> {
    let mut mc = Memcached::new(
        "real",
        MemcachedSpec {
            container_port: i32::from(port),
            config,
            ..MemcachedSpec::with_size(1)
        },
    );
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some("u".into());
    let d = builders::desired_deployment(&mc, &BuildSettings::default()).expect("builds");
    d.spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.command)
        .expect("command")
}

#[test]
fn the_builders_flags_configure_a_real_memcached() {
    let binary = memcached_binary();
    let port = free_port();
    let config = MemcachedConfig {
        memory_mib: 48,
        max_connections: 300,
        threads: 3,
        max_item_size: "2m".into(),
        verbosity: 0,
        extra_args: vec!["-R".into(), "30".into()],
    };
    let args = deployment_args(Some(config), port);
    let mut running = start(&binary, &args);
    let stats = stats_settings(port, &mut running);
    assert_eq!(
        stats.get("maxbytes").map(String::as_str),
        Some("50331648"),
        "{args:?}"
    );
    assert_eq!(stats.get("maxconns").map(String::as_str), Some("300"));
    assert_eq!(stats.get("num_threads").map(String::as_str), Some("3"));
    assert_eq!(
        stats.get("item_size_max").map(String::as_str),
        Some("2097152")
    );
    assert_eq!(
        stats.get("reqs_per_event").map(String::as_str),
        Some("30"),
        "extra args reach memcached"
    );
    assert_eq!(
        stats.get("tcpport").map(String::as_str),
        Some(port.to_string().as_str())
    );
}

#[test]
fn the_seed_samples_defaults_give_the_seeds_64_mib() {
    let binary = memcached_binary();
    let port = free_port();
    let args = deployment_args(None, port);
    let mut running = start(&binary, &args);
    let stats = stats_settings(port, &mut running);
    assert_eq!(stats.get("maxbytes").map(String::as_str), Some("67108864"));
    assert_eq!(stats.get("maxconns").map(String::as_str), Some("1024"));
    assert_eq!(stats.get("num_threads").map(String::as_str), Some("4"));
    assert_eq!(
        stats.get("item_size_max").map(String::as_str),
        Some("1048576")
    );
}

#[test]
fn the_seeds_literal_command_is_refused_by_memcached() {
    // Why the builder writes `-m 64`: memcached reads the seed's `-m=64` as "=64", a
    // memory limit of 0 MiB, and refuses to start (its default 1 MiB item size is more
    // than half of that). The real memcached decides: it must exit with its usage error.
    let binary = memcached_binary();
    let port = free_port();
    let seed: Vec<String> = [
        "memcached",
        "-m=64",
        "-o",
        "modern",
        "-v",
        "-p",
        &port.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut running = start(&binary, &seed);
    // A refusal comes at once; a generous deadline only bounds a memcached that neither
    // exits nor refuses (which fails below: it is not what the builder's comment claims).
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Ok(Some(status)) = running.0.try_wait() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "memcached did not refuse the seed's `-m=64` within 60 s (it is running)"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = running.0.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).expect("memcached's stderr");
    }
    // EX_USAGE, and the reason in its own words.
    assert_eq!(
        status.code(),
        Some(64),
        "exit status {status}; stderr: {stderr}"
    );
    assert!(
        stderr.contains("Cannot set item size limit higher than 1/2 of memory max"),
        "stderr: {stderr}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every configuration the validation accepts starts a real memcached with the limits
    /// asked for. The item sizes are drawn from the whole grammar the schema allows (bytes
    /// or k/m, any number) and from near the rule's edges (multiples of 256k and of 1m), so
    /// both accepted and refused values come up (refused ones are skipped: the validation
    /// may be stricter than memcached, never looser).
    #[test]
    fn every_accepted_configuration_starts_a_real_memcached(
        memory_mib in prop_oneof![8i32..=128, 8i32..=65536],
        threads in 1i32..=64,
        max_connections in 16i32..=1024,
        verbosity in 0i32..=3,
        item in prop_oneof![
            "[0-9]{1,7}[kKmM]?",
            (1u64..=64).prop_map(|n| format!("{}k", n * 256)),
            (1u64..=1024).prop_map(|n| format!("{n}m")),
            (1u64..=16).prop_map(|n| format!("{}", n * 512 * 1024)),
        ],
    ) {
        let config = MemcachedConfig {
            memory_mib,
            max_connections,
            threads,
            max_item_size: item.clone(),
            verbosity,
            extra_args: vec![],
        };
        let mut mc = Memcached::new("prop", MemcachedSpec {
            config: Some(config.clone()),
            ..MemcachedSpec::with_size(1)
        });
        mc.metadata.namespace = Some("default".into());
        prop_assume!(memcached_api::validation::validate(&mc).is_ok());
        let port = free_port();
        let args = deployment_args(Some(config), port);
        let mut running = start(&memcached_binary(), &args);
        let stats = stats_settings(port, &mut running);
        let bytes = memcached_api::validation::parse_item_size(&item).expect("accepted, so parses");
        prop_assert_eq!(stats.get("item_size_max").cloned(), Some(bytes.to_string()), "{:?}", args);
        prop_assert_eq!(
            stats.get("maxbytes").cloned(),
            Some((i64::from(memory_mib) * 1024 * 1024).to_string()),
            "{:?}", args
        );
        prop_assert_eq!(stats.get("num_threads").cloned(), Some(threads.to_string()));
    }
}
