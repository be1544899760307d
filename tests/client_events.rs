//! Client events, black box: the real binary, the real CLI (`project set-limits
//! --client-events`), tokens signed by an independent JWT library, real WebSocket
//! clients, and in cluster mode a real `redis-server` and two nodes.
//!
//! A connection's worker is read from its `connection_id` (the id's worker field), so
//! "another worker" is chosen, never hoped for.

mod common;
use common::channel_token as token;
use common::cluster as support;
/// Every project here has its token secret in use.
use common::Project as Private;

use std::time::Duration;

use common::{
    cli, expect_silence, next_json, send_json, set_timeout, wait_for, Options, Server, Ws,
};
use serde_json::{json, Value};

fn project(server: &Server, name: &str, extra: &[&str]) -> Private {
    let mut args = vec!["--rate-limit", "10000/s"];
    args.extend_from_slice(extra);
    let (p, v) = server.project_json(name, &args);
    assert_eq!(v["project"]["client_events"], "off", "off by default: {v}");
    p
}

/// A WebSocket and the worker it landed on (from its connection id).
fn connect(url: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    let worker = common::worker_of(hello["connection_id"].as_str().unwrap());
    (ws, worker)
}

/// Three connections: the sender, a peer on the sender's worker, a peer on another.
fn three_on_two_workers(url: &str) -> (Ws, Ws, Ws) {
    let (sender, w) = connect(url);
    let (mut same, mut other) = (None, None);
    for _ in 0..200 {
        let (ws, worker) = connect(url);
        if worker == w && same.is_none() {
            same = Some(ws);
        } else if worker != w && other.is_none() {
            other = Some(ws);
        }
        if same.is_some() && other.is_some() {
            break;
        }
    }
    (
        sender,
        same.expect("a connection on the sender's worker"),
        other.expect("a connection on another worker"),
    )
}

fn sub_private(ws: &mut Ws, channel: &str, token: &str) {
    send_json(
        ws,
        json!({"type": "subscribe", "channel": channel, "token": token}),
    );
    let reply = next_json(ws);
    assert_eq!(reply["type"], "subscribed", "{reply}");
}

/// Read the presence `join` frames of `users` (in any order): the subscribers that were
/// already in a presence channel hear each later member's join.
fn joins(ws: &mut Ws, users: &[&str]) {
    let mut seen: Vec<String> = (0..users.len())
        .map(|_| {
            let v = next_json(ws);
            assert_eq!(
                (&v["type"], &v["action"]),
                (&json!("presence"), &json!("join")),
                "{v}"
            );
            v["user_id"].as_str().unwrap().to_string()
        })
        .collect();
    seen.sort();
    let mut want: Vec<String> = users.iter().map(|u| u.to_string()).collect();
    want.sort();
    assert_eq!(seen, want);
}

fn event(channel: &str, name: &str, data: Value) -> Value {
    json!({"type": "client_event", "channel": channel, "event": name, "data": data})
}

/// Send a client event and read the error frame it gets.
fn refused(ws: &mut Ws, frame: Value) -> Value {
    let channel = frame["channel"].clone();
    send_json(ws, frame);
    let reply = next_json(ws);
    assert_eq!(reply["type"], "error", "{reply}");
    assert_eq!(reply["channel"], channel, "{reply}");
    reply
}

/// `project set-limits --client-events on` for `p`.
fn events_on(s: &Server, p: &Private) {
    cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--client-events", "on"],
    );
}

/// The next frame on each of `wss` is the client event `event` whose `field` is `value`.
fn expect_event_each(wss: [&mut Ws; 2], event: &str, (field, value): (&str, &str)) {
    for ws in wss {
        let v = next_json(ws);
        assert_eq!(
            (v["event"].as_str(), v[field].as_str()),
            (Some(event), Some(value)),
            "{v}"
        );
    }
}

/// Turn client events on with the CLI, then wait until the server applied it: a probe
/// event is no longer refused (the probe is then delivered to `peers`, read here).
fn turn_on(sender: &mut Ws, peers: &mut [&mut Ws], channel: &str, on_cli: impl FnOnce()) {
    on_cli();
    wait_for(Duration::from_secs(10), "client events to be on", || {
        send_json(sender, event(channel, "client-probe", json!({})));
        set_timeout(sender, Duration::from_millis(300));
        let accepted = match sender.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                assert_eq!(v["code"], "forbidden", "{v}");
                false
            }
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => true, // no answer: relayed
        };
        set_timeout(sender, Duration::from_secs(10));
        accepted
    });
    for p in peers.iter_mut() {
        let v = next_json(p);
        assert_eq!(v["event"], "client-probe", "{v}");
    }
}

#[test]
fn off_by_default_then_relayed_to_others_on_every_worker_never_the_sender() {
    let s = Server::start();
    let p = project(&s, "chat", &[]);
    let ch = "private-room";
    let url = s.ws_url(&p.public);
    let (mut sender, mut same, mut other) = three_on_two_workers(&url);
    for ws in [&mut sender, &mut same, &mut other] {
        sub_private(ws, ch, &token(&p.token_secret, ch, "u1"));
    }

    // Off: forbidden, nothing relayed.
    let r = refused(&mut sender, event(ch, "client-typing", json!({"a": 1})));
    assert_eq!(r["code"], "forbidden", "{r}");
    expect_silence(&mut same, Duration::from_millis(300));
    expect_silence(&mut other, Duration::from_millis(300));

    turn_on(&mut sender, &mut [&mut same, &mut other], ch, || {
        let v = cli(
            &s.data_dir,
            &["project", "set-limits", &p.id, "--client-events", "on"],
        );
        assert_eq!(v["project"]["client_events"], "on", "{v}");
        let list = cli(&s.data_dir, &["project", "list"]);
        assert_eq!(list["projects"][0]["client_events"], "on", "{list}");
    });

    send_json(
        &mut sender,
        event(ch, "client-typing", json!({"a": [1, "x"]})),
    );
    let mut ids = Vec::new();
    for ws in [&mut same, &mut other] {
        let mut v = next_json(ws);
        let id = v.as_object_mut().unwrap().remove("id").expect("an id");
        let id = id.as_str().unwrap().to_string();
        assert!(
            id.len() == 20 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        ids.push(id);
        // Exactly a publish's message frame: no offset, no user_id on a private channel.
        assert_eq!(
            v,
            json!({"type": "message", "channel": ch, "event": "client-typing", "data": {"a": [1, "x"]}})
        );
    }
    assert_eq!(ids[0], ids[1], "one event, one id");
    // A string `data` is passed as is.
    send_json(&mut same, event(ch, "client-s", json!("text")));
    expect_event_each([&mut sender, &mut other], "client-s", ("data", "text"));
    // Never back to the sender.
    expect_silence(&mut sender, Duration::from_millis(500));
    expect_silence(&mut same, Duration::from_millis(100));

    // Off again: forbidden again.
    cli(
        &s.data_dir,
        &["project", "set-limits", &p.id, "--client-events", "off"],
    );
    wait_for(Duration::from_secs(10), "client events to be off", || {
        send_json(&mut sender, event(ch, "client-x", json!({})));
        match errors_within(&mut sender, Duration::from_millis(300)).first() {
            Some(v) => {
                assert_eq!(v["code"], "forbidden", "{v}");
                true
            }
            None => {
                // Still on: the peers got it.
                next_json(&mut same);
                next_json(&mut other);
                false
            }
        }
    });
}

/// The connection's side of a burst: drains `n` answers (errors) or times out.
fn errors_within(ws: &mut Ws, d: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    set_timeout(ws, d);
    while let Ok(tungstenite::Message::Text(t)) = ws.read() {
        out.push(serde_json::from_str(t.as_str()).unwrap());
    }
    set_timeout(ws, Duration::from_secs(10));
    out
}

#[test]
fn more_than_ten_a_second_are_dropped_with_rate_limited_and_the_connection_stays() {
    let s = Server::start_with(Options::default().workers(1));
    let p = project(&s, "chat", &[]);
    let ch = "private-burst";
    let (mut sender, _) = connect(&s.ws_url(&p.public));
    let (mut peer, _) = connect(&s.ws_url(&p.public));
    for ws in [&mut sender, &mut peer] {
        sub_private(ws, ch, &token(&p.token_secret, ch, "u"));
    }
    turn_on(&mut sender, &mut [&mut peer], ch, || events_on(&s, &p));
    // The probe above was one of this second's events: wait it out before the burst,
    // by sending nothing until a second has passed (measured, not slept blindly).
    let start = std::time::Instant::now();
    wait_for(Duration::from_secs(5), "a second since the probe", || {
        start.elapsed() >= Duration::from_millis(1100)
    });
    // 15 in one burst: all within far less than a second.
    let burst: String = (0..15)
        .map(|i| event(ch, "client-n", json!({"i": i})).to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for line in burst.lines() {
        sender
            .write(tungstenite::Message::text(line.to_string()))
            .unwrap();
    }
    sender.flush().unwrap();
    let mut got = Vec::new();
    for _ in 0..10 {
        let v = next_json(&mut peer);
        got.push(v["data"]["i"].as_i64().unwrap());
    }
    assert_eq!(got, (0..10).collect::<Vec<_>>(), "the first ten, in order");
    expect_silence(&mut peer, Duration::from_millis(300));
    let errors = errors_within(&mut sender, Duration::from_millis(500));
    assert_eq!(errors.len(), 5, "{errors:?}");
    for e in &errors {
        assert_eq!(
            (
                e["type"].as_str(),
                e["code"].as_str(),
                e["channel"].as_str()
            ),
            (Some("error"), Some("rate_limited"), Some(ch)),
            "{e}"
        );
    }
    // Not a close: the connection still answers.
    send_json(&mut sender, json!({"type": "ping"}));
    assert_eq!(next_json(&mut sender)["type"], "pong");
}

#[test]
fn refusals_public_not_subscribed_bad_names_bad_and_large_data() {
    let s = Server::start_with(Options::config("max_body_bytes = 1024\n"));
    let p = project(&s, "chat", &[]);
    let ch = "private-ok";
    let (mut sender, _) = connect(&s.ws_url(&p.public));
    let (mut peer, _) = connect(&s.ws_url(&p.public));
    for ws in [&mut sender, &mut peer] {
        sub_private(ws, ch, &token(&p.token_secret, ch, "u"));
        common::subscribe(ws, "news");
    }
    turn_on(&mut sender, &mut [&mut peer], ch, || events_on(&s, &p));
    let cases = [
        (event("news", "client-x", json!({})), "forbidden"),
        (event("private-other", "client-x", json!({})), "forbidden"),
        (event("presence-other", "client-x", json!({})), "forbidden"),
        (event(ch, "typing", json!({})), "invalid_event"),
        (event(ch, "pusher:ping", json!({})), "invalid_event"),
        (event(ch, "client-", json!({})).clone(), "ok"),
        (
            event(ch, &format!("client-{}", "x".repeat(94)), json!({})),
            "invalid_event",
        ),
        (event(ch, "client-x", json!(7)), "invalid_data"),
        (event(ch, "client-x", json!([1])), "invalid_data"),
        (
            json!({"type": "client_event", "channel": ch, "event": "client-x"}),
            "invalid_data",
        ),
        (
            event(ch, "client-x", json!({"big": "y".repeat(1100)})),
            "payload_too_large",
        ),
    ];
    for (frame, code) in cases {
        if code == "ok" {
            send_json(&mut sender, frame);
            assert_eq!(next_json(&mut peer)["event"], "client-");
            continue;
        }
        let r = refused(&mut sender, frame.clone());
        assert_eq!(r["code"], code, "{frame}: {r}");
    }
    // An invalid channel name is the subscribe frame's error.
    send_json(&mut sender, event("", "client-x", json!({})));
    assert_eq!(next_json(&mut sender)["code"], "invalid_channel");
    // Nothing of the refused ones reached anyone.
    expect_silence(&mut peer, Duration::from_millis(300));
}

/// `private-encrypted-` channels carry payloads their clients encrypt end to end: a
/// native client event on one is refused (`forbidden`) and relayed to nobody, as the
/// Pusher protocol refuses it (issue 20, finding 12: it was relayed in clear).
#[test]
fn native_client_events_on_private_encrypted_channels_are_refused() {
    let s = Server::start();
    let p = project(&s, "sealed", &[]);
    let ch = "private-encrypted-room";
    let plain = "private-plain";
    let (mut sender, _) = connect(&s.ws_url(&p.public));
    let (mut peer, _) = connect(&s.ws_url(&p.public));
    for ws in [&mut sender, &mut peer] {
        sub_private(ws, ch, &token(&p.token_secret, ch, "u"));
        sub_private(ws, plain, &token(&p.token_secret, plain, "u"));
    }
    turn_on(&mut sender, &mut [&mut peer], plain, || events_on(&s, &p));
    send_json(
        &mut sender,
        event(ch, "client-secret", json!({"text": "in clear"})),
    );
    // Nothing reaches the peer (before the fix: the event, in clear).
    expect_silence(&mut peer, Duration::from_millis(300));
    let r = next_json(&mut sender);
    assert_eq!(
        (&r["code"], &r["channel"]),
        (&json!("forbidden"), &json!(ch)),
        "{r}"
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("private-encrypted-"),
        "{r}"
    );
    // Client events on the plain private channel still flow.
    send_json(&mut sender, event(plain, "client-ok", json!({})));
    assert_eq!(next_json(&mut peer)["event"], "client-ok");
}

#[test]
fn presence_channels_add_the_senders_user_id_and_metrics_count_them() {
    let s = Server::start_with(Options::config("metrics_listen = \"127.0.0.1:0\"\n"));
    let p = project(&s, "chat", &[]);
    let ch = "presence-room";
    let (mut sender, _) = connect(&s.ws_url(&p.public));
    let (mut peer, _) = connect(&s.ws_url(&p.public));
    sub_private(&mut sender, ch, &token(&p.token_secret, ch, "alice"));
    sub_private(&mut peer, ch, &token(&p.token_secret, ch, "bob"));
    joins(&mut sender, &["bob"]);
    turn_on(&mut sender, &mut [&mut peer], ch, || events_on(&s, &p));
    send_json(&mut peer, event(ch, "client-hi", json!({"x": 1})));
    let v = next_json(&mut sender);
    assert_eq!(v["user_id"], "bob", "{v}");
    assert_eq!(v["data"], json!({"x": 1}));
    send_json(&mut sender, event(ch, "client-hi", json!({})));
    assert_eq!(next_json(&mut peer)["user_id"], "alice");
    // The probe and two events; each one delivery.
    let counters = s.scrape_when(|c| c.get("ringcast_deliveries_total") == Some(&3.0));
    assert_eq!(
        counters.get("ringcast_client_events_total"),
        Some(&3.0),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("ringcast_deliveries_total"),
        Some(&3.0),
        "{counters:?}"
    );
}

#[test]
fn client_events_are_not_kept_in_history_and_cost_quota() {
    let s = Server::start();
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "create",
            "h",
            "--rate-limit",
            "4/min",
            "--history",
            "10/600s",
        ],
    );
    let p = Private::from_create(&v);
    s.wait_key(&p.secret); // one quota unit (the warm-up publish may spend it)
    let ch = "private-h";
    let (mut sender, _) = connect(&s.ws_url(&p.public));
    let (mut peer, _) = connect(&s.ws_url(&p.public));
    for ws in [&mut sender, &mut peer] {
        sub_private(ws, ch, &token(&p.token_secret, ch, "u"));
    }
    turn_on(&mut sender, &mut [&mut peer], ch, || events_on(&s, &p));
    // Not kept: the channel's history is empty, and the frame has no position.
    let req = format!(
        "GET /api/v1/history?channel={ch} HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nConnection: close\r\n\r\n",
        p.secret
    );
    let (st, _, h) = common::parse_response(&s.raw(req.as_bytes()));
    assert_eq!(st, 200, "{h}");
    assert_eq!(h["offset"], 0, "{h}");
    assert_eq!(h["messages"], json!([]), "{h}");
    // One quota unit each: with 4/min, at most 4 units in all (the warm-up publish, the
    // probe, ...): keep sending until refused by the quota, then a REST publish is 429.
    let mut accepted = 0;
    loop {
        send_json(&mut sender, event(ch, "client-q", json!({})));
        set_timeout(&mut sender, Duration::from_millis(300));
        match sender.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                assert_eq!(v["code"], "rate_limited", "{v}");
                break;
            }
            _ => accepted += 1,
        }
        assert!(accepted < 4, "the quota never refused a client event");
    }
    set_timeout(&mut sender, Duration::from_secs(10));
    let (st, _) = s.publish(&p.secret, "news", "e", json!({}));
    assert_eq!(st, 429, "the client events spent the project's quota");
    for _ in 0..accepted {
        let v = next_json(&mut peer);
        assert_eq!(v["event"], "client-q");
        assert!(v.get("offset").is_none(), "{v}");
    }
}

#[test]
fn cluster_relays_to_subscribers_on_other_nodes_with_user_id() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let v = support::cli(
        &redis,
        &["project", "create", "c", "--rate-limit", "10000/s"],
    );
    let p = Private::from_create(&v);
    a.wait_key(&p.secret);
    b.wait_key(&p.secret);
    let ch = "presence-cluster";
    let (mut sender, _) = connect(&format!("ws://{}/api/v1/ws?key={}", a.addr, p.public));
    let (mut near, _) = connect(&format!("ws://{}/api/v1/ws?key={}", a.addr, p.public));
    let (mut far, _) = connect(&format!("ws://{}/api/v1/ws?key={}", b.addr, p.public));
    sub_private(&mut sender, ch, &token(&p.token_secret, ch, "s1"));
    sub_private(&mut near, ch, &token(&p.token_secret, ch, "n1"));
    sub_private(&mut far, ch, &token(&p.token_secret, ch, "f1"));
    joins(&mut sender, &["n1", "f1"]);
    joins(&mut near, &["f1"]);
    turn_on(&mut sender, &mut [&mut near, &mut far], ch, || {
        let v = support::cli(
            &redis,
            &["project", "set-limits", &p.id, "--client-events", "on"],
        );
        assert_eq!(v["project"]["client_events"], "on", "{v}");
    });
    send_json(&mut sender, event(ch, "client-move", json!({"x": 3})));
    let (n, f) = (next_json(&mut near), next_json(&mut far));
    for v in [&n, &f] {
        assert_eq!(v["event"], "client-move", "{v}");
        assert_eq!(v["user_id"], "s1", "{v}");
        assert_eq!(v["data"], json!({"x": 3}));
    }
    assert_eq!(n["id"], f["id"], "one id on every node");
    // Exactly once on each node, never to the sender.
    expect_silence(&mut far, Duration::from_millis(300));
    expect_silence(&mut near, Duration::from_millis(100));
    expect_silence(&mut sender, Duration::from_millis(100));
    // And the other way, from node B.
    send_json(&mut far, event(ch, "client-back", json!("b")));
    expect_event_each([&mut sender, &mut near], "client-back", ("user_id", "f1"));
    expect_silence(&mut far, Duration::from_millis(300));
}

/// Every project is also a Pusher app: `project create` and `project list` show its
/// `pusher_app_id` (a string of digits, from 1000000, one more per project) and
/// `"pusher":"on"`; `project set-limits --pusher off|on` switches it like
/// `--client-events`, and a bad value is refused by the command line as usual.
#[test]
fn app_ids_and_the_pusher_switch_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let created: Vec<Value> = ["a", "b", "c"]
        .iter()
        .map(|name| cli(data, &["project", "create", name]))
        .collect();
    let ids: Vec<u64> = created
        .iter()
        .map(|v| {
            assert_eq!(v["project"]["pusher"], "on", "on by default: {v}");
            let id = v["project"]["pusher_app_id"].as_str().expect("a string");
            assert!(id.bytes().all(|b| b.is_ascii_digit()), "{id}");
            id.parse().unwrap()
        })
        .collect();
    assert_eq!(ids, [1_000_000, 1_000_001, 1_000_002]);

    let p = created[1]["project"]["id"].as_str().unwrap();
    let v = cli(data, &["project", "set-limits", p, "--pusher", "off"]);
    assert_eq!(v["project"]["pusher"], "off", "{v}");
    assert_eq!(v["project"]["pusher_app_id"], "1000001", "{v}");
    let list = cli(data, &["project", "list"]);
    let shown: Vec<(&str, &str)> = list["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pusher_app_id"].as_str().unwrap(),
                p["pusher"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("1000000", "on"), ("1000001", "off"), ("1000002", "on")]
    );
    let v = cli(data, &["project", "set-limits", p, "--pusher", "on"]);
    assert_eq!(v["project"]["pusher"], "on", "{v}");

    for bad in [
        &["project", "set-limits", p, "--pusher", "maybe"][..],
        &["project", "set-limits", p, "--pusher"],
    ] {
        let out = std::process::Command::new(common::bin())
            .arg("--data-dir")
            .arg(data)
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty(), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains("--pusher"), "{err}");
    }
    // Refused before the store: the project is as it was.
    let list = cli(data, &["project", "list"]);
    assert_eq!(list["projects"][1]["pusher"], "on", "{list}");
    // Numbering goes on after the existing projects.
    let v = cli(data, &["project", "create", "d"]);
    assert_eq!(v["project"]["pusher_app_id"], "1000003", "{v}");
}
