//! The byte streams an HTTP connection runs on, and how each becomes a WebSocket.
//!
//! The connection loop is generic over [`Transport`]: a plain `TcpStream` or a
//! [`crate::tls::TlsStream`] whose handshake is done. Each is monomorphised separately,
//! so plaintext keeps its direct io_uring reads, sends its answers with one `send` when
//! the socket takes them ([`Transport::try_send`]), and pays nothing for TLS.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;

use crate::tls::{TlsReader, TlsStream, TlsWriter};

/// What an upgraded stream becomes.
pub(crate) enum WsIo {
    /// Plaintext: the socket alone, owned by the connection's record from now on (its
    /// reader parks in the worker's engine, its writer writes without monoio).
    Plain(OwnedFd),
    /// TLS: rustls' halves for the reader and writer tasks, over this TCP socket.
    Tls(RawFd, TlsReader, TlsWriter),
}

/// A connected byte stream the HTTP loop can serve, and how it becomes a WebSocket.
pub(crate) trait Transport: AsyncReadRent + AsyncWriteRent + 'static {
    /// Take the stream apart after an upgrade.
    fn into_ws(self) -> std::io::Result<WsIo>;
    /// The TCP socket under the stream.
    fn socket_fd(&self) -> RawFd;
    /// The client's address (for `ws_connect_rate_per_ip`).
    fn peer_ip(&self) -> Option<std::net::IpAddr> {
        // SAFETY: the descriptor is this open stream's socket, borrowed for this call
        // only, while `self` keeps it open.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.socket_fd()) };
        let addr = socket2::SockRef::from(&fd).peer_addr().ok()?;
        addr.as_socket().map(|a| a.ip())
    }
    /// Write what the socket takes now, without waiting and without an io_uring
    /// operation: `Some(bytes written)`, or `None` when it takes nothing now or the
    /// stream cannot (TLS: its records are written by the stream itself). The caller
    /// writes the rest the usual way, which also reports a broken connection.
    fn try_send(&mut self, _bytes: &[u8]) -> Option<usize> {
        None
    }
    /// Before the server closes the connection: TLS sends close_notify so the client
    /// sees a clean end; plaintext needs nothing (dropping the socket sends FIN).
    fn before_close(&mut self) -> impl std::future::Future<Output = ()> {
        std::future::ready(())
    }
}

impl Transport for TcpStream {
    fn socket_fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn try_send(&mut self, bytes: &[u8]) -> Option<usize> {
        // An answer is small and the socket's send buffer almost always has room: one
        // `send` now costs less than an operation on the ring, its timer and the wake
        // of this task when it completes (the WebSocket writer does the same).
        // SAFETY: plain syscall on this open stream's socket; `bytes` is a live slice
        // for the call. No operation of monoio's is writing on it (the HTTP loop
        // writes from one place, between requests).
        let n = unsafe {
            libc::send(
                self.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(n).ok().filter(|&n| n > 0)
    }

    fn into_ws(self) -> std::io::Result<WsIo> {
        // A duplicate, then monoio's stream is dropped: taking monoio's own descriptor
        // back (`into_raw_fd`) panics should an operation still hold it, and no panic
        // may cross a worker. One `dup` and one `close` per connection's life.
        // SAFETY: plain syscall on this open stream's socket; the result is checked.
        let fd = unsafe { libc::fcntl(self.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop(self);
        // SAFETY: `fd` is a fresh descriptor owned by nothing else.
        Ok(WsIo::Plain(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl Transport for TlsStream {
    fn socket_fd(&self) -> RawFd {
        self.raw_fd()
    }

    fn into_ws(self) -> std::io::Result<WsIo> {
        let fd = self.raw_fd();
        let (rd, wr) = self.into_halves();
        Ok(WsIo::Tls(fd, rd, wr))
    }

    async fn before_close(&mut self) {
        let _ = self.shutdown().await;
    }
}
