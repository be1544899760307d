//! One client WebSocket connection as a nonblocking state machine driven by a mio
//! event loop: connect, upgrade, (ringcast, Pusher) wait for the greeting and
//! subscribe, then receive deliveries (and answer Pusher's `pusher:ping`). Over TLS
//! (`wss://`) the same machine reads and writes through its `tls::Session`.
//!
//! Invariants:
//! - No allocation per received frame: input is read into the thread's scratch buffer
//!   and parsed in place; only a partial frame left at the end of a read is copied
//!   into the connection's own (initially empty) buffer.
//! - No unwrap on socket input: every malformed byte sequence becomes `Ev::Failed`.
//! - Every read burst is bounded (`MAX_READS_PER_EVENT`); the caller re-polls.
//! - TLS state exists only on a TLS connection (`tls` is one pointer, `None` on
//!   plaintext); output waiting in it counts as output, so a writable edge flushes it.

use crate::http::parse_response;
use crate::target::{Inbound, Target};
use crate::tls;
use crate::ws::{self, FrameHead};
use mio::net::TcpStream;
use std::io;
use std::time::Instant;

thread_local! {
    /// The thread's buffer for inflated messages (`--compression`), reused.
    static INFLATED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Reads per readiness event before yielding to other connections. A connection that
/// still has data is reported `more_input` so the loop comes back to it.
const MAX_READS_PER_EVENT: usize = 16;

/// Pending partial input larger than this means a runaway peer.
const MAX_PENDING: usize = 8 << 20;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// TCP connect in progress.
    Connecting,
    /// Upgrade request sent, waiting for 101.
    Upgrading,
    /// ringcast: waiting for the `connected` greeting.
    Greeting,
    /// ringcast: subscribe frames sent, waiting for confirmations.
    Subscribing,
    /// Receiving deliveries.
    Ready,
    /// Closed by either side or failed; the socket is dead.
    Closed,
}

/// What happened on a connection, for the owning loop to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// Upgraded and (ringcast) subscribed to every initial channel.
    Ready,
    /// A delivery.
    Message { t: u64, seq: u64 },
    /// A server `error` frame.
    ServerError,
    /// A fragmented message (not expected from either server; skipped).
    Fragmented,
    /// The server closed with this WebSocket close code (1006: without a close frame).
    Closed(u16),
    /// The connection failed before or outside the WebSocket protocol.
    Failed(&'static str),
    /// The upgrade was answered with this HTTP status instead of 101.
    Refused(u16),
}

/// One client connection.
pub struct WsConn {
    pub stream: TcpStream,
    pub phase: Phase,
    /// Channels to subscribe to once connected (ringcast) or the URL's channel (Nchan).
    pub channels: Vec<u32>,
    /// When the connect started (connect-time measurement and timeouts).
    pub started: Instant,
    /// Subscribe confirmations still awaited.
    pending_subs: usize,
    /// Partial input carried over between reads; empty (unallocated) most of the time.
    pending: Vec<u8>,
    /// Output not yet accepted by the kernel.
    out: Vec<u8>,
    out_pos: usize,
    mask_seed: u32,
    /// Set when the last readable event stopped at the read bound with data left.
    pub more_input: bool,
    /// The TLS session of a `wss://` connection; `None` on plaintext.
    tls: Option<tls::Session>,
}

impl WsConn {
    /// Wrap a socket whose nonblocking connect is in progress; with `tls`, everything
    /// goes through that session (its handshake starts with the first flush).
    pub fn new(
        stream: TcpStream,
        channels: Vec<u32>,
        seed: u32,
        tls: Option<tls::Session>,
    ) -> Self {
        WsConn {
            stream,
            phase: Phase::Connecting,
            channels,
            started: Instant::now(),
            pending_subs: 0,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            mask_seed: seed | 1,
            more_input: false,
            tls,
        }
    }

    /// Queue a text frame (subscribe, unsubscribe, ping) and try to send it.
    pub fn send_text(&mut self, payload: &[u8]) -> io::Result<()> {
        ws::encode_client_frame(ws::OP_TEXT, payload, &mut self.mask_seed, &mut self.out);
        self.flush()
    }

    /// ringcast: subscribe to one more channel on a ready connection.
    pub fn subscribe(&mut self, target: &Target, ch: u32, subscribe: bool) -> io::Result<()> {
        let json = target.subscribe_json(ch, subscribe);
        self.send_text(json.as_bytes())
    }

    /// Write queued output until done or the kernel's buffer is full.
    pub fn flush(&mut self) -> io::Result<()> {
        // Bounded: each iteration writes at least one byte or returns.
        while self.out_pos < self.out.len() {
            let rest = &self.out[self.out_pos..];
            match tls::write(&mut self.stream, self.tls.as_mut(), rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        tls::send(&mut self.stream, self.tls.as_mut())?; // records rustls still holds
        self.out.clear();
        self.out_pos = 0;
        if self.out.capacity() > 4096 {
            self.out.shrink_to(256);
        }
        Ok(())
    }

    /// Output is waiting: queued frames, or (TLS) records not yet on the socket.
    fn has_output(&self) -> bool {
        !self.out.is_empty() || self.tls.as_ref().is_some_and(tls::Session::wants_write)
    }

    fn fail(&mut self, why: &'static str, sink: &mut impl FnMut(Ev)) {
        if self.phase != Phase::Closed {
            self.phase = Phase::Closed;
            sink(Ev::Failed(why));
        }
    }

    /// Handle a readiness event. `scratch` is the thread's shared read buffer.
    pub fn on_ready(
        &mut self,
        readable: bool,
        writable: bool,
        target: &Target,
        scratch: &mut [u8],
        sink: &mut impl FnMut(Ev),
    ) {
        if self.phase == Phase::Closed {
            return;
        }
        if self.phase == Phase::Connecting && (writable || readable) {
            match self.stream.take_error() {
                Ok(None) => {}
                _ => return self.fail("connect failed", sink),
            }
            if let Err(e) = self.stream.peer_addr() {
                if e.kind() == io::ErrorKind::NotConnected {
                    return; // spurious wake-up; connect still in progress
                }
                return self.fail("connect failed", sink);
            }
            self.phase = Phase::Upgrading;
            let path = target.ws_path(self.channels.first().copied().unwrap_or(0));
            ws::write_upgrade_request(&mut self.out, &target.endpoint.host, &path);
        }
        if (writable || self.has_output()) && self.flush().is_err() {
            return self.fail("write error", sink);
        }
        if readable || self.more_input {
            self.read_input(target, scratch, sink);
        }
    }

    fn read_input(&mut self, target: &Target, scratch: &mut [u8], sink: &mut impl FnMut(Ev)) {
        self.more_input = false;
        for i in 0..MAX_READS_PER_EVENT {
            let n = match tls::read(&mut self.stream, self.tls.as_mut(), scratch) {
                Ok(0) => {
                    if self.phase != Phase::Closed {
                        self.phase = Phase::Closed;
                        sink(Ev::Closed(1006));
                    }
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Only the TLS session returns it: a refused certificate, a bad record.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return self.fail("TLS error", sink)
                }
                Err(_) => return self.fail("read error", sink),
            };
            if self.pending.is_empty() {
                let used = self.consume(&scratch[..n], target, sink);
                if self.phase == Phase::Closed {
                    return;
                }
                self.pending.extend_from_slice(&scratch[used..n]);
            } else {
                let mut buf = std::mem::take(&mut self.pending);
                if buf.len() + n > MAX_PENDING {
                    return self.fail("input backlog too large", sink);
                }
                buf.extend_from_slice(&scratch[..n]);
                let used = self.consume(&buf, target, sink);
                buf.drain(..used);
                if buf.is_empty() && buf.capacity() > 4096 {
                    buf = Vec::new(); // give the memory back after a large frame
                }
                self.pending = buf;
                if self.phase == Phase::Closed {
                    return;
                }
            }
            if self.flush().is_err() {
                return self.fail("write error", sink);
            }
            if i + 1 == MAX_READS_PER_EVENT {
                self.more_input = true;
            }
        }
    }

    /// Consume complete units (the upgrade response, then frames) from `buf`;
    /// returns the bytes used. Never reads past a partial unit.
    fn consume(&mut self, buf: &[u8], target: &Target, sink: &mut impl FnMut(Ev)) -> usize {
        let mut pos = 0;
        if self.phase == Phase::Upgrading {
            match parse_response(buf, true) {
                Ok(None) => return 0,
                Err(_) => {
                    self.fail("bad upgrade response", sink);
                    return buf.len();
                }
                Ok(Some(r)) if r.status != 101 => {
                    self.phase = Phase::Closed;
                    sink(Ev::Refused(r.status));
                    return buf.len();
                }
                Ok(Some(r)) => {
                    pos = r.head_len;
                    if target.uses_subscribe_frames() {
                        self.phase = Phase::Greeting;
                    } else {
                        self.phase = Phase::Ready;
                        sink(Ev::Ready);
                    }
                }
            }
        }
        // Bounded by the buffer: each iteration consumes one whole frame.
        while pos < buf.len() && self.phase != Phase::Closed {
            let head: FrameHead = match ws::parse_frame(&buf[pos..]) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(_) => {
                    self.fail("bad frame from server", sink);
                    return buf.len();
                }
            };
            let payload = &buf[pos + head.header_len..pos + head.total_len()];
            pos += head.total_len();
            match head.opcode {
                ws::OP_TEXT | ws::OP_BINARY if head.fin && head.compressed => {
                    let mut inflated = INFLATED.with(std::cell::Cell::take);
                    if ws::inflate(payload, &mut inflated) {
                        self.on_message(&inflated, target, sink);
                    } else {
                        self.fail("bad compressed frame from server", sink);
                        return buf.len();
                    }
                    INFLATED.with(|c| c.set(inflated));
                }
                ws::OP_TEXT | ws::OP_BINARY if head.fin => self.on_message(payload, target, sink),
                ws::OP_TEXT | ws::OP_BINARY | ws::OP_CONT => sink(Ev::Fragmented),
                ws::OP_PING => {
                    ws::encode_client_frame(
                        ws::OP_PONG,
                        payload,
                        &mut self.mask_seed,
                        &mut self.out,
                    );
                }
                ws::OP_CLOSE => {
                    let code = ws::close_code(payload);
                    // Echo the close so the server completes its handshake cleanly.
                    ws::encode_client_frame(
                        ws::OP_CLOSE,
                        &code.to_be_bytes(),
                        &mut self.mask_seed,
                        &mut self.out,
                    );
                    let _ = self.flush();
                    self.phase = Phase::Closed;
                    sink(Ev::Closed(code));
                }
                _ => {} // pong
            }
        }
        pos
    }

    fn on_message(&mut self, payload: &[u8], target: &Target, sink: &mut impl FnMut(Ev)) {
        match target.classify(payload) {
            Inbound::Message { t, seq } => sink(Ev::Message { t, seq }),
            Inbound::Connected if self.phase == Phase::Greeting => {
                if self.channels.is_empty() {
                    self.phase = Phase::Ready;
                    sink(Ev::Ready);
                    return;
                }
                self.phase = Phase::Subscribing;
                self.pending_subs = self.channels.len();
                for i in 0..self.channels.len() {
                    let json = target.subscribe_json(self.channels[i], true);
                    ws::encode_client_frame(
                        ws::OP_TEXT,
                        json.as_bytes(),
                        &mut self.mask_seed,
                        &mut self.out,
                    );
                }
            }
            Inbound::Subscribed if self.phase == Phase::Subscribing => {
                self.pending_subs = self.pending_subs.saturating_sub(1);
                if self.pending_subs == 0 {
                    self.phase = Phase::Ready;
                    sink(Ev::Ready);
                }
            }
            Inbound::Error => sink(Ev::ServerError),
            // Queued here; flushed by the read loop right after this batch of frames.
            Inbound::Ping => ws::encode_client_frame(
                ws::OP_TEXT,
                target.pusher_pong(),
                &mut self.mask_seed,
                &mut self.out,
            ),
            _ => {}
        }
    }
}
