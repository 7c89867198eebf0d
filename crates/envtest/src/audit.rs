//! The API server's audit log, read back: every request it served, with the verb, the
//! resource, who asked and with which program (`User-Agent`), and the answer's code. A test
//! or benchmark counts what one client did, as the server saw it, without trusting that
//! client's own counters.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use crate::{Error, io_err};

/// One request, as the API server logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    pub user_agent: String,
    /// Who the request acted as: the impersonated user when there is one (a test gives
    /// the client under test an identity of its own with [`crate::ControlPlane::client_as`]).
    pub username: String,
    /// The resource's API group (empty for the core group and non-resource URLs), as the
    /// server's authorizer saw it.
    pub api_group: String,
    /// `deployments`, `memcacheds`, ... (empty for non-resource URLs).
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub request_uri: String,
    pub code: u16,
    /// When the server finished it (RFC 3339).
    pub timestamp: String,
}

impl Request {
    /// Whether it asked for a change (a dry run is not one).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) && !self.is_dry_run()
    }

    pub fn is_dry_run(&self) -> bool {
        self.request_uri.contains("dryRun=All")
    }
}

fn text(v: &Value, path: &str) -> String {
    v.pointer(path)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Every complete request in the log at `path` (lines that do not parse are skipped: the
/// last one may be half written).
pub fn read(path: &Path) -> Result<Vec<Request>, Error> {
    let f = std::fs::File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(io_err(format!("reading {}", path.display())))?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v.get("stage").and_then(Value::as_str) != Some("ResponseComplete") {
            continue;
        }
        out.push(Request {
            verb: text(&v, "/verb"),
            user_agent: text(&v, "/userAgent"),
            username: v
                .pointer("/impersonatedUser/username")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| text(&v, "/user/username")),
            api_group: text(&v, "/objectRef/apiGroup"),
            resource: text(&v, "/objectRef/resource"),
            subresource: text(&v, "/objectRef/subresource"),
            namespace: text(&v, "/objectRef/namespace"),
            name: text(&v, "/objectRef/name"),
            request_uri: text(&v, "/requestURI"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            timestamp: text(&v, "/stageTimestamp"),
        });
    }
    Ok(out)
}
