//! Idempotent publish on a single node (contract 1.3, "Idempotent publish"), black box:
//! the real binary, raw HTTP requests carrying `Idempotency-Key`, real WebSocket
//! subscribers counting what is delivered, Pusher requests signed here (RustCrypto
//! HMAC-SHA256 and MD5, nothing from src/), the real metrics endpoint.
//!
//! Keys are spread over the server's two workers on purpose (several keys per test):
//! a key's entry lives on the worker a hash picks, so most tests cross workers.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// POST `body` to `path` with `key` and, if given, `Idempotency-Key: idem`.
fn post(s: &Server, path: &str, key: &str, idem: Option<&str>, body: &str) -> (u16, String, Value) {
    let headers: Vec<(&str, &str)> = idem.map(|k| ("Idempotency-Key", k)).into_iter().collect();
    parse_response(&s.raw(post_request_with(path, key, &headers, body).as_bytes()))
}

fn one(channel: &str, data: Value) -> String {
    json!({"channel": channel, "event": "e", "data": data}).to_string()
}

/// The next frame is a marker published now: nothing else was queued before it.
fn expect_next_is_marker(s: &Server, secret: &str, ws: &mut Ws, channel: &str) {
    let (st, _) = s.publish(secret, channel, "marker", json!("m"));
    assert_eq!(st, 202);
    let f = next_json(ws);
    assert_eq!(f["event"], "marker", "delivered before the marker: {f}");
}

#[test]
fn the_same_key_and_body_twice_is_delivered_once_with_the_same_answer() {
    let s = Server::start();
    let p = s.project("idem", "1000/s");
    let mut ws = s.ws_on(&p.public, "c");
    // Eight keys: both workers own some, so the claim crosses workers for some of them.
    for i in 0..8 {
        let key = format!("order-{i}");
        let body = one("c", json!({"n": i}));
        let (st, head, first) = post(&s, "/api/v1/publish", &p.secret, Some(&key), &body);
        assert_eq!(st, 202, "{first}");
        assert!(!replayed(&head), "a first request is not a replay: {head}");
        let (st, head2, again) = post(&s, "/api/v1/publish", &p.secret, Some(&key), &body);
        assert_eq!(st, 202, "{again}");
        assert_eq!(again, first, "the retry gets the same answer (same id)");
        assert!(replayed(&head2), "the retry says it is a replay: {head2}");
        // A replay spends no quota: as much remains as after the first request (or
        // more: the bucket refills).
        let remaining =
            |h: &str| -> u64 { header(h, "RateLimit-Remaining").unwrap().parse().unwrap() };
        assert!(remaining(&head2) >= remaining(&head), "{head} / {head2}");
        let f = next_json(&mut ws);
        assert_eq!(f["id"], first["id"], "{f}");
        assert_eq!(f["data"]["n"], i);
    }
    expect_next_is_marker(&s, &p.secret, &mut ws, "c");
}

#[test]
fn after_the_window_the_same_key_publishes_again() {
    let s = Server::start_with(Options::config("idempotency_window_s = 1\n"));
    let p = s.project("window", "1000/s");
    let mut ws = s.ws_on(&p.public, "w");
    let body = one("w", json!("x"));
    let (st, _, first) = post(&s, "/api/v1/publish", &p.secret, Some("k"), &body);
    assert_eq!(st, 202);
    let (_, head, again) = post(&s, "/api/v1/publish", &p.secret, Some("k"), &body);
    assert!(
        replayed(&head) && again == first,
        "within the window: a replay"
    );
    assert_eq!(next_json(&mut ws)["id"], first["id"]);
    // Poll until the key is forgotten: that request is processed as a new one.
    let mut second = Value::Null;
    wait_for(Duration::from_secs(5), "the window to end", || {
        let (st, head, v) = post(&s, "/api/v1/publish", &p.secret, Some("k"), &body);
        assert_eq!(st, 202, "{v}");
        second = v;
        !replayed(&head)
    });
    assert_ne!(second["id"], first["id"], "a new publish, a new id");
    assert_eq!(next_json(&mut ws)["id"], second["id"]);
    expect_next_is_marker(&s, &p.secret, &mut ws, "w");
}

#[test]
fn the_same_key_with_another_body_is_422_and_publishes_nothing() {
    let s = Server::start();
    let p = s.project("reuse", "1000/s");
    let mut ws = s.ws_on(&p.public, "r");
    for i in 0..4 {
        let key = format!("k{i}");
        let (st, _, first) = post(
            &s,
            "/api/v1/publish",
            &p.secret,
            Some(&key),
            &one("r", json!("1")),
        );
        assert_eq!(st, 202);
        assert_eq!(next_json(&mut ws)["id"], first["id"]);
        let (st, head, v) = post(
            &s,
            "/api/v1/publish",
            &p.secret,
            Some(&key),
            &one("r", json!("2")),
        );
        assert_eq!(st, 422, "{v}");
        assert_eq!(v["error"]["code"], "idempotency_key_reused");
        assert!(!replayed(&head));
        // Even a body that means the same JSON differently: the bytes decide.
        let spaced = one("r", json!("1")).replace(',', ", ");
        let (st, _, _) = post(&s, "/api/v1/publish", &p.secret, Some(&key), &spaced);
        assert_eq!(st, 422);
        // The key still answers its first request.
        let (st, head, v) = post(
            &s,
            "/api/v1/publish",
            &p.secret,
            Some(&key),
            &one("r", json!("1")),
        );
        assert_eq!((st, replayed(&head)), (202, true));
        assert_eq!(v, first);
    }
    expect_next_is_marker(&s, &p.secret, &mut ws, "r");
}

#[test]
fn racing_duplicates_are_delivered_once_and_the_others_replayed_or_409() {
    let s = Server::start();
    let p = s.project("race", "100000/s");
    let mut ws = s.ws_on(&p.public, "race");
    for round in 0..4 {
        let key = format!("race-{round}");
        let body = one("race", json!({"round": round}));
        let n = 16;
        let barrier = Arc::new(Barrier::new(n));
        let s = &s;
        let answers: Vec<(u16, String, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let (barrier, body, key, secret) =
                        (barrier.clone(), body.clone(), key.clone(), p.secret.clone());
                    scope.spawn(move || {
                        barrier.wait();
                        post(s, "/api/v1/publish", &secret, Some(&key), &body)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let fresh: Vec<_> = answers
            .iter()
            .filter(|(st, head, _)| *st == 202 && !replayed(head))
            .collect();
        assert_eq!(fresh.len(), 1, "exactly one request publishes: {answers:?}");
        let id = &fresh[0].2["id"];
        for (st, head, v) in &answers {
            match st {
                202 => assert_eq!(&v["id"], id, "every 202 is the same answer"),
                409 => {
                    assert_eq!(v["error"]["code"], "idempotency_key_in_progress");
                    assert_eq!(header(head, "Retry-After").as_deref(), Some("1"));
                }
                other => panic!("unexpected {other}: {v}"),
            }
        }
        let f = next_json(&mut ws);
        assert_eq!(&f["id"], id);
    }
    expect_next_is_marker(&s, &p.secret, &mut ws, "race");
}

#[test]
fn a_refused_request_leaves_the_key_free() {
    let s = Server::start();
    // A burst of 3: a batch of 4 messages can never be afforded (429, nothing spent).
    let p = s.project("refused", "3/s");
    let mut ws = s.ws_on(&p.public, "f");
    // 400 first (no event), then the fixed request with the same key: processed.
    let bad = json!({"channel": "f", "data": "no event"}).to_string();
    let (st, _, v) = post(&s, "/api/v1/publish", &p.secret, Some("k400"), &bad);
    assert_eq!(st, 400, "{v}");
    let (st, head, v) = post(
        &s,
        "/api/v1/publish",
        &p.secret,
        Some("k400"),
        &one("f", json!("1")),
    );
    assert_eq!((st, replayed(&head)), (202, false), "{v}");
    assert_eq!(next_json(&mut ws)["id"], v["id"]);
    // 429 first, then a request the quota affords, with the same key: processed.
    let msgs: Vec<Value> = (0..4)
        .map(|i| json!({"channel": "f", "event": "e", "data": i.to_string()}))
        .collect();
    let big = json!({ "messages": msgs }).to_string();
    let (st, _, v) = post(&s, "/api/v1/publish/batch", &p.secret, Some("k429"), &big);
    assert_eq!(st, 429, "{v}");
    let small = json!({"messages": [{"channel": "f", "event": "e", "data": "s"}]}).to_string();
    let mut answer = Value::Null;
    wait_for(Duration::from_secs(5), "the quota to refill", || {
        let (st, head, v) = post(&s, "/api/v1/publish/batch", &p.secret, Some("k429"), &small);
        assert!(!replayed(&head));
        answer = v;
        st == 202
    });
    assert_eq!(next_json(&mut ws)["id"], answer["ids"][0]);
    // 401 (a wrong key) leaves it free as well.
    let (st, _, _) = post(
        &s,
        "/api/v1/publish",
        "sk_wrong",
        Some("k401"),
        &one("f", json!("3")),
    );
    assert_eq!(st, 401);
    let mut answer = Value::Null;
    wait_for(Duration::from_secs(5), "the quota to refill", || {
        let (st, head, v) = post(
            &s,
            "/api/v1/publish",
            &p.secret,
            Some("k401"),
            &one("f", json!("3")),
        );
        assert!(!replayed(&head));
        answer = v;
        st == 202
    });
    assert_eq!(next_json(&mut ws)["id"], answer["id"]);
}

#[test]
fn invalid_keys_are_refused_with_400_and_nothing_published() {
    let s = Server::start();
    let p = s.project("invalid", "1000/s");
    let mut ws = s.ws_on(&p.public, "i");
    let body = one("i", json!("1"));
    let long = "x".repeat(256);
    for key in [long.as_str(), "tab\there", "caf\u{e9}"] {
        let (st, _, v) = post(&s, "/api/v1/publish", &p.secret, Some(key), &body);
        assert_eq!(st, 400, "{key:?}: {v}");
        assert_eq!(v["error"]["code"], "invalid_idempotency_key");
    }
    // Empty, and given twice.
    for extra in [
        "Idempotency-Key:\r\n",
        "Idempotency-Key: a\r\nIdempotency-Key: a\r\n",
    ] {
        let req = format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\n{extra}Content-Type: application/json\r\n\r\n{body}",
            body.len(),
            p.secret
        );
        let (st, _, v) = parse_response(&s.raw(req.as_bytes()));
        assert_eq!(st, 400, "{extra:?}: {v}");
        assert_eq!(v["error"]["code"], "invalid_idempotency_key");
    }
    // 255 printable characters, spaces and punctuation included, are a key.
    let max = format!("a b!~{}", "z".repeat(250));
    let (st, _, v) = post(&s, "/api/v1/publish", &p.secret, Some(&max), &body);
    assert_eq!(st, 202, "{v}");
    assert_eq!(next_json(&mut ws)["id"], v["id"]);
    expect_next_is_marker(&s, &p.secret, &mut ws, "i");
}

#[test]
fn one_key_covers_a_whole_batch_and_a_multi_channel_publish() {
    let s = Server::start();
    let p = s.project("batchkey", "1000/s");
    let mut ws = s.ws_on(&p.public, "a");
    subscribe(&mut ws, "b");
    let msgs: Vec<Value> = (0..3)
        .map(|i| json!({"channel": if i == 1 { "b" } else { "a" }, "event": "e", "data": i.to_string()}))
        .collect();
    let body = json!({ "messages": msgs }).to_string();
    let (st, _, first) = post(
        &s,
        "/api/v1/publish/batch",
        &p.secret,
        Some("batch-1"),
        &body,
    );
    assert_eq!(st, 202, "{first}");
    let (st, head, again) = post(
        &s,
        "/api/v1/publish/batch",
        &p.secret,
        Some("batch-1"),
        &body,
    );
    assert_eq!((st, replayed(&head)), (202, true));
    assert_eq!(again, first, "the same ids, in order");
    for i in 0..3 {
        assert_eq!(next_json(&mut ws)["id"], first["ids"][i]);
    }
    let multi = json!({"channels": ["a", "b"], "event": "e", "data": "m"}).to_string();
    let (st, _, first) = post(&s, "/api/v1/publish", &p.secret, Some("multi-1"), &multi);
    assert_eq!(st, 202);
    let (st, head, again) = post(&s, "/api/v1/publish", &p.secret, Some("multi-1"), &multi);
    assert_eq!((st, replayed(&head), &again), (202, true, &first));
    assert_eq!(next_json(&mut ws)["id"], first["id"]);
    assert_eq!(next_json(&mut ws)["id"], first["id"]);
    expect_next_is_marker(&s, &p.secret, &mut ws, "a");
}

/// A signed Pusher REST POST with `Idempotency-Key: idem`.
fn pusher_post(
    s: &Server,
    app: &Value,
    path: &str,
    idem: &str,
    body: &str,
) -> (u16, String, Value) {
    let app_id = app["project"]["pusher_app_id"].as_str().unwrap();
    let key = app["public_key"].as_str().unwrap();
    let secret = app["token_secret"].as_str().unwrap();
    let path = format!("/apps/{app_id}{path}");
    let ts = common::unix_now();
    let query = format!(
        "auth_key={key}&auth_timestamp={ts}&auth_version=1.0&body_md5={}",
        sign::md5_hex(body.as_bytes())
    );
    let sig = sign::hmac_hex(secret, &format!("POST\n{path}\n{query}"));
    let req = format!(
        "POST {path}?{query}&auth_signature={sig} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\nContent-Type: application/json\r\nIdempotency-Key: {idem}\r\n\r\n{body}",
        body.len()
    );
    parse_response(&s.raw(req.as_bytes()))
}

#[test]
fn pusher_events_and_batch_events_take_a_key_too() {
    let s = Server::start();
    let app = cli(
        &s.data_dir,
        &["project", "create", "pusher", "--rate-limit", "1000/s"],
    );
    let secret = app["secret_key"].as_str().unwrap().to_string();
    s.wait_key(&secret);
    let mut ws = s.ws(app["public_key"].as_str().unwrap());
    subscribe(&mut ws, "p");
    let body = json!({"name": "ev", "channel": "p", "data": "{\"n\":1}"}).to_string();
    let (st, head, first) = pusher_post(&s, &app, "/events", "pusher-1", &body);
    assert_eq!((st, replayed(&head)), (200, false), "{first}");
    let (st, head, again) = pusher_post(&s, &app, "/events", "pusher-1", &body);
    assert_eq!((st, replayed(&head), &again), (200, true, &first));
    assert_eq!(next_json(&mut ws)["event"], "ev");
    // The same key on another body: 422, as on the native API.
    let other = json!({"name": "ev", "channel": "p", "data": "2"}).to_string();
    let (st, _, v) = pusher_post(&s, &app, "/events", "pusher-1", &other);
    assert_eq!(st, 422, "{v}");
    let batch = json!({"batch": [
        {"name": "b0", "channel": "p", "data": "0"},
        {"name": "b1", "channel": "p", "data": "1"},
    ]})
    .to_string();
    let (st, _, first) = pusher_post(&s, &app, "/batch_events", "pusher-2", &batch);
    assert_eq!(st, 200, "{first}");
    let (st, head, again) = pusher_post(&s, &app, "/batch_events", "pusher-2", &batch);
    assert_eq!((st, replayed(&head), &again), (200, true, &first));
    assert_eq!(next_json(&mut ws)["event"], "b0");
    assert_eq!(next_json(&mut ws)["event"], "b1");
    expect_next_is_marker(&s, &secret, &mut ws, "p");
}

#[test]
fn over_the_per_project_bound_the_oldest_keys_are_forgotten_and_counted() {
    let s = Server::start_with(Options::config(
        "idempotency_max_keys_per_project = 4\nmetrics_listen = \"127.0.0.1:0\"\n",
    ));
    let p = s.project("bound", "1000/s");
    let mut ws = s.ws_on(&p.public, "m");
    let body = one("m", json!("same body, twenty keys"));
    for i in 0..20 {
        let (st, _, v) = post(
            &s,
            "/api/v1/publish",
            &p.secret,
            Some(&format!("key-{i}")),
            &body,
        );
        assert_eq!(st, 202);
        assert_eq!(next_json(&mut ws)["id"], v["id"]);
    }
    let m = s.scrape();
    let evicted = m["ringcast_idempotency_keys_evicted_total"];
    // At most 4 kept (2 per worker): at least 16 of the 20 forgotten, counted.
    assert!((16.0..=18.0).contains(&evicted), "evicted {evicted}");
    // The newest is remembered; the oldest was forgotten, so its retry publishes again.
    let (st, head, _) = post(&s, "/api/v1/publish", &p.secret, Some("key-19"), &body);
    assert_eq!((st, replayed(&head)), (202, true));
    let (st, head, v) = post(&s, "/api/v1/publish", &p.secret, Some("key-0"), &body);
    assert_eq!((st, replayed(&head)), (202, false));
    assert_eq!(next_json(&mut ws)["id"], v["id"]);
    // 422 and replays are counted too.
    let (st, _, _) = post(
        &s,
        "/api/v1/publish",
        &p.secret,
        Some("key-0"),
        &one("m", json!("0")),
    );
    assert_eq!(st, 422);
    let m = s.scrape();
    assert_eq!(m["ringcast_idempotent_replays_total"], 1.0);
    assert_eq!(m["ringcast_idempotency_key_reused_total"], 1.0);
    assert_eq!(m["ringcast_idempotency_in_progress_total"], 0.0);
    assert_eq!(
        m["ringcast_publish_requests_total{api=\"native\",status=\"422\"}"],
        1.0
    );
    expect_next_is_marker(&s, &p.secret, &mut ws, "m");
}

#[test]
fn the_publish_cli_sends_the_key_and_a_rerun_publishes_nothing() {
    let s = Server::start();
    let p = s.project("cli", "1000/s");
    let mut ws = s.ws_on(&p.public, "cli");
    let base = s.url("");
    let run = || {
        std::process::Command::new(bin())
            .arg("publish")
            .args([
                "--url",
                &base,
                "--key",
                &p.secret,
                "--idempotency-key",
                "cli-1",
            ])
            .args(["cli", "e", "{\"n\":1}"])
            .env_remove("RINGCAST_KEY")
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{first:?}");
    let again = run();
    assert!(again.status.success(), "{again:?}");
    assert_eq!(again.stdout, first.stdout, "the same answer printed");
    assert!(String::from_utf8_lossy(&again.stderr).contains("Idempotent-Replayed"));
    let v: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(next_json(&mut ws)["id"], v["id"]);
    expect_next_is_marker(&s, &p.secret, &mut ws, "cli");
}
