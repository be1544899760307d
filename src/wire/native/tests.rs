//! The native frames, byte for byte: goldens of every frame (the bytes the server
//! wrote before the frame formats moved into `wire`), and the properties the relay relies
//! on (a history frame built from a relayed body is the local one).

use super::*;
use crate::json::{json_str_len, write_json_str};
use crate::ws::frame::Opcode;

#[test]
fn frame_is_a_text_frame_with_exact_json() {
    let f = message_frame("news \"x\"", "e", br#"{"a":1}"#, "abc");
    assert_eq!(f[0], 0x81);
    let len = f[1] as usize;
    assert_eq!(len, f.len() - 2);
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["channel"], "news \"x\"");
    assert_eq!(v["data"]["a"], 1);
    assert_eq!(v["id"], "abc");
}

#[test]
fn history_frames_carry_the_position_and_the_data_span() {
    let (f, span) = message_frame_at("c", "e", br#"{"a":[1]}"#, "abc", 42, "00ff00ff");
    assert_eq!(&f[span], br#"{"a":[1]}"#);
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["offset"], 42);
    assert_eq!(v["epoch"], "00ff00ff");
    assert_eq!(v["id"], "abc");
    assert_eq!(f[1] as usize, f.len() - 2);
    let (f, _) = message_frame_at("c", "e", b"\"x\"", "i", u64::MAX, "e");
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["offset"], u64::MAX);
    let (f, _) = message_frame_at("c", "e", b"\"x\"", "i", 0, "e");
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["offset"], 0);
}

#[test]
fn cluster_history_frames_are_byte_for_byte_the_local_ones() {
    // A node builds a history frame from the body Redis relays; it must be the
    // frame this node would have encoded, or the frame check drops it.
    let (body, _) = message_body("c:1", "e\"", br#"{"a":[1]}"#, "abc");
    let remote = frame_with_position(&body, 42, "00ff00ff");
    let (local, _) = message_frame_at("c:1", "e\"", br#"{"a":[1]}"#, "abc", 42, "00ff00ff");
    assert_eq!(remote, local);
    let mut plain = body;
    plain.push(b'}');
    let plain = crate::ws::frame::frame(Opcode::Text, &plain);
    assert_eq!(plain, message_frame("c:1", "e\"", br#"{"a":[1]}"#, "abc"));
}

#[test]
fn large_frames_use_extended_lengths() {
    let data = format!("\"{}\"", "x".repeat(70_000));
    let f = message_frame("c", "e", data.as_bytes(), "id");
    assert_eq!(f[1], 127);
    let v: serde_json::Value = serde_json::from_slice(&f[10..]).unwrap();
    assert_eq!(v["data"].as_str().unwrap().len(), 70_000);
}

#[test]
fn escaping_round_trips() {
    for s in [
        "plain",
        "q\"uote",
        "back\\slash",
        "tab\tnl\n",
        "ctl\u{1}",
        "é漢",
    ] {
        let mut out = Vec::new();
        write_json_str(&mut out, s);
        assert_eq!(out.len(), json_str_len(s));
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, s);
    }
}

#[test]
fn pong_constant_is_a_valid_frame() {
    assert_eq!(PONG[1] as usize, PONG.len() - 2);
    let v: serde_json::Value = serde_json::from_slice(&PONG[2..]).unwrap();
    assert_eq!(v["type"], "pong");
}

#[test]
fn subscribed_carries_the_position_when_given() {
    let f = subscribed("c\"", Some((7, "abcd0123")), Some(true));
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["channel"], "c\"");
    assert_eq!(
        (v["offset"].as_u64(), v["epoch"].as_str()),
        (Some(7), Some("abcd0123"))
    );
    assert_eq!(v["recovered"], true);
    let f = subscribed("c", None, Some(false));
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["recovered"], false);
    assert!(v.get("offset").is_none());
    assert_eq!(subscribed("c", None, None), reply("subscribed", "c"));
}

#[test]
fn replies_escape_channels() {
    let f = reply("subscribed", "a\"b");
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["channel"], "a\"b");
    let e = error_frame("invalid_json", "bad");
    let v: serde_json::Value = serde_json::from_slice(&e[2..]).unwrap();
    assert_eq!(v["code"], "invalid_json");
    let parse = |f: Bytes| serde_json::from_slice::<serde_json::Value>(&f[2..]).unwrap();
    assert_eq!(
        parse(channel_error_frame("forbidden", "private-\"x", "no")),
        serde_json::json!({"type":"error","code":"forbidden","channel":"private-\"x","message":"no"})
    );
    assert_eq!(
        parse(refreshed_frame(Some("private-a"), 1_900_000_000)),
        serde_json::json!({"type":"refreshed","channel":"private-a","exp":1_900_000_000u64})
    );
}

#[test]
fn client_event_frames_are_message_frames_with_an_optional_user() {
    let parse = |f: Bytes| {
        let start = if f[1] & 0x7f == 126 { 4 } else { 2 };
        serde_json::from_slice::<serde_json::Value>(&f[start..]).unwrap()
    };
    assert_eq!(
        parse(client_event_frame(
            "private-\"a",
            "client-t",
            br#"{"x":1}"#,
            "i1",
            None
        )),
        serde_json::json!({"type":"message","channel":"private-\"a","event":"client-t","data":{"x":1},"id":"i1"})
    );
    let long = "u".repeat(200);
    assert_eq!(
        parse(client_event_frame(
            "presence-r",
            "client-t",
            br#""s""#,
            "i2",
            Some(&long)
        )),
        serde_json::json!({"type":"message","channel":"presence-r","event":"client-t","data":"s","id":"i2","user_id":long})
    );
}

use crate::wire::test_payload as payload;

#[test]
fn goldens() {
    let cases: [(Bytes, &str); 18] = [
        (
            message_frame("c\"1", "e", br#"{"a":1}"#, "abc"),
            r#"{"type":"message","channel":"c\"1","event":"e","data":{"a":1},"id":"abc"}"#,
        ),
        (
            message_frame_at("c", "e\n", br#""s""#, "abc", 42, "00ff00ff").0,
            r#"{"type":"message","channel":"c","event":"e\n","data":"s","id":"abc","offset":42,"epoch":"00ff00ff"}"#,
        ),
        (
            client_event_frame("presence-r", "client-t", b"{}", "i", Some("u\"1")),
            r#"{"type":"message","channel":"presence-r","event":"client-t","data":{},"id":"i","user_id":"u\"1"}"#,
        ),
        (
            presence_frame("presence-r", "join", "u1", Some(r#"{"n":1}"#)),
            r#"{"type":"presence","channel":"presence-r","action":"join","user_id":"u1","info":{"n":1}}"#,
        ),
        (
            presence_frame("presence-\"r", "leave", "u\\", None),
            r#"{"type":"presence","channel":"presence-\"r","action":"leave","user_id":"u\\"}"#,
        ),
        (Bytes::from_static(PONG), r#"{"type":"pong"}"#),
        (
            reply("unsubscribed", "a\"b"),
            r#"{"type":"unsubscribed","channel":"a\"b"}"#,
        ),
        (
            subscribed("c", Some((7, "ab01")), Some(true)),
            r#"{"type":"subscribed","channel":"c","recovered":true,"offset":7,"epoch":"ab01"}"#,
        ),
        (
            subscribed("c", None, Some(false)),
            r#"{"type":"subscribed","channel":"c","recovered":false}"#,
        ),
        (
            subscribed("c", Some((0, "e")), None),
            r#"{"type":"subscribed","channel":"c","offset":0,"epoch":"e"}"#,
        ),
        (
            subscribed_presence("presence-r", r#"{"count":0,"members":[]}"#),
            r#"{"type":"subscribed","channel":"presence-r","presence":{"count":0,"members":[]}}"#,
        ),
        (
            error_frame("invalid_json", "bad \"x\""),
            r#"{"type":"error","code":"invalid_json","message":"bad \"x\""}"#,
        ),
        (
            channel_error_frame("forbidden", "private-a", "no"),
            r#"{"type":"error","code":"forbidden","channel":"private-a","message":"no"}"#,
        ),
        (
            unsubscribed_with_reason("private-a", "token_expired"),
            r#"{"type":"unsubscribed","channel":"private-a","reason":"token_expired"}"#,
        ),
        (
            refreshed_frame(Some("private-a"), u64::MAX),
            r#"{"type":"refreshed","channel":"private-a","exp":18446744073709551615}"#,
        ),
        (
            refreshed_frame(None, 1_900_000_000),
            r#"{"type":"refreshed","exp":1900000000}"#,
        ),
        (
            connected_frame("0123456789abcdef", 25, None),
            r#"{"type":"connected","connection_id":"0123456789abcdef","heartbeat_s":25}"#,
        ),
        (
            connected_frame("0123456789abcdef", 25, Some("ann \"a\"")),
            r#"{"type":"connected","connection_id":"0123456789abcdef","heartbeat_s":25,"user_id":"ann \"a\""}"#,
        ),
    ];
    for (frame, json) in cases {
        assert_eq!(payload(&frame), json);
        assert_eq!(
            frame,
            crate::ws::frame::frame(Opcode::Text, json.as_bytes())
        );
    }
}

#[test]
fn presence_frames_past_125_bytes_get_the_long_header() {
    let user = "u".repeat(200);
    let f = presence_frame("presence-r", "leave", &user, None);
    assert_eq!(f[1], 126);
    let v: serde_json::Value = serde_json::from_str(payload(&f)).unwrap();
    assert_eq!(v["user_id"], user.as_str());
}
