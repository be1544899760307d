//! The floor's receiving side: a minimal epoll reader that reads and discards
//! everything on the client ends of the floor's sockets, run either as threads of
//! the harness's own process (`thread`, the original floor) or in a forked child
//! process (`process`: like a fan-out, whose subscribers live in another process
//! than the server, so the sender's wake-ups cross an address space).
//!
//! Invariants: `start` in `process` mode forks, so it must be called before the
//! calling process has started any thread (the floor calls it first thing); the
//! child touches only its own sockets and a shared anonymous mapping, leaves by
//! `_exit`, never returning into the parent's code, and dies with its parent; every loop watches the stop
//! flag at least every 20 ms, and `stop` waits for a child at most 5 s before it
//! kills it.

use crate::stats::{self_cpu_s, thread_cpu_s};
use mio::{Events, Interest, Poll, Token};
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Where the reader runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaderKind {
    Thread,
    Process,
}

impl ReaderKind {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "thread" => Ok(Self::Thread),
            "process" => Ok(Self::Process),
            other => Err(format!("unknown --reader {other:?} (thread, process)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Thread => "thread",
            Self::Process => "process",
        }
    }
}

/// What the sender and the readers share: in `thread` mode an ordinary heap value,
/// in `process` mode a `MAP_SHARED` page both processes see after the fork.
#[repr(C)]
struct Shared {
    stop: AtomicBool,
    bytes: AtomicU64,
    /// Epoll waits that returned events: about one per wake-up of a sleeping
    /// reader when the sender is paced (a busy reader's waits return at once).
    turns: AtomicU64,
    /// The readers' CPU, µs, written once by the reader side as it stops.
    cpu_us: AtomicU64,
}

/// A running reader; `stop` ends it and returns its CPU seconds.
pub struct Reader {
    shared: &'static Shared,
    threads: Vec<std::thread::JoinHandle<f64>>,
    child: Option<libc::pid_t>,
}

/// Start `threads` epoll readers over `socks` (split evenly), in this process or
/// in a child; the caller's copies of the sockets are closed in `process` mode.
pub fn start(
    kind: ReaderKind,
    socks: Vec<mio::net::TcpStream>,
    threads: usize,
) -> Result<Reader, String> {
    let shared = shared_page(kind)?;
    match kind {
        ReaderKind::Thread => Ok(Reader {
            shared,
            threads: spawn_readers(socks, threads, shared),
            child: None,
        }),
        ReaderKind::Process => {
            // SAFETY: getpid has no preconditions.
            let parent = unsafe { libc::getpid() };
            // SAFETY: the process is single-threaded here (see the invariants), so
            // the child may allocate and spawn threads freely.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                return Err(format!("fork: {}", io::Error::last_os_error()));
            }
            if pid == 0 {
                // A parent that dies without setting `stop` (a panic, a kill) must
                // not leave the child polling forever: it dies with it. The getppid
                // check covers a parent that died before the prctl.
                // SAFETY: prctl and getppid on ourselves; _exit leaves at once.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                }
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for h in spawn_readers(socks, threads, shared) {
                        let _ = h.join();
                    }
                    shared
                        .cpu_us
                        .store((self_cpu_s() * 1e6).round() as u64, Relaxed);
                }))
                .is_ok();
                // SAFETY: leave the child without running the parent's destructors
                // or returning into its code.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            drop(socks); // the child has its own copies
            Ok(Reader {
                shared,
                threads: Vec::new(),
                child: Some(pid),
            })
        }
    }
}

impl Reader {
    /// Bytes read so far by every reader.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Relaxed)
    }

    /// Epoll waits that returned events so far, over every reader.
    pub fn turns(&self) -> u64 {
        self.shared.turns.load(Relaxed)
    }

    /// Stop the readers; returns their CPU seconds (0 when a child had to be killed).
    pub fn stop(self) -> f64 {
        self.shared.stop.store(true, Relaxed);
        let mut cpu = 0.0;
        for h in self.threads {
            cpu += h.join().unwrap_or(0.0);
        }
        if let Some(pid) = self.child {
            if wait_child(pid, Duration::from_secs(5)) {
                cpu += self.shared.cpu_us.load(Relaxed) as f64 / 1e6;
            }
        }
        cpu
    }
}

/// The shared state: leaked (one small value per floor run) in `thread` mode, a
/// shared anonymous page in `process` mode (never unmapped: the process ends soon).
fn shared_page(kind: ReaderKind) -> Result<&'static Shared, String> {
    let init = Shared {
        stop: AtomicBool::new(false),
        bytes: AtomicU64::new(0),
        turns: AtomicU64::new(0),
        cpu_us: AtomicU64::new(0),
    };
    if kind == ReaderKind::Thread {
        return Ok(Box::leak(Box::new(init)));
    }
    // SAFETY: a fresh anonymous mapping, page-aligned and big enough for `Shared`.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            std::mem::size_of::<Shared>().max(4096),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", io::Error::last_os_error()));
    }
    let p = p.cast::<Shared>();
    // SAFETY: `p` is valid, aligned and ours alone until the fork.
    unsafe {
        p.write(init);
        Ok(&*p)
    }
}

/// Wait for the child to exit, at most `limit`; kill it after that. True when it
/// exited by itself.
fn wait_child(pid: libc::pid_t, limit: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child, WNOHANG.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid || r < 0 {
            return r == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if t0.elapsed() > limit {
            // SAFETY: signalling and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn spawn_readers(
    mut socks: Vec<mio::net::TcpStream>,
    threads: usize,
    shared: &'static Shared,
) -> Vec<std::thread::JoinHandle<f64>> {
    let threads = threads.clamp(1, 64);
    let per = socks.len().div_ceil(threads).max(1);
    let mut handles = Vec::new();
    while !socks.is_empty() {
        let rest = socks.split_off(per.min(socks.len()));
        let mine = std::mem::replace(&mut socks, rest);
        handles.push(std::thread::spawn(move || minimal_reader(mine, shared)));
    }
    handles
}

/// Read and discard everything; returns this thread's CPU seconds. Sleeps in
/// epoll whenever nothing is readable, as a fan-out's subscribers do.
fn minimal_reader(mut socks: Vec<mio::net::TcpStream>, shared: &Shared) -> f64 {
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
    while !shared.stop.load(Relaxed) {
        // Leftovers from the last turn: look again without sleeping.
        let wait = if more.is_empty() {
            Duration::from_millis(20)
        } else {
            Duration::ZERO
        };
        if poll.poll(&mut events, Some(wait)).is_err() {
            continue;
        }
        if !events.is_empty() {
            shared.turns.fetch_add(1, Relaxed);
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
                        shared.bytes.fetch_add(n as u64, Relaxed);
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
