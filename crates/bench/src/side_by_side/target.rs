//! Where one contender runs: a fresh control plane (envtest, stopped afterwards; with
//! `--bare`, etcd and kube-apiserver alone) or a fresh namespace of a given cluster
//! (deleted afterwards), with the CRD installed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt};
use memcached_api::Memcached;

use super::{Args, Contender, PREFIX};
use crate::{Result, create_namespace, log};

/// Where one contender runs: a fresh control plane (dropped, so stopped, afterwards) or a
/// namespace of a given cluster.
pub(super) struct Target {
    pub(super) client: Client,
    pub(super) kubeconfig: PathBuf,
    pub(super) audit: PathBuf,
    pub(super) ns: String,
    pub(super) control_plane: Option<envtest::ControlPlane>,
}

impl Target {
    pub(super) async fn new(args: &Args, who: Contender, n: usize, run: u16) -> Result<Target> {
        if let (Some(kubeconfig), Some(audit)) = (&args.kubeconfig, &args.audit_log) {
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(kubeconfig)?,
                &Default::default(),
            )
            .await?;
            let client = Client::try_from(config)?;
            memcached_operator::crd::check_installed(&client, None).await?;
            let ns = format!(
                "{PREFIX}{}-{n}-{run}-{}",
                who.tag(),
                jiff::Timestamp::now().as_second() % 100_000
            );
            create_namespace(&client, &ns).await?;
            return Ok(Target {
                client,
                kubeconfig: kubeconfig.clone(),
                audit: audit.clone(),
                ns,
                control_plane: None,
            });
        }
        let cp = envtest::ControlPlane::start(envtest::Options {
            workloads: !args.bare,
            ..envtest::Options::new(envtest::Kube::Newest)
        })
        .await?;
        let client = cp.client().await?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.patch(
            "memcacheds.memcached.cache.example.com",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&Memcached::crd()),
        )
        .await?;
        kube::runtime::wait::await_condition(
            crds,
            "memcacheds.memcached.cache.example.com",
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await?;
        let ns = if args.bare {
            // `ControlPlane::namespace` waits for the `default` ServiceAccount, which only
            // kube-controller-manager creates; nothing here runs pods.
            let ns = format!("{PREFIX}{}", who.tag());
            create_namespace(&client, &ns).await?;
            ns
        } else {
            cp.namespace(&format!("{PREFIX}{}", who.tag())).await?
        };
        Ok(Target {
            client,
            kubeconfig: cp.kubeconfig().to_path_buf(),
            audit: cp.audit_log(),
            ns,
            control_plane: Some(cp),
        })
    }

    pub(super) async fn finish(self) {
        if self.control_plane.is_none() {
            delete_namespace(&self.client, &self.ns).await;
        }
    }
}

pub(super) async fn delete_namespace(client: &Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = namespaces.delete(ns, &DeleteParams::background()).await {
        log(format!("could not delete namespace {ns}: {e}"));
        return;
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if let Ok(None) = namespaces.get_opt(ns).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    log(format!(
        "namespace {ns} still terminating after 10 min; going on"
    ));
}
