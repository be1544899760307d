//! The rest of the `server` tests (one test binary, two files).

use super::*;

#[test]
fn hundreds_of_subscribers_over_two_workers_get_each_message_once() {
    let s = Server::start();
    let p = s.project("many", "100000/s");
    let mut clients: Vec<Ws> = (0..300).map(|_| s.ws(&p.public)).collect();
    for ws in clients.iter_mut() {
        subscribe(ws, "fan");
    }
    let n = 20;
    for i in 0..n {
        assert_eq!(s.publish(&p.secret, "fan", "tick", json!({"i": i})).0, 202);
    }
    for ws in clients.iter_mut() {
        for i in 0..n {
            let m = next_json(ws);
            assert_eq!(m["data"]["i"], i, "in order, exactly once");
        }
    }
    // No duplicates trailing behind.
    for ws in clients.iter_mut().take(20) {
        expect_silence(ws, Duration::from_millis(50));
    }
}

#[test]
fn unsubscribe_stops_delivery() {
    let s = Server::start();
    let p = s.project("u", "100000/s");
    let mut ws = s.ws_on(&p.public, "c");
    assert_eq!(s.publish(&p.secret, "c", "e", json!("one")).0, 202);
    assert_eq!(next_json(&mut ws)["data"], "one");
    send_json(&mut ws, json!({"type": "unsubscribe", "channel": "c"}));
    assert_eq!(
        next_json(&mut ws),
        json!({"type": "unsubscribed", "channel": "c"})
    );
    assert_eq!(s.publish(&p.secret, "c", "e", json!("two")).0, 202);
    expect_silence(&mut ws, Duration::from_millis(300));
}

#[test]
fn client_protocol_replies_and_errors_keep_the_connection() {
    let s = Server::start_with(Options::config("max_subscriptions_per_connection = 2\n"));
    let p = s.project("proto", "100000/s");
    let mut ws = s.ws(&p.public);
    send_json(&mut ws, json!({"type": "ping"}));
    assert_eq!(next_json(&mut ws), json!({"type": "pong"}));
    ws.send(tungstenite::Message::text("{not json")).unwrap();
    let e = next_json(&mut ws);
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("invalid_json"))
    );
    send_json(&mut ws, json!({"type": "dance"}));
    assert_eq!(next_json(&mut ws)["code"], "unknown_type");
    for bad in [
        json!(""),
        json!(5),
        json!("x".repeat(101)),
        json!("a\u{1}b"),
    ] {
        send_json(&mut ws, json!({"type": "subscribe", "channel": bad}));
        assert_eq!(next_json(&mut ws)["code"], "invalid_channel");
    }
    subscribe(&mut ws, "one");
    subscribe(&mut ws, "one"); // idempotent, still one subscription
    subscribe(&mut ws, "two");
    send_json(&mut ws, json!({"type": "subscribe", "channel": "three"}));
    assert_eq!(next_json(&mut ws)["code"], "too_many_subscriptions");
    assert_eq!(s.publish(&p.secret, "one", "e", json!("x")).0, 202);
    let m = next_json(&mut ws);
    assert_eq!(m["channel"], "one");
    expect_silence(&mut ws, Duration::from_millis(200));
}

#[test]
fn revoked_public_key_closes_open_sockets_with_4001() {
    let s = Server::start();
    let p = s.project("rv", "100000/s");
    let other = s.project("keep", "100000/s");
    let mut ws = s.ws_on(&p.public, "c");
    let mut keep = s.ws_on(&other.public, "c");
    let start = Instant::now();
    cli(&s.data_dir, &["key", "revoke", &p.public]);
    assert_eq!(close_code(&mut ws), Some(4001));
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(s.publish(&other.secret, "c", "e", json!("still")).0, 202);
    assert_eq!(next_json(&mut keep)["data"], "still");
}

#[test]
fn stalled_subscriber_is_closed_with_4008_and_others_get_everything() {
    let s = Server::start_with(Options::config("send_backlog_bytes = 65536\n").workers(2));
    let p = s.project("slow", "1000000/s");
    let mut healthy = s.ws_on(&p.public, "c");
    let mut stalled = s.ws_on(&p.public, "c");
    // The stalled client stops reading; the healthy one reads on another thread.
    let n = 1500;
    let reader = std::thread::spawn(move || {
        let mut got = 0;
        while got < n {
            let m = next_json(&mut healthy);
            assert_eq!(m["data"]["i"], got);
            got += 1;
        }
        got
    });
    let blob = "x".repeat(8000);
    let agent = agent();
    for i in 0..n {
        let body = json!({"channel": "c", "event": "e", "data": {"i": i, "pad": blob}});
        let resp = s.agent_publish(&agent, &p.secret, &body.to_string());
        assert_eq!(resp.status().as_u16(), 202);
    }
    assert_eq!(reader.join().unwrap(), n);
    // Now the stalled client reads: old frames, then the 4008 close.
    set_timeout(&mut stalled, Duration::from_secs(10));
    assert_eq!(close_code(&mut stalled), Some(4008));
    assert_eq!(s.health().0, 200);
}

#[test]
fn sigterm_closes_websockets_with_1001_and_exits_zero() {
    let mut s = Server::start();
    let p = s.project("bye", "100000/s");
    let mut ws = s.ws_on(&p.public, "c");
    let start = Instant::now();
    // The reader may start after the close arrives: the frame waits in its socket.
    let reader = std::thread::spawn(move || close_code(&mut ws));
    let status = s
        .terminate(Duration::from_secs(5))
        .expect("exited within 5 s");
    assert!(status.success(), "{status:?}");
    assert_eq!(reader.join().unwrap(), Some(1001));
    assert!(start.elapsed() < Duration::from_secs(6));
}

#[test]
fn per_project_websocket_limit_answers_503_and_frees_on_close() {
    let s = Server::start_with(Options::config("max_ws_connections_per_project = 2\n"));
    let p = s.project("lim", "100/s");
    let other = s.project("other", "100/s");
    let first = s.ws(&p.public);
    let _second = s.ws(&p.public);
    match tungstenite::connect(s.ws_url(&p.public)) {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503);
            let body: Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or(b"")).unwrap();
            assert_eq!(body["error"]["code"], "unavailable");
        }
        other => panic!("expected 503, got {:?}", other.map(|_| ())),
    }
    // Another project is not affected.
    let _o = s.ws(&other.public);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match tungstenite::connect(s.ws_url(&p.public)) {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("slot was not released: {e}"),
        }
    }
}

#[test]
fn rate_headers_on_every_publish_answer_once_the_key_is_known() {
    let s = Server::start_with(Options::config("max_body_bytes = 512\n"));
    let p = s.project("hdr", "50/s");
    let big = format!(
        r#"{{"channel":"c","event":"e","data":"{}"}}"#,
        "x".repeat(600)
    );
    let cases: [(&str, &[u8], u16); 4] = [
        (
            "application/json",
            br#"{"channel":"c","event":"e","data":{}}"#,
            202,
        ),
        ("application/json", b"{bad", 400),
        ("text/plain", b"{}", 415),
        ("application/json", big.as_bytes(), 413),
    ];
    for (ct, body, want) in cases {
        let (status, head, _) = s.raw_publish(&p.secret, ct, body);
        assert_eq!(status, want);
        assert_eq!(
            header(&head, "ratelimit-limit").as_deref(),
            Some("50"),
            "{want}"
        );
        assert!(header(&head, "ratelimit-remaining").is_some(), "{want}");
        assert!(header(&head, "ratelimit-reset").is_some(), "{want}");
    }
    // Refused requests spend nothing: only the one 202 (and the key probe's 400s) ran.
    let (_, head, _) = s.raw_publish(&p.secret, "text/plain", b"{}");
    let remaining: u32 = header(&head, "ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining >= 48, "{remaining}");
    // Without a known key there is no project, hence no rate headers.
    let (status, head, _) = s.raw_publish("", "application/json", b"{}");
    assert_eq!(status, 401);
    assert!(header(&head, "ratelimit-limit").is_none());
}

#[test]
fn head_health_has_no_body_and_keeps_the_stream_in_step() {
    let s = Server::start();
    let resp = s.raw(
        b"HEAD /health HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    let text = String::from_utf8(resp).unwrap();
    let (first, rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(first.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(header(first, "content-length").is_some());
    assert!(
        rest.starts_with("HTTP/1.1 404 "),
        "HEAD must not send a body: {text}"
    );
}

#[test]
fn messages_published_in_quick_succession_all_arrive_in_order() {
    // Write coalescing must never reorder, drop or hold back the last frame.
    let s = Server::start_with(Options::config("write_coalesce_ms = 20\n"));
    let p = s.project("co", "1000000/s");
    let mut ws = s.ws_on(&p.public, "c");
    let body = r#"{"channel":"c","event":"e","data":{"i":N}}"#;
    let mut req = String::new();
    for i in 0..200 {
        let b = body.replace('N', &i.to_string());
        req.push_str(&format!(
            "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            p.secret,
            b.len()
        ));
        if i % 50 == 49 {
            req.push_str("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let resp = String::from_utf8(s.raw(req.as_bytes())).unwrap();
            assert_eq!(resp.matches("202 Accepted").count(), 50);
            req.clear();
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for i in 0..200 {
        assert_eq!(next_json(&mut ws)["data"]["i"], i);
    }
    expect_silence(&mut ws, Duration::from_millis(100));
}

#[test]
fn the_epoll_fallback_serves_the_same_contract() {
    let s = Server::start_with(Options {
        env: vec![("RINGCAST_FORCE_EPOLL", "1")],
        ..Options::default()
    });
    assert!(s.banner.contains("epoll"), "{}", s.banner);
    let p = s.project("ep", "100000/s");
    let mut clients: Vec<Ws> = (0..20).map(|_| s.ws(&p.public)).collect();
    for ws in clients.iter_mut() {
        subscribe(ws, "c");
    }
    for i in 0..5 {
        assert_eq!(s.publish(&p.secret, "c", "e", json!({"i": i})).0, 202);
    }
    for ws in clients.iter_mut() {
        for i in 0..5 {
            assert_eq!(next_json(ws)["data"]["i"], i);
        }
    }
    assert_eq!(s.health().0, 200);
}

#[test]
fn the_default_driver_is_io_uring_where_available() {
    let s = Server::start();
    assert!(
        s.banner.contains("io_uring") || s.banner.contains("epoll"),
        "{}",
        s.banner
    );
    assert!(s.banner.contains("2 workers"), "{}", s.banner);
}

#[test]
fn an_answer_before_the_body_arrived_closes_the_connection() {
    // Otherwise the late body bytes would be read as the next request (desync).
    let s = Server::start();
    for head in [
        "POST /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 33\r\n\r\n",
        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n",
    ] {
        let mut c = std::net::TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        use std::io::{Read, Write};
        c.write_all(head.as_bytes()).unwrap();
        let mut first = vec![0u8; 4096];
        let n = c.read(&mut first).unwrap();
        let text = String::from_utf8_lossy(&first[..n]).to_string();
        assert!(text.starts_with("HTTP/1.1 4"), "{text}");
        // The "body" that follows looks like a request; it must not be answered.
        let _ = c.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        assert!(!rest.contains("HTTP/1.1 200"), "desync: {rest}");
    }
    assert_eq!(s.health().0, 200);
}

#[test]
fn deeply_nested_client_frames_get_an_error_and_the_socket_stays_up() {
    let s = Server::start();
    let p = s.project("nest", "100/s");
    let mut ws = s.ws(&p.public);
    let deep = format!(
        r#"{{"type":"ping","x":{}{}}}"#,
        "[".repeat(8000),
        "]".repeat(8000)
    );
    ws.send(tungstenite::Message::text(deep)).unwrap();
    assert_eq!(next_json(&mut ws)["code"], "invalid_json");
    send_json(&mut ws, json!({"type": "ping"}));
    assert_eq!(next_json(&mut ws), json!({"type": "pong"}));
    assert_eq!(s.health().0, 200);
}

#[test]
fn console_is_served_only_when_turned_on() {
    let answer =
        |s: &Server, req: &str| String::from_utf8_lossy(&s.raw(req.as_bytes())).to_string();
    let get = |s: &Server, path: &str| {
        answer(
            s,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
    };
    let off = Server::start();
    let resp = get(&off, "/console");
    assert!(resp.starts_with("HTTP/1.1 404 "), "{resp}");

    let on = Server::start_with(Options::config("console = true\n"));
    let page = get(&on, "/console");
    assert!(page.starts_with("HTTP/1.1 200 "), "{page}");
    assert!(page.contains("Content-Type: text/html"), "{page}");
    let loads_client = page.contains("/console/ringcast.js");
    assert!(loads_client, "the page loads the client");
    let js = get(&on, "/console/ringcast.js");
    assert!(js.starts_with("HTTP/1.1 200 "), "{js}");
    assert!(js.contains("Content-Type: text/javascript"), "{js}");
    let is_client = js.contains("export class Ringcast");
    assert!(is_client, "the client module itself");
    let post = answer(
        &on,
        "POST /console HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
}
