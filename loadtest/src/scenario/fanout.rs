//! `fanout`: N WebSocket subscribers over K channels, publishers at a fixed total
//! rate for D seconds, then a drain for late deliveries; measures delivery
//! (expected, received, duplicates), publish-to-delivery latency and the server's
//! CPU per delivery. `ramp` runs one of these per step.
//!
//! Invariants:
//! - Every phase is bounded: connecting by `--connect-timeout`, publishing by
//!   `--duration` plus the publishers' answer grace, draining by `--drain`, and the
//!   subscriber threads by a hard deadline covering all three.
//! - Expected = Σ over channels of (ready subscribers × accepted publishes), from the
//!   counts the threads report at the end; a subscriber closed mid-run still counts,
//!   so a loss shows in `delivery_ratio`.
//! - The CPU window starts once the subscribers are ready and ends after the drain,
//!   so connecting is never charged to deliveries.
//! - `ok` only when something was expected and every expected delivery arrived
//!   exactly once.

use crate::pubrun::{join_publishers, start_publishers, PubRun, PubSpec, PubTotals};
use crate::report::{cpu_json, progress, r3, snapshot, table, Snapshot};
use crate::stats::{summarize, LatencySummary};
use crate::subrun::{join_subscribers, start_subscribers, wait_ready, SubRun, SubSpec, SubTotals};
use crate::target::Target;
use crate::{secs, Common};
use clap::Args;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct FanoutArgs {
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    #[arg(long, default_value_t = 1)]
    pub channels: u32,
    /// Total publishes per second.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    #[arg(long, default_value_t = 4)]
    pub pub_conns: usize,
    #[arg(long, default_value_t = 1)]
    pub pub_threads: usize,
    /// Seconds to wait for late deliveries after the last publish.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    #[arg(long, default_value_t = 60.0)]
    pub connect_timeout: f64,
    /// Handshakes in flight per subscriber thread.
    #[arg(long, default_value_t = 256)]
    pub inflight: usize,
    #[arg(long, default_value_t = 0)]
    pub pad: usize,
    /// Messages per publish request: more than 1 uses `POST /api/v1/publish/batch`
    /// (ringcast); `--rate` still counts messages.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Also subscribe every subscriber to a channel of its own (the `scale` scenario's
    /// second subscription); nothing is published there, so no delivery is expected.
    #[arg(long)]
    pub own_channel: bool,
}

/// What one run measured, handed from the run's phases to its report.
struct Outcome {
    /// `--channels`, at least 1.
    channels: u32,
    ready: u64,
    connect_time: Duration,
    publish: PubTotals,
    subs: SubTotals,
    expected: u64,
    /// Taken once the subscribers are ready: the start of the CPU window.
    s0: Snapshot,
    s1: Snapshot,
    publish_end: Instant,
    delivered_at: Instant,
}

impl Outcome {
    /// Received over expected; 0 when nothing was expected (no subscriber or no
    /// accepted publish), so an empty run never reads as perfect.
    fn ratio(&self) -> f64 {
        if self.expected > 0 {
            self.subs.received as f64 / self.expected as f64
        } else {
            0.0
        }
    }
}

pub fn run(c: &Common, t: &Target, a: &FanoutArgs) -> Result<Value, String> {
    let start = Instant::now();
    let channels = a.channels.max(1);
    let (subs, connect_time) = connect(c, t, a, channels, start);
    let ready = subs.shared.ready.load(Relaxed);
    progress(
        c,
        "fanout",
        start,
        format!(
            "{ready}/{} subscribers ready in {:.2}s",
            a.subs,
            connect_time.as_secs_f64()
        ),
    );

    let s0 = snapshot(c);
    let pubs = start_publishers(
        c,
        t,
        PubSpec {
            conns: a.pub_conns,
            threads: a.pub_threads,
            rate: Some(a.rate),
            duration: a.duration,
            channels,
            pipeline: 1,
            pad: a.pad,
            pad_vary: false,
            batch: a.batch,
        },
    );
    watch_publishing(c, start, &pubs, &subs);
    let publish_end = Instant::now();
    let publish = join_publishers(pubs, channels);

    drain(&subs, ready, &publish, channels, a.drain);
    let delivered_at = Instant::now();
    let s1 = snapshot(c);
    let subs = join_subscribers(subs);
    let expected = expected_deliveries(&subs, &publish);
    let o = Outcome {
        channels,
        ready,
        connect_time,
        publish,
        subs,
        expected,
        s0,
        s1,
        publish_end,
        delivered_at,
    };
    Ok(report(c, t, a, &o))
}

/// Open every subscriber and wait until each is ready or failed.
fn connect(
    c: &Common,
    t: &Target,
    a: &FanoutArgs,
    channels: u32,
    start: Instant,
) -> (SubRun, Duration) {
    // Covers every phase with room to spare: the threads must outlive the drain.
    let hard = start + secs(a.connect_timeout + a.duration + a.drain + 30.0);
    let subs = start_subscribers(
        c,
        t,
        SubSpec {
            n: a.subs,
            channels,
            inflight: a.inflight,
            connect_timeout: a.connect_timeout,
            hard_deadline: hard,
            churn: None,
            own_channel: a.own_channel,
        },
    );
    let connect_time = wait_ready(c, "fanout", &subs, a.connect_timeout);
    (subs, connect_time)
}

/// Progress once a second until every publisher thread has finished.
fn watch_publishing(c: &Common, start: Instant, pubs: &PubRun, subs: &SubRun) {
    let mut last = (Instant::now(), 0u64);
    // Bounded: publishers end at their deadline plus a grace period.
    while pubs.handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if last.0.elapsed() >= Duration::from_secs(1) {
            let rec = subs.shared.received.load(Relaxed);
            let rate = (rec - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), rec);
            progress(
                c,
                "fanout",
                start,
                format!(
                    "published {} accepted {} delivered {rec} ({rate:.0}/s) closed {}",
                    pubs.shared.sent.load(Relaxed),
                    pubs.shared.accepted.load(Relaxed),
                    subs.shared.closed.load(Relaxed)
                ),
            );
        }
    }
}

/// Wait up to `drain` seconds for late deliveries, returning early once the
/// estimated count has arrived.
fn drain(subs: &SubRun, ready: u64, p: &PubTotals, channels: u32, drain: f64) {
    // Expected deliveries need the per-channel ready counts, which live in the
    // threads; approximate progress with the total until the threads report.
    let expected_est: u64 = if channels == 1 {
        ready * p.accepted
    } else {
        ready * p.accepted / u64::from(channels)
    };
    let drain_deadline = Instant::now() + secs(drain);
    while Instant::now() < drain_deadline && subs.shared.received.load(Relaxed) < expected_est {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Σ over channels of (subscribers ready on it × publishes accepted for it).
fn expected_deliveries(subs: &SubTotals, p: &PubTotals) -> u64 {
    subs.ready_per_channel
        .iter()
        .map(|(ch, n)| {
            n * p
                .accepted_per_channel
                .get(*ch as usize)
                .copied()
                .unwrap_or(0)
        })
        .sum()
}

/// The JSON line, and the table on stderr.
fn report(c: &Common, t: &Target, a: &FanoutArgs, o: &Outcome) -> Value {
    let lat = summarize(&o.subs.latency);
    let v = summary(c, t, a, o, &lat);
    print_table(t, a, o, &v, &lat);
    v
}

fn summary(c: &Common, t: &Target, a: &FanoutArgs, o: &Outcome, lat: &LatencySummary) -> Value {
    let (p, subs_t, expected) = (&o.publish, &o.subs, o.expected);
    let deliver_window = o
        .delivered_at
        .duration_since(o.s0.at)
        .as_secs_f64()
        .max(1e-9);
    let mut v = json!({
        "mode": "fanout", "target": t.kind.name(), "publish_api": t.publish.name(),
        "params": {"subs": a.subs, "channels": o.channels, "rate": a.rate, "duration_s": a.duration,
                   "pub_conns": a.pub_conns, "threads": c.threads, "pad": a.pad, "batch": a.batch, "own_channel": a.own_channel,
                   "publish_url": c.publish_url},
        "subscribers_ready": o.ready,
        "connect_time_s": r3(o.connect_time.as_secs_f64()),
        "connect_latency": summarize(&subs_t.connect).to_json(),
        "publish": p.json,
        "expected": expected, "received": subs_t.received, "duplicates": subs_t.duplicates,
        "reordered": subs_t.reordered,
        "untracked_seq": subs_t.untracked,
        "delivery_ratio": (o.ratio() * 1e6).round() / 1e6,
        "deliveries_per_s": (subs_t.received as f64 / deliver_window).round(),
        "drain_s": r3(o.delivered_at.duration_since(o.publish_end).as_secs_f64()),
        "latency": lat.to_json(),
        "subscribers": subs_t.json,
        "cpu": cpu_json(c, &o.s0, &o.s1, subs_t.received, "delivery"),
    });
    v["ok"] = json!(expected > 0 && subs_t.received == expected && subs_t.duplicates == 0);
    v
}

fn print_table(t: &Target, a: &FanoutArgs, o: &Outcome, v: &Value, lat: &LatencySummary) {
    let (p, subs_t, expected) = (&o.publish, &o.subs, o.expected);
    eprintln!(
        "fanout against {} ({} subs, {} channels, {}/s for {}s):",
        t.kind.name(),
        a.subs,
        o.channels,
        a.rate,
        a.duration
    );
    table(&[
        (
            "subscribers ready",
            format!("{} in {:.2}s", o.ready, o.connect_time.as_secs_f64()),
        ),
        (
            "publishes accepted",
            format!("{} of {} ({})", p.accepted, p.sent, v["publish"]["status"]),
        ),
        (
            "delivered / expected",
            format!(
                "{} / {expected} (ratio {:.6}, dup {}, reordered {})",
                subs_t.received,
                o.ratio(),
                subs_t.duplicates,
                subs_t.reordered
            ),
        ),
        ("deliveries/s", v["deliveries_per_s"].to_string()),
        (
            "latency p50/p90/p99/p99.9/max ms",
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2} / {:.2}",
                lat.p50_us / 1e3,
                lat.p90_us / 1e3,
                lat.p99_us / 1e3,
                lat.p999_us / 1e3,
                lat.max_us / 1e3
            ),
        ),
        (
            "server CPU us/delivery",
            v["cpu"]["server_cpu_us_per_delivery"].to_string(),
        ),
        ("server CPU %", v["cpu"]["server_cpu_pct"].to_string()),
        ("harness CPU %", v["cpu"]["harness_cpu_pct"].to_string()),
    ]);
}
