//! Protocol abuse against the real server, with raw sockets: every byte a client sends
//! is hostile until parsed.
//!
//! Each case sends one kind of bad input and asserts the exact answer (HTTP status and
//! error code, or WebSocket close code), then [`still_serving`] asserts the server is
//! unharmed: `/health` is 200 and a well-formed publish is accepted (202). One server
//! serves all cases of a test, so damage done by one case shows up in the next.
//!
//! WebSocket cases write the upgrade request and the frames by hand (tungstenite would
//! refuse to send most of them), and read the server's unmasked frames with a small
//! decoder here.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// Limits made small so that the cases are cheap, and the timeout short so that the
/// slowloris case is quick.
const CONFIG: &str =
    "max_body_bytes = 262144\nmax_frame_bytes = 1024\nheader_read_timeout_ms = 500\n";
const MAX_FRAME: usize = 1024;

fn start() -> (Server, Project) {
    let server = Server::start_with(Options {
        config: CONFIG.to_string(),
        ..Options::default()
    });
    let project = server.project("abuse", "1000000/s");
    (server, project)
}

/// The server answers health checks and still accepts a normal publish.
fn still_serving(server: &Server, project: &Project, case: &str) {
    let (status, body) = server.health();
    assert_eq!(status, 200, "after {case}: /health {body}");
    let (status, body) = server.publish(&project.secret, "abuse", "after", json!({"case": case}));
    assert_eq!(status, 202, "after {case}: publish {body}");
}

fn expect_error(server: &Server, raw: &[u8], status: u16, code: &str, case: &str) {
    let (got, head, body) = parse_response(&server.raw(raw));
    assert_eq!(got, status, "{case}: {head}\n{body}");
    assert_eq!(body["error"]["code"], code, "{case}: {body}");
}

fn publish_head(key: &str, extra: &str) -> String {
    format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\n\
         Content-Type: application/json\r\n{extra}\r\n"
    )
}

#[test]
fn malformed_http_gets_400_411_413_and_the_server_stays_up() {
    let (server, p) = start();
    let key = &p.secret;
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "garbage request line",
            b"GARBAGE\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "binary request line",
            b"\x00\xff\xfe\x01 / HTTP/1.1\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "space in the target",
            b"GET /he alth HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "bad HTTP version",
            b"GET /health HTTP/9.9\r\nHost: t\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "header without colon",
            b"GET /health HTTP/1.1\r\nHost t\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "conflicting Content-Length",
            publish_head(key, "Content-Length: 2\r\nContent-Length: 3\r\n").into_bytes(),
            400,
            "bad_request",
        ),
        (
            "negative Content-Length",
            publish_head(key, "Content-Length: -1\r\n").into_bytes(),
            400,
            "bad_request",
        ),
        (
            "non-numeric Content-Length",
            publish_head(key, "Content-Length: 0x10\r\n").into_bytes(),
            400,
            "bad_request",
        ),
        (
            "Content-Length overflowing 64 bits",
            publish_head(key, "Content-Length: 99999999999999999999999\r\n").into_bytes(),
            400,
            "bad_request",
        ),
        (
            "huge declared Content-Length",
            publish_head(key, "Content-Length: 1000000000000000\r\n").into_bytes(),
            413,
            "payload_too_large",
        ),
        (
            "chunked body",
            publish_head(key, "Transfer-Encoding: chunked\r\n").into_bytes(),
            411,
            "length_required",
        ),
        (
            "Transfer-Encoding and Content-Length",
            publish_head(key, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n").into_bytes(),
            400,
            "bad_request",
        ),
        (
            "too many headers",
            format!(
                "GET /health HTTP/1.1\r\n{}\r\n",
                (0..200)
                    .map(|i| format!("X-{i}: v\r\n"))
                    .collect::<String>()
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "huge header",
            format!(
                "GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n",
                "a".repeat(40_000)
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
    ];
    for (case, raw, status, code) in &cases {
        expect_error(&server, raw, *status, code, case);
        still_serving(&server, &p, case);
    }
}

#[test]
fn hostile_json_bodies_get_400() {
    let (server, p) = start();
    let depth = 100_000;
    let deep_array = "[".repeat(depth);
    let mut bad_utf8 = br#"{"channel":"c","event":"e","data":""#.to_vec();
    bad_utf8.extend_from_slice(b"\xff\xfe\xc3\x28");
    bad_utf8.extend_from_slice(br#""}"#);
    let mut overlong = br#"{"channel":""#.to_vec();
    overlong.extend_from_slice(b"\xc0\xaf");
    overlong.extend_from_slice(br#"","event":"e","data":{}}"#);
    let mut surrogate = br#"{"channel":"c","event":""#.to_vec();
    surrogate.extend_from_slice(b"\xed\xa0\x80");
    surrogate.extend_from_slice(br#"","data":{}}"#);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("100k unclosed [", deep_array.into_bytes()),
        (
            "100k [ then 100k }",
            format!("{}{}", "[".repeat(depth), "}".repeat(depth)).into_bytes(),
        ),
        ("invalid UTF-8 in a string", bad_utf8),
        ("overlong UTF-8 in channel", overlong),
        ("UTF-8 encoded surrogate in event", surrogate),
        ("NUL bytes", b"\0\0\0\0".to_vec()),
        (
            "trailing garbage",
            br#"{"channel":"c","event":"e","data":{}} x"#.to_vec(),
        ),
        (
            "two objects",
            br#"{"channel":"c","event":"e","data":{}}{}"#.to_vec(),
        ),
        ("unterminated string", br#"{"channel":"c"#.to_vec()),
    ];
    for (case, body) in &cases {
        assert!(body.len() <= 262_144, "{case} must fit the body limit");
        let (status, _, v) = server.raw_publish(&p.secret, "application/json", body);
        assert_eq!(status, 400, "{case}: {v}");
        assert_eq!(v["error"]["code"], "invalid_json", "{case}: {v}");
        still_serving(&server, &p, case);
    }
}

/// Deep but balanced nesting is valid JSON: ringcast validates it without recursion
/// (no stack to overflow), accepts it and delivers it byte for byte. The body limit is
/// what bounds it; clients that cap nesting depth are the publisher's concern.
#[test]
fn deep_but_valid_json_is_delivered_intact() {
    let (server, p) = start();
    let mut sub = server.ws_on(&p.public, "deep");
    let depth = 100_000;
    let deep_in_data = format!(
        r#"{{"channel":"deep","event":"e","data":{{"x":{}{}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let deep_objects = format!(
        r#"{{"channel":"deep","event":"e","data":{}1{}}}"#,
        r#"{"a":"#.repeat(20_000),
        "}".repeat(20_000)
    );
    for (case, body) in [
        ("100k nested arrays", &deep_in_data),
        ("20k nested objects", &deep_objects),
    ] {
        let (status, _, v) = server.raw_publish(&p.secret, "application/json", body.as_bytes());
        assert_eq!(status, 202, "{case}: {v}");
        let data_start = body.find(r#""data":"#).unwrap() + 7;
        let data = &body[data_start..body.len() - 1];
        let frame = loop {
            match sub.read().expect("ws read") {
                tungstenite::Message::Text(t) => break t.to_string(),
                tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => continue,
                other => panic!("{case}: unexpected frame {other:?}"),
            }
        };
        let want = format!(r#""data":{data},"id":"#);
        assert!(frame.contains(&want), "{case}: data not delivered intact");
        still_serving(&server, &p, case);
    }
}

#[test]
fn slowloris_headers_get_408_after_the_header_timeout() {
    let (server, p) = start();
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let started = Instant::now();
    s.write_all(b"POST /api/v1/publish HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    // One header byte every 50 ms: each read makes progress, the whole head never ends.
    let mut out = Vec::new();
    let drip = b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut closed = false;
    for &b in drip.iter().cycle() {
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
        if s.write_all(&[b]).is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    // Drain whatever is left until the server closes.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    if !closed {
        let _ = s.read_to_end(&mut out);
    }
    let elapsed = started.elapsed();
    let (status, head, body) = parse_response(&out);
    assert_eq!(status, 408, "{head}");
    assert_eq!(body["error"]["code"], "request_timeout");
    assert!(
        elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(5),
        "408 after {elapsed:?}, the timeout is 500 ms"
    );
    still_serving(&server, &p, "slowloris");
}

// ---------------------------------------------------------------------------------
// WebSocket, by hand.

/// A raw WebSocket connection after a successful upgrade and the `connected` frame.
struct RawWs {
    s: TcpStream,
    buf: Vec<u8>,
}

impl RawWs {
    fn open(server: &Server, public_key: &str) -> RawWs {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "GET /api/v1/ws?key={public_key} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = s.read(&mut chunk).expect("read upgrade answer");
            assert!(n > 0, "closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
        let mut ws = RawWs {
            s,
            buf: buf.split_off(end),
        };
        let (op, payload) = ws.read_frame().expect("connected frame");
        assert_eq!(op, 0x1);
        let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(v["type"], "connected");
        ws
    }

    fn send(&mut self, bytes: &[u8]) {
        // The server may already have closed after an earlier part; that is its right.
        let _ = self.s.write_all(bytes);
    }

    /// Next server frame (opcode, payload), or `None` at EOF.
    fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some((hl, len)) = common::frame_head(&self.buf) {
                if self.buf.len() >= hl + len {
                    let op = self.buf[0] & 0x0f;
                    let payload = self.buf[hl..hl + len].to_vec();
                    self.buf.drain(..hl + len);
                    return Some((op, payload));
                }
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Read until the server's close frame; its code.
    fn close_code(&mut self) -> u16 {
        while let Some((op, payload)) = self.read_frame() {
            if op == 0x8 {
                assert!(payload.len() >= 2, "close frame without a code");
                return u16::from_be_bytes([payload[0], payload[1]]);
            }
        }
        panic!("connection ended without a close frame");
    }
}

/// A client frame: `first` is FIN/RSV/opcode; `len_override` forges the length field.
fn client_frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut out = vec![first];
    let mbit = if masked { 0x80 } else { 0 };
    if payload.len() < 126 {
        out.push(mbit | payload.len() as u8);
    } else if payload.len() <= 0xffff {
        out.push(mbit | 126);
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    } else {
        out.push(mbit | 127);
        out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    }
    if masked {
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

fn text(s: &str) -> Vec<u8> {
    client_frame(0x81, s.as_bytes(), true)
}

#[test]
fn websocket_violations_get_their_close_codes() {
    let (server, p) = start();
    // A header claiming 2^40 bytes: refused from the header alone (nothing is buffered).
    let mut huge_header = vec![0x82, 0x80 | 127];
    huge_header.extend_from_slice(&(1u64 << 40).to_be_bytes());
    huge_header.extend_from_slice(&[1, 2, 3, 4]);
    let mut fragmented_too_big = client_frame(0x02, &vec![7u8; MAX_FRAME - 10], true);
    fragmented_too_big.extend(client_frame(0x80, &[7u8; 20], true));
    let mut text_then_text = client_frame(0x01, b"{\"type\":", true);
    text_then_text.extend(text("{}"));
    let mut split_bad_utf8 = client_frame(0x01, b"ok \xce", true);
    split_bad_utf8.extend(client_frame(0x80, b"\x28 no", true));
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "invalid UTF-8 in a text frame",
            client_frame(0x81, b"{\"type\":\"ping\xff\"}", true),
            1007,
        ),
        ("invalid UTF-8 across fragments", split_bad_utf8, 1007),
        (
            "unmasked client frame",
            client_frame(0x81, br#"{"type":"ping"}"#, false),
            1002,
        ),
        ("fragmented ping", client_frame(0x09, b"x", true), 1002),
        (
            "fragmented close",
            client_frame(0x08, &1000u16.to_be_bytes(), true),
            1002,
        ),
        (
            "ping over 125 bytes",
            client_frame(0x89, &[b'p'; 126], true),
            1002,
        ),
        (
            "reserved data opcode 0x3",
            client_frame(0x83, b"x", true),
            1002,
        ),
        (
            "reserved control opcode 0xB",
            client_frame(0x8B, b"", true),
            1002,
        ),
        ("RSV1 set", client_frame(0xC1, b"{}", true), 1002),
        ("RSV2 set", client_frame(0xA1, b"{}", true), 1002),
        ("RSV3 set", client_frame(0x91, b"{}", true), 1002),
        (
            "continuation without a start",
            client_frame(0x80, b"x", true),
            1002,
        ),
        ("new message inside a fragmented one", text_then_text, 1002),
        (
            "close with a one-byte payload",
            client_frame(0x88, &[3], true),
            1002,
        ),
        (
            "close with a forbidden code (1005)",
            client_frame(0x88, &1005u16.to_be_bytes(), true),
            1002,
        ),
        (
            "frame over max_frame_bytes",
            client_frame(0x81, &vec![b' '; MAX_FRAME + 1], true),
            1009,
        ),
        ("length field of 2^40", huge_header, 1009),
        ("fragments over max_frame_bytes", fragmented_too_big, 1009),
        (
            "binary frame (the protocol is JSON text)",
            client_frame(0x82, b"\x00\x01", true),
            1003,
        ),
    ];
    for (case, bytes, want) in &cases {
        let mut ws = RawWs::open(&server, &p.public);
        ws.send(bytes);
        assert_eq!(ws.close_code(), *want, "{case}");
        // The server shuts the socket down after its close frame (within its grace).
        ws.s.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        while ws.read_frame().is_some() {}
        still_serving(&server, &p, case);
    }
}

mod more_abuse;
