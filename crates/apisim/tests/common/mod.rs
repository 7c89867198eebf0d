#![allow(dead_code)]
//! Shared test helpers.

use kube::core::Status;
use serde_json::Value;
use std::time::Duration;

/// The Status of an API error (panics in tests if it is another kind of error).
pub fn status(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A kube::Client talking HTTP to a served instance.
pub async fn http_client(server: &apisim::ApiServer) -> (apisim::ServeHandle, kube::Client) {
    let h = server.serve().await.expect("serve");
    let cfg = kube::Config::new(h.url().parse().expect("url"));
    let c = kube::Client::try_from(cfg).expect("client");
    (h, c)
}

/// Poll `f` until it returns Some, or panic after `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("deserialize")
}

/// Raw HTTP request against a served instance: (status, JSON body).
pub async fn raw(url: &str, method: &str, path: &str, ctype: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![];
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let code: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    // de-chunk if needed
    let json_start = body.find('{').unwrap_or(0);
    let json_end = body.rfind('}').map(|i| i + 1).unwrap_or(body.len());
    let v = serde_json::from_str(&body[json_start..json_end]).unwrap_or(Value::Null);
    (code, v)
}
