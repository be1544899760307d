//! An echo server on ringcast's own WebSocket layer, for the Autobahn|Testsuite.
//!
//! `cargo run --release --example ws_echo -- --listen 127.0.0.1:PORT`
//!
//! It runs exactly the code the server runs for a WebSocket connection: the request head
//! parser (`http::parse`), the upgrade checks and answer (`http::upgrade`, `ws::handshake`),
//! the frame codec and reassembly (`ws::frame`, `ws::message`), the parked reader in the
//! connection engine and the writer (`engine`, `ws::conn`), on one monoio runtime. Only the [`Session`] differs: every text
//! and binary message is sent back with the same opcode, which is all the suite needs.
//!
//! permessage-deflate: an acceptable offer is agreed (the server's negotiation,
//! `ws::deflate`), with the compression threshold at 0 so that every echo goes
//! compressed: Autobahn's groups 12 and 13 then test the server's inflater and
//! compressor both.
//!
//! Invariants: nothing here re-implements framing or the handshake (then the suite would
//! test this file, not ringcast); any path is accepted, since the suite picks its own.
//! Limits are raised above the server's defaults because case group 9 sends messages of
//! up to 16 MiB, and fragmented ones in up to 65,536 frames; the limit logic itself is
//! the same code.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use ringcast::{
    configure_compression, deflate_offer_acceptable, frame, parse_head, start_parked,
    validate_upgrade, write_error, write_switching_with, Disconnect, Engine, Extra, Opcode,
    PlainWriter, ReadCtx, ReadLimits, Session, WsConn,
};

/// Largest message echoed: group 9 sends up to 16 MiB; headroom for reassembly.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Most frames per message: cases 9.3.1 and 9.4.1 send 4 MiB in 64-byte fragments
/// (65,536 frames; group 5 uses at most 5, groups 6 and 10 one per octet of short texts).
const MAX_FRAGMENTS: usize = 100_000;
/// Echo backlog: a 16 MiB echo plus whatever the suite pipelines behind it.
const SEND_BACKLOG: usize = 256 * 1024 * 1024;
/// Request head limits, as the server's defaults.
const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// The echo handler in place of ringcast's client protocol (with the worker's reader
/// knobs, as the server's sessions hold theirs).
struct Echo(Rc<ReadCtx>);

impl Session for Echo {
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), Disconnect> {
        conn.send(frame(opcode, payload));
        Ok(())
    }

    fn on_end(&mut self, _conn: &Rc<WsConn>) {}

    fn read_ctx(&self) -> &ReadCtx {
        &self.0
    }
}

fn listen_addr() -> String {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:9001".to_string();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().expect("--listen needs an address"),
            other => {
                if let Some(v) = other.strip_prefix("--listen=") {
                    listen = v.to_string();
                } else {
                    eprintln!("usage: ws_echo [--listen ADDR]");
                    std::process::exit(2);
                }
            }
        }
    }
    listen
}

fn main() {
    let addr = listen_addr();
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr.as_str()).expect("bind");
        println!(
            "ws_echo listening on ws://{}",
            listener.local_addr().expect("local addr")
        );
        let started = Instant::now();
        configure_compression(0);
        let engine = ringcast::install_engine().expect("connection engine");
        let mut next_id = 0u64;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            next_id += 1;
            monoio::spawn(serve(stream, next_id, started, engine.clone()));
        }
    });
}

/// Read the upgrade request, answer it with the server's handshake code, then run the
/// server's connection engine (parked reader, direct sends, writer on backlog) with the
/// echo session.
async fn serve(mut stream: TcpStream, id: u64, started: Instant, engine: Rc<Engine>) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let head = loop {
        match parse_head(&buf, MAX_HEAD, MAX_HEADERS) {
            Ok(Some(head)) => break head,
            Ok(None) => {}
            Err(e) => {
                let mut out = Vec::new();
                write_error(&mut out, e.into(), Extra::default());
                let _ = stream.write_all(out).await;
                return;
            }
        }
        if buf.len() == buf.capacity() {
            buf.reserve(4096);
        }
        let spare = Vec::with_capacity(4096);
        let (res, chunk) = stream.read(spare).await;
        match res {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    };
    let mut out = Vec::new();
    let deflate = head
        .ws_extensions
        .as_ref()
        .and_then(|r| deflate_offer_acceptable(&buf[r.clone()]));
    match validate_upgrade(&head, &buf) {
        Ok(key) => write_switching_with(&mut out, key, deflate),
        Err(err) => {
            write_error(&mut out, err, Extra::default());
            let _ = stream.write_all(out).await;
            return;
        }
    }
    let (res, _) = stream.write_all(out).await;
    if res.is_err() {
        return;
    }
    // Bytes after the head are the first frames; the reader handles them first.
    let leftover = buf.split_off(head.head_len);
    // As the server does (`http::transport`, `http::upgrade::start`): the connection
    // owns a duplicate of the socket, monoio's stream is dropped.
    // SAFETY: plain syscall on the open stream's socket; the result is checked.
    let fd = unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return;
    }
    drop(stream);
    // SAFETY: `fd` is fresh and owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let conn = Rc::new(
        WsConn::new(id, fd, SEND_BACKLOG, 0)
            .owning(owned)
            .with_compression(deflate),
    );
    // Replies go by direct send, a writer task only with a backlog.
    conn.start_writer(PlainWriter::new(fd), bytes::Bytes::new());
    let ctx = READ_CTX.with(|c| {
        c.get_or_init(|| {
            Rc::new(ReadCtx {
                limits: ReadLimits {
                    max_message: MAX_MESSAGE,
                    max_fragments: MAX_FRAGMENTS,
                    // Echo replies are the client's own frames: stop reading at half
                    // the backlog.
                    pause_backlog: SEND_BACKLOG / 2,
                },
                clock: Box::new(move || started.elapsed().as_secs() as u32),
            })
        })
        .clone()
    });
    // The reader parks in the engine between readiness turns, as the server's does.
    start_parked(&engine, conn, Echo(ctx), leftover, ());
}

thread_local! {
    static READ_CTX: std::cell::OnceCell<Rc<ReadCtx>> = const { std::cell::OnceCell::new() };
}
