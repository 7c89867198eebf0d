//! `bench latency`: the latencies the README quotes, measured here rather than printed by
//! tests: the hop memcached's proxy adds to a get (the operator's rendered route
//! configuration, memcached 1.6.38 built by `make memcached-proxy`), and the time the
//! validating webhook takes to admit a Memcached with the server-side dry run of its
//! children (the real control plane of `crates/envtest`).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube};
use http::Request;
use kube::CustomResourceExt;
use memcached_api::{Memcached, ProxyBackend};
use memcached_operator::builders::BuildSettings;
use memcached_operator::proxy;
use memcached_operator::webhook::{self, VALIDATE_PATH, dry_run::ChildrenCheck};
use serde_json::json;
use tower::ServiceExt;

use crate::{Result, log};

#[derive(clap::Args)]
pub struct Args {
    /// Gets timed per path (direct, through the proxy), after as many to warm up.
    #[arg(long, default_value_t = 20_000)]
    gets: usize,
    /// Admission reviews timed per Kubernetes version.
    #[arg(long, default_value_t = 200)]
    reviews: usize,
}

pub async fn run(args: Args) -> Result<()> {
    let hop = tokio::task::spawn_blocking(move || proxy_hop(args.gets)).await??;
    println!("{hop}");
    for kube in [Kube::Oldest, Kube::Newest] {
        println!("{}", admission(kube, args.reviews).await?);
    }
    Ok(())
}

/// p50 and p99 of `samples`, sorted in place.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
    (at(50), at(99))
}

// ---------------------------------------------------------------------------------------
// The proxy's hop

/// memcached with its proxy, as `make memcached-proxy` builds it.
fn memcached() -> Result<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = root.join("bin/memcached-1.6.38/memcached");
    if !bin.is_file() {
        return Err(format!("{} is missing: make memcached-proxy", bin.display()).into());
    }
    Ok(bin)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A memcached process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(program: &Path, args: &[String], port: u16) -> Result<Running> {
    let mut argv = args.to_vec();
    argv.extend(["-l".into(), "127.0.0.1".into()]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        argv.extend(["-u".into(), "nobody".into()]);
    }
    let child = Command::new(program)
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let running = Running(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("memcached did not listen on {port}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(running)
}

/// `get key` on one connection, once, checking the value.
fn get(reader: &mut BufReader<TcpStream>, writer: &mut TcpStream, want: &str) -> Result<()> {
    writer.write_all(b"get hot\r\n")?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("VALUE hot") {
        return Err(format!("get hot: {line:?}").into());
    }
    line.clear();
    reader.read_line(&mut line)?;
    if line.trim_end() != want {
        return Err(format!("get hot: value {line:?}").into());
    }
    line.clear();
    reader.read_line(&mut line)?;
    if line.trim_end() != "END" {
        return Err(format!("get hot: {line:?}").into());
    }
    Ok(())
}

/// `gets` gets timed on one connection to `port`, after as many to warm up.
fn timed_gets(port: u16, gets: usize) -> Result<(Duration, Duration)> {
    let writer = TcpStream::connect(("127.0.0.1", port))?;
    writer.set_nodelay(true)?;
    let mut reader = BufReader::new(writer.try_clone()?);
    let mut writer = writer;
    for _ in 0..gets {
        get(&mut reader, &mut writer, "value")?;
    }
    let mut samples = Vec::with_capacity(gets);
    for _ in 0..gets {
        let started = Instant::now();
        get(&mut reader, &mut writer, "value")?;
        samples.push(started.elapsed());
    }
    Ok(percentiles(&mut samples))
}

fn proxy_hop(gets: usize) -> Result<String> {
    let program = memcached()?;
    let backend_port = free_port()?;
    let _backend = start(
        &program,
        &["-p".into(), backend_port.to_string()],
        backend_port,
    )?;
    let dir = tempdir("proxy-hop")?;
    let file = dir.join("config.lua");
    let backends = [ProxyBackend {
        zone: None,
        copy: 1,
        slot: 0,
        pod: "cache-0".into(),
        address: format!("127.0.0.1:{backend_port}"),
        warm_from: None,
        grown_from: None,
    }];
    let (text, _) = proxy::render("bench/pool", &backends, 1, &file.to_string_lossy());
    std::fs::write(&file, text)?;
    let proxy_port = free_port()?;
    let args = proxy::proxy_args(i32::from(proxy_port), &file.to_string_lossy());
    let _proxy = start(&program, &args[1..], proxy_port)?;
    {
        let mut conn = TcpStream::connect(("127.0.0.1", backend_port))?;
        conn.write_all(b"set hot 0 0 5\r\nvalue\r\n")?;
        let mut line = String::new();
        BufReader::new(conn).read_line(&mut line)?;
        if line.trim_end() != "STORED" {
            return Err(format!("set hot: {line:?}").into());
        }
    }
    log(format!("proxy hop: {gets} gets per path"));
    let (d50, d99) = timed_gets(backend_port, gets)?;
    let (p50, p99) = timed_gets(proxy_port, gets)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "proxy hop, {gets} gets of a 5-byte value on loopback (one connection each):\n\
         | | p50 | p99 |\n|---|---|---|\n\
         | direct | {d50:.1?} | {d99:.1?} |\n\
         | through the proxy | {p50:.1?} | {p99:.1?} |\n\
         | added by the proxy | {:.1?} | {:.1?} |",
        p50.saturating_sub(d50),
        p99.saturating_sub(d99)
    ))
}

fn tempdir(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------
// Admission with the children's dry run

async fn admission(kube: Kube, reviews: usize) -> Result<String> {
    let cp = ControlPlane::shared(kube)?;
    let client = cp.client().await?;
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client.clone());
    let _ = crds
        .create(&kube::api::PostParams::default(), &Memcached::crd())
        .await;
    let ns = cp.namespace("bench-admission").await?;
    let app = webhook::router_with(
        memcached_api::DEFAULT_IMAGE,
        Some(ChildrenCheck::new(client, BuildSettings::default())),
    );
    log(format!("admission on {kube:?}: {reviews} reviews"));
    let mut samples = Vec::with_capacity(reviews);
    for i in 0..reviews + reviews / 10 {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": format!("bench-{i}"),
                "kind": {"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"},
                "resource": {"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"},
                "operation": "CREATE", "namespace": ns, "name": format!("cache-{i}"),
                "userInfo": {"username": "bench"},
                "object": {
                    "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                    "metadata": {"name": format!("cache-{i}"), "namespace": ns},
                    "spec": {"size": 3, "exporter": {"enabled": true}},
                },
            },
        });
        let request = Request::post(VALIDATE_PATH)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(review.to_string()))?;
        let started = Instant::now();
        let response = app.clone().oneshot(request).await?;
        let took = started.elapsed();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
        let answer: serde_json::Value = serde_json::from_slice(&body)?;
        if answer["response"]["allowed"] != true {
            return Err(format!("review {i} not admitted: {answer}").into());
        }
        // The first tenth warms the connections up.
        if i >= reviews / 10 {
            samples.push(took);
        }
    }
    let (p50, p99) = percentiles(&mut samples);
    let max = samples.last().copied().unwrap_or_default();
    Ok(format!(
        "admission with the children's dry run, {kube:?} ({}): {reviews} reviews of a size-3 \
         Memcached with the exporter (a read of its Service, then its Deployment, Service and budget): p50 {p50:.1?}, p99 {p99:.1?}, max {max:.1?}",
        cp.version()
    ))
}
