//! # apisim — an in-memory Kubernetes API server
//!
//! `apisim` behaves like kube-apiserver where an operator depends on it: a generic JSON
//! object store with a global resourceVersion, the REST routes (`/api/v1/...`,
//! `/apis/GROUP/VERSION/...`), create/get/list/update/patch/delete/deletecollection/watch,
//! status and scale subresources, merge / JSON / strategic-merge / server-side-apply
//! patches, label and field selectors, pagination, watch with resume and 410 Expired,
//! discovery, CRDs with structural-schema validation, finalizers, ownerReference garbage
//! collection, namespace deletion, an optional workload simulator (Deployments →
//! ReplicaSets → Pods), fault injection and request counting.
//!
//! It is used in-process (`ApiServer::client()` returns a `kube::Client` whose requests go
//! straight to the server, no sockets) or over plain HTTP (`ApiServer::serve()`), which
//! also works with `kubectl`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! let server = apisim::ApiServer::new();
//! let client = server.client();
//! let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
//! let cm: ConfigMap = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "x"}, "data": {"k": "v"}
//! }))?;
//! cms.create(&Default::default(), &cm).await?;
//! assert!(server.get_object("v1", "configmaps", Some("default"), "x").is_some());
//! # Ok(()) }
//! ```
//!
//! ## Modules
//!
//! * `store` — the object store, resourceVersions, watch history, create/update/delete
//!   semantics (status subresource, generation, finalizers), GC and namespace cleanup;
//! * `http` — routing, request parsing, list/selectors/pagination, patches, scale,
//!   discovery, the hyper server; `watch` — watch streams; `table` — kubectl Tables;
//! * `patch` — merge / JSON / strategic merge patch; `apply` — server-side apply with field
//!   ownership; `schema` — CRD structural schemas (defaulting, pruning, validation);
//! * `registry` — built-in kinds and CRD-defined kinds (discovery documents);
//! * `review` — TokenReview and SubjectAccessReview; `sim` — the workload simulator;
//! * `selectors` — label and field selectors; `validation` — names, labels, annotations
//!   and data keys as kube-apiserver checks them; `util` — small helpers;
//! * `faults` — fault injection and request counting.
//!
//! ## What is approximated
//!
//! The crate's `README.md` lists it exactly. In short: no authentication/authorization
//! of requests and no admission webhooks; JSON only (no protobuf/CBOR) and no OpenAPI
//! (kubectl needs `--validate=false`); no version conversion (an object is served at
//! every served version with only `apiVersion` rewritten); lists answer from the current
//! state (resourceVersion on list is ignored, continue tokens resume after the last key);
//! strategic merge patch knows a fixed table of merge keys; server-side apply tracks
//! ownership of leaf field paths per manager (conflicts, force, removal of fields a
//! manager stops applying) without per-type schemas; built-in kinds are not
//! schema-validated; the workload simulator replaces kube-controller-manager and kubelet
//! with a simple model (pods become Ready after a delay, rolling updates by maxSurge /
//! maxUnavailable).

mod apply;
mod error;
mod faults;
mod fields;
mod http;
mod patch;
mod registry;
mod review;
mod schema;
mod selectors;
mod sim;
mod store;
mod table;
mod util;
mod validation;
mod watch;

pub use error::ApiError;
pub use faults::{AuditEvent, Fault, RequestCounts};

use bytes::Bytes;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::broadcast;

/// Response body type of [`ApiService`].
pub type ResponseBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// Capacity of the internal event channel; a watcher more than this many events behind
/// has its stream closed (it re-watches from its last resourceVersion).
const EVENT_CHANNEL: usize = 16_384;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub simulator: bool,
    pub pod_ready_delay: Duration,
    pub bookmark_interval: Duration,
}

pub(crate) struct Inner {
    pub state: Mutex<store::State>,
    pub tx: broadcast::Sender<Arc<store::Event>>,
    pub cut: tokio::sync::watch::Sender<u64>,
    pub faults: Mutex<Vec<faults::FaultState>>,
    /// Bumped whenever the faults change, waking requests held by a hanging fault.
    pub faults_changed: tokio::sync::watch::Sender<u64>,
    /// Every answered request, in order, when the server keeps an audit log.
    pub audit: Option<Mutex<Vec<faults::AuditEvent>>>,
    pub counts: Mutex<BTreeMap<(String, String), u64>>,
    pub latency: Mutex<Duration>,
    pub cfg: Config,
    pub bg_started: AtomicBool,
}

impl Inner {
    /// Start the background tasks (GC, simulator) once a tokio runtime is available.
    pub fn ensure_background(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if self.bg_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let rx = self.tx.subscribe();
        tokio::spawn(store::gc::run(weak.clone(), rx));
        if self.cfg.simulator {
            let rx = self.tx.subscribe();
            tokio::spawn(sim::run(weak, rx, self.cfg.pod_ready_delay));
        }
    }
}

/// An in-memory Kubernetes API server. Cheap to clone (shared state).
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").finish_non_exhaustive()
    }
}

/// Builder for [`ApiServer`].
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    simulator: bool,
    pod_ready_delay: Duration,
    watch_history: usize,
    bookmark_interval: Duration,
    audit_log: bool,
}

impl ApiServerBuilder {
    /// Run the Deployment/ReplicaSet/Pod simulator (default: off).
    pub fn workload_simulator(mut self, on: bool) -> Self {
        self.simulator = on;
        self
    }
    /// How long simulated pods stay Pending before turning Running/Ready (default 200ms).
    pub fn pod_ready_delay(mut self, d: Duration) -> Self {
        self.pod_ready_delay = d;
        self
    }
    /// Number of events kept for watch resume (default 10 000). Older resourceVersions get 410.
    pub fn watch_history(mut self, n: usize) -> Self {
        self.watch_history = n;
        self
    }
    /// Interval of BOOKMARK events on watches that asked for them (default 1s).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }
    /// Keep a record of every answered request (who, what, status code), read with
    /// [`ApiServer::audit_events`] (default: off; it grows with every request).
    pub fn audit_log(mut self, on: bool) -> Self {
        self.audit_log = on;
        self
    }
    pub fn build(self) -> ApiServer {
        let (tx, _) = broadcast::channel(EVENT_CHANNEL);
        let state = store::State::new(self.watch_history, tx.clone());
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let inner = Arc::new(Inner {
            state: Mutex::new(state),
            tx,
            cut,
            faults: Mutex::new(vec![]),
            faults_changed: tokio::sync::watch::channel(0u64).0,
            audit: self.audit_log.then(|| Mutex::new(Vec::new())),
            counts: Mutex::new(BTreeMap::new()),
            latency: Mutex::new(Duration::ZERO),
            cfg: Config {
                simulator: self.simulator,
                pod_ready_delay: self.pod_ready_delay,
                bookmark_interval: self.bookmark_interval,
            },
            bg_started: AtomicBool::new(false),
        });
        if self.simulator {
            // the node the simulated pods run on
            let mut st = inner.state.lock();
            if let Some(rt) = st.rt("", "nodes") {
                let node = serde_json::json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "apisim-node", "labels": {"kubernetes.io/hostname": "apisim-node", "kubernetes.io/os": "linux"}},
                    "spec": {"podCIDR": "10.244.0.0/16"},
                });
                if st
                    .create(&rt, None, node, &store::WriteCtx::internal("v1"))
                    .is_ok()
                {
                    let mut n = st
                        .get(&rt.key(), "", "apisim-node")
                        .map(|n| (**n).clone())
                        .unwrap_or_default();
                    n["status"] = serde_json::json!({
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "apisim simulated node"}],
                        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "apisim-node"}],
                        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "1000"},
                        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "1000"},
                    });
                    let _ = st.update(
                        &rt,
                        "",
                        "apisim-node",
                        "status",
                        n,
                        &store::WriteCtx::internal("v1"),
                    );
                }
            }
        }
        inner.ensure_background();
        ApiServer { inner }
    }
}

/// The store's changes, from [`ApiServer::changes`].
pub struct Changes(broadcast::Receiver<Arc<store::Event>>);

impl Changes {
    /// The next change; `None` once the server is gone. After a gap (this receiver fell
    /// behind), a change whose [`Change::event_type`] is `LAGGED` comes first.
    pub async fn recv(&mut self) -> Option<Change> {
        match self.0.recv().await {
            Ok(ev) => Some(Change(Some(ev))),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Change(None)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// One change of the store (`None` inside: changes were missed).
#[derive(Clone, Debug)]
pub struct Change(Option<Arc<store::Event>>);

impl Change {
    /// The plural of the object's kind ("deployments"); empty for `LAGGED`.
    pub fn kind_plural(&self) -> &str {
        self.0.as_ref().map_or("", |ev| ev.key.1.as_str())
    }

    /// `ADDED`, `MODIFIED` or `DELETED`; `LAGGED` when changes were missed.
    pub fn event_type(&self) -> &str {
        self.0.as_ref().map_or("LAGGED", |ev| ev.etype)
    }

    /// The object as stored after the change (before it, for `DELETED`); null for `LAGGED`.
    pub fn object(&self) -> &Value {
        static NONE: Value = Value::Null;
        self.0.as_ref().map_or(&NONE, |ev| &ev.obj)
    }
}

impl ApiServer {
    /// A server with the built-in kinds and namespaces; workload simulator off.
    pub fn new() -> ApiServer {
        Self::builder().build()
    }

    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder {
            simulator: false,
            pod_ready_delay: Duration::from_millis(200),
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(1),
            audit_log: false,
        }
    }

    /// An in-process `kube::Client` (default namespace "default"). Needs a tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The server as a `tower::Service`.
    pub fn service(&self) -> ApiService {
        ApiService {
            inner: self.inner.clone(),
        }
    }

    /// Serve plain HTTP on 127.0.0.1 (random port) until the handle is dropped.
    pub async fn serve(&self) -> std::io::Result<ServeHandle> {
        http::serve(self.inner.clone()).await
    }

    /// Add a fault; faults are checked in the order added, the first that fires wins.
    pub fn inject(&self, fault: Fault) {
        self.inner
            .faults
            .lock()
            .push(faults::FaultState { fault, matched: 0 });
        self.inner.faults_changed.send_modify(|v| *v += 1);
    }

    /// Removes every fault; requests held by a [`Fault::hang`] go on.
    pub fn clear_faults(&self) {
        self.inner.faults.lock().clear();
        self.inner.faults_changed.send_modify(|v| *v += 1);
    }

    /// Delay added to every request.
    pub fn set_latency(&self, d: Duration) {
        *self.inner.latency.lock() = d;
    }

    /// End every open watch stream now (clients see a normal end of stream).
    pub fn cut_watches(&self) {
        self.inner.cut.send_modify(|v| *v += 1);
    }

    pub fn request_counts(&self) -> RequestCounts {
        RequestCounts {
            map: self.inner.counts.lock().clone(),
        }
    }

    pub fn reset_request_counts(&self) {
        self.inner.counts.lock().clear();
    }

    /// The answered requests so far, in the order answered (empty unless the server was
    /// built with [`ApiServerBuilder::audit_log`]).
    pub fn audit_events(&self) -> Vec<AuditEvent> {
        self.inner
            .audit
            .as_ref()
            .map(|log| log.lock().clone())
            .unwrap_or_default()
    }

    /// Register a bearer token: TokenReview authenticates it, and requests carrying it are
    /// attributed to `username` (in [`Fault::user`] and the audit log).
    pub fn allow_token(&self, token: &str, username: &str, groups: &[&str]) {
        self.inner.state.lock().tokens.insert(
            token.to_string(),
            (
                username.to_string(),
                groups.iter().map(|g| g.to_string()).collect(),
            ),
        );
    }

    /// Every change the store makes from now on, in order, in-process: no serialization, no
    /// HTTP, nothing added to what the server does for its clients (a tool observing a
    /// benchmark uses it so as not to load the server it measures). A receiver that falls
    /// more than the channel's capacity behind sees a `LAGGED` change and should read the
    /// store again.
    pub fn changes(&self) -> Changes {
        Changes(self.inner.tx.subscribe())
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.state.lock().rv
    }

    /// One stored object (`api_version` like "v1" or "apps/v1", `kind_plural` like
    /// "deployments"; `namespace` None means "default" for namespaced kinds and is ignored
    /// for cluster-scoped ones).
    pub fn get_object(
        &self,
        api_version: &str,
        kind_plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let (group, version) = split_api_version(api_version);
        let st = self.inner.state.lock();
        let rt = st.reg.find(group, version, kind_plural)?;
        let ns = if rt.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        st.get(&rt.key(), ns, name)
            .map(|o| http::present(o, rt, version))
    }

    /// Stored objects of a kind (all namespaces when `namespace` is None), sorted by namespace/name.
    pub fn list_objects(
        &self,
        api_version: &str,
        kind_plural: &str,
        namespace: Option<&str>,
    ) -> Vec<Value> {
        let (group, version) = split_api_version(api_version);
        let st = self.inner.state.lock();
        let Some(rt) = st.reg.find(group, version, kind_plural) else {
            return vec![];
        };
        let ns = if rt.namespaced { namespace } else { None };
        st.list(&rt.key(), ns)
            .iter()
            .map(|o| http::present(o, rt, version))
            .collect()
    }
}

pub(crate) fn split_api_version(av: &str) -> (&str, &str) {
    match av.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", av),
    }
}

/// The server as a `tower::Service<http::Request<B>>` (usable by `kube::Client::new`).
#[derive(Clone)]
pub struct ApiService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiService").finish_non_exhaustive()
    }
}

impl<B> tower::Service<::http::Request<B>> for ApiService
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = ::http::Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ::http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = match body.collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) => {
                    return Ok(http::error_response(&ApiError::bad_request(format!(
                        "error reading request body: {e}"
                    ))));
                }
            };
            // belt and braces: a bug must not take the connection (or kube's Buffer) down
            use futures::FutureExt;
            match std::panic::AssertUnwindSafe(http::handle(inner, parts, bytes))
                .catch_unwind()
                .await
            {
                Ok(r) => Ok(r),
                Err(_) => Ok(http::error_response(&ApiError::internal(
                    "apisim: internal error while handling the request",
                ))),
            }
        })
    }
}

/// A running HTTP server; dropping it stops the server and its connections.
pub struct ServeHandle {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ServeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeHandle")
            .field("port", &self.port)
            .finish()
    }
}

impl ServeHandle {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    /// A kubeconfig for this server (cluster, user and context all named "apisim").
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: apisim\n  cluster:\n    server: {}\nusers:\n- name: apisim\n  user: {{}}\ncontexts:\n- name: apisim\n  context:\n    cluster: apisim\n    user: apisim\n    namespace: default\ncurrent-context: apisim\npreferences: {{}}\n",
            self.url()
        )
    }
    pub fn write_kubeconfig(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }
}

impl Drop for ServeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
