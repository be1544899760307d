//! Presence channels and occupancy, black box: the real binary, tokens signed by an
//! independent JWT library, real WebSocket clients, REST over real sockets.
//!
//! A connection's worker is read from its `connection_id` (the id's worker field), so
//! "another worker" is chosen, never hoped for.

mod common;
use common::expect_presence;
use common::{hs256, unix_now, Project};

use std::time::Duration;

use common::{
    cli, close_code, expect_silence, next_json, parse_response, send_json, set_timeout, Options,
    Server, Ws,
};
use serde_json::{json, Value};

fn token(p: &Project, channel: &str, user: &str) -> String {
    hs256(
        &p.token_secret,
        json!({"channel": channel, "exp": unix_now() + 600, "sub": user, "info": {"name": format!("name of {user}")}}),
    )
}

/// A WebSocket and the worker it landed on (from its connection id).
fn connect(server: &Server, key: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(server.ws_url(key)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    let worker = common::worker_of(hello["connection_id"].as_str().unwrap());
    (ws, worker)
}

/// A connection on a worker other than `not` (or on `same` when asked).
fn connect_on(server: &Server, key: &str, worker: &str, same: bool) -> Ws {
    for _ in 0..200 {
        let (ws, w) = connect(server, key);
        if (w == worker) == same {
            return ws;
        }
    }
    panic!("no connection landed where wanted");
}

fn join(ws: &mut Ws, p: &Project, channel: &str, user: &str) -> Value {
    send_json(
        ws,
        json!({"type": "subscribe", "channel": channel, "token": token(p, channel, user)}),
    );
    next_json(ws)
}

fn users(presence: &Value) -> Vec<&str> {
    common::strs(&presence["members"], "user_id")
}

#[test]
fn a_user_with_two_tabs_joins_once_and_leaves_once() {
    let s = Server::start();
    let p = s.test_project("room");
    let ch = "presence-room";
    let (mut obs, w) = connect(&s, &p.public);
    let reply = join(&mut obs, &p, ch, "observer");
    assert_eq!(reply["type"], "subscribed", "{reply}");
    assert_eq!(reply["presence"]["count"], 1, "{reply}");
    assert_eq!(users(&reply["presence"]), ["observer"]);

    // u1's first tab, on another worker: everyone else hears one join, with its info.
    let mut tab1 = connect_on(&s, &p.public, &w, false);
    let reply = join(&mut tab1, &p, ch, "u1");
    assert_eq!(reply["presence"]["count"], 2, "{reply}");
    assert_eq!(users(&reply["presence"]), ["observer", "u1"], "join order");
    assert_eq!(
        reply["presence"]["members"][1]["info"]["name"],
        "name of u1"
    );
    let j = expect_presence(&mut obs, "join", "u1");
    assert_eq!(j["channel"], ch);
    assert_eq!(j["info"]["name"], "name of u1", "{j}");
    // The joiner does not hear its own join.
    expect_silence(&mut tab1, Duration::from_millis(300));

    // u1's second tab, on the observer's worker: no second join.
    let mut tab2 = connect_on(&s, &p.public, &w, true);
    let reply = join(&mut tab2, &p, ch, "u1");
    assert_eq!(reply["presence"]["count"], 2, "{reply}");
    expect_silence(&mut obs, Duration::from_millis(300));

    // One tab leaves: u1 is still here. The other closes: one leave.
    send_json(&mut tab1, json!({"type": "unsubscribe", "channel": ch}));
    assert_eq!(next_json(&mut tab1)["type"], "unsubscribed");
    expect_silence(&mut obs, Duration::from_millis(300));
    let (st, v) = s.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["count"], 2, "{v}");
    drop(tab2);
    let l = expect_presence(&mut obs, "leave", "u1");
    assert!(l.get("info").is_none(), "{l}");
    let (_, v) = s.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
    assert_eq!(
        v,
        json!({"channel": ch, "count": 1, "members": [{"user_id": "observer", "info": {"name": "name of observer"}}]})
    );
}

#[test]
fn every_way_of_ending_makes_a_leave() {
    let s = Server::start();
    let p = s.test_project("ends");
    let ch = "presence-ends";
    let (mut obs, _) = connect(&s, &p.public);
    assert_eq!(join(&mut obs, &p, ch, "observer")["type"], "subscribed");

    // Unsubscribe.
    let (mut a, _) = connect(&s, &p.public);
    join(&mut a, &p, ch, "by-unsubscribe");
    expect_presence(&mut obs, "join", "by-unsubscribe");
    send_json(&mut a, json!({"type": "unsubscribe", "channel": ch}));
    expect_presence(&mut obs, "leave", "by-unsubscribe");

    // An abrupt close (TCP gone without a close frame).
    let (mut b, _) = connect(&s, &p.public);
    join(&mut b, &p, ch, "by-reset");
    expect_presence(&mut obs, "join", "by-reset");
    drop(b);
    expect_presence(&mut obs, "leave", "by-reset");

    // Token expiry (exp + 5 s of leeway).
    let (mut c, _) = connect(&s, &p.public);
    let short = hs256(
        &p.token_secret,
        json!({"channel": ch, "exp": unix_now() + 1, "sub": "by-expiry"}),
    );
    send_json(
        &mut c,
        json!({"type": "subscribe", "channel": ch, "token": short}),
    );
    assert_eq!(next_json(&mut c)["type"], "subscribed");
    let j = expect_presence(&mut obs, "join", "by-expiry");
    assert!(j.get("info").is_none(), "no info claim, no info: {j}");
    set_timeout(&mut obs, Duration::from_secs(15));
    expect_presence(&mut obs, "leave", "by-expiry");
    let ended = next_json(&mut c);
    assert_eq!(ended["reason"], "token_expired", "{ended}");

    // Revocation of the member's key (the observer uses another one).
    let extra = cli(&s.data_dir, &["key", "create", &p.id, "--kind", "public"]);
    let extra = extra["key"].as_str().unwrap().to_string();
    common::wait_for(Duration::from_secs(5), "the new key to be known", || {
        tungstenite::connect(s.ws_url(&extra)).is_ok()
    });
    let (mut d, _) = connect(&s, &extra);
    join(&mut d, &p, ch, "by-revocation");
    expect_presence(&mut obs, "join", "by-revocation");
    cli(&s.data_dir, &["key", "revoke", &extra]);
    assert_eq!(close_code(&mut d), Some(4001));
    expect_presence(&mut obs, "leave", "by-revocation");

    // Still exactly one member: nothing leaked.
    let (_, v) = s.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
    assert_eq!(v["count"], 1, "{v}");
}

#[test]
fn a_full_channel_refuses_new_users_but_not_new_tabs() {
    let s = Server::start_with(Options::config("max_presence_members = 2\n"));
    let p = s.test_project("full");
    let ch = "presence-full";
    let (mut a, _) = connect(&s, &p.public);
    let (mut b, _) = connect(&s, &p.public);
    assert_eq!(join(&mut a, &p, ch, "u1")["type"], "subscribed");
    assert_eq!(join(&mut b, &p, ch, "u2")["type"], "subscribed");
    expect_presence(&mut a, "join", "u2");
    let (mut c, _) = connect(&s, &p.public);
    let refused = join(&mut c, &p, ch, "u3");
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["code"], "presence_full", "{refused}");
    assert_eq!(refused["channel"], ch, "{refused}");
    expect_silence(&mut a, Duration::from_millis(300));
    // Not subscribed: a publish does not reach it; the connection stays usable.
    let (st, _) = s.publish(&p.secret, ch, "e", json!({"n": 1}));
    assert_eq!(st, 202);
    assert_eq!(next_json(&mut a)["event"], "e");
    expect_silence(&mut c, Duration::from_millis(300));
    // A member's second tab is not a new member.
    let (mut a2, _) = connect(&s, &p.public);
    assert_eq!(join(&mut a2, &p, ch, "u1")["type"], "subscribed");
    // Once u2 leaves, u3 may join (the refused attempt left nothing behind).
    drop(b);
    expect_presence(&mut a, "leave", "u2");
    let reply = join(&mut c, &p, ch, "u3");
    assert_eq!(reply["type"], "subscribed", "{reply}");
    assert_eq!(users(&reply["presence"]), ["u1", "u3"]);
}

#[test]
fn presence_tokens_need_a_user_and_an_object_info() {
    let s = Server::start();
    let p = s.test_project("tokens");
    let ch = "presence-t";
    let (mut ws, _) = connect(&s, &p.public);
    let refused = |ws: &mut Ws, claims: Value| {
        let t = hs256(&p.token_secret, claims);
        send_json(ws, json!({"type": "subscribe", "channel": ch, "token": t}));
        let v = next_json(ws);
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["code"], "forbidden", "{v}");
        v
    };
    let exp = unix_now() + 600;
    let v = refused(&mut ws, json!({"channel": ch, "exp": exp}));
    assert!(v["message"].as_str().unwrap().contains("sub"), "{v}");
    refused(&mut ws, json!({"channel": ch, "exp": exp, "sub": ""}));
    refused(
        &mut ws,
        json!({"channel": ch, "exp": exp, "sub": "x".repeat(129)}),
    );
    let v = refused(
        &mut ws,
        json!({"channel": ch, "exp": exp, "sub": "u", "info": "not an object"}),
    );
    assert!(v["message"].as_str().unwrap().contains("info"), "{v}");
    refused(
        &mut ws,
        json!({"channel": ch, "exp": exp, "sub": "u", "info": {"pad": "x".repeat(1100)}}),
    );
    // No token at all, as for private channels.
    send_json(&mut ws, json!({"type": "subscribe", "channel": ch}));
    assert_eq!(next_json(&mut ws)["code"], "forbidden");
    let (_, v) = s.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
    assert_eq!(v["count"], 0, "{v}");
}

#[test]
fn presence_rest_checks_its_key_and_channel() {
    let s = Server::start();
    let p = s.test_project("rest");
    let (st, v) = s.get_json(&p.secret, "/api/v1/presence?channel=news");
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_field", "{v}");
    let (st, v) = s.get_json(&p.secret, "/api/v1/presence");
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "missing_field", "{v}");
    let (st, _) = s.get_json(&p.public, "/api/v1/presence?channel=presence-x");
    assert_eq!(st, 401);
    let (st, _) = s.get_json("sk_nope", "/api/v1/channels");
    assert_eq!(st, 401);
    let (st, _) = s.get_json(&p.public, "/api/v1/channels/info?channel=x");
    assert_eq!(st, 401);
    let (st, v) = s.get_json(&p.secret, "/api/v1/channels/info");
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.get_json(&p.secret, "/api/v1/presence?channel=presence-nobody");
    assert_eq!(st, 200);
    assert_eq!(
        v,
        json!({"channel": "presence-nobody", "count": 0, "members": []})
    );
    let resp = s.raw(
        format!(
            "POST /api/v1/channels HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            p.secret
        )
        .as_bytes(),
    );
    assert_eq!(parse_response(&resp).0, 405);
}

#[test]
fn occupancy_counts_subscribers_on_every_worker_by_prefix() {
    let s = Server::start();
    let p = s.test_project("occ");
    let other = s.test_project("other");
    let (mut a, w) = connect(&s, &p.public);
    let mut b = connect_on(&s, &p.public, &w, false);
    for ws in [&mut a, &mut b] {
        common::subscribe(ws, "news");
    }
    common::subscribe(&mut a, "news-eu");
    common::subscribe(&mut b, "sport");
    // Another project's channel of the same prefix is not listed.
    let (mut o, _) = connect(&s, &other.public);
    common::subscribe(&mut o, "news-other-project");
    let (st, v) = s.get_json(&p.secret, "/api/v1/channels?prefix=news");
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"channels": [{"name": "news", "subscribers": 2}, {"name": "news-eu", "subscribers": 1}]})
    );
    let (_, v) = s.get_json(&p.secret, "/api/v1/channels");
    let names = common::strs(&v["channels"], "name");
    assert_eq!(names, ["news", "news-eu", "sport"], "sorted by name");
    let (_, v) = s.get_json(&p.secret, "/api/v1/channels/info?channel=news");
    assert_eq!(
        v,
        json!({"channel": "news", "occupied": true, "subscribers": 2})
    );
    // A presence channel adds its distinct users: two tabs of one user.
    let (mut t1, _) = connect(&s, &p.public);
    let (mut t2, _) = connect(&s, &p.public);
    join(&mut t1, &p, "presence-occ", "u1");
    join(&mut t2, &p, "presence-occ", "u1");
    let (_, v) = s.get_json(&p.secret, "/api/v1/channels/info?channel=presence-occ");
    assert_eq!(
        v,
        json!({"channel": "presence-occ", "occupied": true, "subscribers": 2, "user_count": 1})
    );
    // Leaving empties it.
    send_json(&mut a, json!({"type": "unsubscribe", "channel": "news"}));
    assert_eq!(next_json(&mut a)["type"], "unsubscribed");
    drop(b);
    common::wait_for(Duration::from_secs(5), "news to be vacated", || {
        let (_, v) = s.get_json(&p.secret, "/api/v1/channels/info?channel=news");
        v == json!({"channel": "news", "occupied": false, "subscribers": 0})
    });
    let (_, v) = s.get_json(&p.secret, "/api/v1/channels?prefix=news");
    assert_eq!(
        v,
        json!({"channels": [{"name": "news-eu", "subscribers": 1}]})
    );
}

/// A member that stops reading is closed with 4008 (slow consumer) like any subscriber:
/// that is a leave too. The flood goes to a plain channel the observer is not in.
#[test]
fn a_slow_consumer_closed_with_4008_leaves() {
    let s = Server::start_with(Options::config("send_backlog_bytes = 65536\n"));
    let p = s.test_project("slow");
    let ch = "presence-slow";
    let (mut obs, _) = connect(&s, &p.public);
    join(&mut obs, &p, ch, "observer");
    let (mut slow, _) = connect(&s, &p.public);
    assert_eq!(join(&mut slow, &p, ch, "slow")["type"], "subscribed");
    common::subscribe(&mut slow, "flood");
    expect_presence(&mut obs, "join", "slow");
    // Batches of 60 × 16 KB (under the 1 MiB batch body): the loopback socket buffers
    // hold tens of MB before the server's own queue for the slow one grows at all.
    let blob = "x".repeat(16000);
    let messages: Vec<Value> = (0..60)
        .map(|i| json!({"channel": "flood", "event": "e", "data": {"i": i, "pad": blob}}))
        .collect();
    let body = json!({ "messages": messages }).to_string();
    let req = format!(
        "POST /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len(),
        p.secret
    );
    let mut left = None;
    for _ in 0..400 {
        let (st, _, v) = parse_response(&s.raw(req.as_bytes()));
        assert_eq!(st, 202, "{v}");
        set_timeout(&mut obs, Duration::from_millis(10));
        if let Ok(tungstenite::Message::Text(t)) = obs.read() {
            left = Some(serde_json::from_str::<Value>(t.as_str()).unwrap());
            break;
        }
    }
    if left.is_none() {
        // The leave comes when the connection ends: up to 10 s after the 4008, while
        // the close frame waits behind the bytes the slow one never read.
        set_timeout(&mut obs, Duration::from_secs(15));
        left = Some(next_json(&mut obs));
    }
    let left = left.expect("the slow member was closed and left");
    assert_eq!(
        (&left["action"], &left["user_id"]),
        (&json!("leave"), &json!("slow")),
        "{left}"
    );
    // The slow one's connection is over (its queued frames, then a 4008 close or a
    // reset once the server gave up on it).
    set_timeout(&mut slow, Duration::from_secs(10));
    let ended = (0..100_000).any(|_| match slow.read() {
        Ok(tungstenite::Message::Close(f)) => {
            assert_eq!(f.map(|f| u16::from(f.code)), Some(4008));
            true
        }
        Ok(_) => false,
        Err(_) => true,
    });
    assert!(ended);
}
