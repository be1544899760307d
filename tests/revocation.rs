//! Revocation reaches every socket opened with a key, wherever it is in its life.
//!
//! The case guarded here: the key was checked when the upgrade was decided, but a client
//! that does not read makes the server's write of the 101 answer wait; a revocation in
//! that window once missed the socket (it was registered only after the write), which
//! then subscribed and kept receiving. Now the socket is registered before anything is
//! written and the key is checked again at registration.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// A masked client text frame.
fn text_frame(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Unmasked server frames in `buf`: (opcode, payload).
fn frames(mut buf: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while buf.len() >= 2 {
        let op = buf[0] & 0x0f;
        let (len, head) = match buf[1] & 0x7f {
            126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
            127 if buf.len() >= 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&buf[2..10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            n if n < 126 => (n as usize, 2),
            _ => break,
        };
        if buf.len() < head + len {
            break;
        }
        out.push((op, buf[head..head + len].to_vec()));
        buf = &buf[head + len..];
    }
    out
}

#[test]
fn a_key_revoked_while_its_upgrade_answer_waits_still_closes_the_socket() {
    // The console's script is a large answer (~25 KB): a few dozen of them pipelined in
    // front of the upgrade, in the same read, make the server's write of that batch (the
    // 101 last) wait for a client that does not read.
    let s = Server::start_with(Options::config("console = true\n"));
    let p = s.project("race", "100000/s");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    // A small receive buffer (set before connect, so the window stays small).
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(&s.addr.into()).expect("connect");
    let mut sock: TcpStream = socket.into();
    let upgrade = format!(
        "GET /api/v1/ws?key={} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        p.public
    );
    let subscribe = text_frame(br#"{"type":"subscribe","channel":"c"}"#);
    let one = b"GET /console/ringcast.js HTTP/1.1\r\nHost: x\r\n\r\n";
    // Everything within the server's first 4 KiB read: one batch.
    let n = (4000 - upgrade.len() - subscribe.len()) / one.len();
    let mut burst = Vec::new();
    for _ in 0..n {
        burst.extend_from_slice(one);
    }
    burst.extend_from_slice(upgrade.as_bytes());
    burst.extend_from_slice(&subscribe);
    sock.write_all(&burst).expect("send the burst");
    // Wait until the server has taken the batch and decided the upgrade: its answers
    // (the 101 behind them, in the same write) start arriving in our receive buffer,
    // which we then leave unread so the rest of the write stalls.
    sock.set_nonblocking(true).unwrap();
    let mut probe = [0u8; 1];
    wait_for(
        Duration::from_secs(10),
        "the server to answer the batch",
        || matches!(sock.peek(&mut probe), Ok(n) if n > 0),
    );
    sock.set_nonblocking(false).unwrap();
    cli(&s.data_dir, &["key", "revoke", &p.public]);
    s.wait_key_refused(&p.public);

    // Now read everything the server has for us.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut published_after = false;
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if published_after {
                    break;
                }
                if find(&got, b"101 Switching Protocols").is_some() {
                    // The socket is open to us now: anything published still reaches a
                    // subscriber that revocation missed.
                    assert_eq!(s.publish(&p.secret, "c", "after", json!({})).0, 202);
                    published_after = true;
                }
            }
            Err(_) => break,
        }
        assert!(
            Instant::now() < deadline,
            "the server never ended the connection"
        );
    }
    eprintln!(
        "read {} bytes; tail: {:?}",
        got.len(),
        String::from_utf8_lossy(&got[got.len().saturating_sub(400)..])
    );
    let at = find(&got, b"HTTP/1.1 101 Switching Protocols").expect("the upgrade was answered");
    let head_end = at + find(&got[at..], b"\r\n\r\n").expect("101 head") + 4;
    let ws = frames(&got[head_end..]);
    let texts: Vec<String> = ws
        .iter()
        .filter(|(op, _)| *op == 1)
        .map(|(_, p)| String::from_utf8_lossy(p).to_string())
        .collect();
    assert!(
        texts.iter().all(|t| !t.contains("\"type\":\"message\"")),
        "a revoked key's socket received a message: {texts:?}"
    );
    let close = ws
        .iter()
        .find(|(op, _)| *op == 8)
        .unwrap_or_else(|| panic!("no close frame after {texts:?}"));
    assert_eq!(
        u16::from_be_bytes([close.1[0], close.1[1]]),
        4001,
        "{texts:?}"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}
