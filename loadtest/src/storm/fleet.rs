//! The storm fleet: one thread, one mio poll over every client of the process, the
//! reconnect timers, and the choice of node a load balancer would make.
//!
//! Invariants:
//! - The fleet alone decides when (the JS client's backoff, `backoff.rs`) and where
//!   (round-robin over the nodes not known to be down) a client reconnects.
//! - A node that refused a TCP connect, or answered an upgrade with an HTTP error, is
//!   skipped for `DOWN_MS` (what a balancer's health check does); the client moves to
//!   the next node at once for a refused connect, after its backoff otherwise.
//! - Every phase is bounded: an attempt that is not Ready within `ATTEMPT_TIMEOUT`
//!   (the JS client's `connectTimeoutMs`) is dropped and retried.

use super::backoff::{self, Rng};
use super::client::{Client, Names, Outcome, Phase};
use super::Counters;
use crate::net;
use mio::{Events, Interest, Poll, Token};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a node that refused is skipped.
const DOWN_MS: u64 = 2_000;
/// The JS client's `connectTimeoutMs`.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Plan {
    pub nodes: Vec<SocketAddr>,
    /// Node every client starts on.
    pub home: usize,
    pub first_client: u32,
    pub clients: u32,
    /// Stop when this instant passes or `stop_file` exists (then keep receiving for
    /// `drain`, so messages published last still arrive).
    pub until: Instant,
    pub drain: Duration,
    pub stop_file: Option<PathBuf>,
    /// Rewritten every 500 ms: `<ready> <total> <lost_now> <messages>` (messages: every
    /// `message` frame received so far, what `storm.sh` counts deliveries by).
    pub status_file: Option<PathBuf>,
    /// Connects started per second during the first connect (0: unpaced).
    pub connect_rate: u32,
    pub source_ips: usize,
    /// The balancer's view, if given: one line of connection counts (one per node, in
    /// `nodes` order), rewritten by the script; then a reconnect goes to the least
    /// loaded live node instead of round-robin.
    pub loads_file: Option<PathBuf>,
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Fleet {
    poll: Poll,
    clients: Vec<Client>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    down_until: Vec<Instant>,
    rr: usize,
    /// Least-loaded: the last counts read from the loads file, plus what this process
    /// sent to each node since (other processes' picks show at the next reading).
    loads: Option<Vec<u64>>,
    rng: Rng,
    nodes: Vec<SocketAddr>,
    source_ips: usize,
    ready: u32,
}

impl Fleet {
    /// Start an attempt of client `i` on `node`.
    fn connect(&mut self, i: usize, node: usize, names: &Names, c: &mut Counters) {
        let src = net::source_ip(i, self.source_ips);
        match net::connect_nonblocking(self.nodes[node], src) {
            Ok(mut s) => {
                let r = self.poll.registry().register(
                    &mut s,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                );
                if r.is_err() {
                    *c.failures.entry("register").or_default() += 1;
                    self.schedule(i, None, c);
                    return;
                }
                c.attempts += 1;
                self.clients[i].start(s, node, names);
            }
            Err(_) => {
                *c.failures.entry("socket").or_default() += 1;
                self.schedule(i, None, c);
            }
        }
    }

    /// The node a balancer would pick: least loaded when the script gives the loads,
    /// else round-robin; nodes known down are skipped (all down: the next one).
    fn pick(&mut self, now: Instant) -> usize {
        let n = self.nodes.len();
        if let Some(loads) = self.loads.as_mut() {
            if let Some(j) = least_loaded(loads, &self.down_until, now, self.rr) {
                self.rr = j;
                if let Some(l) = loads.get_mut(j) {
                    *l += 1;
                }
                return j;
            }
        }
        for _ in 0..n {
            self.rr = (self.rr + 1) % n;
            if self.down_until[self.rr] <= now {
                return self.rr;
            }
        }
        self.rr
    }

    /// Read the balancer's view (a missing or short file keeps round-robin).
    fn read_loads(&mut self, path: &std::path::Path) {
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let v: Vec<u64> = text
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == self.nodes.len() {
            self.loads = Some(v);
        }
    }

    /// Wait as the JS client would, then reconnect (through the timer heap).
    fn schedule(&mut self, i: usize, ask: Option<u64>, c: &mut Counters) {
        let cl = &mut self.clients[i];
        let delay = backoff::next_delay(cl.attempt, ask, self.rng.unit());
        cl.attempt = cl.attempt.saturating_add(1);
        c.reconnect_wait_ms_sum += delay;
        self.timers.push(Reverse((
            Instant::now() + Duration::from_millis(delay),
            i as u32,
        )));
    }

    fn on_outcome(&mut self, i: usize, o: Outcome, names: &Names, c: &mut Counters) {
        match o {
            Outcome::Nothing => {}
            Outcome::Ready => {
                self.ready += 1;
                let now = Instant::now();
                let cl = &mut self.clients[i];
                c.note_upgrade(cl.node);
                cl.since = now;
                if let Some(at) = cl.lost_at.take() {
                    c.back_ms.push(now.duration_since(at).as_millis() as u32);
                    c.last_back_unix_ms = c.last_back_unix_ms.max(unix_ms());
                }
                cl.was_ready = true;
            }
            Outcome::Lost {
                code: _,
                ask,
                refused,
                failover,
            } => {
                let now = Instant::now();
                let cl = &mut self.clients[i];
                let was = cl.phase;
                if was == Phase::Ready {
                    self.ready -= 1;
                    c.losses += 1;
                    cl.lost_at = Some(now);
                    if c.first_loss_unix_ms == 0 {
                        c.first_loss_unix_ms = unix_ms();
                    }
                    // A connection that lasted resets the backoff (`_stableMs`).
                    if now.duration_since(cl.since) >= Duration::from_millis(backoff::STABLE_MS) {
                        cl.attempt = 0;
                    }
                }
                let node = cl.node;
                cl.drop_socket();
                if refused {
                    self.down_until[node] = now + Duration::from_millis(DOWN_MS);
                }
                let any_up = self.down_until.iter().any(|&d| d <= now);
                if failover && any_up && self.clients[i].was_ready {
                    // The balancer tries another backend at once.
                    let next = self.pick(now);
                    self.connect(i, next, names, c);
                } else {
                    self.schedule(i, ask, c);
                }
            }
        }
    }
}

/// The live node with the fewest connections; ties go to the first after `after`
/// (so equal nodes are taken in turn). `None` when every node is down.
fn least_loaded(
    loads: &[u64],
    down_until: &[Instant],
    now: Instant,
    after: usize,
) -> Option<usize> {
    let n = down_until.len();
    (1..=n)
        .map(|k| (after + k) % n)
        .filter(|&j| down_until[j] <= now)
        .min_by_key(|&j| loads.get(j).copied().unwrap_or(u64::MAX))
}

/// Run the fleet until the plan's end; the counters and every client's record.
pub fn run(plan: &Plan, names: &Names, c: &mut Counters) -> Result<Vec<Client>, String> {
    let poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let n = plan.nodes.len();
    let mut f = Fleet {
        poll,
        clients: (0..plan.clients)
            .map(|k| Client::new(plan.first_client + k))
            .collect(),
        timers: BinaryHeap::new(),
        down_until: vec![Instant::now(); n],
        rr: plan.home,
        loads: None,
        rng: Rng::new(u64::from(plan.first_client) ^ u64::from(std::process::id())),
        nodes: plan.nodes.clone(),
        source_ips: plan.source_ips.max(1),
        ready: 0,
    };
    let mut events = Events::with_capacity(4096);
    let mut scratch = vec![0u8; 64 * 1024];
    let started = Instant::now();
    let mut next_first = 0usize;
    let mut last_status = Instant::now() - Duration::from_secs(1);
    let mut last_sweep = Instant::now();
    let mut end: Option<Instant> = None;
    loop {
        let now = Instant::now();
        match end {
            Some(e) if now >= e => break,
            Some(_) => {}
            None if now >= plan.until || plan.stop_file.as_ref().is_some_and(|p| p.exists()) => {
                end = Some(now + plan.drain);
            }
            None => {}
        }
        // First connects, paced.
        let due = if plan.connect_rate == 0 {
            f.clients.len()
        } else {
            ((now.duration_since(started).as_secs_f64() * f64::from(plan.connect_rate)) as usize
                + 1)
            .min(f.clients.len())
        };
        while next_first < due {
            f.connect(next_first, plan.home, names, c);
            next_first += 1;
        }
        // Reconnect timers.
        while let Some(Reverse((at, i))) = f.timers.peek().copied() {
            if at > now {
                break;
            }
            f.timers.pop();
            let i = i as usize;
            if f.clients[i].phase == Phase::Idle {
                // Until its first Ready a client stays on its home node, so the fleet
                // starts with the placement the run asked for (a refused first connect
                // retries there); after a loss it goes where the balancer sends it.
                let node = if f.clients[i].was_ready {
                    f.pick(now)
                } else {
                    plan.home
                };
                f.connect(i, node, names, c);
            }
        }
        // Attempts that hang.
        if now.duration_since(last_sweep) >= Duration::from_secs(1) {
            last_sweep = now;
            for i in 0..f.clients.len() {
                let cl = &f.clients[i];
                if cl.phase != Phase::Idle
                    && cl.phase != Phase::Ready
                    && now.duration_since(cl.since) > ATTEMPT_TIMEOUT
                {
                    *c.failures.entry("attempt_timeout").or_default() += 1;
                    f.clients[i].drop_socket();
                    f.schedule(i, None, c);
                }
            }
        }
        if now.duration_since(last_status) >= Duration::from_millis(500) {
            last_status = now;
            if let Some(p) = &plan.loads_file {
                f.read_loads(p);
            }
            if let Some(p) = &plan.status_file {
                let lost_now = f.clients.iter().filter(|x| x.lost_at.is_some()).count();
                let tmp = p.with_extension("tmp");
                let line = format!(
                    "{} {} {} {}\n",
                    f.ready,
                    f.clients.len(),
                    lost_now,
                    c.messages
                );
                if std::fs::write(&tmp, line).is_ok() {
                    let _ = std::fs::rename(&tmp, p);
                }
            }
        }
        let wait = f
            .timers
            .peek()
            .map(|Reverse((at, _))| at.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(100))
            .min(Duration::from_millis(100));
        match f.poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
        for ev in events.iter() {
            let i = ev.token().0;
            if i >= f.clients.len() || f.clients[i].phase == Phase::Idle {
                continue;
            }
            if ev.is_writable() || ev.is_error() {
                let o = f.clients[i].on_writable(c);
                f.on_outcome(i, o, names, c);
                if f.clients[i].phase == Phase::Idle {
                    continue;
                }
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                let jitter = f.rng.unit();
                let o = f.clients[i].on_readable(&mut scratch, names, c, jitter);
                f.on_outcome(i, o, names, c);
            }
        }
    }
    c.ready_at_end = f.ready;
    c.ready_per_node = vec![0; n];
    for cl in f.clients.iter().filter(|x| x.phase == Phase::Ready) {
        if let Some(r) = c.ready_per_node.get_mut(cl.node) {
            *r += 1;
        }
    }
    c.lost_at_end = f.clients.iter().filter(|x| x.lost_at.is_some()).count() as u32;
    c.never_ready = f.clients.iter().filter(|x| !x.was_ready).count() as u32;
    Ok(f.clients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_loaded_skips_down_nodes_and_rotates_ties() {
        let now = Instant::now();
        let up = [now; 4];
        assert_eq!(least_loaded(&[5, 3, 3, 9], &up, now, 0), Some(1));
        assert_eq!(least_loaded(&[5, 3, 3, 9], &up, now, 1), Some(2));
        let mut down = up;
        down[1] = now + Duration::from_secs(2);
        assert_eq!(least_loaded(&[5, 3, 4, 9], &down, now, 0), Some(2));
        // A short loads line counts as full, never as empty.
        assert_eq!(least_loaded(&[5], &up, now, 0), Some(0));
        let all_down = [now + Duration::from_secs(2); 4];
        assert_eq!(least_loaded(&[0, 0, 0, 0], &all_down, now, 0), None);
    }
}
