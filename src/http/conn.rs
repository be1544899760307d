//! One HTTP/1.1 connection: its state ([`HttpConn`]: read buffer, pending output, when
//! the current request started, whether to close) and the loop over three steps:
//! serve the complete requests already buffered (pipelining, one answer write for all
//! of them), flush (one direct `send` when the socket takes it all, the usual case),
//! read more. Or hand the socket to the WebSocket layer after an
//! upgrade.
//!
//! Serving a request is parsing its head (`super::parse`) and routing it ([`route`]:
//! the routing table) to the endpoint that answers it. Unknown paths get 404, wrong
//! methods 405 with `Allow`. `GET`/`HEAD /health` and the WebSocket upgrades take no
//! body: a head declaring one (`Content-Length` above 0) is a 400 decided from the
//! head, before any of the body is waited for, and the connection closes (the body is
//! never read).
//!
//! Pending answers are bounded: a buffered request is served only while less than
//! `max_pending_answer_bytes` of answers wait to be written, so a client that pipelines
//! requests and never reads holds at most that plus one answer (itself bounded: a
//! history answer by `max_history_answer_bytes`, a listing by its channel cap). The
//! next request waits until the client has read the ones before it (flush first).
//!
//! Limits enforced here: request head size and header count (431), body size (413,
//! decided from Content-Length before the body is read), the time to receive a whole
//! request once its first byte arrived (408, then close: idle half-open requests cannot
//! pile up) and the keep-alive idle time (silent close). A response that makes the
//! stream untrustworthy (400 on framing, 411, 413, 431) closes the connection after it.
//!
//! A pending read is only ever dropped by a timeout, after which the connection is
//! answered (408) and closed, never read again.

use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use super::outcome::{answer, Deferred, Outcome, Request, Upgrade};
use super::parse::{parse_head, Method};
use super::response::{write_error, Extra};
use super::transport::Transport;
use super::{
    channels, console, health, history, publish, pusher_rest, pusher_ws, upgrade, users, ApiError,
    Service,
};
use crate::config::Config;
use crate::shard::ConnGuard;

/// What a buffer of a new connection starts with; a keep-alive connection that grew it
/// for a large request gives the rest back once idle.
const INITIAL_BUFFER: usize = 4096;
const IDLE_BUFFER_MAX: usize = 8192;
/// The output buffer kept between answers; a larger one (a large answer was written) is
/// given back once written.
const OUT_KEEP_MAX: usize = 64 * 1024;

/// One connection's HTTP state between reads.
pub(crate) struct HttpConn {
    /// Bytes read and not yet consumed by a request.
    buf: Vec<u8>,
    /// Answers not yet written.
    out: Vec<u8>,
    /// When the first byte of the request being received arrived (for 408).
    request_started: Option<Instant>,
    /// Close after the pending output is written.
    close: bool,
    /// The client's address: the TCP peer's, or what a trusted proxy's PROXY header
    /// named (`ws_connect_rate_per_ip` and the logs use it).
    pub(super) peer: Option<std::net::IpAddr>,
    /// The peer is a trusted proxy that sent no PROXY header: each request's
    /// `X-Forwarded-For` may name the client.
    forwarded: bool,
    /// An answer being prepared (see [`Outcome::Deferred`]).
    deferred: Option<Deferred>,
    /// `serve_buffered` stopped at `max_pending_answer_bytes` with requests still
    /// buffered: once the answers are written, serve again before reading.
    held: bool,
}

/// How a read ended.
enum Read {
    Data,
    Closed,
    TimedOut,
}

impl HttpConn {
    fn new() -> HttpConn {
        HttpConn {
            buf: Vec::with_capacity(INITIAL_BUFFER),
            out: Vec::new(),
            request_started: None,
            close: false,
            peer: None,
            forwarded: false,
            deferred: None,
            held: false,
        }
    }

    /// Serve the complete requests already buffered, while less than
    /// `max_pending_answer_bytes` of answers wait in `out` (over it, `held`: the rest
    /// waits for a flush). Returns an upgrade when one of them switched protocols
    /// (nothing after it is served).
    fn serve_buffered(&mut self, svc: &Rc<Service>) -> Option<Upgrade> {
        let cfg = svc.config();
        let mut consumed = 0;
        let mut upgrade = None;
        self.held = false;
        while consumed < self.buf.len() {
            if self.out.len() >= cfg.max_pending_answer_bytes {
                self.held = true;
                break;
            }
            let req = &self.buf[consumed..];
            let head = match parse_head(req, cfg.max_header_bytes, cfg.max_headers) {
                Ok(Some(head)) => head,
                Ok(None) => {
                    self.incomplete();
                    break;
                }
                Err(e) => {
                    write_error(&mut self.out, e.into(), Extra::default());
                    self.close = true;
                    break;
                }
            };
            let peer = match (&head.forwarded_for, self.forwarded) {
                (Some(xff), true) => svc
                    .node
                    .trusted
                    .forwarded_client(&req[xff.clone()])
                    .or(self.peer),
                _ => self.peer,
            };
            let request = Request {
                svc,
                head: &head,
                bytes: req,
                peer,
            };
            match route(&request, &mut self.out) {
                Outcome::NeedMore => {
                    self.incomplete();
                    break;
                }
                Outcome::Answered { close } => {
                    let body = head.content_length.unwrap_or(0);
                    let buffered = req.len() - head.head_len;
                    consumed += head.head_len + body.min(buffered);
                    self.request_started = None;
                    // Answered before its whole body arrived (a refusal decided from the
                    // head): the rest of that body would be read as the next request,
                    // so the connection ends here instead.
                    if close || !head.keep_alive() || body > buffered {
                        self.close = true;
                        break;
                    }
                }
                Outcome::Deferred(answer) => {
                    // Only answers decided from a whole request are deferred.
                    consumed += head.head_len + head.content_length.unwrap_or(0);
                    self.request_started = None;
                    self.deferred = Some(answer);
                    if !head.keep_alive() {
                        self.close = true;
                    }
                    break;
                }
                Outcome::Upgrade(u) => {
                    tracing::debug!(client = ?peer, dialect = ?u.dialect, "websocket upgraded");
                    consumed += head.head_len;
                    upgrade = Some(u);
                    break;
                }
            }
        }
        self.buf.drain(..consumed);
        upgrade
    }

    /// The request at the front of the buffer is not whole yet: its 408 clock runs from
    /// now (its first bytes came with the read just before) unless it already runs. A
    /// request whole in the buffer is served without reading the clock.
    fn incomplete(&mut self) {
        self.request_started.get_or_insert_with(Instant::now);
    }

    /// Write pending answers: at once when the socket takes them all (the usual case:
    /// no operation on the ring, no timer), else the rest through the ring. A client
    /// that sends requests but never reads its answers must not hold the connection
    /// (and its slot) forever: those writes share the idle timeout. `false` when the
    /// connection is gone.
    async fn flush<S: Transport>(&mut self, stream: &mut S, limit: Duration) -> bool {
        if self.out.is_empty() {
            return true;
        }
        if let Some(sent) = stream.try_send(&self.out) {
            self.out.drain(..sent);
            if self.out.is_empty() {
                let written = std::mem::take(&mut self.out);
                self.keep_out(written);
                return true;
            }
        }
        let write = stream.write_all(std::mem::take(&mut self.out));
        match monoio::time::timeout(limit, write).await {
            Ok((Ok(_), written)) => {
                self.keep_out(written);
                true
            }
            _ => false,
        }
    }

    /// A written output buffer becomes the next one, unless a large answer grew it
    /// (then it goes, and the next answer starts small).
    fn keep_out(&mut self, mut written: Vec<u8>) {
        if written.capacity() <= OUT_KEEP_MAX {
            written.clear();
            self.out = written;
        }
    }

    /// A large request grew the buffer; an idle keep-alive connection gives it back.
    fn release_idle_buffer(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > IDLE_BUFFER_MAX {
            self.buf = Vec::with_capacity(INITIAL_BUFFER);
        }
    }

    /// Read more, under the request timeout (a request is under way) or the keep-alive
    /// idle timeout.
    async fn read<S: Transport>(&mut self, stream: &mut S, cfg: &Config) -> Read {
        let max_buffer = cfg.max_header_bytes + cfg.max_request_body();
        if self.buf.len() == self.buf.capacity() {
            if self.buf.capacity() >= max_buffer + 1024 {
                // Cannot happen with the checks of `serve_buffered`; never grow without
                // bound.
                return Read::Closed;
            }
            self.buf.reserve(self.buf.capacity().min(max_buffer));
        }
        let timeout = match self.request_started {
            Some(t) => cfg.header_read_timeout().saturating_sub(t.elapsed()),
            None if !self.buf.is_empty() => cfg.header_read_timeout(),
            None => cfg.http_idle_timeout(),
        };
        let len = self.buf.len();
        let buf = std::mem::take(&mut self.buf);
        match monoio::time::timeout(timeout, stream.read(buf.slice_mut(len..))).await {
            Ok((Ok(n), b)) => {
                self.buf = b.into_inner();
                if n == 0 {
                    Read::Closed
                } else {
                    Read::Data
                }
            }
            Ok((Err(_), _)) => Read::Closed,
            Err(_) if self.request_started.is_some() || len > 0 => Read::TimedOut,
            Err(_) => Read::Closed,
        }
    }
}

/// The routing table: which endpoint answers a request whose head is parsed.
fn route(r: &Request<'_>, out: &mut Vec<u8>) -> Outcome {
    let method = r.head.method();
    let no_body = |out: &mut Vec<u8>, what: &'static str| answer(out, ApiError::BadRequest(what));
    match r.path() {
        b"/api/v1/publish" | b"/api/v1/publish/batch" if method != Method::Post => {
            publish::count(405);
            answer(out, ApiError::MethodNotAllowed("POST"))
        }
        b"/api/v1/publish" => publish::handle(r, out, publish::Endpoint::One),
        b"/api/v1/publish/batch" => publish::handle(r, out, publish::Endpoint::Batch),
        b"/api/v1/history"
        | b"/api/v1/channels"
        | b"/api/v1/channels/info"
        | b"/api/v1/presence"
            if method != Method::Get =>
        {
            answer(out, ApiError::MethodNotAllowed("GET"))
        }
        b"/api/v1/history" => history::handle(r, out),
        b"/api/v1/channels" => channels::handle(r, out, channels::Ask::List),
        b"/api/v1/channels/info" => channels::handle(r, out, channels::Ask::Info),
        b"/api/v1/presence" => channels::handle(r, out, channels::Ask::Presence),
        b"/api/v1/channels/unsubscribe" => users::handle_unsubscribe(r, out),
        path if path.starts_with(b"/api/v1/users/") => users::handle_user(r, out, &path[14..]),
        b"/health" => match method {
            Method::Get | Method::Head if r.head.has_body() => {
                no_body(out, "a /health request must not have a body")
            }
            Method::Get | Method::Head => health::handle(r, out),
            _ => answer(out, ApiError::MethodNotAllowed("GET, HEAD")),
        },
        b"/api/v1/ws" if method == Method::Get && r.head.has_body() => {
            no_body(out, "the WebSocket upgrade request must not have a body")
        }
        b"/api/v1/ws" => upgrade::handle(r, out),
        // The Pusher REST API: `/apps/{app_id}/...` (404 and 405 are its own to decide).
        path if path.starts_with(b"/apps/") => pusher_rest::handle(r, out, &path[6..]),
        // The Pusher protocol's WebSocket: `/app/{key}` (one segment; pusher-js puts
        // nothing else in the path unless told to use a `wsPath` prefix).
        path if path.starts_with(b"/app/") && path.len() > 5 && !path[5..].contains(&b'/') => {
            if method == Method::Get && r.head.has_body() {
                return no_body(out, "the WebSocket upgrade request must not have a body");
            }
            pusher_ws::handle(r, out, &path[5..])
        }
        b"/console" | b"/console/" | b"/console/ringcast.js" if r.svc.config().console => {
            match method {
                Method::Get | Method::Head => console::handle(r.head, r.path(), out),
                _ => answer(out, ApiError::MethodNotAllowed("GET, HEAD")),
            }
        }
        _ => answer(out, ApiError::NotFound),
    }
}

/// Answer 503 and close: the worker is at its connection limit.
pub(crate) async fn refuse_busy(mut stream: TcpStream) {
    let mut out = Vec::new();
    write_error(&mut out, ApiError::TooManyConnections, Extra::default());
    let _ = monoio::time::timeout(Duration::from_secs(1), stream.write_all(out)).await;
}

/// Where an accepted connection comes from (see `crate::admission`).
#[derive(Debug)]
pub(crate) struct Origin {
    /// The client address: the TCP peer, or what its trusted PROXY header named
    /// (`None`: looked up from the socket).
    pub client: Option<std::net::IpAddr>,
    /// The TCP peer is one of `trusted_proxies`.
    pub trusted_peer: bool,
    /// `client` came from a PROXY header (then `X-Forwarded-For` is not read).
    pub from_header: bool,
    /// Bytes already read that start the HTTP stream.
    pub leftover: Vec<u8>,
    /// Bytes already read that start the TLS handshake.
    pub tls_prefix: Vec<u8>,
}

impl Origin {
    /// A connection as accepted from `peer`.
    pub(crate) fn peer(peer: std::net::IpAddr) -> Origin {
        Origin {
            client: Some(crate::admission::trusted::canonical(peer)),
            trusted_peer: false,
            from_header: false,
            leftover: Vec::new(),
            tls_prefix: Vec::new(),
        }
    }
}

/// Serve one accepted connection until it closes or becomes a WebSocket.
pub(crate) async fn serve<S: Transport>(
    svc: Rc<Service>,
    mut stream: S,
    guard: ConnGuard,
    origin: Origin,
) {
    let mut conn = HttpConn::new();
    conn.peer = origin.client.or_else(|| stream.peer_ip());
    conn.forwarded = origin.trusted_peer && !origin.from_header;
    if !origin.leftover.is_empty() {
        conn.buf.extend_from_slice(&origin.leftover);
    }
    loop {
        let upgrade = conn.serve_buffered(&svc);
        if upgrade.is_none() && svc.shard.has_mail() {
            // Busy workers must drain their mailbox themselves (see `Shard::drain`). Not
            // between an upgrade's checks and its registration: an envelope drained there
            // (a user's disconnect, a key revoked) would miss the new connection.
            svc.shard.drain();
        }
        if let Some(u) = upgrade {
            // The answers so far, 101 included, become the WebSocket's first bytes: the
            // connection is registered with its shard before anything is written, so a
            // key revoked while a slow client holds the 101 still closes it (4001).
            // A task of its own: this HTTP task's state (its buffers, its read and
            // timeout futures) is freed instead of living as long as the socket.
            let answers = std::mem::take(&mut conn.out);
            upgrade::start(svc, stream, u, answers, conn.buf, guard);
            return;
        }
        let idle = svc.config().http_idle_timeout();
        if let Some(answer) = conn.deferred.take() {
            // Answers written before it go first; then this one, then the requests
            // buffered after it. A small answer joins the output (pipelined publishes
            // keep one write for many answers); a large one becomes the output as it
            // is, never copied, once the answers before it are written.
            let bytes = answer.await;
            if bytes.len() > OUT_KEEP_MAX
                && !conn.out.is_empty()
                && !conn.flush(&mut stream, idle).await
            {
                return;
            }
            if conn.out.is_empty() {
                conn.out = bytes;
            } else {
                conn.out.extend_from_slice(&bytes);
            }
            if !conn.close {
                continue;
            }
        }
        if !conn.flush(&mut stream, idle).await {
            return;
        }
        conn.release_idle_buffer();
        if conn.close || (svc.shard.is_stopping() && conn.buf.is_empty()) {
            stream.before_close().await;
            return;
        }
        if conn.held {
            // Requests were left buffered for the answers before them to be read.
            continue;
        }
        match conn.read(&mut stream, svc.config()).await {
            Read::Data => {}
            Read::Closed => return,
            Read::TimedOut => {
                let mut out = Vec::new();
                write_error(&mut out, ApiError::RequestTimeout, Extra::default());
                let write = stream.write_all(out);
                let _ = monoio::time::timeout(Duration::from_secs(1), write).await;
                return;
            }
        }
    }
}
