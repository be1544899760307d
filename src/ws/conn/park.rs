//! The reader of a plaintext connection as a parked record ([`Parked`]) in the worker's
//! engine (`crate::engine`), instead of a task: while the connection is idle it is this
//! record and nothing else. When its socket is readable the engine gives it a turn
//! ([`Ready::ready`]): one `recv(MSG_DONTWAIT)` into the worker's scratch buffer and the
//! same frame processing as the task reader ([`process`]), synchronously, then it parks
//! again. Only what must wait leaves the engine for a task of its own, which parks the
//! record again when the wait is over: back-pressure (the client's own queue is over
//! `ws_read_pause_bytes`) and the close handshake (waiting up to [`CLOSE_GRACE`] for
//! the close frame to be flushed).
//!
//! Invariants (with the parent module's): nothing partial stays in the scratch buffer
//! (a partial frame's tail moves to the record's `pending`, freed when empty); the
//! record is released from the engine before its socket can close (the connection
//! owns the descriptor and the record holds the connection); `Session::on_end` runs
//! exactly once.

use super::*;
use crate::engine::{Engine, Ready, Token};

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
            let (used, keep) = process(&self.conn, &mut self.session, &mut self.asm, data, limits);
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
        let keep = process_vec(
            &self.conn,
            &mut self.session,
            &mut self.asm,
            pending,
            limits,
        );
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
