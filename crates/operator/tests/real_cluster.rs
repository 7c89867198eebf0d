//! The operator as users run it, on a real control plane (`crates/envtest`: kube-apiserver
//! with RBAC, kube-controller-manager, kube-scheduler, kwok nodes) at the oldest and the
//! newest pinned Kubernetes versions: `memcached-operator run` processes with leader
//! election, with only the generated RBAC's identity, with the admission webhooks
//! registered in the API server; and `config/` applied server-side.
//!
//! The tests of this binary share one control plane per version, so each works in a
//! namespace of its own, scopes its operators to it (`--namespace`), and names or scopes
//! what it registers cluster-wide (ClusterRoles, bindings, webhook configurations).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use envtest::{ControlPlane, Kube};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::{Memcached, condition};
use serde_json::{Value, json};

mod common;
use common::bad_inputs::{
    children_refused, memcached, schema_passes_operator_refuses, schema_rejects,
};
use common::cluster::{apply_crd, service_account_token};
use common::process::{Operator, TempDir, free_port};
use common::{foreign_crds, wait_for_within};

/// The leader-election Lease's default name (`--leader-election-id`).
const LEASE: &str = "memcached-operator.cache.example.com";
/// Short lease settings, as in `tests/manager.rs`.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const LEASE_FLAGS: [&str; 3] = [
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=250ms",
];
/// How long anything the real servers do (pods scheduled and Ready, a Lease taken, an
/// event written) may take on the shared, loaded machine.
const CONVERGE: Duration = Duration::from_secs(120);
/// The webhooks' names in `config/webhook/manifests.yaml`, as the API server quotes them.
const MUTATING_WEBHOOK: &str = "mmemcached-v1.kb.io";
const VALIDATING_WEBHOOK: &str = "vmemcached-v1.kb.io";

fn config_dir() -> PathBuf {
    envtest::repo_root().join("config")
}

/// Every YAML document of `path`, as JSON.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    yaml_docs_of(&text)
}

fn yaml_docs_of(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Runs `cmd` to the end on a blocking thread, feeding it `stdin`.
async fn run(mut cmd: Command, stdin: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("command starts");
        if let Some(input) = stdin
            && let Some(mut pipe) = child.stdin.take()
        {
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("command runs")
    })
    .await
    .expect("join")
}

/// The API server's refusal of a request: its code and message.
fn refusal<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
    }
}

/// One test's namespace on the shared control plane of one version, with the Memcached CRD.
struct Real {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    dir: TempDir,
}

impl Real {
    async fn start(kube: Kube, test: &str) -> Real {
        let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
        let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
        let ns = cp
            .namespace(test)
            .await
            .unwrap_or_else(|e| panic!("namespace: {e}"));
        apply_crd(&client, &Memcached::crd()).await;
        println!("{test}: Kubernetes {} namespace {ns}", cp.version());
        Real {
            cp,
            client,
            ns,
            dir: TempDir::new(test),
        }
    }

    fn memcacheds(&self) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Operator flags every process of a test gets: its namespace, no metrics or probes
    /// servers (they would need ports), leader election on the namespace's Lease.
    fn candidate_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--namespace={}", self.ns),
            "--leader-elect".to_string(),
            format!("--leader-election-namespace={}", self.ns),
            "--metrics-bind-address=0".to_string(),
            "--health-probe-bind-address=0".to_string(),
        ];
        args.extend(LEASE_FLAGS.iter().map(|f| f.to_string()));
        args
    }

    fn spawn(&self, kubeconfig: &Path, name: &str, args: &[String]) -> Operator {
        Operator::spawn(kubeconfig, self.dir.path(), name, args, &[])
    }

    /// The leader's `POD_NAME` (identities are `<POD_NAME>_<random>`).
    async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        let holder = leases.get_opt(LEASE).await.ok()??.spec?.holder_identity?;
        holder
            .split('_')
            .next()
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    }

    /// The Lease's spec as it is now.
    async fn lease(&self) -> LeaseSpec {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        leases
            .get(LEASE)
            .await
            .expect("the Lease")
            .spec
            .expect("the Lease's spec")
    }

    async fn wait_leader(&self, timeout: Duration, accept: impl Fn(&str) -> bool) -> String {
        wait_for_within("a leader holds the Lease", timeout, || async {
            self.lease_holder().await.filter(|h| accept(h))
        })
        .await
    }

    /// Applies a Memcached of `size` as a user would (server-side apply, admin).
    async fn apply(&self, name: &str, size: i32) {
        let mc = json!({
            "apiVersion": "memcached.cache.example.com/v1",
            "kind": "Memcached",
            "metadata": {"name": name},
            "spec": {"size": size}
        });
        self.memcacheds()
            .patch(
                name,
                &PatchParams::apply("real-cluster-test").force(),
                &Patch::Apply(&mc),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    /// Ready, not terminating pods of the Deployment `name`, found through the
    /// ownerReferences kube-controller-manager wrote (Deployment → ReplicaSet → Pod), sorted.
    async fn ready_pods(&self, name: &str) -> Option<Vec<String>> {
        let owned_by = |refs: &Option<Vec<_>>, kind: &str, names: &[String]| {
            refs.iter().flatten().any(
                |r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
                    r.kind == kind && names.contains(&r.name)
                },
            )
        };
        let rss: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &self.ns);
        let rs_names: Vec<String> = rss
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|rs| owned_by(&rs.metadata.owner_references, "Deployment", &[name.into()]))
            .filter_map(|rs| rs.metadata.name)
            .collect();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let mut ready: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| owned_by(&p.metadata.owner_references, "ReplicaSet", &rs_names))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.metadata.name)
            .collect();
        ready.sort();
        Some(ready)
    }

    /// Waits until `name` is Available with `size` pods, `status.nodes` naming exactly the
    /// ready pods the cluster runs for it, at the current generation.
    async fn converged(&self, name: &str, size: usize) -> Memcached {
        let api = self.memcacheds();
        wait_for_within(
            &format!("{name} at {size} ready pods named in status.nodes"),
            CONVERGE,
            || async {
                let mc = api.get_opt(name).await.ok().flatten()?;
                let status = mc.status.as_ref()?;
                let available = mc.condition(condition::AVAILABLE)?.status == "True";
                let pods = self.ready_pods(name).await?;
                let mut nodes = status.nodes.clone();
                nodes.sort();
                (available
                    && pods.len() == size
                    && nodes == pods
                    && status.observed_generation == mc.metadata.generation)
                    .then_some(mc)
            },
        )
        .await
    }

    /// The `reportingInstance` of every event about the Memcached `name` whose note
    /// contains `text`, waiting for at least one.
    async fn reporters(&self, name: &str, text: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        wait_for_within(
            &format!("an event about {name} saying {text:?}"),
            CONVERGE,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                let mut reporters: Vec<String> = list
                    .items
                    .into_iter()
                    .filter(|e| {
                        e.regarding.as_ref().is_some_and(|r| {
                            r.kind.as_deref() == Some("Memcached")
                                && r.name.as_deref() == Some(name)
                        })
                    })
                    .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(text)))
                    .filter_map(|e| e.reporting_instance)
                    .collect();
                reporters.sort();
                reporters.dedup();
                (!reporters.is_empty()).then_some(reporters)
            },
        )
        .await
    }
}

on_both_versions! {
/// Two operator processes on one Lease: one leads and alone writes; SIGKILL of the leader
/// hands the Lease to the other once the lease ran out (and not before), which then
/// converges a new Memcached; SIGTERM of that leader releases the Lease to a restarted
/// standby.
async fn leader_election_fails_over_on_kill_and_hands_over_on_term(kube: Kube) {
    let real = Real::start(kube, "leader").await;
    let kubeconfig = real.cp.kubeconfig().to_path_buf();
    let args = real.candidate_args();
    let mut ops = vec![
        real.spawn(&kubeconfig, "op-a", &args),
        real.spawn(&kubeconfig, "op-b", &args),
    ];
    let first = real
        .wait_leader(CONVERGE, |h| h == "op-a" || h == "op-b")
        .await;
    real.apply("first", 2).await;
    real.converged("first", 2).await;
    assert_eq!(
        real.reporters("first", "Created Deployment").await,
        std::slice::from_ref(&first),
        "only the leader writes"
    );
    // The standby stays a standby while the leader renews. What is ruled out: a standby
    // takes a record it has seen unchanged for a lease duration, and looks every 250-550 ms;
    // the wait covers both, and the leader's renewals in it are seen.
    let before = real.lease().await;
    tokio::time::sleep(LEASE_DURATION + Duration::from_secs(1)).await;
    let after = real.lease().await;
    assert_eq!(real.lease_holder().await.as_deref(), Some(first.as_str()));
    assert_eq!(
        after.lease_transitions, before.lease_transitions,
        "no transition while the leader renews"
    );
    assert!(after.renew_time > before.renew_time, "the leader renews");
    for op in ops.iter_mut() {
        assert!(op.exited().is_none(), "{} exited:\n{}", op.name, op.logs());
    }
    let leaders: Vec<&str> = ops
        .iter()
        .filter(|o| o.logs().contains("successfully acquired lease"))
        .map(|o| o.name.as_str())
        .collect();
    assert_eq!(leaders, [first.as_str()], "exactly one process leads");

    // SIGKILL: nothing is released; the standby takes over once the lease runs out, and not
    // before: its acquisition comes at least a lease duration after the killed leader's last
    // renewal (both times are written from this machine's clock).
    let idx = ops.iter().position(|o| o.name == first).expect("leader is ours");
    let mut killed = ops.remove(idx);
    let standby = ops.pop().expect("the standby");
    let killed_at = Instant::now();
    killed.signal(libc::SIGKILL);
    let _ = killed.wait_exit(Duration::from_secs(60)).await;
    let last = real.lease().await;
    let second = real.wait_leader(CONVERGE, |h| h != first).await;
    println!(
        "{kube:?}: SIGKILL failover {:?} (lease duration {LEASE_DURATION:?})",
        killed_at.elapsed()
    );
    assert_eq!(second, standby.name);
    let taken = real.lease().await;
    if last
        .holder_identity
        .as_deref()
        .is_some_and(|h| h.starts_with(&format!("{first}_")))
    {
        let waited = taken
            .acquire_time
            .expect("acquireTime")
            .0
            .duration_since(last.renew_time.expect("renewTime").0);
        assert!(
            waited
                >= jiff::SignedDuration::try_from(LEASE_DURATION).expect("duration")
                    - jiff::SignedDuration::from_millis(50),
            "{second} took the Lease {waited:?} after {first}'s last renewal, before it expired"
        );
    }
    assert_eq!(
        taken.lease_transitions,
        after.lease_transitions.map(|t| t + 1),
        "one transition: {first} to {second}"
    );
    real.apply("second", 2).await;
    real.converged("second", 2).await;
    assert_eq!(
        real.reporters("second", "Created Deployment").await,
        std::slice::from_ref(&second),
        "the new leader, and only it, writes"
    );

    // A restarted standby, then SIGTERM of the leader: the Lease is released at once.
    let mut restarted = real.spawn(&kubeconfig, "op-c", &args);
    restarted
        .wait_log("attempting to acquire leader lease", CONVERGE)
        .await;
    // Let it look at the Lease at least once (retry period 250 ms).
    tokio::time::sleep(Duration::from_millis(750)).await;
    assert_eq!(real.lease_holder().await.as_deref(), Some(second.as_str()));
    let mut leader = standby;
    // Released rather than left to expire (how fast is measured exactly in the manager
    // crate's leader tests, on a paused clock).
    let termed_at = Instant::now();
    leader.signal(libc::SIGTERM);
    real.wait_leader(CONVERGE, |h| h == "op-c").await;
    println!("{kube:?}: SIGTERM handover {:?}", termed_at.elapsed());
    let status = leader.wait_exit(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "SIGTERM is a clean exit: {status:?}\n{}",
        leader.logs()
    );
    assert!(leader.logs().contains("released leader lease"), "{}", leader.logs());
    real.apply("third", 1).await;
    real.converged("third", 1).await;
    assert_eq!(
        real.reporters("third", "Created Deployment").await,
        ["op-c".to_string()]
    );
    assert!(restarted.exited().is_none(), "{}", restarted.logs());
}
}

/// The objects of `config/rbac` (in its kustomization's order), made this test's own: the
/// `system` namespace becomes `ns`, and cluster-scoped names (and references to them) get
/// `ns` as a prefix so tests and versions never share them.
fn generated_rbac(ns: &str) -> Vec<Value> {
    let dir = config_dir().join("rbac");
    let kustomization = yaml_docs(&dir.join("kustomization.yaml"));
    let files: Vec<String> = kustomization[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|f| f.as_str().expect("file name").to_string())
        .collect();
    let mut out = vec![];
    for file in files {
        for mut obj in yaml_docs(&dir.join(&file)) {
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            if obj["metadata"]["namespace"] == "system" {
                obj["metadata"]["namespace"] = json!(ns);
            }
            if kind.starts_with("Cluster") {
                let name = obj["metadata"]["name"].as_str().expect("name").to_string();
                obj["metadata"]["name"] = json!(format!("{ns}-{name}"));
            }
            if obj["roleRef"]["kind"] == "ClusterRole" {
                let name = obj["roleRef"]["name"].as_str().expect("name").to_string();
                obj["roleRef"]["name"] = json!(format!("{ns}-{name}"));
            }
            for subject in obj["subjects"].as_array_mut().into_iter().flatten() {
                if subject["namespace"] == "system" {
                    subject["namespace"] = json!(ns);
                }
            }
            out.push(obj);
        }
    }
    out
}

async fn create_typed<K>(api: Api<K>, obj: &Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(obj.clone())
        .unwrap_or_else(|e| panic!("{}: {e}", obj["metadata"]["name"]));
    api.create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("creating {} {}: {e}", obj["kind"], obj["metadata"]["name"]));
}

async fn create_rbac(client: &Client, ns: &str, obj: &Value) {
    let c = client.clone();
    match obj["kind"].as_str().unwrap_or_default() {
        "ServiceAccount" => create_typed::<ServiceAccount>(Api::namespaced(c, ns), obj).await,
        "Role" => create_typed::<Role>(Api::namespaced(c, ns), obj).await,
        "RoleBinding" => create_typed::<RoleBinding>(Api::namespaced(c, ns), obj).await,
        "ClusterRole" => create_typed::<ClusterRole>(Api::all(c), obj).await,
        "ClusterRoleBinding" => create_typed::<ClusterRoleBinding>(Api::all(c), obj).await,
        other => panic!("config/rbac has a {other}, which this test does not know"),
    }
}

async fn delete_cluster_rbac(client: &Client, objects: &[Value]) {
    for obj in objects {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let dp = DeleteParams::default();
        let _ = match obj["kind"].as_str().unwrap_or_default() {
            "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                .delete(name, &dp)
                .await
                .map(|_| ()),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                .delete(name, &dp)
                .await
                .map(|_| ()),
            _ => Ok(()),
        };
    }
}

on_both_versions! {
/// The operator with nothing but the generated RBAC: a ServiceAccount bound as
/// `config/rbac` binds it, a token from the TokenRequest API, and the operator run with
/// only that token. It takes the Lease, converges the seed's sample to three ready pods
/// named in `status.nodes`, publishes its events, and the API server refuses that identity
/// what the roles do not grant.
async fn the_generated_rbac_is_all_the_operator_needs(kube: Kube) {
    let real = Real::start(kube, "rbac").await;
    let ns = real.ns.clone();
    let rbac = generated_rbac(&ns);
    for obj in &rbac {
        create_rbac(&real.client, &ns, obj).await;
    }
    let sa_name = rbac
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("config/rbac has the operator's ServiceAccount")
        .to_string();
    let token = service_account_token(&real.client, &ns, &sa_name).await;
    let kubeconfig = real
        .cp
        .kubeconfig_for_token(&format!("{ns}-operator"), &token)
        .expect("token kubeconfig");
    let sa_client = envtest::client_from_kubeconfig(&kubeconfig)
        .await
        .expect("client from the token kubeconfig");
    // The token is the ServiceAccount, as the API server sees it.
    let whoami = Api::<SelfSubjectReview>::all(sa_client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    assert_eq!(
        whoami.status.and_then(|s| s.user_info).and_then(|u| u.username),
        Some(format!("system:serviceaccount:{ns}:{sa_name}"))
    );

    let mut op = real.spawn(&kubeconfig, "op-rbac", &real.candidate_args());
    real.wait_leader(CONVERGE, |h| h == "op-rbac").await;

    let sample = yaml_docs(&config_dir().join("samples/memcached_v1_memcached.yaml"))
        .pop()
        .expect("the seed's sample");
    let name = sample["metadata"]["name"].as_str().expect("name").to_string();
    assert_eq!(sample["spec"]["size"], 3, "the seed's sample is size 3");
    real.memcacheds()
        .patch(
            &name,
            &PatchParams::apply("real-cluster-test"),
            &Patch::Apply(&sample),
        )
        .await
        .expect("apply the sample");
    let mc = real.converged(&name, 3).await;
    assert_eq!(mc.status.as_ref().map(|s| s.nodes.len()), Some(3));
    // Events are written under that identity too.
    assert_eq!(
        real.reporters(&name, "Created Deployment").await,
        ["op-rbac".to_string()]
    );
    assert!(op.exited().is_none(), "{}", op.logs());
    let logs = op.logs();
    assert!(
        !logs.contains("forbidden") && !logs.contains("Forbidden"),
        "the operator was refused something:\n{logs}"
    );

    // What the roles do not grant, the API server refuses that identity.
    // It reads Secrets (their metadata is watched, the data of those a Memcached names is
    // read) but may never write one.
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "planted"}}))
        .expect("a Secret");
    let (code, message) = refusal(
        "creating a Secret",
        Api::<Secret>::namespaced(sa_client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("cannot create resource \"secrets\""), "{message}");
    let (code, message) = refusal(
        "deleting a Namespace (dry run)",
        Api::<Namespace>::all(sa_client.clone())
            .delete(
                "default",
                &DeleteParams {
                    dry_run: true,
                    ..DeleteParams::default()
                },
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
    let (code, message) = refusal(
        "creating a Memcached",
        Api::<Memcached>::namespaced(sa_client.clone(), &ns)
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &serde_json::from_value(json!({
                    "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
                    "metadata": {"name": "not-mine"}, "spec": {"size": 1}
                }))
                .expect("Memcached"),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");

    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());
    assert!(
        op.logs().contains("released leader lease"),
        "the Lease is released under that identity too:\n{}",
        op.logs()
    );
    delete_cluster_rbac(&real.client, &rbac).await;
}
}

/// `config/webhook/manifests.yaml`'s configurations, pointed at `https://127.0.0.1:PORT`
/// (the operator runs on this machine, not behind a Service) with the cluster CA as
/// `caBundle`, limited to namespace `ns` and named after it.
fn webhook_configurations(
    ns: &str,
    port: u16,
    ca_pem: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let docs = yaml_docs(&config_dir().join("webhook/manifests.yaml"));
    let adapt = |kind: &str| -> Value {
        let mut doc = docs
            .iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in config/webhook/manifests.yaml"))
            .clone();
        let name = doc["metadata"]["name"].as_str().expect("name").to_string();
        doc["metadata"]["name"] = json!(format!("{ns}-{name}"));
        // cert-manager's CA injection: done by hand below.
        if let Some(meta) = doc["metadata"].as_object_mut() {
            meta.remove("annotations");
        }
        for hook in doc["webhooks"].as_array_mut().expect("webhooks") {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("service path")
                .to_string();
            hook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
            });
            hook["namespaceSelector"] = json!({
                "matchLabels": {"kubernetes.io/metadata.name": ns}
            });
        }
        doc
    };
    (
        serde_json::from_value(adapt("MutatingWebhookConfiguration")).expect("mutating"),
        serde_json::from_value(adapt("ValidatingWebhookConfiguration")).expect("validating"),
    )
}

fn dynamic_memcacheds(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<Memcached>(&()))
}

async fn create_raw(
    api: &Api<DynamicObject>,
    ns: &str,
    object: &Value,
    dry_run: bool,
) -> Result<DynamicObject, kube::Error> {
    let mut object = object.clone();
    object["metadata"]["namespace"] = json!(ns);
    let obj: DynamicObject = serde_json::from_value(object).expect("a DynamicObject");
    api.create(
        &PostParams {
            dry_run,
            ..PostParams::default()
        },
        &obj,
    )
    .await
}

on_both_versions! {
/// The operator's admission webhooks registered in the real API server from
/// `config/webhook`: what only the webhook enforces is refused by the validating webhook
/// with the field named; what the CRD schema rejects is refused too (by the schema or by
/// the mutating webhook, which runs first), naming the field; a good object is admitted
/// with the webhook's warning and stored with its defaults; updates are checked; and with
/// the webhook server gone the API server refuses writes (failurePolicy Fail), proving
/// every write went through it.
async fn webhooks_registered_in_the_api_server_refuse_bad_memcacheds(kube: Kube) {
    let real = Real::start(kube, "webhooks").await;
    let ns = real.ns.clone();
    let (cert, key) = real
        .cp
        .serving_cert(&["127.0.0.1", "localhost"])
        .expect("serving certificate");
    let cert_dir = real.dir.path().join("certs");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    std::fs::write(cert_dir.join("tls.crt"), cert).expect("write tls.crt");
    std::fs::write(cert_dir.join("tls.key"), key).expect("write tls.key");
    let port = free_port();
    let mut op = Operator::spawn(
        real.cp.kubeconfig(),
        real.dir.path(),
        "op-webhooks",
        &[
            format!("--namespace={ns}"),
            "--metrics-bind-address=0".into(),
            "--health-probe-bind-address=0".into(),
            format!("--webhook-port={port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
        ],
        &[("ENABLE_WEBHOOKS", "true")],
    );
    let deadline = Instant::now() + CONVERGE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(op.exited().is_none(), "the operator exited:\n{}", op.logs());
        assert!(
            Instant::now() < deadline,
            "the webhook server does not listen:\n{}",
            op.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (mutating, validating) = webhook_configurations(&ns, port, real.cp.ca_pem());
    let mutating = Api::<MutatingWebhookConfiguration>::all(real.client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .expect("the API server accepts the MutatingWebhookConfiguration");
    let validating = Api::<ValidatingWebhookConfiguration>::all(real.client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .expect("the API server accepts the ValidatingWebhookConfiguration");

    let api = dynamic_memcacheds(&real.client, &ns);
    // The API server picks new configurations up within a moment: probe with a dry run of
    // an object only the webhook refuses.
    let probe = memcached("probe", json!({"size": 2, "containerPort": 9150}));
    wait_for_within(
        "the API server calls the webhook",
        CONVERGE,
        || async {
            match create_raw(&api, &ns, &probe, true).await {
                Err(kube::Error::Api(s)) if s.message.contains("admission webhook") => Some(()),
                _ => None,
            }
        },
    )
    .await;

    // Rules only the webhook enforces (the schema lets these through, see bad_input.rs),
    // and what Kubernetes would refuse in the children (the issue's `memory: abc`, a
    // toleration `operator: Bogus`, …; the webhook dry-runs the Deployment and Services it
    // would create): each refused by the validating webhook, on the Memcached's own field.
    let webhook_only = schema_passes_operator_refuses()
        .into_iter()
        .map(|(name, spec, field)| (name, spec, field, None));
    let children = children_refused()
        .into_iter()
        .map(|(name, spec, field, words)| (name.to_string(), spec, field, Some(words)));
    for (name, spec, field, words) in webhook_only.chain(children) {
        let (code, message) = refusal(
            &name,
            create_raw(&api, &ns, &memcached(&name, spec), false).await,
        );
        println!("{kube:?} webhook {name}: {code} {message}");
        assert!(
            message.contains(&format!(
                "admission webhook \"{VALIDATING_WEBHOOK}\" denied the request"
            )),
            "{name}: not the validating webhook's refusal: {message}"
        );
        assert_eq!(code, 422, "{name}: {message}");
        assert!(message.contains(field), "{name}: {field} not in {message}");
        if let Some(words) = words {
            assert!(message.contains(words), "{name}: {words:?} not in {message}");
        }
    }

    // What the CRD schema (or the server's own checks) rejects: refused, the field named,
    // by whichever runs first: the server's decoding, the mutating webhook (structural
    // problems), or the schema validation.
    for (what, object, code, needles) in schema_rejects() {
        let result = create_raw(&api, &ns, &object, false).await;
        if what == "wrong kind" {
            // The API server hands the webhooks the object converted to the kind they are
            // registered for, and applies the mutating webhook's answer to that converted
            // object: the body's `kind: Redis` is replaced, and a Memcached is stored.
            // (Where no webhook is called the server refuses it: 422, `kind: Invalid
            // value: "Redis": must be Memcached`.)
            let stored = result.unwrap_or_else(|e| panic!("{what}: {e}"));
            println!("{kube:?} schema {what}: stored as {:?}", stored.types);
            assert_eq!(
                stored.types.as_ref().map(|t| t.kind.as_str()),
                Some("Memcached")
            );
            api.delete("wrong-kind", &DeleteParams::default())
                .await
                .expect("delete wrong-kind");
            continue;
        }
        let (got, message) = refusal(what, result);
        let by = if message.contains(MUTATING_WEBHOOK) {
            "mutating webhook"
        } else if message.contains(VALIDATING_WEBHOOK) {
            "validating webhook"
        } else {
            "API server"
        };
        println!("{kube:?} schema {what}: {got} by {by}: {message}");
        assert_eq!(got, code, "{what}: {message}");
        // The field is named whoever refuses it; the schema's own words only when the
        // schema does (the webhook words type errors its own way).
        let field = needles[0];
        assert!(message.contains(field), "{what}: {field:?} not in {message}");
        if by == "API server" {
            for needle in &needles {
                assert!(message.contains(needle), "{what}: {needle:?} not in {message}");
            }
        }
    }
    let stored = api.list(&ListParams::default()).await.expect("list");
    assert!(
        stored.items.is_empty(),
        "nothing stored: {:?}",
        stored.items.iter().map(|o| &o.metadata.name).collect::<Vec<_>>()
    );

    // A good one, as a user would create it: admitted with the webhook's warning for a
    // single pod, and stored with the defaults the README documents.
    let good = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "good", "namespace": ns},
        "spec": {"size": 1, "config": {"memoryMiB": 128}}
    });
    let mut kubectl = real.cp.kubectl();
    kubectl.args(["create", "-f", "-"]);
    let out = run(kubectl, Some(good.to_string())).await;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "kubectl create: {stderr}");
    assert!(
        stderr.contains("Warning:") && stderr.contains("spec.size"),
        "the webhook's warning reaches the user: {stderr:?}"
    );
    let stored = real.memcacheds().get("good").await.expect("stored");
    let spec = serde_json::to_value(&stored.spec).expect("spec");
    assert_eq!(spec["containerPort"], 11211, "{spec}");
    assert_eq!(spec["config"]["memoryMiB"], 128, "{spec}");
    assert_eq!(spec["config"]["threads"], 4, "{spec}");
    assert_eq!(spec["config"]["maxConnections"], 1024, "{spec}");
    assert_eq!(spec["config"]["maxItemSize"], "1m", "{spec}");
    assert_eq!(spec["config"]["verbosity"], 1, "{spec}");

    // Updates go through the webhook too.
    let (code, message) = refusal(
        "an update to the exporter's port",
        real.memcacheds()
            .patch(
                "good",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"containerPort": 9150}})),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains(VALIDATING_WEBHOOK), "{message}");
    assert!(message.contains("spec.containerPort"), "{message}");

    // With the webhook server gone, the API server cannot admit anything (failurePolicy
    // Fail): the mutating webhook is called for a good object.
    op.signal(libc::SIGTERM);
    let status = op.wait_exit(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}\n{}", op.logs());
    let (_, message) = refusal(
        "a good object without the webhook server",
        create_raw(&api, &ns, &memcached("good-2", json!({"size": 2})), true).await,
    );
    assert!(
        message.contains(&format!("failed calling webhook \"{MUTATING_WEBHOOK}\"")),
        "{message}"
    );

    let dp = DeleteParams::default();
    Api::<MutatingWebhookConfiguration>::all(real.client.clone())
        .delete(mutating.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await
        .expect("delete the MutatingWebhookConfiguration");
    Api::<ValidatingWebhookConfiguration>::all(real.client.clone())
        .delete(validating.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await
        .expect("delete the ValidatingWebhookConfiguration");
}
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// `kubectl kustomize DIR` (the pinned kubectl), as YAML.
async fn kustomize(cp: &ControlPlane, dir: &Path) -> String {
    let mut cmd = Command::new(cp.bin_dir().join("kubectl"));
    cmd.arg("kustomize").arg(dir);
    let out = run(cmd, None).await;
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `kubectl apply --server-side --dry-run=server -f -` of `yaml`: every object must be
/// accepted, and named in kubectl's report.
async fn server_dry_run(cp: &ControlPlane, what: &str, yaml: &str) {
    let objects = yaml_docs_of(yaml);
    assert!(!objects.is_empty(), "{what} builds to nothing");
    let mut kubectl = cp.kubectl();
    kubectl.args(["apply", "--server-side", "--dry-run=server", "-f", "-"]);
    let out = run(kubectl, Some(yaml.to_string())).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{what}: the API server ({}) refused it:\n{stderr}\n{stdout}",
        cp.version()
    );
    let applied: Vec<&str> = stdout
        .lines()
        .filter(|l| l.ends_with("serverside-applied (server dry run)"))
        .collect();
    println!(
        "{what} on {}: {} objects\n{stdout}{stderr}",
        cp.version(),
        objects.len()
    );
    for obj in &objects {
        let name = obj["metadata"]["name"].as_str().expect("name");
        let kind = obj["kind"].as_str().expect("kind").to_lowercase();
        assert!(
            applied
                .iter()
                .any(|l| l.starts_with(&kind) && l.contains(&format!("/{name} "))),
            "{what}: {kind} {name} not in kubectl's report:\n{stdout}"
        );
    }
    assert_eq!(applied.len(), objects.len(), "{stdout}");
}

on_both_versions! {
/// `config/default` (and with the README's optional `../prometheus` and
/// `../network-policy`) built by the pinned kubectl and applied server-side as a dry run:
/// the real API server accepts every object. cert-manager's and the Prometheus Operator's
/// kinds are installed as minimal CRDs first so that their objects are checked too.
async fn config_applies_server_side(kube: Kube) {
    let cp = ControlPlane::shared(kube).unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    for crd in foreign_crds::cert_manager_and_prometheus() {
        let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("CRD");
        apply_crd(&client, &crd).await;
    }
    // A dry run persists nothing, not even the Namespace it would create, so the objects
    // in it would find no namespace: create it first, as `kubectl apply` of the Namespace
    // would have. (This control plane is this test binary's; nothing else uses it.)
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "memcached-operator-system"}
    }))
    .expect("Namespace");
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating memcached-operator-system: {e}"),
    }
    let tmp = TempDir::new("config");
    let config = tmp.path().join("config");
    copy_tree(&config_dir(), &config);

    let default = kustomize(cp, &config.join("default")).await;
    server_dry_run(cp, "config/default", &default).await;

    let path = config.join("default/kustomization.yaml");
    let mut kustomization = yaml_docs(&path).pop().expect("kustomization");
    let resources = kustomization["resources"].as_array_mut().expect("resources");
    resources.push(json!("../prometheus"));
    resources.push(json!("../network-policy"));
    std::fs::write(&path, serde_yaml::to_string(&kustomization).expect("YAML"))
        .expect("write kustomization");
    let full = kustomize(cp, &config.join("default")).await;
    server_dry_run(cp, "config/default with ../prometheus and ../network-policy", &full).await;
}
}

on_both_versions! {
/// `kubectl wait --for=condition=Ready` (the pinned kubectl) follows the pool: it returns
/// once the pool serves at its size; a change the pool cannot take (pods no node accepts)
/// turns `Ready` False, naming why, while the old pods keep serving; the condition speaks
/// for the current generation (kstatus).
async fn kubectl_wait_for_ready_follows_the_pool(kube: Kube) {
    let real = Real::start(kube, "ready").await;
    let kubeconfig = real.cp.kubeconfig().to_path_buf();
    let _op = real.spawn(&kubeconfig, "op", &real.candidate_args());
    let wait = |condition: &str, timeout: &str| {
        let mut kubectl = real.cp.kubectl();
        kubectl.args([
            "wait",
            "-n",
            &real.ns,
            &format!("--for=condition={condition}"),
            &format!("--timeout={timeout}"),
            "memcached/waited",
        ]);
        kubectl
    };
    real.apply("waited", 2).await;
    let out = run(wait("Ready", "120s"), None).await;
    assert!(
        out.status.success(),
        "kubectl wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let mc = real.converged("waited", 2).await;
    let ready = mc.condition(condition::READY).expect("Ready").clone();
    assert_eq!(ready.observed_generation, mc.metadata.generation);

    // Pods no node accepts: the rollout cannot finish; the old pods keep serving.
    let stuck = json!({
        "apiVersion": "memcached.cache.example.com/v1", "kind": "Memcached",
        "metadata": {"name": "waited"},
        "spec": {"size": 2, "nodeSelector": {"example.com/no-such-node": "true"}},
    });
    real.memcacheds()
        .patch("waited", &PatchParams::apply("real-cluster-test").force(), &Patch::Apply(&stuck))
        .await
        .expect("apply");
    let out = run(wait("Ready=false", "120s"), None).await;
    assert!(
        out.status.success(),
        "kubectl wait Ready=false: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mc = real.memcacheds().get("waited").await.expect("get");
    let ready = mc.condition(condition::READY).expect("Ready");
    assert_eq!(ready.observed_generation, mc.metadata.generation);
    assert!(ready.message.starts_with("Progressing is True"), "{ready:?}");
    assert_eq!(
        mc.condition(condition::AVAILABLE).map(|c| c.status.as_str()),
        Some("True"),
        "the old pods serve"
    );
    let out = run(wait("Ready", "3s"), None).await;
    assert!(!out.status.success(), "kubectl wait returned while the rollout cannot finish");
}
}

on_both_versions! {
/// An operator watching 17 namespaces (9 kinds each, 153 watches) holds a few connections
/// to the API server, not one per watch: the real server's HTTP/2 carries each group of 8
/// namespaces' watches over one connection. And what it watches that way works: a pool in
/// one of the namespaces converges.
async fn the_watches_of_many_namespaces_share_a_few_connections(kube: Kube) {
    const NAMESPACES: usize = 17;
    let real = Real::start(kube, "watch-conns").await;
    let mut namespaces = vec![real.ns.clone()];
    for _ in 1..NAMESPACES {
        let ns = real
            .cp
            .namespace("watch-conns")
            .await
            .unwrap_or_else(|e| panic!("namespace: {e}"));
        namespaces.push(ns);
    }
    let port = real
        .cp
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .expect("the API server's port");
    let kubeconfig = real.cp.kubeconfig().to_path_buf();
    let mut args = real.candidate_args();
    args[0] = format!("--namespace={}", namespaces.join(","));
    let mut op = real.spawn(&kubeconfig, "op", &args);
    op.wait_log("caches synced", CONVERGE).await;
    real.wait_leader(CONVERGE, |h| h == "op").await;
    real.apply("conns", 1).await;
    real.converged("conns", 1).await;
    let held = envtest::established_connections(op.pid(), Some(port));
    println!("{NAMESPACES} namespaces watched over {held} connections");
    // 3 for the watches (8 + 8 + 1 namespaces), the rest for reads and writes (the Lease,
    // the pool's children and status, events).
    assert!(
        (1..=8).contains(&held),
        "{held} connections for {NAMESPACES} namespaces' watches (one per watch: {})",
        NAMESPACES * 9
    );
}
}
