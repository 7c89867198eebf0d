//! Fault injection and request counting.

use crate::error::ApiError;
use std::collections::BTreeMap;

/// A fault to inject: requests matching every set filter fail with `status`, or, with
/// [`Fault::hang`], are held unanswered.
///
/// ```
/// use apisim::Fault;
/// let f = Fault::new().verb("patch").resource("deployments").status(500).times(2);
/// // A network partition of one client: its requests get no answer until the fault is cleared.
/// let p = Fault::new().user("op-a").hang();
/// # let _ = (f, p);
/// ```
#[derive(Debug, Clone)]
pub struct Fault {
    pub(crate) verb: Option<String>,
    pub(crate) resource: Option<String>,
    pub(crate) subresource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) hang: bool,
    pub(crate) status: u16,
    pub(crate) message: Option<String>,
    pub(crate) times: Option<u64>,
    pub(crate) fraction: Option<f64>,
}

impl Default for Fault {
    fn default() -> Self {
        Self::new()
    }
}

impl Fault {
    /// A fault matching every request, failing with 500, forever (narrow it down with the setters).
    pub fn new() -> Fault {
        Fault {
            verb: None,
            resource: None,
            subresource: None,
            namespace: None,
            name: None,
            user: None,
            hang: false,
            status: 500,
            message: None,
            times: None,
            fraction: None,
        }
    }
    /// Audit verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`) or `any` / `*`.
    pub fn verb(mut self, v: &str) -> Fault {
        self.verb = (v != "any" && v != "*").then(|| v.to_string());
        self
    }
    /// Resource plural (`deployments`); `memcacheds/status` also sets the subresource.
    /// Without a subresource filter, requests to any subresource of the resource match.
    pub fn resource(mut self, r: &str) -> Fault {
        match r.split_once('/') {
            Some((r, s)) => {
                self.resource = Some(r.to_string());
                self.subresource = Some(s.to_string());
            }
            None => self.resource = Some(r.to_string()),
        }
        self
    }
    /// Subresource (`status`, `scale`); `""` matches only the main resource.
    pub fn subresource(mut self, s: &str) -> Fault {
        self.subresource = Some(s.to_string());
        self
    }
    pub fn namespace(mut self, ns: &str) -> Fault {
        self.namespace = Some(ns.to_string());
        self
    }
    /// Object name.
    pub fn name(mut self, n: &str) -> Fault {
        self.name = Some(n.to_string());
        self
    }
    /// Only requests of this user: the username [`crate::ApiServer::allow_token`] registered
    /// for the request's bearer token, `system:anonymous` without a registered one.
    pub fn user(mut self, u: &str) -> Fault {
        self.user = Some(u.to_string());
        self
    }
    /// Hold matching requests unanswered (instead of failing them) until the fault is
    /// cleared, as a network partition between the client and the server would; they are
    /// served then if their client still waits. A client that gives up first (drops the
    /// request, closes the connection) never has its request served. Open watch streams are
    /// not held (see [`crate::ApiServer::cut_watches`]).
    pub fn hang(mut self) -> Fault {
        self.hang = true;
        self
    }
    /// HTTP status of the injected error (reason follows: 409 Conflict, 429 TooManyRequests ...).
    pub fn status(mut self, code: u16) -> Fault {
        self.status = code;
        self
    }
    pub fn message(mut self, m: &str) -> Fault {
        self.message = Some(m.to_string());
        self
    }
    /// Fire only for the first `n` matching requests.
    pub fn times(mut self, n: u64) -> Fault {
        self.times = Some(n);
        self
    }
    /// Fire for this fraction of matching requests, deterministically: the k-th match fires
    /// when `floor(k * f) > floor((k - 1) * f)` (0.5 = every 2nd, 0.3 = 3 of every 10).
    pub fn fraction(mut self, f: f64) -> Fault {
        self.fraction = Some(f.clamp(0.0, 1.0));
        self
    }
}

#[derive(Debug, Clone)]
pub(crate) struct FaultState {
    pub fault: Fault,
    pub matched: u64,
}

pub(crate) struct RequestInfo<'a> {
    pub user: &'a str,
    pub verb: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// What a fault does to the request it fires for.
pub(crate) enum Fired {
    Fail(ApiError),
    Hang,
}

impl FaultState {
    /// Check one request; counts matches and says whether to fail or hold it.
    pub fn check(&mut self, r: &RequestInfo<'_>) -> Option<Fired> {
        let f = &self.fault;
        if f.verb.as_deref().is_some_and(|v| v != r.verb)
            || f.user.as_deref().is_some_and(|v| v != r.user)
            || f.resource.as_deref().is_some_and(|v| v != r.resource)
            || f.subresource.as_deref().is_some_and(|v| v != r.subresource)
            || f.namespace.as_deref().is_some_and(|v| v != r.namespace)
            || f.name.as_deref().is_some_and(|v| v != r.name)
        {
            return None;
        }
        self.matched += 1;
        let k = self.matched;
        if let Some(t) = f.times
            && k > t
        {
            return None;
        }
        if let Some(fr) = f.fraction
            && ((k as f64) * fr).floor() <= (((k - 1) as f64) * fr).floor()
        {
            return None;
        }
        if f.hang {
            return Some(Fired::Hang);
        }
        let msg = f
            .message
            .clone()
            .unwrap_or_else(|| format!("injected fault: {} {} failed", r.verb, r.resource));
        let mut e = ApiError::new(f.status, msg);
        if f.status == 429 || f.status == 500 || f.status == 503 {
            e = e.with_details(serde_json::json!({"retryAfterSeconds": 1}));
        }
        Some(Fired::Fail(e))
    }
}

/// A snapshot of request counts by (verb, resource[/subresource]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub(crate) map: BTreeMap<(String, String), u64>,
}

impl RequestCounts {
    /// Count for one verb and resource (`"memcacheds/status"` for the subresource).
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.map
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }
    pub fn total(&self) -> u64 {
        self.map.values().sum()
    }
    /// create + update + patch + delete + deletecollection.
    pub fn writes(&self) -> u64 {
        self.map
            .iter()
            .filter(|((v, _), _)| {
                matches!(
                    v.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .map(|(_, c)| c)
            .sum()
    }
    pub fn by_verb(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for ((v, _), c) in &self.map {
            *m.entry(v.clone()).or_insert(0) += c;
        }
        m
    }
    pub fn iter(&self) -> impl Iterator<Item = ((&str, &str), u64)> {
        self.map
            .iter()
            .map(|((v, r), c)| ((v.as_str(), r.as_str()), *c))
    }
}

impl std::fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:<18} {:<40} {:>8}", "VERB", "RESOURCE", "COUNT")?;
        for ((v, r), c) in &self.map {
            writeln!(f, "{v:<18} {r:<40} {c:>8}")?;
        }
        write!(f, "{:<18} {:<40} {:>8}", "total", "", self.total())
    }
}

/// One request as the server answered it, like an entry of kube-apiserver's audit log:
/// who asked for what and the status code of the answer. Kept, in the order the answers
/// were given, by a server built with [`crate::ApiServerBuilder::audit_log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// The username [`crate::ApiServer::allow_token`] registered for the request's bearer
    /// token; `system:anonymous` without a registered one.
    pub user: String,
    /// The request's `User-Agent` header (empty without one).
    pub user_agent: String,
    /// Audit verb: get, list, watch, create, update, patch, delete, deletecollection (the
    /// lower-case method for non-resource requests).
    pub verb: String,
    /// Resource plural, `plural/subresource` for a subresource, the path for non-resource
    /// requests.
    pub resource: String,
    /// Namespace in the URL (empty when cluster-scoped or across namespaces).
    pub namespace: String,
    /// Name in the URL (empty for create, list and watch).
    pub name: String,
    /// HTTP status code of the answer.
    pub code: u16,
}

impl AuditEvent {
    /// A create, update, patch, delete or deletecollection that succeeded (2xx): a change
    /// the server made for this user.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) && (200..300).contains(&self.code)
    }
}
