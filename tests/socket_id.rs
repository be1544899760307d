//! Connection ids in Pusher's socket id form, and `socket_id` on the native publish API
//! (Laravel's `toOthers()`): black box, the real binary, real WebSocket clients.

mod common;

use std::time::Duration;

use common::{next_json, set_timeout, subscribe, Server, Ws};
use serde_json::{json, Value};

fn connect(s: &Server, key: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(s.ws_url(key)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    (ws, hello["connection_id"].as_str().unwrap().to_string())
}

fn is_socket_id(s: &str) -> bool {
    match s.split_once('.') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

#[test]
fn connection_ids_have_the_socket_id_form_and_differ() {
    let s = Server::start();
    let p = s.project("ids", "1000/s");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..8 {
        let (_ws, id) = connect(&s, &p.public);
        assert!(is_socket_id(&id), "{id}");
        assert!(seen.insert(id));
    }
}

#[test]
fn a_publish_with_socket_id_leaves_that_connection_out() {
    let s = Server::start();
    let p = s.project("toothers", "1000/s");
    let (mut a, a_id) = connect(&s, &p.public);
    let (mut b, _) = connect(&s, &p.public);
    subscribe(&mut a, "news");
    subscribe(&mut b, "news");
    let body = json!({"channel": "news", "event": "e", "data": {"n": 1}, "socket_id": a_id});
    let (st, _, v) = s.raw_publish(&p.secret, "application/json", body.to_string().as_bytes());
    assert_eq!(st, 202, "{v}");
    assert_eq!(next_json(&mut b)["data"], json!({"n": 1}));
    // `a` gets the next message, not the one it was left out of.
    assert_eq!(s.publish(&p.secret, "news", "e", json!({"n": 2})).0, 202);
    assert_eq!(next_json(&mut a)["data"], json!({"n": 2}));
    assert_eq!(next_json(&mut b)["data"], json!({"n": 2}));

    // Batch: per message.
    let body = json!({"messages": [
        {"channel": "news", "event": "e", "data": {"n": 3}, "socket_id": a_id},
        {"channel": "news", "event": "e", "data": {"n": 4}},
    ]});
    let req = format!(
        "POST /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.to_string().len(),
        p.secret
    );
    let (st, _, v) = common::parse_response(&s.raw(req.as_bytes()));
    assert_eq!(st, 202, "{v}");
    assert_eq!(next_json(&mut a)["data"], json!({"n": 4}));
    assert_eq!(next_json(&mut b)["data"], json!({"n": 3}));
    assert_eq!(next_json(&mut b)["data"], json!({"n": 4}));
}

#[test]
fn a_well_formed_socket_id_of_nobody_excludes_nobody_and_a_malformed_one_is_400() {
    let s = Server::start();
    let p = s.project("nobody", "1000/s");
    let (mut a, _) = connect(&s, &p.public);
    subscribe(&mut a, "news");
    let body = json!({"channel": "news", "event": "e", "data": {}, "socket_id": "1.1"});
    let (st, _, _) = s.raw_publish(&p.secret, "application/json", body.to_string().as_bytes());
    assert_eq!(st, 202);
    assert_eq!(next_json(&mut a)["type"], "message");
    for bad in [
        json!("abc"),
        json!("1.2.3"),
        json!("-1.2"),
        json!(12),
        json!(""),
    ] {
        let body = json!({"channel": "news", "event": "e", "data": {}, "socket_id": bad});
        let (st, _, v): (u16, String, Value) =
            s.raw_publish(&p.secret, "application/json", body.to_string().as_bytes());
        assert_eq!(st, 400, "{bad}: {v}");
        assert_eq!(v["error"]["code"], "invalid_field", "{v}");
    }
}
