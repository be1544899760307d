//! `soak`: connection and subscription churn with mixed-size publishes for a long
//! run, sampling the server's RSS and fds, to tell a leak (steady growth after
//! warm-up) from noise. `loadtest/soak.sh` runs it against a fresh server.
//!
//! Invariants:
//! - Bounded by `--duration`; the subscriber threads' hard deadline is 30 s past it.
//! - Samples are taken on a fixed tick; ticks missed by a stalled machine are skipped,
//!   never bunched, so the slope is not skewed by a burst of close samples. One last
//!   sample is taken at the end with the churn still running.
//! - Samples before `--warmup` are kept in `samples` but left out of the slopes.

use crate::pubrun::{join_publishers, start_publishers, PubRun, PubSpec, PubTotals};
use crate::report::{cpu_json, progress, r1, snapshot, table, Snapshot};
use crate::stats::summarize;
use crate::subrun::{join_subscribers, start_subscribers, SubRun, SubSpec, SubTotals};
use crate::target::Target;
use crate::{secs, subs, trend, Common};
use clap::Args;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SoakArgs {
    #[arg(long, default_value_t = 2000)]
    conns: usize,
    #[arg(long, default_value_t = 100)]
    channels: u32,
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    #[arg(long, default_value_t = 1800.0)]
    duration: f64,
    #[arg(long, default_value_t = 10.0)]
    sample_every: f64,
    /// Samples before this many seconds are left out of the slope.
    #[arg(long, default_value_t = 60.0)]
    warmup: f64,
    #[arg(long, default_value_t = 5.0)]
    min_life: f64,
    #[arg(long, default_value_t = 60.0)]
    max_life: f64,
    #[arg(long, default_value_t = 5.0)]
    flip_every: f64,
    /// Publishes carry 0..=pad filler bytes (mixed sizes).
    #[arg(long, default_value_t = 2000)]
    pad: usize,
}

/// The sampled series: every sample for the JSON line, and the (seconds, value)
/// points the slopes are fitted to.
#[derive(Default)]
struct Samples {
    json: Vec<Value>,
    rss: Vec<(f64, f64)>,
    fds: Vec<(f64, f64)>,
}

impl Samples {
    fn take(&mut self, c: &Common, start: Instant, subs: &SubRun) {
        let s = snapshot(c);
        let x = start.elapsed().as_secs_f64();
        let open = subs
            .shared
            .ready
            .load(Relaxed)
            .saturating_sub(subs.shared.closed.load(Relaxed));
        self.json.push(
            json!({"t_s": r1(x), "rss_bytes": s.server.rss_bytes, "fds": s.server.fds,
                            "open": open, "opened": subs.shared.opened.load(Relaxed),
                            "flips": subs.shared.flips.load(Relaxed),
                            "delivered": subs.shared.received.load(Relaxed)}),
        );
        self.rss.push((x, s.server.rss_bytes as f64));
        self.fds.push((x, s.server.fds as f64));
    }
}

/// What one run measured, handed from the run's phases to its report.
struct Outcome {
    channels: u32,
    samples: Samples,
    flips: u64,
    publish: PubTotals,
    subs: SubTotals,
    s0: Snapshot,
    s1: Snapshot,
}

pub fn run(c: &Common, t: &Target, a: &SoakArgs) -> Result<Value, String> {
    let start = Instant::now();
    let channels = a.channels.max(1);
    let churn = subs::Churn {
        min_life: secs(a.min_life),
        max_life: secs(a.max_life.max(a.min_life)),
        flip_every: secs(a.flip_every.max(0.1)),
        channels,
    };
    let hard = start + secs(a.duration + 30.0);
    let s0 = snapshot(c);
    let subs = start_subscribers(
        c,
        t,
        SubSpec {
            n: a.conns,
            channels,
            inflight: 256,
            connect_timeout: 30.0,
            hard_deadline: hard,
            churn: Some(churn),
        },
    );
    let pubs = start_publishers(
        c,
        t,
        PubSpec {
            conns: 4,
            threads: 1,
            rate: Some(a.rate),
            duration: a.duration,
            channels,
            pipeline: 1,
            pad: a.pad,
            pad_vary: true,
            batch: 1,
        },
    );
    let mut samples = Samples::default();
    sample_until_end(c, a, start, &subs, &pubs, &mut samples);
    // One last sample at the end, with the churn still running.
    samples.take(c, start, &subs);
    let flips = subs.shared.flips.load(Relaxed);
    pubs.shared.stop.store(true, Relaxed);
    let publish = join_publishers(pubs, channels);
    let s1 = snapshot(c);
    let subs = join_subscribers(subs);
    let o = Outcome {
        channels,
        samples,
        flips,
        publish,
        subs,
        s0,
        s1,
    };
    Ok(report(c, t, a, &o))
}

/// Sample every `--sample-every` seconds, and print progress every second, until
/// `--duration` has passed.
fn sample_until_end(
    c: &Common,
    a: &SoakArgs,
    start: Instant,
    subs: &SubRun,
    pubs: &PubRun,
    samples: &mut Samples,
) {
    let every = secs(a.sample_every.max(1.0));
    let mut next_sample = Instant::now();
    let mut last_progress = Instant::now();
    let end = start + secs(a.duration);
    // Bounded by the duration.
    while Instant::now() < end {
        if Instant::now() >= next_sample {
            // Skip missed ticks (a stalled machine) instead of bunching samples.
            while next_sample <= Instant::now() {
                next_sample += every;
            }
            samples.take(c, start, subs);
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            progress(
                c,
                "soak",
                start,
                format!(
                    "opened {} ready {} closed {} flips {} published {} delivered {}",
                    subs.shared.opened.load(Relaxed),
                    subs.shared.ready.load(Relaxed),
                    subs.shared.closed.load(Relaxed),
                    subs.shared.flips.load(Relaxed),
                    pubs.shared.accepted.load(Relaxed),
                    subs.shared.received.load(Relaxed)
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON line, and the table on stderr.
fn report(c: &Common, t: &Target, a: &SoakArgs, o: &Outcome) -> Value {
    let (p, subs_t) = (&o.publish, &o.subs);
    let rss_trend = trend::summary(&o.samples.rss, a.warmup);
    let fds_trend = trend::summary(&o.samples.fds, a.warmup);
    let rss_slope = rss_trend["slope_per_min"].as_f64();
    let mut v = json!({
        "mode": "soak", "target": t.kind.name(),
        "params": {"conns": a.conns, "channels": o.channels, "rate": a.rate, "duration_s": a.duration,
                   "sample_every_s": a.sample_every, "warmup_s": a.warmup, "min_life_s": a.min_life,
                   "max_life_s": a.max_life, "flip_every_s": a.flip_every, "pad_max": a.pad},
        "publish": p.json,
        "received": subs_t.received,
        "subscription_changes": o.flips,
        "latency": summarize(&subs_t.latency).to_json(),
        "subscribers": subs_t.json,
        "samples": o.samples.json,
        "rss_slope_bytes_per_min": rss_slope,
        "fds_slope_per_min": fds_trend["slope_per_min"],
        "rss_after_warmup": rss_trend,
        "fds_after_warmup": fds_trend,
        "cpu": cpu_json(c, &o.s0, &o.s1, subs_t.received, "delivery"),
    });
    v["ok"] = json!(subs_t.received > 0);
    eprintln!(
        "soak against {} ({} conns churning, {}s):",
        t.kind.name(),
        a.conns,
        a.duration
    );
    table(&[
        ("connections opened", v["subscribers"]["opened"].to_string()),
        ("publishes accepted", p.accepted.to_string()),
        ("delivered", subs_t.received.to_string()),
        ("RSS slope bytes/min", format!("{rss_slope:?}")),
        ("fds slope /min", v["fds_slope_per_min"].to_string()),
    ]);
    v
}
