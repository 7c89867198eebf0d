//! What both benchmarks measure with and print with: a process's CPU time and memory
//! (`/proc`), the API server's audit log counted by client, medians and spreads over runs,
//! and durations and sizes as the tables print them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::Result;

/// Resident and peak memory of a process, in KiB, from `/proc/PID/status`.
pub(crate) fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system) of a process so far.
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may contain spaces) start at state, field 3.
    let after = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Requests in the audit log after byte `from` whose User-Agent starts with `agent`, by
/// verb (dry runs apart), and how many were writes.
pub(crate) fn audit_requests(
    path: &Path,
    from: u64,
    agent: &str,
) -> Result<(BTreeMap<String, u64>, u64)> {
    use std::io::{BufRead, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let mut by_verb = BTreeMap::new();
    let mut writes = 0;
    for line in std::io::BufReader::new(f).lines() {
        let Ok(event) = serde_json::from_str::<Value>(&line?) else {
            continue;
        };
        let field = |name: &str| event.get(name).and_then(Value::as_str).unwrap_or_default();
        if field("stage") != "ResponseComplete" || !field("userAgent").starts_with(agent) {
            continue;
        }
        let verb = field("verb").to_string();
        let dry_run = field("requestURI").contains("dryRun=All");
        let sub = event
            .pointer("/objectRef/subresource")
            .and_then(Value::as_str)
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        if !dry_run
            && matches!(
                verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        {
            writes += 1;
        }
        let key = if dry_run {
            format!("{verb} (dry run)")
        } else {
            format!("{verb}{sub}")
        };
        *by_verb.entry(key).or_insert(0) += 1;
    }
    Ok((by_verb, writes))
}

/// Writes in the audit log `path` from byte `from`, by writer and resource: the writer is
/// the User-Agent's program (kube-controller-manager's with the controller it names last,
/// as `kube-controller-manager endpointslice-controller`), the resource with its
/// subresource (`poddisruptionbudgets/status`).
pub(crate) fn audit_writes_by(path: &Path, from: u64) -> Result<BTreeMap<String, u64>> {
    use std::io::{BufRead, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let mut by = BTreeMap::new();
    for line in std::io::BufReader::new(f).lines() {
        let Ok(event) = serde_json::from_str::<Value>(&line?) else {
            continue;
        };
        let field = |name: &str| event.get(name).and_then(Value::as_str).unwrap_or_default();
        let writes = matches!(
            field("verb"),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        );
        if field("stage") != "ResponseComplete"
            || !writes
            || field("requestURI").contains("dryRun=All")
        {
            continue;
        }
        let agent = field("userAgent");
        let program = agent.split('/').next().unwrap_or_default();
        let writer = match agent.rsplit('/').next() {
            Some(controller) if program == "kube-controller-manager" => {
                format!("{program} {controller}")
            }
            _ => program.to_string(),
        };
        let resource = event
            .pointer("/objectRef/resource")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let sub = event
            .pointer("/objectRef/subresource")
            .and_then(Value::as_str)
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        *by.entry(format!("{writer}: {resource}{sub}")).or_insert(0) += 1;
    }
    Ok(by)
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        len if len % 2 == 1 => Some(values[mid]),
        _ => Some((values[mid - 1] + values[mid]) / 2.0),
    }
}

/// `values` as "median (min–max)" with two decimals and `unit`; one value alone; "–" for none.
pub(crate) fn spread(values: Vec<f64>, unit: &str) -> String {
    let (Some(min), Some(max)) = (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) else {
        return "–".into();
    };
    let count = values.len();
    let mid = median(values).unwrap_or(min);
    if count == 1 {
        format!("{mid:.2}{unit}")
    } else {
        format!("{mid:.2}{unit} ({min:.2}–{max:.2}{unit}, {count} runs)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn audit_requests_count_by_agent_verb_and_subresource() {
        let dir = std::env::temp_dir().join(format!("sbs-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.log");
        let event = |agent: &str, verb: &str, uri: &str, sub: Option<&str>| {
            let mut e = json!({"stage": "ResponseComplete", "userAgent": agent, "verb": verb,
                "requestURI": uri, "objectRef": {"resource": "memcacheds"}});
            if let Some(sub) = sub {
                e["objectRef"]["subresource"] = json!(sub);
            }
            e.to_string()
        };
        let lines = [
            event("memcached-peer/tuned", "update", "/apis/x", Some("status")),
            event("memcached-peer/tuned", "create", "/apis/x", None),
            event("memcached-peer/tuned", "patch", "/apis/x?dryRun=All", None),
            event("memcached-peer/tuned", "get", "/apis/x", None),
            event("kube-controller-manager/v1.37.2", "create", "/api/v1/pods", None),
            json!({"stage": "RequestReceived", "userAgent": "memcached-peer/tuned", "verb": "create"}).to_string(),
        ];
        std::fs::write(&path, lines.join("\n")).expect("write");
        let (by_verb, writes) = audit_requests(&path, 0, "memcached-peer/tuned").expect("read");
        assert_eq!(writes, 2, "{by_verb:?}");
        assert_eq!(by_verb.get("update/status"), Some(&1));
        assert_eq!(by_verb.get("patch (dry run)"), Some(&1));
        assert_eq!(by_verb.get("get"), Some(&1));
        let (_, all) = audit_requests(&path, 0, "").expect("read");
        assert_eq!(all, 3, "every client's writes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
