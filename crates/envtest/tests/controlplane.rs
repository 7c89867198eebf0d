//! The harness itself: the control plane starts, runs workloads on kwok's fake nodes (pods
//! Running and Ready with IPs, scheduled by the real scheduler), collects garbage, and says
//! which binary is missing and how to build it.

use std::time::{Duration, Instant};

use envtest::{ControlPlane, Error, Kube, Options};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn workloads_run(kube: Kube) {
    let cp = ControlPlane::shared(kube).expect("control plane starts");
    let client = cp.client().await.expect("admin client");
    let info = client.apiserver_version().await.expect("/version");
    assert_eq!(
        format!("v{}.{}", info.major, info.minor.trim_end_matches('+')),
        cp.version().minor_tag(),
        "the server is the pinned version"
    );
    let ns = cp.namespace("workloads").await.expect("namespace");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready = eventually(
        "3 pods Running and Ready with IPs on fake nodes",
        || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let ready: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| {
                    let s = p.status.as_ref();
                    s.and_then(|s| s.phase.as_deref()) == Some("Running")
                        && s.and_then(|s| s.pod_ip.as_ref()).is_some()
                        && s.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .collect();
            (ready.len() == 3).then_some(ready)
        },
    )
    .await;
    for p in &ready {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(
            node.starts_with("kwok-node-"),
            "scheduled onto a fake node: {node}"
        );
    }
    eventually("the Deployment reports 3 available replicas", || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.available_replicas == Some(3)).then_some(())
    })
    .await;

    // Garbage collection: the ReplicaSet and pods go with their Deployment.
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the pods garbage-collected", || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn workloads_run_on_the_newest_pinned_version() {
    workloads_run(Kube::Newest).await;
}

#[tokio::test]
async fn workloads_run_on_the_oldest_pinned_version() {
    workloads_run(Kube::Oldest).await;
}

#[tokio::test]
async fn an_owned_control_plane_stores_objects_and_leaves_no_process_behind() {
    let cp = ControlPlane::start(Options {
        workloads: false,
        ..Options::new(Kube::Newest)
    })
    .await
    .expect("control plane starts");
    // How long start-up takes is reported, not asserted (a busy machine would flake it).
    eprintln!("etcd and kube-apiserver ready in {:?}", cp.started_in());
    let client = cp.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
    )
    .await
    .expect("the server stores objects");
    let dir = cp.dir().to_path_buf();
    let pids = pids_under(&dir);
    assert!(
        pids.len() >= 2,
        "etcd and kube-apiserver run from {dir:?}: {pids:?}"
    );
    drop(cp);
    assert!(!dir.exists(), "the data directory is removed");
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "process {pid} is gone"
        );
    }
}

/// PIDs of processes whose working directory is `dir`.
fn pids_under(dir: &std::path::Path) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd == dir) {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn a_missing_binary_is_named_with_the_command_that_builds_it() {
    let empty = std::env::temp_dir().join(format!("envtest-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let err = ControlPlane::start(Options {
        bin_root: Some(empty.clone()),
        ..Options::new(Kube::Oldest)
    })
    .await
    .expect_err("no binaries there");
    let _ = std::fs::remove_dir_all(&empty);
    assert!(matches!(err, Error::MissingBinary { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("etcd is missing"), "{msg}");
    assert!(msg.contains("make controlplane"), "{msg}");
    let oldest = envtest::pinned_kube_versions().unwrap()[0].minor_tag();
    assert!(
        msg.contains(&format!("hack/controlplane/build.sh {oldest}")),
        "{msg}"
    );
}

/// `make dev-cluster`'s program: a kubeconfig appears once the cluster is ready, the seed's
/// workflow (`make install`, `kubectl apply -k config/samples`) works against it with the
/// pinned kubectl, and SIGTERM stops every process and removes the kubeconfig.
#[tokio::test]
async fn the_dev_cluster_serves_the_seed_workflow_and_stops_on_term() {
    let root = envtest::repo_root();
    let dir = std::env::temp_dir().join(format!("dev-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dev-cluster"))
        .args(["--kube", "newest", "--nodes", "1", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("dev-cluster starts");
    eventually("the kubeconfig written", || async {
        kubeconfig.exists().then_some(())
    })
    .await;
    let kubectl = envtest::kubectl_path().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .current_dir(&root)
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["apply", "--server-side", "-k", "config/crd"]);
    // `kubectl wait` fails at once (rather than waiting) while the new CRD has no
    // conditions yet ("accessor error: <nil>"): asked again until it answers.
    eventually("the CRD Established, as kubectl wait says", || async {
        std::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/memcacheds.memcached.cache.example.com",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| ())
    })
    .await;
    run(&["apply", "-k", "config/samples"]);
    let size = run(&[
        "get",
        "memcached",
        "memcached-sample",
        "-o",
        "jsonpath={.spec.size}",
    ]);
    assert_eq!(size, "3");
    let nodes = run(&["get", "nodes", "-o", "name"]);
    assert_eq!(nodes.trim(), "node/kwok-node-0");

    let pid = child.id();
    let children: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| s.rsplit(") ").next().map(str::to_owned))
                .and_then(|rest| rest.split_whitespace().nth(1).map(str::to_owned))
                .is_some_and(|ppid| ppid == pid.to_string())
        })
        .collect();
    assert!(
        children.len() >= 5,
        "etcd, apiserver, controllers, scheduler, kwok: {children:?}"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!kubeconfig.exists(), "the kubeconfig is removed");
    for p in children {
        let gone = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true);
        assert!(gone, "process {p} stopped");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The audit log tells who did what: a client acting as its own user is counted apart from
/// everyone else, writes apart from reads, and a server-side dry run is not a write.
#[tokio::test]
async fn the_audit_log_counts_one_clients_writes() {
    let cp = ControlPlane::shared(Kube::Newest).expect("control plane starts");
    let ns = cp.namespace("audit").await.unwrap();
    let alice = cp.client_as("alice", &["system:masters"]).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(alice, &ns);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.get("a").await.unwrap();
    cms.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap(),
    )
    .await
    .unwrap();
    let mine = eventually("alice's three requests logged", || async {
        let mine: Vec<_> = cp
            .audit()
            .ok()?
            .into_iter()
            .filter(|r| r.username == "alice" && r.namespace == ns)
            .collect();
        (mine.len() >= 3).then_some(mine)
    })
    .await;
    let writes: Vec<_> = mine.iter().filter(|r| r.is_write()).collect();
    assert_eq!(writes.len(), 1, "{mine:#?}");
    assert_eq!(
        (
            writes[0].verb.as_str(),
            writes[0].resource.as_str(),
            writes[0].name.as_str(),
            writes[0].code
        ),
        ("create", "configmaps", "a", 201)
    );
    assert!(mine.iter().any(|r| r.verb == "get" && r.name == "a"));
    assert!(mine.iter().any(|r| r.is_dry_run() && r.verb == "create"));
}
