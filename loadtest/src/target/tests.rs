//! Unit tests of the target dialects: stamps, signed queries, inbound classification.
use super::*;
use crate::http::parse_response;

fn target(kind: Kind) -> Target {
    Target {
        kind,
        endpoint: crate::net::parse_url("http://127.0.0.1:8080").unwrap(),
        publish_endpoint: None,
        secret_key: "sk_x".into(),
        public_key: "pk_y".into(),
        tag: "ab".into(),
        channel_prefix: "lt".into(),
        token: None,
        publish: PublishApi::default_for(kind),
        app_id: "1000001".into(),
        app_secret: "ts_z".into(),
        idempotency_keys: false,
        tls: None,
        publish_tls: None,
    }
}

#[test]
fn private_runs_name_their_channels_and_send_the_token() {
    let mut t = target(Kind::Ringcast);
    assert_eq!(t.channel_name(2), "ltabc2");
    t.channel_prefix = "private-lt".into();
    t.token = Some("h.p.s".into());
    assert_eq!(t.channel_name(2), "private-ltabc2");
    let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(2, true)).unwrap();
    assert_eq!(v["token"], "h.p.s");
    assert_eq!(v["channel"], "private-ltabc2");
    let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(2, false)).unwrap();
    assert!(v.get("token").is_none());
}

#[test]
fn uws_is_driven_like_ringcast() {
    let (r, u) = (target(Kind::Ringcast), target(Kind::Uws));
    assert_eq!(u.ws_path(0), r.ws_path(0));
    assert_eq!(u.publish, PublishApi::Native);
    assert_eq!(u.subscribe_json(1, true), r.subscribe_json(1, true));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    r.write_publish(&mut a, 3, 7, 1, 0);
    u.write_publish(&mut b, 3, 7, 1, 0);
    assert_eq!(a, b);
    // The peer's frame, as it sends it.
    let msg = br#"{"type":"message","channel":"ltabc3","event":"lt","data":{"t":7,"seq":1},"id":"0123456789abcdef0000"}"#;
    assert_eq!(u.classify(msg), Inbound::Message { t: 7, seq: 1 });
    assert_eq!(
        u.classify(br#"{"type":"subscribed","channel":"ltabc3"}"#),
        Inbound::Subscribed
    );
    assert_eq!(u.kind.name(), "uws");
}

#[test]
fn publishers_use_the_publish_endpoint_when_set() {
    let mut t = target(Kind::Ringcast);
    assert_eq!(t.for_publishers().endpoint.addr, t.endpoint.addr);
    t.publish_endpoint = Some(crate::net::parse_url("http://127.0.0.1:8081").unwrap());
    let p = t.for_publishers();
    assert_eq!(p.endpoint.addr.port(), 8081);
    assert_eq!(p.endpoint.host, "127.0.0.1:8081");
    // Subscribers keep the original endpoint and the same channel names.
    assert_eq!(t.endpoint.addr.port(), 8080);
    assert_eq!(p.channel_name(3), t.channel_name(3));
}

/// Split a request we wrote into head and body and check Content-Length matches.
fn body_of(req: &[u8]) -> &[u8] {
    let head_end = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = std::str::from_utf8(&req[..head_end]).unwrap();
    let cl: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(cl, req.len() - head_end, "{head}");
    &req[head_end..]
}

#[test]
fn ringcast_publish_is_valid_json_with_right_length() {
    let t = target(Kind::Ringcast);
    for pad in [0, 1, 100] {
        let mut out = Vec::new();
        t.write_publish(&mut out, 3, 1_700_000_000_123_456_789, 42, pad);
        let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
        assert_eq!(v["channel"], "ltabc3");
        assert_eq!(v["data"]["t"], 1_700_000_000_123_456_789u64);
        assert_eq!(v["data"]["seq"], 42);
    }
}

#[test]
fn ringcast_batch_is_valid_json_with_right_length() {
    let t = target(Kind::Ringcast);
    let mut out = Vec::new();
    t.write_publish_batch(&mut out, [(0, 5), (2, 6)].into_iter(), 77, 3);
    assert!(out.starts_with(b"POST /api/v1/publish/batch HTTP/1.1\r\n"));
    let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
    let m = v["messages"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[1]["channel"], "ltabc2");
    assert_eq!(
        (m[1]["data"]["t"].as_u64(), m[1]["data"]["seq"].as_u64()),
        (Some(77), Some(6))
    );
    assert_eq!(m[0]["data"]["pad"], "xxx");
}

#[test]
fn nchan_publish_is_raw_data() {
    let t = target(Kind::Nchan);
    let mut out = Vec::new();
    t.write_publish(&mut out, 0, 5, 6, 10);
    assert!(out.starts_with(b"POST /pub/ltabc0 HTTP/1.1\r\n"));
    let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
    assert_eq!((v["t"].as_u64(), v["seq"].as_u64()), (Some(5), Some(6)));
    assert_eq!(t.ws_path(7), "/sub/ltabc7");
    // And the request parser agrees about where a response ends, as a sanity check.
    assert!(
        parse_response(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", false)
            .unwrap()
            .is_some()
    );
}

#[test]
fn classifies_ringcast_frames() {
    let t = target(Kind::Ringcast);
    assert_eq!(
        t.classify(
            br#"{"type":"message","channel":"c","event":"e","data":{"t":12,"seq":3},"id":"9"}"#
        ),
        Inbound::Message { t: 12, seq: 3 }
    );
    // The timestamp inside data wins over anything before it.
    assert_eq!(
        t.classify(br#"{"type":"message","channel":"c","event":"e","data":{"seq":4, "t": 99}}"#),
        Inbound::Message { t: 99, seq: 4 }
    );
    assert_eq!(
        t.classify(br#"{"type":"subscribed","channel":"c"}"#),
        Inbound::Subscribed
    );
    assert_eq!(
        t.classify(br#"{"type":"connected","connection_id":"x","heartbeat_s":25}"#),
        Inbound::Connected
    );
    assert_eq!(
        t.classify(br#"{"type":"error","code":"x","message":"y"}"#),
        Inbound::Error
    );
    assert_eq!(
        t.classify(br#"{"type":"message","data":{"t":"x"}}"#),
        Inbound::Other
    );
    assert_eq!(t.classify(b""), Inbound::Other);
    assert_eq!(
        t.classify(br#"{"t":99999999999999999999999,"seq":1}"#),
        Inbound::Other
    );
}

/// Pusher's worked example (pusher/docs, library_auth_reference/rest-api.md,
/// "Worked authentication example"): app 3, its key, secret, timestamp and body
/// give this `body_md5` and `auth_signature`.
#[test]
fn pusher_signature_matches_the_worked_example() {
    let body = br#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
    let q = pusher_signed_query(
        "278d425bdf160c739803",
        "7ad3773142a6692b25b8",
        "POST",
        "/apps/3/events",
        1353088179,
        body,
    );
    assert_eq!(
        q,
        "auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0\
         &body_md5=ec365a775a4cd0599faeb73354201b6f\
         &auth_signature=da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"
    );
    // Anything signed changes the signature.
    let other = pusher_signed_query(
        "278d425bdf160c739803",
        "7ad3773142a6692b25b8",
        "POST",
        "/apps/4/events",
        1353088179,
        body,
    );
    assert_ne!(q[q.len() - 64..], other[other.len() - 64..]);
}

/// The path and query of a request we wrote.
fn target_of(req: &[u8]) -> &str {
    let line =
        std::str::from_utf8(&req[..req.windows(2).position(|w| w == b"\r\n").unwrap()]).unwrap();
    line.strip_prefix("POST ")
        .unwrap()
        .strip_suffix(" HTTP/1.1")
        .unwrap()
}

#[test]
fn pusher_publish_is_signed_with_data_as_a_string() {
    let t = target(Kind::Pusher);
    assert_eq!(t.publish, PublishApi::Pusher);
    for pad in [0, 5] {
        let mut out = Vec::new();
        let ts_ns = 1_700_000_000_987_654_321;
        t.write_publish(&mut out, 3, ts_ns, 42, pad);
        assert!(!String::from_utf8_lossy(&out).contains("X-Api-Key"));
        let body = body_of(&out);
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["name"], "lt");
        assert_eq!(v["channel"], "ltabc3");
        // data is a string holding our stamp as JSON.
        let data: serde_json::Value = serde_json::from_str(v["data"].as_str().unwrap()).unwrap();
        assert_eq!(data["t"], ts_ns);
        assert_eq!(data["seq"], 42);
        if pad > 0 {
            assert_eq!(data["pad"], "xxxxx");
        }
        // The query is exactly what the signer gives for this body and second.
        let want = pusher_signed_query(
            "pk_y",
            "ts_z",
            "POST",
            "/apps/1000001/events",
            1_700_000_000,
            body,
        );
        assert_eq!(target_of(&out), format!("/apps/1000001/events?{want}"));
    }
}

#[test]
fn pusher_batch_goes_to_batch_events() {
    let t = target(Kind::Pusher);
    let mut out = Vec::new();
    t.write_publish_batch(&mut out, [(0, 5), (2, 6)].into_iter(), 77_000_000_000, 0);
    let body = body_of(&out);
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let b = v["batch"].as_array().unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!(b[1]["channel"], "ltabc2");
    assert_eq!(b[1]["name"], "lt");
    assert_eq!(
        parse_stamp_escaped(serde_json::to_string(&b[1]["data"]).unwrap().as_bytes()),
        Some((77_000_000_000, 6))
    );
    let want = pusher_signed_query(
        "pk_y",
        "ts_z",
        "POST",
        "/apps/1000001/batch_events",
        77,
        body,
    );
    assert_eq!(
        target_of(&out),
        format!("/apps/1000001/batch_events?{want}")
    );
}

#[test]
fn pusher_target_can_publish_natively() {
    let mut t = target(Kind::Pusher);
    t.publish = PublishApi::Native;
    let mut out = Vec::new();
    t.write_publish(&mut out, 1, 9, 8, 0);
    assert!(out.starts_with(b"POST /api/v1/publish HTTP/1.1\r\n"));
    assert!(String::from_utf8_lossy(&out).contains("\r\nX-Api-Key: sk_x\r\n"));
    let v: serde_json::Value = serde_json::from_slice(body_of(&out)).unwrap();
    assert_eq!(
        (v["data"]["t"].as_u64(), v["data"]["seq"].as_u64()),
        (Some(9), Some(8))
    );
    assert_eq!(v["event"], "lt");
}

#[test]
fn idempotency_keys_are_fresh_per_publish_when_asked() {
    let mut t = target(Kind::Ringcast);
    let key_of = |out: &[u8]| {
        let text = String::from_utf8_lossy(out).to_string();
        text.lines()
            .find_map(|l| l.strip_prefix("Idempotency-Key: ").map(str::to_string))
    };
    let mut out = Vec::new();
    t.write_publish(&mut out, 1, 9, 8, 0);
    assert_eq!(key_of(&out), None, "off by default");
    t.idempotency_keys = true;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    t.write_publish(&mut a, 1, 9, 8, 0);
    t.write_publish(&mut b, 1, 9, 8, 0);
    let (ka, kb) = (key_of(&a).unwrap(), key_of(&b).unwrap());
    assert!(ka.starts_with("ab-") && ka != kb, "{ka} {kb}");
}

#[test]
fn pusher_connects_and_subscribes_with_protocol_7_frames() {
    let t = target(Kind::Pusher);
    assert_eq!(
        t.ws_path(4),
        "/app/pk_y?protocol=7&client=ringcast-loadtest&version=1"
    );
    assert!(t.uses_subscribe_frames());
    let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(4, true)).unwrap();
    assert_eq!(v["event"], "pusher:subscribe");
    assert_eq!(v["data"]["channel"], "ltabc4");
    let v: serde_json::Value = serde_json::from_str(&t.subscribe_json(4, false)).unwrap();
    assert_eq!(v["event"], "pusher:unsubscribe");
    let v: serde_json::Value = serde_json::from_slice(t.pusher_pong()).unwrap();
    assert_eq!(v["event"], "pusher:pong");
}

#[test]
fn classifies_pusher_frames() {
    let t = target(Kind::Pusher);
    // ringcast's shape (event first) and another key order.
    assert_eq!(
        t.classify(br#"{"event":"lt","channel":"ltabc0","data":"{\"t\":12,\"seq\":3}"}"#),
        Inbound::Message { t: 12, seq: 3 }
    );
    assert_eq!(
        t.classify(
            br#"{"channel":"ltabc0","data":"{\"seq\":4,\"t\":99,\"pad\":\"xx\"}","event":"lt"}"#
        ),
        Inbound::Message { t: 99, seq: 4 }
    );
    // data sent as an object rather than a string is read as well.
    assert_eq!(
        t.classify(br#"{"event":"lt","channel":"c","data":{"t":5,"seq":6}}"#),
        Inbound::Message { t: 5, seq: 6 }
    );
    // Another event on the same channel is not a delivery, nor is a longer name.
    assert_eq!(
        t.classify(br#"{"event":"lt2","channel":"c","data":"{\"t\":5,\"seq\":6}"}"#),
        Inbound::Other
    );
    assert_eq!(
        t.classify(br#"{"event":"lt","channel":"c","data":"{\"t\":\"x\"}"}"#),
        Inbound::Other
    );
    assert_eq!(
        t.classify(
            br#"{"event":"pusher:connection_established","data":"{\"socket_id\":\"1.2\",\"activity_timeout\":120}"}"#
        ),
        Inbound::Connected
    );
    assert_eq!(
        t.classify(
            br#"{"event":"pusher_internal:subscription_succeeded","channel":"ltabc0","data":"{}"}"#
        ),
        Inbound::Subscribed
    );
    assert_eq!(
        t.classify(br#"{"event":"pusher:error","data":{"code":4301,"message":"x"}}"#),
        Inbound::Error
    );
    assert_eq!(
        t.classify(
            br#"{"event":"pusher:subscription_error","channel":"c","data":"{\"type\":\"AuthError\"}"}"#
        ),
        Inbound::Error
    );
    assert_eq!(
        t.classify(br#"{"event":"pusher:ping","data":{}}"#),
        Inbound::Ping
    );
    assert_eq!(
        t.classify(br#"{"event":"pusher:pong","data":"{}"}"#),
        Inbound::Other
    );
    assert_eq!(t.classify(b""), Inbound::Other);
    assert_eq!(t.classify(b"\"event\":\"lt\""), Inbound::Other);
}

#[test]
fn realistic_padding_is_json_of_at_least_the_size_and_differs_per_message() {
    // `write_items` directly: flipping `--pad-json` here would race other tests.
    let stamp = |seq: u64| {
        let mut out = format!("{{\"t\":7,\"seq\":{seq}").into_bytes();
        write_items(&mut out, seq, 1024, b"\"");
        out.push(b'}');
        out
    };
    let (a, b) = (stamp(1), stamp(2));
    let v: serde_json::Value = serde_json::from_slice(&a).expect("valid JSON");
    assert_eq!(v["seq"], 1);
    assert!(v["items"].as_array().is_some_and(|i| !i.is_empty()), "{v}");
    assert!(a.len() >= 1024, "{}", a.len());
    assert_ne!(a, b);
    assert_eq!(parse_stamp(&a), Some((7, 1)));
}
