//! `idle`: open N WebSocket connections, subscribe them (unless `--channels 0`), hold
//! them, and report the server's RSS growth per open connection: what an idle
//! subscriber costs in memory.
//!
//! Invariants:
//! - Bounded: connecting by `--connect-timeout`, then exactly `--hold` seconds; the
//!   subscriber threads' hard deadline covers both.
//! - The RSS "after" reading is taken while every connection is still held, and the
//!   growth is divided by the connections still open then, not by those asked for.
//! - `ok` only when every asked-for connection is open at that reading.

use crate::report::{cpu_json, progress, r3, snapshot, table, Snapshot};
use crate::stats::summarize;
use crate::subrun::{join_subscribers, start_subscribers, wait_ready, SubSpec, SubTotals};
use crate::target::Target;
use crate::{secs, Common};
use clap::Args;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct IdleArgs {
    #[arg(long, default_value_t = 10000)]
    conns: usize,
    /// Seconds to hold all connections before the RSS reading.
    #[arg(long, default_value_t = 5.0)]
    hold: f64,
    /// Channels the connections subscribe to (0: connect only, no subscription).
    #[arg(long, default_value_t = 1)]
    channels: u32,
    #[arg(long, default_value_t = 60.0)]
    connect_timeout: f64,
    #[arg(long, default_value_t = 256)]
    inflight: usize,
}

/// What one run measured, handed from the run's phases to its report.
struct Outcome {
    ready: u64,
    still_open: u64,
    connect_time: Duration,
    subs: SubTotals,
    /// Before the first connection: the server's baseline.
    s0: Snapshot,
    /// After the hold, with every connection still open.
    s1: Snapshot,
}

pub fn run(c: &Common, t: &Target, a: &IdleArgs) -> Result<Value, String> {
    let start = Instant::now();
    let s0 = snapshot(c);
    let hard = start + secs(a.connect_timeout + a.hold + 30.0);
    let subs = start_subscribers(
        c,
        t,
        SubSpec {
            n: a.conns,
            channels: a.channels,
            inflight: a.inflight,
            connect_timeout: a.connect_timeout,
            hard_deadline: hard,
            churn: None,
            own_channel: false,
        },
    );
    let connect_time = wait_ready(c, "idle", &subs, a.connect_timeout);
    let ready = subs.shared.ready.load(Relaxed);
    progress(
        c,
        "idle",
        start,
        format!(
            "{ready}/{} connections ready in {:.2}s; holding {}s",
            a.conns,
            connect_time.as_secs_f64(),
            a.hold
        ),
    );
    hold(a.hold);
    let s1 = snapshot(c);
    let still_open = ready - subs.shared.closed.load(Relaxed).min(ready);
    let subs = join_subscribers(subs);
    let o = Outcome {
        ready,
        still_open,
        connect_time,
        subs,
        s0,
        s1,
    };
    Ok(report(c, t, a, &o))
}

/// Hold every connection open for `hold` seconds before the RSS reading.
fn hold(hold: f64) {
    let hold_end = Instant::now() + secs(hold);
    while Instant::now() < hold_end {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The JSON line, and the table on stderr.
fn report(c: &Common, t: &Target, a: &IdleArgs, o: &Outcome) -> Value {
    let (s0, s1, still_open) = (&o.s0, &o.s1, o.still_open);
    let rss_delta = s1.server.rss_bytes as i64 - s0.server.rss_bytes as i64;
    let per_conn = if still_open > 0 {
        rss_delta as f64 / still_open as f64
    } else {
        0.0
    };
    let mut v = json!({
        "mode": "idle", "target": t.kind.name(),
        "params": {"conns": a.conns, "hold_s": a.hold, "channels": a.channels, "threads": c.threads},
        "connections_ready": o.ready, "connections_open": still_open,
        "connect_time_s": r3(o.connect_time.as_secs_f64()),
        "connect_latency": summarize(&o.subs.connect).to_json(),
        "subscribers": o.subs.json,
        "cpu": cpu_json(c, s0, s1, 0, "none"),
    });
    if !c.server_pids.is_empty() {
        v["server_rss_before_bytes"] = json!(s0.server.rss_bytes);
        v["server_rss_after_bytes"] = json!(s1.server.rss_bytes);
        v["server_fds_after"] = json!(s1.server.fds);
        v["server_bytes_per_connection"] = json!(per_conn.round());
    }
    v["ok"] = json!(still_open as usize == a.conns);
    eprintln!("idle against {} ({} connections):", t.kind.name(), a.conns);
    table(&[
        (
            "connections open",
            format!(
                "{still_open} (ready in {:.2}s)",
                o.connect_time.as_secs_f64()
            ),
        ),
        (
            "server RSS before/after",
            format!("{} / {}", s0.server.rss_bytes, s1.server.rss_bytes),
        ),
        ("server bytes/connection", format!("{per_conn:.0}")),
        ("harness CPU s", v["cpu"]["harness_cpu_s"].to_string()),
    ]);
    v
}
