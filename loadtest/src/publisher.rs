//! Publisher threads: a few keep-alive HTTP/1.1 connections on one mio loop, posting
//! as fast as responses come back (optionally pipelined) or on a fixed schedule.
//!
//! Publish number `g` (global over all publisher threads) goes to channel `g % K`
//! with per-channel sequence `g / K`, and carries its send time, so subscribers can
//! compute latency and detect duplicates without any coordination.
//!
//! Invariants:
//! - Bounded in time (`deadline`, then at most `answer_grace` for outstanding
//!   responses) and every poll has a timeout.
//! - A response is attributed to the oldest outstanding request on its connection
//!   (HTTP/1.1 answers in order); a malformed response kills only that connection.
//! - A connection the server ends cleanly with nothing outstanding (`Connection: close`
//!   after the last answer, as Sockudo's REST API does on every response, or an idle
//!   close) is reopened on the same slot; requests are only written to open ones.
//! - Over TLS (`https://`) a connection reads and writes through its own `tls::Session`
//!   (made with the connection, a new one on reopen); a request written before the
//!   handshake completes waits in the session and leaves right after it.

use crate::http::parse_response;
use crate::net::{connect_nonblocking, source_ip};
use crate::stats::{new_histogram, record, unix_ns};
use crate::target::Target;
use crate::tls;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Progress counters shared with the main thread.
#[derive(Default)]
pub struct PubShared {
    pub sent: AtomicU64,
    pub accepted: AtomicU64,
    pub answered: AtomicU64,
    /// Set by the main thread to end the run early.
    pub stop: AtomicBool,
}

/// What one publisher thread does.
#[derive(Clone)]
pub struct PubPlan {
    pub target: Target,
    pub conns: usize,
    /// Publishes per second for this thread; `None`: as fast as responses allow.
    pub rate: Option<f64>,
    pub duration: Duration,
    pub channels: u32,
    pub thread_idx: usize,
    pub threads: usize,
    /// Requests in flight per connection.
    pub pipeline: usize,
    /// Filler bytes in `data`; with `pad_vary` each publish gets 0..=pad bytes.
    pub pad: usize,
    pub pad_vary: bool,
    /// Messages per request: 1 = `POST /api/v1/publish`; more = one
    /// `POST /api/v1/publish/batch` carrying that many consecutive publish numbers.
    pub batch: usize,
    pub source_ips: usize,
    pub answer_grace: Duration,
}

/// What one publisher thread measured.
pub struct PubResult {
    pub statuses: BTreeMap<u16, u64>,
    pub accepted_per_channel: Vec<u64>,
    pub sent: u64,
    pub unanswered: u64,
    pub conn_errors: BTreeMap<&'static str, u64>,
    /// Request-to-response time (ns).
    pub response: Histogram<u64>,
    /// How far behind schedule the sender fell at worst (rate mode).
    pub max_lag: Duration,
    pub elapsed: Duration,
}

struct Conn {
    stream: TcpStream,
    up: bool,
    dead: bool,
    /// Send instant, first publish counter and message count of each outstanding
    /// request, oldest first.
    inflight: VecDeque<(Instant, u64, u32)>,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    /// The last read stopped at its bound with data possibly left: read again
    /// without waiting for a new edge.
    more: bool,
    /// The server closed it cleanly with nothing outstanding: open a new one here.
    reopen: bool,
    /// The TLS session of an `https://` target; `None` on plaintext.
    tls: Option<tls::Session>,
}

impl Conn {
    fn flush(&mut self) -> io::Result<()> {
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
        tls::send(&mut self.stream, self.tls.as_mut())?; // records the session still holds
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }
}

/// Run one publisher thread to completion.
pub fn run(plan: PubPlan, shared: Arc<PubShared>) -> PubResult {
    let mut res = PubResult {
        statuses: BTreeMap::new(),
        accepted_per_channel: vec![0; plan.channels.max(1) as usize],
        sent: 0,
        unanswered: 0,
        conn_errors: BTreeMap::new(),
        response: new_histogram(),
        max_lag: Duration::ZERO,
        elapsed: Duration::ZERO,
    };
    let Ok(mut poll) = Poll::new() else {
        *res.conn_errors.entry("epoll_create failed").or_default() += 1;
        return res;
    };
    let mut events = Events::with_capacity(1024);
    let mut conns: Vec<Conn> = Vec::with_capacity(plan.conns);
    for i in 0..plan.conns {
        let src = source_ip(plan.thread_idx * plan.conns + i, plan.source_ips);
        let Ok(tls) = plan.target.tls.as_ref().map(tls::Session::new).transpose() else {
            *res.conn_errors.entry("TLS session failed").or_default() += 1;
            continue;
        };
        match connect_nonblocking(plan.target.endpoint.addr, src) {
            Ok(mut stream) => {
                if poll
                    .registry()
                    .register(
                        &mut stream,
                        Token(i),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .is_err()
                {
                    *res.conn_errors.entry("epoll register failed").or_default() += 1;
                    continue;
                }
                conns.push(Conn {
                    stream,
                    up: false,
                    dead: false,
                    inflight: VecDeque::new(),
                    out: Vec::with_capacity(4096),
                    out_pos: 0,
                    inbuf: Vec::with_capacity(4096),
                    more: false,
                    reopen: false,
                    tls,
                });
            }
            Err(_) => *res.conn_errors.entry("connect() failed").or_default() += 1,
        }
    }
    // Wait (bounded) for the connects to complete before the clock starts.
    let connect_deadline = Instant::now() + Duration::from_secs(10);
    while conns.iter().any(|c| !c.up && !c.dead) && Instant::now() < connect_deadline {
        if poll
            .poll(&mut events, Some(Duration::from_millis(50)))
            .is_err()
        {
            continue;
        }
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_writable() && !c.up {
                match (c.stream.take_error(), c.stream.peer_addr()) {
                    (Ok(None), Ok(_)) => c.up = true,
                    (_, Err(e)) if e.kind() == io::ErrorKind::NotConnected => {}
                    _ => {
                        c.dead = true;
                        *res.conn_errors.entry("connect failed").or_default() += 1;
                    }
                }
            }
        }
    }
    for c in conns.iter_mut().filter(|c| !c.up && !c.dead) {
        c.dead = true;
        *res.conn_errors.entry("connect timeout").or_default() += 1;
    }

    let k_chan = u64::from(plan.channels.max(1));
    let threads = plan.threads.max(1) as u64;
    let interval = plan
        .rate
        .map(|r| Duration::from_secs_f64(1.0 / r.max(1e-3)));
    let t0 = Instant::now();
    let deadline = t0 + plan.duration;
    let mut k: u64 = 0; // this thread's publish counter
    let mut rr = 0usize;
    let mut scratch = vec![0u8; 64 * 1024];
    let mut pad_rng: u64 = 0x2545_F491_4F6C_DD1D ^ plan.thread_idx as u64;
    let mut sending = true;
    let mut grace_deadline: Option<Instant> = None;

    // Bounded: ends at the deadline plus the answer grace at the latest.
    loop {
        let now = Instant::now();
        if sending && (now >= deadline || shared.stop.load(Relaxed)) {
            sending = false;
            grace_deadline = Some(now + plan.answer_grace);
        }
        let outstanding: usize = conns
            .iter()
            .filter(|c| !c.dead)
            .map(|c| c.inflight.len())
            .sum();
        if !sending && (outstanding == 0 || grace_deadline.is_some_and(|g| now >= g)) {
            res.unanswered = outstanding as u64;
            break;
        }
        if conns.iter().all(|c| c.dead && !(c.reopen && sending)) {
            break;
        }

        // Send what is due, round-robin over connections with room in their pipeline.
        if sending {
            let mut budget: usize = 4096; // per loop turn, so reads are never starved
            while budget > 0 {
                if let Some(iv) = interval {
                    let due = t0 + iv.mul_f64(k as f64);
                    if due > now {
                        break;
                    }
                    let lag = now.duration_since(due);
                    if lag > res.max_lag {
                        res.max_lag = lag;
                    }
                }
                let n = conns.len();
                let Some(ci) = (0..n).map(|j| (rr + j) % n).find(|&j| {
                    conns[j].up && !conns[j].dead && conns[j].inflight.len() < plan.pipeline.max(1)
                }) else {
                    break;
                };
                rr = ci + 1;
                let batch = plan.batch.max(1);
                if batch > 1 {
                    let c = &mut conns[ci];
                    let msgs = (k..k + batch as u64).map(|kk| {
                        let g = kk * threads + plan.thread_idx as u64;
                        ((g % k_chan) as u32, g / k_chan)
                    });
                    plan.target
                        .write_publish_batch(&mut c.out, msgs, unix_ns(), plan.pad);
                    c.inflight.push_back((Instant::now(), k, batch as u32));
                    k += batch as u64;
                    res.sent += batch as u64;
                    shared.sent.fetch_add(batch as u64, Relaxed);
                    budget = budget.saturating_sub(batch);
                    continue;
                }
                let g = k * threads + plan.thread_idx as u64;
                let ch = (g % k_chan) as u32;
                let seq = g / k_chan;
                let pad = if plan.pad_vary && plan.pad > 0 {
                    pad_rng ^= pad_rng << 13;
                    pad_rng ^= pad_rng >> 7;
                    pad_rng ^= pad_rng << 17;
                    (pad_rng % (plan.pad as u64 + 1)) as usize
                } else {
                    plan.pad
                };
                let c = &mut conns[ci];
                plan.target
                    .write_publish(&mut c.out, ch, unix_ns(), seq, pad);
                c.inflight.push_back((Instant::now(), k, 1));
                k += 1;
                res.sent += 1;
                shared.sent.fetch_add(1, Relaxed);
                budget -= 1;
            }
            for c in conns.iter_mut().filter(|c| !c.dead && !c.out.is_empty()) {
                if c.flush().is_err() {
                    c.dead = true;
                    *res.conn_errors.entry("write error").or_default() += 1;
                }
            }
        }

        let timeout = match interval {
            Some(iv) if sending => {
                let due = t0 + iv.mul_f64(k as f64);
                due.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(10))
            }
            _ => Duration::from_millis(10),
        };
        if poll.poll(&mut events, Some(timeout)).is_err() {
            continue;
        }
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if c.dead {
                continue;
            }
            if ev.is_writable() && !c.up {
                match (c.stream.take_error(), c.stream.peer_addr()) {
                    (Ok(None), Ok(_)) => c.up = true,
                    (_, Err(e)) if e.kind() == io::ErrorKind::NotConnected => continue,
                    _ => {
                        c.dead = true;
                        *res.conn_errors.entry("reconnect failed").or_default() += 1;
                        continue;
                    }
                }
            }
            if ev.is_writable() && c.flush().is_err() {
                c.dead = true;
                *res.conn_errors.entry("write error").or_default() += 1;
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() {
                read_responses(c, &mut scratch, &mut res, &shared, &plan);
            }
        }
        for c in conns.iter_mut().filter(|c| c.more && !c.dead) {
            read_responses(c, &mut scratch, &mut res, &shared, &plan);
        }
        for (i, c) in conns.iter_mut().enumerate() {
            if c.reopen && sending {
                reopen(i, c, &poll, &plan, &mut res);
            }
        }
    }
    res.elapsed = t0.elapsed();
    res
}

/// Replace a connection the server closed cleanly by a new one on the same slot and
/// token; it takes requests again once its connect completes (a writable event).
fn reopen(i: usize, c: &mut Conn, poll: &Poll, plan: &PubPlan, res: &mut PubResult) {
    c.reopen = false;
    let _ = poll.registry().deregister(&mut c.stream);
    let src = source_ip(plan.thread_idx * plan.conns + i, plan.source_ips);
    let Ok(tls) = plan.target.tls.as_ref().map(tls::Session::new).transpose() else {
        c.dead = true;
        *res.conn_errors.entry("TLS session failed").or_default() += 1;
        return;
    };
    let Ok(mut stream) = connect_nonblocking(plan.target.endpoint.addr, src) else {
        c.dead = true;
        *res.conn_errors.entry("reconnect failed").or_default() += 1;
        return;
    };
    if poll
        .registry()
        .register(
            &mut stream,
            Token(i),
            Interest::READABLE | Interest::WRITABLE,
        )
        .is_err()
    {
        c.dead = true;
        *res.conn_errors.entry("epoll register failed").or_default() += 1;
        return;
    }
    c.stream = stream;
    c.tls = tls;
    c.up = false;
    c.dead = false;
    c.more = false;
    c.inbuf.clear();
    c.out.clear();
    c.out_pos = 0;
    *res.conn_errors.entry("reopened after close").or_default() += 1;
}

fn read_responses(
    c: &mut Conn,
    scratch: &mut [u8],
    res: &mut PubResult,
    shared: &PubShared,
    plan: &PubPlan,
) {
    let k_chan = u64::from(plan.channels.max(1));
    let threads = plan.threads.max(1) as u64;
    // Bounded: at most 64 reads per call; `more` brings us back next loop turn,
    // since edge-triggered epoll will not report data that was already there.
    c.more = true;
    for _ in 0..64 {
        let n = match tls::read(&mut c.stream, c.tls.as_mut(), scratch) {
            Ok(0) => {
                c.dead = true;
                c.more = false;
                if c.inflight.is_empty() && c.inbuf.is_empty() {
                    c.reopen = true; // an idle close: nothing was lost
                } else {
                    *res.conn_errors.entry("closed by server").or_default() += 1;
                }
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.more = false;
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                c.dead = true;
                // InvalidData: only a TLS session returns it (certificate, bad record).
                let why = if e.kind() == io::ErrorKind::InvalidData {
                    "TLS error"
                } else {
                    "read error"
                };
                *res.conn_errors.entry(why).or_default() += 1;
                return;
            }
        };
        c.inbuf.extend_from_slice(&scratch[..n]);
        let mut pos = 0;
        loop {
            match parse_response(&c.inbuf[pos..], false) {
                Ok(None) => break,
                Err(_) => {
                    c.dead = true;
                    *res.conn_errors.entry("bad response").or_default() += 1;
                    return;
                }
                Ok(Some(r)) => {
                    pos += r.total_len;
                    let Some((sent_at, k0, n)) = c.inflight.pop_front() else {
                        c.dead = true;
                        *res.conn_errors.entry("unsolicited response").or_default() += 1;
                        return;
                    };
                    record(&mut res.response, sent_at.elapsed().as_nanos() as u64);
                    *res.statuses.entry(r.status).or_default() += 1;
                    shared.answered.fetch_add(1, Relaxed);
                    if (200..300).contains(&r.status) {
                        // A batch is accepted whole: each of its messages counts.
                        shared.accepted.fetch_add(u64::from(n), Relaxed);
                        for kk in k0..k0 + u64::from(n) {
                            let ch = (kk * threads + plan.thread_idx as u64) % k_chan;
                            if let Some(a) = res.accepted_per_channel.get_mut(ch as usize) {
                                *a += 1;
                            }
                        }
                    }
                    if r.close {
                        c.dead = true;
                        c.more = false;
                        if c.inflight.is_empty() && pos == c.inbuf.len() {
                            c.reopen = true;
                        } else {
                            *res.conn_errors.entry("connection: close").or_default() += 1;
                        }
                        return;
                    }
                }
            }
        }
        c.inbuf.drain(..pos);
        if c.inbuf.len() > crate::http::MAX_HEAD * 4 {
            c.dead = true;
            *res.conn_errors
                .entry("response backlog too large")
                .or_default() += 1;
            return;
        }
    }
}
