//! Operating ringcast, against the real binary: the Prometheus metrics move by exactly
//! what the test did; json logs are one JSON object per line with no key in them;
//! `config show` names each value's source; bad configuration is refused in one line;
//! `ringcast publish`/`subscribe` round trips over plain HTTP and TLS; the Grafana
//! dashboard asks only for metrics the server exports.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

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

fn scrape_text(s: &Server) -> String {
    let addr = s.metrics.expect("server prints its metrics address");
    let (status, body) = get(addr, "GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    body
}

/// Every sample of a scrape: series (name and labels, as written) → value.
fn scrape(s: &Server) -> HashMap<String, f64> {
    scrape_text(s)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line");
            (series.to_string(), value.parse().expect("sample value"))
        })
        .collect()
}

fn metric(m: &HashMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no series {series} in {m:?}"))
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
    let before = scrape(&s);
    assert_eq!(metric(&before, "ringcast_connections"), 0.0);

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
            let m = scrape(&s);
            metric(&m, "ringcast_connections") == 4.0 && metric(&m, "ringcast_subscriptions") == 4.0
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

    let after = scrape(&s);
    let delta = |series: &str| metric(&after, series) - metric(&before, series);
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
            let m = scrape(&s);
            metric(&m, "ringcast_bytes_sent_total") == bytes as f64
        },
    );
    assert_eq!(metric(&after, "ringcast_mailbox_depth{worker=\"0\"}"), 0.0);
    assert_eq!(metric(&after, "ringcast_mailbox_depth{worker=\"1\"}"), 0.0);
    assert_eq!(metric(&after, "ringcast_cluster_connected"), 0.0);
    assert_eq!(metric(&after, "ringcast_cluster_enabled"), 0.0);

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
            let m = scrape(&s);
            metric(&m, "ringcast_connections") == 3.0 && metric(&m, "ringcast_subscriptions") == 2.0
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
        let mut ws = s.ws(&p.public);
        subscribe(&mut ws, "c");
        stalled.push(ws);
    }
    let blob = "x".repeat(8000);
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut sent = 0;
    while metric(&scrape(&s), "ringcast_slow_consumer_closes_total") < 2.0 {
        assert!(sent < 4000, "no slow-consumer close after {sent} publishes");
        let body = json!({"channel": "c", "event": "e", "data": {"pad": blob}});
        let resp = agent
            .post(s.url("/api/v1/publish"))
            .header("X-Api-Key", &p.secret)
            .content_type("application/json")
            .send(body.to_string())
            .unwrap();
        assert_eq!(resp.status().as_u16(), 202);
        sent += 1;
    }
    assert_eq!(
        metric(&scrape(&s), "ringcast_slow_consumer_closes_total"),
        2.0
    );
    for ws in stalled.iter_mut() {
        assert_eq!(close_code(ws), Some(4008));
    }
    // One summary line for both closes, within the 10 s interval.
    let summaries = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("slow consumers closed"))
            })
            .collect::<Vec<_>>()
    };
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
    let mut ws = s.ws(&p.public);
    subscribe(&mut ws, "c");
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn config_show_names_each_values_source_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ringcast.toml");
    std::fs::write(
        &file,
        "max_body_bytes = 1024\nlisten = \"127.0.0.1:9000\"\nworkers = 7\nlog_level = \"debug\"\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let v = config_show(
        &[
            "--redis",
            "redis://:hunter2@10.0.0.5:6379/0",
            "config",
            "show",
            "--config",
            file,
            "--workers",
            "3",
        ],
        &[
            ("RINGCAST_METRICS_LISTEN", "127.0.0.1:9100"),
            // Cluster mode needs a master key file (issue 14); config show names it.
            ("RINGCAST_MASTER_KEY_FILE", "cluster-master.key"),
        ],
    );
    let check = |key: &str, value: Value, source: &str| {
        assert_eq!(v[key]["value"], value, "{key}: {v}");
        assert_eq!(v[key]["source"], source, "{key}: {v}");
    };
    check("max_body_bytes", json!(1024), "file");
    check("listen", json!("127.0.0.1:9000"), "file");
    check("log_level", json!("debug"), "file");
    check("workers", json!(3), "flag");
    check("metrics_listen", json!("127.0.0.1:9100"), "env");
    check("redis", json!("redis://:***@10.0.0.5:6379/0"), "flag");
    check("master_key_file", json!("cluster-master.key"), "env");
    check("heartbeat_s", json!(25), "default");
    check("log_format", json!("text"), "default");
    assert!(!v.to_string().contains("hunter2"));
    // A password in the query (issue 20, finding 12): redis-rs reads `pass` on a unix
    // socket URL.
    let v = config_show(
        &[
            "--redis",
            "redis+unix:///run/redis.sock?db=2&pass=hunter2",
            "config",
            "show",
        ],
        &[("RINGCAST_MASTER_KEY_FILE", "cluster-master.key")],
    );
    assert_eq!(
        v["redis"]["value"], "redis+unix:///run/redis.sock?db=2&pass=***",
        "{v}"
    );
    assert!(!v.to_string().contains("hunter2"));

    // The environment against a flag: the flag is what the user typed on this run.
    let v = config_show(
        &["config", "show", "--listen", "127.0.0.1:9001"],
        &[("RINGCAST_LISTEN", "127.0.0.1:9002")],
    );
    assert_eq!(v["listen"]["value"], "127.0.0.1:9001");
    assert_eq!(v["listen"]["source"], "flag");
    let v = config_show(
        &["config", "show"],
        &[("RINGCAST_LISTEN", "127.0.0.1:9002")],
    );
    assert_eq!(v["listen"]["source"], "env");
    let v = config_show(&["config", "show", "--log-format", "json"], &[]);
    assert_eq!(v["log_format"]["value"], "json");
    assert_eq!(v["log_format"]["source"], "flag");
}

/// `ringcast serve` that must not start: its stderr.
fn refused(args: &[&str], config: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, config).unwrap();
    let out = Command::new(bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn bad_configuration_is_refused_in_one_line_naming_key_value_and_allowed() {
    let e = refused(&[], "max_bdy_bytes = 12\n", &[]);
    assert!(e.contains("unknown key `max_bdy_bytes` (= 12)"), "{e}");
    assert!(e.contains("max_body_bytes"), "lists the known keys: {e}");
    let e = refused(&[], "heartbeat_s = \"soon\"\n", &[]);
    assert!(e.contains("`heartbeat_s` = \"soon\" is not valid"), "{e}");
    let e = refused(&[], "mailbox_high_water_pct = 0\n", &[]);
    assert!(
        e.contains("mailbox_high_water_pct = 0") && e.contains("1 to 100"),
        "{e}"
    );
    let e = refused(&[], "log_format = \"xml\"\n", &[]);
    assert!(
        e.contains("log_format") && e.contains("xml") && e.contains("json"),
        "{e}"
    );
    let e = refused(&[], "tls_cert = \"c.pem\"\n", &[]);
    assert!(e.contains("tls_cert") && e.contains("together"), "{e}");
    let e = refused(&["--tls-cert", "c.pem"], "", &[]);
    assert!(e.contains("--tls-key"), "{e}");
    let e = refused(&[], "", &[("RINGCAST_METRICS_LISTEN", "nowhere")]);
    assert!(e.contains("nowhere") && e.contains("metrics-listen"), "{e}");
    let e = refused(&["--log-format", "xml"], "", &[]);
    assert!(e.contains("xml") && e.contains("text, json"), "{e}");
}

/// `ringcast subscribe` as a child process, its stdout read line by line.
struct Subscriber {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

fn spawn_subscriber(args: &[&str], key: &str) -> Subscriber {
    let mut child = Command::new(bin())
        .arg("subscribe")
        .args(args)
        .env("RINGCAST_KEY", key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Subscriber { child, lines }
}

fn run_publish(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("publish")
        .args(args)
        .env_remove("RINGCAST_KEY")
        .output()
        .unwrap()
}

fn exit_within(child: &mut std::process::Child, d: Duration) -> std::process::ExitStatus {
    let mut status = None;
    wait_for(d, "the subscriber to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

fn round_trip(s: &Server, extra: &[&str]) {
    let p = s.project("cli", "100000/s");
    let base = s.url("");
    let mut args = vec!["--url", base.as_str(), "--count", "3"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["news", "sport"]);
    let mut sub = spawn_subscriber(&args, &p.public);
    wait_for(
        Duration::from_secs(5),
        "the CLI subscriber's 2 subscriptions",
        || metric(&scrape(s), "ringcast_subscriptions") == 2.0,
    );
    let publish = |channel: &str, data: &str| {
        let mut a = vec!["--url", base.as_str(), "--key", p.secret.as_str()];
        a.extend_from_slice(extra);
        a.extend_from_slice(&[channel, "e", data]);
        run_publish(&a)
    };
    let out = publish(
        "news",
        "{\"n\": 1,\n \"big\": 123456789012345678901234567890}",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    assert!(publish("sport", "\"two\"").status.success());
    assert!(publish("elsewhere", "{}").status.success());
    assert!(
        publish("news", "[3]").status.code() == Some(1),
        "an array is a 400"
    );
    assert!(publish("news", "{\"n\":3}").status.success());
    let got: Vec<String> = (0..3)
        .map(|_| sub.lines.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    assert_eq!(
        got[0],
        format!(
            "{{\"type\":\"message\",\"channel\":\"news\",\"event\":\"e\",\"data\":{{\"n\":1,\"big\":123456789012345678901234567890}},\"id\":\"{id}\"}}"
        )
    );
    let second: Value = serde_json::from_str(&got[1]).unwrap();
    assert_eq!(
        (second["channel"].clone(), second["data"].clone()),
        (json!("sport"), json!("two"))
    );
    let third: Value = serde_json::from_str(&got[2]).unwrap();
    assert_eq!(third["data"]["n"], 3);
    assert!(exit_within(&mut sub.child, Duration::from_secs(5)).success());

    // A refused publish: exit 1, the status and body on stderr, nothing on stdout.
    let mut a = vec!["--url", base.as_str(), "--key", "sk_nope"];
    a.extend_from_slice(extra);
    a.extend_from_slice(&["news", "e", "{}"]);
    let out = run_publish(&a);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("HTTP 401") && err.contains("unauthorized"),
        "{err}"
    );
}

#[test]
fn cli_publish_and_subscribe_round_trip() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    round_trip(&s, &[]);

    // SIGINT ends `subscribe` with 0; a missing key is a one-line error.
    let p = s.project("int", "100/s");
    let base = s.url("");
    let mut sub = spawn_subscriber(&["--url", &base, "c"], &p.public);
    wait_for(Duration::from_secs(5), "the subscription", || {
        metric(&scrape(&s), "ringcast_subscriptions") == 1.0
    });
    let _ = Command::new("kill")
        .args(["-INT", &sub.child.id().to_string()])
        .status();
    assert!(exit_within(&mut sub.child, Duration::from_secs(5)).success());
    let out = run_publish(&["--url", &base, "c", "e", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RINGCAST_KEY"));
    // A revoked public key: subscribe fails with the server's 401.
    cli(&s.data_dir, &["key", "revoke", &p.public]);
    s.wait_key_refused(&p.public);
    let out = Command::new(bin())
        .args(["subscribe", "--url", &base, "--key", &p.public, "c"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 401"));
}

/// One plain HTTP answer per connection from a thread, each request head kept.
fn answering(answer: String) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            // Kept before answering, so it is there once the client has its answer.
            if tx
                .send(String::from_utf8_lossy(&head).into_owned())
                .is_err()
            {
                return;
            }
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (addr, rx)
}

/// Issue 20, finding 12: `ringcast publish` does not follow a redirect (it would carry
/// `X-Api-Key` to whatever host the answer names); it reports it and exits 1.
#[test]
fn cli_publish_follows_no_redirect_and_sends_the_key_nowhere_else() {
    let ok = "HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    let (elsewhere, elsewhere_got) = answering(ok.to_string());
    let key = "sk_redirecttestkey0000000000000000";
    // 301/302/303 turn the POST into a GET (and were followed with the key before the
    // fix); 307/308 would resend the POST.
    for status in [301, 302, 303, 307, 308] {
        let redirect = format!(
            "HTTP/1.1 {status} Moved\r\nLocation: http://{elsewhere}/api/v1/publish\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (redirector, redirector_got) = answering(redirect);
        let out = run_publish(&[
            "--url",
            &format!("http://{redirector}"),
            "--key",
            key,
            "c",
            "e",
            "{}",
        ]);
        let first = redirector_got.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(first.contains(key), "the key went to --url: {first}");
        // The command has exited: a followed redirect would have reached `elsewhere`.
        let followed = elsewhere_got.try_recv().ok();
        assert!(
            followed.is_none(),
            "{status}: the redirect was followed, the request: {followed:?}"
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&status.to_string()) && err.contains("not followed") && !err.contains(key),
            "{err}"
        );
    }
}

#[test]
fn cli_publish_and_subscribe_over_tls_with_a_private_ca() {
    let files = TlsFiles::generate();
    let s = Server::start_tls(
        Options {
            config: METRICS.into(),
            ..Options::default()
        },
        &files,
    );
    let ca = files.cert.to_str().unwrap().to_string();
    round_trip(&s, &["--ca-file", &ca]);

    // Without the CA the certificate is not trusted: both refuse to talk.
    let p = s.project("untrusted", "100/s");
    let base = s.url("");
    let out = run_publish(&["--url", &base, "--key", &p.secret, "c", "e", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    let out = Command::new(bin())
        .args(["subscribe", "--url", &base, "--key", &p.public, "c"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/ringcast.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => collect(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");

    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let text = scrape_text(&s);
    let families: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let mut named = 0;
    for expr in &exprs {
        let mut rest = expr.as_str();
        let mut found = false;
        while let Some(i) = rest.find("ringcast_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = name.strip_suffix(suffix)?;
                    (families.get(base) == Some(&"histogram")).then_some(base)
                })
                .unwrap_or(&name);
            assert!(
                families.contains_key(family),
                "dashboard query names {name}, which the server does not export: {expr}"
            );
            found = true;
            named += 1;
        }
        assert!(found, "a query without a ringcast metric: {expr}");
    }
    // Every metric the contract names is on the dashboard.
    for required in [
        "ringcast_connections",
        "ringcast_subscriptions",
        "ringcast_publish_requests_total",
        "ringcast_messages_published_total",
        "ringcast_deliveries_total",
        "ringcast_bytes_sent_total",
        "ringcast_slow_consumer_closes_total",
        "ringcast_mailbox_depth",
        "ringcast_publish_duration_seconds_bucket",
        "ringcast_cluster_connected",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(required)),
            "{required} is not on the dashboard"
        );
    }
    assert!(named > exprs.len());
}

#[test]
fn quota_units_batches_and_replays_are_counted() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "create",
            "units",
            "--rate-limit",
            "100000/s",
            "--history",
            "100/600s",
        ],
    );
    let secret = v["secret_key"].as_str().unwrap().to_string();
    let public = v["public_key"].as_str().unwrap().to_string();
    s.wait_key(&secret);
    let mut ws = s.ws(&public);
    subscribe(&mut ws, "a");
    subscribe(&mut ws, "b");
    let before = scrape(&s);

    // One message to two channels: 2 units, 2 deliveries to this one subscriber.
    let body = json!({"channels": ["a", "b"], "event": "e", "data": {"n": 0}});
    let (st, _, _) = s.raw_publish(&secret, "application/json", body.to_string().as_bytes());
    assert_eq!(st, 202);
    // A batch of three messages (a, b, a): 3 units, 3 deliveries.
    let batch = json!({"messages": [
        {"channel": "a", "event": "e", "data": {"n": 1}},
        {"channel": "b", "event": "e", "data": {"n": 2}},
        {"channel": "a", "event": "e", "data": {"n": 3}},
    ]});
    let req = format!(
        "POST /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {secret}\r\nContent-Type: application/json\r\n\r\n{batch}",
        batch.to_string().len()
    );
    assert_eq!(parse_response(&s.raw(req.as_bytes())).0, 202);
    for _ in 0..5 {
        assert_eq!(next_json(&mut ws)["type"], "message");
    }

    // A second client recovers channel "a" from offset 0: its 3 kept messages replayed.
    let mut late = s.ws(&public);
    send_json(
        &mut late,
        json!({"type": "subscribe", "channel": "a", "since": {"offset": 0, "epoch": "x"}}),
    );
    let reply = next_json(&mut late);
    assert_eq!(reply["type"], "subscribed");
    let epoch = reply["epoch"].as_str().unwrap().to_string();
    send_json(&mut late, json!({"type": "unsubscribe", "channel": "a"}));
    assert_eq!(next_json(&mut late)["type"], "unsubscribed");
    send_json(
        &mut late,
        json!({"type": "subscribe", "channel": "a", "since": {"offset": 0, "epoch": epoch}}),
    );
    let reply = next_json(&mut late);
    assert_eq!(reply["recovered"], true, "{reply}");
    for _ in 0..3 {
        assert_eq!(next_json(&mut late)["type"], "message");
    }

    let after = scrape(&s);
    let delta = |series: &str| metric(&after, series) - metric(&before, series);
    assert_eq!(requests(&after, 202) - requests(&before, 202), 2.0);
    assert_eq!(delta("ringcast_messages_published_total"), 5.0);
    assert_eq!(delta("ringcast_deliveries_total"), 5.0 + 3.0);
    assert_eq!(delta("ringcast_publish_duration_seconds_count"), 2.0);
}
