//! The Pusher REST API (`/apps/{app_id}/...`), black box: the real binary, requests
//! signed here by a small signer of our own (RustCrypto's HMAC-SHA256 and MD5, nothing
//! from src/), real WebSocket clients of both protocols receiving what is published.
//!
//! Design: docs/design/pusher.md, section 4 (checks in the order of 4.1, bodies of 4.2,
//! `info` of 4.3, quota of 4.4).

mod common;
use common::cluster as support;
use common::unix_now;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{
    cli, expect_silence, header, next_json, parse_response, send_json, set_timeout, wait_for,
    Options, Server, Ws,
};
use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use serde_json::{json, Value};
use sha2::Sha256;

/// A project seen as a Pusher app.
struct App {
    project_id: String,
    app_id: String,
    /// Its public key: the Pusher key.
    key: String,
    /// Its token secret: the Pusher secret.
    secret: String,
    /// Its secret key, for the native API.
    sk: String,
}

/// The app `project create` printed.
fn app_of(v: &Value) -> App {
    App {
        project_id: v["project"]["id"].as_str().unwrap().into(),
        app_id: v["project"]["pusher_app_id"].as_str().unwrap().into(),
        key: v["public_key"].as_str().unwrap().into(),
        secret: v["token_secret"].as_str().unwrap().into(),
        sk: v["secret_key"].as_str().unwrap().into(),
    }
}

fn app(s: &Server, name: &str, rate: &str) -> App {
    let app = app_of(&cli(
        &s.data_dir,
        &["project", "create", name, "--rate-limit", rate],
    ));
    // The server sees a new project within its refresh interval.
    wait_for(Duration::from_secs(5), "the server to know the app", || {
        get(s, &app, "/channels", &[]).0 != 401
    });
    app
}

fn md5_hex(body: &[u8]) -> String {
    hex(&Md5::digest(body))
}

fn hmac_hex(secret: &str, msg: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(msg.as_bytes());
    hex(&mac.finalize().into_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request to sign: everything Pusher's signature covers, and what to change in it.
#[derive(Clone)]
struct Req {
    method: &'static str,
    path: String,
    /// Parameters besides the auth ones, unescaped (the tests use no character that
    /// needs escaping on the wire).
    params: Vec<(String, String)>,
    body: Vec<u8>,
    key: String,
    secret: String,
    timestamp: u64,
    version: String,
    /// `Some(v)`: send `body_md5=v`; `None`: the MD5 of the body when there is one.
    body_md5: Option<String>,
    /// Leave these parameters out after signing.
    drop: Vec<&'static str>,
    content_type: Option<&'static str>,
}

impl Req {
    fn new(app: &App, method: &'static str, path: &str) -> Req {
        Req {
            method,
            path: format!("/apps/{}{path}", app.app_id),
            params: Vec::new(),
            body: Vec::new(),
            key: app.key.clone(),
            secret: app.secret.clone(),
            timestamp: unix_now(),
            version: "1.0".into(),
            body_md5: None,
            drop: Vec::new(),
            content_type: None,
        }
    }

    fn post(app: &App, path: &str, body: &Value) -> Req {
        let mut r = Req::new(app, "POST", path);
        r.body = body.to_string().into_bytes();
        r.content_type = Some("application/json");
        r
    }

    fn param(mut self, k: &str, v: &str) -> Req {
        self.params.push((k.into(), v.into()));
        self
    }

    /// The query string: sorted, signed, `auth_signature` last.
    fn query(&self) -> String {
        let mut pairs: Vec<(String, String)> = vec![
            ("auth_key".into(), self.key.clone()),
            ("auth_timestamp".into(), self.timestamp.to_string()),
            ("auth_version".into(), self.version.clone()),
        ];
        match &self.body_md5 {
            Some(v) => pairs.push(("body_md5".into(), v.clone())),
            None if !self.body.is_empty() => pairs.push(("body_md5".into(), md5_hex(&self.body))),
            None => {}
        }
        pairs.extend(self.params.iter().cloned());
        pairs.sort();
        let joined = |pairs: &[(String, String)]| {
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&")
        };
        let to_sign = format!("{}\n{}\n{}", self.method, self.path, joined(&pairs));
        pairs.push(("auth_signature".into(), hmac_hex(&self.secret, &to_sign)));
        pairs.retain(|(k, _)| !self.drop.contains(&k.as_str()));
        joined(&pairs)
    }

    fn send(&self, s: &Server) -> (u16, String, Value) {
        self.send_query(s, &self.query())
    }

    fn send_query(&self, s: &Server, query: &str) -> (u16, String, Value) {
        parse_response(&s.raw(&self.bytes(query)))
    }

    fn send_to(&self, node: &support::Node) -> (u16, String, Value) {
        parse_response(&node.raw(&self.bytes(&self.query())))
    }

    /// The whole request with `query` as its query string.
    fn bytes(&self, query: &str) -> Vec<u8> {
        let mut head = format!(
            "{} {}?{query} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n",
            self.method, self.path
        );
        if !self.body.is_empty() {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        if let Some(ct) = self.content_type {
            head.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

fn get(s: &Server, app: &App, path: &str, params: &[(&str, &str)]) -> (u16, Value) {
    let mut r = Req::new(app, "GET", path);
    for (k, v) in params {
        r = r.param(k, v);
    }
    let (st, _, v) = r.send(s);
    (st, v)
}

fn trigger(s: &Server, app: &App, body: Value) -> (u16, Value) {
    let (st, _, v) = Req::post(app, "/events", &body).send(s);
    (st, v)
}

fn batch(s: &Server, app: &App, body: Value) -> (u16, Value) {
    let (st, _, v) = Req::post(app, "/batch_events", &body).send(s);
    (st, v)
}

/// A native WebSocket client and its `connection_id`.
fn native(s: &Server, app: &App) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(s.ws_url(&app.key)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    let id = hello["connection_id"].as_str().unwrap().to_string();
    (ws, id)
}

fn native_on(s: &Server, app: &App, channel: &str) -> (Ws, String) {
    let (mut ws, id) = native(s, app);
    common::subscribe(&mut ws, channel);
    (ws, id)
}

/// A Pusher-protocol WebSocket client subscribed to the public `channel`.
fn pusher_on(s: &Server, app: &App, channel: &str) -> Ws {
    let url = format!(
        "ws://{}/app/{}?protocol=7&client=t&version=1",
        s.addr, app.key
    );
    let (mut ws, _) = tungstenite::connect(url).expect("pusher connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["event"], "pusher:connection_established", "{hello}");
    send_json(
        &mut ws,
        json!({"event": "pusher:subscribe", "data": {"channel": channel}}),
    );
    let ok = next_json(&mut ws);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    ws
}

/// A native presence member of `channel` as `user` (a token signed with the token
/// secret, as tests/presence.rs does).
fn member(s: &Server, app: &App, channel: &str, user: &str) -> Ws {
    let claims = json!({"channel": channel, "exp": unix_now() + 600, "sub": user});
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(app.secret.as_bytes()),
    )
    .unwrap();
    let (mut ws, _) = native(s, app);
    send_json(
        &mut ws,
        json!({"type": "subscribe", "channel": channel, "token": token}),
    );
    let reply = next_json(&mut ws);
    assert_eq!(reply["type"], "subscribed", "{reply}");
    ws
}

fn expect_message(ws: &mut Ws, channel: &str, event: &str) -> Value {
    let v = next_json(ws);
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["channel"], channel, "{v}");
    assert_eq!(v["event"], event, "{v}");
    v
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

#[test]
fn events_reach_subscribers_of_both_protocols_with_data_as_a_string() {
    let s = Server::start();
    let a = app(&s, "events", "10000/s");
    let (mut n, _) = native_on(&s, &a, "orders");
    let mut p = pusher_on(&s, &a, "orders");

    let (st, v) = trigger(
        &s,
        &a,
        json!({"name": "order.created", "channel": "orders", "data": "{\"id\":42}"}),
    );
    assert_eq!((st, &v), (200, &json!({})));
    // Native: the Pusher string is a string, never parsed.
    let m = expect_message(&mut n, "orders", "order.created");
    assert_eq!(m["data"], "{\"id\":42}", "{m}");
    assert!(m["id"].is_string(), "{m}");
    // Pusher: the same text as the event's data string.
    let f = next_json(&mut p);
    assert_eq!(
        f,
        json!({"event": "order.created", "channel": "orders", "data": "{\"id\":42}"})
    );

    // A native publish reaches the Pusher client too (object data as JSON text).
    let (st, _) = s.publish(&a.sk, "orders", "native", json!({"a": 1}));
    assert_eq!(st, 202);
    let f = next_json(&mut p);
    assert_eq!(f["event"], "native", "{f}");
    assert_eq!(f["data"], "{\"a\":1}", "{f}");
    expect_message(&mut n, "orders", "native");

    // Three channels: each subscriber gets it once, on its channel.
    let mut subs: Vec<(Ws, &str)> = ["a", "b", "c"]
        .into_iter()
        .map(|c| (native_on(&s, &a, c).0, c))
        .collect();
    let (st, v) = trigger(
        &s,
        &a,
        json!({"name": "tick", "channels": ["a", "b", "c"], "data": "plain text"}),
    );
    assert_eq!((st, &v), (200, &json!({})));
    for (ws, c) in &mut subs {
        let m = expect_message(ws, c, "tick");
        assert_eq!(m["data"], "plain text");
        expect_silence(ws, Duration::from_millis(100));
    }
    expect_silence(&mut n, Duration::from_millis(100));
}

#[test]
fn batch_events_are_delivered_in_order_all_or_nothing() {
    let s = Server::start();
    let a = app(&s, "batch", "10000/s");
    let (mut n, _) = native_on(&s, &a, "feed");
    let (mut other, _) = native_on(&s, &a, "side");
    let events: Vec<Value> = (0..5)
        .map(|i| json!({"name": "e", "channel": if i == 2 { "side" } else { "feed" }, "data": i.to_string()}))
        .collect();
    let (st, v) = batch(&s, &a, json!({ "batch": events }));
    assert_eq!((st, &v), (200, &json!({})));
    for i in [0, 1, 3, 4] {
        let m = expect_message(&mut n, "feed", "e");
        assert_eq!(m["data"], i.to_string(), "in order: {m}");
    }
    assert_eq!(expect_message(&mut other, "side", "e")["data"], "2");

    // One invalid event: 400 naming it, and nothing of the batch is published.
    let (st, v) = batch(
        &s,
        &a,
        json!({"batch": [
            {"name": "ok", "channel": "feed", "data": "1"},
            {"name": "ok", "channel": "feed", "data": "2"},
            {"name": "pusher:nope", "channel": "feed", "data": "3"},
        ]}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(error_code(&v), "invalid_field");
    assert_eq!(v["error"]["index"], 2, "{v}");
    let (st, v) = batch(
        &s,
        &a,
        json!({"batch": [
            {"name": "ok", "channel": "feed", "data": "1"},
            {"name": "ok", "channel": "feed", "data": {"not": "a string"}},
        ]}),
    );
    assert_eq!((st, v["error"]["index"].clone()), (400, json!(1)), "{v}");
    for empty in [json!({"batch": []}), json!({"events": []})] {
        let (st, v) = batch(&s, &a, empty);
        assert_eq!(st, 400, "{v}");
        assert!(v["error"].get("index").is_none(), "{v}");
    }
    let too_many: Vec<Value> = (0..101)
        .map(|_| json!({"name": "e", "channel": "feed", "data": "x"}))
        .collect();
    let (st, v) = batch(&s, &a, json!({ "batch": too_many }));
    assert_eq!(st, 400, "{v}");
    expect_silence(&mut n, Duration::from_millis(300));

    // info per event: counts for the events that asked, {} for the others.
    let (st, v) = batch(
        &s,
        &a,
        json!({"batch": [
            {"name": "e", "channel": "feed", "data": "x", "info": "subscription_count"},
            {"name": "e", "channel": "side", "data": "y"},
            {"name": "e", "channel": "nobody", "data": "z", "info": "subscription_count"},
        ]}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"batch": [{"subscription_count": 1}, {}, {"subscription_count": 0}]})
    );
    expect_message(&mut n, "feed", "e");
    expect_message(&mut other, "side", "e");
}

#[test]
fn info_and_the_channel_queries_answer_from_presence_and_occupancy() {
    let s = Server::start();
    let a = app(&s, "info", "10000/s");
    let (_news1, _) = native_on(&s, &a, "news");
    let _news2 = pusher_on(&s, &a, "news");
    let _ann = member(&s, &a, "presence-room", "ann");
    let _bob = member(&s, &a, "presence-room", "bob");
    let _bob2 = member(&s, &a, "presence-room", "bob");
    let _cy = member(&s, &a, "presence-lobby", "10");

    // The hub counts asynchronously: wait until it has them all.
    wait_for(Duration::from_secs(5), "the hub's counts", || {
        let (_, v) = get(
            &s,
            &a,
            "/channels/presence-room",
            &[("info", "subscription_count")],
        );
        v["subscription_count"] == 3
    });

    // events with info: per channel published to.
    let (st, v) = trigger(
        &s,
        &a,
        json!({"name": "e", "channels": ["news", "empty"], "data": "x", "info": "subscription_count"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"channels": {"news": {"subscription_count": 2}, "empty": {"subscription_count": 0}}})
    );
    let (st, v) = trigger(
        &s,
        &a,
        json!({"name": "e", "channel": "presence-room", "data": "x", "info": "user_count,subscription_count"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"channels": {"presence-room": {"user_count": 2, "subscription_count": 3}}})
    );
    for bad in ["user_count", "subscription_count,", "members", ""] {
        let (st, v) = trigger(
            &s,
            &a,
            json!({"name": "e", "channels": ["news", "presence-room"], "data": "x", "info": bad}),
        );
        assert_eq!((st, error_code(&v)), (400, "invalid_info"), "{bad}: {v}");
    }

    // GET /channels: occupied channels, sorted, attributes as asked.
    let (st, v) = get(&s, &a, "/channels", &[]);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"channels": {"news": {}, "presence-lobby": {}, "presence-room": {}}})
    );
    let (st, v) = get(
        &s,
        &a,
        "/channels",
        &[("filter_by_prefix", "presence-"), ("info", "user_count")],
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"channels": {"presence-lobby": {"user_count": 1}, "presence-room": {"user_count": 2}}})
    );
    let (st, v) = get(
        &s,
        &a,
        "/channels",
        &[("filter_by_prefix", "ne"), ("info", "subscription_count")],
    );
    assert_eq!(
        (st, v),
        (
            200,
            json!({"channels": {"news": {"subscription_count": 2}}})
        )
    );
    let (st, v) = get(&s, &a, "/channels", &[("info", "user_count")]);
    assert_eq!((st, error_code(&v)), (400, "invalid_info"), "{v}");

    // GET /channels/{channel}.
    let (st, v) = get(
        &s,
        &a,
        "/channels/presence-room",
        &[("info", "user_count,subscription_count")],
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"occupied": true, "user_count": 2, "subscription_count": 3})
    );
    let (st, v) = get(&s, &a, "/channels/news", &[]);
    assert_eq!((st, v), (200, json!({"occupied": true})));
    let (st, v) = get(&s, &a, "/channels/quiet", &[("info", "subscription_count")]);
    assert_eq!(
        (st, v),
        (200, json!({"occupied": false, "subscription_count": 0}))
    );
    let (st, v) = get(&s, &a, "/channels/news", &[("info", "user_count")]);
    assert_eq!((st, error_code(&v)), (400, "invalid_info"), "{v}");
    // The path segment is percent-decoded (the signature covers it as sent).
    let (st, v) = get(
        &s,
        &a,
        "/channels/presence%2Droom",
        &[("info", "user_count")],
    );
    assert_eq!((st, v), (200, json!({"occupied": true, "user_count": 2})));

    // GET /channels/{channel}/users: ids in join order, strings.
    let (st, v) = get(&s, &a, "/channels/presence-room/users", &[]);
    assert_eq!(
        (st, v),
        (200, json!({"users": [{"id": "ann"}, {"id": "bob"}]}))
    );
    let (st, v) = get(&s, &a, "/channels/presence-lobby/users", &[]);
    assert_eq!((st, v), (200, json!({"users": [{"id": "10"}]})));
    let (st, v) = get(&s, &a, "/channels/news/users", &[]);
    assert_eq!((st, error_code(&v)), (400, "invalid_field"), "{v}");
    let (st, v) = get(
        &s,
        &a,
        "/channels/presence-room/users",
        &[("info", "user_count")],
    );
    assert_eq!((st, error_code(&v)), (400, "invalid_query"), "{v}");
}

/// Sleep until just after a second boundary, so the server reads the same second as
/// the signer for the next few milliseconds (the ±600 s edges are exact).
fn start_of_second() {
    let sub = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    if sub > 300 {
        std::thread::sleep(Duration::from_millis(u64::from(1000 - sub) + 20));
    }
}

#[test]
fn every_signature_refusal_is_401_with_a_message() {
    let s = Server::start();
    let a = app(&s, "sig", "10000/s");
    let b = app(&s, "other", "10000/s");
    let body = json!({"name": "e", "channel": "c", "data": "x"});
    let ok = Req::post(&a, "/events", &body);
    assert_eq!(ok.send(&s).0, 200);

    let unauthorized = |r: &Req, why: &str| {
        let (st, head, v) = r.send(&s);
        assert_eq!(st, 401, "{why}: {head} {v}");
        assert_eq!(error_code(&v), "unauthorized", "{why}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains(&a.secret), "{why}: {msg}");
        msg.to_string()
    };

    for missing in [
        "auth_key",
        "auth_timestamp",
        "auth_version",
        "auth_signature",
    ] {
        let mut r = ok.clone();
        r.drop.push(missing);
        let msg = unauthorized(&r, missing);
        assert!(msg.contains(missing), "{msg}");
    }
    let mut r = ok.clone();
    r.version = "2.0".into();
    unauthorized(&r, "auth_version 2.0");

    // The timestamp window: 600 s each way is in, 601 out.
    for (delta, accepted) in [(600i64, true), (-600, true), (601, false), (-601, false)] {
        start_of_second();
        let mut r = ok.clone();
        r.timestamp = (unix_now() as i64 + delta) as u64;
        let (st, _, v) = r.send(&s);
        assert_eq!(st, if accepted { 200 } else { 401 }, "{delta}: {v}");
    }

    // App id and key: one message for every way of being wrong.
    let mut msgs = Vec::new();
    let mut r = ok.clone();
    r.key = "pk_0000000000000000000000000000".into();
    msgs.push(unauthorized(&r, "unknown key"));
    let mut r = ok.clone();
    r.key = b.key.clone();
    msgs.push(unauthorized(&r, "a key of another app"));
    let mut r = ok.clone();
    r.key = b.key.clone();
    r.secret = b.secret.clone();
    msgs.push(unauthorized(&r, "another app's key and secret"));
    let mut r = ok.clone();
    r.path = "/apps/999999999/events".into();
    msgs.push(unauthorized(&r, "unknown app id"));
    let mut r = ok.clone();
    r.path = format!("/apps/{}x/events", a.app_id);
    msgs.push(unauthorized(&r, "app id not a number"));
    assert!(msgs.windows(2).all(|w| w[0] == w[1]), "{msgs:?}");

    // body_md5.
    let mut r = ok.clone();
    r.body_md5 = Some(md5_hex(b"another body"));
    unauthorized(&r, "wrong body_md5");
    let mut r = ok.clone();
    r.drop.push("body_md5");
    unauthorized(&r, "body_md5 left out after signing");
    let mut r = ok.clone();
    r.body_md5 = Some(String::new());
    unauthorized(&r, "empty body_md5 with a body");
    // Signed without body_md5 at all, with a body.
    let mut r = ok.clone();
    r.body_md5 = Some("-".into());
    let q = r
        .query()
        .split('&')
        .filter(|p| !p.starts_with("body_md5="))
        .collect::<Vec<_>>()
        .join("&");
    let (st, _, v) = r.send_query(&s, &q);
    assert_eq!(st, 401, "{v}");
    // The MD5 of the empty body on a GET (the Python SDK sends it): accepted.
    let mut r = Req::new(&a, "GET", "/channels");
    r.body_md5 = Some(md5_hex(b""));
    assert_eq!(r.send(&s).0, 200);
    let mut r = Req::new(&a, "GET", "/channels");
    r.body_md5 = Some(md5_hex(b"x"));
    unauthorized(&r, "wrong body_md5 on a GET");

    // The signature.
    let mut r = ok.clone();
    r.secret = "ts_not_the_secret".into();
    let msg = unauthorized(&r, "wrong secret");
    // The same message as an unknown app (a public key must not tell its app id).
    assert_eq!(msg, msgs[0]);
    assert!(msg.starts_with("invalid signature"), "{msg}");
    let q = ok.query();
    let (before, sig) = q.rsplit_once("auth_signature=").unwrap();
    for bad in [&sig[..63], "zz", &sig.to_uppercase()[..]] {
        let (st, _, v) = ok.send_query(&s, &format!("{before}auth_signature={bad}"));
        // Uppercase hex is the same signature.
        let want = if bad.len() == 64 { 200 } else { 401 };
        assert_eq!(st, want, "{bad}: {v}");
    }
    // A signed parameter changed after signing.
    let r = Req::new(&a, "GET", "/channels").param("filter_by_prefix", "a");
    let q = r
        .query()
        .replace("filter_by_prefix=a", "filter_by_prefix=b");
    assert_eq!(r.send_query(&s, &q).0, 401);
    // Another path than the one signed.
    let q = ok.query();
    let mut r = ok.clone();
    r.path = format!("/apps/{}/batch_events", a.app_id);
    assert_eq!(r.send_query(&s, &q).0, 401);
}

#[test]
fn rotated_secrets_verify_during_their_grace_only() {
    let s = Server::start();
    let a = app(&s, "rotate", "10000/s");
    let old = a.secret.clone();
    let signed = |secret: &str| {
        let mut r = Req::new(&a, "GET", "/channels");
        r.secret = secret.to_string();
        r.send(&s).0
    };
    // With a grace: both verify.
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "rotate-token-secret",
            &a.project_id,
            "--grace",
            "1h",
        ],
    );
    let new = v["token_secret"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(5), "the new secret", || {
        signed(&new) == 200
    });
    assert_eq!(signed(&old), 200, "the old secret is in its grace");
    // Without: only the newest.
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "rotate-token-secret",
            &a.project_id,
            "--grace",
            "0s",
        ],
    );
    let newest = v["token_secret"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(5), "the newest secret", || {
        signed(&newest) == 200
    });
    assert_eq!(signed(&new), 401, "rotated out with no grace");
}

#[test]
fn query_body_and_route_refusals() {
    let s = Server::start();
    let a = app(&s, "refusals", "10000/s");
    let (mut n, id) = native_on(&s, &a, "c");
    let body = json!({"name": "e", "channel": "c", "data": "x"});

    // A parameter given twice (names compare case-insensitively): 400 before the
    // signature is even looked at.
    let r = Req::post(&a, "/events", &body);
    let q = r.query();
    for dup in [
        format!("{q}&auth_key={}", a.key),
        format!("{q}&AUTH_KEY={}", a.key),
    ] {
        let (st, _, v) = r.send_query(&s, &dup);
        assert_eq!((st, error_code(&v)), (400, "invalid_query"), "{v}");
    }

    // 413 from the declared size, before the body is read.
    let big = json!({"name": "e", "channel": "c", "data": "x".repeat(70_000)});
    let (st, _, v) = Req::post(&a, "/events", &big).send(&s);
    assert_eq!((st, error_code(&v)), (413, "payload_too_large"), "{v}");

    // Body validation.
    let bad_bodies = [
        (
            json!({"name": "pusher:x", "channel": "c", "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "pusher_internal:x", "channel": "c", "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channels": ["c", "c"], "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channels": (0..101).map(|i| format!("c{i}")).collect::<Vec<_>>(), "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channel": "c", "data": {"a": 1}}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channel": "c".repeat(101), "data": "x"}),
            "field_too_long",
        ),
        (
            json!({"name": "e".repeat(101), "channel": "c", "data": "x"}),
            "field_too_long",
        ),
        (json!({"channel": "c", "data": "x"}), "missing_field"),
        (
            json!({"name": "e", "channel": "c", "data": "x", "socket_id": "nope"}),
            "invalid_field",
        ),
    ];
    for (body, code) in bad_bodies {
        let (st, v) = trigger(&s, &a, body.clone());
        assert_eq!((st, error_code(&v)), (400, code), "{body}: {v}");
    }
    let mut r = Req::post(&a, "/events", &body);
    r.body = b"{not json".to_vec();
    let (st, _, v) = r.send(&s);
    assert_eq!((st, error_code(&v)), (400, "invalid_json"), "{v}");
    let mut r = Req::post(&a, "/events", &body);
    r.content_type = Some("text/plain");
    let (st, _, v) = r.send(&s);
    assert_eq!(st, 400, "{v}");
    expect_silence(&mut n, Duration::from_millis(200));

    // A GET with a body.
    let mut r = Req::new(&a, "GET", "/channels");
    r.body = b"{}".to_vec();
    assert_eq!(r.send(&s).0, 400);

    // Routes and methods.
    let (st, head, _) = Req::new(&a, "GET", "/events").send(&s);
    assert_eq!((st, header(&head, "allow").as_deref()), (405, Some("POST")));
    let (st, head, _) = Req::post(&a, "/channels", &body).send(&s);
    assert_eq!((st, header(&head, "allow").as_deref()), (405, Some("GET")));
    for path in [
        "/nope",
        "/users/u1/terminate_connections",
        "/channels/c/members",
        "",
    ] {
        let (st, _, v) = Req::new(&a, "GET", path).send(&s);
        assert_eq!((st, error_code(&v)), (404, "not_found"), "{path}: {v}");
    }

    // socket_id leaves that connection out, in events and in batch_events.
    let (mut m, _) = native_on(&s, &a, "c");
    let (st, _) = trigger(
        &s,
        &a,
        json!({"name": "e", "channel": "c", "data": "1", "socket_id": id}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut m, "c", "e")["data"], "1");
    let (st, _) = batch(
        &s,
        &a,
        json!({"batch": [{"name": "e", "channel": "c", "data": "2", "socket_id": id}]}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut m, "c", "e")["data"], "2");
    expect_silence(&mut n, Duration::from_millis(300));
    // An id of nobody leaves nobody out.
    let (st, _) = trigger(
        &s,
        &a,
        json!({"name": "e", "channel": "c", "data": "3", "socket_id": "1.1"}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut n, "c", "e")["data"], "3");
}

#[test]
fn pusher_off_and_the_quota_answer_403() {
    let s = Server::start_with(Options {
        config: "metrics_listen = \"127.0.0.1:0\"\n".into(),
        ..Options::default()
    });
    let a = app(&s, "slow", "2/s");
    let body = json!({"name": "e", "channel": "c", "data": "x"});

    // Over the burst in one request: 403 and no Retry-After (waiting cannot help).
    let (st, head, v) = Req::post(
        &a,
        "/events",
        &json!({"name": "e", "channels": ["a", "b", "c"], "data": "x"}),
    )
    .send(&s);
    assert_eq!((st, error_code(&v)), (403, "rate_limited"), "{v}");
    assert_eq!(header(&head, "retry-after"), None, "{head}");

    // Over the quota: 403 with Retry-After and the rate headers.
    let mut statuses = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let (st, head, v) = Req::post(&a, "/events", &body).send(&s);
        statuses.push(st);
        if st == 403 {
            refused = Some((head, v));
            break;
        }
    }
    let (head, v) = refused.unwrap_or_else(|| panic!("never over quota: {statuses:?}"));
    assert_eq!(error_code(&v), "rate_limited", "{v}");
    let retry: u64 = header(&head, "retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1, "{head}");
    assert_eq!(
        header(&head, "ratelimit-remaining").as_deref(),
        Some("0"),
        "{head}"
    );
    // GETs cost nothing.
    assert_eq!(get(&s, &a, "/channels", &[]).0, 200);

    // The metrics count the Pusher API under its own label.
    let metrics = scrape(&s);
    assert!(
        metrics.contains("ringcast_publish_requests_total{api=\"pusher\",status=\"200\"}"),
        "{metrics}"
    );
    let forbidden = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("ringcast_publish_requests_total{api=\"pusher\",status=\"403\"} ")
        })
        .unwrap();
    assert!(forbidden.parse::<u64>().unwrap() >= 2, "{metrics}");

    // The Pusher switch off: 403 once signed, 401 still for what is not.
    cli(
        &s.data_dir,
        &["project", "set-limits", &a.project_id, "--pusher", "off"],
    );
    wait_for(
        Duration::from_secs(5),
        "the switch to reach the server",
        || get(&s, &a, "/channels", &[]).0 == 403,
    );
    let (st, v) = get(&s, &a, "/channels", &[]);
    assert_eq!((st, error_code(&v)), (403, "pusher_disabled"), "{v}");
    let (st, _, v) = Req::post(&a, "/events", &body).send(&s);
    assert_eq!((st, error_code(&v)), (403, "pusher_disabled"), "{v}");
    let mut r = Req::new(&a, "GET", "/channels");
    r.secret = "ts_wrong".into();
    assert_eq!(r.send(&s).0, 401);
}

fn scrape(s: &Server) -> String {
    let addr = s.metrics.expect("metrics address");
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// A native client of a cluster node subscribed to `channel`, and its connection id.
fn node_client(node: &support::Node, key: &str, channel: &str) -> (Ws, String) {
    let url = format!("ws://{}/api/v1/ws?key={key}", node.addr);
    let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    let id = hello["connection_id"].as_str().unwrap().to_string();
    common::subscribe(&mut ws, channel);
    (ws, id)
}

#[test]
fn cluster_counts_are_cluster_wide_and_socket_id_excludes_on_another_node() {
    let Some(redis) = support::Redis::start() else {
        return;
    };
    let a_node = support::Node::start(&redis);
    let b_node = support::Node::start(&redis);
    let a = app_of(&support::cli(
        &redis,
        &["project", "create", "c", "--rate-limit", "10000/s"],
    ));
    for node in [&a_node, &b_node] {
        support::wait_for("the node to know the app", || {
            Req::new(&a, "GET", "/channels").send_to(node).0 == 200
        });
    }

    // Presence members on both nodes; a user on both counts once.
    let claims = |user: &str| {
        let c = json!({"channel": "presence-room", "exp": unix_now() + 600, "sub": user});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &c,
            &jsonwebtoken::EncodingKey::from_secret(a.secret.as_bytes()),
        )
        .unwrap()
    };
    let mut members = Vec::new();
    for (node, user) in [(&a_node, "u1"), (&b_node, "u2"), (&b_node, "u1")] {
        let (mut ws, _) = node_client(node, &a.key, "lobby");
        send_json(
            &mut ws,
            json!({"type": "subscribe", "channel": "presence-room", "token": claims(user)}),
        );
        assert_eq!(next_json(&mut ws)["type"], "subscribed");
        members.push(ws);
    }
    for node in [&a_node, &b_node] {
        support::wait_for("cluster-wide counts", || {
            let r = Req::new(&a, "GET", "/channels")
                .param("filter_by_prefix", "presence-")
                .param("info", "user_count,subscription_count");
            r.send_to(node).2
                == json!({"channels": {"presence-room": {"user_count": 2, "subscription_count": 3}}})
        });
        let (st, _, v) = Req::new(&a, "GET", "/channels/presence-room/users").send_to(node);
        assert_eq!(
            (st, v),
            (200, json!({"users": [{"id": "u1"}, {"id": "u2"}]}))
        );
    }

    // A trigger on node B with the socket_id of a connection on node A leaves it out,
    // and reaches everyone else on both nodes.
    let (mut on_a, a_id) = node_client(&a_node, &a.key, "news");
    let (mut other_a, _) = node_client(&a_node, &a.key, "news");
    let (mut on_b, _) = node_client(&b_node, &a.key, "news");
    redis.wait_numsub(&a.project_id, "news", 2);
    let body = json!({"name": "e", "channel": "news", "data": "x", "socket_id": a_id});
    let (st, _, v) = Req::post(&a, "/events", &body).send_to(&b_node);
    assert_eq!(st, 200, "{v}");
    for ws in [&mut other_a, &mut on_b] {
        assert_eq!(expect_message(ws, "news", "e")["data"], "x");
    }
    expect_silence(&mut on_a, Duration::from_millis(300));
}
