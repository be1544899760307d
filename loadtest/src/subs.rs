//! Subscriber threads: each runs one mio epoll loop over thousands of `WsConn`s,
//! opens them with a bounded number of handshakes in flight, records delivery
//! latency in its own HDR histogram and checks duplicates per subscriber and seq.
//! With `churn` set (soak mode) connections are closed and reopened and their
//! subscriptions changed while the run goes on.
//!
//! Invariants:
//! - The loop is bounded in time (`hard_deadline`) and every poll has a timeout.
//! - Shared state is a handful of atomics for progress; everything else is
//!   thread-local and returned once at the end (no locks on the receive path).

use crate::net::{connect_nonblocking, source_ip};
use crate::stats::{new_histogram, record, unix_ns};
use crate::target::{Kind, Target};
use crate::tls;
use crate::wsconn::{Ev, Phase, WsConn};
use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest sequence number tracked for duplicates per subscriber (a bitset of this
/// many bits at most, 128 KiB); later seqs are counted but not checked.
const MAX_TRACKED_SEQ: u64 = 1 << 20;

/// Progress counters shared with the main thread.
#[derive(Default)]
pub struct Shared {
    pub ready: AtomicU64,
    pub failed: AtomicU64,
    pub received: AtomicU64,
    pub closed: AtomicU64,
    /// Set by the main thread: close everything and return.
    pub stop: AtomicBool,
    /// Churn mode: connections (re)opened so far.
    pub opened: AtomicU64,
    /// Churn mode: subscription changes (unsubscribe old + subscribe new) sent so far.
    pub flips: AtomicU64,
}

/// Soak-mode churn: lifetimes and subscription changes.
#[derive(Debug, Clone, Copy)]
pub struct Churn {
    pub min_life: Duration,
    pub max_life: Duration,
    /// Mean interval between subscription changes on one connection.
    pub flip_every: Duration,
    pub channels: u32,
}

/// What one subscriber thread is asked to do.
pub struct SubPlan {
    pub target: Target,
    /// Global subscriber index and its channel, for every connection of this thread.
    pub conns: Vec<(usize, u32)>,
    pub source_ips: usize,
    /// Handshakes in flight at once (keeps the server's accept backlog from overflowing).
    pub max_inflight: usize,
    pub connect_timeout: Duration,
    pub hard_deadline: Instant,
    pub churn: Option<Churn>,
    /// Send subscribe frames (ringcast); false: connect and hold only.
    pub subscribe: bool,
    /// Also subscribe to the connection's own channel, `OWN_CHANNEL_BASE + index`
    /// (nothing is published there by `fanout`: its deliveries are never expected).
    pub own_channel: bool,
}

/// First channel index of the per-connection channels (`--own-channel`): far above
/// any `--channels` count, so an own channel never collides with a shared one.
pub const OWN_CHANNEL_BASE: u32 = 1 << 30;

/// What one subscriber thread measured.
pub struct SubResult {
    pub latency: Histogram<u64>,
    pub connect: Histogram<u64>,
    pub received: u64,
    pub duplicates: u64,
    /// Deliveries with a seq below the highest this subscriber had seen (each
    /// subscriber listens to one channel, so with one publishing connection, whose
    /// requests are answered in order, any is a reorder by the server).
    pub reordered: u64,
    pub untracked: u64,
    /// Ready subscribers per channel index (expected deliveries = Σ ready × accepted).
    pub ready_per_channel: BTreeMap<u32, u64>,
    pub close_codes: BTreeMap<u16, u64>,
    pub refused: BTreeMap<u16, u64>,
    pub failures: BTreeMap<&'static str, u64>,
    pub server_errors: u64,
    pub fragmented: u64,
    pub opened: u64,
}

struct Slot {
    conn: WsConn,
    seen: Vec<u64>,
    /// Highest seq received plus one (0: none yet).
    high: u64,
    ready: bool,
    /// Churn: when to close this connection, and when to change a subscription next.
    dies_at: Option<Instant>,
    flip_at: Option<Instant>,
}

/// A cheap deterministic PRNG (splitmix64) for churn decisions.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(if span == 0 { 0 } else { self.next() % span })
    }
}

/// Run one subscriber thread to completion.
pub fn run(plan: SubPlan, shared: Arc<Shared>) -> SubResult {
    let mut res = SubResult {
        latency: new_histogram(),
        connect: new_histogram(),
        received: 0,
        duplicates: 0,
        reordered: 0,
        untracked: 0,
        ready_per_channel: BTreeMap::new(),
        close_codes: BTreeMap::new(),
        refused: BTreeMap::new(),
        failures: BTreeMap::new(),
        server_errors: 0,
        fragmented: 0,
        opened: 0,
    };
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(_) => {
            *res.failures.entry("epoll_create failed").or_default() += plan.conns.len() as u64;
            shared.failed.fetch_add(plan.conns.len() as u64, Relaxed);
            return res;
        }
    };
    let mut events = Events::with_capacity(4096);
    let mut scratch = vec![0u8; 64 * 1024];
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(plan.conns.len());
    let mut rng = Rng(plan.conns.first().map_or(1, |c| c.0 as u64 + 1));
    let mut to_open: std::collections::VecDeque<usize> = (0..plan.conns.len()).collect();
    slots.resize_with(plan.conns.len(), || None);
    let mut chan_of: Vec<u32> = plan.conns.iter().map(|c| c.1).collect();
    let mut inflight = 0usize;
    let mut retry: Vec<usize> = Vec::new();
    let mut last_sweep = Instant::now();

    // Bounded by hard_deadline (and by stop).
    while Instant::now() < plan.hard_deadline && !shared.stop.load(Relaxed) {
        // Open more connections while under the in-flight bound.
        while inflight < plan.max_inflight {
            let Some(i) = to_open.pop_front() else { break };
            let (global, _) = plan.conns[i];
            let ch = chan_of[i];
            res.opened += 1;
            shared.opened.fetch_add(1, Relaxed);
            let src = source_ip(global, plan.source_ips);
            let stream = match connect_nonblocking(plan.target.endpoint.addr, src) {
                Ok(s) => s,
                Err(_) => {
                    *res.failures.entry("connect() failed").or_default() += 1;
                    shared.failed.fetch_add(1, Relaxed);
                    if plan.churn.is_some() {
                        to_open.push_back(i); // try again later in churn mode
                        break;
                    }
                    continue;
                }
            };
            // TLS state only for a TLS target: plaintext connections stay as small.
            let tls = match plan.target.tls.as_ref().map(tls::Session::new).transpose() {
                Ok(s) => s,
                Err(_) => {
                    *res.failures.entry("TLS session failed").or_default() += 1;
                    shared.failed.fetch_add(1, Relaxed);
                    continue;
                }
            };
            let mut conn = WsConn::new(
                stream,
                match (plan.subscribe, plan.own_channel) {
                    (true, true) => vec![ch, OWN_CHANNEL_BASE.wrapping_add(global as u32)],
                    (true, false) => vec![ch],
                    (false, _) => Vec::new(),
                },
                (global as u32).wrapping_mul(2_654_435_761),
                tls,
            );
            if poll
                .registry()
                .register(
                    &mut conn.stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                *res.failures.entry("epoll register failed").or_default() += 1;
                shared.failed.fetch_add(1, Relaxed);
                continue;
            }
            slots[i] = Some(Slot {
                conn,
                seen: Vec::new(),
                high: 0,
                ready: false,
                dies_at: None,
                flip_at: None,
            });
            inflight += 1;
        }

        if poll
            .poll(&mut events, Some(Duration::from_millis(10)))
            .is_err()
        {
            continue; // EINTR; the loop is bounded by the deadline
        }
        let mut work: Vec<(usize, bool, bool)> = events
            .iter()
            .map(|e| {
                (
                    e.token().0,
                    e.is_readable() || e.is_read_closed() || e.is_error(),
                    e.is_writable(),
                )
            })
            .collect();
        work.extend(retry.drain(..).map(|i| (i, true, false)));
        for (i, readable, writable) in work {
            let Some(slot) = slots.get_mut(i).and_then(|s| s.as_mut()) else {
                continue;
            };
            let target = &plan.target;
            // Collect events first, then apply (the closure cannot borrow the slot).
            let mut got: Vec<Ev> = Vec::new();
            slot.conn
                .on_ready(readable, writable, target, &mut scratch, &mut |ev| {
                    got.push(ev)
                });
            if slot.conn.more_input {
                retry.push(i);
            }
            for ev in got {
                apply(
                    ev,
                    slot,
                    &mut res,
                    &shared,
                    &mut inflight,
                    plan.churn,
                    &mut rng,
                );
            }
            if slot.conn.phase == Phase::Closed {
                let _ = poll.registry().deregister(&mut slot.conn.stream);
                slots[i] = None;
                if let Some(churn) = plan.churn {
                    chan_of[i] = (rng.next() % u64::from(churn.channels.max(1))) as u32;
                    to_open.push_back(i);
                }
            }
        }

        // Timeouts and churn, a few times a second (bounded by the slot count).
        if last_sweep.elapsed() >= Duration::from_millis(100) {
            last_sweep = Instant::now();
            let now = Instant::now();
            for (i, entry) in slots.iter_mut().enumerate() {
                let Some(slot) = entry.as_mut() else { continue };
                let mut close = false;
                if !slot.ready && now.duration_since(slot.conn.started) > plan.connect_timeout {
                    *res.failures.entry("connect/handshake timeout").or_default() += 1;
                    shared.failed.fetch_add(1, Relaxed);
                    inflight = inflight.saturating_sub(1);
                    close = true;
                }
                if let Some(churn) = plan.churn {
                    if slot.dies_at.is_some_and(|d| now >= d) {
                        close = true;
                    } else if slot.flip_at.is_some_and(|f| now >= f) {
                        if plan.target.kind == Kind::Nchan {
                            close = true; // Nchan subscribes by URL: a change is a reconnect
                        } else if let Some(&old) = slot.conn.channels.first() {
                            let new = (rng.next() % u64::from(churn.channels.max(1))) as u32;
                            let ok = slot.conn.subscribe(&plan.target, old, false).is_ok()
                                && slot.conn.subscribe(&plan.target, new, true).is_ok();
                            slot.conn.channels[0] = new;
                            shared.flips.fetch_add(1, Relaxed);
                            if !ok {
                                close = true;
                            }
                            slot.flip_at = Some(
                                now + rng.between(churn.flip_every / 2, churn.flip_every * 3 / 2),
                            );
                        }
                    }
                }
                if close {
                    let _ = poll.registry().deregister(&mut slot.conn.stream);
                    if slot.ready {
                        shared.closed.fetch_add(1, Relaxed);
                    }
                    *entry = None;
                    if let Some(churn) = plan.churn {
                        // Reopen on a fresh random channel.
                        chan_of[i] = (rng.next() % u64::from(churn.channels.max(1))) as u32;
                        to_open.push_back(i);
                    }
                }
            }
        }
    }

    res
}

fn apply(
    ev: Ev,
    slot: &mut Slot,
    res: &mut SubResult,
    shared: &Shared,
    inflight: &mut usize,
    churn: Option<Churn>,
    rng: &mut Rng,
) {
    match ev {
        Ev::Ready => {
            slot.ready = true;
            // Counted once, when subscribed: a subscriber closed later still counts
            // as expected, so its losses show in the delivery ratio.
            if churn.is_none() {
                let ch = slot.conn.channels.first().copied().unwrap_or(0);
                *res.ready_per_channel.entry(ch).or_default() += 1;
            }
            *inflight = inflight.saturating_sub(1);
            shared.ready.fetch_add(1, Relaxed);
            record(
                &mut res.connect,
                slot.conn.started.elapsed().as_nanos() as u64,
            );
            if let Some(c) = churn {
                let now = Instant::now();
                slot.dies_at = Some(now + rng.between(c.min_life, c.max_life));
                slot.flip_at = Some(now + rng.between(c.flip_every / 2, c.flip_every * 3 / 2));
            }
        }
        Ev::Message { t, seq } => {
            let now = unix_ns();
            record(&mut res.latency, now.saturating_sub(t));
            if churn.is_none() && seq < MAX_TRACKED_SEQ {
                let (w, b) = ((seq / 64) as usize, seq % 64);
                if slot.seen.len() <= w {
                    slot.seen.resize(w + 1, 0);
                }
                if slot.seen[w] & (1 << b) != 0 {
                    res.duplicates += 1;
                    return;
                }
                slot.seen[w] |= 1 << b;
                if seq + 1 < slot.high {
                    res.reordered += 1;
                }
                slot.high = slot.high.max(seq + 1);
            } else if churn.is_none() {
                res.untracked += 1;
            }
            res.received += 1;
            shared.received.fetch_add(1, Relaxed);
        }
        Ev::ServerError => res.server_errors += 1,
        Ev::Fragmented => res.fragmented += 1,
        Ev::Closed(code) => {
            *res.close_codes.entry(code).or_default() += 1;
            if slot.ready {
                shared.closed.fetch_add(1, Relaxed);
            } else {
                *inflight = inflight.saturating_sub(1);
                shared.failed.fetch_add(1, Relaxed);
            }
        }
        Ev::Failed(why) => {
            *res.failures.entry(why).or_default() += 1;
            if slot.ready {
                shared.closed.fetch_add(1, Relaxed);
            } else {
                *inflight = inflight.saturating_sub(1);
                shared.failed.fetch_add(1, Relaxed);
            }
        }
        Ev::Refused(status) => {
            *res.refused.entry(status).or_default() += 1;
            *inflight = inflight.saturating_sub(1);
            shared.failed.fetch_add(1, Relaxed);
        }
    }
}
