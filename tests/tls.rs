//! TLS black-box tests: the real binary started with `--tls-cert/--tls-key` on a
//! certificate generated here (rcgen), talked to by real TLS clients that trust exactly
//! that certificate: ureq (HTTPS), tungstenite over rustls (WSS), and rustls directly
//! where the test is about the handshake or the bytes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn start() -> (Server, TlsFiles) {
    let files = TlsFiles::generate();
    let server = Server::start_tls(Options::default(), &files);
    (server, files)
}

#[test]
fn https_health_and_publish() {
    let (s, files) = start();
    assert!(s.url("/health").starts_with("https://"));
    let agent = files.agent();
    let mut resp = agent.get(s.url("/health")).call().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(v["status"], "ok");

    let p = s.project("tls", "1000/s");
    let mut resp = s.agent_publish(
        &agent,
        &p.secret,
        r#"{"channel":"news","event":"e","data":{"x":1}}"#,
    );
    assert_eq!(resp.status().as_u16(), 202);
    assert_eq!(resp.headers().get("ratelimit-limit").unwrap(), "1000");
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["id"].as_str().is_some_and(|id| !id.is_empty()));

    // Errors keep their contract over TLS too.
    let resp = s.agent_publish(&agent, "sk_nope", "{}");
    assert_eq!(resp.status().as_u16(), 401);
}

#[test]
fn keep_alive_and_a_large_body_over_tls() {
    let (s, _files) = start();
    let p = s.project("big", "100000/s");
    // A 60 KiB body spans several TLS records; three requests share one connection.
    let data = "x".repeat(60 * 1024);
    let body = json!({"channel": "c", "event": "e", "data": data}).to_string();
    let mut conn = s.connect();
    let mut req = Vec::new();
    for i in 0..3 {
        let close = if i == 2 { "Connection: close\r\n" } else { "" };
        req.extend_from_slice(
            format!(
                "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{close}\r\n",
                p.secret,
                body.len()
            )
            .as_bytes(),
        );
        req.extend_from_slice(body.as_bytes());
    }
    conn.write_all(&req).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 202 Accepted").count(), 3, "{text}");
}

#[test]
fn alpn_is_http11() {
    let (s, files) = start();
    let cfg = files.client_config(&[b"h2", b"http/1.1"]);
    let name = rustls::pki_types::ServerName::IpAddress(s.addr.ip().into());
    let mut conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut tcp = TcpStream::connect(s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[test]
fn tls12_is_accepted() {
    let (s, files) = start();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            files.cert_der.clone(),
        ))
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::IpAddress(s.addr.ip().into());
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let tcp = TcpStream::connect(s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    assert_eq!(
        stream.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn wss_subscriber_receives_a_published_message() {
    let (s, _files) = start();
    let p = s.project("ws", "1000/s");
    let mut ws = s.ws_on(&p.public, "news");
    // A second subscriber on the same channel: fan-out over TLS reaches both.
    let mut ws2 = s.ws_on(&p.public, "news");
    for i in 0..20 {
        let (status, _) = s.publish(&p.secret, "news", "tick", json!({"i": i}));
        assert_eq!(status, 202);
    }
    for w in [&mut ws, &mut ws2] {
        for i in 0..20 {
            let m = next_json(w);
            assert_eq!(m["type"], "message", "{m}");
            assert_eq!(m["channel"], "news");
            assert_eq!(m["event"], "tick");
            assert_eq!(m["data"], json!({"i": i}));
        }
    }
    // The client protocol works in the other direction too.
    send_json(&mut ws, json!({"type": "ping"}));
    assert_eq!(next_json(&mut ws)["type"], "pong");
}

#[test]
fn wss_refuses_a_secret_key_with_401() {
    let (s, files) = start();
    let p = s.project("ws401", "1000/s");
    let tcp = TcpStream::connect(s.addr).unwrap();
    let err = tungstenite::client_tls_with_config(
        s.ws_url(&p.secret),
        tcp,
        None,
        Some(tungstenite::Connector::Rustls(
            files.client_config(&[b"http/1.1"]),
        )),
    )
    .unwrap_err();
    match err {
        tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 401)
        }
        other => panic!("expected HTTP 401, got {other:?}"),
    }
}

#[test]
fn plaintext_to_the_tls_port_is_refused_and_the_server_keeps_serving() {
    let (s, files) = start();
    for _ in 0..3 {
        let out = s.raw_plain(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        // At most a TLS alert record (0x15), never an HTTP answer.
        assert!(
            !out.starts_with(b"HTTP/"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        assert!(out.is_empty() || out[0] == 0x15, "{out:?}");
    }
    // A client that connects and says nothing is cut at the header-read timeout; it
    // does not hold up others meanwhile.
    let _silent = TcpStream::connect(s.addr).unwrap();
    let (status, body) = s.health();
    assert_eq!(status, 200, "{body}");
    let resp = files.agent().get(s.url("/health")).call().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[test]
fn silent_tls_client_is_cut_at_the_header_timeout() {
    let files = TlsFiles::generate();
    let s = Server::start_tls(Options::config("header_read_timeout_ms = 300\n"), &files);
    let mut tcp = TcpStream::connect(s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = tcp.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    assert!(start.elapsed() < Duration::from_secs(3));
}

fn serve_fails(args: &[&std::ffi::OsStr]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "1"])
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve should fail");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("listening"), "it listened: {stdout}");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn bad_certificate_or_key_stops_the_start_with_a_clear_error() {
    let files = TlsFiles::generate();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "this is not PEM\n").unwrap();

    let other = TlsFiles::generate();
    // (certificate, key, what the error says)
    let cases: [(&std::path::Path, &std::path::Path, &[&str]); 5] = [
        (
            &missing,
            &files.key,
            &["cannot read TLS certificate file", "missing.pem"],
        ),
        (&garbage, &files.key, &["holds no PEM certificate"]),
        (&files.cert, &garbage, &["no usable PEM private key"]),
        // A certificate given as the key (a PEM file, but no key in it).
        (&files.cert, &files.cert, &["no usable PEM private key"]),
        // A key that does not belong to the certificate.
        (&files.cert, &other.key, &["not usable together"]),
    ];
    for (cert, key, says) in cases {
        let err = serve_fails(&[
            "--tls-cert".as_ref(),
            cert.as_os_str(),
            "--tls-key".as_ref(),
            key.as_os_str(),
        ]);
        for part in says {
            assert!(err.contains(part), "{part}: {err}");
        }
    }
}

#[test]
fn tls_from_the_config_file() {
    let files = TlsFiles::generate();
    let config = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        files.cert.display().to_string(),
        files.key.display().to_string()
    );
    // Started through the config file only; the helpers still need to know it is TLS.
    let mut s = Server::start_with(Options {
        config,
        ..Options::default()
    });
    s.tls = Some(files.client_config(&[b"http/1.1"]));
    let (status, body) = s.health();
    assert_eq!(status, 200, "{body}");
}

/// Not a test: the figures behind docs/tls-bench.md, TLS beside plaintext from one run.
/// `cargo test --release --test tls -- --ignored --nocapture tls_vs_plain_figures`
/// Knobs: BENCH_CONNS (publisher connections, 8), BENCH_SECS (per phase, 5),
/// BENCH_SUBS (subscribers, 200), BENCH_MSGS (messages fanned out, 500).
#[test]
#[ignore = "benchmark, not a check: produces the figures of docs/tls-bench.md; run by hand with --ignored"]
fn tls_vs_plain_figures() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let conns = env("BENCH_CONNS", 8);
    let secs = env("BENCH_SECS", 5) as u64;
    let subs = env("BENCH_SUBS", 200);
    let msgs = env("BENCH_MSGS", 500);
    let files = TlsFiles::generate();
    let opts = || Options::config("send_backlog_bytes = 67108864\n").workers(2);
    let plain = Server::start_with(opts());
    let tls = Server::start_tls(opts(), &files);
    for (name, s) in [("plain", &plain), ("tls", &tls)] {
        let p = s.project("bench", "10000000/s");
        let cpu0 = server_cpu_s(s.pid());
        let (rate, requests) = publish_rate(s, &p.secret, conns, Duration::from_secs(secs));
        let cpu1 = server_cpu_s(s.pid());
        let (deliveries, elapsed) = fanout(s, &p, subs, msgs);
        let cpu2 = server_cpu_s(s.pid());
        println!(
            "{name}: publish {rate:.0} req/s ({conns} keep-alive conns, {secs} s), server CPU \
             {:.2} us/request; fan-out {deliveries} deliveries to {subs} subscribers in \
             {:.3} s = {:.0}/s, server CPU {:.3} us/delivery",
            (cpu1 - cpu0) * 1e6 / requests as f64,
            elapsed.as_secs_f64(),
            deliveries as f64 / elapsed.as_secs_f64(),
            (cpu2 - cpu1) * 1e6 / deliveries as f64,
        );
    }
}

/// User + system CPU seconds the server process has used so far.
fn server_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on every Linux ABI ringcast runs on.
    ticks / 100.0
}

fn publish_rate(s: &Server, key: &str, conns: usize, dur: Duration) -> (f64, u64) {
    let body = r#"{"channel":"bench","event":"e","data":{"n":1}}"#;
    let req = format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let done = std::sync::atomic::AtomicU64::new(0);
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..conns {
            scope.spawn(|| {
                let mut c = s.connect();
                let mut buf = vec![0u8; 4096];
                let mut n = 0u64;
                while start.elapsed() < dur {
                    c.write_all(req.as_bytes()).unwrap();
                    // One response: head + a short JSON body; read until it is whole.
                    let mut got = Vec::new();
                    loop {
                        let k = c.read(&mut buf).unwrap();
                        assert!(k > 0, "server closed");
                        got.extend_from_slice(&buf[..k]);
                        if let Some(h) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&got[..h]).to_string();
                            assert!(head.starts_with("HTTP/1.1 202"), "{head}");
                            let len: usize =
                                header(&head, "content-length").unwrap().parse().unwrap();
                            if got.len() >= h + 4 + len {
                                break;
                            }
                        }
                    }
                    n += 1;
                }
                done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    let n = done.into_inner();
    (n as f64 / start.elapsed().as_secs_f64(), n)
}

fn fanout(s: &Server, p: &Project, subs: usize, msgs: usize) -> (usize, Duration) {
    let ready = std::sync::Barrier::new(subs + 1);
    let mut elapsed = Duration::ZERO;
    let total = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for _ in 0..subs {
            handles.push(scope.spawn(|| {
                let mut ws = s.ws_on(&p.public, "fan");
                ready.wait();
                for _ in 0..msgs {
                    let m = next_json(&mut ws);
                    assert_eq!(m["type"], "message");
                }
                total.fetch_add(msgs, std::sync::atomic::Ordering::Relaxed);
                std::time::Instant::now()
            }));
        }
        ready.wait();
        let start = std::time::Instant::now();
        let mut c = s.connect();
        let body = r#"{"channel":"fan","event":"e","data":{"n":1}}"#;
        let req = format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            p.secret,
            body.len()
        );
        // Pipelined in chunks of 50: publishing is not what this phase measures.
        let mut sent = 0;
        let mut buf = vec![0u8; 65536];
        while sent < msgs {
            let k = (msgs - sent).min(50);
            c.write_all(req.repeat(k).as_bytes()).unwrap();
            let mut answers = 0;
            let mut got = Vec::new();
            while answers < k {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
                answers = String::from_utf8_lossy(&got)
                    .matches("HTTP/1.1 202")
                    .count();
            }
            sent += k;
        }
        let last = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap();
        elapsed = last - start;
    });
    (total.into_inner(), elapsed)
}
