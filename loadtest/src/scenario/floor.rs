//! `floor`: the kernel floor, the least CPU any server could spend per delivered
//! frame on this machine. This module checks the fd budget, runs the variants
//! (`crate::floor` does the sending) and writes the report.
//!
//! Invariants: needs no server, so no target, keys or `--server-pid` are read; the
//! run is refused up front when the sockets would not fit under the fd limit, rather
//! than failing halfway through opening them; `ok` only when no variant failed.

use crate::floor::{self as kernel, FloorOpts};
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
    /// Comma-separated: write, uring, coalesce.
    #[arg(long, default_value = "write,uring,coalesce")]
    variants: String,
}

impl FloorArgs {
    fn opts(&self) -> FloorOpts {
        FloorOpts {
            sockets: self.sockets,
            duration: secs(self.duration),
            frame_bytes: self.frame_bytes,
            batch: self.batch,
            variants: self
                .variants
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
        }
    }
}

pub fn run(a: &FloorArgs) -> Result<Value, String> {
    let opts = a.opts();
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
                   "frame_bytes": opts.frame_bytes, "batch": opts.batch},
        "variants": variants,
        "ok": variants.iter().all(|v| v.get("error").is_none()),
    }))
}

/// One row per variant on stderr: its CPU per frame, or why it failed.
fn print_table(opts: &FloorOpts, variants: &[Value]) {
    eprintln!(
        "floor ({} sockets, {}-byte frame):",
        opts.sockets, opts.frame_bytes
    );
    let rows: Vec<(String, String)> = variants
        .iter()
        .map(|v| {
            let name = v["variant"].as_str().unwrap_or("?").to_string();
            let val = match v.get("error") {
                Some(e) => format!("error: {e}"),
                None => format!(
                    "{} us CPU/frame, {} frames/s, eagain {}",
                    v["sender_cpu_us_per_frame"], v["frames_per_s"], v["eagain"]
                ),
            };
            (name, val)
        })
        .collect();
    let refs: Vec<(&str, String)> = rows.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    table(&refs);
}
