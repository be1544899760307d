//! Channel history and recovery against the real server (contract 1.1, "History and
//! recovery"): the CLI setting, offsets and epochs on frames, answers and `subscribed`,
//! offsets increasing by one across workers, recovery with publishes racing the replay,
//! eviction by size, TTL and byte budget, the epoch after a restart, REST history.

#[path = "../common/mod.rs"]
mod common;
use common::subscribe_since as sub;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A project with history `spec` (e.g. "100/120s").
fn history_project(s: &Server, name: &str, spec: &str) -> Project {
    let (p, v) = s.project_json(name, &["--rate-limit", "100000/s", "--history", spec]);
    assert_eq!(v["project"]["history"], spec);
    p
}

fn get(s: &Server, key: &str, query: &str) -> (u16, Value) {
    let req = get_request(&format!("/api/v1/history?{query}"), key);
    let (st, _, v) = parse_response(&s.raw(req.as_bytes()));
    (st, v)
}

fn offsets_of(frames: &[Value]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f["offset"].as_u64().expect("offset"))
        .collect()
}

/// A new client of `key` subscribing to `channel` from (`offset`, `epoch`): its answer
/// says `recovered` and the channel's `latest` offset, and nothing is replayed.
fn expect_no_replay(
    s: &Server,
    key: &str,
    (channel, offset, epoch): (&str, u64, &str),
    (recovered, latest): (bool, u64),
) {
    let mut ws = s.ws(key);
    let r = sub(&mut ws, channel, Some((offset, epoch)));
    assert_eq!(
        (r["recovered"].as_bool(), r["offset"].as_u64()),
        (Some(recovered), Some(latest)),
        "{r}"
    );
    expect_silence(&mut ws, Duration::from_millis(100));
}

#[test]
fn the_cli_sets_and_shows_history() {
    let s = Server::start();
    let v = cli(&s.data_dir, &["project", "create", "plain"]);
    assert_eq!(v["project"]["history"], "off");
    let v = cli(
        &s.data_dir,
        &["project", "create", "kept", "--history", "100/120s"],
    );
    assert_eq!(v["project"]["history"], "100/120s");
    let id = v["project"]["id"].as_str().unwrap().to_string();
    let list = cli(&s.data_dir, &["project", "list"]);
    let shown: Vec<(String, String)> = list["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().into(),
                p["history"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("plain".into(), "off".into()),
            ("kept".into(), "100/120s".into())
        ]
    );
    let v = cli(&s.data_dir, &["project", "set-history", &id, "5/10s"]);
    assert_eq!(v["project"]["history"], "5/10s");
    let v = cli(&s.data_dir, &["project", "set-history", &id, "0/0s"]);
    assert_eq!(v["project"]["history"], "off");
    for bad in [
        vec!["project", "create", "x", "--history", "100"],
        vec!["project", "create", "x", "--history", "0/10s"],
        vec!["project", "set-history", &id, "10/0s"],
        vec!["project", "set-history", "prj_nope", "10/10s"],
    ] {
        let out = std::process::Command::new(bin())
            .arg("--data-dir")
            .arg(&s.data_dir)
            .args(&bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} should fail");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn positions_on_frames_answers_and_subscribed_only_with_history() {
    let s = Server::start();
    let h = history_project(&s, "h", "10/60s");
    let plain = s.project("plain", "1000/s");

    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", None);
    assert_eq!(r["offset"], 0, "{r}");
    let epoch = r["epoch"].as_str().unwrap().to_string();
    assert!(r.get("recovered").is_none());
    let (st, v) = s.publish(&h.secret, "c", "e", json!({"n": 1}));
    assert_eq!(st, 202);
    assert_eq!(
        (v["offset"].as_u64(), v["epoch"].as_str()),
        (Some(1), Some(epoch.as_str()))
    );
    let f = next_json(&mut ws);
    assert_eq!(
        (f["offset"].as_u64(), f["epoch"].as_str()),
        (Some(1), Some(epoch.as_str()))
    );
    assert_eq!(f["id"], v["id"]);
    assert_eq!(f["data"], json!({"n": 1}));
    // Multi-channel: one offset per channel, none in the answer.
    let body = json!({"channels": ["c", "d"], "event": "e", "data": "x"}).to_string();
    let (st, _, v) = s.raw_publish(&h.secret, "application/json", body.as_bytes());
    assert_eq!(st, 202);
    assert!(v.get("offset").is_none(), "{v}");
    assert_eq!(next_json(&mut ws)["offset"], 2);
    let (_, d) = get(&s, &h.secret, "channel=d");
    assert_eq!(d["offset"], 1);
    assert_ne!(d["epoch"], json!(epoch), "each channel has its own epoch");

    // A project without history: no position anywhere; `since` answers recovered:false.
    let mut pw = s.ws(&plain.public);
    let r = sub(&mut pw, "c", Some((3, "abc")));
    assert_eq!(r["recovered"], false);
    assert!(r.get("offset").is_none() && r.get("epoch").is_none(), "{r}");
    let (st, v) = s.publish(&plain.secret, "c", "e", json!("x"));
    assert_eq!(st, 202);
    assert!(v.get("offset").is_none(), "{v}");
    let f = next_json(&mut pw);
    assert!(f.get("offset").is_none() && f.get("epoch").is_none(), "{f}");
    let (st, v) = get(&s, &plain.secret, "channel=c");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("history_off"))
    );
}

#[test]
fn offsets_increase_by_one_in_the_same_order_on_every_worker() {
    let s = Server::start(); // 2 workers
    let h = history_project(&s, "order", "10000/600s");
    // Subscribers on several connections: SO_REUSEPORT spreads them over both workers.
    let mut subs: Vec<Ws> = (0..6).map(|_| s.ws(&h.public)).collect();
    for ws in subs.iter_mut() {
        assert_eq!(sub(ws, "c", None)["offset"], 0);
    }
    // Publishers on several connections (so on both workers), at once.
    let per = 100;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let addr = s.addr;
            let key = h.secret.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    let body = json!({"channel": "c", "event": "e", "data": {"t": t, "i": i}})
                        .to_string();
                    let req = format!(
                        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let mut c = std::net::TcpStream::connect(addr).unwrap();
                    use std::io::{Read, Write};
                    c.write_all(req.as_bytes()).unwrap();
                    let mut out = Vec::new();
                    c.read_to_end(&mut out).unwrap();
                    assert!(out.starts_with(b"HTTP/1.1 202"), "{}", String::from_utf8_lossy(&out));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = 4 * per as u64;
    let mut first: Option<Vec<(u64, Value)>> = None;
    for ws in subs.iter_mut() {
        let got: Vec<(u64, Value)> = (0..total)
            .map(|_| {
                let f = next_json(ws);
                (f["offset"].as_u64().unwrap(), f["data"].clone())
            })
            .collect();
        let offsets: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            offsets,
            (1..=total).collect::<Vec<_>>(),
            "1, 2, 3, ... with no gap"
        );
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(f, &got, "every subscriber sees the same order"),
        }
    }
}

#[test]
fn recovery_replays_the_missed_messages_then_goes_live() {
    let s = Server::start();
    let h = history_project(&s, "rec", "100/600s");
    let mut ws = s.ws(&h.public);
    let epoch = common::subscribe_epoch(&mut ws, "c");
    for i in 1..=3 {
        s.publish(&h.secret, "c", "e", json!({"i": i}));
    }
    for _ in 0..3 {
        next_json(&mut ws);
    }
    drop(ws);
    for i in 4..=7 {
        s.publish(&h.secret, "c", "e", json!({"i": i}));
    }
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", Some((3, &epoch)));
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(
        (r["offset"].as_u64(), r["epoch"].as_str()),
        (Some(7), Some(epoch.as_str()))
    );
    let replay: Vec<Value> = (0..4).map(|_| next_json(&mut ws)).collect();
    assert_eq!(offsets_of(&replay), [4, 5, 6, 7]);
    assert_eq!(replay[0]["data"], json!({"i": 4}));
    s.publish(&h.secret, "c", "e", json!({"i": 8}));
    assert_eq!(next_json(&mut ws)["offset"], 8);
    // Up to date: recovered with nothing to replay.
    expect_no_replay(&s, &h.public, ("c", 8, &epoch), (true, 8));
    // Beyond the latest offset, or another epoch: not recovered, nothing replayed.
    for (offset, e) in [(9, epoch.as_str()), (3, "deadbeef")] {
        let mut w = s.ws(&h.public);
        let r = sub(&mut w, "c", Some((offset, e)));
        assert_eq!(r["recovered"], false, "{r}");
        assert_eq!(
            (r["offset"].as_u64(), r["epoch"].as_str()),
            (Some(8), Some(epoch.as_str()))
        );
        expect_silence(&mut w, Duration::from_millis(100));
    }
    // A malformed since is an error frame and no subscription.
    let mut w = s.ws(&h.public);
    send_json(
        &mut w,
        json!({"type": "subscribe", "channel": "c", "since": {"offset": "x"}}),
    );
    let f = next_json(&mut w);
    assert_eq!(
        (f["type"].as_str(), f["code"].as_str()),
        (Some("error"), Some("invalid_since"))
    );
}

#[test]
fn recovery_has_no_gap_and_no_duplicate_while_publishes_race_the_replay() {
    let s = Server::start();
    let h = history_project(&s, "race", "100000/600s");
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    // Two publishers on their own keep-alive connections, each at most one publish per
    // 0.5 ms: flat out, they outran the reader on a loaded machine, so each round's
    // replay grew until it passed half the send backlog (a replay is attempted only
    // when it fits; `recovered: false` then, rightly). The publishes still race every
    // replay.
    let pubs: Vec<_> = (0..2)
        .map(|_| {
            let (addr, key) = (s.addr, h.secret.clone());
            let (stop, published) = (stop.clone(), published.clone());
            std::thread::spawn(move || {
                use std::io::{BufRead, BufReader, Read, Write};
                let c = std::net::TcpStream::connect(addr).unwrap();
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut w = c;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_micros(500));
                    let body = r#"{"channel":"c","event":"e","data":"x"}"#;
                    let req = format!(
                        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    w.write_all(req.as_bytes()).unwrap();
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        if let Some(v) = line.strip_prefix("Content-Length: ") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut b = vec![0; len];
                    r.read_exact(&mut b).unwrap();
                    published.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    wait_for(Duration::from_secs(10), "publishing to start", || {
        published.load(Ordering::Relaxed) > 50
    });
    // Other subscribers of the channel on both workers, so frames of it are always in
    // flight in every worker's mailbox when the reconnecting client joins.
    let mut others: Vec<Ws> = (0..6).map(|_| s.ws(&h.public)).collect();
    for o in others.iter_mut() {
        sub(o, "c", None);
    }
    // Reconnect again and again mid-stream: each time the replay must join the live
    // stream exactly.
    let mut ws = s.ws(&h.public);
    let r = sub(&mut ws, "c", None);
    let epoch = r["epoch"].as_str().unwrap().to_string();
    let mut last = r["offset"].as_u64().unwrap();
    let mut joined_at = last;
    for round in 0..40 {
        // Read the replay and on into the live stream (past the position `subscribed`
        // gave), then leave, let publishes pass, come back with since.
        while last < joined_at + 20 {
            let f = next_json(&mut ws);
            let o = f["offset"].as_u64().unwrap();
            assert_eq!(
                o,
                last + 1,
                "round {round}: after offset {last} (joined at {joined_at})"
            );
            last = o;
        }
        drop(ws);
        let before = published.load(Ordering::Relaxed);
        wait_for(Duration::from_secs(10), "publishes while away", || {
            published.load(Ordering::Relaxed) > before + 20
        });
        ws = s.ws(&h.public);
        let r = sub(&mut ws, "c", Some((last, &epoch)));
        assert_eq!(r["recovered"], true, "round {round}: since {last}: {r}");
        joined_at = r["offset"].as_u64().unwrap();
        assert!(joined_at > last);
    }
    stop.store(true, Ordering::Relaxed);
    for p in pubs {
        p.join().unwrap();
    }
    drop(others);
}

#[test]
fn eviction_by_size_and_by_ttl_answers_recovered_false() {
    let s = Server::start();
    let h = history_project(&s, "size", "3/600s");
    let mut ws = s.ws(&h.public);
    let epoch = common::subscribe_epoch(&mut ws, "c");
    for i in 0..6 {
        s.publish(&h.secret, "c", "e", json!({"i": i}));
    }
    // 4..6 are kept: since 3 recovers, since 2 does not (offset 3 is gone).
    let mut w = s.ws(&h.public);
    let r = sub(&mut w, "c", Some((3, &epoch)));
    assert_eq!(r["recovered"], true);
    assert_eq!(
        offsets_of(&(0..3).map(|_| next_json(&mut w)).collect::<Vec<_>>()),
        [4, 5, 6]
    );
    expect_no_replay(&s, &h.public, ("c", 2, &epoch), (false, 6));

    let t = history_project(&s, "ttl", "100/1s");
    let mut ws = s.ws(&t.public);
    let epoch = common::subscribe_epoch(&mut ws, "c");
    s.publish(&t.secret, "c", "e", json!("old"));
    wait_for(Duration::from_secs(5), "the message to expire", || {
        get(&s, &t.secret, "channel=c").1["messages"]
            .as_array()
            .is_some_and(|m| m.is_empty())
    });
    let (_, v) = get(&s, &t.secret, "channel=c");
    assert_eq!(v["offset"], 1, "the offset stays after eviction");
    let mut w = s.ws(&t.public);
    let r = sub(&mut w, "c", Some((0, &epoch)));
    assert_eq!(
        (r["recovered"].as_bool(), r["offset"].as_u64()),
        (Some(false), Some(1))
    );
}

#[test]
fn the_byte_budget_drops_the_oldest_of_the_largest_channel_first() {
    let s = Server::start_with(Options::config("history_max_bytes = 20000\n"));
    let h = history_project(&s, "budget", "1000/600s");
    for i in 0..5 {
        s.publish(&h.secret, "small", "e", json!({"i": i}));
    }
    let big = "x".repeat(1000);
    for i in 0..60 {
        s.publish(&h.secret, "large", "e", json!({"i": i, "pad": big}));
    }
    let (_, small) = get(&s, &h.secret, "channel=small");
    assert_eq!(
        small["messages"].as_array().unwrap().len(),
        5,
        "small kept whole"
    );
    let (_, large) = get(&s, &h.secret, "channel=large&limit=1000");
    let kept = offsets_of(large["messages"].as_array().unwrap());
    assert!(kept.len() < 20, "about 20 KB of 60 KB kept: {}", kept.len());
    assert_eq!(kept.last(), Some(&60), "the newest stay");
    assert_eq!(large["offset"], 60);
}

/// Publish a batch of `messages` (each `{"channel", "event", "data"}`) on one connection.
fn publish_batch(s: &Server, key: &str, messages: Vec<Value>) {
    let body = json!({ "messages": messages }).to_string();
    let req = post_request("/api/v1/publish/batch", key, &body);
    let (st, _, v) = parse_response(&s.raw(req.as_bytes()));
    assert_eq!(st, 202, "{v}");
}

mod recovery_and_rest;
