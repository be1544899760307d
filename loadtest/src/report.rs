//! What every scenario reports beside its own figures: CPU and memory snapshots of
//! the harness and the server, the `cpu` object of the JSON line, progress lines and
//! the closing table on stderr, and the rounding used for JSON numbers.
//!
//! Invariants: stdout is never written here (it carries only the one JSON line that
//! `main` prints); the harness's own CPU is always in `cpu`, the server's only when
//! `--server-pid` was given, so a reader can tell which side was the bottleneck.

use crate::stats::{sample_pids, self_cpu_s, ProcSample};
use crate::Common;
use serde_json::{json, Value};
use std::time::Instant;

/// One decimal place: percentages and seconds a reader compares by eye.
pub fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Three decimal places: CPU seconds and µs per unit, where the third digit matters.
pub fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// CPU and memory readings of the harness and the server at one instant.
#[derive(Clone, Copy)]
pub struct Snapshot {
    pub at: Instant,
    pub self_cpu: f64,
    pub server: ProcSample,
    pub missing: usize,
}

pub fn snapshot(c: &Common) -> Snapshot {
    let (server, missing) = sample_pids(&c.server_pids);
    Snapshot {
        at: Instant::now(),
        self_cpu: self_cpu_s(),
        server,
        missing,
    }
}

/// CPU figures over [a, b]; `per` is the unit count (deliveries, publishes).
pub fn cpu_json(c: &Common, a: &Snapshot, b: &Snapshot, per: u64, per_name: &str) -> Value {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    let mut v = json!({
        "window_s": r3(wall),
        "harness_cpu_s": r3(b.self_cpu - a.self_cpu),
        "harness_cpu_pct": r1(100.0 * (b.self_cpu - a.self_cpu) / wall.max(1e-9)),
    });
    if !c.server_pids.is_empty() {
        let scpu = b.server.cpu_s - a.server.cpu_s;
        v["server_cpu_s"] = json!(r3(scpu));
        v["server_cpu_pct"] = json!(r1(100.0 * scpu / wall.max(1e-9)));
        v["server_rss_bytes"] = json!(b.server.rss_bytes);
        v["server_fds"] = json!(b.server.fds);
        v["server_pids_missing"] = json!(b.missing.max(a.missing));
        if per > 0 {
            v[format!("server_cpu_us_per_{per_name}")] = json!(r3(scpu * 1e6 / per as f64));
        }
    }
    v
}

pub fn progress(c: &Common, mode: &str, start: Instant, line: String) {
    if !c.quiet {
        eprintln!("[{mode} {:>5.1}s] {line}", start.elapsed().as_secs_f64());
    }
}

pub fn table(rows: &[(&str, String)]) {
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (k, v) in rows {
        eprintln!("  {k:<w$}  {v}");
    }
}
