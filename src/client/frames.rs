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
}
