//! What every reconcile shares: the client for writes, the caches for reads, the event
//! publisher, what was learned of the server's normal forms ([`Context`]); and why a
//! reconcile fails ([`Error`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use memcached_api::{Memcached, validation};

use super::ControllerConfig;
use super::events::Events;
use super::pacing::StatusPacing;
use super::secrets::SecretReads;
use super::watches::SecretMeta;
use crate::builders::BuildError;
use crate::cached::{
    CachedConfigMap, CachedDeployment, CachedHpa, CachedNetworkPolicy, CachedPdb, CachedPod,
    CachedService, CachedServiceMonitor,
};
use crate::children::Kind;
use crate::drift::NormalForms;
use crate::informer::{Cache, Index, Store, WhileServed};
use crate::triggers::Busy;

/// Why a reconcile failed; each names the object and the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the desired {kind} for {object}: {source}")]
    Build {
        kind: &'static str,
        object: String,
        source: BuildError,
    },
    #[error("applying {kind} {object}: {source}")]
    Apply {
        kind: &'static str,
        object: String,
        source: kube::Error,
    },
    /// The API server refuses the child built from the spec (the validating webhook
    /// refuses such a Memcached; this one was admitted without it).
    #[error("Kubernetes refuses the {kind} {object} built from the spec: {errors}")]
    Refused {
        kind: &'static str,
        object: String,
        errors: validation::ValidationErrors,
    },
    #[error("patching {kind} {object}: {source}")]
    Patch {
        kind: &'static str,
        object: String,
        source: kube::Error,
    },
    #[error("deleting {kind} {object}: {source}")]
    Delete {
        kind: String,
        object: String,
        source: kube::Error,
    },
    #[error("writing the status of Memcached {object}: {source}")]
    Status { object: String, source: kube::Error },
    #[error("Memcached has no namespace (it is a namespaced kind)")]
    NoNamespace,
    #[error(
        "{kind} {object} is controlled by another owner ({controller}); not taking it over: delete it or rename this Memcached"
    )]
    Conflict {
        kind: &'static str,
        object: String,
        controller: String,
    },
    /// An object of a child's name that the operator did not create (no controller
    /// reference): it is another application's, and left as it is.
    #[error(
        "{kind} {object} already exists and was not created by this Memcached; not taking it over: delete or rename it, or rename this Memcached"
    )]
    NotOurs { kind: &'static str, object: String },
    /// Several children failed (each is told).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Children(Vec<Error>),
}

impl Error {
    /// The `Degraded` condition's reason for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            // A child Kubernetes refuses is the spec's problem, reported as the webhook's
            // rules are.
            Error::Refused { .. } => "InvalidSpec",
            Error::Conflict { .. } | Error::NotOurs { .. } => "ChildConflict",
            Error::Children(errors) => errors.first().map_or("ReconcileFailed", Error::reason),
            _ => "ReconcileFailed",
        }
    }
}

/// Shared state of the reconciler: the client for writes and the caches for reads.
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub memcacheds: Store<Memcached>,
    /// The children's caches, with our writes the watches have not delivered yet.
    pub deployments: Cache<CachedDeployment>,
    pub services: Cache<CachedService>,
    pub pdbs: Cache<CachedPdb>,
    pub network_policies: Cache<CachedNetworkPolicy>,
    pub hpas: Cache<CachedHpa>,
    pub config_maps: Cache<CachedConfigMap>,
    /// The pod cache by `namespace/instance` (the pods of one Memcached).
    pub pod_index: Index<CachedPod>,
    /// Which Secrets exist, at which version (metadata only).
    pub secrets: Store<SecretMeta>,
    /// What was read of the Secrets the pools mount (see [`super::secrets`]).
    pub(super) secret_reads: SecretReads,
    pub(super) events: Events,
    /// Reconciles running (status refreshes and events wait while every slot is taken).
    pub(super) busy: Busy,
    /// What the server stores for each child's desired state (see [`NormalForms`]).
    pub(super) normal_forms: Arc<NormalForms>,
    /// When each pool's status was last written (progress waits for an interval).
    pub(super) status_pacing: StatusPacing,
    /// Each pool's flush on demand as this process last left it.
    pub(super) flushes: super::flush::Flushes,
    /// Our ServiceMonitors, while they are served.
    pub(super) service_monitors: Arc<WhileServed<CachedServiceMonitor>>,
    failures: Mutex<HashMap<ObjectRef<Memcached>, u32>>,
}

impl Context {
    pub(super) fn new(
        client: Client,
        config: ControllerConfig,
        caches: &super::Caches,
        events: Events,
        busy: Busy,
        normal_forms: Arc<NormalForms>,
    ) -> Self {
        let status_pacing = StatusPacing::new(config.status_progress_interval);
        Context {
            client,
            config,
            memcacheds: caches.memcacheds.store(),
            deployments: caches.deployments.cache(),
            services: caches.services.cache(),
            pdbs: caches.pdbs.cache(),
            network_policies: caches.network_policies.cache(),
            hpas: caches.hpas.cache(),
            config_maps: caches.config_maps.cache(),
            pod_index: caches.pod_index.clone(),
            service_monitors: caches.service_monitors.clone(),
            secrets: caches.secrets.store(),
            secret_reads: SecretReads::default(),
            events,
            busy,
            normal_forms,
            status_pacing,
            flushes: Default::default(),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a failure of `key`'s reconcile; returns how many in a row. The counts of
    /// Memcacheds gone from the cache are dropped here (a deleted object is never
    /// reconciled again, so no success would reset them).
    pub(super) fn record_failure(&self, key: ObjectRef<Memcached>) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.retain(|k, _| *k == key || self.memcacheds.get(k).is_some());
        let count = failures.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    pub(super) fn reset_failures(&self, key: &ObjectRef<Memcached>) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }

    /// Whether the API server serves `kind` (a ServiceMonitor: whether the Prometheus
    /// Operator's definition exists), as the watches say.
    pub(super) fn served(&self, kind: Kind) -> bool {
        match kind {
            Kind::ServiceMonitor => self.service_monitors.store().is_some(),
            _ => kind.always_served(),
        }
    }
}

/// `namespace/name` of a Memcached, for logs and messages.
pub(super) fn object_key(mc: &Memcached) -> String {
    format!("{}/{}", mc.namespace().unwrap_or_default(), mc.name_any())
}
