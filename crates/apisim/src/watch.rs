//! Watch streams.

use crate::error::ApiError;
use crate::http::{Query, present};
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::Event;
use crate::{Inner, ResponseBody};
use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// A response body fed by a channel.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

struct Filter {
    rt: Arc<ResourceType>,
    version: String,
    ns: Option<String>,
    ls: LabelSelector,
    fs: FieldSelector,
    /// `as=PartialObjectMetadata` watches get metadata-only objects.
    partial: bool,
}

impl Filter {
    fn out(&self, o: &Value) -> Value {
        if self.partial {
            crate::http::partial(o)
        } else {
            present(o, &self.rt, &self.version)
        }
    }

    fn matches(&self, o: &Value) -> bool {
        self.ls.matches(o) && self.fs.matches(o)
    }
    /// The serialized event this watcher sees for a store event, if any.
    fn line_for(&self, ev: &Event) -> Option<Bytes> {
        let (t, same) = self.kind_for(ev)?;
        if same
            && !self.partial
            && ev.obj["apiVersion"].as_str() == Some(self.rt.api_version(&self.version).as_str())
        {
            return Some(ev.line.get_or_init(|| line(t, &ev.obj)).clone());
        }
        Some(line(t, &self.out(&ev.obj)))
    }

    /// The event type this watcher sees, and whether it is the store event's own type.
    fn kind_for(&self, ev: &Event) -> Option<(&'static str, bool)> {
        let (t, _) = self.apply_inner(ev)?;
        Some((t, t == ev.etype))
    }

    fn apply_inner(&self, ev: &Event) -> Option<(&'static str, ())> {
        if ev.key != self.rt.key() {
            return None;
        }
        if let Some(ns) = &self.ns
            && *ns != ev.ns
        {
            return None;
        }
        let now = self.matches(&ev.obj);
        let was = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        let t = match ev.etype {
            "ADDED" => now.then_some("ADDED"),
            "DELETED" => (now || was).then_some("DELETED"),
            _ => match (was, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
        }?;
        Some((t, ()))
    }
}

/// One watch event as the API server streams it: `{"type":…,"object":…}`, `type` first as in
/// Go's `metav1.WatchEvent`, so a client can decode the object straight from the stream
/// (serde buffers an adjacently tagged enum's content whenever the tag comes after it).
fn line(t: &str, obj: &Value) -> Bytes {
    let mut v = Vec::with_capacity(512);
    v.extend_from_slice(b"{\"type\":");
    // Writing a str or a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut v, t);
    v.extend_from_slice(b",\"object\":");
    let _ = serde_json::to_writer(&mut v, obj);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

fn bookmark(rt: &ResourceType, version: &str, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": meta}),
    )
}

pub fn start(
    partial: bool,
    inner: Arc<Inner>,
    rt: Arc<ResourceType>,
    version: String,
    ns: Option<String>,
    q: &Query,
) -> Result<Response<ResponseBody>, ApiError> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fs = FieldSelector::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &rt.group,
        &rt.plural,
    )?;
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let send_initial = q.get("sendInitialEvents").map(String::as_str) == Some("true");
    if send_initial && q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
        return Err(ApiError::invalid(
            "ListOptions.meta.k8s.io",
            "meta.k8s.io",
            "ListOptions",
            "",
            vec![crate::error::FieldError::required(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            )],
        ));
    }
    let timeout = match q.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => None,
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {t}"))
        })?)),
    };
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let filter = Filter {
        rt: rt.clone(),
        version: version.clone(),
        ns: ns.clone(),
        ls,
        fs,
        partial,
    };

    // Under the lock only collect (cheap Arc clones); serialize after releasing it.
    let mut snapshot: Vec<Arc<Value>> = vec![];
    let mut replay: Vec<Arc<Event>> = vec![];
    let mut initial: Vec<Bytes> = vec![];
    let mut expired = false;
    let (rx, start_rv) = {
        let st = inner.state.lock();
        let rx = st.tx.subscribe();
        let start_rv = st.rv;
        if send_initial || rv_param.is_empty() || rv_param == "0" {
            snapshot = st.list(&rt.key(), ns.as_deref());
        } else {
            let rv: u64 = rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {rv_param}"))
            })?;
            if rv < st.floor {
                expired = true;
                let e =
                    ApiError::expired(format!("too old resource version: {rv} ({})", st.floor + 1));
                initial.push(line("ERROR", &e.to_status()));
            } else {
                // the history is ordered by rv: skip to the first event after `rv`
                let start = st.history.partition_point(|e| e.rv <= rv);
                replay = st.history.range(start..).cloned().collect();
            }
        }
        (rx, start_rv)
    };
    for o in snapshot {
        if filter.matches(&o) {
            initial.push(line("ADDED", &filter.out(&o)));
        }
    }
    for ev in replay {
        if let Some(b) = filter.line_for(&ev) {
            initial.push(b);
        }
    }
    let (tx, body_rx) = mpsc::channel::<Bytes>(256);
    let cut = inner.cut.subscribe();
    let interval = inner.cfg.bookmark_interval;
    drop(inner);
    tokio::spawn(run(
        filter,
        rx,
        tx,
        cut,
        initial,
        expired,
        start_rv,
        bookmarks,
        send_initial,
        timeout,
        interval,
    ));
    let mut resp = Response::new(ChannelBody(body_rx).boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[allow(clippy::too_many_arguments)]
async fn run(
    filter: Filter,
    mut rx: broadcast::Receiver<Arc<Event>>,
    tx: mpsc::Sender<Bytes>,
    mut cut: tokio::sync::watch::Receiver<u64>,
    initial: Vec<Bytes>,
    expired: bool,
    start_rv: u64,
    bookmarks: bool,
    send_initial: bool,
    timeout: Option<Duration>,
    interval: Duration,
) {
    cut.borrow_and_update();
    // (capped: a huge timeoutSeconds must not overflow the clock)
    let year = Duration::from_secs(365 * 24 * 3600);
    let deadline = tokio::time::Instant::now() + timeout.unwrap_or(year).min(year);
    let send_all = async {
        for b in initial {
            if tx.send(b).await.is_err() {
                return false;
            }
        }
        true
    };
    tokio::select! {
        biased;
        _ = cut.changed() => return,
        ok = send_all => if !ok { return },
        _ = tokio::time::sleep_until(deadline) => return,
    }
    if expired {
        return;
    }
    let mut last_rv = start_rv;
    if send_initial {
        if tx
            .send(bookmark(&filter.rt, &filter.version, last_rv, true))
            .await
            .is_err()
        {
            return;
        }
    } else if bookmarks
        && tx
            .send(bookmark(&filter.rt, &filter.version, last_rv, false))
            .await
            .is_err()
    {
        return;
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        tokio::select! {
            biased;
            _ = cut.changed() => return,
            _ = tx.closed() => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tick.tick(), if bookmarks => {
                if tx.send(bookmark(&filter.rt, &filter.version, last_rv, false)).await.is_err() {
                    return;
                }
            }
            r = rx.recv() => match r {
                Ok(ev) => {
                    if ev.rv <= start_rv {
                        continue;
                    }
                    if filter.rt.crd
                        && ev.etype == "DELETED"
                        && ev.key.0 == "apiextensions.k8s.io"
                        && ev.key.1 == "customresourcedefinitions"
                        && ev.obj["spec"]["group"] == filter.rt.group.as_str()
                        && ev.obj["spec"]["names"]["plural"] == filter.rt.plural.as_str()
                    {
                        // the kind is gone: end the stream, like kube-apiserver
                        return;
                    }
                    last_rv = last_rv.max(ev.rv);
                    if let Some(b) = filter.line_for(&ev)
                        && tx.send(b).await.is_err()
                    {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_line_puts_the_type_first_as_the_api_server_does() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let line = line("ADDED", &obj);
        let text = std::str::from_utf8(&line).unwrap_or_default();
        assert!(text.starts_with(r#"{"type":"ADDED","object":{"#), "{text}");
        assert!(text.ends_with("}\n"));
        let parsed: Value = serde_json::from_str(text).unwrap_or_default();
        assert_eq!(parsed, json!({"type": "ADDED", "object": obj}));
    }
}
