//! Ending a user's access across a cluster (issue 25), black box: a real `redis-server`
//! started here, two `ringcast serve --redis` nodes, real WebSocket clients of both
//! nodes, the CLI against the same Redis. A request to one node reaches the user's
//! connections on the other through the store's end records (the design:
//! `src/cluster/users.rs`); blocks live in Redis.

mod common;
use common::cluster as support;
use common::users::{native_as, pusher_as, upgrade_status};

use common::{close_code, next_json, parse_response, unix_now};
use serde_json::{json, Value};
use support::{Node, Project, Redis};

fn start() -> Option<(Redis, Node, Node, Project)> {
    let (redis, a, b) = support::two_nodes()?;
    let p = support::project_on(&redis, "p", "10000/s", &[&a, &b]);
    Some((redis, a, b, p))
}

fn post(node: &Node, path: &str, key: &str, body: &str) -> (u16, Value) {
    let (st, _, v) = parse_response(&node.raw(common::post_request(path, key, body).as_bytes()));
    (st, v)
}

fn show(node: &Node, p: &Project, user: &str) -> Value {
    let (st, v) = node.get_json(&p.secret, &format!("/api/v1/users/{user}"));
    assert_eq!(st, 200, "{v}");
    v
}

#[test]
fn disconnect_block_and_unsubscribe_reach_every_node() {
    let Some((redis, a, b, p)) = start() else {
        return;
    };
    let mut ann_a = native_as(a.addr, &p, "ann");
    let mut ann_b = native_as(b.addr, &p, "ann");
    let mut bob_b = native_as(b.addr, &p, "bob");
    // `connections` is the node's own count (see src/cluster/users.rs).
    support::wait_for("each node counts its own", || {
        show(&a, &p, "ann")["connections"] == 1 && show(&b, &p, "ann")["connections"] == 1
    });

    // Unsubscribe asked on B reaches ann on A.
    common::subscribe(&mut ann_a, "news");
    common::subscribe(&mut bob_b, "news");
    let body = r#"{"channel":"news","user_id":"ann"}"#;
    assert_eq!(
        post(&b, "/api/v1/channels/unsubscribe", &p.secret, body).0,
        202
    );
    let v = next_json(&mut ann_a);
    assert_eq!(
        v,
        json!({"type": "unsubscribed", "channel": "news", "reason": "server"})
    );

    // Disconnect asked on A closes ann on both nodes, her Pusher connection on B too
    // (4009: pusher-js does not reconnect); bob stays.
    let mut ann_pusher_b = pusher_as(b.addr, &p, "ann");
    assert_eq!(
        post(&a, "/api/v1/users/ann/disconnect", &p.secret, "").0,
        202
    );
    assert_eq!(close_code(&mut ann_a), Some(4010));
    assert_eq!(close_code(&mut ann_b), Some(4010));
    assert_eq!(close_code(&mut ann_pusher_b), Some(4009));
    let (st, _, _) = a.publish(&p.secret, "news", json!({"n": 1}));
    assert_eq!(st, 202);
    let v = next_json(&mut bob_b);
    assert_eq!(v["channel"], "news", "{v}");

    // Block asked on B: ann on A closed, refused on both until `until`, then accepted.
    // `until` leaves a loaded machine time to see the refusal on A (its watcher polls
    // the store every 250 ms) before the block ends.
    let mut ann_a = native_as(a.addr, &p, "ann");
    let until = unix_now() + 6;
    let body = format!(r#"{{"until":{until}}}"#);
    assert_eq!(post(&b, "/api/v1/users/ann/block", &p.secret, &body).0, 202);
    assert_eq!(close_code(&mut ann_a), Some(4010));
    assert_eq!(upgrade_status(b.addr, &p, "ann"), 401);
    support::wait_for("the block to reach A", || {
        upgrade_status(a.addr, &p, "ann") == 401
    });
    assert_eq!(show(&a, &p, "ann")["blocked_until"], until);
    support::wait_for("the block to end", || {
        upgrade_status(a.addr, &p, "ann") == 101 && upgrade_status(b.addr, &p, "ann") == 101
    });

    // The CLI on the same Redis: a disconnect and a block reach both nodes.
    let mut ann_a = native_as(a.addr, &p, "ann");
    let mut ann_b = native_as(b.addr, &p, "ann");
    support::cli(&redis, &["user", "disconnect", &p.id, "ann"]);
    assert_eq!(close_code(&mut ann_a), Some(4010));
    assert_eq!(close_code(&mut ann_b), Some(4010));
    let v = support::cli(&redis, &["user", "block", &p.id, "ann"]);
    assert_eq!(v["blocked"], true);
    support::wait_for("the CLI's block on both", || {
        upgrade_status(a.addr, &p, "ann") == 401 && upgrade_status(b.addr, &p, "ann") == 401
    });
    // Lifted on A over REST: both accept again.
    let lift = format!(
        "DELETE /api/v1/users/ann/block HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Api-Key: {}\r\n\r\n",
        p.secret
    );
    assert_eq!(parse_response(&a.raw(lift.as_bytes())).0, 202);
    support::wait_for("the lift on both", || {
        upgrade_status(a.addr, &p, "ann") == 101 && upgrade_status(b.addr, &p, "ann") == 101
    });
    // bob never noticed.
    let (st, _, _) = b.publish(&p.secret, "news", json!({"n": 2}));
    assert_eq!(st, 202);
    assert_eq!(next_json(&mut bob_b)["channel"], "news");
}

#[test]
fn blocks_in_redis_expire_and_a_lost_store_answers_503() {
    let Some((mut redis, a, _b, p)) = start() else {
        return;
    };
    let cli = |args: &[&str]| support::cli(&redis, args);
    // Long enough for a loaded machine to run two CLI processes and a REST call before
    // the block ends.
    let until = unix_now() + 6;
    let v = cli(&[
        "user",
        "block",
        &p.id,
        "brief",
        "--until",
        &until.to_string(),
    ]);
    assert_eq!(v["blocked_until"], until);
    assert_eq!(cli(&["user", "show", &p.id, "brief"])["blocked"], true);
    assert_eq!(show(&a, &p, "brief")["blocked"], true);
    support::wait_for("the block to expire", || {
        cli(&["user", "show", &p.id, "brief"])["blocked"] == false
    });
    assert_eq!(show(&a, &p, "brief")["blocked"], false);
    assert_eq!(
        cli(&["user", "unblock", &p.id, "brief"])["unblocked"],
        false
    );
    cli(&["user", "block", &p.id, "long"]);
    assert_eq!(cli(&["user", "unblock", &p.id, "long"])["unblocked"], true);
    assert_eq!(cli(&["user", "show", &p.id, "long"])["blocked"], false);

    // The node keeps serving without its store, but cannot store a block: 503.
    redis.kill();
    let (st, v) = post(&a, "/api/v1/users/x/block", &p.secret, r#"{"until":null}"#);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{v}"
    );
}
