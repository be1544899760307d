//! `publish`: M keep-alive connections posting as fast as responses come back (or at
//! `--rate`), no subscribers; measures the server's publish path alone.
//!
//! Invariants: bounded by the publishers' own deadline plus their answer grace; the
//! run is `ok` when at least one publish was accepted; the server's CPU is charged
//! per accepted publish (`server_cpu_us_per_accepted_publish`), the figure the suite
//! summary reads.

use crate::pubrun::{join_publishers, start_publishers, PubRun, PubSpec, PubTotals};
use crate::report::{cpu_json, progress, snapshot, table, Snapshot};
use crate::target::Target;
use crate::Common;
use clap::Args;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct PublishArgs {
    #[arg(long, default_value_t = 64)]
    conns: usize,
    /// Total publishes per second; default: as fast as responses come back.
    #[arg(long)]
    rate: Option<f64>,
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Requests in flight per connection (HTTP/1.1 pipelining).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    #[arg(long, default_value_t = 1)]
    channels: u32,
    /// Publisher threads.
    #[arg(long, default_value_t = 1)]
    pub_threads: usize,
    #[arg(long, default_value_t = 0)]
    pad: usize,
    /// Messages per request: more than 1 uses `POST /api/v1/publish/batch` (ringcast);
    /// `accepted` and the CPU per publish then count messages, not requests.
    #[arg(long, default_value_t = 1)]
    batch: usize,
}

pub fn run(c: &Common, t: &Target, a: &PublishArgs) -> Result<Value, String> {
    let start = Instant::now();
    let s0 = snapshot(c);
    let pubs = start_publishers(
        c,
        t,
        PubSpec {
            conns: a.conns,
            threads: a.pub_threads,
            rate: a.rate,
            duration: a.duration,
            channels: a.channels,
            pipeline: a.pipeline,
            pad: a.pad,
            pad_vary: false,
            batch: a.batch,
        },
    );
    watch(c, start, &pubs);
    let s1 = snapshot(c);
    let p = join_publishers(pubs, a.channels);
    Ok(report(c, t, a, &p, &s0, &s1))
}

/// Progress once a second until every publisher thread has finished.
fn watch(c: &Common, start: Instant, pubs: &PubRun) {
    let mut last = (Instant::now(), 0u64);
    // Bounded: publishers end at their deadline plus a grace period.
    while pubs.handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if last.0.elapsed() >= Duration::from_secs(1) {
            let acc = pubs.shared.accepted.load(Relaxed);
            let rate = (acc - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), acc);
            progress(
                c,
                "publish",
                start,
                format!(
                    "sent {} accepted {acc} ({rate:.0}/s)",
                    pubs.shared.sent.load(Relaxed)
                ),
            );
        }
    }
}

/// The JSON line, and the table on stderr.
fn report(
    c: &Common,
    t: &Target,
    a: &PublishArgs,
    p: &PubTotals,
    s0: &Snapshot,
    s1: &Snapshot,
) -> Value {
    let secs_run = p.elapsed.as_secs_f64().max(1e-9);
    let mut v = json!({
        "mode": "publish", "target": t.kind.name(), "publish_api": t.publish.name(),
        "params": {"conns": a.conns, "rate": a.rate, "duration_s": a.duration, "pipeline": a.pipeline,
                   "channels": a.channels, "pub_threads": a.pub_threads, "pad": a.pad,
                   "batch": a.batch},
        "publish": p.json,
        "requests_per_s": (p.statuses.values().sum::<u64>() as f64 / secs_run).round(),
        "accepted_per_s": (p.accepted as f64 / secs_run).round(),
        "cpu": cpu_json(c, s0, s1, p.accepted, "accepted_publish"),
    });
    v["ok"] = json!(p.accepted > 0);
    eprintln!(
        "publish against {} ({} conns, {:.0}s):",
        t.kind.name(),
        a.conns,
        a.duration
    );
    table(&[
        ("requests/s", v["requests_per_s"].to_string()),
        ("accepted (2xx)", p.accepted.to_string()),
        ("status", v["publish"]["status"].to_string()),
        (
            "response p50/p99 us",
            format!(
                "{} / {}",
                v["publish"]["response_latency"]["p50_us"],
                v["publish"]["response_latency"]["p99_us"]
            ),
        ),
        (
            "server CPU us/publish",
            v["cpu"]["server_cpu_us_per_accepted_publish"].to_string(),
        ),
        ("harness CPU %", v["cpu"]["harness_cpu_pct"].to_string()),
    ]);
    v
}
