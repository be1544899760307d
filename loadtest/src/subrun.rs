//! The subscriber side of a scenario: spreads N WebSocket subscribers over the
//! `--threads` epoll threads of `subs.rs`, waits for them to connect, and merges
//! what each thread measured into one set of totals and the `subscribers` JSON.
//!
//! Invariants: subscriber `i` always listens on channel `i % channels`, so the
//! expected delivery count can be computed from the per-channel ready counts alone;
//! every wait here is bounded (`connect_timeout`, and each thread's hard deadline);
//! a thread that panicked is counted under `failures`, never propagated.

use crate::report::progress;
use crate::target::Target;
use crate::{secs, stats, subs, Common};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to open: named fields, since several are numbers a call could swap unseen.
pub struct SubSpec {
    pub n: usize,
    /// 0: connect-only idle connections, no subscribe frames.
    pub channels: u32,
    /// Handshakes in flight per thread.
    pub inflight: usize,
    pub connect_timeout: f64,
    pub hard_deadline: Instant,
    pub churn: Option<subs::Churn>,
    /// Also subscribe every connection to a channel of its own (`scale`): what a
    /// second subscription per connection costs the server.
    pub own_channel: bool,
}

pub struct SubRun {
    pub shared: Arc<subs::Shared>,
    pub handles: Vec<std::thread::JoinHandle<subs::SubResult>>,
    pub total: usize,
}

pub fn start_subscribers(c: &Common, t: &Target, spec: SubSpec) -> SubRun {
    let shared = Arc::new(subs::Shared::default());
    let threads = c.threads.clamp(1, 64);
    let mut handles = Vec::new();
    for th in 0..threads {
        let conns: Vec<(usize, u32)> = (th..spec.n)
            .step_by(threads)
            .map(|i| {
                (
                    i,
                    if spec.channels == 0 {
                        0
                    } else {
                        (i % spec.channels as usize) as u32
                    },
                )
            })
            .collect();
        let plan = subs::SubPlan {
            target: t.clone(),
            // channels == 0: connect-only idle connections, no subscribe frames.
            subscribe: spec.channels > 0,
            conns,
            source_ips: c.source_ips,
            max_inflight: spec.inflight.max(1),
            connect_timeout: secs(spec.connect_timeout),
            hard_deadline: spec.hard_deadline,
            churn: spec.churn,
            own_channel: spec.own_channel,
        };
        let sh = shared.clone();
        handles.push(std::thread::spawn(move || subs::run(plan, sh)));
    }
    SubRun {
        shared,
        handles,
        total: spec.n,
    }
}

/// Wait until every subscriber is ready or failed (bounded by `timeout`).
pub fn wait_ready(c: &Common, mode: &str, run: &SubRun, timeout: f64) -> Duration {
    let start = Instant::now();
    let deadline = start + secs(timeout + 1.0);
    let mut last = Instant::now();
    loop {
        let ready = run.shared.ready.load(Relaxed);
        let failed = run.shared.failed.load(Relaxed);
        if ready + failed >= run.total as u64 || Instant::now() >= deadline {
            return start.elapsed();
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            progress(
                c,
                mode,
                start,
                format!("connecting: ready {ready}/{} failed {failed}", run.total),
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub struct SubTotals {
    pub latency: hdrhistogram::Histogram<u64>,
    pub connect: hdrhistogram::Histogram<u64>,
    pub received: u64,
    pub duplicates: u64,
    /// Deliveries whose seq was below one this subscriber had already received.
    pub reordered: u64,
    pub untracked: u64,
    pub ready_per_channel: BTreeMap<u32, u64>,
    pub json: Value,
}

/// Stop every subscriber thread and merge what they measured.
pub fn join_subscribers(run: SubRun) -> SubTotals {
    run.shared.stop.store(true, Relaxed);
    let mut t = SubTotals {
        latency: stats::new_histogram(),
        connect: stats::new_histogram(),
        received: 0,
        duplicates: 0,
        reordered: 0,
        untracked: 0,
        ready_per_channel: BTreeMap::new(),
        json: json!({}),
    };
    let mut closes: BTreeMap<String, u64> = BTreeMap::new();
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let (mut server_errors, mut fragmented, mut opened) = (0, 0, 0);
    for h in run.handles {
        let Ok(r) = h.join() else {
            *failures
                .entry("subscriber thread panicked".into())
                .or_default() += 1;
            continue;
        };
        let _ = t.latency.add(&r.latency);
        let _ = t.connect.add(&r.connect);
        t.received += r.received;
        t.duplicates += r.duplicates;
        t.reordered += r.reordered;
        t.untracked += r.untracked;
        for (k, v) in r.ready_per_channel {
            *t.ready_per_channel.entry(k).or_default() += v;
        }
        for (k, v) in r.close_codes {
            *closes.entry(k.to_string()).or_default() += v;
        }
        for (k, v) in r.refused {
            *refused.entry(k.to_string()).or_default() += v;
        }
        for (k, v) in r.failures {
            *failures.entry(k.to_string()).or_default() += v;
        }
        server_errors += r.server_errors;
        fragmented += r.fragmented;
        opened += r.opened;
    }
    t.json = json!({
        "close_codes": closes, "refused_status": refused, "failures": failures,
        "server_error_frames": server_errors, "fragmented": fragmented, "opened": opened,
    });
    t
}
