//! Presence and occupancy across a cluster, black box: a real `redis-server`, two or
//! three `ringcast serve --redis` nodes, tokens signed by an independent JWT library,
//! real WebSocket clients, REST over real sockets. A node is killed with SIGKILL (no
//! clean shutdown) to show that its members and subscriptions go with its lease.

mod common;
use common::cluster as support;
use common::expect_presence;

use std::time::{Duration, Instant};

use common::{expect_silence, next_json, send_json, set_timeout, Ws};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use support::{Node, Project, Redis};

/// A Redis, two nodes on it and a project both know; `None` where [`Redis::start`] is.
fn start() -> Option<(Redis, Node, Node, Project)> {
    let (redis, a, b) = support::two_nodes()?;
    let p = support::project_on(&redis, "p", "10000/s", &[&a, &b]);
    Some((redis, a, b, p))
}

fn join(ws: &mut Ws, p: &Project, channel: &str, user: &str) -> Value {
    let exp = common::unix_now() + 600;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({"channel": channel, "exp": exp, "sub": user, "info": {"u": user}}),
        &EncodingKey::from_secret(p.token_secret.as_bytes()),
    )
    .unwrap();
    send_json(
        ws,
        json!({"type": "subscribe", "channel": channel, "token": token}),
    );
    let v = next_json(ws);
    assert_eq!(v["type"], "subscribed", "{v}");
    v
}

fn users(presence: &Value) -> Vec<&str> {
    common::strs(&presence["members"], "user_id")
}

#[test]
fn members_and_counts_are_cluster_wide() {
    let Some((_redis, a, b, p)) = start() else {
        return;
    };
    let ch = "presence-cluster";

    let mut on_b = b.ws(&p.public);
    let reply = join(&mut on_b, &p, ch, "ub");
    assert_eq!(users(&reply["presence"]), ["ub"]);
    // A member on node A sees node B's member, and B's subscriber hears A's join.
    let mut on_a = a.ws(&p.public);
    let reply = join(&mut on_a, &p, ch, "ua");
    assert_eq!(users(&reply["presence"]), ["ub", "ua"], "{reply}");
    assert_eq!(reply["presence"]["members"][0]["info"], json!({"u": "ub"}));
    expect_presence(&mut on_b, "join", "ua");
    // The same user on the other node is not a second member.
    let mut ua_on_b = b.ws(&p.public);
    let reply = join(&mut ua_on_b, &p, ch, "ua");
    assert_eq!(reply["presence"]["count"], 2, "{reply}");
    expect_silence(&mut on_a, Duration::from_millis(300));

    for node in [&a, &b] {
        let (st, v) = node.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
        assert_eq!(st, 200, "{v}");
        assert_eq!(users(&v), ["ub", "ua"], "{v}");
        let (_, v) = node.get_json(&p.secret, &format!("/api/v1/channels/info?channel={ch}"));
        assert_eq!(
            v,
            json!({"channel": ch, "occupied": true, "subscribers": 3, "user_count": 2})
        );
    }

    // Occupancy of a plain channel held on both nodes.
    let mut n1 = a.ws(&p.public);
    let mut n2 = b.ws(&p.public);
    common::subscribe(&mut n1, "news");
    common::subscribe(&mut n2, "news");
    let (_, v) = b.get_json(&p.secret, "/api/v1/channels?prefix=ne");
    assert_eq!(v, json!({"channels": [{"name": "news", "subscribers": 2}]}));

    // ua leaves node B: still a member through node A. Then from A: gone everywhere.
    drop(ua_on_b);
    expect_silence(&mut on_b, Duration::from_millis(300));
    drop(on_a);
    expect_presence(&mut on_b, "leave", "ua");
    support::wait_for("ua's leave to reach Redis", || {
        let (_, v) = b.get_json(&p.secret, &format!("/api/v1/presence?channel={ch}"));
        users(&v) == ["ub"]
    });
}

/// A member "watcher" of `presence-<user>` on node `a`, and a member `user` on node `b`,
/// whose join the watcher has seen: (watcher, member).
fn watched_member((a, b): (&Node, &Node), p: &Project, user: &str) -> (Ws, Ws) {
    let ch = &format!("presence-{user}");
    let mut watcher = a.ws(&p.public);
    join(&mut watcher, p, ch, "watcher");
    let mut member = b.ws(&p.public);
    join(&mut member, p, ch, user);
    expect_presence(&mut watcher, "join", user);
    (watcher, member)
}

#[test]
fn a_killed_nodes_members_and_subscribers_are_gone_within_30_s() {
    let Some((_redis, a, mut b, p)) = start() else {
        return;
    };
    let (mut watcher, doomed) = watched_member((&a, &b), &p, "doomed");
    let plain = b.ws_on(&p.public, "only-on-b");
    support::wait_for("b's subscriber to be counted", || {
        let (_, v) = a.get_json(&p.secret, "/api/v1/channels/info?channel=only-on-b");
        v["subscribers"] == 1
    });

    // SIGKILL: no clean shutdown, nothing said to anyone.
    let _ = b.child.kill();
    let _ = b.child.wait();
    let killed = Instant::now();
    set_timeout(&mut watcher, Duration::from_secs(35));
    expect_presence(&mut watcher, "leave", "doomed");
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let (_, v) = a.get_json(&p.secret, "/api/v1/channels/info?channel=only-on-b");
    assert_eq!(
        v,
        json!({"channel": "only-on-b", "occupied": false, "subscribers": 0})
    );
    let (_, v) = a.get_json(&p.secret, "/api/v1/presence?channel=presence-doomed");
    assert_eq!(users(&v), ["watcher"]);
    drop(doomed);
    drop(plain);
}

#[test]
fn a_node_shutting_down_hands_its_members_back_at_once() {
    let Some((_redis, a, mut b, p)) = start() else {
        return;
    };
    let (mut watcher, leaving) = watched_member((&a, &b), &p, "leaving");
    let stopped = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    expect_presence(&mut watcher, "leave", "leaving");
    // Well before the 20 s lease would have lapsed.
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    let _ = b.child.wait();
    drop(leaving);
}
