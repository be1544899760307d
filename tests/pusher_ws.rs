//! The Pusher protocol 7 WebSocket (`/app/{key}`), black box: the real binary, a real
//! WebSocket client sending the frames pusher-js sends, channel signatures made here
//! with an HMAC implementation independent of the server's.

mod common;
use common::unix_now;
/// Every project here has its token secret in use.
use common::Project as App;

use std::time::Duration;

use common::{
    cli, close_code, expect_silence, next_json, send_json, set_timeout, Options, Server, Ws,
};
use serde_json::{json, Value};

fn pusher_url(s: &Server, key: &str, query: &str) -> String {
    format!("ws://{}/app/{key}{query}", s.addr)
}

/// Connect as pusher-js does; returns the socket and its socket_id.
fn connect(s: &Server, key: &str) -> (Ws, String) {
    common::pusher_connect(&pusher_url(
        s,
        key,
        "?protocol=7&client=js&version=8.6.0&flash=false",
    ))
}

/// The data of a Pusher frame, decoded once more when it is a string (double encoding).
fn data_of(frame: &Value) -> Value {
    match &frame["data"] {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        other => other.clone(),
    }
}

fn subscribe(ws: &mut Ws, channel: &str, auth: Option<&str>, channel_data: Option<&str>) -> Value {
    let mut data = json!({"channel": channel});
    if let Some(a) = auth {
        data["auth"] = json!(a);
    }
    if let Some(c) = channel_data {
        data["channel_data"] = json!(c);
    }
    send_json(ws, json!({"event": "pusher:subscribe", "data": data}));
    next_json(ws)
}

/// A native client subscribed to `claims["channel"]` with a token of `claims`, signed
/// with `a`'s token secret.
fn native_member(s: &Server, a: &App, claims: Value) -> Ws {
    let mut ws = s.ws(&a.public);
    let channel = claims["channel"].clone();
    let token = common::hs256(&a.token_secret, claims);
    send_json(
        &mut ws,
        json!({"type": "subscribe", "channel": channel, "token": token}),
    );
    assert_eq!(next_json(&mut ws)["type"], "subscribed");
    ws
}

/// A Pusher connection that joined the presence channel `channel` as `channel_data`
/// (subscription_succeeded checked): the socket and its socket_id.
fn pusher_member(s: &Server, a: &App, channel: &str, channel_data: &str) -> (Ws, String) {
    let (mut ws, id) = connect(s, &a.public);
    let ok = presence_subscribe(a, (&mut ws, &id), channel, channel_data);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    (ws, id)
}

/// `pusher:subscribe` to the presence channel `channel` as the member `channel_data`,
/// signed for the connection (socket, its socket_id) as `a`'s backend would; the answer.
fn presence_subscribe(
    a: &App,
    (ws, socket_id): (&mut Ws, &str),
    channel: &str,
    channel_data: &str,
) -> Value {
    let auth = auth_for(a, socket_id, channel, Some(channel_data));
    subscribe(ws, channel, Some(&auth), Some(channel_data))
}

fn auth_for(a: &App, socket_id: &str, channel: &str, channel_data: Option<&str>) -> String {
    let text = match channel_data {
        Some(d) => format!("{socket_id}:{channel}:{d}"),
        None => format!("{socket_id}:{channel}"),
    };
    format!(
        "{}:{}",
        a.public,
        common::sign::hmac_hex(&a.token_secret, &text)
    )
}

/// Read frames until one with `event`; others are skipped.
fn next_event(ws: &mut Ws, event: &str) -> Value {
    loop {
        let f = next_json(ws);
        if f["event"] == event {
            return f;
        }
    }
}

#[test]
fn the_handshake_gives_a_socket_id_and_the_heartbeat_as_activity_timeout() {
    let s = Server::start_with(Options::config("heartbeat_s = 7\n"));
    let a = s.test_project("hs");
    assert!(a.app_id.parse::<u64>().unwrap() >= 1_000_000);
    let url = pusher_url(&s, &a.public, "?protocol=7&client=js&version=8.6.0");
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    let hello = next_json(&mut ws);
    let data: Value = serde_json::from_str(hello["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["activity_timeout"], 7);
    let id = data["socket_id"].as_str().unwrap();
    let (n, l) = id.split_once('.').unwrap();
    assert!(n.parse::<u32>().is_ok() && l.parse::<u64>().is_ok(), "{id}");
    // Ping: a JSON pong. Unknown events, bad JSON: pusher:error, still open. A sign-in
    // without user_data and auth: pusher:error 4009 (tests/users_identity.rs signs in).
    send_json(&mut ws, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_json(&mut ws)["event"], "pusher:pong");
    send_json(&mut ws, json!({"event": "pusher:signin", "data": {}}));
    let e = next_json(&mut ws);
    assert_eq!(
        (&e["event"], &e["data"]["code"]),
        (&json!("pusher:error"), &json!(4009))
    );
    for bad in [
        json!({"event": "hello", "data": {}}),
        json!({"no": "event"}),
    ] {
        send_json(&mut ws, bad);
        let e = next_json(&mut ws);
        assert_eq!(e["event"], "pusher:error", "{e}");
        assert!(e["data"]["message"].is_string(), "{e}");
        assert!(e["data"].get("code").is_none(), "{e}");
    }
    send_json(&mut ws, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_json(&mut ws)["event"], "pusher:pong");
    // A binary frame closes with 1003 (pusher-js: back off and reconnect).
    ws.send(tungstenite::Message::Binary(vec![1, 2, 3].into()))
        .unwrap();
    assert_eq!(close_code(&mut ws), Some(1003));
}

#[test]
fn refusals_are_made_in_band_with_pushers_codes() {
    let s = Server::start();
    let a = s.test_project("refused");
    let refused = |url: String, code: u16| {
        let (mut ws, resp) = tungstenite::connect(url).expect("the upgrade itself succeeds");
        assert_eq!(resp.status(), 101);
        let e = next_json(&mut ws);
        assert_eq!(e["event"], "pusher:error", "{e}");
        assert_eq!(e["data"]["code"], code, "{e}");
        assert_eq!(close_code(&mut ws), Some(code));
    };
    refused(
        pusher_url(&s, "pk_unknownunknownunknown", "?protocol=7"),
        4001,
    );
    refused(pusher_url(&s, &a.secret, "?protocol=7"), 4001);
    refused(pusher_url(&s, &a.public, "?protocol=4"), 4007);
    refused(pusher_url(&s, &a.public, "?protocol=seven"), 4007);
    // The switch: off closes open Pusher connections and refuses new ones with 4001;
    // native connections of the project stay.
    let (mut open, _) = connect(&s, &a.public);
    let mut native = s.ws(&a.public);
    cli(
        &s.data_dir,
        &["project", "set-limits", &a.id, "--pusher", "off"],
    );
    assert_eq!(close_code(&mut open), Some(4001));
    common::subscribe(&mut native, "still-here");
    common::wait_for(
        Duration::from_secs(10),
        "the switch to reach the server",
        || {
            let (mut ws, _) = tungstenite::connect(pusher_url(&s, &a.public, "")).unwrap();
            next_json(&mut ws)["event"] == "pusher:error"
        },
    );
    refused(pusher_url(&s, &a.public, "?protocol=7"), 4001);
    cli(
        &s.data_dir,
        &["project", "set-limits", &a.id, "--pusher", "on"],
    );
    common::wait_for(Duration::from_secs(10), "the switch back on", || {
        let (mut ws, _) = tungstenite::connect(pusher_url(&s, &a.public, "")).unwrap();
        next_json(&mut ws)["event"] == "pusher:connection_established"
    });
    // Not an upgrade at all: plain HTTP, as on /api/v1/ws.
    let resp = s.raw(
        format!(
            "GET /app/{} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            a.public
        )
        .as_bytes(),
    );
    assert_eq!(common::parse_response(&resp).0, 400);
}

#[test]
fn both_protocols_get_one_native_publish_in_their_own_form() {
    let s = Server::start();
    let a = s.test_project("both");
    let (mut p, _) = connect(&s, &a.public);
    let ok = subscribe(&mut p, "orders", None, None);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert_eq!(ok["channel"], "orders");
    let mut n = s.ws(&a.public);
    common::subscribe(&mut n, "orders");
    assert_eq!(
        s.publish(
            &a.secret,
            "orders",
            "order.created",
            json!({"id": 42, "q": "a\"b"})
        )
        .0,
        202
    );
    let f = next_json(&mut p);
    assert_eq!(
        (&f["event"], &f["channel"]),
        (&json!("order.created"), &json!("orders"))
    );
    assert!(f["data"].is_string(), "double encoded: {f}");
    assert_eq!(data_of(&f), json!({"id": 42, "q": "a\"b"}));
    let m = next_json(&mut n);
    assert_eq!(m["data"], json!({"id": 42, "q": "a\"b"}));
    // A string is passed as is.
    assert_eq!(
        s.publish(&a.secret, "orders", "note", json!("hello")).0,
        202
    );
    assert_eq!(next_json(&mut p)["data"], "hello");
    assert_eq!(next_json(&mut n)["data"], "hello");
    // Unsubscribe: no answer, no more messages.
    send_json(
        &mut p,
        json!({"event": "pusher:unsubscribe", "data": {"channel": "orders"}}),
    );
    send_json(&mut p, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_json(&mut p)["event"], "pusher:pong");
    assert_eq!(s.publish(&a.secret, "orders", "e", json!({})).0, 202);
    next_json(&mut n);
    expect_silence(&mut p, Duration::from_millis(300));
}

#[test]
fn a_native_publish_with_the_socket_id_skips_that_pusher_client() {
    let s = Server::start();
    let a = s.test_project("others");
    let (mut p1, id1) = connect(&s, &a.public);
    let (mut p2, _) = connect(&s, &a.public);
    subscribe(&mut p1, "chat", None, None);
    subscribe(&mut p2, "chat", None, None);
    let body = json!({"channel": "chat", "event": "said", "data": {"n": 1}, "socket_id": id1});
    let (st, _, _) = s.raw_publish(&a.secret, "application/json", body.to_string().as_bytes());
    assert_eq!(st, 202);
    assert_eq!(data_of(&next_json(&mut p2)), json!({"n": 1}));
    expect_silence(&mut p1, Duration::from_millis(300));
}

#[test]
fn private_channels_need_pushers_signature_over_the_socket_id() {
    let s = Server::start();
    let a = s.test_project("private");
    let other = s.test_project("other");
    let (mut ws, id) = connect(&s, &a.public);
    let err = |f: &Value, status: u64| {
        assert_eq!(f["event"], "pusher:subscription_error", "{f}");
        assert_eq!(data_of(f)["status"], status, "{f}");
        assert_eq!(data_of(f)["type"], "AuthError", "{f}");
    };
    let foreign_key = format!(
        "{}:{}",
        other.public,
        common::sign::hmac_hex(&a.token_secret, &format!("{id}:private-orders"))
    );
    let refused = [
        None,
        Some("nonsense".to_string()),
        // Signed for another socket, another channel, with another app's secret or key.
        Some(auth_for(&a, "1.2", "private-orders", None)),
        Some(auth_for(&a, &id, "private-other", None)),
        Some(auth_for(&other, &id, "private-orders", None)),
        Some(foreign_key),
    ];
    for auth in &refused {
        err(
            &subscribe(&mut ws, "private-orders", auth.as_deref(), None),
            401,
        );
    }
    // Right: uppercase hex is the same signature.
    let good = auth_for(&a, &id, "private-orders", None);
    let (key, sig) = good.rsplit_once(':').unwrap();
    let upper = format!("{key}:{}", sig.to_uppercase());
    let ok = subscribe(&mut ws, "private-orders", Some(&upper), None);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert_eq!(
        s.publish(&a.secret, "private-orders", "e", json!({"x": 1}))
            .0,
        202
    );
    assert_eq!(data_of(&next_json(&mut ws)), json!({"x": 1}));
    // A stray `channel_data` on a private channel is not part of its signature (Pusher
    // signs it for presence channels only).
    let stray = auth_for(&a, &id, "private-stray", None);
    let ok = subscribe(
        &mut ws,
        "private-stray",
        Some(&stray),
        Some(r#"{"user_id":"u"}"#),
    );
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    // Names: invalid and cache channels.
    let f = subscribe(&mut ws, &"x".repeat(101), None, None);
    assert_eq!(data_of(&f)["type"], "InvalidChannel", "{f}");
    let f = subscribe(&mut ws, "cache-x", None, None);
    assert_eq!(data_of(&f)["type"], "UnsupportedFeature", "{f}");
}

#[test]
fn presence_is_one_set_across_both_protocols() {
    let s = Server::start();
    let a = s.test_project("presence");
    let ch = "presence-room";
    // A native member first.
    let mut n = native_member(
        &s,
        &a,
        json!({"channel": ch, "exp": unix_now() + 600, "sub": "native", "info": {"name": "N"}}),
    );
    // A Pusher member with a numeric user id, channel_data as Python writes it.
    let (mut p, id) = connect(&s, &a.public);
    let cd = r#"{"user_id": 10, "user_info": {"name": "Ten"}}"#;
    let ok = presence_subscribe(&a, (&mut p, &id), ch, cd);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    let presence = &data_of(&ok)["presence"];
    assert_eq!(presence["count"], 2, "{ok}");
    assert_eq!(presence["ids"], json!(["native", "10"]), "{ok}");
    assert_eq!(presence["hash"]["native"], json!({"name": "N"}));
    assert_eq!(presence["hash"]["10"], json!({"name": "Ten"}));
    let join = next_json(&mut n);
    assert_eq!(
        (&join["action"], &join["user_id"]),
        (&json!("join"), &json!("10")),
        "{join}"
    );
    // A second Pusher tab of user 10 joins nobody; a new native member is announced.
    let (mut p2, id2) = connect(&s, &a.public);
    let ok2 = presence_subscribe(&a, (&mut p2, &id2), ch, cd);
    assert_eq!(data_of(&ok2)["presence"]["count"], 2);
    let n2 = native_member(
        &s,
        &a,
        json!({"channel": ch, "exp": unix_now() + 600, "sub": "late"}),
    );
    let added = next_event(&mut p, "pusher_internal:member_added");
    assert_eq!(data_of(&added), json!({"user_id": "late"}));
    // The native member leaves: member_removed to Pusher members.
    drop(n2);
    let removed = next_event(&mut p, "pusher_internal:member_removed");
    assert_eq!(data_of(&removed), json!({"user_id": "late"}));
    // Bad channel_data: AuthError 400 (signature right, content wrong).
    let (mut p3, id3) = connect(&s, &a.public);
    let cd3 = r#"{"user_info":{}}"#;
    let f = presence_subscribe(&a, (&mut p3, &id3), ch, cd3);
    assert_eq!(data_of(&f)["status"], 400, "{f}");
    // User 10's second tab was held open until here on purpose.
    drop(p2);
}

/// A connection is one member of a presence channel: a second `pusher:subscribe` to a
/// held presence channel with another `user_id` (and a valid signature) is refused, adds
/// no member, and the first user leaves once with the connection (issue 20, finding 5:
/// it used to add the second user and orphan the first until restart).
#[test]
fn a_second_presence_subscribe_with_another_user_id_is_refused() {
    let s = Server::start();
    let a = s.test_project("ghost");
    let ch = "presence-ghost";
    let ocd = r#"{"user_id":"observer"}"#;
    let (mut observer, _) = pusher_member(&s, &a, ch, ocd);

    let cd1 = r#"{"user_id":"u1"}"#;
    let (mut x, xid) = pusher_member(&s, &a, ch, cd1);
    let added = next_event(&mut observer, "pusher_internal:member_added");
    assert_eq!(data_of(&added)["user_id"], "u1");

    // The same connection, the same channel, another user, a valid signature: refused.
    let cd2 = r#"{"user_id":"u2"}"#;
    let f = presence_subscribe(&a, (&mut x, &xid), ch, cd2);
    assert_eq!(f["event"], "pusher:subscription_error", "{f}");
    assert_eq!(f["channel"], ch, "{f}");
    assert_eq!(data_of(&f)["type"], "AuthError", "{f}");
    assert_eq!(data_of(&f)["status"], 403, "{f}");
    // The same user again is still answered with the members (u1 and the observer).
    let again = presence_subscribe(&a, (&mut x, &xid), ch, cd1);
    assert_eq!(
        data_of(&again)["presence"]["ids"],
        json!(["observer", "u1"]),
        "{again}"
    );

    // The connection ends: u1 leaves, once, and nobody stays behind.
    drop(x);
    let removed = next_event(&mut observer, "pusher_internal:member_removed");
    assert_eq!(data_of(&removed)["user_id"], "u1", "{removed}");
    let (mut late, lid) = connect(&s, &a.public);
    let lcd = r#"{"user_id":"late"}"#;
    let ok = presence_subscribe(&a, (&mut late, &lid), ch, lcd);
    assert_eq!(
        data_of(&ok)["presence"]["ids"],
        json!(["observer", "late"]),
        "{ok}"
    );
    // The observer saw no u2 come or go: the next member event is the late joiner.
    let added = next_event(&mut observer, "pusher_internal:member_added");
    assert_eq!(data_of(&added)["user_id"], "late", "{added}");
}

#[test]
fn client_events_reach_the_others_of_both_protocols_and_are_rate_limited() {
    let s = Server::start();
    let a = s.test_project("events");
    cli(
        &s.data_dir,
        &["project", "set-limits", &a.id, "--client-events", "on"],
    );
    let ch = "private-chat";
    let (mut p1, id1) = connect(&s, &a.public);
    let (mut p2, id2) = connect(&s, &a.public);
    // Wait until the switch is live: an event from p1 is refused until then.
    subscribe(&mut p1, ch, Some(&auth_for(&a, &id1, ch, None)), None);
    subscribe(&mut p2, ch, Some(&auth_for(&a, &id2, ch, None)), None);
    let mut n = native_member(&s, &a, json!({"channel": ch, "exp": unix_now() + 600}));
    common::wait_for(Duration::from_secs(10), "client events switched on", || {
        send_json(
            &mut p1,
            json!({"event": "client-typing", "channel": ch, "data": {"on": true}}),
        );
        set_timeout(&mut p2, Duration::from_millis(300));
        let got = matches!(p2.read(), Ok(tungstenite::Message::Text(_)));
        if !got {
            // Refused while off: a pusher:error for p1.
            set_timeout(&mut p1, Duration::from_millis(300));
            let _ = p1.read();
        }
        got
    });
    set_timeout(&mut p1, Duration::from_secs(10));
    set_timeout(&mut p2, Duration::from_secs(10));
    // One more, checked on every side.
    send_json(
        &mut p1,
        json!({"event": "client-typing", "channel": ch, "data": {"on": false}}),
    );
    let f = next_event(&mut p2, "client-typing");
    assert_eq!(data_of(&f), json!({"on": false}));
    let m = loop {
        let m = next_json(&mut n);
        if m["data"] == json!({"on": false}) {
            break m;
        }
    };
    assert_eq!(m["event"], "client-typing");
    // Never back to the sender; over 10 per second: pusher:error 4301, still open.
    let mut limited = false;
    for i in 0..12 {
        send_json(
            &mut p1,
            json!({"event": "client-burst", "channel": ch, "data": {"i": i}}),
        );
    }
    set_timeout(&mut p1, Duration::from_millis(500));
    while let Ok(tungstenite::Message::Text(t)) = p1.read() {
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        assert_ne!(v["event"], "client-burst", "the sender got its own event");
        if v["event"] == "pusher:error" && v["data"]["code"] == 4301 {
            limited = true;
        }
    }
    assert!(limited, "no 4301 after 12 events in a burst");
    set_timeout(&mut p1, Duration::from_secs(10));
    send_json(&mut p1, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_event(&mut p1, "pusher:pong")["event"], "pusher:pong");
    // Public channels take none.
    subscribe(&mut p1, "public", None, None);
    send_json(
        &mut p1,
        json!({"event": "client-x", "channel": "public", "data": {}}),
    );
    assert_eq!(next_event(&mut p1, "pusher:error")["event"], "pusher:error");
}

#[test]
fn revocation_closes_with_4001_and_a_slow_consumer_with_4100() {
    let s = Server::start_with(Options::config("send_backlog_bytes = 65536\n"));
    let a = s.test_project("closes");
    let (mut slow, _) = connect(&s, &a.public);
    subscribe(&mut slow, "flood", None, None);
    let blob = "x".repeat(16000);
    let messages: Vec<Value> = (0..60)
        .map(|i| json!({"channel": "flood", "event": "e", "data": {"i": i, "pad": blob}}))
        .collect();
    let body = json!({ "messages": messages }).to_string();
    let req = common::post_request("/api/v1/publish/batch", &a.secret, &body);
    // Enough to pass the socket buffers and the 64 KiB backlog many times over.
    for _ in 0..80 {
        assert_eq!(common::parse_response(&s.raw(req.as_bytes())).0, 202);
    }
    assert_eq!(close_code(&mut slow), Some(4100));

    let (mut ws, _) = connect(&s, &a.public);
    cli(&s.data_dir, &["key", "revoke", &a.public]);
    assert_eq!(close_code(&mut ws), Some(4001));
}

#[test]
fn a_server_shutting_down_closes_pusher_clients_with_4200() {
    let mut s = Server::start();
    let a = s.test_project("bye");
    let (mut ws, _) = connect(&s, &a.public);
    subscribe(&mut ws, "news", None, None);
    let mut n = s.ws(&a.public);
    s.terminate(Duration::from_secs(20));
    assert_eq!(close_code(&mut ws), Some(4200));
    assert_eq!(close_code(&mut n), Some(1001));
}
