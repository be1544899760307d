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
//! - Accept churn (`--churn-total`, default 1,000,000): besides the WebSocket churn,
//!   threads open and reset plain TCP connections at an even rate over the run (each
//!   closed with an RST, linger 0: no TIME_WAIT, so the port range holds). The RSS is
//!   read at every 100,000 connections (`churn.rss_per_100k`): a leak per accepted
//!   connection (the accept-loop waker list once held ~27 bytes each) shows there as a
//!   steady rise that the time-sampled slope hides under the WebSocket churn.

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
    /// Plain TCP connections opened and reset over the run (0: none).
    #[arg(long, default_value_t = 1_000_000)]
    churn_total: u64,
    /// Threads opening them.
    #[arg(long, default_value_t = 2)]
    churn_threads: usize,
}

/// Accept churn: `total` connect + RST pairs spread evenly over `duration`.
struct AcceptChurn {
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn start_accept_churn(t: &Target, a: &SoakArgs, start: Instant) -> AcceptChurn {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let n = a.churn_threads.max(1) as u64;
    let mut threads = Vec::new();
    for i in 0..n {
        let (done, failed) = (done.clone(), failed.clone());
        let addr = t.endpoint.addr;
        let share = a.churn_total / n + u64::from(i < a.churn_total % n);
        let duration = a.duration.max(1.0);
        threads.push(std::thread::spawn(move || {
            // Bounded: `share` connections, and never past the run's duration (+30 s).
            let hard = start + secs(duration + 30.0);
            for k in 0..share {
                // Even pacing: connection k of this thread is due at k/share of the run.
                let due = start + secs(duration * k as f64 / share as f64);
                let now = Instant::now();
                if now > hard {
                    break;
                }
                if due > now {
                    std::thread::sleep(due - now);
                }
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(s) => {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        done.fetch_add(1, Relaxed);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Relaxed);
                    }
                }
            }
        }));
    }
    AcceptChurn {
        done,
        failed,
        threads,
    }
}

/// The sampled series: every sample for the JSON line, and the (seconds, value)
/// points the slopes are fitted to.
#[derive(Default)]
struct Samples {
    json: Vec<Value>,
    rss: Vec<(f64, f64)>,
    fds: Vec<(f64, f64)>,
    /// RSS at each 100,000 churned connections: (connections, rss bytes).
    churn_rss: Vec<(u64, u64)>,
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
    churned: u64,
    churn_failed: u64,
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
            own_channel: false,
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
    let churn_run = start_accept_churn(t, a, start);
    let mut samples = Samples::default();
    sample_until_end(c, a, start, &subs, &pubs, &churn_run, &mut samples);
    // One last sample at the end, with the churn still running.
    samples.take(c, start, &subs);
    let flips = subs.shared.flips.load(Relaxed);
    pubs.shared.stop.store(true, Relaxed);
    let publish = join_publishers(pubs, channels);
    let s1 = snapshot(c);
    let subs = join_subscribers(subs);
    for h in churn_run.threads {
        let _ = h.join();
    }
    let churned = churn_run.done.load(Relaxed);
    let churn_failed = churn_run.failed.load(Relaxed);
    let o = Outcome {
        channels,
        churned,
        churn_failed,
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
    churn: &AcceptChurn,
    samples: &mut Samples,
) {
    let every = secs(a.sample_every.max(1.0));
    let mut next_sample = Instant::now();
    let mut last_progress = Instant::now();
    let end = start + secs(a.duration);
    // Bounded by the duration.
    let mut next_mark = 100_000u64;
    while Instant::now() < end {
        let churned = churn.done.load(Relaxed);
        if churned >= next_mark {
            samples
                .churn_rss
                .push((churned, snapshot(c).server.rss_bytes));
            next_mark = (churned / 100_000 + 1) * 100_000;
        }
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
                    "opened {} ready {} closed {} flips {} published {} delivered {} churned {}",
                    subs.shared.opened.load(Relaxed),
                    subs.shared.ready.load(Relaxed),
                    subs.shared.closed.load(Relaxed),
                    subs.shared.flips.load(Relaxed),
                    pubs.shared.accepted.load(Relaxed),
                    subs.shared.received.load(Relaxed),
                    churn.done.load(Relaxed)
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
        "mode": "soak", "target": t.kind.name(), "publish_api": t.publish.name(),
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
        "churn": {
            "connections": o.churned,
            "failed": o.churn_failed,
            "rss_per_100k": o.samples.churn_rss.iter()
                .map(|(n, rss)| json!({"connections": n, "rss_bytes": rss}))
                .collect::<Vec<_>>(),
            "rss_first_to_last_bytes": match (o.samples.churn_rss.first(), o.samples.churn_rss.last()) {
                (Some(a), Some(b)) => json!(b.1 as i64 - a.1 as i64),
                _ => Value::Null,
            },
        },
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
        ("TCP connections churned", o.churned.to_string()),
        (
            "RSS change over the churn",
            v["churn"]["rss_first_to_last_bytes"].to_string(),
        ),
        ("publishes accepted", p.accepted.to_string()),
        ("delivered", subs_t.received.to_string()),
        ("RSS slope bytes/min", format!("{rss_slope:?}")),
        ("fds slope /min", v["fds_slope_per_min"].to_string()),
    ]);
    v
}
