//! Operating ringcast, against the real binary: the Prometheus metrics move by exactly
//! what the test did; json logs are one JSON object per line with no key in them;
//! `config show` names each value's source; bad configuration is refused in one line;
//! `ringcast publish`/`subscribe` round trips over plain HTTP and TLS; the Grafana
//! dashboard asks only for metrics the server exports.

#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::metrics::sample;
use common::*;
use serde_json::{json, Value};

const METRICS: &str = "metrics_listen = \"127.0.0.1:0\"\n";

/// GET /metrics: status and body.
fn get(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn requests(m: &HashMap<String, f64>, status: u16) -> f64 {
    m.get(&format!(
        "ringcast_publish_requests_total{{api=\"native\",status=\"{status}\"}}"
    ))
    .copied()
    .unwrap_or(0.0)
}

/// Bytes of a server-to-client text frame carrying `payload`.
fn frame_len(payload: &str) -> usize {
    let n = payload.len();
    n + if n < 126 { 2 } else { 4 }
}

/// Read the next text frame, returning it and its size on the wire.
fn next_sized(ws: &mut Ws) -> (Value, usize) {
    loop {
        match ws.read().expect("ws read") {
            tungstenite::Message::Text(t) => {
                return (serde_json::from_str(t.as_str()).unwrap(), frame_len(&t))
            }
            tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A subscriber whose received WebSocket bytes are all counted.
fn counted_subscriber(s: &Server, key: &str, channel: &str, bytes: &mut usize) -> Ws {
    let (mut ws, _) = tungstenite::connect(s.ws_url(key)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let (hello, n) = next_sized(&mut ws);
    assert_eq!(hello["type"], "connected");
    *bytes += n;
    send_json(&mut ws, json!({"type": "subscribe", "channel": channel}));
    let (reply, n) = next_sized(&mut ws);
    assert_eq!(reply["type"], "subscribed");
    *bytes += n;
    ws
}

#[test]
fn metrics_move_by_exactly_the_publishes_deliveries_and_refusals() {
    let s = Server::start_with(Options {
        workers: 2,
        config: METRICS.into(),
        ..Options::default()
    });
    let p = s.project("m", "100000/s");
    let before = s.scrape();
    assert_eq!(sample(&before, "ringcast_connections"), 0.0);

    // Three subscribers of "c" (spread over both workers by the kernel) and one of "other".
    let mut bytes = 0usize;
    let mut subs: Vec<Ws> = (0..3)
        .map(|_| counted_subscriber(&s, &p.public, "c", &mut bytes))
        .collect();
    let mut bystander = counted_subscriber(&s, &p.public, "other", &mut bytes);
    wait_for(
        Duration::from_secs(3),
        "4 connections, 4 subscriptions",
        || {
            let m = s.scrape();
            sample(&m, "ringcast_connections") == 4.0 && sample(&m, "ringcast_subscriptions") == 4.0
        },
    );

    // 5 accepted publishes; refusals: 2 × 401, 1 × 400, 1 × 415, 1 × 405.
    for i in 0..5 {
        assert_eq!(s.publish(&p.secret, "c", "e", json!({"i": i})).0, 202);
    }
    assert_eq!(s.publish("sk_unknown", "c", "e", json!({})).0, 401);
    assert_eq!(s.publish(&p.public, "c", "e", json!({})).0, 401);
    assert_eq!(
        s.raw_publish(&p.secret, "application/json", b"{nope").0,
        400
    );
    assert_eq!(s.raw_publish(&p.secret, "text/plain", b"{}").0, 415);
    let resp = s.raw(b"GET /api/v1/publish HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(parse_response(&resp).0, 405);

    for ws in subs.iter_mut() {
        for i in 0..5 {
            let (m, n) = next_sized(ws);
            assert_eq!(m["data"]["i"], i);
            bytes += n;
        }
    }
    expect_silence(&mut bystander, Duration::from_millis(200));

    // A worker counts its deliveries just after writing them: the scrape waits for them.
    let want = sample(&before, "ringcast_deliveries_total") + 15.0;
    let after = s.scrape_when(|m| sample(m, "ringcast_deliveries_total") == want);
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(requests(&after, 202) - requests(&before, 202), 5.0);
    assert_eq!(requests(&after, 401) - requests(&before, 401), 2.0);
    assert_eq!(requests(&after, 400) - requests(&before, 400), 1.0);
    assert_eq!(requests(&after, 415), 1.0);
    assert_eq!(requests(&after, 405), 1.0);
    assert_eq!(delta("ringcast_messages_published_total"), 5.0);
    assert_eq!(delta("ringcast_deliveries_total"), 15.0);
    assert_eq!(delta("ringcast_publish_duration_seconds_count"), 5.0);
    assert_eq!(
        delta("ringcast_publish_duration_seconds_bucket{le=\"+Inf\"}"),
        5.0
    );
    assert!(delta("ringcast_publish_duration_seconds_sum") > 0.0);
    assert_eq!(delta("ringcast_slow_consumer_closes_total"), 0.0);
    // The writer counts a write once it completed, which may be just after the client
    // read it: wait for the exact figure.
    wait_for(
        Duration::from_secs(3),
        "bytes_sent to equal every frame the clients received",
        || {
            let m = s.scrape();
            sample(&m, "ringcast_bytes_sent_total") == bytes as f64
        },
    );
    assert_eq!(sample(&after, "ringcast_mailbox_depth{worker=\"0\"}"), 0.0);
    assert_eq!(sample(&after, "ringcast_mailbox_depth{worker=\"1\"}"), 0.0);
    assert_eq!(sample(&after, "ringcast_cluster_connected"), 0.0);
    assert_eq!(sample(&after, "ringcast_cluster_enabled"), 0.0);

    // No label names a channel, a key or a connection: only these label names exist.
    for series in after.keys() {
        if let Some((_, labels)) = series.split_once('{') {
            for pair in labels.trim_end_matches('}').split(',') {
                let name = pair.split('=').next().unwrap();
                assert!(
                    ["api", "status", "le", "worker", "version", "reason", "result"]
                        .contains(&name),
                    "unexpected label in {series}"
                );
            }
        }
        assert!(
            !series.contains(&p.public) && !series.contains("\"c\""),
            "{series}"
        );
    }

    // Gauges follow closes and unsubscribes.
    drop(subs.pop());
    send_json(&mut subs[0], json!({"type": "unsubscribe", "channel": "c"}));
    assert_eq!(next_json(&mut subs[0])["type"], "unsubscribed");
    wait_for(
        Duration::from_secs(3),
        "3 connections, 2 subscriptions",
        || {
            let m = s.scrape();
            sample(&m, "ringcast_connections") == 3.0 && sample(&m, "ringcast_subscriptions") == 2.0
        },
    );
}

#[test]
fn metrics_listener_serves_only_get_metrics_and_is_off_by_default() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let addr = s.metrics.unwrap();
    assert_ne!(addr.port(), s.addr.port());
    let (status, body) = get(addr, "GET /metrics?x=1 HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.contains("# TYPE ringcast_publish_duration_seconds histogram"));
    assert_eq!(get(addr, "GET /health HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    // The service's own listener knows no /metrics.
    let resp = s.raw(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(parse_response(&resp).0, 404);

    let plain = Server::start();
    assert!(plain.metrics.is_none(), "metrics are off by default");
}

/// Issue 20, finding 9: clients trickling a request head into the metrics port (a byte
/// every 500 ms, under the old per-read timeout of 2 s) held the one-at-a-time listener,
/// so every scrape waited. Now scrapes are served beside them, and each trickler is cut
/// when its head is not complete within 2 s of the accept.
#[test]
fn a_slow_client_on_the_metrics_port_holds_up_no_scrape() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let addr = s.metrics.expect("metrics address");
    let (connected_tx, connected) = std::sync::mpsc::channel();
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let connected_tx = connected_tx.clone();
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                let _ = connected_tx.send(());
                // The read timeout paces the trickle; a read that returns means the
                // server answered or closed.
                c.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let start = std::time::Instant::now();
                let mut buf = [0u8; 256];
                for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().cycle() {
                    if start.elapsed() > Duration::from_secs(12) {
                        return None;
                    }
                    if c.write_all(&[*byte]).is_err() {
                        return Some(start.elapsed());
                    }
                    match c.read(&mut buf) {
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        _ => return Some(start.elapsed()),
                    }
                }
                None
            })
        })
        .collect();
    for _ in 0..4 {
        connected.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    for _ in 0..3 {
        let start = std::time::Instant::now();
        let (status, body) = get(addr, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        let took = start.elapsed();
        assert_eq!(
            status, 200,
            "no scrape answer within 5 s beside the tricklers"
        );
        assert!(body.contains("ringcast_build_info"));
        assert!(took < Duration::from_millis(1500), "a scrape took {took:?}");
        eprintln!("a scrape beside 4 trickling clients: {took:?}");
    }
    for t in tricklers {
        let cut = t.join().unwrap();
        assert!(
            cut.is_some_and(|d| d < Duration::from_secs(5)),
            "a trickling client was still served after 12 s: {cut:?}"
        );
    }
}

#[test]
fn slow_consumer_closes_are_counted_and_logged_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let s = Server::start_with(Options {
        workers: 1,
        config: format!("{METRICS}send_backlog_bytes = 65536\nlog_format = \"json\"\n"),
        log_file: Some(log.clone()),
        ..Options::default()
    });
    let p = s.project("slow", "1000000/s");
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let ws = s.ws_on(&p.public, "c");
        stalled.push(ws);
    }
    let blob = "x".repeat(8000);
    let agent = agent();
    let mut sent = 0;
    while sample(&s.scrape(), "ringcast_slow_consumer_closes_total") < 2.0 {
        assert!(sent < 4000, "no slow-consumer close after {sent} publishes");
        let body = json!({"channel": "c", "event": "e", "data": {"pad": blob}});
        let resp = s.agent_publish(&agent, &p.secret, &body.to_string());
        assert_eq!(resp.status().as_u16(), 202);
        sent += 1;
    }
    assert_eq!(
        sample(&s.scrape(), "ringcast_slow_consumer_closes_total"),
        2.0
    );
    for ws in stalled.iter_mut() {
        assert_eq!(close_code(ws), Some(4008));
    }
    // One summary line for both closes, within the 10 s interval.
    let summaries = || log_lines(&log, |m| m.starts_with("slow consumers closed"));
    wait_for(Duration::from_secs(12), "the slow-consumer summary", || {
        !summaries().is_empty()
    });
    let lines = summaries();
    assert_eq!(lines[0]["level"], "WARN");
    let closed: u64 = lines
        .iter()
        .map(|v| v["fields"]["closed"].as_u64().unwrap())
        .sum();
    assert_eq!(closed, 2, "{lines:?}");
}

#[test]
fn json_logs_are_one_object_per_line_and_never_hold_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut s = Server::start_with(Options {
        config: "log_format = \"json\"\n".into(),
        env: vec![("RUST_LOG", "trace")],
        log_file: Some(log.clone()),
        ..Options::default()
    });
    let p = s.project("logs", "100000/s");
    // Everything that carries a key: publishes (good, refused), a WebSocket with its key
    // in the query string, a refused upgrade, a revocation closing a socket.
    assert_eq!(s.publish(&p.secret, "c", "e", json!({"a": 1})).0, 202);
    assert_eq!(
        s.publish("sk_notarealkeyatall000000000000000", "c", "e", json!({}))
            .0,
        401
    );
    let mut ws = s.ws_on(&p.public, "c");
    assert!(tungstenite::connect(s.ws_url("pk_notarealkeyatall000000000000000")).is_err());
    cli(&s.data_dir, &["key", "revoke", &p.public]);
    assert_eq!(close_code(&mut ws), Some(4001));
    assert!(s
        .terminate(Duration::from_secs(5))
        .is_some_and(|st| st.success()));

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines
        .iter()
        .all(|v| v.is_object() && v["level"].is_string()));
    for secret in [
        p.secret.as_str(),
        &p.public,
        "sk_notarealkeyatall",
        "pk_notarealkeyatall",
    ] {
        assert!(!text.contains(secret), "a key in the logs:\n{text}");
    }
    let start = lines
        .iter()
        .find(|v| v["fields"]["message"] == "ringcast started")
        .unwrap_or_else(|| panic!("no start line in\n{text}"));
    let f = &start["fields"];
    assert_eq!(f["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(f["listen"], format!("http://{}", s.addr));
    assert_eq!(f["workers"], 2);
    assert!(f["driver"] == "io_uring" || f["driver"] == "epoll", "{f}");
    assert_eq!(f["store"], "sqlite");
    assert_eq!(f["cluster"], "off");
    assert!(lines
        .iter()
        .any(|v| v["fields"]["message"] == "shutting down"));
}

/// Issue 20, finding 13: with `--log-format json` every line the server prints, on
/// stdout (the `--dev` keys, the metrics and listening lines) and on stderr, is one JSON
/// object; the start lines keep their text in `fields.message`.
#[test]
fn with_json_logs_every_line_on_stdout_and_stderr_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--dev",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all
    });
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| start_line_text(l).starts_with("ringcast listening on "))
    {
        seen.push(
            rx.recv_timeout(Duration::from_secs(20))
                .expect("the listening line"),
        );
    }
    // The metrics line still names a working address.
    let metrics = seen
        .iter()
        .find_map(|l| {
            start_line_text(l)
                .strip_prefix("ringcast metrics on http://")
                .map(|a| a.trim_end_matches("/metrics").to_string())
        })
        .expect("the metrics line");
    let (status, _) = get(
        metrics.parse().unwrap(),
        "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(status, 200);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(exit_within(&mut child, Duration::from_secs(10)).success());
    let stdout = out_reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    assert!(stdout.len() >= 3, "{stdout:?}");
    let parsed: Vec<Value> = stdout
        .iter()
        .map(String::as_str)
        .chain(stderr.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(parsed.iter().all(Value::is_object), "{parsed:?}");
    let listening = parsed
        .iter()
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("ringcast listening on http://"))
        })
        .expect("the listening line");
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["fields"]["workers"], 1);
    assert!(parsed.iter().any(|v| v["dev_project"].is_object()));
    assert!(parsed
        .iter()
        .any(|v| v["fields"]["message"] == "shutting down"));
}

#[test]
fn a_refused_start_in_json_is_one_json_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .args([
            "--tls-cert",
            "/nonexistent/c.pem",
            "--tls-key",
            "/nonexistent/k.pem",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let v: Value = serde_json::from_str(err.trim()).expect("a JSON line");
    assert_eq!(v["level"], "ERROR");
    assert!(v["fields"]["error"]
        .as_str()
        .unwrap()
        .contains("cannot read TLS certificate file"));
}

/// `ringcast config show` with the given args/env; the parsed JSON.
fn config_show(args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(bin())
        .args(args)
        .env_remove("RINGCAST_LISTEN")
        .env_remove("RINGCAST_METRICS_LISTEN")
        .env_remove("RINGCAST_REDIS_URL")
        .env_remove("RINGCAST_DATA_DIR")
        .env_remove("RINGCAST_MASTER_KEY_FILE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_success(&out, "ringcast");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The child's exit status, once it exits within `d`.
fn exit_within(child: &mut std::process::Child, d: Duration) -> std::process::ExitStatus {
    let mut status = None;
    wait_for(d, "the subscriber to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

mod cli_tools;
