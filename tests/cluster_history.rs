//! Cluster-mode history, black box: two real `ringcast serve --redis URL` nodes sharing
//! one real `redis-server` (ephemeral port), real HTTP and WebSocket clients. Offsets
//! and epochs come from Redis, so every node agrees and a client recovers on any node;
//! Redis losing a channel's history is a new epoch (recovered: false), never a gap.
//!
//! Without `redis-server` on the PATH every test prints why and passes, unless
//! `RINGCAST_REQUIRE_TOOLS=1` (CI sets it).

mod common;
use common::cluster as support;
use common::subscribe_since as sub;

use std::time::{Duration, Instant};

use common::{next_json, parse_response, Ws};
use serde_json::{json, Value};
use support::{cli, wait_for, Node, Redis};

/// A project with history `spec`, known to every node.
fn hist_project(redis: &Redis, name: &str, spec: &str, nodes: &[&Node]) -> support::Project {
    support::history_project_on(redis, name, "100000/s", spec, nodes)
}

/// A Redis, two nodes on it and a project with history `spec` both know; `None` where
/// [`Redis::start`] is.
fn history_nodes(name: &str, spec: &str) -> Option<(Redis, Node, Node, support::Project)> {
    let (redis, a, b) = support::two_nodes()?;
    let p = hist_project(&redis, name, spec, &[&a, &b]);
    Some((redis, a, b, p))
}

fn next_msg(ws: &mut Ws) -> Value {
    let v = next_json(ws);
    assert_eq!(v["type"], "message", "{v}");
    v
}

/// Publish one message; the 202 answer's JSON.
fn publish(node: &Node, key: &str, channel: &str, data: Value) -> Value {
    let (st, _, v) = node.publish(key, channel, data);
    assert_eq!(st, 202, "{v}");
    v
}

fn batch(node: &Node, key: &str, channel: &str, datas: &[Value]) -> (u16, Value) {
    let msgs: Vec<Value> = datas
        .iter()
        .map(|d| json!({"channel": channel, "event": "e", "data": d}))
        .collect();
    let body = json!({ "messages": msgs }).to_string();
    let req = common::post_request("/api/v1/publish/batch", key, &body);
    let (st, _, v) = parse_response(&node.raw(req.as_bytes()));
    (st, v)
}

fn history(node: &Node, key: &str, query: &str) -> (u16, Value) {
    let req = common::get_request(&format!("/api/v1/history?{query}"), key);
    let (st, _, v) = parse_response(&node.raw(req.as_bytes()));
    (st, v)
}

#[test]
fn offsets_agree_on_every_node_whichever_node_publishes() {
    let Some((redis, a, b, p)) = history_nodes("agree", "1000/600s") else {
        return;
    };
    let mut subs: Vec<Ws> = Vec::new();
    let mut epoch = String::new();
    for node in [&a, &a, &b, &b] {
        let mut ws = node.ws(&p.public);
        let r = sub(&mut ws, "c", None);
        assert_eq!(r["offset"], 0, "{r}");
        if epoch.is_empty() {
            epoch = r["epoch"].as_str().unwrap().to_string();
        }
        assert_eq!(r["epoch"], epoch.as_str(), "one epoch on every node");
        subs.push(ws);
    }
    // Sequential publishes alternating between the nodes, then a batch via b.
    let mut want = Vec::new();
    for i in 0..30u64 {
        let node = if i % 2 == 0 { &a } else { &b };
        let v = publish(node, &p.secret, "c", json!(i.to_string()));
        assert_eq!(v["offset"], i + 1, "{v}");
        assert_eq!(v["epoch"], epoch.as_str());
        want.push(json!(i.to_string()));
    }
    let datas: Vec<Value> = (30..40).map(|i| json!(i.to_string())).collect();
    let (st, v) = batch(&b, &p.secret, "c", &datas);
    assert_eq!(st, 202, "{v}");
    want.extend(datas);
    for ws in subs.iter_mut() {
        for (i, data) in want.iter().enumerate() {
            let m = next_msg(ws);
            assert_eq!(m["offset"], i as u64 + 1, "{m}");
            assert_eq!(m["epoch"], epoch.as_str());
            assert_eq!(&m["data"], data, "{m}");
        }
    }
    // The setting lives in Redis like the rest of the project.
    let list = cli(&redis, &["project", "list"]);
    assert_eq!(list["projects"][0]["history"], "1000/600s");
    // Both nodes' REST history agree too.
    for node in [&a, &b] {
        let (st, h) = history(node, &p.secret, "channel=c&limit=1000");
        assert_eq!(st, 200, "{h}");
        assert_eq!(h["offset"], 40);
        let offsets: Vec<u64> = h["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["offset"].as_u64().unwrap())
            .collect();
        assert_eq!(offsets, (1..=40).collect::<Vec<_>>());
    }
}

#[test]
fn a_client_recovers_on_another_node_then_continues_live() {
    let Some((_redis, a, b, p)) = history_nodes("move", "100/600s") else {
        return;
    };
    let mut on_a = a.ws(&p.public);
    let r = sub(&mut on_a, "news", None);
    let epoch = r["epoch"].as_str().unwrap().to_string();
    for i in 0..3 {
        publish(&a, &p.secret, "news", json!(format!("seen {i}")));
    }
    let mut last = 0;
    for _ in 0..3 {
        last = next_msg(&mut on_a)["offset"].as_u64().unwrap();
    }
    assert_eq!(last, 3);
    drop(on_a);
    // Missed while away, published through both nodes.
    for i in 0..4 {
        let node = if i % 2 == 0 { &a } else { &b };
        publish(node, &p.secret, "news", json!(format!("missed {i}")));
    }
    let mut on_b = b.ws(&p.public);
    let r = sub(&mut on_b, "news", Some((last, &epoch)));
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(r["offset"], 7);
    assert_eq!(r["epoch"], epoch.as_str());
    for i in 0..4u64 {
        let m = next_msg(&mut on_b);
        assert_eq!(m["offset"], 4 + i, "{m}");
        assert_eq!(m["data"], format!("missed {i}"));
    }
    publish(&a, &p.secret, "news", json!("live"));
    let m = next_msg(&mut on_b);
    assert_eq!(
        (m["offset"].as_u64(), &m["data"]),
        (Some(8), &json!("live"))
    );
    common::expect_silence(&mut on_b, Duration::from_millis(200));
    // A position from the future, or from another epoch: recovered false, no replay.
    for since in [(100, epoch.as_str()), (2, "0badc0de")] {
        let mut w = a.ws(&p.public);
        let r = sub(&mut w, "news", Some(since));
        assert_eq!(r["recovered"], false, "{r}");
        assert_eq!(r["offset"], 8);
        common::expect_silence(&mut w, Duration::from_millis(100));
    }
}

/// Publishers on both nodes run while clients recover on b from older positions: each
/// client sees every offset after its `since` exactly once, in order.
#[test]
fn publishes_racing_the_replay_leave_no_gap_and_no_duplicate() {
    let Some((_redis, a, b, p)) = history_nodes("race", "10000/600s") else {
        return;
    };
    let mut first = b.ws(&p.public);
    let epoch = common::subscribe_epoch(&mut first, "r");
    drop(first);
    for i in 0..20 {
        publish(&a, &p.secret, "r", json!(i.to_string()));
    }
    // Publishers on both nodes run until every client below has recovered and some
    // more publishes followed, so the recoveries overlap them whatever the machine's
    // load.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let publishers: Vec<_> = [a.addr, b.addr]
        .into_iter()
        .map(|addr| {
            let (secret, stop, sent) = (p.secret.clone(), stop.clone(), sent.clone());
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                use std::sync::atomic::Ordering::Relaxed;
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let body = json!({"channel": "r", "event": "e", "data": i.to_string()}).to_string();
                    let req = format!(
                        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nX-Api-Key: {secret}\r\nContent-Type: application/json\r\n\r\n{body}",
                        body.len()
                    );
                    s.write_all(req.as_bytes()).unwrap();
                    let mut buf = [0u8; 4096];
                    let n = s.read(&mut buf).unwrap();
                    assert!(buf[..n].starts_with(b"HTTP/1.1 202"), "{}", String::from_utf8_lossy(&buf[..n]));
                    sent.fetch_add(1, Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let count = || sent.load(std::sync::atomic::Ordering::Relaxed);
    wait_for("publishes under way", || count() >= 20);
    let mut clients = Vec::new();
    for (i, node) in [&b, &a, &b, &a, &b, &a].into_iter().enumerate() {
        let mut ws = node.ws(&p.public);
        let since = (i as u64 * 3).min(20);
        let r = sub(&mut ws, "r", Some((since, &epoch)));
        assert_eq!(r["recovered"], true, "{r}");
        clients.push((ws, since));
    }
    let after = count();
    wait_for("publishes after the recoveries", || count() >= after + 20);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in publishers {
        t.join().unwrap();
    }
    let total = 20 + count();
    for (ws, since) in clients.iter_mut() {
        let mut want = *since + 1;
        while want <= total {
            let m = next_msg(ws);
            assert_eq!(m["offset"], want, "after since {since}: {m}");
            want += 1;
        }
        common::expect_silence(ws, Duration::from_millis(100));
    }
}

#[test]
fn rest_history_on_one_node_reads_what_another_published() {
    let Some((redis, a, b, p)) = history_nodes("rest", "5/600s") else {
        return;
    };
    for i in 1..=8 {
        publish(&a, &p.secret, "h", json!({"n": i, "s": "é\"x"}));
    }
    let (st, h) = history(&b, &p.secret, "channel=h");
    assert_eq!(st, 200, "{h}");
    assert_eq!(h["channel"], "h");
    assert_eq!(h["offset"], 8);
    let msgs = h["messages"].as_array().unwrap();
    let offsets: Vec<u64> = msgs.iter().map(|m| m["offset"].as_u64().unwrap()).collect();
    assert_eq!(
        offsets,
        [4, 5, 6, 7, 8],
        "capped at history_size, oldest first"
    );
    assert_eq!(msgs[0]["data"], json!({"n": 4, "s": "é\"x"}));
    assert_eq!(msgs[0]["event"], "e");
    assert_eq!(msgs[0]["id"].as_str().unwrap().len(), 20);
    let epoch = h["epoch"].as_str().unwrap().to_string();
    let (_, h) = history(
        &b,
        &p.secret,
        &format!("channel=h&since=5&limit=2&epoch={epoch}"),
    );
    let offsets: Vec<u64> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [6, 7]);
    let (_, h) = history(&b, &p.secret, "channel=h&limit=2");
    assert_eq!(h["messages"][0]["offset"], 7, "newest two without since");
    let (st, h) = history(&b, &p.secret, "channel=h&epoch=ffffffff");
    assert_eq!((st, &h["error"]["code"]), (409, &json!("epoch_mismatch")));
    // Redis holds the caps: at most 5 entries, and both keys expire.
    let len = redis.cmd::<redis::Value>(&["XLEN", &format!("ringcast:hs:{}:h", p.id)]);
    assert_eq!(len, redis::Value::Int(5));
    for key in ["hs", "hm"] {
        let ttl = redis.cmd::<redis::Value>(&["TTL", &format!("ringcast:{key}:{}:h", p.id)]);
        assert!(
            matches!(ttl, redis::Value::Int(t) if t > 0 && t <= 1200),
            "{key}: {ttl:?}"
        );
    }
    // Reading a channel with nothing kept makes nothing in Redis (see also
    // tests/hardening_cluster.rs).
    let r = sub(&mut a.ws(&p.public), "never", None);
    assert_eq!(r["offset"], 0);
    let exists = redis.cmd::<redis::Value>(&["EXISTS", &format!("ringcast:hm:{}:never", p.id)]);
    assert_eq!(exists, redis::Value::Int(0));
    let exists = redis.cmd::<redis::Value>(&["EXISTS", &format!("ringcast:hs:{}:never", p.id)]);
    assert_eq!(exists, redis::Value::Int(0));
    // An evicted position cannot be recovered.
    let mut w = a.ws(&p.public);
    let r = sub(&mut w, "h", Some((2, &epoch)));
    assert_eq!(r["recovered"], false, "{r}");
    let r = sub(&mut b.ws(&p.public), "h", Some((3, &epoch)));
    assert_eq!(r["recovered"], true, "offsets 4..8 are all kept: {r}");
}

#[test]
fn lost_history_in_redis_is_a_new_epoch_never_a_gap() {
    let Some((redis, a, b, p)) = history_nodes("lost", "100/600s") else {
        return;
    };
    let mut w = a.ws(&p.public);
    let epoch = common::subscribe_epoch(&mut w, "l");
    for i in 0..3 {
        publish(&a, &p.secret, "l", json!(i.to_string()));
    }
    drop(w);
    // Only the stream is gone (evicted): the epoch stays, the missing messages are
    // detected.
    redis.cmd::<redis::Value>(&["DEL", &format!("ringcast:hs:{}:l", p.id)]);
    let r = sub(&mut b.ws(&p.public), "l", Some((1, &epoch)));
    assert_eq!((&r["recovered"], &r["offset"]), (&json!(false), &json!(3)));
    let r = sub(&mut b.ws(&p.public), "l", Some((3, &epoch)));
    assert_eq!(r["recovered"], true, "nothing was missed: {r}");
    // The whole history is gone (a Redis restart without persistence, expiry): new
    // epoch, offsets from 1 again, and the old position is refused.
    redis.cmd::<redis::Value>(&[
        "DEL",
        &format!("ringcast:hs:{}:l", p.id),
        &format!("ringcast:hm:{}:l", p.id),
    ]);
    let v = publish(&b, &p.secret, "l", json!("after"));
    assert_eq!(v["offset"], 1);
    let fresh = v["epoch"].as_str().unwrap().to_string();
    assert_ne!(fresh, epoch);
    for node in [&a, &b] {
        let r = sub(&mut node.ws(&p.public), "l", Some((3, &epoch)));
        assert_eq!(r["recovered"], false, "{r}");
        assert_eq!((&r["offset"], &r["epoch"]), (&json!(1), &json!(fresh)));
    }
    // A client that saw the fresh epoch at offset 0 recovers the first message.
    let (st, _) = history(&a, &p.secret, "channel=l2");
    assert_eq!(st, 200);
    let (_, h) = history(&a, &p.secret, "channel=l2");
    let e2 = h["epoch"].as_str().unwrap().to_string();
    publish(&b, &p.secret, "l2", json!("first"));
    let mut w = a.ws(&p.public);
    let r = sub(&mut w, "l2", Some((0, &e2)));
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(next_msg(&mut w)["data"], "first");
}

#[test]
fn redis_away_refuses_history_publishes_and_recoveries() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let a = Node::start(&redis);
    let p = hist_project(&redis, "away", "100/600s", &[&a]);
    let mut w = a.ws(&p.public);
    let epoch = common::subscribe_epoch(&mut w, "x");
    publish(&a, &p.secret, "x", json!("1"));
    assert_eq!(next_msg(&mut w)["offset"], 1);
    redis.kill();
    support::wait_health(&a, 503);
    // No offset can be given: 503, nothing delivered (never a message outside the
    // offsets a later recovery relies on).
    let started = Instant::now();
    let (st, _, v) = a.publish(&p.secret, "x", json!("2"));
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["code"], "unavailable");
    assert!(started.elapsed() < Duration::from_secs(5));
    common::expect_silence(&mut w, Duration::from_millis(200));
    let (st, _) = history(&a, &p.secret, "channel=x");
    assert_eq!(st, 503);
    let mut w2 = a.ws(&p.public);
    let r = sub(&mut w2, "x", Some((1, &epoch)));
    assert_eq!(r["recovered"], false, "{r}");
    assert!(r.get("offset").is_none(), "no position without Redis: {r}");
    redis.spawn();
    support::wait_health(&a, 200);
    wait_for("history publishes again", || {
        a.publish(&p.secret, "x", json!("3")).0 == 202
    });
    let r = sub(&mut a.ws(&p.public), "x", Some((1, &epoch)));
    assert_eq!(r["offset"], 2, "{r}");
    assert_eq!(r["recovered"], true, "the snapshot kept the history: {r}");
}

#[test]
fn history_off_in_cluster_mode_behaves_as_on_one_node() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let p = support::project_on(&redis, "plain", "1000/s", &[&a, &b]);
    let mut w = b.ws(&p.public);
    let r = sub(&mut w, "c", Some((3, "abcdabcd")));
    assert_eq!(r["recovered"], false, "{r}");
    assert!(r.get("offset").is_none(), "{r}");
    redis.wait_numsub(&p.id, "c", 1);
    let (st, _, v) = a.publish(&p.secret, "c", json!("x"));
    assert_eq!(st, 202);
    assert!(v.get("offset").is_none(), "{v}");
    let m = next_msg(&mut w);
    assert!(m.get("offset").is_none(), "{m}");
    let (st, h) = history(&a, &p.secret, "channel=c");
    assert_eq!((st, &h["error"]["code"]), (404, &json!("history_off")));
    let keys = redis.cmd::<redis::Value>(&["KEYS", "ringcast:h[ms]:*"]);
    assert_eq!(keys, redis::Value::Array(vec![]), "no history keys");
}

/// Turning history off and on again forgets the project's history in Redis: messages
/// published while it was off are in no stream, so an older position must not recover.
#[test]
fn history_turned_off_and_on_again_is_a_new_epoch() {
    let Some(redis) = Redis::start() else { return };
    let a = Node::start(&redis);
    let p = hist_project(&redis, "toggle", "100/600s", &[&a]);
    let mut w = a.ws(&p.public);
    let epoch = common::subscribe_epoch(&mut w, "t");
    publish(&a, &p.secret, "t", json!("kept"));
    assert_eq!(next_msg(&mut w)["offset"], 1);
    drop(w);
    let v = cli(&redis, &["project", "set-history", &p.id, "0/0s"]);
    assert_eq!(v["project"]["history"], "off");
    wait_for("history off on the node", || {
        history(&a, &p.secret, "channel=t").0 == 404
    });
    publish(&a, &p.secret, "t", json!("unkept"));
    cli(&redis, &["project", "set-history", &p.id, "100/600s"]);
    wait_for("history on again", || {
        history(&a, &p.secret, "channel=t").0 == 200
    });
    let mut w = a.ws(&p.public);
    let r = sub(&mut w, "t", Some((1, &epoch)));
    assert_eq!(r["recovered"], false, "{r}");
    assert_eq!(r["offset"], 0);
    assert_ne!(r["epoch"], epoch.as_str());
}

/// A channel with steady traffic does not hold up a node's new subscriptions: the
/// subscriber thread ends each read round after a few milliseconds even when messages
/// keep arriving (before, it read until a pause in the traffic that never came).
#[test]
fn a_busy_channel_does_not_hold_up_new_subscriptions() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let p = support::project_on(&redis, "busy", "1000000/s", &[&a, &b]);
    let mut busy = b.ws(&p.public);
    sub(&mut busy, "busy", None);
    redis.wait_numsub(&p.id, "busy", 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (addr, secret, stop) = (a.addr, p.secret.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let body = json!({"channel": "busy", "event": "e", "data": "x"}).to_string();
            let req = format!(
                "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nX-Api-Key: {secret}\r\nContent-Type: application/json\r\n\r\n{body}",
                body.len()
            );
            let mut buf = [0u8; 4096];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                s.write_all(req.as_bytes()).unwrap();
                let _ = s.read(&mut buf).unwrap();
            }
        })
    };
    // The busy subscriber must keep reading, or its node closes it (4008).
    common::set_timeout(&mut busy, Duration::from_millis(100));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = busy.read();
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut quiet = b.ws(&p.public);
    sub(&mut quiet, "quiet", None);
    let started = Instant::now();
    redis.wait_numsub(&p.id, "quiet", 1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().unwrap();
    reader.join().unwrap();
}

/// `socket_id` on a history project: the message travels through the publish script
/// to every node (the publishing one included), carrying the connection to leave out,
/// so that one connection, on either node, does not get it, and the others get it with
/// its offset.
#[test]
fn a_socket_id_leaves_its_connection_out_on_a_history_channel() {
    let Some((redis, a, b, p)) = history_nodes("hist-toothers", "100/600s") else {
        return;
    };
    let connect = |node: &Node| {
        let url = format!("ws://{}/api/v1/ws?key={}", node.addr, p.public);
        let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
        common::set_timeout(&mut ws, Duration::from_secs(10));
        let hello = next_json(&mut ws);
        let id = hello["connection_id"].as_str().unwrap().to_string();
        sub(&mut ws, "feed", None);
        (ws, id)
    };
    let (mut on_a, id_a) = connect(&a);
    let (mut on_b, id_b) = connect(&b);
    let (mut other_b, _) = connect(&b);
    redis.wait_numsub(&p.id, "feed", 2);
    let publish = |node: &Node, n: u64, except: &str| {
        let body = json!({"channel": "feed", "event": "e", "data": {"n": n}, "socket_id": except})
            .to_string();
        let req = format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\n\r\n{body}",
            body.len(),
            p.secret
        );
        assert_eq!(parse_response(&node.raw(req.as_bytes())).0, 202);
    };
    // Published on a, leaving out a connection of b, then one of a.
    publish(&a, 1, &id_b);
    publish(&a, 2, &id_a);
    let data = |ws: &mut Ws| {
        let m = next_json(ws);
        assert_eq!(m["type"], "message", "{m}");
        assert!(m["offset"].is_u64(), "{m}");
        m["data"]["n"].as_u64().unwrap()
    };
    assert_eq!(data(&mut on_a), 1);
    assert_eq!(data(&mut on_b), 2);
    assert_eq!(data(&mut other_b), 1);
    assert_eq!(data(&mut other_b), 2);
    common::expect_silence(&mut on_a, Duration::from_millis(300));
    common::expect_silence(&mut on_b, Duration::from_millis(300));
}
