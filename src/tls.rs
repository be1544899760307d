//! TLS for HTTPS and WSS: the server configuration loaded at start, and rustls driven
//! directly over monoio's owned-buffer IO for each accepted connection.
//!
//! Lifecycle of a TLS connection: [`accept`] runs the handshake (the caller bounds it
//! with the header-read timeout, in the connection's own task, never on the accept loop);
//! the HTTP loop then reads and writes through [`TlsStream`]; an upgrade splits it into a
//! [`TlsReader`] for the WebSocket reader task and a [`TlsWriter`] for its writer task,
//! sharing one rustls session through `Rc<RefCell<_>>`.
//!
//! Invariants:
//! - Configuration: TLS 1.2 and 1.3, the `ring` provider, no client authentication, ALPN
//!   `http/1.1`. [`load_server_config`] reads certificate and key once; any problem is a
//!   [`TlsConfigError`] before anything listens.
//! - The session is never borrowed across an `.await`: every socket operation works on an
//!   owned buffer, and the session is touched only before or after it. So the reader and
//!   the writer may interleave freely, and dropping a pending read (the HTTP idle
//!   timeout) loses nothing but that read's ciphertext buffer.
//! - Ciphertext is fed to rustls until a record yields plaintext; the rest waits in
//!   `pending`. rustls' received-plaintext buffer therefore never overflows, and bytes a
//!   client pipelines behind its upgrade request survive the split.
//! - The writer hands a whole batch of frames to rustls as slices (one set of records,
//!   one socket write per batch, no copy of the frames before encryption). Records that
//!   the reader side queues (a TLS 1.3 key update answer) leave with the next batch.
//! - [`crate::ws::conn::WsConn::abort`] shuts the TCP socket under the session down: the
//!   pending ciphertext read completes with EOF, exactly as on plaintext.

use std::cell::RefCell;
use std::io::{self, BufRead, IoSlice, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use monoio::BufResult;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

use crate::ws::conn::{FrameBatch, FrameWrite, WsRead, IDLE_READ};

/// The one application protocol offered: HTTP/1.1 (WebSocket upgrades ride on it).
pub(crate) const ALPN_HTTP11: &[u8] = b"http/1.1";
/// Ciphertext read size of the HTTP phase: a publish body up to 64 KiB arrives in a few
/// reads, and the buffer lives only while the read is pending.
const HTTP_READ: usize = 16 * 1024;
/// Ciphertext read size of a WebSocket reader: client traffic is small control JSON, and
/// this buffer is parked in the pending read of every idle subscriber. rustls assembles
/// larger records across reads in its own buffer.
const WS_READ: usize = 2 * 1024;
/// Bytes of records kept for reuse by a writer between batches; above this the buffer
/// is released after the write (a burst should not pin memory on an idle connection).
const KEEP_OUT: usize = 64 * 1024;

/// A certificate or key that cannot be used. Every variant names the file; the cause
/// is its `source` (printed after it by the binary's error chain).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsConfigError {
    #[error("cannot read TLS certificate file {path}")]
    ReadCert { path: PathBuf, source: io::Error },
    #[error("cannot read TLS key file {path}")]
    ReadKey { path: PathBuf, source: io::Error },
    #[error("TLS certificate file {path} is not valid PEM")]
    CertPem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("TLS certificate file {path} holds no PEM certificate (BEGIN CERTIFICATE)")]
    NoCert { path: PathBuf },
    #[error("TLS key file {path} holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    Key {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("TLS certificate {cert} and key {key} are not usable together")]
    Rustls {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// Read the PEM certificate chain and private key and build the server configuration.
pub(crate) fn load_server_config(
    cert: &Path,
    key: &Path,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    // Read first, so a missing file says "cannot read" rather than "not valid PEM".
    let cert_pem = std::fs::read(cert).map_err(|source| TlsConfigError::ReadCert {
        path: cert.to_path_buf(),
        source,
    })?;
    let key_pem = std::fs::read(key).map_err(|source| TlsConfigError::ReadKey {
        path: key.to_path_buf(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsConfigError::CertPem {
            path: cert.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsConfigError::NoCert {
            path: cert.to_path_buf(),
        });
    }
    let private_key =
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsConfigError::Key {
            path: key.to_path_buf(),
            source,
        })?;
    let rustls_err = |source| TlsConfigError::Rustls {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(rustls_err)?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(rustls_err)?;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// Why a handshake did not complete (logged at debug; the connection is just closed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("cannot start a TLS session: {0}")]
    Session(#[from] rustls::Error),
    #[error("TLS handshake failed: {0}")]
    Io(#[from] io::Error),
    #[error("peer closed the connection during the TLS handshake")]
    Eof,
}

/// One rustls session and the ciphertext it has not taken yet.
struct Session {
    conn: ServerConnection,
    /// Ciphertext read from the socket but not yet fed (see the module invariants).
    /// Empty, and without an allocation, almost always.
    pending: Vec<u8>,
}

fn invalid_data(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Session {
    /// Feed ciphertext until a record yields plaintext or the peer closed; returns the
    /// number of bytes taken.
    fn feed(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.conn.read_tls(&mut rest)?;
            let state = self.conn.process_new_packets().map_err(invalid_data)?;
            if n == 0 || state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
                break;
            }
        }
        Ok(data.len() - rest.len())
    }

    /// Feed freshly read ciphertext; what rustls does not take yet waits in `pending`.
    fn feed_new(&mut self, data: &[u8]) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.pending.extend_from_slice(data);
            return Ok(());
        }
        let taken = self.feed(data)?;
        if taken < data.len() {
            self.pending.extend_from_slice(&data[taken..]);
        }
        Ok(())
    }

    /// Copy available plaintext into `buf`. `None`: nothing buffered, read the socket.
    fn take_plaintext<T: IoBufMut>(&mut self, buf: &mut T) -> Option<io::Result<usize>> {
        loop {
            match self.conn.reader().fill_buf() {
                Ok(chunk) => {
                    // An empty chunk is a clean close_notify: EOF.
                    let n = chunk.len().min(buf.bytes_total());
                    // SAFETY: `write_ptr` is valid for `bytes_total` bytes (IoBufMut's
                    // contract), `n` is within both, and the regions cannot overlap (the
                    // chunk is rustls' own buffer). Writing through a raw pointer never
                    // reads the possibly uninitialised destination.
                    unsafe {
                        std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf.write_ptr(), n);
                        buf.set_init(n);
                    }
                    self.conn.reader().consume(n);
                    return Some(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Some(Err(e)),
            }
            if self.pending.is_empty() {
                return None;
            }
            let pending = std::mem::take(&mut self.pending);
            match self.feed(&pending) {
                Ok(taken) if taken < pending.len() => {
                    self.pending = pending;
                    self.pending.drain(..taken);
                }
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Move every queued record into `out`.
    fn drain_records(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(out)?;
        }
        Ok(())
    }
}

/// Read plaintext into `buf`, reading ciphertext from `io` as needed.
async fn read_plain<R: AsyncReadRent, T: IoBufMut>(
    io: &mut R,
    session: &RefCell<Session>,
    mut buf: T,
    read_size: usize,
) -> BufResult<usize, T> {
    loop {
        if let Some(res) = session.borrow_mut().take_plaintext(&mut buf) {
            return (res, buf);
        }
        let (res, cipher) = io.read(Vec::with_capacity(read_size)).await;
        match res {
            // TCP EOF: whether or not close_notify came, the stream is over.
            Ok(0) => return (Ok(0), buf),
            Ok(_) => {}
            Err(e) => return (Err(e), buf),
        }
        if let Err(e) = session.borrow_mut().feed_new(&cipher) {
            return (Err(e), buf);
        }
    }
}

/// The answer of both TLS readers to a vectored read. Nothing in ringcast reads
/// vectored; refusing is safer than guessing at partial fills across the iovecs.
fn refuse_vectored<T>(buf: T) -> BufResult<usize, T> {
    (
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "vectored reads are not supported on TLS streams",
        )),
        buf,
    )
}

/// Write every record the session has queued; `out` is a reusable scratch buffer.
async fn flush_records<W: AsyncWriteRent>(
    io: &mut W,
    session: &RefCell<Session>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    loop {
        let mut bytes = std::mem::take(out);
        bytes.clear();
        session.borrow_mut().drain_records(&mut bytes)?;
        if bytes.is_empty() {
            *out = bytes;
            return Ok(());
        }
        let (res, bytes) = io.write_all(bytes).await;
        if bytes.capacity() <= KEEP_OUT {
            *out = bytes;
        }
        res?;
    }
}

/// A TLS connection in its HTTP phase (handshake done, not yet upgraded).
pub(crate) struct TlsStream {
    tcp: TcpStream,
    session: Rc<RefCell<Session>>,
    out: Vec<u8>,
}

/// Run the server handshake on an accepted socket. The caller bounds it in time; on
/// failure the alert rustls prepared is sent (best effort) and the socket is dropped.
///
/// `prefix`: bytes of the connection already read (a trusted proxy's connection sniffed
/// for a PROXY header), fed to the handshake first; empty for any other connection.
pub(crate) async fn accept_prefixed(
    config: Arc<ServerConfig>,
    tcp: TcpStream,
    prefix: Vec<u8>,
) -> Result<TlsStream, HandshakeError> {
    let conn = ServerConnection::new(config)?;
    let mut stream = TlsStream {
        tcp,
        session: Rc::new(RefCell::new(Session {
            conn,
            pending: Vec::new(),
        })),
        out: Vec::new(),
    };
    if !prefix.is_empty() {
        let fed = stream.session.borrow_mut().feed_new(&prefix);
        if let Err(e) = fed {
            let _ = flush_records(&mut stream.tcp, &stream.session, &mut stream.out).await;
            return Err(e.into());
        }
    }
    loop {
        flush_records(&mut stream.tcp, &stream.session, &mut stream.out).await?;
        if !stream.session.borrow().conn.is_handshaking() {
            return Ok(stream);
        }
        let (res, cipher) = stream.tcp.read(Vec::with_capacity(HTTP_READ)).await;
        match res {
            Ok(0) => return Err(HandshakeError::Eof),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let fed = stream.session.borrow_mut().feed_new(&cipher);
        if let Err(e) = fed {
            // Tell the peer why (a plaintext request gets a TLS alert), then give up.
            let _ = flush_records(&mut stream.tcp, &stream.session, &mut stream.out).await;
            return Err(e.into());
        }
    }
}

impl TlsStream {
    /// The descriptor of the TCP socket under the session.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
    }

    /// Split for a WebSocket: the reader and writer tasks share the session.
    pub(crate) fn into_halves(self) -> (TlsReader, TlsWriter) {
        let (rd, wr) = self.tcp.into_split();
        (
            TlsReader {
                tcp: rd,
                session: self.session.clone(),
                idle: Vec::new(),
            },
            TlsWriter {
                tcp: wr,
                session: self.session,
                out: Vec::new(),
            },
        )
    }

    async fn write_plain(&mut self, data: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = self
            .session
            .borrow_mut()
            .conn
            .writer()
            .write_vectored(data)?;
        flush_records(&mut self.tcp, &self.session, &mut self.out).await?;
        Ok(n)
    }
}

impl AsyncReadRent for TlsStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_plain(&mut self.tcp, &self.session, buf, HTTP_READ).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        refuse_vectored(buf)
    }
}

impl AsyncWriteRent for TlsStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: `read_ptr` is valid for `bytes_init` initialised bytes (IoBuf's
        // contract) and the buffer is owned by this call until it returns it.
        let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let res = self.write_plain(&[IoSlice::new(data)]).await;
        (res, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let res = {
            // SAFETY: an IoVecBuf's iovecs point at `read_iovec_len` valid buffers for as
            // long as it is owned, and it is owned by this call until it returns it.
            let iov =
                unsafe { std::slice::from_raw_parts(buf.read_iovec_ptr(), buf.read_iovec_len()) };
            let slices: Vec<IoSlice<'_>> = iov
                .iter()
                // SAFETY: as above, each iovec describes initialised, live bytes.
                .map(|v| {
                    IoSlice::new(unsafe {
                        std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                    })
                })
                .collect();
            self.write_plain(&slices).await
        };
        (res, buf)
    }

    async fn flush(&mut self) -> io::Result<()> {
        flush_records(&mut self.tcp, &self.session, &mut self.out).await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        self.session.borrow_mut().conn.send_close_notify();
        flush_records(&mut self.tcp, &self.session, &mut self.out).await?;
        self.tcp.shutdown().await
    }
}

/// The WebSocket reader's half of a TLS connection.
pub(crate) struct TlsReader {
    tcp: OwnedReadHalf<TcpStream>,
    session: Rc<RefCell<Session>>,
    /// The small buffer an idle TLS connection's read waits with (rustls hands out
    /// plaintext by copy, so TLS keeps a read of its own: no readiness path here).
    idle: Vec<u8>,
}

/// TLS keeps its read path: a read of `IDLE_READ` bytes of plaintext, reused.
impl WsRead for TlsReader {
    async fn read_idle(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = std::mem::take(&mut self.idle);
        if buf.capacity() == 0 {
            buf.reserve_exact(IDLE_READ);
        }
        let (res, buf) = self.read(buf).await;
        res.map(|_| buf)
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() == IDLE_READ {
            buf.clear();
            self.idle = buf;
        }
    }
}

impl AsyncReadRent for TlsReader {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_plain(&mut self.tcp, &self.session, buf, WS_READ).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        refuse_vectored(buf)
    }
}

/// The WebSocket writer's half of a TLS connection.
pub(crate) struct TlsWriter {
    tcp: OwnedWriteHalf<TcpStream>,
    session: Rc<RefCell<Session>>,
    out: Vec<u8>,
}

/// Most frames encrypted per batch (the writer's batch is bounded the same way).
const MAX_SLICES: usize = 64;

impl TlsWriter {
    /// Hand the batch's frames to rustls (encrypted straight from the shared frames).
    fn encrypt(&self, batch: &FrameBatch) -> io::Result<usize> {
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let mut count = 0;
        for (slot, frame) in slices.iter_mut().zip(batch.frames()) {
            *slot = IoSlice::new(frame);
            count += 1;
        }
        let mut session = self.session.borrow_mut();
        session.conn.writer().write_vectored(&slices[..count])
    }
}

impl FrameWrite for TlsWriter {
    async fn write_frames(&mut self, batch: FrameBatch) -> BufResult<usize, FrameBatch> {
        let n = match self.encrypt(&batch) {
            Ok(n) => n,
            Err(e) => return (Err(e), batch),
        };
        match flush_records(&mut self.tcp, &self.session, &mut self.out).await {
            Ok(()) => (Ok(n), batch),
            Err(e) => (Err(e), batch),
        }
    }

    async fn close_write(&mut self) -> io::Result<()> {
        self.session.borrow_mut().conn.send_close_notify();
        flush_records(&mut self.tcp, &self.session, &mut self.out).await?;
        AsyncWriteRent::shutdown(&mut self.tcp).await
    }
}
