//! The rest of the `webhooks` tests (one test binary, two files).

use super::*;

/// A presence room's whole life with one member, u1, as sorted webhook event names.
const ROOM_LIFE_OF_U1: [&str; 4] = [
    "channel_occupied",
    "channel_vacated",
    "member_added:u1",
    "member_removed:u1",
];

/// Occupancy and presence transitions from the node's presence hub: occupied once,
/// a leave and return within 3 s sends neither, a real leave is sent 3 s later; a user
/// with two connections is added once and removed once; every request is signed.
#[test]
fn occupancy_and_membership_webhooks_with_the_three_second_grace() {
    let s = Server::start_with(allowed());
    let p = project(&s, "rooms");
    let receiver = Receiver::start(&[]);
    cli(
        &s.data_dir,
        &["project", "set-webhook", &p.id, &receiver.url()],
    );
    // Wait until the server applied it: occupy new channels until one is reported.
    let mut probe = s.ws(&p.public);
    let mut k = 0;
    wait_for(
        Duration::from_secs(15),
        "the first occupancy webhook",
        || {
            k += 1;
            common::subscribe(&mut probe, &format!("probe-{k}"));
            std::thread::sleep(Duration::from_millis(250));
            !receiver.hooks().is_empty()
        },
    );

    let sub = |ws: &mut Ws, ch: &str| {
        send_json(ws, json!({"type": "subscribe", "channel": ch}));
        assert_eq!(next_json(ws)["type"], "subscribed");
    };
    let unsub = |ws: &mut Ws, ch: &str| {
        send_json(ws, json!({"type": "unsubscribe", "channel": ch}));
        assert_eq!(next_json(ws)["type"], "unsubscribed");
    };
    let url = s.ws_url(&p.public);
    let (mut x, _) = tungstenite::connect(url.as_str()).expect("ws");
    set_timeout(&mut x, Duration::from_secs(10));
    next_json(&mut x);
    let room = "presence-room";
    sub(&mut x, "news");
    let (mut a, _) = member(&url, &p, room, "u1");
    let (mut a2, _) = member(&url, &p, room, "u1");
    // A reload: gone and back within the grace, on both kinds of channel.
    unsub(&mut x, "news");
    sub(&mut x, "news");
    a.close(None).unwrap();
    a2.close(None).unwrap();
    let (mut a3, _) = member(&url, &p, room, "u1");
    wait_for(
        Duration::from_secs(10),
        "news occupied and u1 added",
        || about(&receiver, "news").len() == 1 && about(&receiver, room).len() == 2,
    );
    // Real leaves.
    unsub(&mut x, "news");
    let left = Instant::now();
    unsub(&mut a3, room);
    wait_for(
        Duration::from_secs(15),
        "the leaves, after the grace",
        || about(&receiver, "news").len() == 2 && about(&receiver, room).len() == 4,
    );
    let news = about(&receiver, "news");
    assert_eq!(names(&news), ["channel_occupied", "channel_vacated"]);
    assert!(
        news[1].2 >= left + Duration::from_secs(3),
        "vacated only after 3 s"
    );
    let presence = about(&receiver, room);
    let mut got = names(&presence);
    let pos = |n: &str| got.iter().position(|g| g == n).unwrap();
    assert!(pos("channel_occupied") < pos("channel_vacated"), "{got:?}");
    assert!(pos("member_added:u1") < pos("member_removed:u1"), "{got:?}");
    assert!(presence
        .iter()
        .all(|(n, _, at)| !n.ends_with("removed") || *at >= left + Duration::from_secs(3)));
    got.sort();
    assert_eq!(got, ROOM_LIFE_OF_U1);
    for h in receiver.hooks() {
        assert!(h.signed_with(&p.token_secret));
        assert_eq!(h.key.as_deref(), Some(p.public.as_str()));
    }
}

/// Cluster mode: a channel occupied on two nodes is `channel_occupied` once and
/// `channel_vacated` once, when its last subscriber anywhere leaves; a user with a
/// connection on each node is added once and removed once.
#[test]
fn cluster_transitions_are_sent_once() {
    use support::{Node, Redis};
    let Some(redis) = Redis::start() else { return };
    let (na, nb) = (
        Node::start_env(&redis, &[ALLOW_PRIVATE_WEBHOOKS]),
        Node::start_env(&redis, &[ALLOW_PRIVATE_WEBHOOKS]),
    );
    let p = support::project(&redis, "c", "1000/s");
    let receiver = Receiver::start(&[]);
    support::cli(&redis, &["project", "set-webhook", &p.id, &receiver.url()]);
    na.wait_key(&p.secret);
    nb.wait_key(&p.secret);
    let url_a = format!("ws://{}/api/v1/ws?key={}", na.addr, p.public);
    let url_b = format!("ws://{}/api/v1/ws?key={}", nb.addr, p.public);
    let open = |url: &str| {
        let (mut ws, _) = tungstenite::connect(url).expect("ws");
        set_timeout(&mut ws, Duration::from_secs(10));
        next_json(&mut ws);
        ws
    };
    // Both nodes have the webhook: a new channel on each is reported.
    for (node, url) in [("a", &url_a), ("b", &url_b)] {
        let mut probe = open(url);
        let mut k = 0;
        wait_for(Duration::from_secs(15), "the webhook on every node", || {
            k += 1;
            let ch = format!("probe-{node}-{k}");
            common::subscribe(&mut probe, &ch);
            std::thread::sleep(Duration::from_millis(250));
            !about(&receiver, &ch).is_empty()
        });
    }

    let room = "presence-room";
    let (mut xa, mut xb) = (open(&url_a), open(&url_b));
    common::subscribe(&mut xa, "news");
    common::subscribe(&mut xb, "news");
    let (mut ua, _) = member(&url_a, &p, room, "u1");
    let (mut ub, _) = member(&url_b, &p, room, "u1");
    wait_for(
        Duration::from_secs(10),
        "news occupied and u1 added",
        || about(&receiver, "news").len() == 1 && about(&receiver, room).len() == 2,
    );
    // One node's subscriber leaves: still occupied, still a member.
    send_json(&mut xa, json!({"type": "unsubscribe", "channel": "news"}));
    ua.close(None).unwrap();
    assert_eq!(next_json(&mut xa)["type"], "unsubscribed");
    // 3 s of grace and 1 s of batching: nothing may have come by then.
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(names(&about(&receiver, "news")), ["channel_occupied"]);
    // The last ones leave, on the other node.
    send_json(&mut xb, json!({"type": "unsubscribe", "channel": "news"}));
    ub.close(None).unwrap();
    wait_for(Duration::from_secs(15), "the leaves", || {
        about(&receiver, "news").len() >= 2 && about(&receiver, room).len() >= 4
    });
    // A duplicate from the other node would come within the same grace and batch.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        names(&about(&receiver, "news")),
        ["channel_occupied", "channel_vacated"]
    );
    let mut got = names(&about(&receiver, room));
    got.sort();
    assert_eq!(got, ROOM_LIFE_OF_U1);
}

fn cli_fails(data_dir: &std::path::Path, args: &[&str]) -> (String, String) {
    let out = Command::new(common::bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .expect("run ringcast CLI");
    assert!(!out.status.success(), "ringcast {args:?} should fail");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn set_webhook_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let created = cli(data, &["project", "create", "p"]);
    assert_eq!(created["project"]["webhook"], "off");
    let id = created["project"]["id"].as_str().unwrap();
    for bad in [
        &["project", "set-webhook", id, "ftp://example.com/"][..],
        &["project", "set-webhook", id, "example.com/hook"],
        &[
            "project",
            "set-webhook",
            id,
            "http://h.example/",
            "--events",
            "everything",
        ],
        &["project", "set-webhook", id],
        &["project", "set-webhook", id, "http://h.example/", "--off"],
        &["project", "set-webhook", "prj_nope", "http://h.example/"],
    ] {
        let (stdout, stderr) = cli_fails(data, bad);
        assert!(stdout.is_empty(), "{bad:?}: {stdout}");
        assert!(!stderr.trim().is_empty(), "{bad:?}: says why");
    }
    let (_, stderr) = cli_fails(data, &["project", "set-webhook", id, "ftp://example.com/"]);
    assert!(
        stderr.contains("http://") && stderr.contains("https://"),
        "{stderr}"
    );

    let set = cli(
        data,
        &[
            "project",
            "set-webhook",
            id,
            "https://h.example/w?t=1",
            "--events",
            "member_removed,channel_vacated",
        ],
    );
    let want =
        json!({"url": "https://h.example/w?t=1", "events": ["channel_vacated", "member_removed"]});
    assert_eq!(set["project"]["webhook"], want);
    let list = cli(data, &["project", "list"]);
    assert_eq!(list["projects"][0]["webhook"], want);
    cli(data, &["project", "set-webhook", id, "--off"]);
    let list = cli(data, &["project", "list"]);
    assert_eq!(list["projects"][0]["webhook"], "off");
}

/// Cluster mode: the webhook lives in Redis with the project, and a node sends with the
/// project's public key (kept whole in Redis) and token secret.
#[test]
fn webhooks_in_cluster_mode() {
    use support::{Node, Redis};
    let Some(redis) = Redis::start() else { return };
    let node = Node::start_env(&redis, &[ALLOW_PRIVATE_WEBHOOKS]);
    let p = support::project(&redis, "c", "1000/s");
    support::cli(
        &redis,
        &["project", "set-limits", &p.id, "--client-events", "on"],
    );
    let receiver = Receiver::start(&[]);
    support::cli(
        &redis,
        &[
            "project",
            "set-webhook",
            &p.id,
            &receiver.url(),
            "--events",
            "client_event",
        ],
    );
    let list = support::cli(&redis, &["project", "list"]);
    assert_eq!(
        list["projects"][0]["webhook"]["url"],
        receiver.url().as_str()
    );
    node.wait_key(&p.secret);
    let url = format!("ws://{}/api/v1/ws?key={}", node.addr, p.public);
    let ch = "private-c";
    let ((mut a, _), (mut b, _)) = chatting(&url, &p, ch, ("u1", "u2"));
    events_until(
        (&mut a, &mut b, ch),
        Duration::from_secs(15),
        "a webhook from the node",
        || !receiver.hooks().is_empty(),
    );
    let hook = &receiver.hooks()[0];
    assert_eq!(hook.key.as_deref(), Some(p.public.as_str()));
    assert!(hook.signed_with(&p.token_secret));
}

/// Occupy a fresh channel of each project's connection (each `channel_occupied` is a
/// webhook event of that project).
fn occupy_fresh(conns: &mut [Ws], k: &mut u32) {
    *k += 1;
    for ws in conns.iter_mut() {
        common::subscribe(ws, &format!("fresh-{k}"));
    }
}

/// Issue 20, finding 6: by default a webhook never reaches a loopback address, however
/// the URL spells it (dotted, hex, decimal, short, a name, IPv4-mapped IPv6); each
/// attempt is refused at connect time, counted as failed and logged. With
/// `webhook_allow_private_addresses` the same kind of URL is reached.
#[test]
fn webhooks_to_private_addresses_are_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let s = Server::start_with(Options {
        config: "metrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n".into(),
        log_file: Some(log.clone()),
        ..Options::default()
    });
    let receiver = Receiver::start(&[]);
    let port = receiver.addr.port();
    let hosts = [
        "127.0.0.1",
        "0x7f000001",
        "2130706433",
        "127.1",
        "localhost",
        "[::ffff:127.0.0.1]",
    ];
    let mut conns = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let p = project(&s, &format!("ssrf{i}"));
        let url = format!("http://{host}:{port}/hooks/ringcast");
        cli(&s.data_dir, &["project", "set-webhook", &p.id, &url]);
        conns.push(s.ws(&p.public));
    }
    // The projects whose attempts were refused, by the log's project_index.
    let refused = || {
        let lines = common::log_lines(&log, |m| {
            m.contains("webhook_allow_private_addresses is false")
        });
        let mut projects: Vec<u64> = lines
            .iter()
            .filter_map(|v| v["fields"]["project_index"].as_u64())
            .collect();
        projects.sort_unstable();
        projects.dedup();
        projects.len()
    };
    let mut k = 0;
    wait_for(
        Duration::from_secs(20),
        "every project's attempt refused",
        || {
            occupy_fresh(&mut conns, &mut k);
            let reached = receiver.hooks();
            assert!(
                reached.is_empty(),
                "a webhook reached 127.0.0.1: {:?}",
                reached[0].json()
            );
            std::thread::sleep(Duration::from_millis(200));
            refused() == hosts.len()
        },
    );
    assert!(receiver.hooks().is_empty());
    // A refusal is logged by the request's task and counted when the task reports back.
    wait_for(Duration::from_secs(5), "every refusal counted", || {
        scrape(&s, "ringcast_webhook_requests_total{result=\"failed\"}") >= hosts.len() as u64
    });
    assert_eq!(
        scrape(&s, "ringcast_webhook_requests_total{result=\"ok\"}"),
        0
    );

    // Allowed: a numeric spelling of 127.0.0.1 is resolved and reached.
    let s = Server::start_with(allowed());
    let p = project(&s, "allowed");
    let url = format!("http://0x7f000001:{port}/hooks/ringcast");
    cli(&s.data_dir, &["project", "set-webhook", &p.id, &url]);
    let ws = s.ws(&p.public);
    let mut conns = vec![ws];
    wait_for(Duration::from_secs(20), "the allowed webhook", || {
        occupy_fresh(&mut conns, &mut k);
        std::thread::sleep(Duration::from_millis(200));
        !receiver.hooks().is_empty()
    });
    assert!(receiver.hooks()[0].signed_with(&p.token_secret));
}

/// Issue 20, finding 8: a public-key holder churning subscribe/unsubscribe over many
/// channels filled the project's webhook queue with occupancy events (each vacate held
/// 3 s), so a real `member_added` that happened meanwhile was dropped. Now an occupancy
/// still queued is cancelled by its vacate, and half of the queue is kept for member and
/// client events: the member event arrives. The endpoint is slow (300 ms per request),
/// as a busy backend is, and the queue small (200 events) so the test is quick.
#[test]
fn subscribe_churn_does_not_crowd_out_a_member_event() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let s = Server::start_with(Options {
        config: "webhook_queue_events = 200\nmetrics_listen = \"127.0.0.1:0\"\n".into(),
        // The churn here is the flood itself: no per-connection subscribe rate in the
        // way (an env variable, so an older binary still starts).
        env: vec![
            ALLOW_PRIVATE_WEBHOOKS,
            ("RINGCAST_SUBSCRIBE_RATE_PER_CONNECTION", "1000000"),
        ],
        ..Options::default()
    });
    let p = project(&s, "churned");
    let script = vec![(200, Duration::from_millis(300)); 200];
    let receiver = Receiver::scripted(&script);
    cli(
        &s.data_dir,
        &["project", "set-webhook", &p.id, &receiver.url()],
    );
    // Wait until the server applied it: occupy new channels until one is reported.
    let mut probe = s.ws(&p.public);
    let mut k = 0;
    wait_for(Duration::from_secs(15), "the first webhook", || {
        occupy_fresh(std::slice::from_mut(&mut probe), &mut k);
        std::thread::sleep(Duration::from_millis(250));
        !receiver.hooks().is_empty()
    });

    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let churners: Vec<_> = (0..4)
        .map(|c| {
            let (stop, cycles, url) = (stop.clone(), cycles.clone(), s.ws_url(&p.public));
            std::thread::spawn(move || {
                let (mut ws, _) = tungstenite::connect(url.as_str()).expect("ws");
                set_timeout(&mut ws, Duration::from_secs(10));
                next_json(&mut ws);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ch = format!("churn-{c}-{}", i % 300);
                    common::subscribe(&mut ws, &ch);
                    send_json(&mut ws, json!({"type": "unsubscribe", "channel": ch}));
                    assert_eq!(next_json(&mut ws)["type"], "unsubscribed");
                    cycles.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    // Well past what the queue holds before the real event happens.
    wait_for(Duration::from_secs(30), "1,000 churn cycles", || {
        cycles.load(Ordering::Relaxed) >= 1000
    });
    let room = "presence-room";
    let (_member, _) = member(&s.ws_url(&p.public), &p, room, "u1");
    let arrived = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(15), "member_added of u1", || {
            names(&about(&receiver, room)).contains(&"member_added:u1".to_string())
        })
    });
    stop.store(true, Ordering::Relaxed);
    for t in churners {
        t.join().unwrap();
    }
    eprintln!(
        "churn: {} subscribe/unsubscribe cycles, {} webhook events dropped (queue full)",
        cycles.load(Ordering::Relaxed),
        scrape(
            &s,
            "ringcast_webhook_events_dropped_total{reason=\"queue_full\"}"
        )
    );
    assert!(
        arrived.is_ok(),
        "member_added never arrived during the churn ({} cycles)",
        cycles.load(Ordering::Relaxed)
    );
}
