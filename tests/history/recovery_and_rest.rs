//! The rest of the `history` tests (one test binary, two files).

use super::*;

/// Issue 20, finding 7 (contract 1.3): each project gets an equal share of
/// `history_max_bytes`. A flood from one project, spread over many small channels (each
/// smaller than the other project's one channel), evicted the other project's kept
/// messages (its channel was the largest) and its recovery answered `recovered: false`.
/// Now the flooding project, furthest over its share, loses its own oldest messages; and
/// alone it may use the whole budget.
#[test]
fn one_projects_flood_leaves_another_projects_share_alone() {
    let s = Server::start_with(Options::config("history_max_bytes = 40000\n"));
    let a = history_project(&s, "flood", "1000/600s");
    let b = history_project(&s, "calm", "1000/600s");
    let pad = "p".repeat(300);

    // A alone: about 30 KB of 40 KB (far beyond half), all of it kept.
    for round in 0..5 {
        let messages = (0..10)
            .map(|i| json!({"channel": format!("c-{:04}", round * 10 + i), "event": "e", "data": {"pad": pad}}))
            .collect();
        publish_batch(&s, &a.secret, messages);
    }
    for round in 0..5 {
        for i in 0..10 {
            let (_, v) = get(&s, &a.secret, &format!("channel=c-{:04}", round * 10 + i));
            assert_eq!(
                offsets_of(v["messages"].as_array().unwrap()),
                [1],
                "A alone lost a message: {v}"
            );
        }
    }

    // B: one channel of 12 messages (about 8 KB, within its 20 KB share), a subscriber
    // that saw the first 2.
    let mut ws = s.ws(&b.public);
    let epoch = subscribe_epoch(&mut ws, "orders");
    for i in 0..2 {
        s.publish(&b.secret, "orders", "e", json!({"i": i, "pad": pad}));
    }
    assert_eq!(
        offsets_of(&[next_json(&mut ws), next_json(&mut ws)]),
        [1, 2]
    );
    drop(ws);
    for i in 2..12 {
        s.publish(&b.secret, "orders", "e", json!({"i": i, "pad": pad}));
    }

    // A floods 400 more channels, one message each (about 250 KB), each channel
    // smaller than B's.
    for round in 0..4 {
        let messages = (0..100)
            .map(|i| json!({"channel": format!("c-{:04}", 50 + round * 100 + i), "event": "e", "data": {"pad": pad}}))
            .collect();
        publish_batch(&s, &a.secret, messages);
    }

    // B's messages are all kept, and B's client recovers.
    let (_, v) = get(&s, &b.secret, "channel=orders&limit=100");
    assert_eq!(
        offsets_of(v["messages"].as_array().unwrap()),
        (1..=12).collect::<Vec<u64>>(),
        "B lost kept messages to A's flood"
    );
    let mut ws = s.ws(&b.public);
    let r = sub(&mut ws, "orders", Some((2, &epoch)));
    assert_eq!(r["recovered"], true, "{r}");
    let replay: Vec<Value> = (0..10).map(|_| next_json(&mut ws)).collect();
    assert_eq!(offsets_of(&replay), (3..=12).collect::<Vec<u64>>());
    // A paid for its flood: its newest channel is kept, its oldest are gone.
    let (_, v) = get(&s, &a.secret, "channel=c-0449");
    assert_eq!(offsets_of(v["messages"].as_array().unwrap()), [1], "{v}");
    let (_, v) = get(&s, &a.secret, "channel=c-0000");
    assert_eq!(v["messages"], json!([]), "{v}");
}

#[test]
fn a_restart_changes_the_epoch() {
    let mut s = Server::start();
    let h = history_project(&s, "restart", "100/600s");
    let mut ws = s.ws(&h.public);
    let epoch = subscribe_epoch(&mut ws, "c");
    s.publish(&h.secret, "c", "e", json!("1"));
    drop(ws);
    s.restart(Options::default());
    s.wait_key(&h.secret);
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", Some((1, &epoch)));
    assert_eq!(r["recovered"], false, "{r}");
    assert_eq!(r["offset"], 0);
    assert_ne!(r["epoch"], json!(epoch));
    let (_, v) = s.publish(&h.secret, "c", "e", json!("2"));
    assert_eq!(v["offset"], 1);
}

#[test]
fn rest_history_limit_since_epoch_and_errors() {
    let s = Server::start();
    let h = history_project(&s, "rest", "100/600s");
    let mut ids = Vec::new();
    for i in 1..=10 {
        let body = format!(r#"{{"channel":"a b/é","event":"ev","data":{{"i":{i},"f":1.50}}}}"#);
        let (st, _, v) = s.raw_publish(&h.secret, "application/json", body.as_bytes());
        assert_eq!(st, 202);
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let ch = "channel=a%20b%2F%C3%A9";
    let (st, v) = get(&s, &h.secret, ch);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["channel"], "a b/é");
    assert_eq!(v["offset"], 10);
    let epoch = v["epoch"].as_str().unwrap().to_string();
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(offsets_of(msgs), (1..=10).collect::<Vec<_>>());
    assert_eq!(
        msgs[0],
        json!({"event": "ev", "data": {"i": 1, "f": 1.5}, "id": ids[0], "offset": 1})
    );
    // data verbatim (1.50 stays 1.50)
    let req = format!(
        "GET /api/v1/history?{ch}&limit=1 HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nConnection: close\r\n\r\n",
        h.secret
    );
    let raw = String::from_utf8(s.raw(req.as_bytes())).unwrap();
    assert!(raw.contains(r#""data":{"i":10,"f":1.50}"#), "{raw}");
    // Without since: the newest `limit`, oldest first; with since: the first after it.
    let (_, v) = get(&s, &h.secret, &format!("{ch}&limit=3"));
    assert_eq!(offsets_of(v["messages"].as_array().unwrap()), [8, 9, 10]);
    let (_, v) = get(&s, &h.secret, &format!("{ch}&since=4&limit=2"));
    assert_eq!(offsets_of(v["messages"].as_array().unwrap()), [5, 6]);
    let (_, v) = get(&s, &h.secret, &format!("{ch}&since=10"));
    assert!(v["messages"].as_array().unwrap().is_empty());
    let (st, _) = get(&s, &h.secret, &format!("{ch}&since=4&epoch={epoch}"));
    assert_eq!(st, 200);
    let (st, v) = get(&s, &h.secret, &format!("{ch}&since=4&epoch=other"));
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("epoch_mismatch"))
    );
    // An unknown channel: offset 0, nothing kept.
    let (st, v) = get(&s, &h.secret, "channel=never");
    assert_eq!((st, v["offset"].as_u64()), (200, Some(0)));
    for (q, code) in [
        ("limit=5", "missing_field"),
        ("channel=a&limit=0", "invalid_field"),
        ("channel=a&limit=1001", "invalid_field"),
        ("channel=a&since=x", "invalid_field"),
        ("channel=", "invalid_field"),
    ] {
        let (st, v) = get(&s, &h.secret, q);
        assert_eq!((st, v["error"]["code"].as_str()), (400, Some(code)), "{q}");
    }
    let (st, _) = get(&s, &h.public, ch);
    assert_eq!(st, 401, "a public key cannot read history");
    let (st, _) = get(&s, "", ch);
    assert_eq!(st, 401);
    let req = "POST /api/v1/history HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(parse_response(&s.raw(req.as_bytes())).0, 405);
}

#[test]
fn set_history_applies_to_a_running_server() {
    let s = Server::start();
    let p = s.project("late", "1000/s");
    let (_, v) = s.publish(&p.secret, "c", "e", json!("x"));
    assert!(v.get("offset").is_none());
    cli(&s.data_dir, &["project", "set-history", &p.id, "10/60s"]);
    wait_for(Duration::from_secs(3), "history to turn on", || {
        s.publish(&p.secret, "c", "e", json!("y"))
            .1
            .get("offset")
            .is_some()
    });
    cli(&s.data_dir, &["project", "set-history", &p.id, "0/0s"]);
    wait_for(Duration::from_secs(3), "history to turn off", || {
        get(&s, &p.secret, "channel=c").0 == 404
    });
    let (_, v) = s.publish(&p.secret, "c", "e", json!("z"));
    assert!(v.get("offset").is_none());
}

/// Issue 13 review, point 1: subscribes and REST reads of channels nothing was published
/// to keep nothing on the node, so a client looping over random channel names can
/// neither grow memory nor make the next publish evict stored messages; a client that
/// saw offset 0 before the first publish still recovers it.
#[test]
fn reads_of_unpublished_channels_keep_nothing_and_evict_nothing() {
    // 300 subscribes on one connection, at once: over the default subscribe budget
    // (a burst of 100, then 20 per second), which this test is not about.
    let s = Server::start_with(Options::config(
        "history_max_bytes = 20000\nsubscribe_rate_per_connection = 100000\n",
    ));
    let h = history_project(&s, "reads", "100/600s");
    for i in 0..5 {
        s.publish(&h.secret, "kept", "e", json!({"i": i}));
    }
    // A client that saw offset 0 of a channel before its first message.
    let mut early = s.ws(&h.public);
    let r = sub(&mut early, "first", None);
    assert_eq!(r["offset"], 0);
    let first_epoch = r["epoch"].as_str().unwrap().to_string();
    drop(early);
    // About 100 KB of channel names (each made a log before the fix), by subscribe and
    // unsubscribe, and by REST reads.
    let mut ws = s.ws(&h.public);
    let pad = "n".repeat(90);
    for i in 0..300 {
        let name = format!("{i}-{pad}");
        sub(&mut ws, &name, None);
        send_json(&mut ws, json!({"type": "unsubscribe", "channel": name}));
        assert_eq!(next_json(&mut ws)["type"], "unsubscribed");
    }
    for i in 0..100 {
        let (st, v) = get(&s, &h.secret, &format!("channel=get-{i}-{pad}"));
        assert_eq!((st, v["offset"].as_u64()), (200, Some(0)), "{v}");
    }
    // The next publish evicts nothing: the stored messages are all there.
    s.publish(&h.secret, "other", "e", json!("x"));
    let (_, kept) = get(&s, &h.secret, "channel=kept");
    assert_eq!(
        offsets_of(kept["messages"].as_array().unwrap()),
        [1, 2, 3, 4, 5]
    );
    // The first messages of "first" take the epoch the early client saw.
    s.publish(&h.secret, "first", "e", json!("1"));
    s.publish(&h.secret, "first", "e", json!("2"));
    let mut again = s.ws(&h.public);
    let r = sub(&mut again, "first", Some((0, &first_epoch)));
    assert_eq!(r["recovered"], true, "{r}");
    let replay: Vec<Value> = (0..2).map(|_| next_json(&mut again)).collect();
    assert_eq!(offsets_of(&replay), [1, 2]);
    assert_eq!(replay[0]["epoch"], json!(first_epoch));
}

/// Issue 13 review, point 3: a publish refused with 503 (full mailbox) costs no quota,
/// single or batch, and leaves the channel's history as it was (it neither records the
/// refused message nor loses one it had).
#[test]
fn a_refused_history_publish_costs_no_quota_and_keeps_the_history() {
    let s = Server::start_with(Options::config("mailbox_capacity = 2\n").workers(1));
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "create",
            "full",
            "--rate-limit",
            "7/min",
            "--history",
            "2/600s",
        ],
    );
    let (secret, public) = (
        v["secret_key"].as_str().unwrap().to_string(),
        v["public_key"].as_str().unwrap().to_string(),
    );
    s.wait_key(&secret);
    let mut ws = s.ws(&public);
    sub(&mut ws, "c", None);
    // Pipelined in one write: the worker answers them all before draining its mailbox.
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nX-Api-Key: {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let one = post(
        "/api/v1/publish",
        r#"{"channel":"c","event":"e","data":{}}"#,
    );
    let three = post(
        "/api/v1/publish/batch",
        &json!({"messages": [
            {"channel": "c", "event": "e", "data": "1"},
            {"channel": "c", "event": "e", "data": "2"},
            {"channel": "c", "event": "e", "data": "3"},
        ]})
        .to_string(),
    );
    let mut req = one.repeat(3);
    req.push_str(&three);
    req.push_str("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let resp = String::from_utf8(s.raw(req.as_bytes())).unwrap();
    let statuses: Vec<&str> = resp.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect();
    assert_eq!(statuses, ["202", "202", "503", "503", "503"], "{resp}");
    assert_eq!(
        offsets_of(&[next_json(&mut ws), next_json(&mut ws)]),
        [1, 2]
    );
    // The history holds what was published, not the refused message.
    let (_, v) = get(&s, &secret, "channel=c");
    assert_eq!(offsets_of(v["messages"].as_array().unwrap()), [1, 2], "{v}");
    assert_eq!(v["offset"], 2);
    // 7 units, 2 spent: the refused 1 + 3 came back (before the fix, all 6 were gone).
    let req = post(
        "/api/v1/publish",
        r#"{"channel":"c","event":"e","data":{}}"#,
    )
    .replace("\r\n\r\n{", "\r\nConnection: close\r\n\r\n{");
    let (st, head, v) = parse_response(&s.raw(req.as_bytes()));
    assert_eq!((st, v["offset"].as_u64()), (202, Some(3)), "{v}");
    let remaining: u32 = header(&head, "ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining >= 4, "{head}");
}

/// Issue 13 review, point 4: a replay that would take more than half the connection's
/// send backlog answers recovered: false instead of closing the connection with 4008
/// (the client would otherwise reconnect with the same `since` forever).
#[test]
fn a_replay_larger_than_half_the_send_backlog_is_not_recovered() {
    let s = Server::start_with(Options::config("send_backlog_bytes = 16384\n"));
    let h = history_project(&s, "big", "100/600s");
    let (_, v) = s.publish(&h.secret, "c", "e", json!("first"));
    let epoch = v["epoch"].as_str().unwrap().to_string();
    let pad = "x".repeat(1000);
    // 6 KB to replay from offset 7: within half of 16 KiB.
    for i in 0..12 {
        s.publish(&h.secret, "c", "e", json!({"i": i, "pad": pad}));
    }
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", Some((7, &epoch)));
    assert_eq!(
        (r["recovered"].as_bool(), r["offset"].as_u64()),
        (Some(true), Some(13))
    );
    let replay: Vec<Value> = (0..6).map(|_| next_json(&mut ws)).collect();
    assert_eq!(offsets_of(&replay), [8, 9, 10, 11, 12, 13]);
    // 12 KB from offset 1: more than half; not attempted, and the connection lives on.
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", Some((1, &epoch)));
    assert_eq!(
        (r["recovered"].as_bool(), r["offset"].as_u64()),
        (Some(false), Some(13)),
        "{r}"
    );
    s.publish(&h.secret, "c", "e", json!("live"));
    let f = next_json(&mut ws);
    assert_eq!(
        (f["offset"].as_u64(), &f["data"]),
        (Some(14), &json!("live"))
    );
}

/// Issue 13 review, point 5: history turned off, then on again while the node still
/// keeps the channel's log: a client's old position does not recover (messages
/// published while history was off are in no log), and the channel gets a new epoch.
#[test]
fn history_off_then_on_again_starts_a_new_epoch() {
    let s = Server::start();
    let h = history_project(&s, "toggle", "100/600s");
    let mut ws = s.ws(&h.public);
    sub(&mut ws, "c", None);
    let mut epoch = String::new();
    for i in 0..3 {
        let (_, v) = s.publish(&h.secret, "c", "e", json!({"i": i}));
        epoch = v["epoch"].as_str().unwrap().to_string();
    }
    drop(ws);
    cli(&s.data_dir, &["project", "set-history", &h.id, "0/0s"]);
    wait_for(Duration::from_secs(3), "history to turn off", || {
        get(&s, &h.secret, "channel=c").0 == 404
    });
    s.publish(&h.secret, "c", "e", json!("while off"));
    cli(&s.data_dir, &["project", "set-history", &h.id, "100/600s"]);
    wait_for(Duration::from_secs(3), "history to turn on", || {
        get(&s, &h.secret, "channel=c").0 == 200
    });
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", Some((3, &epoch)));
    assert_eq!(r["recovered"], false, "{r}");
    assert_ne!(r["epoch"], json!(epoch));
    let (_, v) = s.publish(&h.secret, "c", "e", json!("on again"));
    assert_eq!(v["offset"], 1, "{v}");
    assert_eq!(next_json(&mut ws)["offset"], 1);
}
