//! One reconnecting storm client: a nonblocking WebSocket connection to one node at a
//! time, subscribed to the common channel and to its own, resubscribing after every
//! loss with `since` the last position it saw (docs/protocol.md, "History and recovery").
//!
//! Invariants:
//! - The client never decides when or where to reconnect: it reports `Outcome::Lost`
//!   with the close's own ask (1013 `retry_after`, 1001 spread) and the fleet applies
//!   the backoff and picks the node.
//! - No unwrap on socket input: every malformed byte becomes a loss (1002 counted).
//! - Input is kept only while a frame is incomplete; the buffer shrinks back after a
//!   replay burst so 19,000 idle clients stay small.

use super::fields;
use super::ledger::Track;
use super::Counters;
use crate::http::parse_response;
use crate::ws::{self, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};
use mio::net::TcpStream;
use std::io::{self, Read, Write};
use std::time::Instant;

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No socket: waiting for the fleet's reconnect timer.
    Idle,
    Connecting,
    Upgrading,
    Greeting,
    Subscribing,
    Ready,
}

/// What the fleet must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Nothing,
    /// Subscribed to both channels (again).
    Ready,
    /// The connection ended (`code`, 1006 without a close frame); `ask` is the least
    /// wait the close asked for; `refused` when the node never let it in (connect
    /// refused, or an HTTP answer instead of 101).
    Lost {
        code: u16,
        ask: Option<u64>,
        refused: bool,
        /// The TCP connect itself was refused: a balancer tries another node at once.
        failover: bool,
    },
}

/// The channel names every client of the process shares the shape of.
pub struct Names {
    pub common: String,
    pub own_prefix: String,
    pub ws_path: String,
    pub host: String,
}

impl Names {
    pub fn own(&self, idx: u32) -> String {
        format!("{}{idx}", self.own_prefix)
    }
}

pub struct Client {
    /// Global client index (its own channel is `<own_prefix><idx>`).
    pub idx: u32,
    pub stream: Option<TcpStream>,
    pub phase: Phase,
    /// Node index of the current (or last) connection.
    pub node: usize,
    /// [common, own].
    pub tracks: [Track; 2],
    /// Reconnects without a stable connection (the JS client's `_attempt`).
    pub attempt: u32,
    /// When the current attempt or connection started.
    pub since: Instant,
    /// Set when a Ready connection was lost; cleared when Ready again.
    pub lost_at: Option<Instant>,
    /// Has been Ready at least once.
    pub was_ready: bool,
    /// [common, own]: the offset in this connection's `subscribed`; a message at or
    /// below it is the recovery's replay, above it a live delivery.
    live_after: [u64; 2],
    pending_subs: u8,
    input: Vec<u8>,
    out: Vec<u8>,
    mask: u32,
}

impl Client {
    pub fn new(idx: u32) -> Self {
        Client {
            idx,
            stream: None,
            phase: Phase::Idle,
            node: 0,
            tracks: [Track::default(), Track::default()],
            attempt: 0,
            since: Instant::now(),
            lost_at: None,
            was_ready: false,
            live_after: [0; 2],
            pending_subs: 0,
            input: Vec::new(),
            out: Vec::new(),
            mask: idx.wrapping_mul(2_654_435_761) | 1,
        }
    }

    /// Take a socket whose connect is in progress.
    pub fn start(&mut self, stream: TcpStream, node: usize, names: &Names) {
        self.stream = Some(stream);
        self.node = node;
        self.phase = Phase::Connecting;
        self.since = Instant::now();
        self.input.clear();
        self.out.clear();
        ws::write_upgrade_request(&mut self.out, &names.host, &names.ws_path);
    }

    /// Drop the socket (the fleet schedules the next attempt).
    pub fn drop_socket(&mut self) {
        self.stream = None;
        self.phase = Phase::Idle;
        self.input = Vec::new();
        self.out = Vec::new();
    }

    /// Writable: the connect finished (or failed); flush what is queued.
    pub fn on_writable(&mut self, c: &mut Counters) -> Outcome {
        if self.phase == Phase::Connecting {
            let Some(s) = self.stream.as_ref() else {
                return Outcome::Nothing;
            };
            match s.take_error() {
                Ok(None) => {}
                _ => return self.refused(c, "connect_error"),
            }
            match s.peer_addr() {
                Ok(_) => self.phase = Phase::Upgrading,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Outcome::Nothing,
                Err(_) => return self.refused(c, "connect_error"),
            }
        }
        self.flush(c)
    }

    fn refused(&mut self, c: &mut Counters, why: &'static str) -> Outcome {
        *c.failures.entry(why).or_default() += 1;
        Outcome::Lost {
            code: 1006,
            ask: None,
            refused: true,
            failover: why == "connect_error",
        }
    }

    fn flush(&mut self, c: &mut Counters) -> Outcome {
        let Some(s) = self.stream.as_mut() else {
            return Outcome::Nothing;
        };
        while !self.out.is_empty() {
            match s.write(&self.out) {
                Ok(0) => return self.lost(c, 1006, None),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) if self.phase == Phase::Connecting || self.phase == Phase::Upgrading => {
                    return self.refused(c, "connect_error")
                }
                Err(_) => return self.lost(c, 1006, None),
            }
        }
        Outcome::Nothing
    }

    fn lost(&mut self, c: &mut Counters, code: u16, ask: Option<u64>) -> Outcome {
        *c.close_codes.entry(code).or_default() += 1;
        Outcome::Lost {
            code,
            ask,
            refused: false,
            failover: false,
        }
    }

    fn send_text(&mut self, payload: &[u8], c: &mut Counters) -> Outcome {
        ws::encode_client_frame(OP_TEXT, payload, &mut self.mask, &mut self.out);
        self.flush(c)
    }

    /// Readable: read everything there is and handle each complete frame.
    pub fn on_readable(
        &mut self,
        scratch: &mut [u8],
        names: &Names,
        c: &mut Counters,
        jitter: f64,
    ) -> Outcome {
        let mut result = Outcome::Nothing;
        loop {
            let Some(s) = self.stream.as_mut() else {
                return result;
            };
            match s.read(scratch) {
                Ok(0) => {
                    return if self.phase == Phase::Upgrading {
                        self.refused(c, "eof_before_101")
                    } else {
                        self.lost(c, 1006, None)
                    }
                }
                Ok(n) => self.input.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) if self.phase == Phase::Connecting || self.phase == Phase::Upgrading => {
                    return self.refused(c, "connect_error")
                }
                Err(_) => return self.lost(c, 1006, None),
            }
            match self.process(names, c, jitter) {
                Outcome::Nothing => {}
                Outcome::Ready => result = Outcome::Ready,
                lost => return lost,
            }
        }
        if self.input.is_empty() && self.input.capacity() > 4096 {
            self.input = Vec::new();
        }
        result
    }

    /// Handle every complete unit at the front of `input`.
    fn process(&mut self, names: &Names, c: &mut Counters, jitter: f64) -> Outcome {
        let mut result = Outcome::Nothing;
        let mut at = 0;
        loop {
            if self.phase == Phase::Upgrading || self.phase == Phase::Connecting {
                match parse_response(&self.input[at..], true) {
                    Ok(None) => break,
                    Ok(Some(r)) if r.status == 101 => {
                        at += r.head_len;
                        self.phase = Phase::Greeting;
                    }
                    Ok(Some(r)) => {
                        *c.refused_status.entry(r.status).or_default() += 1;
                        return Outcome::Lost {
                            code: 1006,
                            ask: None,
                            refused: true,
                            failover: false,
                        };
                    }
                    Err(_) => return self.refused(c, "bad_http"),
                }
                continue;
            }
            let head = match ws::parse_frame(&self.input[at..]) {
                Ok(None) => break,
                Ok(Some(h)) => h,
                Err(_) => return self.lost(c, 1002, None),
            };
            let start = at + head.header_len;
            let end = at + head.total_len();
            at = end;
            match head.opcode {
                OP_TEXT if head.fin => {
                    let frame = std::mem::take(&mut self.input);
                    let o = self.on_text(&frame[start..end], names, c);
                    self.input = frame;
                    match o {
                        Outcome::Nothing => {}
                        Outcome::Ready => result = Outcome::Ready,
                        lost => return lost,
                    }
                }
                OP_PING => {
                    let payload = self.input[start..end].to_vec();
                    ws::encode_client_frame(OP_PONG, &payload, &mut self.mask, &mut self.out);
                    if let lost @ Outcome::Lost { .. } = self.flush(c) {
                        return lost;
                    }
                }
                OP_CLOSE => {
                    let p = &self.input[start..end];
                    let code = ws::close_code(p);
                    let reason = std::str::from_utf8(p.get(2..).unwrap_or(&[])).unwrap_or("");
                    if code == 1013 && self.was_ready {
                        c.refused_1013 += 1;
                    } else if code == 1013 {
                        c.refused_1013_first += 1;
                    }
                    let ask = super::backoff::close_delay(
                        code,
                        reason,
                        super::backoff::MIN_RECONNECT_MS,
                        super::backoff::SHUTDOWN_SPREAD_MS,
                        jitter,
                    );
                    return self.lost(c, code, ask);
                }
                _ => c.other_frames += 1,
            }
        }
        self.input.drain(..at);
        result
    }

    fn on_text(&mut self, f: &[u8], names: &Names, c: &mut Counters) -> Outcome {
        let slot = |ch: &[u8]| usize::from(ch != names.common.as_bytes());
        match fields::str_field(f, "type") {
            Some(b"message") => {
                let (Some(ch), Some(off), Some(ep)) = (
                    fields::str_field(f, "channel"),
                    fields::u64_field(f, "offset"),
                    fields::epoch(f),
                ) else {
                    c.unpositioned += 1;
                    return Outcome::Nothing;
                };
                let s = slot(ch);
                self.tracks[s].receive(off, ep);
                c.messages += 1;
                if off <= self.live_after[s] {
                    c.replayed += 1;
                } else if let Some(t) = fields::u64_field(f, "t") {
                    c.latency.record_since(t);
                }
                Outcome::Nothing
            }
            Some(b"subscribed") => {
                let (Some(ch), Some(off), Some(ep)) = (
                    fields::str_field(f, "channel"),
                    fields::u64_field(f, "offset"),
                    fields::epoch(f),
                ) else {
                    c.unpositioned += 1;
                    return Outcome::Nothing;
                };
                let s = slot(ch);
                self.live_after[s] = off;
                let t = &mut self.tracks[s];
                match fields::bool_field(f, "recovered") {
                    Some(true) => c.recovered_true += 1,
                    Some(false) => {
                        c.recovered_false += 1;
                        if t.last == 0 {
                            c.recovered_false_fresh += 1;
                        }
                    }
                    None => t.start_at(off, ep),
                }
                self.pending_subs = self.pending_subs.saturating_sub(1);
                if self.pending_subs == 0 && self.phase == Phase::Subscribing {
                    self.phase = Phase::Ready;
                    return Outcome::Ready;
                }
                Outcome::Nothing
            }
            Some(b"connected") if self.phase == Phase::Greeting => {
                self.phase = Phase::Subscribing;
                self.pending_subs = 2;
                let own = names.own(self.idx);
                for (i, ch) in [names.common.as_str(), own.as_str()]
                    .into_iter()
                    .enumerate()
                {
                    let t = &self.tracks[i];
                    let frame = if t.started {
                        format!(
                            r#"{{"type":"subscribe","channel":"{ch}","since":{{"offset":{},"epoch":"{}"}}}}"#,
                            t.last,
                            String::from_utf8_lossy(&t.epoch)
                        )
                    } else {
                        format!(r#"{{"type":"subscribe","channel":"{ch}"}}"#)
                    };
                    if let lost @ Outcome::Lost { .. } = self.send_text(frame.as_bytes(), c) {
                        return lost;
                    }
                }
                Outcome::Nothing
            }
            Some(b"error") => {
                c.server_errors += 1;
                Outcome::Nothing
            }
            _ => Outcome::Nothing,
        }
    }
}
