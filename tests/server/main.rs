//! Black-box tests of the contract: the real binary on an ephemeral loopback port, a
//! real HTTP client (ureq, or raw bytes where the test is about the bytes) and a real
//! WebSocket client (tungstenite).

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

#[test]
fn health_is_ok_and_ignores_keys() {
    let s = Server::start();
    let (status, body) = s.health();
    assert_eq!(status, 200);
    assert_eq!(body, json!({"status": "ok", "version": "0.1"}));
    let mut resp = agent()
        .get(s.url("/health"))
        .header("X-Api-Key", "sk_whatever")
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(ct, "application/json");
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(v["status"], "ok");
}

#[test]
fn publish_accepts_with_id_and_rate_headers() {
    let s = Server::start();
    let p = s.project("acme", "1000/s");
    let mut resp = s.agent_publish(
        &agent(),
        &p.secret,
        r#"{"channel":"news","event":"e","data":{"x":1},"extra":"ignored"}"#,
    );
    assert_eq!(resp.status().as_u16(), 202);
    for h in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
        assert!(resp.headers().get(h).is_some(), "missing {h}");
    }
    assert_eq!(resp.headers().get("ratelimit-limit").unwrap(), "1000");
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["id"].as_str().is_some_and(|id| !id.is_empty()));
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_code: &str, case: &str) {
    assert_eq!(status, want_status, "{case}: {body}");
    assert_eq!(body["error"]["code"], want_code, "{case}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{case}: {body}"
    );
}

#[test]
fn every_publish_400_case() {
    let s = Server::start();
    let p = s.project("v", "100000/s");
    let long = "x".repeat(101);
    let ok100 = "é".repeat(100);
    let cases: Vec<(&str, String, &str)> = vec![
        ("not json", "{nope".into(), "invalid_json"),
        ("empty body", "".into(), "invalid_json"),
        ("array", "[1,2]".into(), "invalid_json"),
        (
            "missing channel",
            r#"{"event":"e","data":{}}"#.into(),
            "missing_field",
        ),
        (
            "missing event",
            r#"{"channel":"c","data":{}}"#.into(),
            "missing_field",
        ),
        (
            "missing data",
            r#"{"channel":"c","event":"e"}"#.into(),
            "missing_field",
        ),
        (
            "channel number",
            r#"{"channel":5,"event":"e","data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "event null",
            r#"{"channel":"c","event":null,"data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "data number",
            r#"{"channel":"c","event":"e","data":5}"#.into(),
            "invalid_field",
        ),
        (
            "data array",
            r#"{"channel":"c","event":"e","data":[1]}"#.into(),
            "invalid_field",
        ),
        (
            "data null",
            r#"{"channel":"c","event":"e","data":null}"#.into(),
            "invalid_field",
        ),
        (
            "empty channel",
            r#"{"channel":"","event":"e","data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "empty event",
            r#"{"channel":"c","event":"","data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "control char",
            r#"{"channel":"a\nb","event":"e","data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "control char event",
            r#"{"channel":"c","event":"\u007f","data":{}}"#.into(),
            "invalid_field",
        ),
        (
            "long channel",
            format!(r#"{{"channel":"{long}","event":"e","data":{{}}}}"#),
            "field_too_long",
        ),
        (
            "long event",
            format!(r#"{{"channel":"c","event":"{long}","data":{{}}}}"#),
            "field_too_long",
        ),
    ];
    for (case, body, code) in cases {
        let (status, _, v) = s.raw_publish(&p.secret, "application/json", body.as_bytes());
        assert_error(status, &v, 400, code, case);
    }
    // 100 two-byte characters are 100 characters: accepted.
    let (status, _) = s.publish(&p.secret, &ok100, "e", json!("x"));
    assert_eq!(status, 202);
}

#[test]
fn publish_401_413_415_and_routing_errors() {
    let s = Server::start_with(Options::config("max_body_bytes = 1024\n"));
    let p = s.project("a", "100000/s");
    let body = br#"{"channel":"c","event":"e","data":{}}"#;
    for (case, key) in [
        ("missing", ""),
        ("unknown", "sk_doesnotexist0000000000000000000"),
        ("public key", p.public.as_str()),
        ("not sk_", "abc"),
    ] {
        let (status, _, v) = s.raw_publish(key, "application/json", body);
        assert_error(status, &v, 401, "unauthorized", case);
    }
    for ct in ["", "text/plain", "application/x-www-form-urlencoded"] {
        let (status, _, v) = s.raw_publish(&p.secret, ct, body);
        assert_error(status, &v, 415, "unsupported_media_type", ct);
    }
    let (status, _, _) = s.raw_publish(&p.secret, "application/json; charset=utf-8", body);
    assert_eq!(status, 202);
    let big = format!(
        r#"{{"channel":"c","event":"e","data":"{}"}}"#,
        "x".repeat(2000)
    );
    let (status, _, v) = s.raw_publish(&p.secret, "application/json", big.as_bytes());
    assert_error(
        status,
        &v,
        413,
        "payload_too_large",
        "body over max_body_bytes",
    );

    let resp = s.raw(b"GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let (status, _, v) = parse_response(&resp);
    assert_error(status, &v, 404, "not_found", "unknown path");
    let resp = s.raw(b"GET /api/v1/publish HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let (status, _, _) = parse_response(&resp);
    assert_eq!(status, 405);
    let resp = s.raw(
        b"POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    let (status, _, v) = parse_response(&resp);
    assert_error(status, &v, 411, "length_required", "chunked");
    let huge = format!(
        "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let (status, _, v) = parse_response(&s.raw(huge.as_bytes()));
    assert_error(status, &v, 431, "headers_too_large", "huge header");
    let (status, _, v) = parse_response(&s.raw(b"BLAH\r\n\r\n"));
    assert_error(status, &v, 400, "bad_request", "garbage");
    assert_eq!(s.health().0, 200);
}

#[test]
fn revoked_secret_key_gets_401_within_a_second() {
    let s = Server::start();
    let p = s.project("r", "100000/s");
    assert_eq!(s.publish(&p.secret, "c", "e", json!({})).0, 202);
    let revoked = cli(&s.data_dir, &["key", "revoke", &p.secret]);
    assert!(revoked["revoked"].as_str().is_some());
    let start = Instant::now();
    loop {
        let (status, body) = s.publish(&p.secret, "c", "e", json!({}));
        if status == 401 {
            assert_eq!(body["error"]["code"], "unauthorized");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "still {status} after 1 s"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn rate_quota_gives_429_with_retry_after() {
    let s = Server::start();
    let p = s.project("q", "3/min");
    // `project` already spent nothing: its probe body is invalid (400), not a publish.
    for _ in 0..3 {
        assert_eq!(s.publish(&p.secret, "c", "e", json!({})).0, 202);
    }
    let body = br#"{"channel":"c","event":"e","data":{}}"#;
    let (status, head, v) = s.raw_publish(&p.secret, "application/json", body);
    assert_error(status, &v, 429, "rate_limited", "over quota");
    let retry: u64 = header(&head, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(header(&head, "ratelimit-remaining").as_deref(), Some("0"));
}

#[test]
fn full_mailbox_gives_503_and_degraded_health() {
    let s = Server::start_with(
        Options::config("mailbox_capacity = 2\nmailbox_high_water_pct = 50\n").workers(1),
    );
    let p = s.project("m", "100000/s");
    // A subscriber on the channel: workers without one are never sent the message.
    let _ws = s.ws_on(&p.public, "c");
    // Pipelined in one write: the worker answers them all before draining its mailbox.
    let resp = publishes_then_health(&s, &p.secret, r#"{"channel":"c","event":"e","data":{}}"#, 3);
    let statuses: Vec<&str> = resp.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect();
    assert_eq!(statuses, ["202", "202", "503", "503"], "{resp}");
    assert!(resp.contains("\"code\":\"unavailable\""));
    assert!(resp.contains("Retry-After: 1"));
    let health = resp.rsplit("\r\n\r\n").next().unwrap();
    let v: Value = serde_json::from_str(health).unwrap();
    assert_eq!(v["status"], "degraded");
    assert_eq!(v["checks"]["database"], "ok");
    assert_ne!(v["checks"]["queues"], "ok");
    // Once drained, healthy again.
    wait_for(Duration::from_secs(5), "the mailboxes to drain", || {
        s.health().0 == 200
    });
}

/// `n` publishes of `body` then `GET /health`, pipelined in one write on one connection;
/// every answer, as text.
fn publishes_then_health(s: &Server, key: &str, body: &str, n: usize) -> String {
    let one = format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut req = one.repeat(n);
    req.push_str("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    String::from_utf8(s.raw(req.as_bytes())).unwrap()
}

#[test]
fn pipelined_keep_alive_requests_are_all_answered() {
    let s = Server::start();
    let p = s.project("pl", "100000/s");
    let resp = publishes_then_health(
        &s,
        &p.secret,
        r#"{"channel":"c","event":"e","data":"x"}"#,
        10,
    );
    assert_eq!(resp.matches("HTTP/1.1 202 Accepted").count(), 10, "{resp}");
    assert_eq!(resp.matches("HTTP/1.1 200 OK").count(), 1);
}

#[test]
fn slow_request_head_times_out_with_408() {
    let s = Server::start_with(Options::config("header_read_timeout_ms = 300\n"));
    let start = Instant::now();
    let resp = s.raw(b"POST /api/v1/publish HTTP/1.1\r\nHost: t\r\n");
    let (status, _, v) = parse_response(&resp);
    assert_error(status, &v, 408, "request_timeout", "slowloris");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(s.health().0, 200);
}

#[test]
fn websocket_refuses_bad_keys_with_401() {
    let s = Server::start();
    let p = s.project("w", "100/s");
    let revoked = s.project("w2", "100/s");
    cli(&s.data_dir, &["key", "revoke", &revoked.public]);
    s.wait_key_refused(&revoked.public);
    for (case, key) in [
        ("secret key", p.secret.as_str()),
        ("unknown", "pk_unknown000000000000000000000000"),
        ("missing", ""),
        ("revoked", revoked.public.as_str()),
    ] {
        match tungstenite::connect(s.ws_url(key)) {
            Err(tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status().as_u16(), 401, "{case}");
                let body: Value =
                    serde_json::from_slice(resp.body().as_deref().unwrap_or(b"")).unwrap();
                assert_eq!(body["error"]["code"], "unauthorized", "{case}");
            }
            other => panic!("{case}: expected 401, got {:?}", other.map(|_| ())),
        }
    }
    let _ws = s.ws_on(&p.public, "ok");
}

#[test]
fn delivery_is_exact_channel_match_with_verbatim_data() {
    let s = Server::start();
    let p = s.project("d", "100000/s");
    let mut ws = s.ws_on(&p.public, "news");
    for other in ["News", "news ", "news/1", "new", "nEws"] {
        assert_eq!(s.publish(&p.secret, other, "e", json!({})).0, 202);
    }
    let data = r#"{"b":1.50,"a":[1,"é"],"z":{"k":null}}"#;
    let body = format!(r#"{{"channel":"news","event":"order.created","data":{data}}}"#);
    let (status, _, v) = s.raw_publish(&p.secret, "application/json", body.as_bytes());
    assert_eq!(status, 202);
    let id = v["id"].as_str().unwrap().to_string();
    let frame = match ws.read().unwrap() {
        tungstenite::Message::Text(t) => t.as_str().to_string(),
        other => panic!("{other:?}"),
    };
    // Data arrives byte for byte as published.
    assert!(frame.contains(&format!(r#""data":{data}"#)), "{frame}");
    let m: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(m["type"], "message");
    assert_eq!(m["channel"], "news");
    assert_eq!(m["event"], "order.created");
    assert_eq!(m["id"], id.as_str());
    // String data too.
    assert_eq!(s.publish(&p.secret, "news", "e", json!("hello")).0, 202);
    assert_eq!(next_json(&mut ws)["data"], "hello");
    expect_silence(&mut ws, Duration::from_millis(300));
}

#[test]
fn projects_are_isolated() {
    let s = Server::start();
    let a = s.project("a", "100000/s");
    let b = s.project("b", "100000/s");
    let mut wa = s.ws(&a.public);
    let mut wb = s.ws(&b.public);
    subscribe(&mut wa, "shared");
    subscribe(&mut wb, "shared");
    assert_eq!(
        s.publish(&a.secret, "shared", "e", json!({"from": "a"})).0,
        202
    );
    assert_eq!(next_json(&mut wa)["data"]["from"], "a");
    expect_silence(&mut wb, Duration::from_millis(300));
    assert_eq!(
        s.publish(&b.secret, "shared", "e", json!({"from": "b"})).0,
        202
    );
    assert_eq!(next_json(&mut wb)["data"]["from"], "b");
    expect_silence(&mut wa, Duration::from_millis(300));
}

mod protocol_and_limits;
