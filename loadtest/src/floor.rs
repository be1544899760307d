//! The floor: the least CPU any server could spend per delivered frame here. The
//! harness writes one pre-encoded ~150-byte WebSocket text frame to N loopback
//! sockets, with a minimal reader (`floor_reader`: threads of this process, or a
//! child process), and reports the sender thread's CPU µs per frame (which includes
//! the loopback receive path the kernel charges to the sender).
//!
//! Two shapes. Max rate (no `pace`): round-robin over every socket as fast as it
//! can, so the reader never sleeps. Paced (`pace`, in `floor_pace`): rounds of K
//! sockets at R rounds per second with sleeps between, the shape of a fan-out
//! scenario, whose readers sleep between bursts and must be woken.
//!
//! Variants: `write` (one write() per socket per frame), `uring` (the same sends,
//! submitted to io_uring in batches: fewer syscalls, the same TCP work) and
//! `coalesce` (B frames per socket leave in one write: what a server gains when
//! frames queue up for one connection; max rate only).
//!
//! Invariants: every loop is bounded by the duration; sockets are nonblocking, a full
//! socket buffer is counted (`eagain`) and skipped, never waited on; the reader is
//! started before any other thread exists (a `process` reader forks).

use crate::floor_pace::{self as pace, Pace};
use crate::floor_reader::{self as reader, ReaderKind};
use crate::floor_send::{new_ring, round3, uring_round, Counts, SendStats};
use crate::stats::thread_cpu_s;
use serde_json::{json, Value};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A server-to-client text frame of `total` bytes (header included) that looks like
/// a ringcast delivery.
pub fn make_frame(total: usize) -> Vec<u8> {
    let total = total.clamp(16, 65535);
    let (header, payload_len) = if total - 2 <= 125 {
        (2, total - 2)
    } else {
        (4, total - 4)
    };
    let mut f = Vec::with_capacity(total);
    f.push(0x81);
    if header == 2 {
        f.push(payload_len as u8);
    } else {
        f.push(126);
        f.extend_from_slice(&(payload_len as u16).to_be_bytes());
    }
    let mut body = br#"{"type":"message","channel":"news","event":"order.created","data":{"t":1700000000000000000,"seq":1,"pad":""#.to_vec();
    body.truncate(payload_len);
    f.extend_from_slice(&body);
    while f.len() < total - 3 {
        f.push(b'x');
    }
    f.extend_from_slice(&b"\"}}"[..total - f.len()]);
    f
}

/// Options of the floor run.
pub struct FloorOpts {
    pub sockets: usize,
    pub duration: Duration,
    pub frame_bytes: usize,
    pub batch: usize,
    pub variants: Vec<String>,
    /// None: the max-rate floor.
    pub pace: Option<Pace>,
    pub reader: ReaderKind,
    pub reader_threads: usize,
}

/// Run every requested variant; returns one JSON object per variant.
pub fn run(opts: &FloorOpts) -> Result<Vec<Value>, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut readers = Vec::with_capacity(opts.sockets);
    let mut writers = Vec::with_capacity(opts.sockets);
    for _ in 0..opts.sockets {
        let c = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        let (s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        c.set_nonblocking(true).map_err(|e| e.to_string())?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        readers.push(mio::net::TcpStream::from_std(c));
        writers.push(s);
    }
    drop(listener);
    let frame = make_frame(opts.frame_bytes);
    let reader = reader::start(opts.reader, readers, opts.reader_threads)?;
    let mut out = Vec::new();
    for v in &opts.variants {
        let (r0, turns0) = (reader.bytes(), reader.turns());
        let mut obj = match opts.pace {
            None => max_rate(v, &writers, &frame, opts),
            Some(p) => paced(v, &writers, &frame, p, opts),
        };
        // Let the reader catch up before the next variant.
        std::thread::sleep(Duration::from_millis(200));
        obj["reader_bytes"] = json!(reader.bytes() - r0);
        obj["reader_turns"] = json!(reader.turns() - turns0);
        out.push(obj);
    }
    let reader_cpu = reader.stop();
    if let Some(last) = out.last_mut() {
        last["reader_cpu_s_total"] = json!(round3(reader_cpu));
    }
    Ok(out)
}

/// One max-rate variant's JSON object (as the floor always reported it).
fn max_rate(v: &str, writers: &[TcpStream], frame: &[u8], opts: &FloorOpts) -> Value {
    let res = match v {
        "write" => run_write(writers, frame, 1, opts.duration),
        "coalesce" => run_write(writers, frame, opts.batch.max(1), opts.duration),
        "uring" => run_uring(writers, frame, opts.batch.max(1), opts.duration),
        other => Err(format!(
            "unknown floor variant {other:?} (write, uring, coalesce)"
        )),
    };
    match res {
        Ok(s) => s.json(v),
        Err(e) => json!({"variant": v, "error": e}),
    }
}

/// One paced variant's JSON object: the max-rate fields, plus the schedule's.
fn paced(v: &str, writers: &[TcpStream], frame: &[u8], p: Pace, opts: &FloorOpts) -> Value {
    let res = match v {
        "write" => pace::run(writers, frame, p, pace::Sender::Write, opts.duration),
        "uring" => new_ring(opts.batch.max(1)).and_then(|(mut ring, batch)| {
            let sender = pace::Sender::Uring {
                ring: &mut ring,
                batch,
            };
            pace::run(writers, frame, p, sender, opts.duration)
        }),
        other => Err(format!(
            "floor variant {other:?} has no paced form (write, uring)"
        )),
    };
    match res {
        Ok(s) => {
            let mut obj = s.send.json(v);
            obj["rounds"] = json!(s.rounds);
            obj["late_rounds"] = json!(s.late_rounds);
            obj["target_frames_per_s"] = json!((p.rounds_per_s * p.per_round as f64).round());
            obj
        }
        Err(e) => json!({"variant": v, "error": e}),
    }
}

/// `per_write` frames per write() per socket, round-robin over all sockets.
fn run_write(
    writers: &[TcpStream],
    frame: &[u8],
    per_write: usize,
    d: Duration,
) -> Result<SendStats, String> {
    let buf: Vec<u8> = frame.repeat(per_write);
    let (mut frames, mut writes, mut eagain) = (0u64, 0u64, 0u64);
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    // Bounded by the duration, checked once per round.
    while t0.elapsed() < d {
        for w in writers {
            // SAFETY: a plain write() of our buffer to a socket we own.
            let n = unsafe { libc::write(w.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
            writes += 1;
            if n < 0 {
                eagain += 1;
            } else {
                // A partial write leaves a torn frame; the reader discards bytes, so
                // only whole frames are counted.
                frames += n as u64 / frame.len() as u64;
            }
        }
    }
    Ok(SendStats {
        frames,
        writes,
        eagain,
        cpu_s: thread_cpu_s() - cpu0,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}

/// One Send SQE per socket, submitted `batch` at a time with one io_uring_enter.
fn run_uring(
    writers: &[TcpStream],
    frame: &[u8],
    batch: usize,
    d: Duration,
) -> Result<SendStats, String> {
    let (mut ring, batch) = new_ring(batch)?;
    let mut c = Counts::default();
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    let mut next = 0usize;
    while t0.elapsed() < d {
        c.add(uring_round(&mut ring, writers, frame, next, batch, batch)?);
        next = (next + batch) % writers.len();
    }
    Ok(SendStats::since(c, cpu0, t0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_has_requested_size_and_parses() {
        for total in [60, 127, 128, 150, 300] {
            let f = make_frame(total);
            assert_eq!(f.len(), total);
            let h = crate::ws::parse_frame(&f).unwrap().unwrap();
            assert_eq!(h.total_len(), total);
            assert_eq!(h.opcode, crate::ws::OP_TEXT);
        }
        let f = make_frame(150);
        let payload = &f[4..];
        assert!(serde_json::from_slice::<serde_json::Value>(payload).is_ok());
    }
}
