//! The operator's API client keeps each connection's read buffer small: a watch that has
//! read a large list or burst holds no more memory afterwards than one that has not.
//!
//! Counted, not timed: a global allocator counts the bytes held, while connections to a
//! local HTTP server stay open after each has read a large body, as watches do. kube's
//! default client is measured the same way beside ours, so the test also shows what the
//! cap saves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use http_body_util::BodyExt;
use kube::client::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Counts the bytes held by the heap.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's pointer, layout and size, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Connections held open at once (watches: 9 per watched namespace).
const CONNECTIONS: usize = 20;
/// The body each reads first (a list of a busy namespace, a burst of events).
const BODY: usize = 1 << 20;

/// A server that answers every request with a chunked body of [`BODY`] bytes, written at
/// once, and then keeps the response open (as a watch does).
async fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let body: &'static [u8] = Box::leak(vec![b'x'; BODY].into_boxed_slice());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let start = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Transfer-Encoding: chunked\r\n\r\n{BODY:x}\r\n"
                );
                if socket.write_all(start.as_bytes()).await.is_err()
                    || socket.write_all(body).await.is_err()
                    || socket.write_all(b"\r\n").await.is_err()
                {
                    return;
                }
                // Held open until the client goes.
                let _ = socket.read(&mut byte).await;
            });
        }
    });
    format!("http://{address}")
}

/// The bytes held per connection once each of [`CONNECTIONS`] has read [`BODY`] and is
/// held open, with `client`.
async fn held_per_connection(client: kube::Client) -> isize {
    let before = HELD.load(Ordering::Relaxed);
    let mut open = Vec::new();
    for _ in 0..CONNECTIONS {
        let request = http::Request::get("/api/v1/pods?watch=true")
            .body(Body::empty())
            .expect("request");
        let mut response = client.send(request).await.expect("response");
        let mut read = 0;
        while read < BODY {
            let frame = response
                .body_mut()
                .frame()
                .await
                .expect("a frame")
                .expect("body");
            read += frame.data_ref().map_or(0, |d| d.len());
        }
        open.push(response);
    }
    let held = HELD.load(Ordering::Relaxed) - before;
    drop(open);
    held / CONNECTIONS as isize
}

/// [`held_per_connection`] with the client `make` builds, in a runtime of its own (its
/// server and connections go with it, so that nothing of one measurement is freed during
/// the next).
fn measure(make: fn(kube::Config) -> Result<kube::Client, kube::Error>) -> isize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let url = serve().await;
        let client = make(kube::Config::new(url.parse().expect("url"))).expect("client");
        held_per_connection(client).await
    })
}

#[test]
fn a_connection_that_read_a_large_body_holds_a_small_buffer() {
    let ours = measure(memcached_operator::client::client);
    let kubes = measure(kube::Client::try_from);
    eprintln!(
        "held per connection after a {BODY}-byte body: ours {ours} B, kube's default {kubes} B"
    );
    let cap = memcached_operator::client::READ_BUFFER_MAX as isize;
    assert!(
        ours <= 4 * cap,
        "each connection holds {ours} bytes after reading a large body (the read buffer's cap is {cap})"
    );
    assert!(
        kubes >= 5 * ours,
        "kube's default client holds {kubes} bytes per connection, ours {ours}: the cap saves less than it should"
    );
}
