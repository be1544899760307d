//! The storm publisher: keeps publishing through the storm to the common channel and
//! to the clients' own channels, each publish with its own `Idempotency-Key`; a publish
//! that fails on one node (connection refused or reset, no answer, 5xx) is sent again,
//! byte for byte with the same key, to the next node (issue 22: a retry is answered
//! from the key, never published twice). Records every accepted (channel, offset, epoch).
//!
//! Invariants:
//! - Blocking sockets with timeouts, one per thread: a few hundred publishes a second
//!   need no event loop, and a node that dies mid-request costs one timeout at most.
//! - A publish is given up only after `GIVE_UP` of retrying (counted, never silent).

use super::fields;
use crate::http::parse_response;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long one publish is retried over the nodes before it counts as failed.
const GIVE_UP: Duration = Duration::from_secs(60);
/// Read/write timeout of one attempt.
const IO_TIMEOUT: Duration = Duration::from_secs(3);

/// What one publisher thread does.
pub struct PubPlan {
    pub nodes: Vec<SocketAddr>,
    pub host_of: Vec<String>,
    pub secret_key: String,
    /// Channels this thread publishes to, in turn.
    pub channels: Vec<String>,
    /// Publishes per second of this thread.
    pub rate: f64,
    pub until: Instant,
    pub stop_file: Option<std::path::PathBuf>,
    /// Unique per run and thread: keys are `<key_prefix>-<n>`.
    pub key_prefix: String,
    pub first_node: usize,
}

/// What it got.
#[derive(Debug, Default)]
pub struct PubOut {
    /// `channel offset epoch` lines.
    pub accepted: Vec<String>,
    pub publishes: u64,
    /// Attempts sent again (to another node, or the same after a 409/429).
    pub retries: u64,
    /// Answers marked `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// Accepted without a position (history off?).
    pub unpositioned: u64,
    /// Given up after `GIVE_UP`, or refused with a 4xx that no retry fixes.
    pub failed: u64,
    pub statuses: std::collections::BTreeMap<u16, u64>,
}

struct Conn {
    node: usize,
    sock: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    /// One request/response on the current node; `None` on any transport failure.
    fn exchange(&mut self, plan: &PubPlan, req: &[u8]) -> Option<(u16, bool, Vec<u8>)> {
        if self.sock.is_none() {
            let s = TcpStream::connect_timeout(&plan.nodes[self.node], IO_TIMEOUT).ok()?;
            s.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
            s.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
            let _ = s.set_nodelay(true);
            self.sock = Some(s);
        }
        let s = self.sock.as_mut()?;
        if s.write_all(req).is_err() {
            self.sock = None;
            return None;
        }
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match parse_response(&self.buf, false) {
                Ok(Some(r)) => {
                    let head = &self.buf[..r.head_len];
                    let replayed = contains_ci(head, b"idempotent-replayed: true");
                    let body = self.buf[r.head_len..r.total_len].to_vec();
                    if r.close {
                        self.sock = None;
                    }
                    return Some((r.status, replayed, body));
                }
                Ok(None) => {}
                Err(_) => {
                    self.sock = None;
                    return None;
                }
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    self.sock = None;
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn next_node(&mut self, n: usize) {
        self.sock = None;
        self.node = (self.node + 1) % n;
    }
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// The publish request for `body` with `key`, for node `node`.
fn request(plan: &PubPlan, node: usize, key: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: {}\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        plan.host_of[node],
        plan.secret_key,
        body.len()
    )
    .into_bytes()
}

/// Publish at the plan's rate until its end; every publish is retried to acceptance
/// (or `GIVE_UP`) before the next.
pub fn run(plan: PubPlan) -> PubOut {
    let mut out = PubOut::default();
    let n = plan.nodes.len();
    let mut conn = Conn {
        node: plan.first_node % n.max(1),
        sock: None,
        buf: Vec::new(),
    };
    if n == 0 || plan.channels.is_empty() || plan.rate <= 0.0 {
        return out;
    }
    let start = Instant::now();
    let mut seq: u64 = 0;
    loop {
        let now = Instant::now();
        if now >= plan.until || plan.stop_file.as_ref().is_some_and(|p| p.exists()) {
            break;
        }
        let due = start + Duration::from_secs_f64(seq as f64 / plan.rate);
        if due > now {
            std::thread::sleep((due - now).min(Duration::from_millis(100)));
            continue;
        }
        let ch = &plan.channels[(seq as usize) % plan.channels.len()];
        let key = format!("{}-{seq}", plan.key_prefix);
        // `t`: the send time, for the clients' publish→delivery latency (a retry sends the
        // same bytes, so a failover's delay counts in its latency).
        let body = format!(
            r#"{{"channel":"{ch}","event":"s","data":{{"k":{seq},"t":{}}}}}"#,
            crate::stats::unix_ns()
        );
        seq += 1;
        out.publishes += 1;
        let first = Instant::now();
        let mut tries = 0u32;
        loop {
            if first.elapsed() > GIVE_UP {
                out.failed += 1;
                break;
            }
            if tries > 0 {
                out.retries += 1;
            }
            tries += 1;
            let req = request(&plan, conn.node, &key, &body);
            let Some((status, replayed, resp)) = conn.exchange(&plan, &req) else {
                conn.next_node(n);
                // Every node refused in a row: do not spin.
                if tries as usize % n == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                continue;
            };
            *out.statuses.entry(status).or_default() += 1;
            match status {
                202 => {
                    if replayed {
                        out.replayed += 1;
                    }
                    match (fields::u64_field(&resp, "offset"), fields::epoch(&resp)) {
                        (Some(o), Some(e)) => out
                            .accepted
                            .push(format!("{ch} {o} {}", String::from_utf8_lossy(&e))),
                        _ => out.unpositioned += 1,
                    }
                    break;
                }
                409 | 429 => std::thread::sleep(Duration::from_millis(250)),
                s if s >= 500 => {
                    conn.next_node(n);
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    out.failed += 1;
                    break;
                }
            }
        }
    }
    out
}
