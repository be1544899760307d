//! Admission (contract 1.3), black box on the real binary: the node-wide upgrade rate
//! (1013 `retry_after`, Pusher 4100), the spread of the 1001 closes at shutdown, and
//! `trusted_proxies` (PROXY protocol v1/v2 and `X-Forwarded-For` from trusted peers
//! only, seen through `ws_connect_rate_per_ip`). Real sockets on 127.0.0.1.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::metrics::sample;
use common::{cli, next_json, set_timeout, Options, Server};
use serde_json::Value;
use tungstenite::Message;

const UPGRADE_HEAD: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

/// The first 12 bytes of an answer ("HTTP/1.1 NNN"), or fewer when the connection ends
/// before them.
fn status_line(conn: &mut impl Read) -> Vec<u8> {
    let mut buf = [0u8; 12];
    let mut got = 0;
    while got < 12 {
        match conn.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf[..got].to_vec()
}

/// Send `prefix` (a PROXY header or nothing), then an upgrade request for `path` with
/// `extra` header lines; returns the status of the answer (0: closed without one).
fn raw_upgrade(s: &Server, prefix: &[u8], path: &str, extra: &str) -> u16 {
    let mut tcp = TcpStream::connect(s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\n{UPGRADE_HEAD}{extra}\r\n");
    let mut bytes = prefix.to_vec();
    bytes.extend_from_slice(req.as_bytes());
    tcp.write_all(&bytes).unwrap();
    let head = status_line(&mut tcp);
    std::str::from_utf8(&head)
        .ok()
        .and_then(|t| t.strip_prefix("HTTP/1.1 "))
        .and_then(|t| t.get(..3))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn v1(src: &str) -> Vec<u8> {
    format!("PROXY TCP4 {src} 127.0.0.1 40000 80\r\n").into_bytes()
}

fn v2(src: [u8; 4]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&[127, 0, 0, 1, 0x9c, 0x40, 0, 80]);
    h
}

/// Three upgrades "from" one address within at most two one-second windows of
/// `ws_connect_rate_per_ip = 1`: at least one is refused with 429.
fn limited(mut attempt: impl FnMut() -> u16) -> (usize, usize) {
    let statuses: Vec<u16> = (0..3).map(|_| attempt()).collect();
    let ok = statuses.iter().filter(|&&s| s == 101).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(ok + refused, 3, "{statuses:?}");
    (ok, refused)
}

#[test]
fn upgrades_over_the_node_rate_are_closed_with_1013_and_a_retry_after() {
    let s = Server::start_with(Options::config(
        "max_upgrades_per_second = 3\nmetrics_listen = \"127.0.0.1:0\"\n",
    ));
    let p = s.project("storm", "1000/s");
    let mut accepted = Vec::new();
    let mut waits = Vec::new();
    for _ in 0..12 {
        let (mut ws, resp) = tungstenite::connect(s.ws_url(&p.public)).expect("101");
        assert_eq!(resp.status().as_u16(), 101);
        set_timeout(&mut ws, Duration::from_secs(10));
        match ws.read().expect("a first frame") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                assert_eq!(v["type"], "connected", "{v}");
                accepted.push(ws);
            }
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 1013);
                let reason = frame.reason.to_string();
                let secs: u64 = reason
                    .strip_prefix("retry_after=")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("reason {reason:?}"));
                assert!((1..=10).contains(&secs), "{reason}");
                waits.push(secs);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A burst of one second's worth (3), refilled at 3/s while the loop runs.
    assert!(accepted.len() >= 3, "{} accepted", accepted.len());
    assert!(!waits.is_empty(), "no upgrade was refused");
    // Each refusal is counted.
    let refused = |m: &HashMap<String, f64>| sample(m, "ringcast_upgrades_refused_total");
    let want = waits.len() as f64;
    assert_eq!(refused(&s.scrape_when(|m| refused(m) == want)), want);
    // Refused upgrades take no slot: the connections held keep working.
    let mut ws = accepted.pop().unwrap();
    ws.send(Message::text(r#"{"type":"ping"}"#)).unwrap();
    assert_eq!(next_json(&mut ws)["type"], "pong");
}

#[test]
fn pusher_upgrades_over_the_node_rate_get_4100() {
    let s = Server::start_with(Options::config("max_upgrades_per_second = 2\n"));
    let v = cli(
        &s.data_dir,
        &["project", "create", "pusher", "--rate-limit", "1000/s"],
    );
    let key = v["public_key"].as_str().unwrap().to_string();
    s.wait_key(v["secret_key"].as_str().unwrap());
    let url = format!(
        "ws://{}/app/{key}?protocol=7&client=js&version=8.6.0",
        s.addr
    );
    let mut refused = 0;
    for _ in 0..10 {
        let (mut ws, _) = tungstenite::connect(&url).expect("101");
        set_timeout(&mut ws, Duration::from_secs(10));
        let first = next_json(&mut ws);
        if first["event"] == "pusher:connection_established" {
            continue;
        }
        assert_eq!(first["event"], "pusher:error", "{first}");
        assert_eq!(first["data"]["code"], 4100, "{first}");
        match ws.read() {
            Ok(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 4100),
            other => panic!("expected the close 4100, got {other:?}"),
        }
        refused += 1;
    }
    assert!(refused > 0, "no Pusher upgrade was refused");
}

#[test]
fn shutdown_spreads_its_1001_closes_over_drain_spread_s() {
    let mut s = Server::start_with(Options::config("drain_spread_s = 2\n"));
    let p = s.project("drain", "1000/s");
    let start = Instant::now();
    let readers: Vec<_> = (0..20)
        .map(|_| {
            let mut ws = s.ws(&p.public);
            set_timeout(&mut ws, Duration::from_secs(30));
            std::thread::spawn(move || loop {
                match ws.read() {
                    Ok(Message::Close(frame)) => {
                        return (frame.map(|f| u16::from(f.code)), Instant::now());
                    }
                    Ok(_) => continue,
                    Err(e) => panic!("before the close: {e}"),
                }
            })
        })
        .collect();
    let status = s.terminate(Duration::from_secs(15)).expect("exited");
    assert!(status.success(), "{status:?}");
    let closes: Vec<(Option<u16>, Instant)> =
        readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(closes.iter().all(|(code, _)| *code == Some(1001)));
    let first = closes.iter().map(|c| c.1).min().unwrap();
    let last = closes.iter().map(|c| c.1).max().unwrap();
    // Each worker closes its ~10 connections at i × 2 s / n: the last ones 1.6 s or
    // more after the first. All at once would be a few milliseconds.
    assert!(
        last - first >= Duration::from_millis(1200),
        "closes spread over {:?} only",
        last - first
    );
    assert!(first > start);
}

#[test]
fn proxy_headers_from_a_trusted_peer_name_the_client() {
    let s = Server::start_with(Options::config("trusted_proxies = [\"127.0.0.0/8\"]\nws_connect_rate_per_ip = 1\nmax_upgrades_per_second = 0\n"));
    let p = s.project("proxied", "1000/s");
    let path = format!("/api/v1/ws?key={}", p.public);
    // v1: the same client address is limited ...
    let (_, refused) = limited(|| raw_upgrade(&s, &v1("203.0.113.7"), &path, ""));
    assert!(refused >= 1);
    // ... while other addresses behind the same proxy are not.
    assert_eq!(raw_upgrade(&s, &v1("203.0.113.8"), &path, ""), 101);
    assert_eq!(raw_upgrade(&s, &v2([198, 51, 100, 1]), &path, ""), 101);
    // v2 names the client the same way.
    let (_, refused) = limited(|| raw_upgrade(&s, &v2([198, 51, 100, 2]), &path, ""));
    assert!(refused >= 1);
    // A malformed header from a trusted peer: the connection is closed unanswered.
    assert_eq!(raw_upgrade(&s, b"PROXY TCP4 nonsense\r\n", &path, ""), 0);
    // Bounded: a v1 line past 107 bytes, a v2 length past 2048, are not waited for.
    let long = format!("PROXY UNKNOWN {}\r\n", "x".repeat(200));
    assert_eq!(raw_upgrade(&s, long.as_bytes(), &path, ""), 0);
    let mut huge = v2([198, 51, 100, 3]);
    huge[14..16].copy_from_slice(&60_000u16.to_be_bytes());
    assert_eq!(raw_upgrade(&s, &huge, &path, ""), 0);
    // A trusted peer without a header: X-Forwarded-For, rightmost untrusted entry
    // (the client-written one on the left is not believed).
    for i in 0..3 {
        let xff = format!("X-Forwarded-For: 10.9.9.{i}, 192.0.2.44\r\n");
        assert_ne!(raw_upgrade(&s, b"", &path, &xff), 0);
    }
    let xff = |a: &str| format!("X-Forwarded-For: {a}\r\n");
    assert_eq!(raw_upgrade(&s, b"", &path, &xff("192.0.2.45")), 101);
    let (_, refused) = limited(|| raw_upgrade(&s, b"", &path, &xff("192.0.2.46")));
    assert!(refused >= 1);
    // The health endpoint keeps answering over PROXY (HAProxy's checks send LOCAL).
    let mut local = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    local.extend_from_slice(&[0x20, 0x00, 0, 0]);
    let mut tcp = TcpStream::connect(s.addr).unwrap();
    tcp.write_all(&local).unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[test]
fn an_untrusted_peer_gets_no_say_about_the_client_address() {
    let s = Server::start_with(Options::config("trusted_proxies = [\"10.0.0.0/8\"]\nws_connect_rate_per_ip = 1\nmax_upgrades_per_second = 0\n"));
    let p = s.project("direct", "1000/s");
    let path = format!("/api/v1/ws?key={}", p.public);
    // A PROXY header from 127.0.0.1 (not trusted) is never parsed: it is a malformed
    // HTTP request, refused with 400 and the connection closed.
    assert_eq!(raw_upgrade(&s, &v1("203.0.113.9"), &path, ""), 400);
    assert_eq!(raw_upgrade(&s, &v2([203, 0, 113, 10]), &path, ""), 400);
    // X-Forwarded-For is ignored: different claimed addresses are one client.
    let mut i = 0;
    let (ok, refused) = limited(|| {
        i += 1;
        raw_upgrade(&s, b"", &path, &format!("X-Forwarded-For: 192.0.2.{i}\r\n"))
    });
    assert!(refused >= 1 && ok <= 2);
}

/// Over TLS: the PROXY header comes before the handshake; without one, the bytes read
/// to look for it start the handshake.
#[test]
fn proxy_headers_before_tls() {
    let files = common::TlsFiles::generate();
    let s = Server::start_tls(
        Options::config("trusted_proxies = [\"127.0.0.1\"]\nws_connect_rate_per_ip = 1\nmax_upgrades_per_second = 0\n"),
        &files,
    );
    let cfg = files.client_config(&[b"http/1.1"]);
    let p = s.project("tls", "1000/s");
    let request = |prefix: &[u8], req: &str| -> String {
        let mut tcp = TcpStream::connect(s.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.write_all(prefix).unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(s.addr.ip().into());
        let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(req.as_bytes()).unwrap();
        String::from_utf8_lossy(&status_line(&mut tls)).to_string()
    };
    let health = "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert!(request(b"", health).starts_with("HTTP/1.1 200"));
    assert!(request(&v2([198, 51, 100, 9]), health).starts_with("HTTP/1.1 200"));
    let upgrade = format!(
        "GET /api/v1/ws?key={} HTTP/1.1\r\nHost: t\r\n{UPGRADE_HEAD}\r\n",
        p.public
    );
    let status = |prefix: &[u8]| -> u16 {
        request(prefix, &upgrade)
            .strip_prefix("HTTP/1.1 ")
            .and_then(|t| t.get(..3))
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    };
    let (_, refused) = limited(|| status(&v2([198, 51, 100, 10])));
    assert!(refused >= 1);
    assert_eq!(status(&v2([198, 51, 100, 11])), 101);
    assert_eq!(status(&v1("198.51.100.12")), 101);
}
