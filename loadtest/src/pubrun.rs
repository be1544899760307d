//! The publisher side of a scenario: spreads `conns` keep-alive connections and the
//! total rate over publisher threads (`publisher.rs`), and merges what each thread
//! measured into one set of totals and the `publish` JSON.
//!
//! Invariants: the threads together publish at the asked total rate (each gets an
//! equal share) and every thread has at least one connection; joining is bounded by
//! the publishers' own deadline plus their answer grace; a thread that panicked is
//! counted under `conn_errors`, never propagated.

use crate::report::r1;
use crate::stats::summarize;
use crate::target::Target;
use crate::{publisher, secs, stats, Common};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// What to publish: named fields, since most are numbers a call could swap unseen.
pub struct PubSpec {
    pub conns: usize,
    pub threads: usize,
    /// Total publishes per second; `None`: as fast as responses come back.
    pub rate: Option<f64>,
    pub duration: f64,
    pub channels: u32,
    /// Requests in flight per connection.
    pub pipeline: usize,
    pub pad: usize,
    /// Each publish gets 0..=pad filler bytes instead of exactly `pad`.
    pub pad_vary: bool,
    /// Messages per request (1: single publishes; more: batch publishes, ringcast only).
    pub batch: usize,
}

pub struct PubRun {
    pub shared: Arc<publisher::PubShared>,
    pub handles: Vec<std::thread::JoinHandle<publisher::PubResult>>,
}

pub fn start_publishers(c: &Common, t: &Target, spec: PubSpec) -> PubRun {
    let shared = Arc::new(publisher::PubShared::default());
    let threads = spec.threads.clamp(1, 64);
    let handles = (0..threads)
        .map(|i| {
            let plan = publisher::PubPlan {
                target: t.for_publishers(),
                conns: (spec.conns / threads + usize::from(i < spec.conns % threads)).max(1),
                rate: spec.rate.map(|r| r / threads as f64),
                duration: secs(spec.duration),
                channels: spec.channels.max(1),
                thread_idx: i,
                threads,
                pipeline: spec.pipeline,
                pad: spec.pad,
                pad_vary: spec.pad_vary,
                batch: spec.batch,
                source_ips: c.source_ips,
                answer_grace: Duration::from_secs(5),
            };
            let sh = shared.clone();
            std::thread::spawn(move || publisher::run(plan, sh))
        })
        .collect();
    PubRun { shared, handles }
}

pub struct PubTotals {
    pub statuses: BTreeMap<u16, u64>,
    pub accepted_per_channel: Vec<u64>,
    pub accepted: u64,
    pub sent: u64,
    pub unanswered: u64,
    pub response: hdrhistogram::Histogram<u64>,
    pub max_lag: Duration,
    pub elapsed: Duration,
    pub json: Value,
}

/// Wait for every publisher thread and merge what they measured.
pub fn join_publishers(run: PubRun, channels: u32) -> PubTotals {
    let mut t = PubTotals {
        statuses: BTreeMap::new(),
        accepted_per_channel: vec![0; channels.max(1) as usize],
        accepted: 0,
        sent: 0,
        unanswered: 0,
        response: stats::new_histogram(),
        max_lag: Duration::ZERO,
        elapsed: Duration::ZERO,
        json: json!({}),
    };
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for h in run.handles {
        let Ok(r) = h.join() else {
            *errors
                .entry("publisher thread panicked".into())
                .or_default() += 1;
            continue;
        };
        for (k, v) in r.statuses {
            *t.statuses.entry(k).or_default() += v;
        }
        for (i, a) in r.accepted_per_channel.iter().enumerate() {
            if let Some(x) = t.accepted_per_channel.get_mut(i) {
                *x += a;
            }
        }
        t.sent += r.sent;
        t.unanswered += r.unanswered;
        let _ = t.response.add(&r.response);
        t.max_lag = t.max_lag.max(r.max_lag);
        t.elapsed = t.elapsed.max(r.elapsed);
        for (k, v) in r.conn_errors {
            *errors.entry(k.to_string()).or_default() += v;
        }
    }
    t.accepted = t.accepted_per_channel.iter().sum();
    let statuses: BTreeMap<String, u64> = t
        .statuses
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    t.json = json!({
        "sent": t.sent, "accepted_2xx": t.accepted, "unanswered": t.unanswered,
        "status": status_classes(&t.statuses), "status_exact": statuses, "conn_errors": errors,
        "max_schedule_lag_ms": r1(t.max_lag.as_secs_f64() * 1000.0),
        "response_latency": summarize(&t.response).to_json(),
    });
    t
}

/// HTTP statuses folded into the classes a reader compares across targets; every
/// class is present (0 when unseen) so scripts need not guard against a missing key.
fn status_classes(statuses: &BTreeMap<u16, u64>) -> BTreeMap<&'static str, u64> {
    let mut classes = BTreeMap::from([
        ("202", 0u64),
        ("2xx_other", 0),
        ("429", 0),
        ("503", 0),
        ("other", 0),
    ]);
    for (&s, &n) in statuses {
        let k = match s {
            202 => "202",
            // Nchan answers 201 (delivered) or 202 (queued, no subscriber).
            200..=299 => "2xx_other",
            429 => "429",
            503 => "503",
            _ => "other",
        };
        *classes.entry(k).or_default() += n;
    }
    classes
}
