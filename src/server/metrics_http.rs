//! The metrics listener: `GET /metrics` in Prometheus text format on `metrics_listen`,
//! and nothing else on that address.
//!
//! Plain control-plane threads with a blocking listener: one accept thread
//! (`ringcast-metrics`) hands each connection to a thread of its own
//! (`ringcast-scrape`), at most [`MAX_CONNECTIONS`] at once; a connection over that is
//! answered 503 at once and closed. Scrapes are rare (every few seconds), so workers never
//! see this traffic and the data plane's listener never serves metrics.
//!
//! Every connection is bounded: a request head of at most [`MAX_HEAD`] bytes that must be
//! complete within [`HEAD_DEADLINE`] of the accept (a deadline for the whole head, not
//! per read: a client trickling a byte now and then is cut at the deadline), a write
//! timeout of [`IO_TIMEOUT`], then the connection is closed (`Connection: close`). A slow
//! or stalled client therefore holds one slot for at most about 2 s, and never holds up
//! another scrape. Nothing here reads a key or logs a request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, NodeGauges};
use crate::node::Node;

use super::ServeError;

/// Largest request head read from a scraper.
const MAX_HEAD: usize = 8192;
/// The whole request head must arrive within this long of the accept.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// A scraper that reads the answer slower than this is dropped.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once. A few scrapers (Prometheus pairs, an operator's curl)
/// plus a handful of stalled clients fit; each costs one short-lived thread, so the
/// bound keeps a flood of connections from costing the node threads and memory.
const MAX_CONNECTIONS: usize = 16;

/// Bind `addr` and serve scrapes on threads of their own; returns the bound address.
pub(crate) fn spawn(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    node: Arc<Node>,
) -> Result<SocketAddr, ServeError> {
    let listener =
        TcpListener::bind(addr).map_err(|source| ServeError::MetricsBind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::MetricsBind { addr, source })?;
    std::thread::Builder::new()
        .name("ringcast-metrics".into())
        .spawn(move || accept_loop(listener, metrics, node))
        .map_err(ServeError::Thread)?;
    Ok(bound)
}

/// Decrements the count of open connections when a connection's thread is done.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>, node: Arc<Node>) {
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            // Never wait on this client: a short write timeout, then close.
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = respond(&mut stream, "503 Service Unavailable", "", 0, b"");
            continue;
        }
        let slot = Slot(open.clone());
        let (metrics, node) = (metrics.clone(), node.clone());
        let spawned = std::thread::Builder::new()
            .name("ringcast-scrape".into())
            .spawn(move || {
                let _slot = slot;
                serve(stream, &metrics, &node);
            });
        if let Err(e) = spawned {
            // The slot went with the closure, which was dropped: the count is right.
            tracing::warn!(error = %e, "metrics listener: cannot start a thread");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What the scrape reads beside the per-worker blocks.
fn gauges(node: &Node) -> NodeGauges {
    use std::sync::atomic::Ordering::Relaxed;
    let stat = |f: fn(&crate::cluster::ClusterStats) -> &std::sync::atomic::AtomicU64| {
        node.cluster
            .as_ref()
            .map_or(0, |c| f(&c.stats).load(Relaxed))
    };
    NodeGauges {
        mailbox_depths: (0..node.config.workers.max(1))
            .filter_map(|i| node.mailboxes.get(i).map(|m| m.len()))
            .collect(),
        cluster_connected: node.cluster.as_ref().map(|c| c.is_ok()),
        cluster_relay_dropped: stat(|s| &s.relay_dropped),
        cluster_receive_dropped: stat(|s| &s.receive_dropped),
        cluster_history_errors: stat(|s| &s.history_errors),
        webhook_dropped_queue_full: node.webhooks.stats().dropped_queue_full.load(Relaxed),
        webhook_dropped_retries_exhausted: node
            .webhooks
            .stats()
            .dropped_retries_exhausted
            .load(Relaxed),
        webhook_requests_ok: node.webhooks.stats().requests_ok.load(Relaxed),
        webhook_requests_failed: node.webhooks.stats().requests_failed.load(Relaxed),
    }
}

fn serve(mut stream: TcpStream, metrics: &Metrics, node: &Node) {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        // Each read may only wait for what is left of the head's deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            let _ = respond(&mut stream, "408 Request Timeout", "", 0, b"");
            return;
        }
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let _ = respond(&mut stream, "408 Request Timeout", "", 0, b"");
                return;
            }
            _ => return,
        }
        if head.len() > MAX_HEAD {
            let _ = respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                0,
                b"",
            );
            return;
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split(|&b| b == b'?').next().unwrap_or_default());
    let _ = match (method, path) {
        (Some(b"GET" | b"HEAD"), Some(b"/metrics")) => {
            let text = metrics.render(&gauges(node));
            // HEAD: the same head (and length) as GET, no body.
            let body = if method == Some(b"HEAD") {
                &b""[..]
            } else {
                text.as_bytes()
            };
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                text.len(),
                body,
            )
        }
        (_, Some(b"/metrics")) => respond(&mut stream, "405 Method Not Allowed", "", 0, b""),
        _ => respond(&mut stream, "404 Not Found", "", 0, b""),
    };
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    len: usize,
    body: &[u8],
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {len}\r\n");
    if !ctype.is_empty() {
        out.push_str(&format!("Content-Type: {ctype}\r\n"));
    }
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
