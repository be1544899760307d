//! Encoders of the Pusher Channels (protocol 7) server frames, each a complete WebSocket
//! text frame (design: docs/design/pusher.md, section 1.2).
//!
//! Invariants:
//! - Every encoder works from borrowed parts and makes one allocation: the frame
//!   (`super::write::object_frame`: a table of fields, counted, then written into a
//!   buffer of exactly that size).
//!   [`pong`] makes none (a static frame).
//! - The output is valid JSON for any `&str` input: names and user ids go through
//!   `crate::json::escape_chunks`; the parts documented as JSON text (`data_json`,
//!   `user_info_json`, the event and user id literals) are the caller's to have checked,
//!   and are copied or escaped byte for byte, never parsed or re-serialised.
//! - `data` of every frame but `pusher:error` is a JSON string holding JSON text (Pusher's
//!   double encoding). Text inside that string is escaped once more: a quote in a channel
//!   name becomes `\\\"` on the wire.

use bytes::Bytes;

use super::write::{object_frame, Val, Val::*};

/// `{"event":"pusher:connection_established","data":"{\"socket_id\":\"…\",\"activity_timeout\":N}"}`.
pub(crate) fn connection_established(socket_id: &str, activity_timeout_s: u32) -> Bytes {
    let data = Obj(&[
        ("socket_id", Str(socket_id)),
        ("activity_timeout", Num(u64::from(activity_timeout_s))),
    ]);
    object_frame(&[
        ("event", Str("pusher:connection_established")),
        ("data", Quoted(&data)),
    ])
}

/// A frame about one channel: `{"event":<event>,"channel":<channel>,"data":"<data>"}`,
/// `data` a JSON document carried as a string.
fn channel_frame(event: &str, channel: &str, data: Val<'_>) -> Bytes {
    object_frame(&[
        ("event", Str(event)),
        ("channel", Str(channel)),
        ("data", Quoted(&data)),
    ])
}

/// `pusher_internal:subscription_succeeded` of `channel`; `data_json` is the JSON text
/// to carry as the `data` string: `{}` for public and private channels, the
/// [`presence_data`] object for presence channels.
pub(crate) fn subscription_succeeded(channel: &str, data_json: &str) -> Bytes {
    channel_frame(
        "pusher_internal:subscription_succeeded",
        channel,
        Json(data_json),
    )
}

/// `{"event":"pusher:signin_success","data":"{\"user_data\":\"…\"}"}`: the accepted
/// `user_data`, exactly as the client sent it (pusher-js parses it again).
pub(crate) fn signin_success(user_data: &str) -> Bytes {
    object_frame(&[
        ("event", Str("pusher:signin_success")),
        ("data", Quoted(&Obj(&[("user_data", Str(user_data))]))),
    ])
}

/// `pusher:subscription_error` of `channel`, data `{"type":…,"error":…,"status":N}`.
pub(crate) fn subscription_error(channel: &str, type_: &str, error: &str, status: u16) -> Bytes {
    channel_frame(
        "pusher:subscription_error",
        channel,
        Obj(&[
            ("type", Str(type_)),
            ("error", Str(error)),
            ("status", Num(u64::from(status))),
        ]),
    )
}

/// `pusher_internal:member_added`, data `{"user_id":…,"user_info":…}`; `user_info_json`
/// (any JSON value, as text) is left out when `None`.
pub(crate) fn member_added(channel: &str, user_id: &str, user_info_json: Option<&str>) -> Bytes {
    channel_frame(
        "pusher_internal:member_added",
        channel,
        Obj(&[
            ("user_id", Str(user_id)),
            ("user_info", user_info_json.map_or(Absent, Json)),
        ]),
    )
}

/// `pusher_internal:member_removed`, data `{"user_id":…}`.
pub(crate) fn member_removed(channel: &str, user_id: &str) -> Bytes {
    channel_frame(
        "pusher_internal:member_removed",
        channel,
        Obj(&[("user_id", Str(user_id))]),
    )
}

/// A channel event: `{"event":<event>,"channel":"<channel>","data":"…"[,"user_id":<id>]}`.
///
/// `event_json_literal` and `user_id_literal` are JSON string literals (quotes included)
/// as they appear in the native frame; `data_json` is the native `data` value as JSON
/// text. A string `data` is sent as that same literal (a string published natively
/// arrives unchanged); any other value is its JSON text escaped into a string, byte for
/// byte. JSON whitespace around `data_json` is dropped.
pub(crate) fn message(
    channel: &str,
    event_json_literal: &str,
    data_json: &str,
    user_id_literal: Option<&str>,
) -> Bytes {
    debug_assert!(
        is_str_literal(event_json_literal),
        "event must be a JSON string literal"
    );
    debug_assert!(
        user_id_literal.is_none_or(is_str_literal),
        "user_id must be a JSON string literal"
    );
    let text = Json(data_json.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r')));
    let data = match text {
        Json(literal) if literal.starts_with('"') => text,
        _ => Quoted(&text),
    };
    object_frame(&[
        ("event", Json(event_json_literal)),
        ("channel", Str(channel)),
        ("data", data),
        ("user_id", user_id_literal.map_or(Absent, Json)),
    ])
}

fn is_str_literal(s: &str) -> bool {
    s.len() >= 2 && s.starts_with('"') && s.ends_with('"')
}

/// The answer to a `pusher:ping`, as a static frame (payload under 126 bytes: a two-byte
/// header).
const PONG: &[u8] = b"\x81\x23{\"event\":\"pusher:pong\",\"data\":\"{}\"}";

/// `{"event":"pusher:pong","data":"{}"}`.
pub(crate) fn pong() -> Bytes {
    Bytes::from_static(PONG)
}

/// `{"event":"pusher:error","data":{"code":N,"message":"…"}}`: here `data` is an object
/// (as Pusher sends it); `code` is left out when `None`.
pub(crate) fn error(code: Option<u16>, message: &str) -> Bytes {
    object_frame(&[
        ("event", Str("pusher:error")),
        (
            "data",
            Obj(&[
                ("code", code.map_or(Absent, |c| Num(u64::from(c)))),
                ("message", Str(message)),
            ]),
        ),
    ])
}

/// Why a native member list does not convert (a bug upstream: the hub writes it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PresenceDataError {
    #[error("the member list is not JSON: {0}")]
    Json(String),
    #[error("the member list is not {{\"members\":[{{\"user_id\":\"…\"}},…]}}")]
    Shape,
    #[error("the member list names user {0:?} twice")]
    Duplicate(String),
}

/// Pusher's presence object from the hub's native member list:
/// `{"count":N,"members":[{"user_id":"u1","info":{…}},{"user_id":"u2"}]}` becomes
/// `{"presence":{"ids":["u1","u2"],"hash":{"u1":{…},"u2":null},"count":2}}`.
///
/// `ids` keep join order (serde_json's `preserve_order` keeps `hash` in it too); a member
/// without `info` (or with `null`) maps to `null`; `count` is the number of members
/// listed. Once per presence subscribe, at most `max_presence_members` members.
pub(crate) fn presence_data(members_json: &str) -> Result<String, PresenceDataError> {
    use serde_json::{Map, Value};
    let native: Value =
        serde_json::from_str(members_json).map_err(|e| PresenceDataError::Json(e.to_string()))?;
    let members = native
        .get("members")
        .and_then(Value::as_array)
        .ok_or(PresenceDataError::Shape)?;
    let mut ids = Vec::with_capacity(members.len());
    let mut hash = Map::with_capacity(members.len());
    for member in members {
        let user_id = member
            .get("user_id")
            .and_then(Value::as_str)
            .ok_or(PresenceDataError::Shape)?;
        let info = member.get("info").cloned().unwrap_or(Value::Null);
        if hash.insert(user_id.to_owned(), info).is_some() {
            return Err(PresenceDataError::Duplicate(user_id.to_owned()));
        }
        ids.push(Value::String(user_id.to_owned()));
    }
    let count = ids.len();
    let mut presence = Map::with_capacity(3);
    presence.insert("ids".into(), Value::Array(ids));
    presence.insert("hash".into(), Value::Object(hash));
    presence.insert("count".into(), Value::from(count));
    let mut outer = Map::with_capacity(1);
    outer.insert("presence".into(), Value::Object(presence));
    Ok(Value::Object(outer).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::frame::{self, Opcode};
    use serde_json::{json, Value};

    use crate::wire::test_payload as payload;

    fn parsed(f: &Bytes) -> Value {
        serde_json::from_str(payload(f)).unwrap()
    }

    /// The `data` string of a frame, parsed as the JSON it holds.
    fn data_of(f: &Bytes) -> Value {
        let v = parsed(f);
        serde_json::from_str(v["data"].as_str().expect("data is a string")).unwrap()
    }

    /// Quotes, backslashes, control characters, DEL and non-ASCII.
    const NASTY: &str = "a\"b\\c\n\r\t\u{1}\u{1f}\u{7f}é\u{1F600}/";

    #[test]
    fn signin_success_carries_user_data_as_sent() {
        let user_data = r#"{"id":"ann","user_info":{"name":"A \"B\""}}"#;
        let f = signin_success(user_data);
        assert_eq!(parsed(&f)["event"], "pusher:signin_success");
        assert_eq!(data_of(&f), json!({ "user_data": user_data }));
    }

    #[test]
    fn connection_established_golden() {
        let f = connection_established("2914375612.4398046511105", 25);
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher:connection_established","data":"{\"socket_id\":\"2914375612.4398046511105\",\"activity_timeout\":25}"}"#
        );
        assert_eq!(
            &f[..],
            &frame::frame(Opcode::Text, payload(&f).as_bytes())[..]
        );
        let f = connection_established("0.0", u32::MAX);
        assert_eq!(
            data_of(&f),
            json!({"socket_id": "0.0", "activity_timeout": u32::MAX})
        );
        // Whatever the id holds, the frame stays JSON and the id comes back.
        let f = connection_established(NASTY, 0);
        assert_eq!(data_of(&f)["socket_id"], NASTY);
    }

    #[test]
    fn subscription_succeeded_golden() {
        let f = subscription_succeeded("private-orders", "{}");
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher_internal:subscription_succeeded","channel":"private-orders","data":"{}"}"#
        );
        let presence = presence_data(
            r#"{"count":2,"members":[{"user_id":"u1","info":{"name":"Ann"}},{"user_id":"10"}]}"#,
        )
        .unwrap();
        let f = subscription_succeeded("presence-room", &presence);
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher_internal:subscription_succeeded","channel":"presence-room","data":"{\"presence\":{\"ids\":[\"u1\",\"10\"],\"hash\":{\"u1\":{\"name\":\"Ann\"},\"10\":null},\"count\":2}}"}"#
        );
        let f = subscription_succeeded(NASTY, &json!({"presence": {"x": NASTY}}).to_string());
        assert_eq!(parsed(&f)["channel"], NASTY);
        assert_eq!(data_of(&f), json!({"presence": {"x": NASTY}}));
    }

    #[test]
    fn subscription_error_golden() {
        let f = subscription_error("private-orders", "AuthError", "invalid signature", 401);
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher:subscription_error","channel":"private-orders","data":"{\"type\":\"AuthError\",\"error\":\"invalid signature\",\"status\":401}"}"#
        );
        let f = subscription_error(NASTY, NASTY, NASTY, 65535);
        assert_eq!(parsed(&f)["channel"], NASTY);
        assert_eq!(
            data_of(&f),
            json!({"type": NASTY, "error": NASTY, "status": 65535})
        );
    }

    #[test]
    fn member_added_and_removed_golden() {
        let f = member_added("presence-room", "u2", Some(r#"{"name":"Bo"}"#));
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher_internal:member_added","channel":"presence-room","data":"{\"user_id\":\"u2\",\"user_info\":{\"name\":\"Bo\"}}"}"#
        );
        let f = member_added("presence-room", "u2", None);
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher_internal:member_added","channel":"presence-room","data":"{\"user_id\":\"u2\"}"}"#
        );
        // Any JSON value as info (Laravel apps send `true`), and escaping inside it.
        let info = json!({"n": NASTY, "list": [1, "two\\"]}).to_string();
        let f = member_added("presence-room", NASTY, Some(&info));
        assert_eq!(
            data_of(&f),
            json!({"user_id": NASTY, "user_info": {"n": NASTY, "list": [1, "two\\"]}})
        );
        let f = member_added("presence-room", "u", Some("true"));
        assert_eq!(data_of(&f), json!({"user_id": "u", "user_info": true}));

        let f = member_removed("presence-room", "u2");
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher_internal:member_removed","channel":"presence-room","data":"{\"user_id\":\"u2\"}"}"#
        );
        let f = member_removed(NASTY, NASTY);
        assert_eq!(parsed(&f)["channel"], NASTY);
        assert_eq!(data_of(&f), json!({"user_id": NASTY}));
    }

    #[test]
    fn message_golden() {
        let f = message("orders", r#""order.created""#, r#"{"id":42}"#, None);
        assert_eq!(
            payload(&f),
            r#"{"event":"order.created","channel":"orders","data":"{\"id\":42}"}"#
        );
        // A string is passed as the same literal, escapes and all.
        let f = message("orders", r#""note""#, r#""hello""#, None);
        assert_eq!(
            payload(&f),
            r#"{"event":"note","channel":"orders","data":"hello"}"#
        );
        let f = message("orders", r#""note""#, r#""a\"b\u00e9\/""#, None);
        assert_eq!(
            payload(&f),
            r#"{"event":"note","channel":"orders","data":"a\"b\u00e9\/"}"#
        );
        assert_eq!(parsed(&f)["data"], "a\"bé/");
        let f = message(
            "presence-room",
            r#""client-typing""#,
            r#"{"on":true}"#,
            Some(r#""u1""#),
        );
        assert_eq!(
            payload(&f),
            r#"{"event":"client-typing","channel":"presence-room","data":"{\"on\":true}","user_id":"u1"}"#
        );
    }

    #[test]
    fn message_data_is_escaped_byte_for_byte() {
        // Not re-serialised: spacing, key order, number spelling and escapes stay as
        // published, inside the string.
        let native = "{ \"b\" : 1.50e1, \"a\":[\"x\\\"y\\\\\",\"\\u00e9\",\"é\u{1F600}\"] }";
        let f = message("c", r#""e""#, native, None);
        let v = parsed(&f);
        assert_eq!(v["data"].as_str().unwrap(), native);
        assert_eq!(
            serde_json::from_str::<Value>(v["data"].as_str().unwrap()).unwrap(),
            serde_json::from_str::<Value>(native).unwrap()
        );
        // Surrounding JSON whitespace is dropped, for strings and other values alike.
        let f = message("c", r#""e""#, " \n\"hi\"\t", None);
        assert_eq!(payload(&f), r#"{"event":"e","channel":"c","data":"hi"}"#);
        let f = message("c", r#""e""#, " [1, 2]\r\n", None);
        assert_eq!(
            payload(&f),
            r#"{"event":"e","channel":"c","data":"[1, 2]"}"#
        );
        // Numbers, booleans and null become their text as a string.
        for (native, text) in [("42", "42"), ("true", "true"), ("null", "null")] {
            let f = message("c", r#""e""#, native, None);
            assert_eq!(parsed(&f)["data"], text);
        }
        // The channel is escaped; the event literal is copied (the native frame's).
        let event = json!(NASTY).to_string();
        let f = message(NASTY, &event, "{}", Some(&event));
        let v = parsed(&f);
        assert_eq!(
            (&v["event"], &v["channel"], &v["user_id"]),
            (&json!(NASTY), &json!(NASTY), &json!(NASTY))
        );
        // Control characters raw inside a string literal cannot occur (the native frame
        // is valid JSON), but control bytes in object text are escaped all the same.
        let f = message("c", r#""e""#, "{\"k\":\"\\n\"}", None);
        assert_eq!(data_of(&f), json!({"k": "\n"}));
    }

    #[test]
    fn large_frames_get_the_long_headers() {
        let big = format!("{{\"k\":\"{}\"}}", "\"".repeat(40_000));
        // Unescaped that is invalid JSON, but the encoder does not parse: it escapes.
        let f = message("c", r#""e""#, &big, None);
        assert_eq!(f[1], 127);
        assert_eq!(parsed(&f)["data"].as_str().unwrap(), big);
        let mid = "x".repeat(300);
        let f = member_removed("presence-room", &mid);
        assert_eq!(f[1], 126);
        assert_eq!(data_of(&f)["user_id"], mid.as_str());
    }

    #[test]
    fn pong_and_error_golden() {
        let f = pong();
        assert_eq!(payload(&f), r#"{"event":"pusher:pong","data":"{}"}"#);
        assert_eq!(
            &f[..],
            &frame::frame(Opcode::Text, payload(&f).as_bytes())[..]
        );

        let f = error(Some(4301), "client event rate limit (10/s) exceeded");
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher:error","data":{"code":4301,"message":"client event rate limit (10/s) exceeded"}}"#
        );
        let f = error(None, "user authentication (pusher:signin) is not supported");
        assert_eq!(
            payload(&f),
            r#"{"event":"pusher:error","data":{"message":"user authentication (pusher:signin) is not supported"}}"#
        );
        let f = error(Some(0), NASTY);
        assert_eq!(parsed(&f)["data"], json!({"code": 0, "message": NASTY}));
    }

    #[test]
    fn presence_data_conversion() {
        let native = r#"{"count":3,"members":[{"user_id":"z","info":{"b":1,"a":2}},{"user_id":"a"},{"user_id":"m","info":null}]}"#;
        assert_eq!(
            presence_data(native).unwrap(),
            r#"{"presence":{"ids":["z","a","m"],"hash":{"z":{"b":1,"a":2},"a":null,"m":null},"count":3}}"#
        );
        assert_eq!(
            presence_data(r#"{"count":0,"members":[]}"#).unwrap(),
            r#"{"presence":{"ids":[],"hash":{},"count":0}}"#
        );
        let nasty = json!({"count": 1, "members": [{"user_id": NASTY, "info": true}]}).to_string();
        let v: Value = serde_json::from_str(&presence_data(&nasty).unwrap()).unwrap();
        assert_eq!(v["presence"]["ids"], json!([NASTY]));
        assert_eq!(v["presence"]["hash"][NASTY], json!(true));

        assert!(matches!(
            presence_data("{"),
            Err(PresenceDataError::Json(_))
        ));
        for bad in [
            r#"{"count":1}"#,
            r#"{"members":{}}"#,
            r#"{"members":[{"info":{}}]}"#,
            r#"{"members":[{"user_id":10}]}"#,
            "[]",
        ] {
            assert_eq!(presence_data(bad), Err(PresenceDataError::Shape), "{bad}");
        }
        assert_eq!(
            presence_data(r#"{"members":[{"user_id":"u"},{"user_id":"u"}]}"#),
            Err(PresenceDataError::Duplicate("u".into()))
        );
    }
}
