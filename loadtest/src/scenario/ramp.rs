//! `ramp`: one `fanout` per step with the rate raised (doubled, then bisected) until a
//! step fails, reporting the highest passing rate and its sustained deliveries/s.
//! This module drives the steps and writes the report; the search itself and the
//! pass/fail judgement are pure and tested in `crate::ramp`.
//!
//! Invariants:
//! - At most `--max-steps` steps (capped at 40), each a complete fanout bounded by
//!   its own deadlines, so the whole run is bounded.
//! - Every step subscribes under its own channel tag, so a late message of one step
//!   can never count in another.
//! - A step where no subscriber connected aborts the search (the server is gone or
//!   refusing, and no rate would pass); the run is then not `ok`.

use super::fanout::{self, FanoutArgs};
use crate::ramp::{judge, step_json, Search};
use crate::report::{progress, r1, table};
use crate::target::Target;
use crate::{secs, Common};
use clap::Args;
use serde_json::{json, Value};
use std::time::Instant;

#[derive(Args)]
pub struct RampArgs {
    #[arg(long, default_value_t = 10000)]
    subs: usize,
    #[arg(long, default_value_t = 1)]
    channels: u32,
    /// Publishes per second of the first step.
    #[arg(long, default_value_t = 1.0)]
    start_rate: f64,
    #[arg(long, default_value_t = 0.1)]
    min_rate: f64,
    #[arg(long, default_value_t = 100000.0)]
    max_rate: f64,
    /// Seconds of publishing per step.
    #[arg(long, default_value_t = 5.0)]
    step_duration: f64,
    /// Seconds to wait for late deliveries after each step's last publish.
    #[arg(long, default_value_t = 3.0)]
    drain: f64,
    #[arg(long, default_value_t = 250.0)]
    p99_limit_ms: f64,
    /// Bisection stops when the lowest failing rate is within this fraction of the best pass.
    #[arg(long, default_value_t = 0.1)]
    tolerance: f64,
    #[arg(long, default_value_t = 12)]
    max_steps: usize,
    /// Seconds of pause between steps (closed connections settle).
    #[arg(long, default_value_t = 2.0)]
    pause: f64,
    #[arg(long, default_value_t = 8)]
    pub_conns: usize,
    #[arg(long, default_value_t = 60.0)]
    connect_timeout: f64,
    #[arg(long, default_value_t = 256)]
    inflight: usize,
}

/// The flags turned into what the steps need.
struct Plan {
    /// The fanout of every step; `rate` is replaced by the search's.
    fanout: FanoutArgs,
    search: Search,
    p99_limit_ms: f64,
    pause: f64,
}

impl RampArgs {
    fn plan(&self) -> Plan {
        Plan {
            fanout: FanoutArgs {
                subs: self.subs,
                channels: self.channels,
                rate: self.start_rate,
                duration: self.step_duration,
                pub_conns: self.pub_conns,
                pub_threads: 1,
                drain: self.drain,
                connect_timeout: self.connect_timeout,
                inflight: self.inflight,
                pad: 0,
                batch: 1,
                own_channel: false,
            },
            search: Search::new(
                self.start_rate,
                self.min_rate,
                self.max_rate,
                self.tolerance,
                self.max_steps.min(40),
            ),
            p99_limit_ms: self.p99_limit_ms,
            pause: self.pause,
        }
    }
}

/// Every step's record, the best passing one, and why the search stopped early.
#[derive(Default)]
struct StepLog {
    steps: Vec<Value>,
    best: Option<Value>,
    aborted: Option<String>,
}

pub fn run(c: &Common, t: &Target, a: &RampArgs) -> Result<Value, String> {
    let plan = a.plan();
    let start = Instant::now();
    let log = climb(c, t, &plan, start)?;
    Ok(report(c, t, &plan, &log, start))
}

/// Run steps until the search is over (or a step finds no subscriber).
fn climb(c: &Common, t: &Target, plan: &Plan, start: Instant) -> Result<StepLog, String> {
    let mut search = plan.search.clone();
    let mut log = StepLog::default();
    // Bounded: the search ends after at most max_steps (<= 40) steps.
    while let Some(rate) = search.next() {
        let fa = FanoutArgs {
            rate,
            ..plan.fanout
        };
        let v = run_step(c, t, &fa, search.steps, start)?;
        if v["subscribers_ready"].as_u64() == Some(0) {
            log.aborted = Some(format!("step at {rate}/s: no subscriber connected"));
            break;
        }
        let (pass, why) = judge(&v, rate, fa.duration, plan.p99_limit_ms);
        let step = step_json(&v, rate, fa.duration, pass, &why);
        eprintln!(
            "ramp step {}: {rate}/s {} ({}) p99 {} ms, {} deliveries/s",
            search.steps + 1,
            if pass { "PASS" } else { "FAIL" },
            if why.is_empty() { "ok" } else { why.as_str() },
            step["p99_ms"],
            step["sustained_deliveries_per_s"]
        );
        search.record(rate, pass);
        if pass
            && log
                .best
                .as_ref()
                .map_or(true, |b| b["rate"].as_f64() < Some(rate))
        {
            log.best = Some(step.clone());
        }
        log.steps.push(step);
        if search.next().is_some() {
            std::thread::sleep(secs(plan.pause));
        }
    }
    Ok(log)
}

/// One step: a complete fanout under a channel tag of its own.
fn run_step(
    c: &Common,
    t: &Target,
    fa: &FanoutArgs,
    steps_done: usize,
    start: Instant,
) -> Result<Value, String> {
    let mut st = t.clone();
    st.tag = format!("{}s{}", t.tag, steps_done);
    let rate = fa.rate;
    progress(
        c,
        "ramp",
        start,
        format!(
            "step {}: {rate}/s x {} subs for {}s",
            steps_done + 1,
            fa.subs,
            fa.duration
        ),
    );
    fanout::run(c, &st, fa)
}

/// The failed step with the lowest rate: how close above the best pass the limit is.
fn lowest_failure(steps: &[Value]) -> Option<Value> {
    steps
        .iter()
        .filter(|s| s["pass"] == json!(false))
        .min_by(|x, y| {
            x["rate"]
                .as_f64()
                .partial_cmp(&y["rate"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned()
}

/// The JSON line, and the table on stderr.
fn report(c: &Common, t: &Target, plan: &Plan, log: &StepLog, start: Instant) -> Value {
    let lowest_fail = lowest_failure(&log.steps);
    let (f, best) = (&plan.fanout, &log.best);
    let mut v = json!({
        "mode": "ramp", "target": t.kind.name(), "publish_api": t.publish.name(),
        "params": {"subs": f.subs, "channels": f.channels, "step_duration_s": f.duration,
                   "drain_s": f.drain, "p99_limit_ms": plan.p99_limit_ms, "start_rate": plan.search.start,
                   "max_rate": plan.search.max_rate, "tolerance": plan.search.tolerance,
                   "max_steps": plan.search.max_steps, "pub_conns": f.pub_conns, "threads": c.threads,
                   "publish_url": c.publish_url},
        "steps": log.steps,
        "best": best,
        "lowest_failure": lowest_fail,
        "best_rate": best.as_ref().map(|b| b["rate"].clone()),
        "sustained_deliveries_per_s": best.as_ref().map(|b| b["sustained_deliveries_per_s"].clone()),
        "elapsed_s": r1(start.elapsed().as_secs_f64()),
        "aborted": log.aborted,
    });
    v["ok"] = json!(best.is_some() && log.aborted.is_none());
    eprintln!(
        "ramp against {} ({} subs, {} channel(s), {}s steps):",
        t.kind.name(),
        f.subs,
        f.channels,
        f.duration
    );
    table(&[
        (
            "steps",
            v["steps"].as_array().map_or(0, Vec::len).to_string(),
        ),
        ("best rate (publishes/s)", v["best_rate"].to_string()),
        (
            "sustained deliveries/s",
            v["sustained_deliveries_per_s"].to_string(),
        ),
        (
            "best p99 ms",
            best.as_ref()
                .map_or("null".into(), |b| b["p99_ms"].to_string()),
        ),
        (
            "lowest failing rate",
            lowest_fail
                .as_ref()
                .map_or("none".into(), |l| format!("{} ({})", l["rate"], l["why"])),
        ),
    ]);
    v
}
