//! Multi-channel and batch publish against the real server (contract 1.1, "Publishing
//! more than one message"): delivery per channel with one id, all-or-nothing validation
//! with `index`, the quota of a whole request taken at once, ids in request order,
//! per-channel order, the limits (count, body, per-message size), reserved event names.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// POST `body` to `path` with `key`; status, head, JSON body.
fn post(s: &Server, path: &str, key: &str, body: &str) -> (u16, String, Value) {
    parse_response(&s.raw(post_request(path, key, body).as_bytes()))
}

fn batch(s: &Server, key: &str, messages: Value) -> (u16, String, Value) {
    post(
        s,
        "/api/v1/publish/batch",
        key,
        &json!({ "messages": messages }).to_string(),
    )
}

fn msg(channel: &str, event: &str, data: Value) -> Value {
    json!({"channel": channel, "event": event, "data": data})
}

/// A later marker publish arrives first: proves nothing earlier was queued.
fn expect_next_is_marker(s: &Server, p: &Project, ws: &mut Ws, channel: &str) {
    let (st, _) = s.publish(&p.secret, channel, "marker", json!("m"));
    assert_eq!(st, 202);
    let f = next_json(ws);
    assert_eq!(
        f["event"], "marker",
        "something was delivered before the marker: {f}"
    );
}

#[test]
fn one_message_to_several_channels_has_one_id_and_one_frame_per_channel() {
    let s = Server::start();
    let p = s.project("multi", "100/s");
    let mut both = s.ws_on(&p.public, "a");
    subscribe(&mut both, "b");
    let mut only_c = s.ws_on(&p.public, "c");

    let body = json!({"channels": ["a", "b", "c"], "event": "e", "data": {"k": 1}});
    let (st, head, v) = post(&s, "/api/v1/publish", &p.secret, &body.to_string());
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap();
    assert!(v.get("offset").is_none(), "no offset for channels: {v}");
    // One unit per channel.
    assert_eq!(header(&head, "RateLimit-Remaining").as_deref(), Some("97"));

    let mut got: Vec<(String, String)> = (0..2)
        .map(|_| {
            let f = next_json(&mut both);
            assert_eq!(f["data"], json!({"k": 1}));
            (
                f["channel"].as_str().unwrap().into(),
                f["id"].as_str().unwrap().into(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("a".into(), id.to_string()), ("b".into(), id.to_string())]
    );
    let f = next_json(&mut only_c);
    assert_eq!(
        (f["channel"].as_str(), f["id"].as_str()),
        (Some("c"), Some(id))
    );
    expect_next_is_marker(&s, &p, &mut both, "a");
}

#[test]
fn channels_rules_answer_400() {
    let s = Server::start();
    let p = s.project("rules", "1000/s");
    let hundred_and_one: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
    for (body, code) in [
        (
            json!({"channels": ["a", "a"], "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channel": "a", "channels": ["b"], "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channels": [], "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channels": hundred_and_one, "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channels": ["ok", 5], "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channels": ["ok", ""], "event": "e", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channels": ["x".repeat(101)], "event": "e", "data": {}}),
            "field_too_long",
        ),
        (json!({"event": "e", "data": {}}), "missing_field"),
        (
            json!({"channel": "a", "event": "pusher:subscribe", "data": {}}),
            "invalid_field",
        ),
        (
            json!({"channel": "a", "event": "pusher_internal:x", "data": {}}),
            "invalid_field",
        ),
    ] {
        let (st, _, v) = post(&s, "/api/v1/publish", &p.secret, &body.to_string());
        assert_eq!(st, 400, "{body} -> {v}");
        assert_eq!(v["error"]["code"], code, "{body} -> {v}");
        assert!(v["error"].get("index").is_none(), "{v}");
    }
    let hundred: Vec<String> = (0..100).map(|i| format!("c{i}")).collect();
    let body = json!({"channels": hundred, "event": "e", "data": "x"});
    let (st, _, v) = post(&s, "/api/v1/publish", &p.secret, &body.to_string());
    assert_eq!(st, 202, "{v}");
}

#[test]
fn several_channels_cost_one_unit_each_and_are_refused_whole() {
    let s = Server::start();
    let p = s.project("quota", "5/min");
    let mut ws = s.ws_on(&p.public, "a");
    let three = json!({"channels": ["a", "b", "c"], "event": "e", "data": "1"}).to_string();
    let (st, head, _) = post(&s, "/api/v1/publish", &p.secret, &three);
    assert_eq!(st, 202);
    assert_eq!(header(&head, "RateLimit-Remaining").as_deref(), Some("2"));
    next_json(&mut ws);
    let (st, head, v) = post(&s, "/api/v1/publish", &p.secret, &three);
    assert_eq!(st, 429, "{v}");
    assert!(header(&head, "Retry-After").is_some());
    // Nothing of the refused one was taken or delivered: two single units still fit.
    expect_silence(&mut ws, Duration::from_millis(200));
    assert_eq!(s.publish(&p.secret, "a", "e", json!("2")).0, 202);
    assert_eq!(s.publish(&p.secret, "a", "e", json!("3")).0, 202);
    assert_eq!(s.publish(&p.secret, "a", "e", json!("4")).0, 429);
    assert_eq!(next_json(&mut ws)["data"], "2");
}

#[test]
fn a_batch_answers_ids_in_request_order_and_keeps_per_channel_order() {
    let s = Server::start();
    let p = s.project("batch", "100000/s");
    let mut ws = s.ws_on(&p.public, "x");
    subscribe(&mut ws, "y");
    let mut sent_ids: Vec<String> = Vec::new();
    let mut expect: Vec<(String, u64, String)> = Vec::new();
    for round in 0..20u64 {
        let messages: Vec<Value> = (0..100u64)
            .map(|i| {
                let ch = if i % 3 == 0 { "y" } else { "x" };
                msg(ch, "n", json!({"seq": round * 100 + i}))
            })
            .collect();
        let (st, _, v) = batch(&s, &p.secret, Value::Array(messages.clone()));
        assert_eq!(st, 202, "{v}");
        let ids = v["ids"].as_array().expect("ids");
        assert_eq!(ids.len(), 100);
        for (m, id) in messages.iter().zip(ids) {
            let id = id.as_str().unwrap().to_string();
            expect.push((
                m["channel"].as_str().unwrap().into(),
                m["data"]["seq"].as_u64().unwrap(),
                id.clone(),
            ));
            sent_ids.push(id);
        }
    }
    let mut unique = sent_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), sent_ids.len(), "ids are unique");
    // One connection, two channels: frames of each channel arrive in request order.
    let mut per_channel: std::collections::HashMap<String, Vec<(u64, String)>> = Default::default();
    for _ in 0..expect.len() {
        let f = next_json(&mut ws);
        per_channel
            .entry(f["channel"].as_str().unwrap().into())
            .or_default()
            .push((
                f["data"]["seq"].as_u64().unwrap(),
                f["id"].as_str().unwrap().into(),
            ));
    }
    for ch in ["x", "y"] {
        let want: Vec<(u64, String)> = expect
            .iter()
            .filter(|(c, _, _)| c == ch)
            .map(|(_, seq, id)| (*seq, id.clone()))
            .collect();
        assert_eq!(per_channel[ch], want, "channel {ch}");
    }
}

#[test]
fn a_batch_with_one_bad_message_publishes_nothing_and_names_it() {
    let s = Server::start();
    let p = s.project("aon", "1000/s");
    let mut ws = s.ws_on(&p.public, "a");
    let good = msg("a", "e", json!("ok"));
    for (bad, code) in [
        (json!({"channel": "a", "event": "e"}), "missing_field"),
        (
            json!({"channel": "a", "event": "e", "data": 5}),
            "invalid_field",
        ),
        (
            json!({"channels": ["a", "a"], "event": "e", "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"channel": "a", "event": "pusher:x", "data": "x"}),
            "invalid_field",
        ),
        (json!("not an object"), "invalid_json"),
    ] {
        let (st, head, v) = batch(&s, &p.secret, json!([good, good, bad, good]));
        assert_eq!(st, 400, "{bad}: {v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert_eq!(v["error"]["index"], 2, "{v}");
        assert!(v["error"]["message"].is_string());
        // A refusal spends nothing.
        assert_eq!(
            header(&head, "RateLimit-Remaining").as_deref(),
            Some("1000")
        );
    }
    // The first of two bad messages is named.
    let (st, _, v) = batch(&s, &p.secret, json!([good, {"x": 1}, {"y": 2}]));
    assert_eq!((st, &v["error"]["index"]), (400, &json!(1)));
    expect_next_is_marker(&s, &p, &mut ws, "a");
}

#[test]
fn batch_counts_and_sizes_are_limited() {
    let s = Server::start_with(Options {
        config: "max_batch_messages = 3\nmax_batch_body_bytes = 2000\nmax_body_bytes = 300\n"
            .into(),
        ..Options::default()
    });
    let p = s.project("limits", "1000/s");
    let m = msg("a", "e", json!("x"));
    // 0 or more than max_batch_messages: 400 without index.
    for messages in [json!([]), json!([m, m, m, m])] {
        let (st, _, v) = batch(&s, &p.secret, messages);
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["code"], "invalid_field");
        assert!(v["error"].get("index").is_none(), "{v}");
    }
    let (st, _, v) = batch(&s, &p.secret, json!([m, m, m]));
    assert_eq!(st, 202, "{v}");
    // Not an object with `messages`.
    let (st, _, v) = post(&s, "/api/v1/publish/batch", &p.secret, r#"{"msgs":[]}"#);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("missing_field"))
    );
    let (st, _, v) = post(&s, "/api/v1/publish/batch", &p.secret, "[1]");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );
    let (st, _, v) = post(&s, "/api/v1/publish/batch", &p.secret, "{");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );
    // One message over the single-publish limit (300 bytes): 413, naming it.
    let big = msg("a", "e", json!("y".repeat(400)));
    let (st, _, v) = batch(&s, &p.secret, json!([m, big]));
    assert_eq!(st, 413, "{v}");
    assert_eq!(v["error"]["code"], "payload_too_large");
    assert_eq!(v["error"]["index"], 1);
    // The whole body over max_batch_body_bytes: 413 from the head.
    let pad = "z".repeat(2100);
    let (st, _, v) = post(
        &s,
        "/api/v1/publish/batch",
        &p.secret,
        &format!(r#"{{"messages":[],"pad":"{pad}"}}"#),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (413, Some("payload_too_large"))
    );
    // The single endpoint keeps its own limit.
    let (st, _, _) = post(
        &s,
        "/api/v1/publish",
        &p.secret,
        &json!({"channel": "a", "event": "e", "data": "q".repeat(400)}).to_string(),
    );
    assert_eq!(st, 413);
}

#[test]
fn batch_default_limits_take_100_messages_and_a_mebibyte() {
    let s = Server::start();
    let p = s.project("defaults", "100000/s");
    let m = msg("a", "e", json!("x".repeat(9000)));
    let hundred = Value::Array(vec![m.clone(); 100]);
    assert!(json!({"messages": hundred}).to_string().len() < 1 << 20);
    let (st, _, v) = batch(&s, &p.secret, hundred);
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["ids"].as_array().unwrap().len(), 100);
    let (st, _, _) = batch(
        &s,
        &p.secret,
        Value::Array(vec![msg("a", "e", json!("1")); 101]),
    );
    assert_eq!(st, 400);
    let huge = Value::Array(vec![msg("a", "e", json!("x".repeat(60_000))); 18]);
    let (st, _, _) = batch(&s, &p.secret, huge);
    assert_eq!(st, 413, "over 1 MiB");
}

#[test]
fn the_quota_of_a_whole_batch_is_taken_at_once_or_not_at_all() {
    let s = Server::start();
    let p = s.project("bq", "10/min");
    let mut ws = s.ws_on(&p.public, "a");
    // 4 messages, one of them to 3 channels: 6 units.
    let six = json!([
        msg("a", "e", json!("1")),
        msg("a", "e", json!("2")),
        {"channels": ["a", "b", "c"], "event": "e", "data": "3"},
        msg("a", "e", json!("4")),
    ]);
    let (st, head, v) = batch(&s, &p.secret, six.clone());
    assert_eq!(st, 202, "{v}");
    assert_eq!(header(&head, "RateLimit-Remaining").as_deref(), Some("4"));
    for want in ["1", "2", "3", "4"] {
        assert_eq!(next_json(&mut ws)["data"], want);
    }
    let (st, head, v) = batch(&s, &p.secret, six);
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");
    assert!(header(&head, "Retry-After").is_some());
    // Nothing was spent: exactly 4 single publishes still fit.
    expect_silence(&mut ws, Duration::from_millis(200));
    for i in 0..4 {
        assert_eq!(s.publish(&p.secret, "a", "e", json!(i.to_string())).0, 202);
    }
    assert_eq!(s.publish(&p.secret, "a", "e", json!("9")).0, 429);
}

#[test]
fn batch_endpoint_checks_key_type_and_method() {
    let s = Server::start();
    let p = s.project("hdr", "100/s");
    let body = json!({"messages": [msg("a", "e", json!("1"))]}).to_string();
    let (st, _, _) = post(&s, "/api/v1/publish/batch", &p.public, &body);
    assert_eq!(st, 401);
    let req = format!(
        "POST /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
        body.len(),
        p.secret
    );
    assert_eq!(parse_response(&s.raw(req.as_bytes())).0, 415);
    let req = "GET /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let (st, head, _) = parse_response(&s.raw(req.as_bytes()));
    assert_eq!(st, 405);
    assert_eq!(header(&head, "Allow").as_deref(), Some("POST"));
}

/// Issue 13 review, point 6: a batch that costs more than the project's whole burst can
/// never be afforded: 429 saying so, without a `Retry-After` that would promise it, and
/// nothing spent.
#[test]
fn a_batch_above_the_whole_burst_is_refused_without_retry_after() {
    let s = Server::start();
    let p = s.project("tiny", "5/min");
    let six: Vec<Value> = (0..6).map(|i| msg("c", "e", json!({"i": i}))).collect();
    let (st, head, v) = batch(&s, &p.secret, json!(six));
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (429, Some("rate_limited")),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("split it"),
        "{v}"
    );
    assert_eq!(header(&head, "Retry-After"), None, "{head}");
    assert_eq!(header(&head, "RateLimit-Remaining").as_deref(), Some("5"));
    // Within the burst: accepted.
    let five: Vec<Value> = (0..5).map(|i| msg("c", "e", json!({"i": i}))).collect();
    let (st, _, v) = batch(&s, &p.secret, json!(five));
    assert_eq!(st, 202, "{v}");
}

/// Issue 13 review, point 7: `mailbox_capacity` counts frames, a batch one per frame:
/// with room for 4, one batch of 3 fits, a second does not (503), a single still does.
#[test]
fn the_mailbox_counts_a_batch_by_its_frames() {
    let s = Server::start_with(Options::config("mailbox_capacity = 4\n").workers(1));
    let p = s.project("frames", "100000/s");
    let _ws = s.ws_on(&p.public, "c");
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            p.secret,
            body.len()
        )
    };
    let three: Vec<Value> = (0..3).map(|i| msg("c", "e", json!({"i": i}))).collect();
    let three = post(
        "/api/v1/publish/batch",
        &json!({ "messages": three }).to_string(),
    );
    let one = post(
        "/api/v1/publish",
        r#"{"channel":"c","event":"e","data":{}}"#,
    );
    // Pipelined in one write: the worker answers them all before draining its mailbox.
    let mut req = three.repeat(2);
    req.push_str(&one);
    req.push_str(&one);
    req.push_str("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let resp = String::from_utf8(s.raw(req.as_bytes())).unwrap();
    let statuses: Vec<&str> = resp.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect();
    assert_eq!(&statuses[..4], ["202", "503", "202", "503"], "{resp}");
}
