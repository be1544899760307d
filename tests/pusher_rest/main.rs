//! The Pusher REST API (`/apps/{app_id}/...`), black box: the real binary, requests
//! signed here by a small signer of our own (RustCrypto's HMAC-SHA256 and MD5, nothing
//! from src/), real WebSocket clients of both protocols receiving what is published.
//!
//! Design: docs/design/pusher.md, section 4 (checks in the order of 4.1, bodies of 4.2,
//! `info` of 4.3, quota of 4.4).

#[path = "../common/mod.rs"]
mod common;
use common::cluster as support;
use common::unix_now;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{
    cli, expect_silence, header, next_json, parse_response, send_json, set_timeout, wait_for,
    Options, Server, Ws,
};
use serde_json::{json, Value};

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

use common::sign::{hmac_hex, md5_hex};

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
    let (mut ws, _) = common::pusher_connect(&url);
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

    type Query<'a> = &'a [(&'a str, &'a str)];
    // Answered 200: (path, query, body).
    let answered: [(&str, Query, Value); 9] = [
        // GET /channels: occupied channels, sorted, attributes as asked.
        (
            "/channels",
            &[],
            json!({"channels": {"news": {}, "presence-lobby": {}, "presence-room": {}}}),
        ),
        (
            "/channels",
            &[("filter_by_prefix", "presence-"), ("info", "user_count")],
            json!({"channels": {"presence-lobby": {"user_count": 1}, "presence-room": {"user_count": 2}}}),
        ),
        (
            "/channels",
            &[("filter_by_prefix", "ne"), ("info", "subscription_count")],
            json!({"channels": {"news": {"subscription_count": 2}}}),
        ),
        // GET /channels/{channel}.
        (
            "/channels/presence-room",
            &[("info", "user_count,subscription_count")],
            json!({"occupied": true, "user_count": 2, "subscription_count": 3}),
        ),
        ("/channels/news", &[], json!({"occupied": true})),
        (
            "/channels/quiet",
            &[("info", "subscription_count")],
            json!({"occupied": false, "subscription_count": 0}),
        ),
        // The path segment is percent-decoded (the signature covers it as sent).
        (
            "/channels/presence%2Droom",
            &[("info", "user_count")],
            json!({"occupied": true, "user_count": 2}),
        ),
        // GET /channels/{channel}/users: ids in join order, strings.
        (
            "/channels/presence-room/users",
            &[],
            json!({"users": [{"id": "ann"}, {"id": "bob"}]}),
        ),
        (
            "/channels/presence-lobby/users",
            &[],
            json!({"users": [{"id": "10"}]}),
        ),
    ];
    for (path, query, want) in answered {
        let (st, v) = get(&s, &a, path, query);
        assert_eq!((st, v), (200, want), "{path} {query:?}");
    }
    // Refused 400: (path, query, error code).
    let refused: [(&str, Query, &str); 4] = [
        ("/channels", &[("info", "user_count")], "invalid_info"),
        ("/channels/news", &[("info", "user_count")], "invalid_info"),
        ("/channels/news/users", &[], "invalid_field"),
        (
            "/channels/presence-room/users",
            &[("info", "user_count")],
            "invalid_query",
        ),
    ];
    for (path, query, code) in refused {
        let (st, v) = get(&s, &a, path, query);
        assert_eq!((st, error_code(&v)), (400, code), "{path} {query:?}: {v}");
    }
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

mod refusals_and_cluster;
