//! The byte streams an HTTP connection runs on, and how each becomes a WebSocket.
//!
//! The connection loop is generic over [`Transport`]: a plain `TcpStream` or a
//! [`crate::tls::TlsStream`] whose handshake is done. Each is monomorphised separately,
//! so plaintext keeps its direct io_uring reads and writes and pays nothing for TLS.

use std::os::fd::{AsRawFd, RawFd};

use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;

use crate::tls::{TlsReader, TlsStream, TlsWriter};
use crate::ws::conn::{FrameWrite, WsRead};

/// A connected byte stream the HTTP loop can serve, and how it becomes a WebSocket.
pub(crate) trait Transport: AsyncReadRent + AsyncWriteRent + 'static {
    /// The reader task's half.
    type Reader: WsRead + 'static;
    /// The writer task's half.
    type Writer: FrameWrite + 'static;
    /// Split after an upgrade; the descriptor is the TCP socket, for `WsConn::abort`.
    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer);
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
    /// Before the server closes the connection: TLS sends close_notify so the client
    /// sees a clean end; plaintext needs nothing (dropping the socket sends FIN).
    fn before_close(&mut self) -> impl std::future::Future<Output = ()> {
        std::future::ready(())
    }
}

impl Transport for TcpStream {
    type Reader = OwnedReadHalf<TcpStream>;
    type Writer = OwnedWriteHalf<TcpStream>;

    fn socket_fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer) {
        let fd = self.as_raw_fd();
        let (rd, wr) = self.into_split();
        (fd, rd, wr)
    }
}

impl Transport for TlsStream {
    type Reader = TlsReader;
    type Writer = TlsWriter;

    fn socket_fd(&self) -> RawFd {
        self.raw_fd()
    }

    fn into_ws_halves(self) -> (RawFd, Self::Reader, Self::Writer) {
        let fd = self.raw_fd();
        let (rd, wr) = self.into_halves();
        (fd, rd, wr)
    }

    async fn before_close(&mut self) {
        let _ = self.shutdown().await;
    }
}
