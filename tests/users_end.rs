//! Ending a user's access (issue 25, contract 1.3 "Users"), black box: the real binary,
//! its REST endpoints over real sockets, the real CLI on the same data directory, a
//! restart on the same directory, and the Pusher `terminate_connections` call signed
//! here. Cluster mode (a real Redis, two nodes): `users_cluster.rs`.

mod common;
use common::users::{native_as, pusher_as, upgrade_status};

use std::time::Duration;

use common::sign::{hmac_hex, md5_hex};
use common::{cli, parse_response, unix_now, wait_for, Options, Project, Server};
use serde_json::{json, Value};

/// A request with `method`, `path`, the secret key `key` (none when empty) and a body
/// (sent as JSON when not empty, or with `content_type`).
fn request(
    s: &Server,
    method: &str,
    path: &str,
    key: &str,
    body: &str,
    content_type: &str,
) -> (u16, String, Value) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    if !key.is_empty() {
        head.push_str(&format!("X-Api-Key: {key}\r\n"));
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    parse_response(&s.raw(head.as_bytes()))
}

fn post(s: &Server, path: &str, key: &str, body: &str) -> (u16, Value) {
    let ct = if body.is_empty() {
        ""
    } else {
        "application/json"
    };
    let (st, _, v) = request(s, "POST", path, key, body, ct);
    (st, v)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

fn show(s: &Server, p: &Project, user: &str) -> Value {
    let (st, v) = s.get_json(&p.secret, &format!("/api/v1/users/{user}"));
    assert_eq!(st, 200, "{v}");
    v
}

#[test]
fn every_status_of_the_user_endpoints() {
    let s = Server::start();
    let p = s.test_project("users");
    let sk = p.secret.as_str();

    // Disconnect: 202 {}, with no body or with a JSON object.
    assert_eq!(
        post(&s, "/api/v1/users/u1/disconnect", sk, ""),
        (202, json!({}))
    );
    assert_eq!(post(&s, "/api/v1/users/u1/disconnect", sk, "{}").0, 202);
    let (st, v) = post(&s, "/api/v1/users/u1/disconnect", sk, "[1]");
    assert_eq!((st, code(&v)), (400, "invalid_json"), "{v}");
    let (st, v) = post(&s, "/api/v1/users/u1/disconnect", sk, "{");
    assert_eq!((st, code(&v)), (400, "invalid_json"), "{v}");
    let (st, _, v) = request(
        &s,
        "POST",
        "/api/v1/users/u1/disconnect",
        sk,
        "{}",
        "text/plain",
    );
    assert_eq!((st, code(&v)), (415, "unsupported_media_type"), "{v}");

    // Keys: none, a public one, an unknown one.
    for key in ["", p.public.as_str(), "sk_nope"] {
        let (st, v) = post(&s, "/api/v1/users/u1/disconnect", key, "");
        assert_eq!((st, code(&v)), (401, "unauthorized"), "{key}: {v}");
        let (st, v) = s.get_json(key, "/api/v1/users/u1");
        assert_eq!(st, 401, "{key}: {v}");
    }

    // User ids: percent-decoded, 1 to 200 characters, no control characters.
    let v = show(&s, &p, "u%20x%2Fy");
    assert_eq!(v["user_id"], "u x/y", "{v}");
    assert_eq!(v["blocked"], false);
    assert_eq!(v["blocked_until"], Value::Null);
    assert_eq!(v["connections"], 0);
    let long = "é".repeat(200);
    let encoded: String = long.bytes().map(|b| format!("%{b:02X}")).collect();
    assert_eq!(show(&s, &p, &encoded)["user_id"], long.as_str());
    for bad in [
        "x".repeat(201),
        "%zz".into(),
        "a%0Ab".into(),
        String::new(),
        "%FF".into(),
    ] {
        let (st, v) = s.get_json(sk, &format!("/api/v1/users/{bad}"));
        assert_eq!((st, code(&v)), (400, "invalid_field"), "{bad}: {v}");
        let (st, v) = post(&s, &format!("/api/v1/users/{bad}/disconnect"), sk, "");
        assert_eq!(st, 400, "{bad}: {v}");
    }

    // Paths and methods.
    for path in [
        "/api/v1/users/u1/nope",
        "/api/v1/users/u1/block/x",
        "/api/v1/users",
    ] {
        let (st, v) = post(&s, path, sk, "");
        assert_eq!((st, code(&v)), (404, "not_found"), "{path}: {v}");
    }
    let allow = |method: &str, path: &str, want: &str| {
        let (st, head, v) = request(&s, method, path, sk, "", "");
        assert_eq!(st, 405, "{method} {path}: {v}");
        assert_eq!(common::header(&head, "allow").as_deref(), Some(want));
    };
    allow("POST", "/api/v1/users/u1", "GET");
    allow("GET", "/api/v1/users/u1/disconnect", "POST");
    allow("GET", "/api/v1/users/u1/block", "POST, DELETE");
    allow("GET", "/api/v1/channels/unsubscribe", "POST");
    let (st, _, v) = request(&s, "GET", "/api/v1/users/u1", sk, "{}", "application/json");
    assert_eq!((st, code(&v)), (400, "bad_request"), "{v}");

    // Block: the body and `until`.
    let block = |user: &str, body: &str| post(&s, &format!("/api/v1/users/{user}/block"), sk, body);
    let (st, v) = block("u2", "");
    assert_eq!((st, code(&v)), (415, "unsupported_media_type"), "{v}");
    let (st, v) = block("u2", "{}");
    assert_eq!((st, code(&v)), (400, "missing_field"), "{v}");
    for bad in [
        r#"{"until":"soon"}"#,
        r#"{"until":-1}"#,
        r#"{"until":1.5}"#,
        r#"{"until":true}"#,
    ] {
        let (st, v) = block("u2", bad);
        assert_eq!((st, code(&v)), (400, "invalid_field"), "{bad}: {v}");
    }
    let (st, v) = block("u2", r#"{"until":null}"#);
    assert_eq!((st, &v), (202, &json!({})));
    let v = show(&s, &p, "u2");
    assert_eq!(
        (&v["blocked"], &v["blocked_until"]),
        (&json!(true), &Value::Null),
        "{v}"
    );
    let until = unix_now() + 3600;
    assert_eq!(block("u3", &format!(r#"{{"until":{until}}}"#)).0, 202);
    assert_eq!(show(&s, &p, "u3")["blocked_until"], until);
    // A time already past: accepted (the user is disconnected), no block in force.
    assert_eq!(block("u4", r#"{"until":5}"#).0, 202);
    assert_eq!(show(&s, &p, "u4")["blocked"], false);
    // A declared body over max_body_bytes: 413 from the head.
    let huge = format!(
        "POST /api/v1/users/u2/block HTTP/1.1\r\nHost: t\r\nX-Api-Key: {sk}\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\n\r\n"
    );
    let (st, _, v) = parse_response(&s.raw(huge.as_bytes()));
    assert_eq!((st, code(&v)), (413, "payload_too_large"), "{v}");

    // Lift: 202 whether or not there was a block; no body allowed.
    let (st, _, v) = request(&s, "DELETE", "/api/v1/users/u2/block", sk, "", "");
    assert_eq!((st, &v), (202, &json!({})));
    assert_eq!(show(&s, &p, "u2")["blocked"], false);
    assert_eq!(
        request(&s, "DELETE", "/api/v1/users/u2/block", sk, "", "").0,
        202
    );
    let (st, _, _) = request(
        &s,
        "DELETE",
        "/api/v1/users/u2/block",
        sk,
        "{}",
        "application/json",
    );
    assert_eq!(st, 400);

    // Unsubscribe.
    let unsub = |body: &str| post(&s, "/api/v1/channels/unsubscribe", sk, body);
    assert_eq!(
        unsub(r#"{"channel":"news","user_id":"u1"}"#),
        (202, json!({}))
    );
    for (body, want) in [
        (r#"{"user_id":"u1"}"#, "missing_field"),
        (r#"{"channel":"news"}"#, "missing_field"),
        (r#"{"channel":"","user_id":"u1"}"#, "invalid_field"),
        (r#"{"channel":7,"user_id":"u1"}"#, "invalid_field"),
        (r#"{"channel":"news","user_id":""}"#, "invalid_field"),
        (r#"["news"]"#, "invalid_json"),
    ] {
        let (st, v) = unsub(body);
        assert_eq!((st, code(&v)), (400, want), "{body}: {v}");
    }
    let (st, v) = post(&s, "/api/v1/channels/unsubscribe", "", "{}");
    assert_eq!(st, 401, "{v}");
}

#[test]
fn blocks_are_bounded_and_calls_cost_quota() {
    let s = Server::start_with(Options::config("max_blocked_users_per_project = 2\n"));
    let p = s.test_project("bounded");
    let block = |user: &str| {
        post(
            &s,
            &format!("/api/v1/users/{user}/block"),
            &p.secret,
            r#"{"until":null}"#,
        )
    };
    assert_eq!(block("a").0, 202);
    assert_eq!(block("b").0, 202);
    let (st, v) = block("c");
    assert_eq!((st, code(&v)), (409, "too_many_blocks"), "{v}");
    assert_eq!(show(&s, &p, "c")["blocked"], false, "nothing changed");
    assert_eq!(block("b").0, 202, "changing a block is not a new one");
    let lift = request(&s, "DELETE", "/api/v1/users/a/block", &p.secret, "", "");
    assert_eq!(lift.0, 202);
    assert_eq!(block("c").0, 202);

    // One unit of the project's quota per call, as a publish.
    let slow = s.project("slow", "2/min");
    let path = "/api/v1/users/u/disconnect";
    assert_eq!(post(&s, path, &slow.secret, "").0, 202);
    assert_eq!(post(&s, path, &slow.secret, "").0, 202);
    let (st, head, v) = request(&s, "POST", path, &slow.secret, "", "");
    assert_eq!((st, code(&v)), (429, "rate_limited"), "{v}");
    assert!(common::header(&head, "retry-after").is_some(), "{head}");
    let (st, _) = s.publish(&slow.secret, "c", "e", json!({"a": 1}));
    assert_eq!(st, 429, "the same quota");
}

#[test]
fn blocks_survive_a_restart_and_the_cli_shares_them() {
    let mut s = Server::start();
    let p = s.test_project("durable");
    let until = unix_now() + 3600;
    let body = format!(r#"{{"until":{until}}}"#);
    assert_eq!(
        post(&s, "/api/v1/users/rest/block", &p.secret, &body).0,
        202
    );

    // The CLI on the same data directory, while the server runs.
    let v = cli(&s.data_dir, &["user", "block", &p.id, "cli-user"]);
    assert_eq!(
        v,
        json!({"user_id": "cli-user", "blocked": true, "blocked_until": null})
    );
    assert_eq!(show(&s, &p, "cli-user")["blocked"], true);
    let v = cli(&s.data_dir, &["user", "show", &p.id, "rest"]);
    assert_eq!(
        v,
        json!({"user_id": "rest", "blocked": true, "blocked_until": until})
    );
    let v = cli(
        &s.data_dir,
        &["user", "block", &p.id, "brief", "--for", "10m"],
    );
    let brief = v["blocked_until"].as_u64().unwrap();
    assert!(
        brief >= unix_now() + 590 && brief <= unix_now() + 600,
        "{v}"
    );
    let v = cli(&s.data_dir, &["user", "disconnect", &p.id, "someone"]);
    assert_eq!(v, json!({"user_id": "someone", "disconnected": true}));

    s.restart(Options::default());
    s.wait_key(&p.secret);
    assert_eq!(show(&s, &p, "rest")["blocked_until"], until);
    assert_eq!(show(&s, &p, "cli-user")["blocked"], true);
    let v = cli(&s.data_dir, &["user", "unblock", &p.id, "cli-user"]);
    assert_eq!(v, json!({"user_id": "cli-user", "unblocked": true}));
    assert_eq!(show(&s, &p, "cli-user")["blocked"], false);
    let v = cli(&s.data_dir, &["user", "unblock", &p.id, "cli-user"]);
    assert_eq!(v["unblocked"], false);

    // The CLI's refusals: exit non-zero, nothing on stdout.
    for args in [
        vec!["user", "show", "prj_nope", "u"],
        vec!["user", "block", &p.id, "u", "--until", "-5"],
        vec!["user", "block", &p.id, "u", "--for", "forever"],
        vec!["user", "disconnect", &p.id, ""],
    ] {
        let out = std::process::Command::new(common::bin())
            .arg("--data-dir")
            .arg(&s.data_dir)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn require_user_is_a_project_limit() {
    let s = Server::start();
    let p = s.test_project("req");
    let v = cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--require-user", "on"],
    );
    assert_eq!(v["project"]["require_user"], "on", "{v}");
    let v = cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--pusher", "on"],
    );
    assert_eq!(v["project"]["require_user"], "on", "kept: {v}");
    let v = cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--require-user", "off"],
    );
    assert_eq!(v["project"]["require_user"], "off", "{v}");
}

#[test]
fn max_blocked_users_per_project_is_a_knob() {
    let show = |args: &[&str], env: &[(&str, &str)]| -> Value {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(common::bin())
            .arg("--data-dir")
            .arg(dir.path())
            .args(["config", "show"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        if !out.status.success() {
            return json!({"error": String::from_utf8_lossy(&out.stderr)});
        }
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = show(&[], &[]);
    assert_eq!(v["max_blocked_users_per_project"]["value"], 10000, "{v}");
    assert_eq!(v["max_blocked_users_per_project"]["source"], "default");
    let v = show(&["--max-blocked-users-per-project", "5"], &[]);
    assert_eq!(v["max_blocked_users_per_project"]["value"], 5, "{v}");
    assert_eq!(v["max_blocked_users_per_project"]["source"], "flag");
    let v = show(&[], &[("RINGCAST_MAX_BLOCKED_USERS_PER_PROJECT", "7")]);
    assert_eq!(v["max_blocked_users_per_project"]["value"], 7, "{v}");
    assert_eq!(v["max_blocked_users_per_project"]["source"], "env");
    for bad in ["0", "1000001", "many"] {
        let v = show(&["--max-blocked-users-per-project", bad], &[]);
        let err = v["error"].as_str().unwrap_or_default();
        assert!(err.contains("max_blocked_users_per_project"), "{bad}: {v}");
    }
}

/// A Pusher REST POST to `/apps/{app_id}{path}` signed with `secret` (the project's token
/// secret), as the SDKs sign it.
fn pusher_post(
    s: &Server,
    app_id: &str,
    key: &str,
    secret: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let full = format!("/apps/{app_id}{path}");
    let query = format!(
        "auth_key={key}&auth_timestamp={}&auth_version=1.0&body_md5={}",
        unix_now(),
        md5_hex(body.as_bytes())
    );
    let signature = hmac_hex(secret, &format!("POST\n{full}\n{query}"));
    let req = format!(
        "POST {full}?{query}&auth_signature={signature} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (st, _, v) = parse_response(&s.raw(req.as_bytes()));
    (st, v)
}

#[test]
fn pusher_terminate_connections_statuses() {
    let s = Server::start_with(Options::config("metrics_listen = \"127.0.0.1:0\"\n"));
    let p = s.test_project("pusher");
    let before = s.scrape();
    let path = "/users/u%201/terminate_connections";
    let (st, v) = pusher_post(&s, &p.app_id, &p.public, &p.token_secret, path, "{}");
    assert_eq!((st, &v), (200, &json!({})), "{v}");
    // Signed with another secret: 401, nothing done.
    let (st, v) = pusher_post(&s, &p.app_id, &p.public, "wrong", path, "{}");
    assert_eq!(st, 401, "{v}");
    let long = format!("/users/{}/terminate_connections", "x".repeat(201));
    let (st, v) = pusher_post(&s, &p.app_id, &p.public, &p.token_secret, &long, "{}");
    assert_eq!((st, code(&v)), (400, "invalid_field"), "{v}");
    // Over the quota: 403, as Pusher answers it.
    let slow = s.project("slow", "1/min");
    let slow_path = "/users/u/terminate_connections";
    assert_eq!(
        pusher_post(
            &s,
            &slow.app_id,
            &slow.public,
            &slow.token_secret,
            slow_path,
            "{}"
        )
        .0,
        200
    );
    let (st, v) = pusher_post(
        &s,
        &slow.app_id,
        &slow.public,
        &slow.token_secret,
        slow_path,
        "{}",
    );
    assert_eq!((st, code(&v)), (403, "rate_limited"), "{v}");

    // Counted: two terminations that were carried out and one block.
    assert_eq!(
        post(&s, "/api/v1/users/m/block", &p.secret, r#"{"until":null}"#).0,
        202
    );
    let after = s.scrape();
    let delta = |name: &str| {
        after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
    };
    assert_eq!(delta("ringcast_user_blocks_total"), 1.0);
    assert_eq!(
        delta("ringcast_user_disconnects_total"),
        3.0,
        "terminate twice, block once"
    );

    // The Pusher switch off: 403 pusher_disabled.
    cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--pusher", "off"],
    );
    wait_for(Duration::from_secs(3), "the switch", || {
        pusher_post(&s, &p.app_id, &p.public, &p.token_secret, path, "{}").0 == 403
    });
    let (_, v) = pusher_post(&s, &p.app_id, &p.public, &p.token_secret, path, "{}");
    assert_eq!(code(&v), "pusher_disabled", "{v}");
}

/// The next frame is a message of `channel`.
fn expect_message(ws: &mut common::Ws, channel: &str) {
    let v = common::next_json(ws);
    assert_eq!(
        (v["type"].as_str(), v["channel"].as_str()),
        (Some("message"), Some(channel)),
        "{v}"
    );
}

#[test]
fn disconnect_unsubscribe_and_block_reach_the_users_connections() {
    let s = Server::start();
    let p = s.test_project("ends");
    let mut ann1 = native_as(s.addr, &p, "ann");
    let mut ann2 = native_as(s.addr, &p, "ann");
    let mut ann_pusher = pusher_as(s.addr, &p, "ann");
    let mut bob = native_as(s.addr, &p, "bob");
    let mut anon = s.ws(&p.public);
    wait_for(Duration::from_secs(5), "three connections of ann", || {
        show(&s, &p, "ann")["connections"] == 3
    });
    assert_eq!(show(&s, &p, "bob")["connections"], 1);

    // Server-side unsubscribe: ann leaves `news`, bob stays.
    common::subscribe(&mut ann1, "news");
    common::subscribe(&mut bob, "news");
    let body = r#"{"channel":"news","user_id":"ann"}"#;
    assert_eq!(
        post(&s, "/api/v1/channels/unsubscribe", &p.secret, body).0,
        202
    );
    let v = common::next_json(&mut ann1);
    assert_eq!(
        v,
        json!({"type": "unsubscribed", "channel": "news", "reason": "server"})
    );
    assert_eq!(s.publish(&p.secret, "news", "e", json!({"n": 1})).0, 202);
    expect_message(&mut bob, "news");
    common::expect_silence(&mut ann1, Duration::from_millis(300));

    // Disconnect: every connection of ann closes (4010; Pusher's 4009), the others stay.
    assert_eq!(
        post(&s, "/api/v1/users/ann/disconnect", &p.secret, "").0,
        202
    );
    assert_eq!(common::close_code(&mut ann1), Some(4010));
    assert_eq!(common::close_code(&mut ann2), Some(4010));
    assert_eq!(common::close_code(&mut ann_pusher), Some(4009));
    wait_for(Duration::from_secs(5), "ann's count", || {
        show(&s, &p, "ann")["connections"] == 0
    });
    assert_eq!(s.publish(&p.secret, "news", "e", json!({"n": 2})).0, 202);
    expect_message(&mut bob, "news");
    common::subscribe(&mut anon, "news");

    // Block until a few seconds from now (long enough for a loaded machine to check the
    // refusal before it ends): closed, refused until then, then accepted.
    let mut ann = native_as(s.addr, &p, "ann");
    let until = unix_now() + 6;
    assert_eq!(
        post(
            &s,
            "/api/v1/users/ann/block",
            &p.secret,
            &format!(r#"{{"until":{until}}}"#)
        )
        .0,
        202
    );
    assert_eq!(common::close_code(&mut ann), Some(4010));
    assert_eq!(upgrade_status(s.addr, &p, "ann"), 401);
    assert_eq!(upgrade_status(s.addr, &p, "bob"), 101);
    wait_for(Duration::from_secs(10), "the block to end", || {
        upgrade_status(s.addr, &p, "ann") == 101
    });
    assert!(unix_now() >= until);

    // The CLI, with the server running: a disconnect and a block reach it.
    let mut carol = native_as(s.addr, &p, "carol");
    cli(&s.data_dir, &["user", "disconnect", &p.id, "carol"]);
    assert_eq!(common::close_code(&mut carol), Some(4010));
    let mut carol = native_as(s.addr, &p, "carol");
    cli(&s.data_dir, &["user", "block", &p.id, "carol"]);
    assert_eq!(common::close_code(&mut carol), Some(4010));
    wait_for(
        Duration::from_secs(5),
        "the block to reach the server",
        || upgrade_status(s.addr, &p, "carol") == 401,
    );
    cli(&s.data_dir, &["user", "unblock", &p.id, "carol"]);
    wait_for(
        Duration::from_secs(5),
        "the lift to reach the server",
        || upgrade_status(s.addr, &p, "carol") == 101,
    );
    // bob and the anonymous connection never noticed.
    assert_eq!(s.publish(&p.secret, "news", "e", json!({"n": 3})).0, 202);
    expect_message(&mut bob, "news");
    expect_message(&mut anon, "news");
}
