//! Idempotent publish in cluster mode, black box: real `ringcast serve --redis URL`
//! nodes on one real `redis-server` (ephemeral port), raw HTTP requests with
//! `Idempotency-Key`, WebSocket subscribers on every node counting deliveries. A retry
//! on another node is answered from Redis; a history publish whose Redis answer was
//! lost (a TCP proxy between one node and Redis swallows Redis' replies) answered 503,
//! yet the script ran: the retry answers its original offset and nothing is delivered
//! twice.
//!
//! Without `redis-server` on the PATH every test prints why and passes, unless
//! `RINGCAST_REQUIRE_TOOLS=1` (CI sets it).

mod common;
use common::cluster as support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{next_json, parse_response, replayed, send_json, Ws};
use serde_json::{json, Value};
use support::{wait_for, Node, Redis};

fn post(node: &Node, path: &str, key: &str, idem: &str, body: &str) -> (u16, String, Value) {
    let req = common::post_request_with(path, key, &[("Idempotency-Key", idem)], body);
    parse_response(&node.raw(req.as_bytes()))
}

fn one(channel: &str, data: &str) -> String {
    json!({"channel": channel, "event": "e", "data": data}).to_string()
}

fn project(redis: &Redis, name: &str, history: Option<&str>, nodes: &[&Node]) -> support::Project {
    match history {
        Some(spec) => support::history_project_on(redis, name, "100000/s", spec, nodes),
        None => support::project_on(redis, name, "100000/s", nodes),
    }
}

fn sub(ws: &mut Ws, channel: &str) {
    send_json(ws, json!({"type": "subscribe", "channel": channel}));
    let v = next_json(ws);
    assert_eq!(v["type"], "subscribed", "{v}");
}

/// A marker published now (without a key) is the next frame on every `ws`: nothing
/// else was delivered before it.
fn expect_next_is_marker(node: &Node, secret: &str, channel: &str, wss: &mut [&mut Ws]) {
    let (st, _, v) = node.publish(secret, channel, json!("marker"));
    assert_eq!(st, 202, "{v}");
    for ws in wss {
        let f = next_json(ws);
        assert_eq!(f["data"], "marker", "delivered before the marker: {f}");
    }
}

#[test]
fn a_retry_on_another_node_is_answered_from_redis_and_delivered_once() {
    let Some(redis) = Redis::start() else { return };
    let (a, b) = (Node::start(&redis), Node::start(&redis));
    for history in [None, Some("100/600s")] {
        let name = if history.is_some() { "hist" } else { "plain" };
        let p = project(&redis, name, history, &[&a, &b]);
        let (mut wa, mut wb) = (a.ws(&p.public), b.ws(&p.public));
        sub(&mut wa, "c");
        sub(&mut wb, "c");
        redis.wait_numsub(&p.id, "c", 2);
        for i in 0..3 {
            let key = format!("{name}-{i}");
            let body = one("c", &format!("m{i}"));
            let (st, head, first) = post(&a, "/api/v1/publish", &p.secret, &key, &body);
            assert_eq!((st, replayed(&head)), (202, false), "{first}");
            assert_eq!(first.get("offset").is_some(), history.is_some(), "{first}");
            let (st, head, again) = post(&b, "/api/v1/publish", &p.secret, &key, &body);
            assert_eq!((st, replayed(&head)), (202, true), "{again}");
            assert_eq!(
                again, first,
                "the same id (and offset, epoch) on the other node"
            );
            // And on the first node again.
            let (_, head, third) = post(&a, "/api/v1/publish", &p.secret, &key, &body);
            assert!(replayed(&head) && third == first);
            for ws in [&mut wa, &mut wb] {
                let f = next_json(ws);
                assert_eq!(f["id"], first["id"], "{f}");
                if history.is_some() {
                    assert_eq!(f["offset"], first["offset"]);
                }
            }
            // Another body with the key, on either node: 422, nothing delivered.
            let (st, _, v) = post(&b, "/api/v1/publish", &p.secret, &key, &one("c", "other"));
            assert_eq!(st, 422, "{v}");
            assert_eq!(v["error"]["code"], "idempotency_key_reused");
        }
        // A batch: one key for all of it.
        let msgs: Vec<Value> = (0..3)
            .map(|i| json!({"channel": "c", "event": "e", "data": format!("b{i}")}))
            .collect();
        let body = json!({ "messages": msgs }).to_string();
        let (st, _, first) = post(&b, "/api/v1/publish/batch", &p.secret, "batch", &body);
        assert_eq!(st, 202, "{first}");
        let (st, head, again) = post(&a, "/api/v1/publish/batch", &p.secret, "batch", &body);
        assert_eq!((st, replayed(&head), &again), (202, true, &first));
        for ws in [&mut wa, &mut wb] {
            for i in 0..3 {
                assert_eq!(next_json(ws)["id"], first["ids"][i]);
            }
        }
        expect_next_is_marker(&a, &p.secret, "c", &mut [&mut wa, &mut wb]);
    }
}

#[test]
fn racing_duplicates_on_two_nodes_are_delivered_once() {
    let Some(redis) = Redis::start() else { return };
    let (a, b) = (Node::start(&redis), Node::start(&redis));
    let p = project(&redis, "race", None, &[&a, &b]);
    let mut ws = a.ws(&p.public);
    sub(&mut ws, "r");
    redis.wait_numsub(&p.id, "r", 1);
    let body = one("r", "once");
    let answers: Vec<(u16, String, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let (node, body, secret) = (if i % 2 == 0 { &a } else { &b }, &body, &p.secret);
                scope.spawn(move || post(node, "/api/v1/publish", secret, "race", body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let fresh = answers
        .iter()
        .filter(|(st, h, _)| *st == 202 && !replayed(h))
        .count();
    assert_eq!(fresh, 1, "{answers:?}");
    let id = &answers.iter().find(|a| a.0 == 202).unwrap().2["id"];
    for (st, _, v) in &answers {
        assert!(*st == 202 && &v["id"] == id || *st == 409, "{st} {v}");
    }
    assert_eq!(&next_json(&mut ws)["id"], id);
    expect_next_is_marker(&a, &p.secret, "r", &mut [&mut ws]);
}

/// A TCP proxy to Redis that, while `swallow` is set, forwards requests but drops
/// Redis' replies: the node's call times out after Redis ran it.
struct Proxy {
    port: u16,
    swallow: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(redis_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let swallow = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (sw, st) = (swallow.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)) else {
                    continue;
                };
                let pipe =
                    |mut from: TcpStream, mut to: TcpStream, drop_if: Option<Arc<AtomicBool>>| {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if drop_if.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
                                        continue;
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client, server, None));
                let sw = sw.clone();
                std::thread::spawn(move || pipe(s2, c2, Some(sw)));
            }
        });
        Proxy {
            port,
            swallow,
            stop,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A node whose Redis is at `port` (the proxy, or Redis itself), with `env` added.
fn node_via(redis: &Redis, port: u16, env: &[(&str, &str)]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis://127.0.0.1:{port}/");
    let mut cmd = support::node_command(&dir, &url, &redis.master_key_file(), 2);
    cmd.env("RUST_LOG", "error").envs(env.iter().copied());
    Node::launch(&mut cmd, dir)
}

#[test]
fn a_history_publish_whose_redis_answer_was_lost_is_delivered_once_and_the_retry_answers_its_offset(
) {
    let Some(redis) = Redis::start() else { return };
    let proxy = Proxy::start(redis.port);
    let a = node_via(&redis, proxy.port, &[]);
    let b = Node::start(&redis);
    let p = project(&redis, "lost", Some("100/600s"), &[&a, &b]);
    let mut wb = b.ws(&p.public);
    sub(&mut wb, "h");
    redis.wait_numsub(&p.id, "h", 1);
    // A keyed publish first: Redis then knows the script (a node calls it by its SHA1
    // and loads it on the first NOSCRIPT, which would be the answer swallowed below).
    let (st, _, v) = post(
        &a,
        "/api/v1/publish",
        &p.secret,
        "warm",
        &one("h", "before"),
    );
    assert_eq!(st, 202, "{v}");
    assert_eq!(next_json(&mut wb)["offset"], 1);

    // Redis runs the script; its answer never reaches node A, which answers 503.
    proxy.swallow.store(true, Ordering::Relaxed);
    let body = one("h", "lost answer");
    let (st, _, v) = post(&a, "/api/v1/publish", &p.secret, "lost-1", &body);
    assert_eq!(st, 503, "{v}");
    let delivered = next_json(&mut wb);
    assert_eq!(
        delivered["data"], "lost answer",
        "the script did run: {delivered}"
    );
    assert_eq!(delivered["offset"], 2);
    proxy.swallow.store(false, Ordering::Relaxed);

    // The retry (once A is connected again) is answered from Redis: the original id
    // and offset, marked as a replay, and delivered nowhere again.
    let mut retry = (0, String::new(), Value::Null);
    wait_for("node A to reach Redis again", || {
        retry = post(&a, "/api/v1/publish", &p.secret, "lost-1", &body);
        retry.0 != 503
    });
    let (st, head, again) = retry;
    assert_eq!((st, replayed(&head)), (202, true), "{again}");
    assert_eq!(again["id"], delivered["id"]);
    assert_eq!(again["offset"], 2);
    assert_eq!(again["epoch"], delivered["epoch"]);
    // On node B as well.
    let (st, head, on_b) = post(&b, "/api/v1/publish", &p.secret, "lost-1", &body);
    assert_eq!((st, replayed(&head), &on_b), (202, true, &again));
    let (st, _, v) = b.publish(&p.secret, "h", json!("marker"));
    assert_eq!(st, 202, "{v}");
    let f = next_json(&mut wb);
    assert_eq!(
        (f["data"].clone(), f["offset"].clone()),
        (json!("marker"), json!(3)),
        "{f}"
    );
}

#[test]
fn over_the_per_project_bound_redis_forgets_the_oldest_keys() {
    let Some(redis) = Redis::start() else { return };
    let bound = [("RINGCAST_IDEMPOTENCY_MAX_KEYS_PER_PROJECT", "3")];
    let a = node_via(&redis, redis.port, &bound);
    let p = project(&redis, "bound", None, &[&a]);
    let body = one("b", "x");
    let mut first = Vec::new();
    for i in 0..6 {
        let (st, head, v) = post(&a, "/api/v1/publish", &p.secret, &format!("k{i}"), &body);
        assert_eq!((st, replayed(&head)), (202, false), "{v}");
        first.push(v);
    }
    let mut c = redis.conn().unwrap();
    let order = format!("ringcast:idemz:{{{}}}", p.id);
    let kept: u64 = redis::cmd("ZCARD").arg(&order).query(&mut c).unwrap();
    assert_eq!(kept, 3, "at most the bound is kept");
    let oldest: u64 = redis::cmd("EXISTS")
        .arg(format!("ringcast:idem:{{{}}}:k0", p.id))
        .query(&mut c)
        .unwrap();
    assert_eq!(oldest, 0, "the oldest key is forgotten");
    // The newest still replays; the oldest publishes again.
    let (st, head, v) = post(&a, "/api/v1/publish", &p.secret, "k5", &body);
    assert_eq!((st, replayed(&head), &v), (202, true, &first[5]));
    let (st, head, v) = post(&a, "/api/v1/publish", &p.secret, "k0", &body);
    assert_eq!((st, replayed(&head)), (202, false));
    assert_ne!(v, first[0]);
}
