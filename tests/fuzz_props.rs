//! Fuzzing on the stable toolchain: proptest properties over the targets cargo-fuzz
//! would use (there is no nightly here, so no libFuzzer).
//!
//! Targets: the HTTP head parser (`http::parse::parse_head`), the publish body parser
//! (`publish::PublishParser::parse`), the WebSocket frame decoder with message
//! reassembly (`ws::frame::decode_frame` + `ws::message::Assembler`), and the key/quota
//! and config parsers (`quota::RateLimit::parse`, `config::Config::from_toml`), and the
//! Pusher REST signature check (`auth::pusher::parse_query` + `check_rest`).
//!
//! Each target gets raw arbitrary bytes (no panic, invariants hold whatever comes in)
//! and structured input near the valid shape (where the interesting branches are), with
//! a differential or round-trip oracle where one exists: serde_json for the publish
//! body, a reference encoder for frames, `Display` for rate limits.
//!
//! Quick by default (proptest's 256 cases per property, a few seconds in all); CI or a
//! long local run sets `PROPTEST_CASES` (read by proptest itself). A failing case is
//! saved in `tests/fuzz_props.proptest-regressions` and replayed first on every later run:
//! commit that file, and the crash stays a regression test.

#[allow(dead_code)]
#[path = "common/sign.rs"]
mod sign;

use proptest::prelude::*;
use ringcast::close_code::{PROTOCOL_ERROR, TOO_BIG};
use ringcast::{
    decode_frame, parse_head, pusher_check_rest, pusher_parse_query, Assembler, Config, Incoming,
    Opcode, PublishParser, PusherQueryError, RateLimit,
};

// ---------------------------------------------------------------------------------
// HTTP request head

/// A request head that is complete and well formed, from generated parts.
fn request_head() -> impl Strategy<Value = String> {
    let method = prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "OPTIONS"]);
    let path = "/[a-z0-9/._-]{0,30}(\\?[a-z0-9=&]{0,20})?";
    // `X-` keeps generated names off the framing headers, which have their own rules.
    let name = "X-[A-Za-z0-9-]{1,15}";
    let value = "[ -~]{0,40}";
    let headers = prop::collection::vec((name, value), 0..12);
    (method, path, headers, any::<bool>()).prop_map(|(m, p, hs, http10)| {
        let mut s = format!("{m} {p} HTTP/1.{}\r\n", if http10 { 0 } else { 1 });
        for (n, v) in hs {
            s.push_str(&format!("{n}: {}\r\n", v.trim()));
        }
        s.push_str("\r\n");
        s
    })
}

/// Every range a parsed head holds lies inside the head.
fn check_head(buf: &[u8], max_head: usize) -> Result<(), TestCaseError> {
    match parse_head(buf, max_head, 64) {
        Ok(Some(head)) => {
            prop_assert!(head.head_len <= buf.len() && head.head_len <= max_head);
            let in_head = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= head.head_len;
            prop_assert!(in_head(&head.path));
            for r in [
                &head.query,
                &head.content_type,
                &head.api_key,
                &head.ws_key,
                &head.ws_version,
            ]
            .into_iter()
            .flatten()
            {
                prop_assert!(in_head(r), "range {r:?} outside head of {}", head.head_len);
            }
        }
        // Incomplete input is "need more", and never beyond the head limit.
        Ok(None) => prop_assert!(buf.len() <= max_head),
        Err(_) => {}
    }
    Ok(())
}

proptest! {
    #[test]
    fn head_parser_survives_any_bytes(buf in prop::collection::vec(any::<u8>(), 0..600),
                                      max_head in 1usize..700) {
        check_head(&buf, max_head)?;
    }

    #[test]
    fn head_parser_on_near_valid_heads(head in request_head(), cut in any::<prop::sample::Index>(),
                                       flip in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let bytes = head.as_bytes();
        let parsed = parse_head(bytes, 16 * 1024, 64);
        prop_assert!(matches!(parsed, Ok(Some(_))), "valid head refused: {head:?} {parsed:?}");
        let h = parsed.unwrap().unwrap();
        prop_assert_eq!(h.head_len, bytes.len());
        // Every strict prefix of a valid head is incomplete, not an error.
        let prefix = &bytes[..cut.index(bytes.len())];
        prop_assert!(matches!(parse_head(prefix, 16 * 1024, 64), Ok(None)),
                     "prefix {:?} of a valid head was not 'need more'", String::from_utf8_lossy(prefix));
        // One corrupted byte: anything may happen except a panic or a bad range.
        let mut bad = bytes.to_vec();
        let i = flip.index(bad.len());
        bad[i] = byte;
        check_head(&bad, 16 * 1024)?;
    }
}

// ---------------------------------------------------------------------------------
// Publish body

/// A JSON value of bounded depth, as serde_json text.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        (-1e300f64..1e300).prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field name as a publisher might send it: mostly valid, sometimes not.
fn name() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        4 => "[a-z0-9._:-]{1,20}".prop_map(serde_json::Value::from),
        2 => any::<String>().prop_map(serde_json::Value::from),
        1 => "é{95,105}".prop_map(serde_json::Value::from),
        1 => json_value(),
    ]
}

/// A publish body: an object with some of channel/event/data and extra fields.
fn publish_body() -> impl Strategy<Value = serde_json::Value> {
    (
        prop::option::weighted(0.9, name()),
        prop::option::weighted(0.9, name()),
        prop::option::weighted(0.9, json_value()),
        prop::collection::btree_map("[a-z]{1,6}", json_value(), 0..3),
    )
        .prop_map(|(channel, event, data, extra)| {
            let mut m = serde_json::Map::new();
            for (k, v) in extra {
                m.insert(k, v);
            }
            if let Some(c) = channel {
                m.insert("channel".into(), c);
            }
            if let Some(e) = event {
                m.insert("event".into(), e);
            }
            if let Some(d) = data {
                m.insert("data".into(), d);
            }
            serde_json::Value::Object(m)
        })
}

/// The contract's rule for channel and event, written independently of the server.
fn valid_name(v: &serde_json::Value) -> Option<&str> {
    let s = v.as_str()?;
    let n = s.chars().count();
    ((1..=100).contains(&n) && !s.chars().any(|c| (c as u32) < 0x20 || c == '\u{7f}')).then_some(s)
}

proptest! {
    #[test]
    fn publish_parser_survives_any_bytes(body in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut parser = PublishParser::new();
        if let Ok(p) = parser.parse(&body) {
            // Whatever it accepts is valid JSON with a valid data field.
            let v: serde_json::Value = serde_json::from_slice(&body).expect("accepted invalid JSON");
            prop_assert!(v.is_object());
            let data: serde_json::Value = serde_json::from_slice(p.data).expect("data span");
            prop_assert!(data.is_object() || data.is_string());
        }
    }

    /// Differential: the parser agrees with serde_json plus the contract's rules.
    #[test]
    fn publish_parser_matches_the_contract(body in publish_body(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&body).unwrap()
        } else {
            serde_json::to_string(&body).unwrap()
        };
        let want = (|| {
            let channel = valid_name(body.get("channel")?)?;
            let event = valid_name(body.get("event")?)?;
            let data = body.get("data")?;
            (data.is_object() || data.is_string()).then_some((channel, event, data))
        })();
        let mut parser = PublishParser::new();
        let got = parser.parse(text.as_bytes());
        match (want, got) {
            (Some((channel, event, data)), Ok(p)) => {
                prop_assert_eq!(p.channel(), channel);
                prop_assert_eq!(p.event, event);
                // `data` is forwarded byte for byte: it must be the same JSON value.
                // (Compared after one serde_json parse on both sides: its default float
                // parsing is not exact, and that is not what is under test.)
                let forwarded: serde_json::Value = serde_json::from_slice(p.data).unwrap();
                let expected: serde_json::Value =
                    serde_json::from_str(&serde_json::to_string(data).unwrap()).unwrap();
                prop_assert_eq!(forwarded, expected);
            }
            (None, Err(_)) => {}
            (want, got) => prop_assert!(false, "body {text}: contract says {want:?}, parser says {got:?}"),
        }
        // The parser is reused per worker: a second parse of the same body agrees.
        let again = parser.parse(text.as_bytes()).map(|p| (p.channel().to_string(), p.data.len()));
        let first = PublishParser::new().parse(text.as_bytes()).map(|p| (p.channel().to_string(), p.data.len()));
        prop_assert_eq!(again, first);
    }
}

// ---------------------------------------------------------------------------------
// WebSocket frames and reassembly

const MAX_MESSAGE: usize = 300;

/// A client frame as the RFC says to encode it (the reference encoder).
fn encode_client(first: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = vec![first];
    if payload.len() < 126 {
        out.push(0x80 | payload.len() as u8);
    } else if payload.len() <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// Decode frames from `buf` and feed them to an assembler, checking every invariant.
fn decode_all(buf: &mut [u8]) -> Result<(), TestCaseError> {
    let mut asm = Assembler::default();
    let mut off = 0;
    while off < buf.len() {
        let len = buf.len() - off;
        let view = match decode_frame(&mut buf[off..], MAX_MESSAGE) {
            Ok(Some(v)) => v,
            Ok(None) => break,
            Err(reason) => {
                prop_assert!(
                    [PROTOCOL_ERROR, TOO_BIG].contains(&reason.code),
                    "unexpected close code {}",
                    reason.code
                );
                break;
            }
        };
        // The payload range never leaves the buffer and ends the frame.
        prop_assert!(view.payload.start <= view.payload.end);
        prop_assert!(view.payload.end == view.consumed && view.consumed <= len);
        // Header (2) + mask (4) at least: client frames are always masked.
        prop_assert!(view.payload.start >= 6);
        prop_assert!(view.payload.len() <= MAX_MESSAGE);
        if view.opcode.is_control() {
            prop_assert!(view.fin && view.payload.len() <= 125);
        }
        let start = off + view.payload.start;
        let end = off + view.payload.end;
        off += view.consumed;
        match asm.push(view.opcode, view.fin, &mut buf[start..end], MAX_MESSAGE) {
            Ok(Incoming::Message(op, data)) => {
                prop_assert!(data.len() <= MAX_MESSAGE);
                prop_assert!(matches!(op, Opcode::Text | Opcode::Binary));
                if op == Opcode::Text {
                    prop_assert!(std::str::from_utf8(data).is_ok());
                }
            }
            Ok(Incoming::Close(code)) => prop_assert!(code >= 1000),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// A frame sequence near the valid shape: data, continuation and control opcodes, with
/// random FIN/RSV bits now and then, and payloads around the limits.
fn frame_seq() -> impl Strategy<Value = Vec<u8>> {
    let opcode = prop::sample::select(vec![0x0u8, 0x1, 0x2, 0x3, 0x8, 0x9, 0xA, 0xB]);
    let payload = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..20),
        "[ -~é€😀]{0,40}".prop_map(|s| s.into_bytes()),
        prop::collection::vec(any::<u8>(), 120..130),
        prop::collection::vec(any::<u8>(), 290..310),
    ];
    // RSV bits are rare: most frames should get past the header checks.
    let rsv = prop_oneof![8 => Just(0u8), 1 => prop::sample::select(vec![0x10u8, 0x20, 0x40])];
    let frame = (opcode, any::<bool>(), rsv, payload, any::<[u8; 4]>()).prop_map(
        |(op, fin, rsv, p, mask)| encode_client(op | if fin { 0x80 } else { 0 } | rsv, &p, mask),
    );
    prop::collection::vec(frame, 1..8).prop_map(|fs| fs.concat())
}

proptest! {
    #[test]
    fn frame_decoder_survives_any_bytes(mut buf in prop::collection::vec(any::<u8>(), 0..400)) {
        decode_all(&mut buf)?;
    }

    #[test]
    fn frame_decoder_on_near_valid_streams(mut buf in frame_seq(), cut in any::<prop::sample::Index>()) {
        let mut prefix = buf[..cut.index(buf.len())].to_vec();
        decode_all(&mut prefix)?;
        decode_all(&mut buf)?;
    }

    /// Round trip: a valid frame decodes to its payload; every strict prefix needs more.
    #[test]
    fn frame_round_trip(text in any::<bool>(), payload in prop::collection::vec(any::<u8>(), 0..MAX_MESSAGE),
                        mask in any::<[u8; 4]>(), cut in any::<prop::sample::Index>()) {
        let first = if text { 0x81 } else { 0x82 };
        let wire = encode_client(first, &payload, mask);
        let mut buf = wire.clone();
        let view = decode_frame(&mut buf, MAX_MESSAGE).unwrap().unwrap();
        prop_assert_eq!(view.consumed, wire.len());
        prop_assert_eq!(&buf[view.payload.clone()], &payload[..]);
        let mut prefix = wire[..cut.index(wire.len())].to_vec();
        prop_assert_eq!(decode_frame(&mut prefix, MAX_MESSAGE).unwrap(), None);
    }

    /// A message split into fragments reassembles to the original, with pings between.
    #[test]
    fn fragments_reassemble(msg in "[ -~é€😀]{0,60}", cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..5)) {
        let bytes = msg.as_bytes();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.dedup();
        let mut asm = Assembler::default();
        let parts: Vec<&[u8]> = points.windows(2).map(|w| &bytes[w[0]..w[1]]).collect();
        let parts = if parts.is_empty() { vec![&bytes[..0]] } else { parts };
        let n = parts.len();
        let mut got = None;
        for (i, part) in parts.into_iter().enumerate() {
            let op = if i == 0 { Opcode::Text } else { Opcode::Continuation };
            let mut p = part.to_vec();
            match asm.push(op, i + 1 == n, &mut p, MAX_MESSAGE).unwrap() {
                Incoming::Message(Opcode::Text, data) => got = Some(data.to_vec()),
                Incoming::None => {}
                other => prop_assert!(false, "unexpected {other:?}"),
            }
            let mut ping = b"p".to_vec();
            prop_assert!(matches!(asm.push(Opcode::Ping, true, &mut ping, MAX_MESSAGE), Ok(Incoming::Ping(_))));
        }
        prop_assert_eq!(got.as_deref(), Some(bytes));
    }
}

// ---------------------------------------------------------------------------------
// Rate limits and config

/// The largest count a rate limit may have (`quota::rate_limit::MAX_COUNT`, private).
const MAX_RATE_COUNT: u32 = 10_000_000;

proptest! {
    #[test]
    fn rate_limit_parse_survives_any_string(s in any::<String>()) {
        if let Ok(r) = RateLimit::parse(&s) {
            prop_assert!(r.count >= 1 && r.count <= MAX_RATE_COUNT);
            prop_assert_eq!(RateLimit::parse(&r.to_string()).unwrap(), r);
        }
    }

    #[test]
    fn rate_limit_parse_near_valid(n in prop_oneof![0u64..20, 9_999_990u64..10_000_010, any::<u64>()],
                                   unit in prop::sample::select(vec!["s", "min", "h", "S", "", "sec"]),
                                   pad in prop::sample::select(vec!["", " ", "\t", "+", "-", "0"])) {
        let s = format!("{pad}{n}/{unit}");
        let ok = RateLimit::parse(&s);
        let unit_ok = unit == "s" || unit == "min";
        let pad_ok = matches!(pad, "" | " " | "\t" | "0");
        let count_ok = (1..=u64::from(MAX_RATE_COUNT)).contains(&n);
        prop_assert_eq!(ok.is_ok(), unit_ok && pad_ok && count_ok, "{:?} -> {:?}", s, ok);
        if let Ok(r) = ok {
            prop_assert_eq!(u64::from(r.count), n);
        }
    }

    #[test]
    fn config_parse_survives_any_text(s in any::<String>()) {
        if let Ok(cfg) = Config::from_toml(&s) {
            let _ = cfg.validate();
        }
    }

    #[test]
    fn config_parse_near_valid(entries in prop::collection::vec((
            prop::sample::select(vec!["max_body_bytes", "max_header_bytes", "max_headers",
                "max_frame_bytes", "heartbeat_s", "mailbox_capacity", "mailbox_high_water_pct",
                "header_read_timeout_ms", "default_rate_limit", "workers", "listen", "bogus"]),
            prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                (0u64..300).prop_map(|n| n.to_string()),
                "\"[0-9]{1,4}/(s|min|x)\"",
                "\"127\\.0\\.0\\.1:[0-9]{1,5}\"",
                Just("true".to_string()),
            ]), 0..6)) {
        let text: String = entries.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        if let Ok(cfg) = Config::from_toml(&text) {
            if cfg.validate().is_ok() {
                // A valid config never disables a limit.
                prop_assert!(cfg.max_body_bytes > 0 && cfg.max_header_bytes > 0);
                prop_assert!(cfg.max_frame_bytes > 0 && cfg.mailbox_capacity > 0);
                prop_assert!(cfg.mailbox_high_water() >= 1);
                prop_assert!(RateLimit::parse(&cfg.default_rate_limit).is_ok());
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Pusher REST: query parsing and signatures
//
// Oracle: an independent signer here (the `hmac`/`sha2`/`md-5` crates, the canonical
// string written from Pusher's documentation, not from ringcast's code).

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A request Pusher's SDKs would sign: the extra parameters, the body, its signature.
fn signed_query(extra: &[(String, String)], body: &[u8], now: u64, secret: &str) -> String {
    let mut params: Vec<(String, String)> = extra.to_vec();
    params.push(("auth_key".into(), "pk_test".into()));
    params.push(("auth_timestamp".into(), now.to_string()));
    params.push(("auth_version".into(), "1.0".into()));
    params.push(("body_md5".into(), sign::md5_hex(body)));
    params.sort();
    let canonical: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let to_sign = format!("POST\n/apps/1000000/events\n{}", canonical.join("&"));
    let signature = sign::hmac_hex(secret, &to_sign);
    let mut q: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect();
    q.push(format!("auth_signature={signature}"));
    q.join("&")
}

proptest! {
    #[test]
    fn pusher_query_parser_survives_any_bytes(buf in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(q) = pusher_parse_query(&buf) {
            prop_assert!(q.len() <= 32);
            let mut keys: Vec<&str> = q.iter().map(|(k, _)| k).collect();
            let n = keys.len();
            keys.sort_unstable();
            keys.dedup();
            prop_assert_eq!(keys.len(), n, "a key twice");
        }
    }

    #[test]
    fn pusher_query_round_trips_percent_encoding(
        pairs in prop::collection::btree_map("[a-z_]{1,10}", "[ -~é€]{0,16}", 0..12),
    ) {
        let raw: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect();
        let q = pusher_parse_query(raw.join("&").as_bytes()).expect("a well-formed query");
        prop_assert_eq!(q.len(), pairs.len());
        for (k, v) in &pairs {
            prop_assert_eq!(q.get(k), Some(v.as_str()));
        }
        // The same key twice is refused, whatever its case.
        if let Some((k, _)) = pairs.iter().next() {
            let twice = format!("{}&{}=x", raw.join("&"), k.to_uppercase());
            prop_assert!(matches!(pusher_parse_query(twice.as_bytes()), Err(PusherQueryError::Duplicate(_))));
        }
    }

    #[test]
    fn pusher_signatures_verify_exactly_the_signed_request(
        extra in prop::collection::btree_map("[a-z]{1,8}", "[ -~]{0,12}", 0..4),
        body in prop::collection::vec(any::<u8>(), 0..200),
        skew in -600i64..=600,
        flip in any::<prop::sample::Index>(),
    ) {
        let extra: Vec<(String, String)> = extra
            .into_iter()
            .filter(|(k, _)| !k.starts_with("auth") && k != "body_md5")
            .collect();
        let now = 1_800_000_000u64;
        let ts = (now as i64 + skew) as u64;
        let secret = "ts_0123456789abcdef";
        let raw = signed_query(&extra, &body, ts, secret);
        let q = pusher_parse_query(raw.as_bytes()).expect("the SDK's query parses");
        prop_assert_eq!(pusher_check_rest("POST", "/apps/1000000/events", &q, &body, now, &[secret]), Ok(()));
        // Another secret, another path, another body: refused.
        prop_assert!(pusher_check_rest("POST", "/apps/1000000/events", &q, &body, now, &["ts_other"]).is_err());
        prop_assert!(pusher_check_rest("POST", "/apps/1000001/events", &q, &body, now, &[secret]).is_err());
        let mut changed = body.clone();
        if changed.is_empty() {
            changed.push(b'x');
        } else {
            let i = flip.index(changed.len());
            changed[i] ^= 1;
        }
        prop_assert!(pusher_check_rest("POST", "/apps/1000000/events", &q, &changed, now, &[secret]).is_err());
        // Out of the 600 s window: refused.
        prop_assert!(pusher_check_rest("POST", "/apps/1000000/events", &q, &body, now + 601 + skew.max(0) as u64, &[secret]).is_err());
    }
}

// ---------------------------------------------------------------------------------
// Regressions: crashes and refusals the properties and schemathesis found, kept as
// plain tests so they run first and always.

/// `Config::mailbox_high_water` multiplied in usize and overflowed (debug: panic at
/// start-up; release: a wrapped, wrong high-water mark) for a huge mailbox_capacity.
#[test]
fn regression_huge_mailbox_capacity_does_not_overflow() {
    let cfg = Config::from_toml("mailbox_capacity = 9223372036854775807\n").unwrap();
    let hw = cfg.mailbox_high_water();
    assert!(hw >= 1 && hw <= cfg.mailbox_capacity);
    assert_eq!(hw, 9223372036854775807 / 100 * 75 + 5);
}

/// Integers beyond 64 bits are valid JSON and valid `data`; simd-json refused them
/// (400 invalid_json) until its `big-int-as-float` feature was enabled. The data is
/// forwarded as text, so nothing is rounded.
#[test]
fn regression_big_integers_in_data_are_accepted_verbatim() {
    let body = br#"{"channel":"c","event":"e","data":{"n":6414170029169719916451051077632,"m":-9223372036854775809}}"#;
    let mut parser = PublishParser::new();
    let p = parser.parse(body).expect("big integers are valid JSON");
    assert_eq!(
        p.data,
        &br#"{"n":6414170029169719916451051077632,"m":-9223372036854775809}"#[..]
    );
}

/// Found by the coverage-guided target fuzz/publish_body (libFuzzer, 9 minutes in):
/// simd-json ended a number at a NUL byte and accepted the rest, so this body was
/// accepted and the NULs were forwarded inside `data` to every subscriber. It must be
/// `invalid_json`, like every other body serde_json refuses.
#[test]
fn regression_nul_after_a_number_is_invalid_json() {
    let body = b"{\"channel\":\"news\",\"event\":\"e\",\"data\":{\"a\":[0\0\0\0\0,\"x\\u00e9\"]}}";
    assert!(serde_json::from_slice::<serde_json::Value>(body).is_err());
    assert!(PublishParser::new().parse(body).is_err());
}

/// Found by the libFuzzer target `fuzz/publish_body` (30-minute run, 1.2 M executions in):
/// simd-json's path for numbers of 19 or more digits accepts whatever follows the digits,
/// so `2.5222…2-;222` inside `data` was accepted and forwarded to every subscriber. The
/// input as the fuzzer saved it; it must be `invalid_json`.
#[test]
fn regression_junk_after_a_long_number_is_invalid_json() {
    let body = br#"{"channel":"news","event":"e","data":{"a":[1,2.5222222222222222222222222222222222222222222222222222222222222222222222222222222222-;222,"x\u00e2222222c{p\u007ffffffau00f9"]}}"#;
    assert!(serde_json::from_slice::<serde_json::Value>(body).is_err());
    assert!(PublishParser::new().parse(body).is_err());
}
