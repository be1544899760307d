//! The rest of the `pusher_rest` tests (one test binary, two files).

use super::*;

#[test]
fn every_signature_refusal_is_401_with_a_message() {
    let s = Server::start();
    let a = app(&s, "sig", "10000/s");
    let b = app(&s, "other", "10000/s");
    let body = json!({"name": "e", "channel": "c", "data": "x"});
    let ok = Req::post(&a, "/events", &body);
    assert_eq!(ok.send(&s).0, 200);

    let unauthorized = |r: &Req, why: &str| {
        let (st, head, v) = r.send(&s);
        assert_eq!(st, 401, "{why}: {head} {v}");
        assert_eq!(error_code(&v), "unauthorized", "{why}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains(&a.secret), "{why}: {msg}");
        msg.to_string()
    };

    for missing in [
        "auth_key",
        "auth_timestamp",
        "auth_version",
        "auth_signature",
    ] {
        let mut r = ok.clone();
        r.drop.push(missing);
        let msg = unauthorized(&r, missing);
        assert!(msg.contains(missing), "{msg}");
    }
    let mut r = ok.clone();
    r.version = "2.0".into();
    unauthorized(&r, "auth_version 2.0");

    // The timestamp window: 600 s each way is in, 601 out.
    for (delta, accepted) in [(600i64, true), (-600, true), (601, false), (-601, false)] {
        start_of_second();
        let mut r = ok.clone();
        r.timestamp = (unix_now() as i64 + delta) as u64;
        let (st, _, v) = r.send(&s);
        assert_eq!(st, if accepted { 200 } else { 401 }, "{delta}: {v}");
    }

    // App id and key: one message for every way of being wrong.
    let mut msgs = Vec::new();
    let mut r = ok.clone();
    r.key = "pk_0000000000000000000000000000".into();
    msgs.push(unauthorized(&r, "unknown key"));
    let mut r = ok.clone();
    r.key = b.key.clone();
    msgs.push(unauthorized(&r, "a key of another app"));
    let mut r = ok.clone();
    r.key = b.key.clone();
    r.secret = b.secret.clone();
    msgs.push(unauthorized(&r, "another app's key and secret"));
    let mut r = ok.clone();
    r.path = "/apps/999999999/events".into();
    msgs.push(unauthorized(&r, "unknown app id"));
    let mut r = ok.clone();
    r.path = format!("/apps/{}x/events", a.app_id);
    msgs.push(unauthorized(&r, "app id not a number"));
    assert!(msgs.windows(2).all(|w| w[0] == w[1]), "{msgs:?}");

    // body_md5.
    let mut r = ok.clone();
    r.body_md5 = Some(md5_hex(b"another body"));
    unauthorized(&r, "wrong body_md5");
    let mut r = ok.clone();
    r.drop.push("body_md5");
    unauthorized(&r, "body_md5 left out after signing");
    let mut r = ok.clone();
    r.body_md5 = Some(String::new());
    unauthorized(&r, "empty body_md5 with a body");
    // Signed without body_md5 at all, with a body.
    let mut r = ok.clone();
    r.body_md5 = Some("-".into());
    let q = r
        .query()
        .split('&')
        .filter(|p| !p.starts_with("body_md5="))
        .collect::<Vec<_>>()
        .join("&");
    let (st, _, v) = r.send_query(&s, &q);
    assert_eq!(st, 401, "{v}");
    // The MD5 of the empty body on a GET (the Python SDK sends it): accepted.
    let mut r = Req::new(&a, "GET", "/channels");
    r.body_md5 = Some(md5_hex(b""));
    assert_eq!(r.send(&s).0, 200);
    let mut r = Req::new(&a, "GET", "/channels");
    r.body_md5 = Some(md5_hex(b"x"));
    unauthorized(&r, "wrong body_md5 on a GET");

    // The signature.
    let mut r = ok.clone();
    r.secret = "ts_not_the_secret".into();
    let msg = unauthorized(&r, "wrong secret");
    // The same message as an unknown app (a public key must not tell its app id).
    assert_eq!(msg, msgs[0]);
    assert!(msg.starts_with("invalid signature"), "{msg}");
    let q = ok.query();
    let (before, sig) = q.rsplit_once("auth_signature=").unwrap();
    for bad in [&sig[..63], "zz", &sig.to_uppercase()[..]] {
        let (st, _, v) = ok.send_query(&s, &format!("{before}auth_signature={bad}"));
        // Uppercase hex is the same signature.
        let want = if bad.len() == 64 { 200 } else { 401 };
        assert_eq!(st, want, "{bad}: {v}");
    }
    // A signed parameter changed after signing.
    let r = Req::new(&a, "GET", "/channels").param("filter_by_prefix", "a");
    let q = r
        .query()
        .replace("filter_by_prefix=a", "filter_by_prefix=b");
    assert_eq!(r.send_query(&s, &q).0, 401);
    // Another path than the one signed.
    let q = ok.query();
    let mut r = ok.clone();
    r.path = format!("/apps/{}/batch_events", a.app_id);
    assert_eq!(r.send_query(&s, &q).0, 401);
}

#[test]
fn rotated_secrets_verify_during_their_grace_only() {
    let s = Server::start();
    let a = app(&s, "rotate", "10000/s");
    let old = a.secret.clone();
    let signed = |secret: &str| {
        let mut r = Req::new(&a, "GET", "/channels");
        r.secret = secret.to_string();
        r.send(&s).0
    };
    // Rotate with this grace; wait until the new secret verifies.
    let rotate = |grace: &str, what: &str| {
        let args = [
            "project",
            "rotate-token-secret",
            &a.project_id,
            "--grace",
            grace,
        ];
        let v = cli(&s.data_dir, &args);
        let secret = v["token_secret"].as_str().unwrap().to_string();
        wait_for(Duration::from_secs(5), what, || signed(&secret) == 200);
        secret
    };
    // With a grace: both verify.
    let new = rotate("1h", "the new secret");
    assert_eq!(signed(&old), 200, "the old secret is in its grace");
    // Without: only the newest.
    rotate("0s", "the newest secret");
    assert_eq!(signed(&new), 401, "rotated out with no grace");
}

#[test]
fn query_body_and_route_refusals() {
    let s = Server::start();
    let a = app(&s, "refusals", "10000/s");
    let (mut n, id) = native_on(&s, &a, "c");
    let body = json!({"name": "e", "channel": "c", "data": "x"});

    // A parameter given twice (names compare case-insensitively): 400 before the
    // signature is even looked at.
    let r = Req::post(&a, "/events", &body);
    let q = r.query();
    for dup in [
        format!("{q}&auth_key={}", a.key),
        format!("{q}&AUTH_KEY={}", a.key),
    ] {
        let (st, _, v) = r.send_query(&s, &dup);
        assert_eq!((st, error_code(&v)), (400, "invalid_query"), "{v}");
    }

    // 413 from the declared size, before the body is read.
    let big = json!({"name": "e", "channel": "c", "data": "x".repeat(70_000)});
    let (st, _, v) = Req::post(&a, "/events", &big).send(&s);
    assert_eq!((st, error_code(&v)), (413, "payload_too_large"), "{v}");

    // Body validation.
    let bad_bodies = [
        (
            json!({"name": "pusher:x", "channel": "c", "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "pusher_internal:x", "channel": "c", "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channels": ["c", "c"], "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channels": (0..101).map(|i| format!("c{i}")).collect::<Vec<_>>(), "data": "x"}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channel": "c", "data": {"a": 1}}),
            "invalid_field",
        ),
        (
            json!({"name": "e", "channel": "c".repeat(101), "data": "x"}),
            "field_too_long",
        ),
        (
            json!({"name": "e".repeat(101), "channel": "c", "data": "x"}),
            "field_too_long",
        ),
        (json!({"channel": "c", "data": "x"}), "missing_field"),
        (
            json!({"name": "e", "channel": "c", "data": "x", "socket_id": "nope"}),
            "invalid_field",
        ),
    ];
    for (body, code) in bad_bodies {
        let (st, v) = trigger(&s, &a, body.clone());
        assert_eq!((st, error_code(&v)), (400, code), "{body}: {v}");
    }
    let mut r = Req::post(&a, "/events", &body);
    r.body = b"{not json".to_vec();
    let (st, _, v) = r.send(&s);
    assert_eq!((st, error_code(&v)), (400, "invalid_json"), "{v}");
    let mut r = Req::post(&a, "/events", &body);
    r.content_type = Some("text/plain");
    let (st, _, v) = r.send(&s);
    assert_eq!(st, 400, "{v}");
    expect_silence(&mut n, Duration::from_millis(200));

    // A GET with a body.
    let mut r = Req::new(&a, "GET", "/channels");
    r.body = b"{}".to_vec();
    assert_eq!(r.send(&s).0, 400);

    // Routes and methods.
    let (st, head, _) = Req::new(&a, "GET", "/events").send(&s);
    assert_eq!((st, header(&head, "allow").as_deref()), (405, Some("POST")));
    let (st, head, _) = Req::post(&a, "/channels", &body).send(&s);
    assert_eq!((st, header(&head, "allow").as_deref()), (405, Some("GET")));
    // terminate_connections is a POST (issue 25).
    let (st, head, _) = Req::new(&a, "GET", "/users/u1/terminate_connections").send(&s);
    assert_eq!((st, header(&head, "allow").as_deref()), (405, Some("POST")));
    for path in [
        "/nope",
        "/users/u1/terminate_connections/x",
        "/channels/c/members",
        "",
    ] {
        let (st, _, v) = Req::new(&a, "GET", path).send(&s);
        assert_eq!((st, error_code(&v)), (404, "not_found"), "{path}: {v}");
    }

    // socket_id leaves that connection out, in events and in batch_events.
    let (mut m, _) = native_on(&s, &a, "c");
    let (st, _) = trigger(
        &s,
        &a,
        json!({"name": "e", "channel": "c", "data": "1", "socket_id": id}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut m, "c", "e")["data"], "1");
    let (st, _) = batch(
        &s,
        &a,
        json!({"batch": [{"name": "e", "channel": "c", "data": "2", "socket_id": id}]}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut m, "c", "e")["data"], "2");
    expect_silence(&mut n, Duration::from_millis(300));
    // An id of nobody leaves nobody out.
    let (st, _) = trigger(
        &s,
        &a,
        json!({"name": "e", "channel": "c", "data": "3", "socket_id": "1.1"}),
    );
    assert_eq!(st, 200);
    assert_eq!(expect_message(&mut n, "c", "e")["data"], "3");
}

#[test]
fn pusher_off_and_the_quota_answer_403() {
    let s = Server::start_with(Options::config("metrics_listen = \"127.0.0.1:0\"\n"));
    let a = app(&s, "slow", "2/s");
    let body = json!({"name": "e", "channel": "c", "data": "x"});

    // Over the burst in one request: 403 and no Retry-After (waiting cannot help).
    let (st, head, v) = Req::post(
        &a,
        "/events",
        &json!({"name": "e", "channels": ["a", "b", "c"], "data": "x"}),
    )
    .send(&s);
    assert_eq!((st, error_code(&v)), (403, "rate_limited"), "{v}");
    assert_eq!(header(&head, "retry-after"), None, "{head}");

    // Over the quota: 403 with Retry-After and the rate headers.
    let mut statuses = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let (st, head, v) = Req::post(&a, "/events", &body).send(&s);
        statuses.push(st);
        if st == 403 {
            refused = Some((head, v));
            break;
        }
    }
    let (head, v) = refused.unwrap_or_else(|| panic!("never over quota: {statuses:?}"));
    assert_eq!(error_code(&v), "rate_limited", "{v}");
    let retry: u64 = header(&head, "retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1, "{head}");
    assert_eq!(
        header(&head, "ratelimit-remaining").as_deref(),
        Some("0"),
        "{head}"
    );
    // GETs cost nothing.
    assert_eq!(get(&s, &a, "/channels", &[]).0, 200);

    // The metrics count the Pusher API under its own label.
    let metrics = s.scrape();
    let pusher = |status: &str| {
        let series =
            format!("ringcast_publish_requests_total{{api=\"pusher\",status=\"{status}\"}}");
        common::metrics::sample(&metrics, &series)
    };
    assert!(pusher("200") >= 1.0, "{metrics:?}");
    assert!(pusher("403") >= 2.0, "{metrics:?}");

    // The Pusher switch off: 403 once signed, 401 still for what is not.
    cli(
        &s.data_dir,
        &["project", "set-limits", &a.project_id, "--pusher", "off"],
    );
    wait_for(
        Duration::from_secs(5),
        "the switch to reach the server",
        || get(&s, &a, "/channels", &[]).0 == 403,
    );
    let (st, v) = get(&s, &a, "/channels", &[]);
    assert_eq!((st, error_code(&v)), (403, "pusher_disabled"), "{v}");
    let (st, _, v) = Req::post(&a, "/events", &body).send(&s);
    assert_eq!((st, error_code(&v)), (403, "pusher_disabled"), "{v}");
    let mut r = Req::new(&a, "GET", "/channels");
    r.secret = "ts_wrong".into();
    assert_eq!(r.send(&s).0, 401);
}

/// A native client of a cluster node subscribed to `channel`, and its connection id.
fn node_client(node: &support::Node, key: &str, channel: &str) -> (Ws, String) {
    let url = format!("ws://{}/api/v1/ws?key={key}", node.addr);
    let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    let id = hello["connection_id"].as_str().unwrap().to_string();
    common::subscribe(&mut ws, channel);
    (ws, id)
}

#[test]
fn cluster_counts_are_cluster_wide_and_socket_id_excludes_on_another_node() {
    let Some(redis) = support::Redis::start() else {
        return;
    };
    let a_node = support::Node::start(&redis);
    let b_node = support::Node::start(&redis);
    let a = app_of(&support::cli(
        &redis,
        &["project", "create", "c", "--rate-limit", "10000/s"],
    ));
    for node in [&a_node, &b_node] {
        support::wait_for("the node to know the app", || {
            Req::new(&a, "GET", "/channels").send_to(node).0 == 200
        });
    }

    // Presence members on both nodes; a user on both counts once.
    let claims = |user: &str| {
        let c = json!({"channel": "presence-room", "exp": unix_now() + 600, "sub": user});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &c,
            &jsonwebtoken::EncodingKey::from_secret(a.secret.as_bytes()),
        )
        .unwrap()
    };
    let mut members = Vec::new();
    for (node, user) in [(&a_node, "u1"), (&b_node, "u2"), (&b_node, "u1")] {
        let (mut ws, _) = node_client(node, &a.key, "lobby");
        send_json(
            &mut ws,
            json!({"type": "subscribe", "channel": "presence-room", "token": claims(user)}),
        );
        assert_eq!(next_json(&mut ws)["type"], "subscribed");
        members.push(ws);
    }
    for node in [&a_node, &b_node] {
        support::wait_for("cluster-wide counts", || {
            let r = Req::new(&a, "GET", "/channels")
                .param("filter_by_prefix", "presence-")
                .param("info", "user_count,subscription_count");
            r.send_to(node).2
                == json!({"channels": {"presence-room": {"user_count": 2, "subscription_count": 3}}})
        });
        let (st, _, v) = Req::new(&a, "GET", "/channels/presence-room/users").send_to(node);
        assert_eq!(
            (st, v),
            (200, json!({"users": [{"id": "u1"}, {"id": "u2"}]}))
        );
    }

    // A trigger on node B with the socket_id of a connection on node A leaves it out,
    // and reaches everyone else on both nodes.
    let (mut on_a, a_id) = node_client(&a_node, &a.key, "news");
    let (mut other_a, _) = node_client(&a_node, &a.key, "news");
    let (mut on_b, _) = node_client(&b_node, &a.key, "news");
    redis.wait_numsub(&a.project_id, "news", 2);
    let body = json!({"name": "e", "channel": "news", "data": "x", "socket_id": a_id});
    let (st, _, v) = Req::post(&a, "/events", &body).send_to(&b_node);
    assert_eq!(st, 200, "{v}");
    for ws in [&mut other_a, &mut on_b] {
        assert_eq!(expect_message(ws, "news", "e")["data"], "x");
    }
    expect_silence(&mut on_a, Duration::from_millis(300));
}
