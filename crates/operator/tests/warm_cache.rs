//! Keeping a pool's cache warm, on every server (apisim and the real control plane at the
//! oldest and newest pinned versions): a renewed TLS certificate reloaded in place changes
//! no Deployment (so no pod and no cache is lost), while `rotation: Restart` rolls the pods;
//! extstore gets its volume, mount and flags, and `spec.rollout.minReadySeconds` paces the
//! Deployment's rollout. What is asserted is the Deployment the server stored, read back, so
//! a real server's defaulting and validation are the judge.
//!
//! The bad values of `spec.extstore` and `spec.rollout` are in `common/bad_inputs.rs`, run
//! by `bad_input.rs` (apisim) and `real_cluster.rs` (both real versions).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Secret, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use memcached_api::Memcached;
use memcached_operator::builders::CONFIG_HASH_ANNOTATION;
use memcached_operator::controller::{self, Backoff, ControllerConfig, ReconcileCounters};
use serde_json::{Value, json};

mod common;
use common::cluster::{Cluster, Server};
use common::wait_for;

/// The memcached container's name and the reload agent's (a native sidecar).
const MEMCACHED: &str = "memcached";
const AGENT: &str = "tls-reload-agent";
/// Where extstore's volume is mounted and the file memcached writes in it (documented).
const EXTSTORE_DIR: &str = "/var/lib/memcached/extstore";
const EXTSTORE_FILE: &str = "/var/lib/memcached/extstore/data";

struct Env {
    cluster: Cluster,
    counters: Arc<ReconcileCounters>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Env {
    /// A controller that looks at every Memcached again every 200 ms: Secrets are not
    /// watched, each reconcile reads them again.
    async fn start(server: Server, test: &str) -> Env {
        let cluster = Cluster::start(
            server,
            test,
            |b| b.pod_ready_delay(Duration::from_millis(20)),
            false,
        )
        .await;
        let config = ControllerConfig {
            namespace: cluster.watch_namespace(),
            resync: Duration::from_millis(200),
            secret_recheck: Duration::from_millis(100),
            backoff: Backoff {
                base: Duration::from_millis(20),
                cap: Duration::from_millis(500),
            },
            ..ControllerConfig::default()
        };
        let counters = config.counters.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(controller::run(cluster.client.clone(), config, async {
            let _ = rx.await;
        }));
        Env {
            cluster,
            counters,
            _stop: tx,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        self.cluster.api()
    }

    async fn apply(&self, name: &str, spec: Value) {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
            "metadata": {"name": name}, "spec": spec
        });
        self.api::<Memcached>()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .unwrap_or_else(|e| panic!("Memcached {name} applies: {e}"));
    }

    /// Waits for `n` more reconciles, counted from now. A reconcile runs alone per object,
    /// so with one Memcached every reconcile but the first counted started after now.
    async fn reconciles(&self, n: u64, why: &str) {
        let target = self.counters.reconciles() + n;
        wait_for(&format!("{n} reconciles: {why}"), || async {
            (self.counters.reconciles() >= target).then_some(())
        })
        .await;
        assert_eq!(self.counters.failures(), 0, "no reconcile fails ({why})");
    }

    /// The Deployment `name` as the server stores it, once `accept` says it is the one.
    async fn deployment(
        &self,
        name: &str,
        what: &str,
        accept: impl Fn(&Deployment) -> bool,
    ) -> Deployment {
        let api = self.api::<Deployment>();
        wait_for(&format!("Deployment {name}: {what}"), || async {
            api.get_opt(name).await.ok().flatten().filter(|d| accept(d))
        })
        .await
    }

    /// The Memcached `name` as the server stores it (its schema defaults filled in).
    async fn memcached(&self, name: &str) -> Value {
        let mc = self
            .api::<Memcached>()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("Memcached {name}: {e}"));
        serde_json::to_value(mc).expect("Memcached as JSON")
    }
}

fn template(d: &Deployment) -> Value {
    serde_json::to_value(&d.spec.as_ref().expect("spec").template).expect("template as JSON")
}

fn generation(d: &Deployment) -> i64 {
    d.metadata
        .generation
        .expect("the server sets metadata.generation")
}

fn config_hash(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(CONFIG_HASH_ANNOTATION)
        .cloned()
}

fn agent(d: &Deployment) -> Option<&Container> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == AGENT)
}

fn memcached_container(d: &Deployment) -> &Container {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == MEMCACHED))
        .expect("the memcached container")
}

fn volume<'a>(d: &'a Deployment, name: &str) -> Option<&'a Volume> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == name)
}

/// memcached's command line: `command` and `args` together.
fn command_line(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// The value after `-o` that carries the `ext_*` options.
fn extstore_option(d: &Deployment) -> String {
    let line = command_line(memcached_container(d));
    line.windows(2)
        .find(|w| w[0] == "-o" && w[1].contains("ext_path="))
        .map(|w| w[1].clone())
        .unwrap_or_else(|| panic!("no `-o ...ext_path=...` in {line:?}"))
}

/// A `kubernetes.io/tls` Secret's PEM-looking contents, different for each `n`.
fn certificate(n: u32) -> Value {
    json!({
        "tls.crt": format!("-----BEGIN CERTIFICATE-----\nMIIBcert{n}\n-----END CERTIFICATE-----\n"),
        "tls.key": format!("-----BEGIN PRIVATE KEY-----\nMIIBkey{n}\n-----END PRIVATE KEY-----\n"),
    })
}

async fn rotate(secrets: &Api<Secret>, name: &str, n: u32) {
    secrets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": certificate(n)})),
        )
        .await
        .unwrap_or_else(|e| panic!("rotate Secret {name}: {e}"));
}

on_every_server! {
/// With `rotation` unset (InPlace) the reload agent runs beside memcached and a renewed
/// certificate changes no Deployment: same generation, same pod template, after reconciles
/// that read the renewed Secret. With `rotation: Restart` the next renewal does change the
/// template's config hash (a new generation), which shows the reconciles read it.
async fn a_tls_renewal_changes_no_deployment_with_the_reload_agent(server: Server) {
    let env = Env::start(server, "a_tls_renewal_changes_no_deploy").await;
    let secrets = env.api::<Secret>();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "cache-tls"},
        "stringData": certificate(1),
    }))
    .expect("a Secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("TLS Secret created");
    let spec = json!({"size": 1, "tls": {"secretName": "cache-tls"}});
    env.apply("warm", spec.clone()).await;

    let d = env
        .deployment("warm", "with the reload agent", |d| agent(d).is_some())
        .await;
    let sidecar = agent(&d).expect("agent");
    // A native sidecar: the server kept the init container's restartPolicy.
    assert_eq!(
        sidecar.restart_policy.as_deref(),
        Some("Always"),
        "the stored agent: {sidecar:?}"
    );
    let line = command_line(memcached_container(&d));
    assert!(
        line.windows(2)
            .any(|w| w[0] == "-l" && w[1].ends_with(",notls:127.0.0.1:11299")),
        "memcached listens for the agent on loopback: {line:?}"
    );
    // Settled: the operator's next reconciles leave it alone.
    env.reconciles(3, "settled before the renewal").await;
    let before = env.api::<Deployment>().get("warm").await.expect("Deployment");

    rotate(&secrets, "cache-tls", 2).await;
    env.reconciles(3, "reconciles that read the renewed Secret").await;
    let after = env.api::<Deployment>().get("warm").await.expect("Deployment");
    assert_eq!(
        generation(&after),
        generation(&before),
        "an in-place renewal changes no Deployment spec on {server:?}"
    );
    assert_eq!(
        template(&after),
        template(&before),
        "an in-place renewal changes no pod template on {server:?}"
    );

    // The contrast: with Restart, the agent goes, and the next renewal rolls the pods.
    let mut restart = spec;
    restart["tls"]["rotation"] = json!("Restart");
    env.apply("warm", restart).await;
    let restarting = env
        .deployment("warm", "without the reload agent", |d| agent(d).is_none())
        .await;
    env.reconciles(3, "settled with rotation Restart").await;
    let settled = env.api::<Deployment>().get("warm").await.expect("Deployment");
    assert_eq!(
        generation(&settled),
        generation(&restarting),
        "nothing changed the Deployment while settling"
    );
    let restarting = settled;
    let hash = config_hash(&restarting).expect("the template's config hash");

    // The same wait as for the in-place renewal above: it is long enough to see one.
    rotate(&secrets, "cache-tls", 3).await;
    env.reconciles(3, "reconciles that read the renewed Secret").await;
    let rolled = env.api::<Deployment>().get("warm").await.expect("Deployment");
    assert_ne!(
        config_hash(&rolled).as_deref(),
        Some(hash.as_str()),
        "a renewal with Restart changes the template's config hash on {server:?}"
    );
    assert!(
        generation(&rolled) > generation(&restarting),
        "a renewal with Restart is a new Deployment generation: {} then {}",
        generation(&restarting),
        generation(&rolled)
    );
}
}

on_every_server! {
/// extstore on node disk: an `emptyDir` limited to twice the file's size and a MiB (what a
/// full file may take; `real_memcached_warm.rs` measures it), mounted where the `ext_path`
/// points, with the file sized in MiB; `spec.rollout.minReadySeconds` is the
/// Deployment's. With a StorageClass, a generic ephemeral volume of that class claiming
/// room for the filesystem's own blocks too, which the server accepts as built.
async fn extstore_gets_its_volume_and_flags_and_rollouts_their_pace(server: Server) {
    let env = Env::start(server, "extstore_gets_its_volume_and_f").await;
    env.apply(
        "disk",
        json!({"size": 1, "extstore": {"enabled": true, "size": "2Gi"},
               "rollout": {"minReadySeconds": 45}}),
    )
    .await;
    env.apply(
        "claimed",
        json!({"size": 1, "extstore": {"enabled": true, "size": "4Gi",
                                       "storageClassName": "standard"}}),
    )
    .await;

    let disk = env.deployment("disk", "created", |_| true).await;
    assert_eq!(
        disk.spec.as_ref().and_then(|s| s.min_ready_seconds),
        Some(45),
        "spec.minReadySeconds as stored on {server:?}"
    );
    let v = volume(&disk, "extstore").expect("the extstore volume");
    assert!(v.ephemeral.is_none(), "{v:?}");
    assert_eq!(
        v.empty_dir.as_ref().and_then(|e| e.size_limit.clone()),
        Some(Quantity("4097Mi".into())),
        "an emptyDir limited to twice the file's size and a MiB: {v:?}"
    );

    // The options follow the stored (server-defaulted) spec.extstore; memcached wants
    // ext_page_size before ext_path, and the file's size in MiB (2Gi = 2048 MiB).
    let stored = env.memcached("disk").await;
    let ext = &stored["spec"]["extstore"];
    let option = extstore_option(&disk);
    for (flag, field) in [
        ("ext_page_size", "pageSizeMiB"),
        ("ext_wbuf_size", "writeBufferMiB"),
        ("ext_threads", "threads"),
        ("ext_item_size", "itemSizeBytes"),
    ] {
        let value = ext[field]
            .as_i64()
            .unwrap_or_else(|| panic!("the server defaults spec.extstore.{field}: {ext}"));
        assert!(
            option.split(',').any(|o| o == format!("{flag}={value}")),
            "{flag}={value} (spec.extstore.{field}) in {option:?}"
        );
    }
    assert!(
        option.ends_with(&format!(",ext_path={EXTSTORE_FILE}:2048m")),
        "{option:?}"
    );
    assert!(
        option.find("ext_page_size=") < option.find("ext_path="),
        "{option:?}"
    );
    let mounts = memcached_container(&disk).volume_mounts.clone().unwrap_or_default();
    let mount = mounts
        .iter()
        .find(|m| m.name == "extstore")
        .unwrap_or_else(|| panic!("extstore mounted: {mounts:?}"));
    assert_eq!(mount.mount_path, EXTSTORE_DIR);
    assert_ne!(mount.read_only, Some(true), "memcached writes the file");

    let claimed = env.deployment("claimed", "created", |_| true).await;
    // Unset, the rollout waits the documented 30 seconds per pod.
    assert_eq!(
        claimed.spec.as_ref().and_then(|s| s.min_ready_seconds),
        Some(30)
    );
    let v = volume(&claimed, "extstore").expect("the extstore volume");
    assert!(v.empty_dir.is_none(), "{v:?}");
    let claim = v
        .ephemeral
        .as_ref()
        .and_then(|e| e.volume_claim_template.as_ref())
        .unwrap_or_else(|| panic!("a generic ephemeral volume as stored on {server:?}: {v:?}"));
    assert_eq!(claim.spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(
        claim
            .spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
        Some(&Quantity("4672Mi".into())),
        "4 GiB, an eighth of it and 64 MiB for the filesystem's own: {claim:?}"
    );
    assert!(
        extstore_option(&claimed).ends_with(&format!(",ext_path={EXTSTORE_FILE}:4096m")),
        "{:?}",
        extstore_option(&claimed)
    );
    assert!(
        memcached_container(&claimed)
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "extstore" && m.mount_path == EXTSTORE_DIR),
        "extstore mounted"
    );

    // The longest pace accepted: the server takes a Deployment with it (Kubernetes wants
    // minReadySeconds below the 600 s progress deadline).
    env.apply(
        "slowest",
        json!({"size": 1, "rollout": {"minReadySeconds": 300}}),
    )
    .await;
    let slowest = env.deployment("slowest", "created", |_| true).await;
    assert_eq!(
        slowest.spec.as_ref().and_then(|s| s.min_ready_seconds),
        Some(300)
    );
}
}
