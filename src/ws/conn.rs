//! One WebSocket connection: the shared state ([`WsConn`]), its reader (on plaintext a
//! record parked in the worker's connection engine, `read.rs`; on TLS a task,
//! [`read_loop`]) and its writer task ([`write_loop`]), which on plaintext exists only
//! while the connection has a backlog.
//!
//! Invariants:
//! - Plaintext sends directly: [`WsConn::enqueue`] (the fan-out, replies) hands a frame
//!   to the kernel with `send(MSG_DONTWAIT | MSG_NOSIGNAL)` when the queue is empty, no
//!   write is in flight, the connection is open and the coalescing window has passed.
//!   A whole frame sent costs no queue slot, no wake and no task. The rest of a partial
//!   send, or a frame that met `EAGAIN`, is queued and the writer task started (or
//!   woken); `EPIPE`/`ECONNRESET` aborts the connection.
//! - The writer task is, while it runs, the only one writing to the socket (the direct
//!   path needs an empty queue and no write in flight, so the two never write at once
//!   and frames leave in queue order). It drains the bounded queue of shared `Bytes`
//!   frames; frames waiting together leave in one write (coalescing), never one syscall
//!   each: one monoio `writev` on plaintext ([`PlainWriter`], over a monoio stream made
//!   when it first writes: lent the socket itself on io_uring, a duplicate on the legacy
//!   driver), one batch of TLS records on TLS (`crate::tls`).
//!   A plaintext writer is spawned on demand (the preamble, the first backlog, a close
//!   frame) and, once its queue is empty and one coalescing window has passed (so a hot
//!   connection does not respawn it per burst), gives the queue's allocation back and
//!   ends. A TLS writer is resident (rustls' state lives in it): TLS has no direct path.
//! - A plaintext connection owns its socket (closed when the last holder of the
//!   [`WsConn`] lets go); TLS streams own theirs.
//! - The queue is bounded in bytes (`send_backlog_bytes`): a push past the bound drops
//!   the backlog, queues a 4008 close frame and never slows the caller (the fan-out).
//! - Plaintext reads by readiness: the parked reader `recv(MSG_DONTWAIT)`s into the
//!   worker's scratch buffer when the engine says its socket is ready, and processes
//!   the bytes there. A partial frame's tail, and frames held back by back-pressure, are
//!   copied into the reader's pending buffer (boxed only while there is one), never left
//!   in the scratch buffer, which is lent to one reader between a `recv` and the end of
//!   its synchronous processing. TLS reads through rustls in its reader task
//!   ([`WsRead`]); a read may not be dropped (that could lose data): to stop a reader,
//!   [`WsConn::abort`] shuts the socket down, which completes a pending read (and makes
//!   a parked reader's socket readable: end of stream).
//! - An idle plaintext connection holds no task, no queue allocation, no read buffer
//!   and no monoio stream.
//! - Every server-initiated close is bounded in time: after `CLOSE_GRACE` the socket is
//!   shut down whether or not the peer answered.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::buf::IoVecBuf;
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::time::Sleep;
use monoio::BufResult;

use super::frame::{self, decode_frame_with, Opcode};
use super::message::{Assembler, Incoming};
use crate::close::code::SLOW_CONSUMER;
use crate::close::Disconnect;
use crate::dialect::Dialect;

mod own;
mod queue;
mod read;
mod write;
pub use own::OwnFrame;
use queue::Queue;
#[cfg(test)]
pub(crate) use read::Parked;
pub(crate) use read::WsRead;
pub use read::{read_loop, ReadLimits, Session};
pub use read::{start_parked, ReadCtx};
pub use write::write_loop;
pub use write::PlainWriter;
pub(crate) use write::{FrameBatch, FrameWrite};

/// How long a closing connection may take to finish its close handshake.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// A slow consumer may still be reading its old frames: its 4008 close frame waits
/// behind them, so it gets longer before the socket is cut (its backlog is already
/// freed; only the kernel's bounded socket buffer remains).
pub(crate) const SLOW_CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Read size while idle on TLS: client-to-server traffic is small control JSON, and the
/// buffer stays parked in the pending read of every idle TLS connection (plaintext
/// parks none: it reads by readiness into the worker's scratch buffer).
pub(crate) const IDLE_READ: usize = 128;
/// Read size while a larger frame is being assembled.
const BULK_READ: usize = 8192;
/// What one queued frame costs beyond its bytes (its queue slot and the shared buffer's
/// header), charged against the backlog so that a flood of tiny frames (pongs to a ping
/// flood from a client that never reads) is bounded in memory, not just in bytes.
const QUEUE_SLOT_COST: usize = 64;
/// Most frames handed to one `writev`.
const MAX_BATCH: usize = 64;

/// What a direct send did.
enum Sent {
    All,
    /// Only this many bytes (the rest is queued).
    Part(usize),
    /// The socket buffer is full: queue the frame.
    WouldBlock,
    /// The peer is gone (`EPIPE`, `ECONNRESET`, ...).
    Failed,
}

/// Why the writer's wait ended.
enum Wake {
    Frames,
    /// The connection is closing with nothing left to write, or done.
    Stop,
    /// An on-demand writer with nothing to do: park the write half and end.
    Idle,
}

/// Milliseconds on this thread's clock (never 0): the coalescing window's clock, kept in
/// a `u32` per connection (it wraps after 49 days; a wrap costs at most one window).
fn now_ms() -> u32 {
    thread_local! {
        static EPOCH: Instant = Instant::now();
    }
    let ms = EPOCH.with(|e| e.elapsed().as_millis()) as u32;
    ms.max(1)
}

/// Set `timer` to `deadline`, made on first use (boxed so an idle writer's task stays
/// small, reused so a hot connection does not allocate per batch).
fn arm(timer: &mut Option<Pin<Box<Sleep>>>, deadline: monoio::time::Instant) -> Pin<&mut Sleep> {
    match timer {
        Some(t) => {
            t.as_mut().reset(deadline);
            t.as_mut()
        }
        None => timer
            .insert(Box::pin(monoio::time::sleep_until(deadline)))
            .as_mut(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// A close frame is queued; nothing else will be.
    Closing,
    /// The writer finished or the socket was shut down.
    Done,
}

/// The tasks a connection may wake (see [`WsConn`]'s `wakers`).
#[derive(Default)]
struct Wakers {
    /// The writer task, waiting for frames.
    writer: Option<Waker>,
    /// A reader paused by back-pressure, or a task waiting for the end.
    waiter: Option<Waker>,
}

/// State shared by a connection's reader, writer and the worker's fan-out.
pub struct WsConn {
    pub id: u64,
    fd: RawFd,
    fd_open: Cell<bool>,
    /// `send_backlog_bytes` (at most 4 GiB: a `u32` keeps the record small).
    backlog_limit: u32,
    /// Queued frames, each with whether it is this connection's own (a reply, a pong:
    /// charged in full to the worker's [`WorkerBacklog`]) or a broadcast shared with
    /// other subscribers (charged only its queue slot there).
    queue: RefCell<Queue>,
    /// Bounded by `backlog_limit` (a `u32`).
    queued_bytes: Cell<u32>,
    /// The worker's budget of queued bytes, once attached ([`WsConn::attach_budget`]).
    budget: std::cell::OnceCell<Rc<WorkerBacklog>>,
    /// What this connection has charged to `budget` (at most its backlog: a `u32`).
    charged: Cell<u32>,
    /// Where the worker's table of open WebSockets keeps this connection (set by that
    /// table, `u32::MAX` while not in it), so that leaving it needs no lookup.
    slot: Cell<u32>,
    state: Cell<State>,
    close_code: Cell<u16>,
    /// The tasks this connection may wake, boxed while one waits and given back when
    /// none does: an idle plaintext connection has no task waiting on it.
    wakers: Cell<Option<Box<Wakers>>>,
    /// Plaintext: the socket, owned by the connection (closed when the last holder
    /// lets go: the parked reader, a writer task, the registry): `fd` is closed on drop.
    /// `false` on TLS, whose streams own theirs. (A flag, not an `OwnedFd` beside `fd`:
    /// the record stays in a smaller allocation class.)
    owns_fd: bool,
    /// A writer task exists (plaintext: while there is a backlog; TLS: always).
    writer_live: Cell<bool>,
    /// The writer holds frames taken from the queue that are not all in the kernel yet
    /// (the direct path waits for it: frames leave in queue order).
    writing: Cell<bool>,
    /// Frames may be sent directly from [`WsConn::enqueue`] (plaintext, writer started).
    direct: Cell<bool>,
    /// [`now_ms`] of the last write that ended (0 = none yet): the coalescing clock.
    last_write_ms: Cell<u32>,
    /// Worker-clock second of the last frame from the client.
    last_seen: Cell<u32>,
    /// Write coalescing window in milliseconds (0 = off), see [`WsConn::set_write_coalesce`].
    coalesce_ms: Cell<u16>,
    /// The client protocol: which frame of a broadcast it takes and which codes its
    /// closes carry. Set before the connection is shared, never changed.
    dialect: Dialect,
    /// permessage-deflate was agreed (`ws::deflate`) with this server window in bits
    /// (0: not agreed): large message frames go compressed, compressed client frames
    /// are accepted. Set before the connection is shared, never changed; it lives in
    /// padding (the record's size is unchanged).
    deflate_window: u8,
}

impl WsConn {
    pub fn new(id: u64, fd: RawFd, backlog_limit: usize, now_s: u32) -> WsConn {
        WsConn {
            id,
            fd,
            fd_open: Cell::new(true),
            backlog_limit: u32::try_from(backlog_limit).unwrap_or(u32::MAX),
            queue: RefCell::new(Queue::default()),
            queued_bytes: Cell::new(0),
            budget: std::cell::OnceCell::new(),
            charged: Cell::new(0),
            slot: Cell::new(u32::MAX),
            state: Cell::new(State::Open),
            close_code: Cell::new(0),
            wakers: Cell::new(None),
            owns_fd: false,
            writer_live: Cell::new(false),
            writing: Cell::new(false),
            direct: Cell::new(false),
            last_write_ms: Cell::new(0),
            last_seen: Cell::new(now_s),
            coalesce_ms: Cell::new(0),
            dialect: Dialect::Native,
            deflate_window: 0,
        }
    }

    /// The connection owns its socket `fd` (plaintext; before it is shared).
    pub fn owning(mut self, fd: OwnedFd) -> WsConn {
        debug_assert_eq!(fd.as_raw_fd(), self.fd);
        // Closed in `drop`.
        self.fd = fd.into_raw_fd();
        self.owns_fd = true;
        self
    }

    /// This connection speaks `dialect` (before it is shared: the fan-out reads it).
    pub fn with_dialect(mut self, dialect: Dialect) -> WsConn {
        self.dialect = dialect;
        self
    }

    #[inline]
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// This connection agreed to permessage-deflate: `window` is the agreement
    /// (`ws::deflate::negotiate::acceptable`: the server window in bits, 8 to 15, and
    /// whether the answer named it); before it is shared.
    pub fn with_compression(mut self, window: Option<u8>) -> WsConn {
        self.deflate_window =
            window.map_or(0, |w| super::deflate::negotiate::window(w).clamp(8, 15));
        self
    }

    /// Whether this connection agreed to permessage-deflate.
    #[inline]
    pub fn compresses(&self) -> bool {
        self.deflate_window != 0
    }

    /// Whether a compressed message of `payload` bytes (uncompressed) fits the window
    /// this connection agreed to: any with 15 bits (deflate's own window), else at most
    /// 2^window bytes (no context takeover: no reference reaches before the message).
    #[inline]
    pub fn deflate_fits(&self, payload: usize) -> bool {
        self.deflate_window >= 15 || payload <= 1usize << self.deflate_window
    }

    pub fn is_open(&self) -> bool {
        self.state.get() == State::Open
    }

    /// The close code the server sent, if it initiated or answered a close.
    pub fn close_code(&self) -> Option<u16> {
        (self.close_code.get() != 0).then(|| self.close_code.get())
    }

    pub fn last_seen(&self) -> u32 {
        self.last_seen.get()
    }

    pub fn touch(&self, now_s: u32) {
        self.last_seen.set(now_s);
    }

    /// Bytes queued and not yet handed to the kernel.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes.get() as usize
    }

    /// Take every queued frame without a writer (unit tests and benches drive the
    /// protocol and the fan-out without a socket).
    #[cfg(any(test, feature = "bench"))]
    pub fn take_queued(&self) -> Vec<Bytes> {
        self.queued_bytes.set(0);
        self.uncharge(self.charged_bytes());
        self.queue
            .borrow_mut()
            .take_all()
            .into_iter()
            .map(|(f, _)| f)
            .collect()
    }

    /// Count this connection's queue against the worker's budget from now on.
    pub fn attach_budget(&self, budget: Rc<WorkerBacklog>) {
        // Attached once, at registration (a second attach is ignored).
        let _ = self.budget.set(budget);
    }

    fn charge(&self, n: usize) {
        if let Some(b) = self.budget.get() {
            // Never more than the queue holds, which the backlog limit (a `u32`) bounds.
            let n32 = u32::try_from(n).unwrap_or(u32::MAX);
            self.charged.set(self.charged.get().saturating_add(n32));
            b.add(n);
        }
    }

    fn uncharge(&self, n: usize) {
        if let Some(b) = self.budget.get() {
            let n = n.min(self.charged_bytes());
            // `n` ≤ `charged`, a `u32`.
            self.charged.set(self.charged.get() - n as u32);
            b.sub(n);
        }
    }

    /// This connection's index in the worker's table of open WebSockets (`None`: not in it).
    pub fn slot(&self) -> Option<u32> {
        Some(self.slot.get()).filter(|&s| s != u32::MAX)
    }

    /// Set by that table when it takes the connection in (`None` when it lets it go).
    pub fn set_slot(&self, slot: Option<u32>) {
        self.slot.set(slot.unwrap_or(u32::MAX));
    }

    /// Queue a broadcast frame that other subscribers share (the fan-out): it counts in
    /// full against this connection's backlog, but only its queue slot against the
    /// worker's budget, since its bytes exist once for all of them. Borrowed: a frame
    /// sent at once is never cloned, so its reference count (shared by every worker's
    /// fan-out of the same message) is not touched per subscriber.
    pub fn send_shared(self: &Rc<Self>, frame: &Bytes) -> bool {
        self.enqueue(frame, false)
    }

    fn enqueue(self: &Rc<Self>, frame: &Bytes, own: bool) -> bool {
        if self.state.get() != State::Open {
            return false;
        }
        if self.queued_bytes() + frame.len() + QUEUE_SLOT_COST > self.backlog_limit() {
            self.close(Disconnect::SLOW_CONSUMER);
            crate::metrics::with(|m| m.slow_consumer_close());
            return false;
        }
        let mut sent = 0;
        if self.direct.get()
            && !self.writing.get()
            && self.fd_open.get()
            && self.queue.borrow().is_empty()
        {
            let window = u32::from(self.coalesce_ms.get());
            let now = if window == 0 { 0 } else { now_ms() };
            if self.window_passed(now, window) {
                match self.send_now(frame) {
                    Sent::All => {
                        if window != 0 {
                            self.last_write_ms.set(now);
                        }
                        return true;
                    }
                    Sent::Part(n) => {
                        if window != 0 {
                            self.last_write_ms.set(now);
                        }
                        sent = n;
                    }
                    Sent::WouldBlock => {}
                    Sent::Failed => {
                        self.abort();
                        return false;
                    }
                }
            }
        }
        let frame = if sent == 0 {
            frame.clone()
        } else {
            frame.slice(sent..)
        };
        let cost = frame.len() + QUEUE_SLOT_COST;
        // Within the backlog limit (checked above), so it fits the `u32`.
        let total = u32::try_from(self.queued_bytes() + cost).unwrap_or(u32::MAX);
        let mut q = self.queue.borrow_mut();
        let was_empty = q.is_empty();
        q.push_back((frame, own));
        self.queued_bytes.set(total);
        drop(q);
        self.charge(if own { cost } else { QUEUE_SLOT_COST });
        if was_empty {
            self.ensure_writer();
        }
        true
    }

    /// Whether a write now (`now`, from [`now_ms`]; unused when `window` is 0) is at least
    /// `window` ms after the last one.
    fn window_passed(&self, now: u32, window: u32) -> bool {
        let last = self.last_write_ms.get();
        window == 0 || last == 0 || now.wrapping_sub(last) >= window
    }

    /// One non-blocking `send` of `frame` on the socket (the direct path).
    fn send_now(&self, frame: &[u8]) -> Sent {
        loop {
            // SAFETY: `fd_open` was checked by the caller: the reader still holds its
            // half, so the descriptor is open and ours; the slice is valid for the call.
            let n = unsafe {
                libc::send(
                    self.fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                let n = n as usize;
                crate::metrics::with(|m| m.bytes_sent(n as u64));
                return if n == frame.len() {
                    Sent::All
                } else {
                    Sent::Part(n)
                };
            }
            if n == 0 {
                return Sent::WouldBlock;
            }
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return Sent::WouldBlock,
                // EPIPE, ECONNRESET, ...: the peer is gone.
                _ => return Sent::Failed,
            }
        }
    }

    /// Start the writer task, or wake it if it runs (frames were queued, or closing).
    fn ensure_writer(self: &Rc<Self>) {
        if self.writer_live.get() {
            self.wake_writer();
        } else if self.direct.get() && self.fd_open.get() && self.state.get() != State::Done {
            self.writer_live.set(true);
            monoio::spawn(write_loop(
                PlainWriter::new(self.fd),
                self.clone(),
                Bytes::new(),
            ));
        }
    }

    /// Start the connection's writer: it writes `preamble` (may be empty: the HTTP
    /// answers that precede the upgrade, the 101 last), then the queue. It is not
    /// charged to the backlog (the HTTP layer bounded it), and the connection is already
    /// registered while it is written, so a close decided meanwhile (revocation,
    /// shutdown) follows it. Plaintext writers end when idle and frames then go
    /// directly ([`FrameWrite::ON_DEMAND`]); TLS writers stay.
    pub fn start_writer<W: FrameWrite + 'static>(self: &Rc<Self>, wr: W, preamble: Bytes) {
        self.direct.set(W::ON_DEMAND);
        self.writer_live.set(true);
        self.writing.set(!preamble.is_empty());
        monoio::spawn(write_loop(wr, self.clone(), preamble));
    }

    /// What this connection holds against the worker's budget.
    pub fn charged_bytes(&self) -> usize {
        self.charged.get() as usize
    }

    /// Wait until at most `limit` bytes are queued, or the connection is no longer open
    /// (the reader's back-pressure: it reads no more frames from a client whose own
    /// queue is above the limit, so replies cannot pile up behind a client that does not
    /// read them; the kernel's buffers and TCP flow control hold the client back).
    async fn wait_drained(&self, limit: usize) {
        poll_fn(|cx| {
            if self.queued_bytes() <= limit || self.state.get() != State::Open {
                Poll::Ready(())
            } else {
                self.set_waiter(cx.waker());
                Poll::Pending
            }
        })
        .await
    }

    /// The backlog bound (`send_backlog_bytes`) in the bytes [`WsConn::send`] counts.
    pub fn backlog_limit(&self) -> usize {
        self.backlog_limit as usize
    }

    /// What queuing `frame` counts against the backlog.
    pub fn cost_of(frame: &Bytes) -> usize {
        frame.len() + QUEUE_SLOT_COST
    }

    /// Start a server-side close. The backlog is dropped for a slow consumer (it is what
    /// made it slow); otherwise queued frames go out first.
    pub fn close(self: &Rc<Self>, why: Disconnect) {
        // Decisions below use the native code; the peer gets its dialect's.
        let code = why.code;
        if self.state.get() != State::Open {
            return;
        }
        let why = self.dialect.translate(why);
        let mut q = self.queue.borrow_mut();
        if code == SLOW_CONSUMER {
            // The queue's memory goes at once: a slow consumer's backlog may be large.
            q.clear();
            self.queued_bytes.set(0);
            drop(q);
            self.uncharge(self.charged_bytes());
            q = self.queue.borrow_mut();
        }
        q.push_back((frame::close_frame(why.code, why.reason), false));
        drop(q);
        self.close_code.set(why.code);
        self.state.set(State::Closing);
        self.ensure_writer();
        let conn = self.clone();
        let grace = if code == SLOW_CONSUMER {
            SLOW_CLOSE_GRACE
        } else {
            CLOSE_GRACE
        };
        monoio::spawn(async move {
            monoio::time::sleep(grace).await;
            conn.abort();
        });
    }

    /// Shut the socket down now: pending reads see EOF, pending writes fail. On TLS this
    /// is the TCP socket under the session: no close_notify, which is what an abort means.
    pub fn abort(&self) {
        if self.fd_open.get() {
            // SAFETY: `fd_open` is true only while the reader still owns its half of
            // the stream, so the descriptor is open and still ours.
            unsafe {
                libc::shutdown(self.fd, libc::SHUT_RDWR);
            }
        }
        self.finish();
    }

    fn finish(&self) {
        self.state.set(State::Done);
        self.wake_writer();
        if let Some(w) = self.take_waiter() {
            w.wake();
        }
    }

    fn set_writer_waker(&self, w: &Waker) {
        let mut b = self.wakers.take().unwrap_or_default();
        b.writer = Some(w.clone());
        self.wakers.set(Some(b));
    }

    fn set_waiter(&self, w: &Waker) {
        let mut b = self.wakers.take().unwrap_or_default();
        b.waiter = Some(w.clone());
        self.wakers.set(Some(b));
    }

    /// Take one waker out; the box goes once neither is left.
    fn take_waker(&self, pick: fn(&mut Wakers) -> &mut Option<Waker>) -> Option<Waker> {
        let mut b = self.wakers.take()?;
        let w = pick(&mut b).take();
        if b.writer.is_some() || b.waiter.is_some() {
            self.wakers.set(Some(b));
        }
        w
    }

    /// The writer task's waker, if it waits for frames.
    pub(super) fn take_writer_waker(&self) -> Option<Waker> {
        self.take_waker(|b| &mut b.writer)
    }

    fn take_waiter(&self) -> Option<Waker> {
        self.take_waker(|b| &mut b.waiter)
    }

    fn wake_writer(&self) {
        if let Some(w) = self.take_writer_waker() {
            w.wake();
        }
    }

    /// Coalesce writes to this connection: a write that would follow the previous one
    /// by less than `window` waits until `window` has passed, so frames published in
    /// quick succession leave in one `writev`. A connection receiving less than one
    /// frame per window is never delayed; a hot one trades at most `window` of latency
    /// for one syscall (and its kernel TCP work) per batch instead of per frame.
    pub fn set_write_coalesce(&self, window: Duration) {
        self.coalesce_ms
            .set(window.as_millis().min(u128::from(u16::MAX)) as u16);
    }

    /// Wait until a frame is queued, the writer should stop, or (an on-demand writer)
    /// it has been idle for one coalescing window since its last write.
    async fn wait_frames(&self, on_demand: bool, timer: &mut Option<Pin<Box<Sleep>>>) -> Wake {
        let mut linger = false;
        if on_demand && self.queue.borrow().is_empty() {
            let window = u32::from(self.coalesce_ms.get());
            let last = self.last_write_ms.get();
            let since = if window == 0 || last == 0 {
                window
            } else {
                now_ms().wrapping_sub(last)
            };
            if since < window {
                let deadline =
                    monoio::time::Instant::now() + Duration::from_millis(u64::from(window - since));
                arm(timer, deadline);
                linger = true;
            }
        }
        poll_fn(|cx| {
            if !self.queue.borrow().is_empty() {
                return Poll::Ready(Wake::Frames);
            }
            if self.state.get() != State::Open {
                return Poll::Ready(Wake::Stop);
            }
            if on_demand {
                let idle = match timer.as_mut() {
                    Some(t) if linger => t.as_mut().poll(cx).is_ready(),
                    _ => true,
                };
                if idle {
                    return Poll::Ready(Wake::Idle);
                }
            }
            self.set_writer_waker(cx.waker());
            Poll::Pending
        })
        .await
    }

    /// Move queued frames into `batch`; whether the batch ends with the close frame.
    fn take_batch(&self, batch: &mut FrameBatch) -> bool {
        let mut q = self.queue.borrow_mut();
        let mut taken = 0usize;
        let mut uncharged = 0usize;
        while batch.bufs.len() < MAX_BATCH {
            let Some((f, own)) = q.pop_front() else { break };
            let cost = f.len() + QUEUE_SLOT_COST;
            taken += cost;
            uncharged += if own { cost } else { QUEUE_SLOT_COST };
            if batch.bufs.capacity() == 0 {
                batch.bufs.reserve_exact(q.len() + 1);
            }
            batch.bufs.push(f);
        }
        let left = self.queued_bytes().saturating_sub(taken);
        // No more than was queued: fits the `u32`.
        self.queued_bytes.set(left as u32);
        let done = q.is_empty() && self.state.get() == State::Closing;
        drop(q);
        self.uncharge(uncharged);
        // A reader paused by back-pressure may read again.
        if let Some(w) = self.take_waiter() {
            w.wake();
        }
        done
    }

    /// Wait until the writer is done (close frame flushed, or socket dead).
    pub async fn wait_done(&self) {
        poll_fn(|cx| {
            if self.state.get() == State::Done {
                Poll::Ready(())
            } else {
                self.set_waiter(cx.waker());
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for WsConn {
    fn drop(&mut self) {
        // Frames still queued when the connection ends leave the worker's budget too.
        self.uncharge(self.charged_bytes());
        if self.owns_fd {
            // SAFETY: `owning` took this descriptor over from an `OwnedFd`; nothing else
            // closes it, and every user of `fd` holds this record.
            unsafe {
                libc::close(self.fd);
            }
        }
    }
}

/// One worker's budget of queued bytes across all its WebSocket connections: what each
/// holds of its own (replies) in full, plus one queue slot per broadcast frame. Over the
/// budget, the worker closes the largest queues with 4008 first (`Shard::shed`), so a
/// public key opening thousands of connections that never read cannot make the worker
/// hold more than this. Thread-local, like the connections.
pub struct WorkerBacklog {
    total: Cell<usize>,
    budget: usize,
    over: Cell<Option<Waker>>,
}

impl WorkerBacklog {
    pub fn new(budget: usize) -> WorkerBacklog {
        WorkerBacklog {
            total: Cell::new(0),
            budget,
            over: Cell::new(None),
        }
    }

    pub fn total(&self) -> usize {
        self.total.get()
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    fn add(&self, n: usize) {
        let total = self.total.get() + n;
        self.total.set(total);
        if total > self.budget {
            if let Some(w) = self.over.take() {
                w.wake();
            }
        }
    }

    fn sub(&self, n: usize) {
        self.total.set(self.total.get().saturating_sub(n));
    }

    /// Resolves when the total is over the budget.
    pub async fn over_budget(&self) {
        poll_fn(|cx| {
            if self.total.get() > self.budget {
                Poll::Ready(())
            } else {
                self.over.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}
