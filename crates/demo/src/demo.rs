//! The demo: the operator running in-process against the in-memory API server with its
//! workload simulator. It applies the seed's sample, scales it, repairs drift, recreates a
//! deleted Service and deletes the sample, printing what happens.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use memcached_api::{Memcached, condition};
use memcached_operator::controller::{self, ControllerConfig};
use memcached_operator::samples::SEED_SAMPLE;

/// How the demo went wrong, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{step}: {source}")]
    Api {
        step: &'static str,
        source: kube::Error,
    },
    #[error("{step}: timed out after {timeout:?}")]
    Timeout {
        step: &'static str,
        timeout: Duration,
    },
    #[error("the seed sample does not parse: {0}")]
    Sample(#[from] serde_yaml::Error),
    #[error("starting the in-memory API server: {0}")]
    Serve(#[from] std::io::Error),
}

/// Writes time-stamped lines; shared by the narrative and the status watcher.
#[derive(Clone)]
struct Printer {
    out: Arc<Mutex<dyn Write + Send>>,
    start: Instant,
}

impl Printer {
    fn line(&self, text: impl AsRef<str>) {
        let t = self.start.elapsed().as_secs_f64();
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout must not stop the demo.
        let _ = writeln!(out, "[{t:7.3}s] {}", text.as_ref());
        let _ = out.flush();
    }
}

async fn wait_for<T, F, Fut>(
    step: &'static str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, DemoError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(DemoError::Timeout { step, timeout });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn api_err(step: &'static str) -> impl FnOnce(kube::Error) -> DemoError {
    move |source| DemoError::Api { step, source }
}

fn summary(mc: &Memcached) -> String {
    let status = mc.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        mc.condition(t)
            .map(|c| format!("{}={}({})", t, c.status, c.reason))
            .unwrap_or_default()
    };
    format!(
        "memcached/{} size={} ready={}/{} nodes={:?} {} {} {}",
        mc.name_any(),
        mc.spec.size,
        status.ready_replicas,
        status.replicas,
        status.nodes,
        cond(condition::AVAILABLE),
        cond(condition::PROGRESSING),
        cond(condition::DEGRADED)
    )
}

async fn converged(api: &Api<Memcached>, name: &str, size: usize) -> Option<Memcached> {
    let mc = api.get_opt(name).await.ok().flatten()?;
    let status = mc.status.as_ref()?;
    let available = mc
        .condition(condition::AVAILABLE)
        .is_some_and(|c| c.status == "True");
    let progressing = mc
        .condition(condition::PROGRESSING)
        .is_some_and(|c| c.status == "True");
    (status.nodes.len() == size
        && available
        && !progressing
        && status.observed_generation == mc.metadata.generation)
        .then_some(mc)
}

/// Runs the demo, writing its narrative to `out`. `step_timeout` bounds each wait.
pub async fn run<W: Write + Send + 'static>(
    out: W,
    step_timeout: Duration,
) -> Result<(), DemoError> {
    let p = Printer {
        out: Arc::new(Mutex::new(out)),
        start: Instant::now(),
    };
    let server = apisim::ApiServer::builder()
        .workload_simulator(true)
        .pod_ready_delay(Duration::from_millis(300))
        .build();
    let handle = server.serve().await?;
    p.line(format!(
        "in-memory API server on {} (kubectl --server {} get memcacheds,deployments,services,pods)",
        handle.url(),
        handle.url()
    ));
    let client: Client = server.client();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Memcached::crd())
        .await
        .map_err(api_err("installing the CRD"))?;
    p.line("installed CRD memcacheds.memcached.cache.example.com (make install)");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = ControllerConfig {
        resync: Duration::from_secs(30),
        ..ControllerConfig::default()
    };
    let operator = tokio::spawn(controller::run(client.clone(), config, async {
        let _ = stop_rx.await;
    }));
    p.line("operator started: watching Memcacheds, owning Deployments and Services, watching Pods");

    // Print every status change as it happens.
    let api: Api<Memcached> = Api::default_namespaced(client.clone());
    let watch_api = api.clone();
    let watch_printer = p.clone();
    let status_watch = tokio::spawn(async move {
        let mut last = String::new();
        let mut stream = watcher(watch_api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(mc)) = stream.next().await {
            if mc.status.is_none() {
                continue;
            }
            let line = summary(&mc);
            if line != last {
                watch_printer.line(format!("  status: {line}"));
                last = line;
            }
        }
    });

    let sample: Memcached = serde_yaml::from_str(SEED_SAMPLE)?;
    p.line("applying the seed sample: memcached-sample, spec.size: 3");
    api.patch(
        "memcached-sample",
        &PatchParams::apply("kubectl"),
        &Patch::Apply(&sample),
    )
    .await
    .map_err(api_err("applying the sample"))?;
    let mc = wait_for("waiting for 3 ready pods", step_timeout, || {
        converged(&api, "memcached-sample", 3)
    })
    .await?;
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let d = deployments
        .get("memcached-sample")
        .await
        .map_err(api_err("reading the Deployment"))?;
    let image = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    p.line(format!(
        "Deployment memcached-sample: replicas={} image={image}, owned by Memcached {}",
        d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        d.owner_references()
            .first()
            .map(|o| o.name.as_str())
            .unwrap_or("?")
    ));
    p.line(format!("converged: {}", summary(&mc)));
    let owned_services: Vec<String> = services
        .list(&ListParams::default().labels("app.kubernetes.io/instance=memcached-sample"))
        .await
        .map_err(api_err("listing the Services"))?
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    let budget = pdbs
        .get_opt("memcached-sample")
        .await
        .map_err(api_err("reading the PodDisruptionBudget"))?
        .is_some();
    p.line(format!(
        "also owned: Service {owned_services:?} (headless: DNS names every ready pod), PodDisruptionBudget: {}; endpoints {:?}",
        if budget { "maxUnavailable 1" } else { "none" },
        mc.status.as_ref().map(|s| s.endpoints.clone()).unwrap_or_default()
    ));

    p.line("kubectl scale memcached/memcached-sample --replicas=5");
    let scale = serde_json::json!({"spec": {"replicas": 5}});
    api.patch_scale(
        "memcached-sample",
        &PatchParams::default(),
        &Patch::Merge(&scale),
    )
    .await
    .map_err(api_err("scaling to 5"))?;
    let mc = wait_for("waiting for 5 ready pods", step_timeout, || {
        converged(&api, "memcached-sample", 5)
    })
    .await?;
    p.line(format!("converged: {}", summary(&mc)));

    p.line("drift: someone edits the Deployment to replicas=1");
    let edit = serde_json::json!({"spec": {"replicas": 1}});
    deployments
        .patch(
            "memcached-sample",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await
        .map_err(api_err("editing the Deployment"))?;
    wait_for(
        "waiting for the drift to be repaired",
        step_timeout,
        || async {
            let d = deployments
                .get_opt("memcached-sample")
                .await
                .ok()
                .flatten()?;
            (d.spec.as_ref()?.replicas == Some(5)).then_some(())
        },
    )
    .await?;
    p.line("repaired: Deployment replicas back to 5 (spec.size)");

    p.line("drift: someone deletes the Service");
    services
        .delete("memcached-sample", &DeleteParams::default())
        .await
        .map_err(api_err("deleting the Service"))?;
    wait_for(
        "waiting for the Service to come back",
        step_timeout,
        || async {
            let s = services.get_opt("memcached-sample").await.ok().flatten()?;
            s.metadata.deletion_timestamp.is_none().then_some(())
        },
    )
    .await?;
    p.line("repaired: Service memcached-sample recreated");

    p.line("kubectl delete memcached/memcached-sample");
    api.delete("memcached-sample", &DeleteParams::default())
        .await
        .map_err(api_err("deleting the sample"))?;
    wait_for(
        "waiting for the owned objects to be garbage-collected",
        step_timeout,
        || async {
            let d = deployments.get_opt("memcached-sample").await.ok()?;
            let s = services.get_opt("memcached-sample").await.ok()?;
            (d.is_none() && s.is_none()).then_some(())
        },
    )
    .await?;
    p.line("deleted: Deployment and Service garbage-collected through their ownerReferences");

    let counts = server.request_counts();
    p.line(format!(
        "API requests made during the demo: {}",
        counts.total()
    ));
    let _ = stop_tx.send(());
    status_watch.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), operator).await;
    p.line("operator stopped; demo done");
    drop(handle);
    Ok(())
}
