//! The TLS client of `wss://` (`https://`) targets: the rustls configuration, built
//! once per run from `--ca-file`, one client session driven over a nonblocking mio
//! socket, and the `read`/`write` that subscribers and publishers call whether their
//! connection has a session or not.
//!
//! Invariants:
//! - Verification is never off: the server's certificate must chain to a certificate
//!   of `--ca-file` and name the URL's host (an IP SAN for `127.0.0.1`). A TLS URL
//!   without `--ca-file` is refused (a loopback server has no publicly trusted
//!   certificate), and there is no "insecure" mode.
//! - The server's TLS stack: rustls 0.23 with the `ring` provider, TLS 1.2 and 1.3,
//!   ALPN `http/1.1`; no second TLS stack in the workspace.
//! - No session resumption: every connection makes a full handshake, as N distinct
//!   browsers would, and the threads share no session cache (no lock between them).
//! - A plaintext connection carries none of this: a connection owns a `Session` (one
//!   box) only when its target is TLS, and `Option<Session>` is one pointer.
//! - Edge-triggered readiness: `Session::read` returns `WouldBlock` only after the
//!   socket itself did and rustls holds no plaintext, so no readiness edge is lost.
//!   Records rustls queues while reading (the handshake's) are sent at once.

use mio::net::TcpStream;
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// What every TLS connection of a run shares: the configuration and the name the
/// server's certificate must carry.
#[derive(Debug, Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Client {
    /// Trust exactly the certificates of the PEM file `ca_file` (a CA, or the server's
    /// self-signed certificate) for the server `host` (`127.0.0.1:PORT`, `[::1]:PORT`,
    /// `localhost:PORT`: the `Host` value of the URL).
    pub fn new(ca_file: &Path, host: &str) -> Result<Client, String> {
        let what = ca_file.display();
        let mut roots = RootCertStore::empty();
        let certs =
            CertificateDer::pem_file_iter(ca_file).map_err(|e| format!("--ca-file {what}: {e}"))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("--ca-file {what}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("--ca-file {what}: unusable certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err(format!("--ca-file {what}: no PEM certificate in it"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = Resumption::disabled();
        let name = ServerName::try_from(host_name(host).to_string())
            .map_err(|e| format!("{host}: not a TLS server name: {e}"))?;
        Ok(Client {
            config: Arc::new(config),
            name,
        })
    }
}

/// The host of a `Host` value, without its port and an IPv6 literal's brackets.
fn host_name(host: &str) -> &str {
    let h = match host.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') && !h.is_empty() => h,
        _ => host,
    };
    h.trim_start_matches('[').trim_end_matches(']')
}

/// Read from a connection: through its session when it has one, else from the socket.
pub fn read(sock: &mut TcpStream, tls: Option<&mut Session>, buf: &mut [u8]) -> io::Result<usize> {
    match tls {
        None => sock.read(buf),
        Some(s) => s.read(sock, buf),
    }
}

/// Write to a connection: through its session when it has one, else to the socket.
pub fn write(sock: &mut TcpStream, tls: Option<&mut Session>, data: &[u8]) -> io::Result<usize> {
    match tls {
        None => sock.write(data),
        Some(s) => s.write(sock, data),
    }
}

/// Records a connection's session still holds go out (nothing to do on plaintext).
pub fn send(sock: &mut TcpStream, tls: Option<&mut Session>) -> io::Result<()> {
    tls.map_or(Ok(()), |s| s.send(sock))
}

/// One client session. Boxed: a `ClientConnection` is large, and the connection that
/// owns it pays one pointer for it (and plaintext ones pay nothing, see `Option`'s niche).
pub struct Session(Box<ClientConnection>);

impl Session {
    /// A session for a connection whose TCP connect is in progress; its first flight
    /// (ClientHello) leaves with the first `write`/`send`.
    pub fn new(client: &Client) -> io::Result<Session> {
        ClientConnection::new(client.config.clone(), client.name.clone())
            .map(|c| Session(Box::new(c)))
            .map_err(io::Error::other)
    }

    /// Read plaintext into `buf`, reading ciphertext from `sock` as needed. `Ok(0)` is
    /// the end of the stream (with or without the server's close_notify, as a TCP EOF
    /// is on plaintext); `WouldBlock` when the socket has nothing more.
    pub fn read(&mut self, sock: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        // Bounded: each iteration returns or consumes ciphertext read from the socket.
        loop {
            match self.0.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.0.read_tls(sock)? == 0 {
                return Ok(0);
            }
            self.0
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // The handshake (or a key update) may have queued records to answer with.
            self.send(sock)?;
        }
    }

    /// Hand plaintext to rustls and send what is ready. Like a socket write: `Ok(n)`
    /// with `n > 0` bytes taken, or `WouldBlock` when rustls' buffers are full (before
    /// the handshake completes, plaintext waits in rustls, up to its 64 KiB limit).
    pub fn write(&mut self, sock: &mut TcpStream, data: &[u8]) -> io::Result<usize> {
        let n = self.0.writer().write(data)?;
        self.send(sock)?;
        if n == 0 && !data.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    /// Write queued records until none is left or the kernel's buffer is full.
    pub fn send(&mut self, sock: &mut TcpStream) -> io::Result<()> {
        // Bounded: each iteration writes at least one byte or returns.
        while self.0.wants_write() {
            match self.0.write_tls(sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Records are waiting for the socket to become writable.
    pub fn wants_write(&self) -> bool {
        self.0.wants_write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use rustls::{ServerConfig, ServerConnection, StreamOwned};
    use std::net::{SocketAddr, TcpListener};
    use std::time::{Duration, Instant};

    #[test]
    fn host_names_lose_port_and_brackets() {
        assert_eq!(host_name("127.0.0.1:8443"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8443"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("localhost"), "localhost");
    }

    #[test]
    fn plaintext_connections_pay_one_pointer_at_most() {
        assert_eq!(
            std::mem::size_of::<Option<Session>>(),
            std::mem::size_of::<usize>()
        );
    }

    /// A certificate for 127.0.0.1 and its key; the PEM of the certificate in a file.
    fn certificate(
        tag: &str,
    ) -> (
        std::path::PathBuf,
        CertificateDer<'static>,
        PrivateKeyDer<'static>,
    ) {
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let path = std::env::temp_dir().join(format!("lt-tls-{tag}-{}.pem", std::process::id()));
        std::fs::write(&path, ck.cert.pem()).unwrap();
        let key = PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()).into();
        (path, ck.cert.der().clone(), key)
    }

    /// A one-connection rustls server on a blocking socket: reads 5 bytes, answers
    /// `pong\n`, closes with close_notify; returns what it read.
    fn server(
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
    ) -> (SocketAddr, std::thread::JoinHandle<io::Result<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap();
        let handle = std::thread::spawn(move || {
            let (sock, _) = listener.accept()?;
            sock.set_read_timeout(Some(Duration::from_secs(5)))?;
            let conn = ServerConnection::new(Arc::new(config)).map_err(io::Error::other)?;
            let mut tls = StreamOwned::new(conn, sock);
            let mut got = [0u8; 5];
            tls.read_exact(&mut got)?;
            tls.write_all(b"pong\n")?;
            tls.conn.send_close_notify();
            tls.flush()?;
            Ok(got.to_vec())
        });
        (addr, handle)
    }

    /// The client side as the harness drives it: a nonblocking connect, a write once
    /// the socket is writable, reads on readiness until the end of the stream.
    fn talk(client: &Client, addr: SocketAddr) -> io::Result<Vec<u8>> {
        let mut sock = crate::net::connect_nonblocking(addr, None)?;
        let mut poll = mio::Poll::new()?;
        let mut events = mio::Events::with_capacity(8);
        poll.registry().register(
            &mut sock,
            mio::Token(0),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        )?;
        let mut s = Session::new(client)?;
        let (mut got, mut sent, mut buf) = (Vec::new(), false, [0u8; 256]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            poll.poll(&mut events, Some(Duration::from_millis(50)))?;
            if !sent && events.iter().any(|e| e.is_writable()) {
                assert_eq!(s.write(&mut sock, b"ping\n")?, 5);
                sent = true;
            }
            loop {
                match s.read(&mut sock, &mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Err(io::ErrorKind::TimedOut.into())
    }

    #[test]
    fn round_trip_with_the_trusted_certificate() {
        let (pem, cert, key) = certificate("ok");
        let client = Client::new(&pem, "127.0.0.1:1");
        let _ = std::fs::remove_file(&pem);
        let (addr, srv) = server(cert, key);
        let got = talk(&client.unwrap(), addr).unwrap();
        assert_eq!(got, b"pong\n");
        assert_eq!(srv.join().unwrap().unwrap(), b"ping\n");
    }

    #[test]
    fn another_certificate_is_refused() {
        let (other, _, _) = certificate("other");
        let (pem, cert, key) = certificate("served");
        let client = Client::new(&other, "127.0.0.1:1").unwrap();
        let _ = (std::fs::remove_file(&other), std::fs::remove_file(&pem));
        let (addr, srv) = server(cert, key);
        let err = talk(&client, addr).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(srv.join().unwrap().is_err());
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_refused() {
        assert!(Client::new(Path::new("/nonexistent/ca.pem"), "127.0.0.1:1").is_err());
        let empty = std::env::temp_dir().join(format!("lt-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, b"").unwrap();
        let r = Client::new(&empty, "127.0.0.1:1");
        let _ = std::fs::remove_file(&empty);
        assert!(r.unwrap_err().contains("no PEM certificate"));
    }
}
