//! The frames of the client protocol that the server writes itself: replies, error
//! frames, the `connected` greeting. Each is a complete WebSocket text frame whose JSON
//! is escaped by `crate::json`, so a channel name can never break out of its string.

use bytes::Bytes;

use crate::json::write_json_str;
use crate::ws::frame::{self, Opcode};

/// `{"type":"pong"}` as a complete frame.
pub(crate) const PONG: &[u8] = b"\x81\x0f{\"type\":\"pong\"}";

pub(crate) fn reply(kind: &str, channel: &str) -> Bytes {
    let mut json = Vec::with_capacity(48 + channel.len());
    json.extend_from_slice(b"{\"type\":\"");
    json.extend_from_slice(kind.as_bytes());
    json.extend_from_slice(b"\",\"channel\":");
    write_json_str(&mut json, channel);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// `subscribed` with what a history channel adds: its position and, for a subscribe
/// with `since`, whether the missed messages follow (`recovered`).
pub(crate) fn subscribed(
    channel: &str,
    position: Option<(u64, &str)>,
    recovered: Option<bool>,
) -> Bytes {
    let mut json = Vec::with_capacity(96 + channel.len());
    json.extend_from_slice(b"{\"type\":\"subscribed\",\"channel\":");
    write_json_str(&mut json, channel);
    if let Some(r) = recovered {
        json.extend_from_slice(if r {
            b",\"recovered\":true"
        } else {
            b",\"recovered\":false"
        });
    }
    if let Some((offset, epoch)) = position {
        json.extend_from_slice(b",\"offset\":");
        json.extend_from_slice(offset.to_string().as_bytes());
        json.extend_from_slice(b",\"epoch\":");
        write_json_str(&mut json, epoch);
    }
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// `subscribed` on a presence channel: the hub's presence object (`{"count":N,
/// "members":[...]}`, JSON text it wrote) under `"presence"`.
pub(crate) fn subscribed_presence(channel: &str, presence: &str) -> Bytes {
    let mut json = Vec::with_capacity(64 + channel.len() + presence.len());
    json.extend_from_slice(b"{\"type\":\"subscribed\",\"channel\":");
    write_json_str(&mut json, channel);
    json.extend_from_slice(b",\"presence\":");
    json.extend_from_slice(presence.as_bytes());
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// The message frame of a client event: a publish's message frame (same fields, same
/// order) plus `"user_id"` when the sender's grant on a presence channel names one.
/// Encoded once per event, in one exactly-sized allocation.
pub(crate) fn client_event_frame(
    channel: &str,
    event: &str,
    data: &[u8],
    id: &str,
    user_id: Option<&str>,
) -> Bytes {
    use crate::json::json_str_len;
    const A: &[u8] = b"{\"type\":\"message\",\"channel\":";
    const B: &[u8] = b",\"event\":";
    const C: &[u8] = b",\"data\":";
    const D: &[u8] = b",\"id\":\"";
    const E: &[u8] = b"\"";
    const U: &[u8] = b",\"user_id\":";
    let user_len = user_id.map_or(0, |u| U.len() + json_str_len(u));
    let payload_len = A.len()
        + json_str_len(channel)
        + B.len()
        + json_str_len(event)
        + C.len()
        + data.len()
        + D.len()
        + id.len()
        + E.len()
        + user_len
        + 1;
    let mut out = Vec::with_capacity(frame::header_len(payload_len) + payload_len);
    frame::write_header(&mut out, Opcode::Text, payload_len);
    out.extend_from_slice(A);
    write_json_str(&mut out, channel);
    out.extend_from_slice(B);
    write_json_str(&mut out, event);
    out.extend_from_slice(C);
    out.extend_from_slice(data);
    out.extend_from_slice(D);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(E);
    if let Some(user) = user_id {
        out.extend_from_slice(U);
        write_json_str(&mut out, user);
    }
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

/// An error frame that keeps the connection open.
pub(crate) fn error_frame(code: &str, message: &str) -> Bytes {
    let mut json = Vec::with_capacity(48 + message.len());
    json.extend_from_slice(b"{\"type\":\"error\",\"code\":");
    write_json_str(&mut json, code);
    json.extend_from_slice(b",\"message\":");
    write_json_str(&mut json, message);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// An error frame about one channel (`forbidden` for a refused token).
pub(crate) fn channel_error_frame(code: &str, channel: &str, message: &str) -> Bytes {
    let mut json = Vec::with_capacity(64 + channel.len() + message.len());
    json.extend_from_slice(b"{\"type\":\"error\",\"code\":");
    write_json_str(&mut json, code);
    json.extend_from_slice(b",\"channel\":");
    write_json_str(&mut json, channel);
    json.extend_from_slice(b",\"message\":");
    write_json_str(&mut json, message);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// `unsubscribed` sent by the server on its own (e.g. `token_expired`).
pub(crate) fn unsubscribed_with_reason(channel: &str, reason: &str) -> Bytes {
    let mut json = Vec::with_capacity(64 + channel.len());
    json.extend_from_slice(b"{\"type\":\"unsubscribed\",\"channel\":");
    write_json_str(&mut json, channel);
    json.extend_from_slice(b",\"reason\":");
    write_json_str(&mut json, reason);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// The answer to an accepted `refresh`: the new `exp` now in force.
pub(crate) fn refreshed_frame(channel: &str, exp: u64) -> Bytes {
    let mut json = Vec::with_capacity(64 + channel.len());
    json.extend_from_slice(b"{\"type\":\"refreshed\",\"channel\":");
    write_json_str(&mut json, channel);
    json.extend_from_slice(format!(",\"exp\":{exp}}}").as_bytes());
    frame::frame(Opcode::Text, &json)
}

/// The frame sent right after the upgrade.
pub(crate) fn connected_frame(connection_id: &str, heartbeat_s: u64) -> Bytes {
    let json = format!(
        "{{\"type\":\"connected\",\"connection_id\":\"{connection_id}\",\"heartbeat_s\":{heartbeat_s}}}"
    );
    frame::frame(Opcode::Text, json.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

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
            parse(refreshed_frame("private-a", 1_900_000_000)),
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
}
