//! The floor: the least CPU any server could spend per delivered frame here. The
//! harness writes one pre-encoded ~150-byte WebSocket text frame to N loopback
//! sockets as fast as it can, with a minimal reader on another thread, and reports
//! the sender thread's CPU µs per frame (which includes the loopback receive path
//! the kernel charges to the sender).
//!
//! Variants: `write` (one write() per socket per frame), `uring` (the same sends,
//! submitted to io_uring in batches: fewer syscalls, the same TCP work) and
//! `coalesce` (B frames per socket leave in one write: what a server gains when
//! frames queue up for one connection).
//!
//! Invariants: every loop is bounded by the duration; sockets are nonblocking, a full
//! socket buffer is counted (`eagain`) and skipped, never waited on.

use crate::stats::thread_cpu_s;
use mio::{Events, Interest, Poll, Token};
use serde_json::{json, Value};
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
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
    let frame = make_frame(opts.frame_bytes);
    let stop = Arc::new(AtomicBool::new(false));
    let read_bytes = Arc::new(AtomicU64::new(0));
    let reader = {
        let stop = stop.clone();
        let read_bytes = read_bytes.clone();
        std::thread::spawn(move || minimal_reader(readers, &stop, &read_bytes))
    };
    let mut out = Vec::new();
    for v in &opts.variants {
        let r0 = read_bytes.load(Relaxed);
        let res = match v.as_str() {
            "write" => run_write(&writers, &frame, 1, opts.duration),
            "coalesce" => run_write(&writers, &frame, opts.batch.max(1), opts.duration),
            "uring" => run_uring(&writers, &frame, opts.batch.max(1), opts.duration),
            other => Err(format!(
                "unknown floor variant {other:?} (write, uring, coalesce)"
            )),
        };
        // Let the reader catch up before the next variant.
        std::thread::sleep(Duration::from_millis(200));
        let mut obj = match res {
            Ok(s) => {
                let per = if s.frames > 0 {
                    s.cpu_s * 1e6 / s.frames as f64
                } else {
                    0.0
                };
                json!({
                    "variant": v, "frames": s.frames, "writes": s.writes, "eagain": s.eagain,
                    "elapsed_s": round3(s.elapsed_s), "sender_cpu_s": round3(s.cpu_s),
                    "frames_per_s": (s.frames as f64 / s.elapsed_s.max(1e-9)).round(),
                    "sender_cpu_us_per_frame": round3(per),
                })
            }
            Err(e) => json!({"variant": v, "error": e}),
        };
        obj["reader_bytes"] = json!(read_bytes.load(Relaxed) - r0);
        out.push(obj);
    }
    stop.store(true, Relaxed);
    let reader_cpu = reader.join().unwrap_or(0.0);
    if let Some(last) = out.last_mut() {
        last["reader_cpu_s_total"] = json!(round3(reader_cpu));
    }
    Ok(out)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

struct SendStats {
    frames: u64,
    writes: u64,
    eagain: u64,
    cpu_s: f64,
    elapsed_s: f64,
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
    use io_uring::{opcode, types, IoUring};
    let entries = batch.next_power_of_two().clamp(8, 4096) as u32;
    let mut ring = IoUring::new(entries).map_err(|e| format!("io_uring unavailable: {e}"))?;
    let batch = batch.min(entries as usize);
    let (mut frames, mut writes, mut eagain) = (0u64, 0u64, 0u64);
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    let mut next = 0usize;
    while t0.elapsed() < d {
        let mut queued = 0;
        {
            let mut sq = ring.submission();
            while queued < batch {
                let fd = writers[next % writers.len()].as_raw_fd();
                next += 1;
                let sqe = opcode::Send::new(types::Fd(fd), frame.as_ptr(), frame.len() as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .user_data(0);
                // SAFETY: `frame` outlives the ring's use of it: we wait for every
                // completion below before the next batch or return.
                if unsafe { sq.push(&sqe) }.is_err() {
                    break;
                }
                queued += 1;
            }
        }
        ring.submit_and_wait(queued)
            .map_err(|e| format!("io_uring submit: {e}"))?;
        writes += queued as u64;
        for cqe in ring.completion() {
            if cqe.result() < 0 {
                eagain += 1;
            } else {
                frames += cqe.result() as u64 / frame.len() as u64;
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

/// Read and discard everything; returns this thread's CPU seconds.
fn minimal_reader(
    mut socks: Vec<mio::net::TcpStream>,
    stop: &AtomicBool,
    bytes: &AtomicU64,
) -> f64 {
    let Ok(mut poll) = Poll::new() else {
        return 0.0;
    };
    for (i, s) in socks.iter_mut().enumerate() {
        let _ = poll.registry().register(s, Token(i), Interest::READABLE);
    }
    let mut events = Events::with_capacity(4096);
    let mut buf = vec![0u8; 256 * 1024];
    let mut more: Vec<usize> = Vec::new();
    let cpu0 = thread_cpu_s();
    while !stop.load(Relaxed) {
        if poll
            .poll(&mut events, Some(Duration::from_millis(20)))
            .is_err()
        {
            continue;
        }
        let mut ready: Vec<usize> = events.iter().map(|e| e.token().0).collect();
        ready.append(&mut more);
        for i in ready {
            let Some(s) = socks.get_mut(i) else { continue };
            // Bounded per socket per turn; leftovers are revisited next turn.
            let mut drained = false;
            for _ in 0..8 {
                match s.read(&mut buf) {
                    Ok(0) => {
                        drained = true;
                        break;
                    }
                    Ok(n) => {
                        bytes.fetch_add(n as u64, Relaxed);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(_) => {
                        drained = true;
                        break;
                    }
                }
            }
            if !drained {
                more.push(i);
            }
        }
    }
    thread_cpu_s() - cpu0
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
