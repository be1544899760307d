//! The writer half of a connection: the batch of frames handed to the stream in one
//! write ([`FrameBatch`]), the write side as the writer needs it ([`FrameWrite`], one impl
//! per transport) and the writer task ([`write_loop`]). The invariants are the parent
//! module's: only one of the direct path and the writer writes at a time, frames leave in
//! queue order, frames waiting together leave in one write.

use super::*;

/// Frames handed to the stream in one write, with their iovecs (built only by the
/// plaintext writer for a batch of more than one frame; TLS hands the frames to rustls
/// as slices).
#[derive(Default)]
pub struct FrameBatch {
    pub(super) bufs: Vec<Bytes>,
    iov: Vec<libc::iovec>,
}

impl FrameBatch {
    /// The frames still to write, oldest first (the first may be partly written already).
    pub fn frames(&self) -> &[Bytes] {
        &self.bufs
    }

    fn rebuild(&mut self) {
        self.iov.clear();
        // Sized to the batch: one frame (the common case) costs one iovec, not four.
        self.iov.reserve_exact(self.bufs.len());
        self.iov.extend(self.bufs.iter().map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        }));
    }

    /// Drop `n` written bytes from the front.
    fn advance(&mut self, mut n: usize) {
        let mut done = 0;
        for b in self.bufs.iter_mut() {
            if n >= b.len() {
                n -= b.len();
                done += 1;
            } else {
                *b = b.slice(n..);
                break;
            }
        }
        self.bufs.drain(..done);
    }
}

// SAFETY: the iovecs point into the `Bytes` held in `bufs`, which are neither moved nor
// mutated while the runtime owns the batch (the struct is only touched again after the
// operation returns it), so every pointer stays valid for the operation's lifetime.
unsafe impl IoVecBuf for FrameBatch {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}

/// The write side of a WebSocket connection, as the writer task needs it.
///
/// `write_frames` hands the front of the batch to the stream and returns how many bytes
/// were taken (a partial write is fine: the writer advances and calls again). It must
/// take at least one byte of a non-empty batch or fail. `close_write` ends the sending side
/// after the close frame (TLS: close_notify first).
pub trait FrameWrite: Sized {
    /// The writer task runs only while there is a backlog; frames otherwise go by direct
    /// send (plaintext). `false`: a resident writer (TLS: rustls' state lives in it).
    const ON_DEMAND: bool = false;
    fn write_frames(
        &mut self,
        batch: FrameBatch,
    ) -> impl Future<Output = BufResult<usize, FrameBatch>>;
    fn close_write(&mut self) -> impl Future<Output = std::io::Result<()>>;
    /// The writer ends (called with no operation in flight): let go of what it holds.
    fn done(&mut self) {}
}

/// Plaintext: the connection's socket, written through monoio (one `send`, or one
/// `writev` for several frames, straight from the shared frames) so that the writes of
/// every backlogged connection of a worker leave in one ring submission, not one
/// syscall each. The monoio stream is made when the writer first writes and taken apart
/// when it ends ([`FrameWrite::done`]): an idle connection holds none. It never owns
/// the socket (the connection does): on io_uring the stream is lent the connection's own
/// descriptor (monoio registers nothing there, so making it cannot fail, and the
/// descriptor is taken back unclosed); on the legacy driver, whose registration can
/// fail (and would then close what it was given), it gets a duplicate of its own.
pub struct PlainWriter {
    fd: RawFd,
    stream: Option<TcpStream>,
    /// `stream` is over a duplicate (legacy driver), closed with it.
    dup: bool,
}

impl PlainWriter {
    pub fn new(fd: RawFd) -> PlainWriter {
        PlainWriter {
            fd,
            stream: None,
            dup: false,
        }
    }

    /// The writer's monoio stream, made on first use.
    fn stream(&mut self) -> std::io::Result<&mut TcpStream> {
        if self.stream.is_none() {
            let dup = monoio::utils::is_legacy();
            let fd = if dup {
                // SAFETY: plain syscall on the connection's open socket; checked below.
                let fd = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                fd
            } else {
                self.fd
            };
            // SAFETY: `fd` is open: a fresh duplicate that monoio owns from now on, or
            // (io_uring) the connection's socket, lent until `done` takes it back
            // unclosed (the writer holds the connection, which keeps it open).
            let std = unsafe { std::net::TcpStream::from_raw_fd(fd) };
            self.stream = Some(TcpStream::from_std(std)?);
            self.dup = dup;
        }
        match self.stream.as_mut() {
            Some(s) => Ok(s),
            None => Err(std::io::Error::other("no stream")),
        }
    }
}

impl Drop for PlainWriter {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            if self.dup {
                drop(stream);
            } else {
                // Dropped without `done` (the task itself was dropped, at the runtime's
                // end): an operation may still hold the stream, so it cannot be taken
                // apart, and closing it would close the connection's socket under it.
                // Its small record is leaked instead.
                std::mem::forget(stream);
            }
        }
    }
}

impl FrameWrite for PlainWriter {
    const ON_DEMAND: bool = true;

    async fn write_frames(&mut self, mut batch: FrameBatch) -> BufResult<usize, FrameBatch> {
        let stream = match self.stream() {
            Ok(s) => s,
            Err(e) => return (Err(e), batch),
        };
        if batch.bufs.len() == 1 {
            // One frame (the usual fan-out case): a plain send, no iovec to build or
            // for the kernel to import. The clone is a reference count.
            let frame = batch.bufs[0].clone();
            let (res, _) = stream.write(frame).await;
            return (res, batch);
        }
        batch.rebuild();
        stream.writev(batch).await
    }

    async fn close_write(&mut self) -> std::io::Result<()> {
        // SAFETY: plain syscall on the connection's open socket.
        if unsafe { libc::shutdown(self.fd, libc::SHUT_WR) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn done(&mut self) {
        if let Some(stream) = self.stream.take() {
            if self.dup {
                drop(stream);
            } else {
                // No operation is in flight (the writer awaited each one), so monoio's
                // record of the descriptor is ours alone: taken apart, not closed.
                let _ = stream.into_raw_fd();
            }
        }
    }
}

/// The writer task: drain the queue into the socket; on plaintext until the queue has
/// been empty for one coalescing window (then the half is parked in the connection), on
/// TLS until closed. Started by [`WsConn::start_writer`] and, on plaintext, again by the
/// next backlog or close. `preamble` (may be empty) goes out first.
pub async fn write_loop<W: FrameWrite>(mut wr: W, conn: Rc<WsConn>, preamble: Bytes) {
    let mut batch = FrameBatch::default();
    if !preamble.is_empty() {
        conn.writing.set(true);
        batch.bufs.push(preamble);
        while !batch.bufs.is_empty() {
            let (res, b) = Box::pin(wr.write_frames(batch)).await;
            batch = b;
            match res {
                Ok(n) if n > 0 => batch.advance(n),
                _ => {
                    wr.done();
                    conn.writing.set(false);
                    conn.writer_live.set(false);
                    conn.abort();
                    return;
                }
            }
        }
        conn.writing.set(false);
        batch = FrameBatch::default();
    }
    // Made on the first coalescing delay or linger and re-armed after.
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    loop {
        match conn.wait_frames(W::ON_DEMAND, &mut timer).await {
            Wake::Frames => {}
            Wake::Stop => break,
            Wake::Idle => {
                // Nothing queued, nothing in flight, connection open: from now on the
                // fan-out sends directly, and the next backlog starts a new writer.
                drop(conn.take_writer_waker());
                conn.writer_live.set(false);
                // The queue is empty: give its allocation back, so an idle connection
                // holds none (the next backlog makes a new one).
                conn.queue.borrow_mut().release();
                wr.done();
                return;
            }
        }
        let window = u32::from(conn.coalesce_ms.get());
        let last = conn.last_write_ms.get();
        if window != 0 && last != 0 && conn.is_open() {
            let since = now_ms().wrapping_sub(last);
            if since < window {
                let deadline =
                    monoio::time::Instant::now() + Duration::from_millis(u64::from(window - since));
                arm(&mut timer, deadline).await;
            }
        }
        conn.writing.set(true);
        let ends_with_close = conn.take_batch(&mut batch);
        while !batch.bufs.is_empty() {
            let (res, b) = wr.write_frames(batch).await;
            batch = b;
            match res {
                Ok(n) if n > 0 => {
                    crate::metrics::with(|m| m.bytes_sent(n as u64));
                    batch.advance(n);
                }
                _ => {
                    wr.done();
                    batch.bufs.clear();
                    conn.writing.set(false);
                    conn.writer_live.set(false);
                    conn.abort();
                    return;
                }
            }
        }
        conn.writing.set(false);
        if window != 0 {
            conn.last_write_ms.set(now_ms());
        }
        if batch.bufs.capacity() > 8 {
            // A burst grew the batch; a connection that stays should not keep it.
            batch = FrameBatch::default();
        }
        if ends_with_close {
            // Boxed: a rare path whose future would otherwise enlarge every writer.
            let _ = Box::pin(wr.close_write()).await;
            break;
        }
    }
    wr.done();
    conn.writer_live.set(false);
    conn.finish();
}
