//! Who a connection is (contract 1.3, "Users"), black box: the real binary, real
//! WebSocket clients, connection tokens made by an independent JWT library
//! (`jsonwebtoken`), Pusher sign-in signatures made by an HMAC implementation that is not
//! the server's.

mod common;
use common::users::{conn_token, connect_as, pusher_as, signin, upgrade_answer, ws_url};
use common::Project;

use std::time::Duration;

use common::{
    close_code, expect_silence, hs256, next_json, parse_response, send_json, unix_now, Server, Ws,
};
use serde_json::{json, Value};

/// Subscribe to `channel` with a channel token; the answer.
fn subscribe_with(ws: &mut Ws, channel: &str, token: &str) -> Value {
    send_json(
        ws,
        json!({"type": "subscribe", "channel": channel, "token": token}),
    );
    next_json(ws)
}

fn expect_invalid_token(s: &Server, p: &Project, token: &str, why: &str) {
    let (status, body) = upgrade_answer(s.addr, p, token);
    assert_eq!(status, 401, "{why}: {body}");
    assert_eq!(body["error"]["code"], "invalid_token", "{why}: {body}");
}

#[test]
fn connection_tokens_are_checked_at_the_upgrade() {
    let s = Server::start();
    let p = s.test_project("users-a");
    let other = s.test_project("users-b");

    let (mut ws, hello) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    assert_eq!(hello["user_id"], "ann", "{hello}");
    // An empty token is no token: anonymous, as without one (no user_id).
    let (_, hello) = connect_as(s.addr, &p, "");
    assert!(hello.get("user_id").is_none(), "{hello}");

    let now = unix_now();
    let expired = hs256(&p.token_secret, json!({"sub": "ann", "exp": now - 60}));
    expect_invalid_token(&s, &p, &expired, "expired");
    let wrong = hs256("ts_not_the_secret", json!({"sub": "ann", "exp": now + 600}));
    expect_invalid_token(&s, &p, &wrong, "wrong secret");
    expect_invalid_token(&s, &p, &conn_token(&other, "ann", 600), "another project");
    let no_sub = hs256(&p.token_secret, json!({"exp": now + 600}));
    expect_invalid_token(&s, &p, &no_sub, "no sub");
    let long = conn_token(&p, &"u".repeat(201), 600);
    expect_invalid_token(&s, &p, &long, "sub over 200 characters");
    // A user the REST calls could not name (a control character) is never let in.
    let control = conn_token(&p, "a\nb", 600);
    expect_invalid_token(&s, &p, &control, "sub with a control character");
    let big = hs256(
        &p.token_secret,
        json!({"sub": "ann", "exp": now + 600, "info": {"x": "y".repeat(1100)}}),
    );
    expect_invalid_token(&s, &p, &big, "info over 1 KiB");
    let no_exp = hs256(&p.token_secret, json!({"sub": "ann"}));
    expect_invalid_token(&s, &p, &no_exp, "no exp");
    let channel = common::channel_token(&p.token_secret, "private-a", "ann");
    expect_invalid_token(&s, &p, &channel, "a channel token");
    expect_invalid_token(&s, &p, "not.a.jwt", "garbage");

    // 200 characters is still a user.
    let (_, hello) = connect_as(s.addr, &p, &conn_token(&p, &"u".repeat(200), 600));
    assert_eq!(hello["user_id"].as_str().map(str::len), Some(200));
    // The first connection is unaffected by all of it.
    send_json(&mut ws, json!({"type": "ping"}));
    assert_eq!(next_json(&mut ws)["type"], "pong");
}

#[test]
fn a_refresh_keeps_the_connection_and_without_one_it_closes_with_4011() {
    let s = Server::start();
    let p = s.test_project("users-refresh");
    // Both tokens end in 2 s: the deadline is exp + 5 s.
    let (mut late, _) = connect_as(s.addr, &p, &conn_token(&p, "ann", 2));
    let (mut kept, _) = connect_as(s.addr, &p, &conn_token(&p, "bob", 2));

    // Another user's token is refused, and does not move anything.
    send_json(
        &mut kept,
        json!({"type": "refresh", "token": conn_token(&p, "ann", 600)}),
    );
    let refused = next_json(&mut kept);
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["code"], "forbidden", "{refused}");
    assert!(refused.get("channel").is_none(), "{refused}");

    let exp = unix_now() + 600;
    let fresh = hs256(&p.token_secret, json!({"sub": "bob", "exp": exp}));
    send_json(&mut kept, json!({"type": "refresh", "token": fresh}));
    assert_eq!(
        next_json(&mut kept),
        json!({"type": "refreshed", "exp": exp})
    );

    assert_eq!(
        close_code(&mut late),
        Some(4011),
        "exp + 5 s without a refresh"
    );
    // Past the first deadline, the refreshed one is still open.
    send_json(&mut kept, json!({"type": "ping"}));
    assert_eq!(next_json(&mut kept)["type"], "pong");

    // A connection opened without a token has none to refresh.
    let mut anon = s.ws(&p.public);
    send_json(
        &mut anon,
        json!({"type": "refresh", "token": fresh_for(&p)}),
    );
    let refused = next_json(&mut anon);
    assert_eq!(refused["code"], "forbidden", "{refused}");
}

fn fresh_for(p: &Project) -> String {
    conn_token(p, "carl", 600)
}

#[test]
fn channel_tokens_belong_to_the_connections_user_and_presence_takes_it() {
    let s = Server::start();
    let p = s.test_project("users-channels");
    let token = hs256(
        &p.token_secret,
        json!({"sub": "ann", "exp": unix_now() + 600, "info": {"name": "Ann"}}),
    );
    let (mut ann, _) = connect_as(s.addr, &p, &token);

    let bobs = common::channel_token(&p.token_secret, "private-a", "bob");
    let refused = subscribe_with(&mut ann, "private-a", &bobs);
    assert_eq!(refused["code"], "forbidden", "{refused}");
    assert_eq!(refused["channel"], "private-a", "{refused}");

    let anns = common::channel_token(&p.token_secret, "private-a", "ann");
    send_json(
        &mut ann,
        json!({"type": "subscribe", "channel": "private-a", "token": anns}),
    );
    assert_eq!(next_json(&mut ann)["type"], "subscribed");

    // A presence token naming no user: the member is the connection's user, with the
    // connection token's info.
    let mut watcher = s.ws(&p.public);
    let watch = common::channel_token(&p.token_secret, "presence-room", "zed");
    send_json(
        &mut watcher,
        json!({"type": "subscribe", "channel": "presence-room", "token": watch}),
    );
    assert_eq!(next_json(&mut watcher)["type"], "subscribed");
    let nameless = hs256(
        &p.token_secret,
        json!({"channel": "presence-room", "exp": unix_now() + 600}),
    );
    send_json(
        &mut ann,
        json!({"type": "subscribe", "channel": "presence-room", "token": nameless}),
    );
    let joined = next_json(&mut ann);
    assert_eq!(joined["type"], "subscribed", "{joined}");
    let seen = common::expect_presence(&mut watcher, "join", "ann");
    assert_eq!(seen["info"], json!({"name": "Ann"}), "{seen}");

    // Without a connection user, a presence token without sub is refused as before.
    let mut anon = s.ws(&p.public);
    send_json(
        &mut anon,
        json!({"type": "subscribe", "channel": "presence-room", "token": nameless}),
    );
    assert_eq!(next_json(&mut anon)["code"], "forbidden");
    expect_silence(&mut ann, Duration::from_millis(200));
}

#[test]
fn pusher_signin_needs_pushers_signature_and_names_the_user() {
    let s = Server::start();
    let p = s.test_project("users-pusher");
    let url = format!(
        "ws://{}/app/{}?protocol=7&client=js&version=8.4.0",
        s.addr, p.public
    );
    let (mut ws, socket_id) = common::pusher_connect(&url);
    let user_data = r#"{"id":"ann","user_info":{"name":"Ann"}}"#;

    let bad = signin(&mut ws, &p, &socket_id, user_data, "ts_wrong");
    assert_eq!(bad["event"], "pusher:error", "{bad}");
    assert_eq!(bad["data"]["code"], 4009, "{bad}");
    // Signed for another connection: refused too.
    let bad = signin(&mut ws, &p, "1.2", user_data, &p.token_secret);
    assert_eq!(bad["data"]["code"], 4009, "{bad}");

    let ok = signin(&mut ws, &p, &socket_id, user_data, &p.token_secret);
    assert_eq!(ok["event"], "pusher:signin_success", "{ok}");
    let data: Value = serde_json::from_str(ok["data"].as_str().expect("a string")).unwrap();
    assert_eq!(data["user_data"], user_data);

    // The same user again is fine; another one is not (a connection's user stays).
    let again = signin(&mut ws, &p, &socket_id, user_data, &p.token_secret);
    assert_eq!(again["event"], "pusher:signin_success", "{again}");
    let other = signin(&mut ws, &p, &socket_id, r#"{"id":"bob"}"#, &p.token_secret);
    assert_eq!(other["event"], "pusher:error", "{other}");
    // user_data without a string id.
    let no_id = signin(&mut ws, &p, &socket_id, r#"{"id":7}"#, &p.token_secret);
    assert_eq!(no_id["event"], "pusher:error", "{no_id}");
    let control = signin(
        &mut ws,
        &p,
        &socket_id,
        r#"{"id":"a\u0007b"}"#,
        &p.token_secret,
    );
    assert_eq!(control["event"], "pusher:error", "{control}");
    send_json(&mut ws, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_json(&mut ws)["event"], "pusher:pong");
}

#[test]
fn with_require_user_on_an_upgrade_needs_a_valid_connection_token() {
    let s = Server::start();
    let p = s.test_project("users-required");
    common::cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--require-user", "on"],
    );
    let plain = format!("ws://{}/api/v1/ws?key={}", s.addr, p.public);
    let refused = || {
        matches!(tungstenite::connect(plain.as_str()),
            Err(tungstenite::Error::Http(r)) if r.status().as_u16() == 401)
    };
    common::wait_for(
        Duration::from_secs(5),
        "require_user to reach the server",
        refused,
    );
    let (status, body) = upgrade_answer(s.addr, &p, "");
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("invalid_token"))
    );
    expect_invalid_token(&s, &p, "not.a.jwt", "garbage");
    let (_, hello) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    assert_eq!(hello["user_id"], "ann");
    // Pusher connections have no connection token: not affected (they sign in).
    let url = format!("ws://{}/app/{}?protocol=7", s.addr, p.public);
    let _ = common::pusher_connect(&url);

    common::cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--require-user", "off"],
    );
    common::wait_for(
        Duration::from_secs(5),
        "require_user off to reach the server",
        || !refused(),
    );
}

/// A REST call with the secret key on a new connection: status and JSON body.
fn rest(s: &Server, method: &str, path: &str, p: &Project, body: &str) -> (u16, Value) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        p.secret,
        body.len()
    );
    let (status, _, v) = parse_response(&s.raw(req.as_bytes()));
    (status, v)
}

fn connections(s: &Server, p: &Project, user: &str) -> u64 {
    let (status, v) = s.get_json(&p.secret, &format!("/api/v1/users/{user}"));
    assert_eq!(status, 200, "{v}");
    v["connections"].as_u64().expect("a count")
}

#[test]
fn a_disconnect_closes_the_users_connections_with_4010_and_pushers_with_4009() {
    let s = Server::start_with(common::Options::default().workers(2));
    let p = s.test_project("users-disconnect");
    let (mut a1, _) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    let (mut a2, _) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    let (mut bob, _) = connect_as(s.addr, &p, &conn_token(&p, "bob", 600));
    let mut pa = pusher_as(s.addr, &p, "ann");
    assert_eq!(connections(&s, &p, "ann"), 3);
    assert_eq!(connections(&s, &p, "bob"), 1);

    let (status, v) = rest(&s, "POST", "/api/v1/users/ann/disconnect", &p, "");
    assert_eq!(status, 202, "{v}");
    assert_eq!(close_code(&mut a1), Some(4010));
    assert_eq!(close_code(&mut a2), Some(4010));
    let err = next_json(&mut pa);
    assert_eq!(err["event"], "pusher:error", "{err}");
    assert_eq!(err["data"]["code"], 4009, "{err}");
    assert_eq!(
        close_code(&mut pa),
        Some(4009),
        "pusher-js does not reconnect"
    );
    send_json(&mut bob, json!({"type": "ping"}));
    assert_eq!(
        next_json(&mut bob)["type"],
        "pong",
        "another user is untouched"
    );
    common::wait_for(Duration::from_secs(3), "ann's connections to go", || {
        connections(&s, &p, "ann") == 0
    });
}

#[test]
fn a_server_unsubscribe_says_reason_server_and_the_channel_can_be_taken_again() {
    let s = Server::start();
    let p = s.test_project("users-unsub");
    let (mut ann, _) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    common::subscribe(&mut ann, "news");
    common::subscribe(&mut ann, "sentinel");
    let mut pa = pusher_as(s.addr, &p, "ann");
    send_json(
        &mut pa,
        json!({"event": "pusher:subscribe", "data": {"channel": "news"}}),
    );
    assert_eq!(
        next_json(&mut pa)["event"],
        "pusher_internal:subscription_succeeded"
    );
    let mut other = s.ws(&p.public);
    common::subscribe(&mut other, "news");

    let body = json!({"channel": "news", "user_id": "ann"}).to_string();
    let (status, v) = rest(&s, "POST", "/api/v1/channels/unsubscribe", &p, &body);
    assert_eq!(status, 202, "{v}");
    assert_eq!(
        next_json(&mut ann),
        json!({"type": "unsubscribed", "channel": "news", "reason": "server"})
    );
    // Nothing more on news for ann (the sentinel comes next), the others still get it.
    let (status, _) = s.publish(&p.secret, "news", "e", json!({"n": 1}));
    assert_eq!(status, 202);
    assert_eq!(next_json(&mut other)["channel"], "news");
    let (status, _) = s.publish(&p.secret, "sentinel", "e", json!({"n": 2}));
    assert_eq!(status, 202);
    assert_eq!(next_json(&mut ann)["channel"], "sentinel");
    expect_silence(&mut pa, Duration::from_millis(300));
    // A presence channel: the member leaves as on an unsubscribe.
    let mut watcher = s.ws(&p.public);
    let watch = common::channel_token(&p.token_secret, "presence-room", "zed");
    send_json(
        &mut watcher,
        json!({"type": "subscribe", "channel": "presence-room", "token": watch}),
    );
    assert_eq!(next_json(&mut watcher)["type"], "subscribed");
    let room = common::channel_token(&p.token_secret, "presence-room", "ann");
    send_json(
        &mut ann,
        json!({"type": "subscribe", "channel": "presence-room", "token": room}),
    );
    assert_eq!(next_json(&mut ann)["type"], "subscribed");
    common::expect_presence(&mut watcher, "join", "ann");
    let body = json!({"channel": "presence-room", "user_id": "ann"}).to_string();
    let (status, v) = rest(&s, "POST", "/api/v1/channels/unsubscribe", &p, &body);
    assert_eq!(status, 202, "{v}");
    assert_eq!(next_json(&mut ann)["reason"], "server");
    common::expect_presence(&mut watcher, "leave", "ann");

    // The connection forgot the channel: subscribing again is a new subscription.
    common::subscribe(&mut ann, "news");
    let (status, _) = s.publish(&p.secret, "news", "e", json!({"n": 3}));
    assert_eq!(status, 202);
    assert_eq!(next_json(&mut ann)["data"]["n"], 3);
}

#[test]
fn a_blocked_user_is_refused_everywhere_until_the_block_is_lifted() {
    let s = Server::start();
    let p = s.test_project("users-block");
    let (mut ann, _) = connect_as(s.addr, &p, &conn_token(&p, "ann", 600));
    let (status, v) = rest(
        &s,
        "POST",
        "/api/v1/users/ann/block",
        &p,
        r#"{"until":null}"#,
    );
    assert_eq!(status, 202, "{v}");
    assert_eq!(close_code(&mut ann), Some(4010), "a block disconnects");
    let token = conn_token(&p, "ann", 600);
    common::wait_for(
        Duration::from_secs(3),
        "the block to reach the server",
        || upgrade_answer(s.addr, &p, &token).0 == 401,
    );
    let (_, body) = upgrade_answer(s.addr, &p, &token);
    assert_eq!(body["error"]["code"], "invalid_token", "{body}");
    // A channel token naming ann, on an anonymous connection.
    let mut anon = s.ws(&p.public);
    let anns = common::channel_token(&p.token_secret, "private-a", "ann");
    let refused = subscribe_with(&mut anon, "private-a", &anns);
    assert_eq!(refused["code"], "forbidden", "{refused}");
    // A Pusher sign-in as ann.
    let url = format!("ws://{}/app/{}?protocol=7", s.addr, p.public);
    let (mut pws, socket_id) = common::pusher_connect(&url);
    let refused = signin(&mut pws, &p, &socket_id, r#"{"id":"ann"}"#, &p.token_secret);
    assert_eq!(refused["data"]["code"], 4009, "{refused}");
    // A Pusher presence member naming ann.
    let member = r#"{"user_id":"ann"}"#;
    let sig = common::sign::hmac_hex(
        &p.token_secret,
        &format!("{socket_id}:presence-room:{member}"),
    );
    send_json(
        &mut pws,
        json!({"event": "pusher:subscribe", "data": {"channel": "presence-room",
            "auth": format!("{}:{sig}", p.public), "channel_data": member}}),
    );
    let refused = next_json(&mut pws);
    assert_eq!(refused["event"], "pusher:subscription_error", "{refused}");
    // Others are not blocked.
    let (_, hello) = connect_as(s.addr, &p, &conn_token(&p, "bob", 600));
    assert_eq!(hello["user_id"], "bob");

    let (status, v) = rest(&s, "DELETE", "/api/v1/users/ann/block", &p, "");
    assert!(
        status == 200 || status == 202 || status == 204,
        "{status} {v}"
    );
    common::wait_for(
        Duration::from_secs(3),
        "the unblock to reach the server",
        || upgrade_answer_is_101(&s, &p, &token),
    );
    let (_, hello) = connect_as(s.addr, &p, &token);
    assert_eq!(hello["user_id"], "ann");
}

/// Whether an upgrade with `token` is accepted (the socket is dropped at once).
fn upgrade_answer_is_101(s: &Server, p: &Project, token: &str) -> bool {
    tungstenite::connect(ws_url(s.addr, p, token)).is_ok()
}

/// Open a raw WebSocket with `query` and read its 101 and its `connected` frame.
fn raw_connected(s: &Server, query: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut t = std::net::TcpStream::connect(s.addr).unwrap();
    let req = format!(
        "GET /api/v1/ws?{query} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    t.write_all(req.as_bytes()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("heartbeat_s") {
        let n = t.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 101"));
    t
}

/// The server's RSS (KiB) and CPU time (clock ticks) now.
fn rss_and_cpu(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let cpu = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    (rss, cpu)
}

/// `cargo test --release --test users_identity -- --ignored --nocapture cost` (with
/// `RINGCAST_TEST_BIN=target/release/ringcast`): memory per idle connection and server
/// CPU per connect, without a user and with one (each with its own user and token, so
/// every connect checks a signature), from the same run.
#[test]
#[ignore = "a measurement, not a check: prints the cost of a connection with and without a user"]
fn cost_of_a_connection_with_and_without_a_user() {
    const N: usize = 3000;
    let s = Server::start_with(
        common::Options::config("max_upgrades_per_second = 100000\n").workers(1),
    );
    let p = s.test_project("users-cost");
    let tokens: Vec<String> = (0..N)
        .map(|i| conn_token(&p, &format!("user-{i}"), 3600))
        .collect();
    // Warm the worker's tables up, so both batches grow them alike.
    let warm: Vec<_> = (0..200)
        .map(|_| raw_connected(&s, &format!("key={}", p.public)))
        .collect();
    drop(warm);
    std::thread::sleep(Duration::from_secs(1));
    let mut held = Vec::with_capacity(2 * N);
    let mut rows = Vec::new();
    for with_user in [false, true] {
        let (rss0, cpu0) = rss_and_cpu(s.pid());
        for token in &tokens {
            let query = if with_user {
                format!("key={}&token={token}", p.public)
            } else {
                format!("key={}", p.public)
            };
            held.push(raw_connected(&s, &query));
        }
        std::thread::sleep(Duration::from_millis(500));
        let (rss1, cpu1) = rss_and_cpu(s.pid());
        let bytes = (rss1.saturating_sub(rss0) * 1024) as f64 / N as f64;
        let ticks = (cpu1 - cpu0) as f64 / N as f64;
        rows.push((with_user, bytes, ticks * 10_000.0));
    }
    for (with_user, bytes, us) in rows {
        println!(
            "{:<14} {N} idle connections: {bytes:>7.0} B RSS each, {us:>6.1} µs server CPU per connect",
            if with_user { "with a user" } else { "without a user" }
        );
    }
}
