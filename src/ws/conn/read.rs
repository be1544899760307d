//! The read side of a connection, from the socket to the session: what the protocol
//! layer does with messages ([`Session`]), the reader's limits, the frame processing
//! every reader shares ([`Frames`]: frames decoded by `ws::frame`, reassembled by
//! `ws::message`, each message handed to the session), the worker's scratch buffer, and
//! the two readers over it:
//!
//! - plaintext: a parked record ([`Parked`]) in the worker's engine (`crate::engine`),
//!   instead of a task: while the connection is idle it is this record and nothing
//!   else. When its socket is readable the engine gives it a turn ([`Ready::ready`]):
//!   one `recv(MSG_DONTWAIT)` into the worker's scratch buffer and [`Frames::process`],
//!   synchronously, then it parks again. Only what must wait leaves the engine for a
//!   task of its own, which parks the record again when the wait is over:
//!   back-pressure (the client's own queue is over `ws_read_pause_bytes`) and the close
//!   handshake (waiting up to [`CLOSE_GRACE`] for the close frame to be flushed);
//! - TLS: a reader task ([`read_loop`]) over [`WsRead`].
//!
//! Invariants (with the parent module's): a read is never raced or dropped, a
//! `readable()` poll may be; nothing partial stays in the scratch buffer (a partial
//! frame's tail moves to the record's `pending`, freed when empty); a parked record is
//! released from the engine before its socket can close (the connection owns the
//! descriptor and the record holds the connection); `Session::on_end` runs exactly once.

use super::*;
use crate::engine::{Engine, Ready, Token};

/// What the protocol layer does with complete messages.
pub trait Session {
    /// A complete data message: text (valid UTF-8) or binary.
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), Disconnect>;

    /// The connection is over (called once, after the socket is shut down).
    fn on_end(&mut self, conn: &Rc<WsConn>);

    /// What the reader needs that is the same for every connection of the worker (held
    /// by the session's worker context, so that a parked record holds no pointer to it).
    fn read_ctx(&self) -> &ReadCtx;
}

/// Reader-side knobs.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// Largest message (one frame or a reassembled fragmented message), bytes.
    pub max_message: usize,
    /// Most frames one message may arrive in (empty continuations count), count.
    pub max_fragments: usize,
    /// Back-pressure: no more client frames are handled while more than this many bytes
    /// wait in the connection's queue (`ws_read_pause_bytes`).
    pub pause_backlog: usize,
}

/// The read side of a WebSocket connection as the reader task needs it (TLS; plaintext
/// readers are parked records, below): today's [`AsyncReadRent`] read while a frame
/// is partial (into the connection's pending buffer), and [`WsRead::read_idle`] while
/// none is.
pub trait WsRead: AsyncReadRent {
    /// Wait for bytes while no frame is partial. An empty buffer is the end of the
    /// stream.
    fn read_idle(&mut self) -> impl Future<Output = std::io::Result<Vec<u8>>>;

    /// Take back the buffer [`WsRead::read_idle`] returned, once processed.
    fn recycle(&mut self, buf: Vec<u8>) {
        drop(buf);
    }
}

/// The worker's scratch buffer for readiness reads: one per thread, lent to one reader
/// at a time and only between a `recv` and the end of its (synchronous) processing.
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: Cell<Option<Box<[u8]>>> = const { Cell::new(None) };
}

/// Borrow the worker's scratch buffer (made on first use; should a reader ever find it
/// lent out, it gets a fresh one rather than waiting or panicking).
fn take_scratch() -> Box<[u8]> {
    SCRATCH_BUF
        .with(Cell::take)
        .unwrap_or_else(|| vec![0u8; SCRATCH].into_boxed_slice())
}

fn put_scratch(buf: Box<[u8]>) {
    SCRATCH_BUF.with(|s| s.set(Some(buf)));
}

/// The reader task: decode frames, run the session, answer pings and closes. Returns
/// when the connection is over; the socket is shut down by then.
pub async fn read_loop<S: Session, R: WsRead>(
    mut rd: R,
    conn: Rc<WsConn>,
    session: &mut S,
    limits: ReadLimits,
    clock: impl Fn() -> u32,
    mut pending: Vec<u8>,
) {
    let mut asm = Assembler::new(limits.max_fragments);
    let mut frames = Frames {
        conn: &conn,
        session,
        asm: &mut asm,
        limits,
    };
    // Bytes that arrived with the upgrade request are processed first.
    let mut peer_closed = !frames.process_vec(&mut pending);
    while !peer_closed && conn.state.get() != State::Done {
        // `Frames::process` stops early only for back-pressure: then the queue is over the
        // limit, or was when it stopped (frames already read wait in `pending`).
        let stalled = conn.is_open() && !pending.is_empty() && has_frame(&pending);
        if conn.is_open() && (stalled || conn.queued_bytes() > limits.pause_backlog) {
            // Back-pressure: handle nothing more from this client until its queue
            // drained below the limit.
            conn.wait_drained(limits.pause_backlog).await;
            if conn.is_open() && !pending.is_empty() {
                peer_closed = !frames.process_vec(&mut pending);
                if pending.is_empty() && pending.capacity() > 0 {
                    pending = Vec::new();
                }
                continue;
            }
        }
        if pending.is_empty() {
            // No frame is partial: read by readiness, nothing parked per connection.
            let mut chunk = match rd.read_idle().await {
                Ok(c) => c,
                Err(_) => break,
            };
            // From here to `recycle` nothing awaits: the scratch buffer is lent only
            // for this synchronous pass.
            let data = chunk.as_mut_slice();
            if data.is_empty() {
                rd.recycle(chunk);
                break;
            }
            conn.touch(clock());
            if conn.state.get() != State::Open {
                // Closing: only the peer's close frame matters now.
                peer_closed = contains_close(data, limits);
            } else {
                let (used, keep) = frames.process(data);
                peer_closed = !keep;
                // A partial frame, or frames held back by back-pressure: they move to
                // the connection's own buffer, never wait in the shared scratch.
                pending.extend_from_slice(&data[used..]);
            }
            rd.recycle(chunk);
        } else {
            let (res, mut buf) = rd.read(Vec::with_capacity(BULK_READ)).await;
            match res {
                Ok(n) if n > 0 => {}
                _ => break,
            }
            conn.touch(clock());
            if conn.state.get() != State::Open {
                peer_closed = contains_close(&mut buf, limits);
                continue;
            }
            pending.extend_from_slice(&buf);
            drop(buf);
            peer_closed = !frames.process_vec(&mut pending);
        }
        if pending.is_empty() && pending.capacity() > 0 {
            pending = Vec::new();
        }
    }
    // Let the close reply (ours or the echo of the peer's) leave before shutting down.
    if conn.state.get() == State::Closing {
        let _ = Box::pin(monoio::time::timeout(CLOSE_GRACE, conn.wait_done())).await;
    }
    conn.abort();
    conn.fd_open.set(false);
    frames.session.on_end(&conn);
    drop(rd);
}

/// One pass of frame processing: the connection, its session, its message assembler
/// and the reader's limits, borrowed together by whichever reader holds them (the TLS
/// reader task, or the parked record during its turn).
struct Frames<'a, S> {
    conn: &'a Rc<WsConn>,
    session: &'a mut S,
    asm: &'a mut Assembler,
    limits: ReadLimits,
}

impl<S: Session> Frames<'_, S> {
    /// [`Frames::process`] on a buffer of the connection's own, leaving the unprocessed
    /// tail in it.
    fn process_vec(&mut self, buf: &mut Vec<u8>) -> bool {
        let (used, keep) = self.process(buf);
        buf.drain(..used);
        keep
    }

    /// Decode and handle every complete frame in `buf`. Returns how many bytes were used
    /// (the rest is an incomplete frame or held back by back-pressure) and `false` when
    /// the reader should stop reading (peer closed or protocol error).
    fn process(&mut self, buf: &mut [u8]) -> (usize, bool) {
        let conn = self.conn;
        let mut off = 0;
        while off < buf.len() {
            if conn.queued_bytes() > self.limits.pause_backlog && conn.is_open() {
                // Back-pressure: the rest waits in the buffer (see `read_loop`).
                break;
            }
            match self.frame(&mut buf[off..]) {
                Ok(Some(consumed)) => off += consumed,
                Ok(None) => break,
                Err(reason) => {
                    // The peer's close, a protocol error or the session's verdict: the
                    // rest of the buffer is dropped and reading stops.
                    conn.close(reason);
                    return (buf.len(), false);
                }
            }
        }
        (off, true)
    }

    /// Decode and handle the frame `buf` starts with: the bytes it took, `None` while it
    /// is incomplete, or why the connection closes.
    fn frame(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Disconnect> {
        let (conn, max_message) = (self.conn, self.limits.max_message);
        let Some(view) = decode_frame_with(buf, max_message, conn.compresses())? else {
            return Ok(None);
        };
        let incoming = self.asm.push_frame(
            view.opcode,
            view.fin,
            view.compressed,
            &mut buf[view.payload],
            max_message,
        )?;
        let outcome = match incoming {
            Incoming::None | Incoming::Pong => Ok(()),
            Incoming::Ping(data) => {
                conn.send(frame::frame(Opcode::Pong, data));
                Ok(())
            }
            Incoming::Close(code) => return Err(Disconnect::echo(code)),
            Incoming::Message(op, data) => {
                if conn.is_open() {
                    self.session.on_message(conn, op, data)
                } else {
                    Ok(())
                }
            }
            Incoming::Compressed(op, data) => {
                if conn.is_open() {
                    on_compressed(conn, self.session, op, data, max_message)
                } else {
                    Ok(())
                }
            }
        };
        self.asm.release();
        outcome.map(|()| Some(view.consumed))
    }
}

thread_local! {
    /// The worker's buffer for inflated messages (one message at a time, synchronously).
    static INFLATED: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Inflated buffers up to this size are kept for the next message; a larger one goes.
const KEEP_INFLATED: usize = 64 * 1024;

/// A compressed message: inflate it (bounded by `max_message`: over it, 1009, and the
/// inflater stops there), check text, hand it to the session.
fn on_compressed<S: Session>(
    conn: &Rc<WsConn>,
    session: &mut S,
    opcode: Opcode,
    data: &[u8],
    max_message: usize,
) -> Result<(), Disconnect> {
    use crate::ws::deflate::codec::{inflate, InflateError};
    let mut out = INFLATED.with(Cell::take);
    let result = match inflate(data, max_message, &mut out) {
        Err(InflateError::TooLarge) => Err(Disconnect::INFLATED_TOO_LARGE),
        Err(InflateError::Invalid) => Err(Disconnect::INVALID_COMPRESSED),
        Ok(()) if opcode == Opcode::Text && std::str::from_utf8(&out).is_err() => {
            Err(Disconnect::INVALID_UTF8)
        }
        Ok(()) => session.on_message(conn, opcode, &mut out),
    };
    if out.capacity() <= KEEP_INFLATED {
        out.clear();
        INFLATED.with(|c| c.set(out));
    }
    result
}

/// Whether `buf` starts with a whole frame (its header says how long it is). Cheap: reads
/// at most the 14 header bytes; the payload is not looked at.
fn has_frame(buf: &[u8]) -> bool {
    if buf.len() < 2 {
        return false;
    }
    let masked = buf[1] & 0x80 != 0;
    let (len, header) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() >= 10 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (u64::from_be_bytes(b), 10)
        }
        126 | 127 => return false,
        n => (u64::from(n), 2),
    };
    let need = header as u64 + if masked { 4 } else { 0 } + len;
    buf.len() as u64 >= need
}

/// While closing: whether `buf` holds the peer's close frame (anything else is dropped).
fn contains_close(buf: &mut [u8], limits: ReadLimits) -> bool {
    let mut off = 0;
    while off < buf.len() {
        // Closing: RSV1 is tolerated, only the close frame is looked for.
        match decode_frame_with(&mut buf[off..], limits.max_message, true) {
            Ok(Some(v)) if v.opcode == Opcode::Close => return true,
            Ok(Some(v)) => off += v.consumed,
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
    false
}

/// What the reader needs that is the same for every connection of a worker.
pub struct ReadCtx {
    pub limits: ReadLimits,
    /// The worker's clock in seconds (`WsConn::touch`).
    pub clock: Box<dyn Fn() -> u32>,
}

/// An idle plaintext reader: the whole state of a connection's read side.
pub(crate) struct Parked<S: Session, H: 'static> {
    conn: Rc<WsConn>,
    session: S,
    asm: Assembler,
    /// A partial frame, or frames held back by back-pressure (`None` while there is
    /// none: an idle record holds one pointer for it).
    // Boxed on purpose: 8 bytes in every idle record instead of a 24-byte `Vec`.
    #[allow(clippy::box_collection)]
    pending: Option<Box<Vec<u8>>>,
    /// What lives exactly as long as the reader (admission and per-project slots).
    _held: H,
}

/// What the reader does after a turn.
enum Next {
    /// Wait for readiness again.
    Park,
    /// Its queue is over the pause limit: wait for it to drain (in a task).
    Paused,
    /// The connection is over (or closing): end the reader.
    Finish,
}

/// Start the reader of a plaintext connection in `engine`: the bytes that came with
/// the upgrade request (`pending`) are processed first. Should the engine refuse the
/// socket, the connection ends at once (its session too).
pub fn start_parked<S: Session + 'static, H: 'static>(
    engine: &Rc<Engine>,
    conn: Rc<WsConn>,
    session: S,
    pending: Vec<u8>,
    held: H,
) {
    let token = match engine.register(conn.fd) {
        Ok(t) => t,
        Err(e) => {
            // Only the kernel refusing memory can cause this: end the connection.
            tracing::warn!("engine: cannot register a connection: {e}");
            conn.abort();
            conn.fd_open.set(false);
            let mut session = session;
            session.on_end(&conn);
            drop(held);
            return;
        }
    };
    let mut p = Box::new(Parked {
        asm: Assembler::new(session.read_ctx().limits.max_fragments),
        conn,
        session,
        pending: (!pending.is_empty()).then(|| Box::new(pending)),
        _held: held,
    });
    let next = if p.pending.is_none() {
        Next::Park
    } else if p.process_pending() {
        p.after()
    } else {
        Next::Finish
    };
    p.follow(engine, token, next);
}

impl<S: Session + 'static, H: 'static> Ready for Parked<S, H> {
    fn ready(mut self: Box<Self>, engine: &Rc<Engine>, token: Token) {
        let next = self.turn();
        self.follow(engine, token, next);
    }
}

impl<S: Session + 'static, H: 'static> Parked<S, H> {
    /// One readiness turn: read what is there (up to the scratch buffer) and handle it.
    fn turn(&mut self) -> Next {
        let mut buf = take_scratch();
        let n = loop {
            // SAFETY: `buf` is a live allocation of `buf.len()` bytes we own; the
            // descriptor is open (the connection owns it and `conn` is held).
            let n = unsafe {
                libc::recv(
                    self.conn.fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => continue,
                // Reported ready, nothing there (a spurious wake-up): wait again.
                std::io::ErrorKind::WouldBlock => {
                    put_scratch(buf);
                    return Next::Park;
                }
                _ => {
                    put_scratch(buf);
                    return Next::Finish;
                }
            }
        };
        if n == 0 {
            put_scratch(buf);
            return Next::Finish;
        }
        let ctx = self.session.read_ctx();
        self.conn.touch((ctx.clock)());
        let limits = ctx.limits;
        let data = &mut buf[..n];
        let next = if self.conn.state.get() != State::Open {
            // Closing: only the peer's close frame matters now.
            if contains_close(data, limits) {
                Next::Finish
            } else {
                Next::Park
            }
        } else if self.pending.is_none() {
            let mut frames = Frames {
                conn: &self.conn,
                session: &mut self.session,
                asm: &mut self.asm,
                limits,
            };
            let (used, keep) = frames.process(data);
            // A partial frame, or frames held back by back-pressure, move to the
            // record's own buffer: the scratch buffer is the worker's.
            if used < data.len() {
                self.pending = Some(Box::new(data[used..].to_vec()));
            }
            if keep {
                self.after()
            } else {
                Next::Finish
            }
        } else {
            if let Some(p) = self.pending.as_mut() {
                p.extend_from_slice(data);
            }
            if self.process_pending() {
                self.after()
            } else {
                Next::Finish
            }
        };
        put_scratch(buf);
        next
    }

    /// Handle the complete frames in `pending`; `false` when reading should stop.
    fn process_pending(&mut self) -> bool {
        let limits = self.session.read_ctx().limits;
        let Some(pending) = self.pending.as_mut() else {
            return true;
        };
        let mut frames = Frames {
            conn: &self.conn,
            session: &mut self.session,
            asm: &mut self.asm,
            limits,
        };
        let keep = frames.process_vec(pending);
        if pending.is_empty() {
            self.pending = None;
        }
        keep
    }

    /// After frames were handled: park, pause, or finish (the writer gave up).
    fn after(&self) -> Next {
        if self.conn.state.get() == State::Done {
            return Next::Finish;
        }
        let stalled = self.pending.as_ref().is_some_and(|p| has_frame(p));
        if self.conn.is_open()
            && (stalled || self.conn.queued_bytes() > self.session.read_ctx().limits.pause_backlog)
        {
            Next::Paused
        } else {
            Next::Park
        }
    }

    /// `token`: the record's slot (carried by whoever holds the record, not by it).
    fn follow(self: Box<Self>, engine: &Rc<Engine>, token: Token, next: Next) {
        match next {
            Next::Park => {
                match engine.arm(token, self.conn.fd) {
                    Ok(()) => engine.park(token, self),
                    Err(e) => {
                        // Not woken again: end it rather than leave it deaf.
                        tracing::warn!("engine: cannot watch a connection again: {e}");
                        self.finish(engine, token);
                    }
                }
            }
            Next::Paused => {
                engine.hold(token, self.conn.fd);
                monoio::spawn(self.paused(engine.clone(), token));
            }
            Next::Finish => self.finish(engine, token),
        }
    }

    /// Back-pressure: handle nothing more from this client until its queue drained
    /// below the limit, then handle what waited and park again.
    async fn paused(mut self: Box<Self>, engine: Rc<Engine>, token: Token) {
        loop {
            let pause = self.session.read_ctx().limits.pause_backlog;
            self.conn.wait_drained(pause).await;
            if self.conn.is_open() && self.pending.is_some() && !self.process_pending() {
                self.finish(&engine, token);
                return;
            }
            match self.after() {
                Next::Paused => continue,
                next => {
                    self.follow(&engine, token, next);
                    return;
                }
            }
        }
    }

    /// The reader is done: unregister, let a close reply leave (up to the grace), shut
    /// the socket down, end the session.
    fn finish(self: Box<Self>, engine: &Rc<Engine>, token: Token) {
        engine.release(token, self.conn.fd);
        if self.conn.state.get() == State::Closing {
            monoio::spawn(async move {
                let _ = monoio::time::timeout(CLOSE_GRACE, self.conn.wait_done()).await;
                self.end();
            });
        } else {
            self.end();
        }
    }

    fn end(mut self: Box<Self>) {
        self.conn.abort();
        self.conn.fd_open.set(false);
        self.session.on_end(&self.conn);
        // The socket closes when the last holder of the connection lets go (its
        // writer may still be flushing nothing: it was shut down above).
        drop(self);
    }
}
