//! The HTTP/1.1 connection loop: read, parse every complete request in the buffer
//! (pipelining), route, answer all of them in one write, repeat; or hand the socket to
//! the WebSocket layer after a successful upgrade.
//!
//! Limits enforced here: request head size and header count (431), body size (413,
//! decided from Content-Length before the body is read), the time to receive a whole
//! request once its first byte arrived (408, then close: idle half-open requests cannot
//! pile up) and the keep-alive idle time (silent close). A response that makes the
//! stream untrustworthy (400 on framing, 411, 413, 431) closes the connection after it.
//!
//! The loop is generic over the [`Transport`]: a plain `TcpStream` or a
//! [`crate::tls::TlsStream`] whose handshake is done. Each is monomorphised separately,
//! so plaintext keeps its direct io_uring reads and writes. A pending read is only ever
//! dropped by a timeout, after which the connection is answered (408) and closed, never
//! read again.

use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;

use super::parse::{parse_head, query_param, Method, RequestHead};
use super::response::{write_error, write_json, Extra};
use super::ApiError;
use crate::auth::KeyKind;
use crate::server::worker::{ConnGuard, Worker};
use crate::tls::{TlsReader, TlsStream, TlsWriter};
use crate::ws::conn::{read_loop, write_loop, ConnMeta, FrameWrite, ReadLimits, WsConn};
use crate::ws::protocol::{connected_frame, ClientSession};

/// A connected byte stream the HTTP loop can serve, and how it becomes a WebSocket.
pub trait Transport: AsyncReadRent + AsyncWriteRent + 'static {
    /// The reader task's half.
    type Reader: AsyncReadRent + 'static;
    /// The writer task's half.
    type Writer: FrameWrite + 'static;
    /// Split after an upgrade; the descriptor is the TCP socket, for `WsConn::abort`.
    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer);
    /// Before the server closes the connection: TLS sends close_notify so the client
    /// sees a clean end; plaintext needs nothing (dropping the socket sends FIN).
    fn before_close(&mut self) -> impl std::future::Future<Output = ()> {
        std::future::ready(())
    }
}

impl Transport for TcpStream {
    type Reader = OwnedReadHalf<TcpStream>;
    type Writer = OwnedWriteHalf<TcpStream>;

    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer) {
        let fd = self.as_raw_fd();
        let (rd, wr) = self.into_split();
        (fd, rd, wr)
    }
}

impl Transport for TlsStream {
    type Reader = TlsReader;
    type Writer = TlsWriter;

    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer) {
        let fd = self.raw_fd();
        let (rd, wr) = self.into_halves();
        (fd, rd, wr)
    }

    async fn before_close(&mut self) {
        let _ = self.shutdown().await;
    }
}

/// What routing decided for one request.
enum Outcome {
    /// Answered; keep reading requests (unless `close`).
    Answered { close: bool },
    /// Need more bytes (the body is incomplete).
    NeedMore,
    /// Upgrade to WebSocket with this key entry.
    Upgrade(Upgrade),
}

struct Upgrade {
    project: u32,
    key_id: Box<str>,
    _slot: ProjectSlot,
}

/// One of a project's WebSocket connections on this node; released on drop.
struct ProjectSlot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl ProjectSlot {
    /// Take a slot unless the project is at `limit` (0 = unlimited).
    fn take(
        counter: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        limit: usize,
    ) -> Option<Self> {
        let prev = counter.fetch_add(1, Ordering::AcqRel);
        if limit > 0 && prev >= limit {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ProjectSlot(counter.clone()))
    }
}

impl Drop for ProjectSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answer 503 and close: the worker is at its connection limit.
pub async fn refuse_busy(mut stream: TcpStream) {
    let mut out = Vec::new();
    write_error(&mut out, ApiError::TooManyConnections, Extra::default());
    let _ = monoio::time::timeout(Duration::from_secs(1), stream.write_all(out)).await;
}

/// Serve one accepted connection until it closes.
pub async fn serve<S: Transport>(worker: Rc<Worker>, mut stream: S, guard: ConnGuard) {
    let cfg = &worker.shared.config;
    let max_buffer = cfg.max_header_bytes + cfg.max_body_bytes;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::new();
    let mut request_started: Option<Instant> = None;
    loop {
        // Serve every complete request already buffered.
        let mut consumed = 0;
        let mut close = false;
        let mut upgrade = None;
        while consumed < buf.len() {
            request_started.get_or_insert_with(Instant::now);
            let head = match parse_head(&buf[consumed..], cfg.max_header_bytes, cfg.max_headers) {
                Ok(Some(head)) => head,
                Ok(None) => break,
                Err(e) => {
                    write_error(&mut out, e.into(), Extra::default());
                    close = true;
                    break;
                }
            };
            let req = &buf[consumed..];
            match route(&worker, &head, req, &mut out) {
                Outcome::NeedMore => break,
                Outcome::Answered { close: c } => {
                    let body = head.content_length.unwrap_or(0);
                    let buffered = req.len() - head.head_len;
                    consumed += head.head_len + body.min(buffered);
                    request_started = None;
                    // Answered before its whole body arrived (a refusal decided from the
                    // head): the rest of that body would be read as the next request,
                    // so the connection ends here instead.
                    if c || !head.keep_alive() || body > buffered {
                        close = true;
                        break;
                    }
                }
                Outcome::Upgrade(u) => {
                    consumed += head.head_len;
                    upgrade = Some(u);
                    break;
                }
            }
        }
        buf.drain(..consumed);
        if worker.mailbox.has_mail() {
            // Busy workers must drain their mailbox themselves (see `shard::drain`).
            crate::shard::drain(&worker);
        }
        if let Some(u) = upgrade {
            if !out.is_empty() {
                let write = stream.write_all(std::mem::take(&mut out));
                match monoio::time::timeout(cfg.http_idle_timeout(), write).await {
                    Ok((Ok(_), _)) => {}
                    _ => return,
                }
            }
            // A task of its own: this HTTP task's state (its buffers, its read and
            // timeout futures) is freed instead of living as long as the socket.
            websocket(worker, stream, u, buf, guard);
            return;
        }
        if !out.is_empty() {
            // A client that sends requests but never reads its answers must not hold
            // the connection (and its slot) forever: writes share the idle timeout.
            let write = stream.write_all(std::mem::take(&mut out));
            match monoio::time::timeout(cfg.http_idle_timeout(), write).await {
                Ok((Ok(_), mut written)) => {
                    written.clear();
                    out = written;
                }
                _ => return,
            }
        }
        if buf.is_empty() && buf.capacity() > 8192 {
            // A large request grew the buffer; an idle keep-alive connection gives it back.
            buf = Vec::with_capacity(4096);
        }
        if close {
            stream.before_close().await;
            return;
        }
        if worker.is_stopping() && buf.is_empty() {
            stream.before_close().await;
            return;
        }
        // Read more, under the header/body timeout or the keep-alive idle timeout.
        if buf.len() == buf.capacity() {
            if buf.capacity() >= max_buffer + 1024 {
                // Cannot happen with the checks above; never grow without bound.
                return;
            }
            buf.reserve(buf.capacity().min(max_buffer));
        }
        let timeout = match request_started {
            Some(t) => cfg.header_read_timeout().saturating_sub(t.elapsed()),
            None if !buf.is_empty() => cfg.header_read_timeout(),
            None => cfg.http_idle_timeout(),
        };
        let len = buf.len();
        let read = stream.read(buf.slice_mut(len..));
        match monoio::time::timeout(timeout, read).await {
            Ok((Ok(n), b)) => {
                buf = b.into_inner();
                if n == 0 {
                    return;
                }
            }
            Ok((Err(_), _)) => return,
            Err(_) => {
                if request_started.is_some() || len > 0 {
                    let mut out = Vec::new();
                    write_error(&mut out, ApiError::RequestTimeout, Extra::default());
                    let write = stream.write_all(out);
                    let _ = monoio::time::timeout(Duration::from_secs(1), write).await;
                }
                return;
            }
        }
    }
}

fn slice<'a>(req: &'a [u8], r: &Option<Range<usize>>) -> Option<&'a [u8]> {
    r.as_ref().map(|r| &req[r.clone()])
}

fn route(worker: &Rc<Worker>, head: &RequestHead, req: &[u8], out: &mut Vec<u8>) -> Outcome {
    let path = &req[head.path.clone()];
    match path {
        b"/api/v1/publish" => {
            if head.method() != Method::Post {
                return answer(out, ApiError::MethodNotAllowed("POST"));
            }
            publish(worker, head, req, out)
        }
        b"/health" => {
            if !matches!(head.method(), Method::Get | Method::Head) {
                return answer(out, ApiError::MethodNotAllowed("GET, HEAD"));
            }
            if head.content_length.unwrap_or(0) > 0 {
                // A body on GET is unusual; it must still be skipped whole.
                let need = head.head_len + head.content_length.unwrap_or(0);
                if head.content_length.unwrap_or(0) > worker.shared.config.max_body_bytes {
                    return answer(out, ApiError::PayloadTooLarge);
                }
                if req.len() < need {
                    return Outcome::NeedMore;
                }
            }
            let start = out.len();
            health(worker, out);
            if head.method() == Method::Head {
                // Same head (Content-Length included), no body (RFC 9110 §9.3.2).
                if let Some(end) = out[start..].windows(4).position(|w| w == b"\r\n\r\n") {
                    out.truncate(start + end + 4);
                }
            }
            Outcome::Answered { close: false }
        }
        b"/api/v1/ws" => upgrade(worker, head, req, out),
        _ => answer(out, ApiError::NotFound),
    }
}

fn answer(out: &mut Vec<u8>, err: ApiError) -> Outcome {
    write_error(out, err, Extra::default());
    Outcome::Answered {
        close: err.closes_connection(),
    }
}

fn publish(worker: &Rc<Worker>, head: &RequestHead, req: &[u8], out: &mut Vec<u8>) -> Outcome {
    let shared = &worker.shared;
    let max_body = shared.config.max_body_bytes;
    let length = head.content_length.unwrap_or(0);
    // Everything the head decides is decided before waiting for the body, so a refused
    // request never makes the server buffer it (the connection then closes, see `serve`).
    if shared.shutting_down.load(Ordering::Relaxed) {
        return answer(out, ApiError::Unavailable("the service is shutting down"));
    }
    let keys = shared.keys.load();
    let auth = match crate::publish::authorize(
        &keys,
        slice(req, &head.api_key),
        slice(req, &head.content_type),
        head.content_length,
        max_body,
    ) {
        Ok(auth) => auth,
        Err(refusal) => {
            refusal.write(out);
            return Outcome::Answered {
                close: refusal.error.closes_connection(),
            };
        }
    };
    if req.len() < head.head_len + length {
        // Authorized, body still arriving (the head is checked again when it has).
        return Outcome::NeedMore;
    }
    let body = &req[head.head_len..head.head_len + length];
    let mut parser = worker.parser.borrow_mut();
    crate::publish::accept(&auth, body, &mut parser, &worker.ids, &**shared, out);
    Outcome::Answered { close: false }
}

fn health(worker: &Worker, out: &mut Vec<u8>) {
    let shared = &worker.shared;
    let db_ok = shared.db_ok.load(Ordering::Relaxed);
    let queued = shared.mailboxes.max_len();
    let queues_ok = queued <= shared.config.mailbox_high_water();
    let stopping = shared.shutting_down.load(Ordering::Relaxed);
    // Single node: nothing to check. Cluster mode: both bridge connections are up.
    let cluster_ok = shared.cluster.as_ref().is_none_or(|c| c.is_ok());
    let version = version();
    if db_ok && queues_ok && !stopping && cluster_ok {
        let body = format!("{{\"status\":\"ok\",\"version\":\"{version}\"}}");
        write_json(out, 200, body.as_bytes(), Extra::default());
        return;
    }
    let queues = if queues_ok {
        "ok".to_string()
    } else {
        format!("a shard queue is over its high-water mark ({queued} queued)")
    };
    let mut checks = serde_json::json!({
        "database": if db_ok { "ok" } else { "the key store does not answer" },
        "queues": queues,
        "cluster": match &shared.cluster {
            None => "not configured",
            Some(_) if cluster_ok => "ok",
            Some(_) => "Redis is unreachable; serving local subscribers only",
        },
    });
    if stopping {
        checks["server"] = "shutting down".into();
    }
    let body = serde_json::json!({"status": "degraded", "version": version, "checks": checks});
    write_json(
        out,
        503,
        body.to_string().as_bytes(),
        Extra {
            retry_after_s: Some(1),
            ..Extra::default()
        },
    );
}

/// `<major>.<minor>` of this build.
pub fn version() -> String {
    let mut parts = env!("CARGO_PKG_VERSION").split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    format!("{major}.{minor}")
}

fn upgrade(worker: &Rc<Worker>, head: &RequestHead, req: &[u8], out: &mut Vec<u8>) -> Outcome {
    let key = match crate::ws::handshake::validate(head, req) {
        Ok(k) => k,
        Err(err) => return answer(out, err),
    };
    if worker.is_stopping() {
        return answer(out, ApiError::Unavailable("the service is shutting down"));
    }
    let api_key = slice(req, &head.query)
        .and_then(|q| query_param(q, b"key"))
        .and_then(|k| std::str::from_utf8(k).ok());
    let Some(api_key) = api_key.filter(|k| !k.is_empty()) else {
        return answer(
            out,
            ApiError::Unauthorized("the key query parameter is missing"),
        );
    };
    if KeyKind::of_key(api_key) != Some(KeyKind::Public) {
        return answer(
            out,
            ApiError::Unauthorized("WebSocket connections need a public key (pk_...)"),
        );
    }
    let keys = worker.shared.keys.load();
    let Some(entry) = keys.lookup(api_key).filter(|e| e.kind == KeyKind::Public) else {
        return answer(
            out,
            ApiError::Unauthorized("the API key is unknown or revoked"),
        );
    };
    let limit = worker.shared.config.max_ws_connections_per_project;
    let Some(slot) = ProjectSlot::take(&entry.project.ws_connections, limit) else {
        return answer(
            out,
            ApiError::Unavailable("the project has reached its WebSocket connection limit"),
        );
    };
    crate::ws::handshake::write_switching(out, key);
    Outcome::Upgrade(Upgrade {
        project: entry.project.index,
        key_id: entry.key_id.as_str().into(),
        _slot: slot,
    })
}

/// Run an upgraded connection: writer task spawned, reader in this task.
fn websocket<S: Transport>(
    worker: Rc<Worker>,
    stream: S,
    upgrade: Upgrade,
    leftover: Vec<u8>,
    guard: ConnGuard,
) {
    let cfg = &worker.shared.config;
    let (fd, rd, wr) = stream.into_ws_halves();
    let conn = Rc::new(WsConn::new(
        worker.next_conn_id(),
        ConnMeta {
            project: upgrade.project,
            key_id: upgrade.key_id,
        },
        fd,
        cfg.send_backlog_bytes,
        worker.clock(),
    ));
    conn.set_write_coalesce(Duration::from_millis(cfg.write_coalesce_ms));
    let connection_id = worker.ids.next_id();
    conn.send(connected_frame(connection_id.as_str(), cfg.heartbeat_s));
    let limits = ReadLimits {
        max_message: cfg.max_frame_bytes,
    };
    worker.register_ws(conn.clone());
    monoio::spawn(write_loop(wr, conn.clone()));
    let session = ClientSession::new(worker.clone());
    // An empty leftover still owns the 4 KiB HTTP read buffer: free it now, not when
    // the connection ends (it would be most of an idle connection's memory).
    let pending = if leftover.is_empty() {
        drop(leftover);
        Vec::new()
    } else {
        leftover
    };
    let held = (guard, upgrade._slot);
    monoio::spawn(reader_task(
        rd, conn, session, limits, worker, pending, held,
    ));
}

/// The reader's task. Kept apart from the upgrade so that the task that lives as long
/// as the socket holds only the reader's small state (an idle connection's cost).
async fn reader_task<R: AsyncReadRent>(
    rd: R,
    conn: Rc<WsConn>,
    mut session: ClientSession,
    limits: ReadLimits,
    worker: Rc<Worker>,
    pending: Vec<u8>,
    _held: (ConnGuard, ProjectSlot),
) {
    read_loop(
        rd,
        conn,
        &mut session,
        limits,
        move || worker.clock(),
        pending,
    )
    .await;
}
