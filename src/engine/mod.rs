//! The connection engine: one per worker, it wakes idle connections by readiness
//! without a task per connection (issue 21).
//!
//! An idle plaintext WebSocket is a record parked here ([`Ready`], boxed, in a slot of
//! the engine's slab) and a registration of its socket with the worker's private epoll
//! instance. Nothing else runs or waits for it: no task, no future, no read buffer,
//! no in-flight operation. One task per worker ([`run`]) waits for the epoll descriptor
//! to become readable through monoio (one poll on monoio's io_uring, or one entry in
//! the legacy driver's epoll), collects the ready descriptors without blocking and
//! hands each parked record its turn ([`Ready::ready`]), synchronously, on the worker.
//!
//! Invariants:
//! - A leaf of the layers: it knows only its [`Ready`] records, never a connection,
//!   a project or a channel.
//! - A slot is keyed by a [`Token`]: index and generation. A slot is reused only after
//!   [`Engine::release`], which bumps the generation, so a readiness reported for a
//!   connection that has ended (its event was already collected) finds a stale token
//!   and is dropped, never delivered to the next tenant of the slot.
//! - A record is either in its slot (parked: its socket is armed, level-triggered) or
//!   held by whoever took it out (the engine during its turn, or a task of its own while
//!   it waits for something other than its socket: back-pressure, a close handshake).
//!   Taking it out to a task unregisters the socket ([`Engine::hold`]), so a socket
//!   with unread bytes (or hung up: reported whatever the mask) does not report itself
//!   in a loop; parking it again registers it again.
//! - Level-triggered: a record may read only part of what is waiting; the rest is
//!   reported again on the next pass. Nothing is lost if a turn stops early.
//! - A turn never blocks and never awaits: it runs inside the engine's pass. What must
//!   wait is handed to a task by the record itself.
//! - Why epoll and not io_uring multishot poll: monoio 0.2's public API cannot submit a
//!   raw or multishot operation to its ring, and the legacy driver needs this backend
//!   anyway (CI runs the whole suite on it). The cost per connection is the same (a
//!   kernel registration, no user memory); the difference is one `epoll_ctl` per
//!   connection's life instead of one SQE. See docs/architecture.md.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;

/// A parked record: it gets its turn when its socket is readable (or hung up).
pub trait Ready {
    /// The socket is readable, or at end of stream, or in error. The record is out of
    /// its slot for the call: it parks itself again ([`Engine::park`]), or hands itself
    /// to a task ([`Engine::hold`] first), or ends ([`Engine::release`]). `token` names
    /// its slot (so an idle record need not keep it).
    fn ready(self: Box<Self>, engine: &Rc<Engine>, token: Token);
}

/// A slot of the engine's slab: index (low 32 bits) and generation (high 32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

impl Token {
    fn new(index: u32, gen: u32) -> Token {
        Token(u64::from(gen) << 32 | u64::from(index))
    }

    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }

    fn gen(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// One slot: 24 bytes per connection.
struct Slot {
    gen: u32,
    /// The socket is registered with readiness on (a record that waits in a task is
    /// registered with none).
    armed: bool,
    parked: Option<Box<dyn Ready>>,
}

/// Most readiness events collected per `epoll_wait`.
const BATCH: usize = 256;

/// One worker's engine (see the module doc).
pub struct Engine {
    epoll: OwnedFd,
    slots: RefCell<Vec<Slot>>,
    /// Indices of released slots, reused first (the slab does not grow past the
    /// worker's peak of connections).
    free: RefCell<Vec<u32>>,
    live: Cell<usize>,
    /// Registrations so far (the allocator upkeep tells a connection storm by it).
    registered: Cell<u64>,
}

thread_local! {
    static ENGINE: RefCell<Option<Rc<Engine>>> = const { RefCell::new(None) };
}

/// Make this worker's engine and start its task (inside the worker's runtime).
pub fn install() -> io::Result<Rc<Engine>> {
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
    let engine = Rc::new(Engine {
        epoll,
        slots: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        live: Cell::new(0),
        registered: Cell::new(0),
    });
    ENGINE.with(|e| *e.borrow_mut() = Some(engine.clone()));
    monoio::spawn(run(engine.clone()));
    Ok(engine)
}

/// This worker's engine, if installed.
pub(crate) fn current() -> Option<Rc<Engine>> {
    ENGINE.with(|e| e.borrow().clone())
}

impl Engine {
    /// Make room for `n` slots at once. A vector's unwritten tail is address space, not
    /// resident memory, so this costs nothing until connections come; what it saves is
    /// the slab's doublings during a connection storm, each a copy of the whole slab
    /// whose old buffer the allocator may keep resident for a while.
    pub fn reserve(&self, n: usize) {
        let mut slots = self.slots.borrow_mut();
        let more = n.saturating_sub(slots.len());
        // Best effort: a bound too large to reserve only means the slab grows as before.
        let _ = slots.try_reserve_exact(more);
    }

    /// Register `fd` for readiness and reserve a slot for its record (not parked yet:
    /// events before [`Engine::park`] find the slot empty; level-triggered, they are
    /// reported again on the next pass).
    pub fn register(&self, fd: RawFd) -> io::Result<Token> {
        let mut slots = self.slots.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(slots.len()).map_err(|_| io::Error::other("engine full"))?;
                slots.push(Slot {
                    gen: 0,
                    armed: false,
                    parked: None,
                });
                i
            }
        };
        let slot = &mut slots[index as usize];
        let token = Token::new(index, slot.gen);
        if let Err(e) = self.ctl(libc::EPOLL_CTL_ADD, fd, READ, token) {
            drop(slots);
            self.free.borrow_mut().push(index);
            return Err(e);
        }
        slot.armed = true;
        self.live.set(self.live.get() + 1);
        self.registered.set(self.registered.get() + 1);
        Ok(token)
    }

    /// Register the socket again after [`Engine::hold`] (a no-op while registered).
    /// Call before [`Engine::park`]; on an error the record must end instead (it would
    /// never be woken).
    pub fn arm(&self, token: Token, fd: RawFd) -> io::Result<()> {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = live_slot(&mut slots, token) else {
            return Ok(());
        };
        if !slot.armed {
            self.ctl(libc::EPOLL_CTL_ADD, fd, READ, token)?;
            slot.armed = true;
        }
        Ok(())
    }

    /// Put a record back in its slot (its socket registered: see [`Engine::arm`]).
    pub fn park(&self, token: Token, record: Box<dyn Ready>) {
        let mut slots = self.slots.borrow_mut();
        if let Some(slot) = live_slot(&mut slots, token) {
            slot.parked = Some(record);
        }
    }

    /// The record leaves for a task of its own: its socket is disarmed until it parks
    /// again (it would otherwise be reported on every pass while it has unread bytes).
    pub fn hold(&self, token: Token, fd: RawFd) {
        let mut slots = self.slots.borrow_mut();
        if let Some(slot) = live_slot(&mut slots, token) {
            self.unregister(slot, token, fd);
        }
    }

    /// Take an armed socket out of epoll. Removed, not disarmed: a hang-up or an error
    /// is reported even with no events asked for, and level-triggered it would be
    /// reported every pass.
    fn unregister(&self, slot: &mut Slot, token: Token, fd: RawFd) {
        if slot.armed {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, token);
            slot.armed = false;
        }
    }

    /// The connection is over: unregister its socket (before it is closed) and free
    /// the slot for reuse under a new generation.
    pub fn release(&self, token: Token, fd: RawFd) {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = live_slot(&mut slots, token) else {
            return;
        };
        self.unregister(slot, token, fd);
        slot.gen = slot.gen.wrapping_add(1);
        let parked = slot.parked.take();
        drop(slots);
        // Dropped outside the borrow: a record's drop may touch the engine.
        drop(parked);
        self.free.borrow_mut().push(token.index() as u32);
        self.live.set(self.live.get() - 1);
    }

    /// Connections registered so far (ever).
    pub fn registered(&self) -> u64 {
        self.registered.get()
    }

    /// Connections registered now.
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.live.get()
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: Token) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: token.0,
        };
        // SAFETY: `ev` is a valid event for the call; `fd` is the caller's open socket.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Give each record whose socket is ready its turn (at most `events.len()`).
    fn pass(self: &Rc<Self>, events: &mut [libc::epoll_event]) {
        // SAFETY: `events` is a valid buffer of `events.len()` entries; timeout 0 never
        // blocks the worker.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                0,
            )
        };
        if n <= 0 {
            return;
        }
        for ev in &events[..n as usize] {
            let token = Token(ev.u64);
            let record =
                live_slot(&mut self.slots.borrow_mut(), token).and_then(|s| s.parked.take());
            // `None`: released since the event was collected, or in a task's hands.
            if let Some(record) = record {
                record.ready(self, token);
            }
        }
    }
}

/// The slot `token` names, unless it was released since (a stale generation).
fn live_slot(slots: &mut [Slot], token: Token) -> Option<&mut Slot> {
    slots
        .get_mut(token.index())
        .filter(|s| s.gen == token.gen())
}

/// Readiness a parked connection waits for: bytes, the peer's hang-up, errors (the
/// last two are always reported).
const READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;

/// The engine's task: wait (through monoio) for the epoll descriptor, run one pass,
/// wait again.
async fn run(engine: Rc<Engine>) {
    // monoio waits on a duplicate of the epoll descriptor (it owns and closes what it
    // is given); both name the same epoll instance.
    // SAFETY: plain syscall on our own open descriptor; the result is checked.
    let dup = unsafe { libc::fcntl(engine.epoll.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        tracing::error!(
            "engine: cannot watch the epoll descriptor: {}",
            io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: `dup` is a fresh descriptor owned by nothing else. monoio's `UnixStream`
    // is only used to wait for readiness (its `readable`), never to read or write.
    let std = unsafe { std::os::unix::net::UnixStream::from_raw_fd(dup) };
    let waiter = match monoio::net::UnixStream::from_std(std) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("engine: cannot watch the epoll descriptor: {e}");
            return;
        }
    };
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; BATCH];
    loop {
        // Not relaxed: under the legacy driver, monoio confirms with poll(2).
        if waiter.readable(false).await.is_err() {
            tracing::error!("engine: waiting for readiness failed");
            return;
        }
        // One pass per wake-up, then the other tasks of the worker (the mailbox's
        // fan-out, writers, HTTP) get their turn before the next: a flood of client
        // frames on many connections cannot hold the worker in this loop. Events left
        // over (level-triggered) are reported again at once. The explicit yield
        // matters on the legacy driver, whose readiness wait returns at once, without
        // yielding, while the descriptor stays readable.
        engine.pass(&mut events);
        yield_now().await;
    }
}

/// Let every other ready task of the worker run once before going on.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests;
