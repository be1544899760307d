//! How a floor sender writes one frame to many sockets, and what it counts: one
//! `write(2)` per socket, or the same sends as io_uring Send SQEs in batches. Shared by
//! the max-rate floor (`floor`) and the paced one (`floor_pace`).
//!
//! Invariants: sockets are nonblocking; a full socket buffer is counted (`eagain`) and
//! skipped, never waited on; a partial write counts only whole frames; every io_uring
//! batch is reaped before the next is queued, so the frame outlives the ring's use of it.

use crate::stats::thread_cpu_s;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Frames, writes and full sockets of a burst.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Counts {
    pub frames: u64,
    pub writes: u64,
    pub eagain: u64,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.frames += o.frames;
        self.writes += o.writes;
        self.eagain += o.eagain;
    }
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A sender's figures over a run.
pub struct SendStats {
    pub frames: u64,
    pub writes: u64,
    pub eagain: u64,
    pub cpu_s: f64,
    pub elapsed_s: f64,
}

impl SendStats {
    /// The figures of a run that sent `c`, started at `t0` with the thread's CPU at
    /// `cpu0` (seconds), ending now.
    pub fn since(c: Counts, cpu0: f64, t0: Instant) -> SendStats {
        SendStats {
            frames: c.frames,
            writes: c.writes,
            eagain: c.eagain,
            cpu_s: thread_cpu_s() - cpu0,
            elapsed_s: t0.elapsed().as_secs_f64(),
        }
    }

    /// The variant's JSON object; field names are read by run-suite.sh.
    pub fn json(&self, variant: &str) -> Value {
        let per = if self.frames > 0 {
            self.cpu_s * 1e6 / self.frames as f64
        } else {
            0.0
        };
        json!({
            "variant": variant, "frames": self.frames, "writes": self.writes,
            "eagain": self.eagain, "elapsed_s": round3(self.elapsed_s),
            "sender_cpu_s": round3(self.cpu_s),
            "frames_per_s": (self.frames as f64 / self.elapsed_s.max(1e-9)).round(),
            "sender_cpu_us_per_frame": round3(per),
        })
    }
}

/// One frame to each of `count` sockets from `first`, cycling; one write(2) each.
pub(crate) fn write_round(
    writers: &[TcpStream],
    frame: &[u8],
    first: usize,
    count: usize,
) -> Counts {
    let mut c = Counts::default();
    for j in 0..count {
        let w = &writers[(first + j) % writers.len()];
        // SAFETY: a plain write() of our buffer to a socket we own.
        let n = unsafe { libc::write(w.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        c.writes += 1;
        if n < 0 {
            c.eagain += 1;
        } else {
            c.frames += n as u64 / frame.len() as u64;
        }
    }
    c
}

/// A ring with room for `batch` sends, and the batch it can take.
pub(crate) fn new_ring(batch: usize) -> Result<(io_uring::IoUring, usize), String> {
    let entries = batch.next_power_of_two().clamp(8, 4096) as u32;
    let ring = io_uring::IoUring::new(entries).map_err(|e| format!("io_uring unavailable: {e}"))?;
    Ok((ring, batch.min(entries as usize)))
}

/// One frame to each of `count` sockets from `first` (cycling), as Send SQEs
/// submitted `batch` at a time (at most the ring's size), each batch reaped before
/// the next.
pub(crate) fn uring_round(
    ring: &mut io_uring::IoUring,
    writers: &[TcpStream],
    frame: &[u8],
    first: usize,
    count: usize,
    batch: usize,
) -> Result<Counts, String> {
    use io_uring::{opcode, types};
    let batch = batch.clamp(1, ring.params().sq_entries() as usize);
    let mut c = Counts::default();
    let mut next = first;
    let mut left = count;
    while left > 0 {
        let mut queued = 0;
        {
            let mut sq = ring.submission();
            while queued < batch.min(left) {
                let fd = writers[next % writers.len()].as_raw_fd();
                let sqe = opcode::Send::new(types::Fd(fd), frame.as_ptr(), frame.len() as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .user_data(0);
                // SAFETY: `frame` outlives the ring's use of it: we wait for every
                // completion below before the next batch or return.
                if unsafe { sq.push(&sqe) }.is_err() {
                    break;
                }
                next += 1;
                queued += 1;
            }
        }
        if queued == 0 {
            return Err("io_uring submission queue full".into());
        }
        ring.submit_and_wait(queued)
            .map_err(|e| format!("io_uring submit: {e}"))?;
        c.writes += queued as u64;
        left -= queued;
        for cqe in ring.completion() {
            if cqe.result() < 0 {
                c.eagain += 1;
            } else {
                c.frames += cqe.result() as u64 / frame.len() as u64;
            }
        }
    }
    Ok(c)
}
