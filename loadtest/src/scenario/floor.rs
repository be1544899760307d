//! `floor`: the kernel floor, the least CPU any server could spend per delivered
//! frame on this machine. This module checks the fd budget, runs the variants
//! (`crate::floor` does the sending) and writes the report.
//!
//! Invariants: needs no server, so no target, keys or `--server-pid` are read; the
//! run is refused up front when the sockets would not fit under the fd limit, rather
//! than failing halfway through opening them; `ok` only when no variant failed.
//! Without `--rounds-per-s` the floor is the max-rate one it always was (so old
//! figures stay comparable); with it, the paced shape of `crate::floor_pace`.

use crate::floor::{self as kernel, FloorOpts};
use crate::floor_pace::Pace;
use crate::floor_reader::ReaderKind;
use crate::report::table;
use crate::{net, secs};
use clap::Args;
use serde_json::{json, Value};

#[derive(Args)]
pub struct FloorArgs {
    #[arg(long, default_value_t = 1000)]
    sockets: usize,
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    #[arg(long, default_value_t = 150)]
    frame_bytes: usize,
    /// Sends per io_uring submission, and frames per write in `coalesce`.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Comma-separated: write, uring, coalesce (max rate only). Default: all three
    /// at max rate, write and uring when paced.
    #[arg(long)]
    variants: Option<String>,
    /// Paced: rounds per second, each round one frame to `--per-round` sockets
    /// (the next ones, cycling), with sleeps between rounds. Unset: max rate.
    #[arg(long, requires = "per_round")]
    rounds_per_s: Option<f64>,
    /// Paced: sockets per round (1..=--sockets), like subscribers of one channel.
    #[arg(long, requires = "rounds_per_s")]
    per_round: Option<usize>,
    /// Where the minimal reader runs: `thread` (of this process) or `process` (a
    /// forked child, like a fan-out's subscribers in the load generator).
    #[arg(long, default_value = "thread")]
    reader: String,
    /// Reader epoll loops (the fan-out's client runs `--threads`, 2 by default).
    #[arg(long, default_value_t = 1)]
    reader_threads: usize,
}

impl FloorArgs {
    fn opts(&self) -> Result<FloorOpts, String> {
        let pace = match (self.rounds_per_s, self.per_round) {
            (Some(r), Some(k)) => Some(Pace::new(r, k, self.sockets)?),
            _ => None,
        };
        let default = if pace.is_some() {
            "write,uring"
        } else {
            "write,uring,coalesce"
        };
        Ok(FloorOpts {
            sockets: self.sockets,
            duration: secs(self.duration),
            frame_bytes: self.frame_bytes,
            batch: self.batch,
            variants: self
                .variants
                .as_deref()
                .unwrap_or(default)
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
            pace,
            reader: ReaderKind::parse(&self.reader)?,
            reader_threads: self.reader_threads.clamp(1, 64),
        })
    }
}

pub fn run(a: &FloorArgs) -> Result<Value, String> {
    let opts = a.opts()?;
    // Each socket is a connected pair (writer and reader), plus room for the rest.
    if opts.sockets * 2 + 64 > net::raise_nofile() as usize {
        return Err(format!(
            "{} sockets need {} fds; the limit is {}",
            opts.sockets,
            opts.sockets * 2 + 64,
            net::raise_nofile()
        ));
    }
    let variants = kernel::run(&opts)?;
    print_table(&opts, &variants);
    Ok(json!({
        "mode": "floor",
        "params": {"sockets": opts.sockets, "duration_s": opts.duration.as_secs_f64(),
                   "frame_bytes": opts.frame_bytes, "batch": opts.batch,
                   "rounds_per_s": opts.pace.map(|p| p.rounds_per_s),
                   "per_round": opts.pace.map(|p| p.per_round),
                   "reader": opts.reader.name(), "reader_threads": opts.reader_threads},
        "variants": variants,
        "ok": variants.iter().all(|v| v.get("error").is_none()),
    }))
}

/// One row per variant on stderr: its CPU per frame, or why it failed.
fn print_table(opts: &FloorOpts, variants: &[Value]) {
    let shape = match opts.pace {
        None => "max rate".to_string(),
        Some(p) => format!("{} rounds/s of {}", p.rounds_per_s, p.per_round),
    };
    eprintln!(
        "floor ({} sockets, {}-byte frame, {shape}, reader {} x{}):",
        opts.sockets,
        opts.frame_bytes,
        opts.reader.name(),
        opts.reader_threads
    );
    let rows: Vec<(String, String)> = variants
        .iter()
        .map(|v| {
            let name = v["variant"].as_str().unwrap_or("?").to_string();
            let val = match v.get("error") {
                Some(e) => format!("error: {e}"),
                None => format!(
                    "{} us CPU/frame, {} frames/s, eagain {}{}",
                    v["sender_cpu_us_per_frame"],
                    v["frames_per_s"],
                    v["eagain"],
                    match v.get("late_rounds") {
                        Some(l) => format!(", late rounds {l} of {}", v["rounds"]),
                        None => String::new(),
                    }
                ),
            };
            (name, val)
        })
        .collect();
    let refs: Vec<(&str, String)> = rows.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    table(&refs);
}
