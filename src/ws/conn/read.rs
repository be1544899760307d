//! The reader half of a connection: what the protocol layer does with messages
//! ([`Session`]), the reader's limits, the frame processing every reader shares
//! ([`process`]), the worker's scratch buffer (plaintext readers `recv` into it, see
//! `park.rs`), and the TLS reader task ([`read_loop`]) over [`WsRead`]. The invariants are the parent module's: a read is never
//! raced or dropped, a `readable()` poll may be; nothing partial stays in the scratch buffer.

use super::*;

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
/// readers are parked records, `park.rs`): today's [`AsyncReadRent`] read while a frame
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
pub(super) fn take_scratch() -> Box<[u8]> {
    SCRATCH_BUF
        .with(Cell::take)
        .unwrap_or_else(|| vec![0u8; SCRATCH].into_boxed_slice())
}

pub(super) fn put_scratch(buf: Box<[u8]>) {
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
    // Bytes that arrived with the upgrade request are processed first.
    let mut peer_closed = !process_vec(&conn, session, &mut asm, &mut pending, limits);
    while !peer_closed && conn.state.get() != State::Done {
        // `process` stops early only for back-pressure: then the queue is over the
        // limit, or was when it stopped (frames already read wait in `pending`).
        let stalled = conn.is_open() && !pending.is_empty() && has_frame(&pending);
        if conn.is_open() && (stalled || conn.queued_bytes() > limits.pause_backlog) {
            // Back-pressure: handle nothing more from this client until its queue
            // drained below the limit.
            conn.wait_drained(limits.pause_backlog).await;
            if conn.is_open() && !pending.is_empty() {
                peer_closed = !process_vec(&conn, session, &mut asm, &mut pending, limits);
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
                let (used, keep) = process(&conn, session, &mut asm, data, limits);
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
            peer_closed = !process_vec(&conn, session, &mut asm, &mut pending, limits);
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
    session.on_end(&conn);
    drop(rd);
}

/// [`process`] on a buffer of the connection's own, leaving the unprocessed tail in it.
pub(super) fn process_vec<S: Session>(
    conn: &Rc<WsConn>,
    session: &mut S,
    asm: &mut Assembler,
    buf: &mut Vec<u8>,
    limits: ReadLimits,
) -> bool {
    let (used, keep) = process(conn, session, asm, buf, limits);
    buf.drain(..used);
    keep
}

/// Decode and handle every complete frame in `buf`. Returns how many bytes were used
/// (the rest is an incomplete frame or held back by back-pressure) and `false` when the
/// reader should stop reading (peer closed or protocol error).
pub(super) fn process<S: Session>(
    conn: &Rc<WsConn>,
    session: &mut S,
    asm: &mut Assembler,
    buf: &mut [u8],
    limits: ReadLimits,
) -> (usize, bool) {
    let mut off = 0;
    while off < buf.len() {
        if conn.queued_bytes() > limits.pause_backlog && conn.is_open() {
            // Back-pressure: the rest waits in the buffer (see `read_loop`).
            break;
        }
        match process_frame(conn, session, asm, &mut buf[off..], limits) {
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

/// Decode and handle the frame `buf` starts with: the bytes it took, `None` while it is
/// incomplete, or why the connection closes.
fn process_frame<S: Session>(
    conn: &Rc<WsConn>,
    session: &mut S,
    asm: &mut Assembler,
    buf: &mut [u8],
    limits: ReadLimits,
) -> Result<Option<usize>, Disconnect> {
    let Some(view) = decode_frame_with(buf, limits.max_message, conn.compresses())? else {
        return Ok(None);
    };
    let incoming = asm.push_frame(
        view.opcode,
        view.fin,
        view.compressed,
        &mut buf[view.payload],
        limits.max_message,
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
                session.on_message(conn, op, data)
            } else {
                Ok(())
            }
        }
        Incoming::Compressed(op, data) => {
            if conn.is_open() {
                on_compressed(conn, session, op, data, limits.max_message)
            } else {
                Ok(())
            }
        }
    };
    asm.release();
    outcome.map(|()| Some(view.consumed))
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
pub(super) fn has_frame(buf: &[u8]) -> bool {
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
pub(super) fn contains_close(buf: &mut [u8], limits: ReadLimits) -> bool {
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
