//! What travels through Redis: the pub/sub channel name of a (project, channel) pair, the
//! payload of one relayed publish or presence change, and the checks a received frame
//! passes before any client gets it.
//!
//! - Channel: `ringcast:m:<project id>:<channel>`. Project ids (`prj_` + hex) never
//!   contain `:`, so the first `:` after the prefix splits the two unambiguously, and a
//!   channel name may contain any character, `:` included. Project *ids* are used, not the
//!   dense per-process indexes, because indexes differ between nodes.
//! - Payload: [`VERSION`], the origin node id (8 bytes, little endian), then the complete
//!   WebSocket frame exactly as the origin encoded it. The frame is not re-encoded on the
//!   receiving node: it is copied once into a `Bytes` that all its subscribers share.
//!
//! - Payload with an exception ([`VERSION_EXCEPT`], and [`VERSION_HISTORY_EXCEPT`] for a
//!   history channel): a publish whose `socket_id` names a connection carries it, so the
//!   node holding it leaves it out.
//!
//! - History payload ([`VERSION_HISTORY`], cluster mode with history on): the same
//!   header, then `<offset>,<epoch>,<body>` in ASCII, written by the publish script in
//!   Redis (`cluster::history`), which alone knows the position. `body` is the message
//!   JSON without its closing brace and position ([`super::native::message_body`], from
//!   `super::native`, which spells the message JSON once); every node, the origin
//!   included, turns it into the frame once ([`frame_with_position`]): the bytes the
//!   origin would have built locally.
//!
//! - Presence payload ([`VERSION_PRESENCE`]): the same header, then a presence frame
//!   (`super::native::presence_frame`) as the presence hub of the origin wrote it.
//!
//! Decoding never panics on foreign input: anything malformed is `None`.
//!
//! Whoever can write to Redis can publish on these channels, so a received frame is not
//! trusted as bytes: [`check_frame`] requires exactly what `super::native` produces (one
//! final, unmasked text frame with a minimal length header that covers exactly the
//! payload, holding a JSON object of `type` = `"message"`, the `channel` of the Redis
//! channel it came on, a valid `event`, `data` as an object or a string, a string `id`,
//! for a history project also a numeric `offset` and a hex `epoch`, and nothing else). Anything else is dropped and counted: a Redis writer cannot
//! make a browser receive a close, a ping, a binary frame, broken JSON or a frame of
//! another channel.

// A relayed history body becomes its frame on every node; the cluster reads it here.
pub(crate) use super::native::frame_with_position;
pub(crate) use crate::names::{redis_channel, CHANNEL_PREFIX};

use super::native::{MAX_INFO_BYTES, MAX_USER_ID_CHARS};
use crate::ids::SocketId;

/// Payload format version; a node drops payloads of another version (a mixed-version
/// cluster during an upgrade loses cross-node messages between the two versions rather
/// than delivering frames it cannot vouch for).
pub(crate) const VERSION: u8 = 1;

/// Payload format of a message of a history channel (position assigned by Redis).
pub(crate) const VERSION_HISTORY: u8 = 2;

/// Payload format of a message that leaves one connection of another node out (a
/// publish with a `socket_id` naming it): [`VERSION`]'s header, then the connection's
/// node prefix (4 bytes) and local id (8 bytes), little endian, then the frame.
pub(crate) const VERSION_EXCEPT: u8 = 4;

/// Payload format of a presence frame (the presence hub's join or leave): [`VERSION`]'s
/// header, then the frame.
pub(crate) const VERSION_PRESENCE: u8 = 3;

/// Bytes before the frame in a payload.
pub(crate) const HEADER_LEN: usize = 9;

/// Payload format of a history channel's message that leaves one connection out: as
/// [`VERSION_HISTORY`], with the connection's 12 bytes (as in [`VERSION_EXCEPT`]) after
/// the header. The publish script writes it when the request named a `socket_id`.
pub(crate) const VERSION_HISTORY_EXCEPT: u8 = 5;

/// Bytes of the excepted connection after the header of a [`VERSION_EXCEPT`] payload.
const EXCEPT_LEN: usize = 12;

/// The 12 bytes naming connection `except` in a payload: node prefix, then local id,
/// little endian.
pub(crate) fn except_bytes(except: SocketId) -> [u8; EXCEPT_LEN] {
    let mut out = [0u8; EXCEPT_LEN];
    out[..4].copy_from_slice(&except.node.to_le_bytes());
    out[4..].copy_from_slice(&except.local_part().to_le_bytes());
    out
}

fn except_of(bytes: &[u8]) -> Option<SocketId> {
    let node = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    let local = u64::from_le_bytes(bytes.get(4..EXCEPT_LEN)?.try_into().ok()?);
    SocketId::from_parts(node, local)
}

/// Split a Redis channel into (project id, channel).
pub(crate) fn parse_channel(redis_channel: &str) -> Option<(&str, &str)> {
    let rest = redis_channel.strip_prefix(CHANNEL_PREFIX)?;
    let (project, channel) = rest.split_once(':')?;
    (!project.is_empty() && !channel.is_empty()).then_some((project, channel))
}

/// The header every payload starts with: `version`, then the origin node id (8 bytes,
/// little endian).
fn header(version: u8, origin: u64) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0] = version;
    out[1..].copy_from_slice(&origin.to_le_bytes());
    out
}

/// The header of `version` and `origin`, then `parts`, in one exactly-sized allocation.
fn payload(version: u8, origin: u64, parts: &[&[u8]]) -> Vec<u8> {
    let len = HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&header(version, origin));
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// The payload for `frame` published by node `origin`.
pub(crate) fn encode_payload(origin: u64, frame: &[u8]) -> Vec<u8> {
    payload(VERSION, origin, &[frame])
}

/// The payload for `frame` published by node `origin`, to be delivered to every
/// subscriber but connection `except` (of another node).
pub(crate) fn encode_payload_except(origin: u64, except: SocketId, frame: &[u8]) -> Vec<u8> {
    payload(VERSION_EXCEPT, origin, &[&except_bytes(except), frame])
}

/// The payload for presence `frame` of node `origin`.
pub(crate) fn encode_presence(origin: u64, frame: &[u8]) -> Vec<u8> {
    payload(VERSION_PRESENCE, origin, &[frame])
}

/// (origin node, the connection left out, frame) of a [`VERSION`] or
/// [`VERSION_EXCEPT`] payload.
pub(crate) fn decode_payload(payload: &[u8]) -> Option<(u64, Option<SocketId>, &[u8])> {
    if payload.len() <= HEADER_LEN {
        return None;
    }
    let origin = u64::from_le_bytes(payload[1..HEADER_LEN].try_into().ok()?);
    match payload[0] {
        VERSION => Some((origin, None, &payload[HEADER_LEN..])),
        VERSION_EXCEPT if payload.len() > HEADER_LEN + EXCEPT_LEN => {
            let except = except_of(&payload[HEADER_LEN..])?;
            Some((origin, Some(except), &payload[HEADER_LEN + EXCEPT_LEN..]))
        }
        _ => None,
    }
}

/// Whether `frame` is a well-formed message frame for `channel` (see the module docs).
pub(crate) fn check_frame(frame: &[u8], channel: &str) -> bool {
    let Some(fields) = frame_object(frame) else {
        return false;
    };
    let text = |k: &str| fields.get(k).and_then(|v| v.as_str());
    // A history project's frame also carries its position (`offset`, `epoch`), both or
    // neither.
    let position = match (fields.get("offset"), text("epoch")) {
        (None, None) => true,
        (Some(offset), Some(epoch)) => {
            offset.is_u64() && !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_hexdigit())
        }
        _ => false,
    };
    // A client event on a presence channel also carries its sender's `user_id`.
    let user = match fields.get("user_id") {
        None => 0,
        Some(u) if u.is_string() => 1,
        Some(_) => return false,
    };
    let expected = if fields.contains_key("offset") { 7 } else { 5 } + user;
    position
        && fields.len() == expected
        && text("type") == Some("message")
        && text("channel") == Some(channel)
        && text("event").is_some_and(|e| crate::names::check(e).is_ok())
        && text("id").is_some()
        && fields
            .get("data")
            .is_some_and(|d| d.is_object() || d.is_string())
}

/// Whether `frame` is exactly a presence frame of `channel` as the presence hub writes
/// it: `{"type":"presence","channel":…,"action":"join"|"leave","user_id":"…"}`, plus an
/// object `info` on a join, nothing else; the user id and `info` within what a single
/// node accepts from clients (1 to [`MAX_USER_ID_CHARS`] characters; at most
/// [`MAX_INFO_BYTES`] of compact JSON).
pub(crate) fn check_presence_frame(frame: &[u8], channel: &str) -> bool {
    let Some(fields) = frame_object(frame) else {
        return false;
    };
    let text = |k: &str| fields.get(k).and_then(|v| v.as_str());
    let info = match (text("action"), fields.get("info")) {
        (Some("join"), Some(i)) if i.is_object() && i.to_string().len() <= MAX_INFO_BYTES => 1,
        (Some("join"), None) | (Some("leave"), None) => 0,
        _ => return false,
    };
    fields.len() == 4 + info
        && text("type") == Some("presence")
        && text("channel") == Some(channel)
        && text("user_id").is_some_and(|u| (1..=MAX_USER_ID_CHARS).contains(&u.chars().count()))
}

/// Split a presence payload ([`VERSION_PRESENCE`]) into its origin node and frame.
pub(crate) fn decode_presence(payload: &[u8]) -> Option<(u64, &[u8])> {
    if payload.len() < HEADER_LEN || payload[0] != VERSION_PRESENCE {
        return None;
    }
    let origin = u64::from_le_bytes(payload[1..HEADER_LEN].try_into().ok()?);
    Some((origin, &payload[HEADER_LEN..]))
}

/// The JSON object in the payload of a single final unmasked text frame whose header is
/// minimal and whose length is exactly the rest of `frame`; `None` for anything else.
fn frame_object(frame: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let payload = crate::ws::frame::text_payload(frame)?;
    match serde_json::from_slice(payload) {
        Ok(serde_json::Value::Object(fields)) => Some(fields),
        _ => None,
    }
}

/// The header every payload of `origin` starts with, for the publish script.
pub(crate) fn history_header(origin: u64) -> [u8; HEADER_LEN] {
    header(VERSION_HISTORY, origin)
}

/// A message of a history channel as it travels through Redis.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Positioned<'a> {
    pub origin: u64,
    pub offset: u64,
    pub epoch: &'a str,
    pub body: &'a [u8],
    /// The connection to leave out ([`VERSION_HISTORY_EXCEPT`]).
    pub except: Option<SocketId>,
}

/// Decode a [`VERSION_HISTORY`] or [`VERSION_HISTORY_EXCEPT`] payload.
pub(crate) fn decode_history(payload: &[u8]) -> Option<Positioned<'_>> {
    if payload.len() <= HEADER_LEN {
        return None;
    }
    let origin = u64::from_le_bytes(payload[1..HEADER_LEN].try_into().ok()?);
    let (except, rest) = match payload[0] {
        VERSION_HISTORY => (None, &payload[HEADER_LEN..]),
        VERSION_HISTORY_EXCEPT => (
            Some(except_of(&payload[HEADER_LEN..])?),
            payload.get(HEADER_LEN + EXCEPT_LEN..)?,
        ),
        _ => return None,
    };
    let comma = memchr::memchr(b',', rest)?;
    let offset = parse_offset(&rest[..comma])?;
    let rest = &rest[comma + 1..];
    let comma = memchr::memchr(b',', rest)?;
    let epoch = std::str::from_utf8(&rest[..comma]).ok()?;
    if epoch.is_empty() || !epoch.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(Positioned {
        origin,
        offset,
        epoch,
        body: &rest[comma + 1..],
        except,
    })
}

/// A decimal offset, 1 or more.
pub(crate) fn parse_offset(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text)
        .ok()?
        .parse()
        .ok()
        .filter(|&o| o > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::native::{message_body, message_frame, split_body};

    #[test]
    fn presence_frames_from_redis_are_checked_exactly() {
        let f = |j: &str| crate::ws::frame::frame(crate::ws::frame::Opcode::Text, j.as_bytes());
        let ok = f(
            r#"{"type":"presence","channel":"presence-r","action":"join","user_id":"u","info":{"a":1}}"#,
        );
        assert!(check_presence_frame(&ok, "presence-r"));
        assert!(!check_presence_frame(&ok, "presence-other"));
        let leave =
            f(r#"{"type":"presence","channel":"presence-r","action":"leave","user_id":"u"}"#);
        assert!(check_presence_frame(&leave, "presence-r"));
        for bad in [
            r#"{"type":"presence","channel":"presence-r","action":"leave","user_id":"u","info":{}}"#,
            r#"{"type":"presence","channel":"presence-r","action":"kick","user_id":"u"}"#,
            r#"{"type":"message","channel":"presence-r","action":"join","user_id":"u"}"#,
            r#"{"type":"presence","channel":"presence-r","action":"join","user_id":""}"#,
            r#"{"type":"presence","channel":"presence-r","action":"join","user_id":"u","x":1}"#,
            r#"{"type":"presence","channel":"presence-r","action":"join","user_id":"u","info":"s"}"#,
        ] {
            assert!(!check_presence_frame(&f(bad), "presence-r"), "{bad}");
        }
        // Beyond what a single node accepts from a client: a long user id, a large info.
        let long_user = format!(
            r#"{{"type":"presence","channel":"presence-r","action":"leave","user_id":"{}"}}"#,
            "u".repeat(129)
        );
        assert!(!check_presence_frame(&f(&long_user), "presence-r"));
        let big_info = format!(
            r#"{{"type":"presence","channel":"presence-r","action":"join","user_id":"u","info":{{"x":"{}"}}}}"#,
            "a".repeat(1100)
        );
        assert!(!check_presence_frame(&f(&big_info), "presence-r"));
        let payload = encode_presence(7, &ok);
        assert_eq!(decode_presence(&payload), Some((7, &ok[..])));
        assert_eq!(decode_presence(&payload[..5]), None);
    }

    #[test]
    fn only_well_formed_message_frames_of_the_channel_pass() {
        let good = message_frame("news", "e", br#"{"a":1}"#, "m1");
        assert!(check_frame(&good, "news"));
        assert!(!check_frame(&good, "other"), "another channel's frame");
        let s = message_frame("news", "e", br#""text""#, "m1");
        assert!(check_frame(&s, "news"));
        let num = message_frame("news", "e", b"7", "m1");
        assert!(
            !check_frame(&num, "news"),
            "data must be an object or a string"
        );
        // Not the bytes a publish makes.
        let close = crate::ws::frame::frame(crate::ws::frame::Opcode::Close, b"\x03\xe8");
        assert!(!check_frame(&close, "news"));
        let mut two = good.to_vec();
        two.extend_from_slice(&good);
        assert!(!check_frame(&two, "news"), "a second frame after the first");
        assert!(!check_frame(&good[..good.len() - 1], "news"), "truncated");
        let json =
            br#"{"type":"message","channel":"news","event":"e","data":{},"id":"x","extra":1}"#;
        let extra = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, json);
        assert!(!check_frame(&extra, "news"), "an unknown field");
        // A client event on a presence channel carries its sender's user id
        // (`native::client_event_frame`).
        let json = br#"{"type":"message","channel":"presence-r","event":"client-t","data":{},"id":"x","user_id":"u1"}"#;
        let user = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, json);
        assert!(
            check_frame(&user, "presence-r"),
            "a client event with user_id"
        );
        let json = br#"{"type":"message","channel":"presence-r","event":"client-t","data":{},"id":"x","user_id":7}"#;
        let user = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, json);
        assert!(
            !check_frame(&user, "presence-r"),
            "a user_id that is not a string"
        );
        // A history project's frame, with its position.
        let (body, _) = message_body("news", "e", br#"{"a":1}"#, "m1");
        let at = frame_with_position(&body, 42, "00ff00ff");
        assert!(check_frame(&at, "news"), "a frame with offset and epoch");
        let half =
            br#"{"type":"message","channel":"news","event":"e","data":{},"id":"x","offset":1}"#;
        let half = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, half);
        assert!(!check_frame(&half, "news"), "an offset without an epoch");
        let neg = br#"{"type":"message","channel":"news","event":"e","data":{},"id":"x","offset":-1,"epoch":"ab"}"#;
        let neg = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, neg);
        assert!(!check_frame(&neg, "news"), "a negative offset");
        let bad = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, b"{\"type\":");
        assert!(!check_frame(&bad, "news"), "broken JSON");
        // A long header for a short payload (not what the encoder writes).
        let mut long = vec![0x81, 126, 0, 2];
        long.extend_from_slice(b"{}");
        assert!(!check_frame(&long, "news"));
    }

    #[test]
    fn history_payloads_round_trip_into_exact_frames() {
        let (body, start) = message_body("a:\"b\"", "ev,\"x", br#"{"k":[1,2]}"#, "id1");
        let mut payload = history_header(7).to_vec();
        payload.extend_from_slice(b"42,00ff00ff,");
        payload.extend_from_slice(&body);
        let p = decode_history(&payload).unwrap();
        assert_eq!((p.origin, p.offset, p.epoch), (7, 42, "00ff00ff"));
        let frame = frame_with_position(p.body, p.offset, p.epoch);
        assert_eq!(frame[1] as usize, frame.len() - 2);
        let v: serde_json::Value = serde_json::from_slice(&frame[2..]).unwrap();
        assert_eq!(v["channel"], "a:\"b\"");
        assert_eq!(v["event"], "ev,\"x");
        assert_eq!(v["data"]["k"][1], 2);
        assert_eq!(v["offset"], 42);
        assert_eq!(v["epoch"], "00ff00ff");
        let (event, data, id) = split_body(&body, start).unwrap();
        assert_eq!(
            (event.as_str(), data, id),
            ("ev,\"x", &br#"{"k":[1,2]}"#[..], "id1")
        );
        // Foreign or damaged payloads are refused.
        assert!(decode_history(&payload[..HEADER_LEN + 3]).is_none());
        let mut bad = payload.clone();
        bad[HEADER_LEN] = b'x';
        assert!(decode_history(&bad).is_none());
        assert!(decode_history(&encode_payload(7, b"frame")).is_none());
        assert_eq!(parse_offset(b"0"), None);
        assert_eq!(parse_offset(b"99999999999999999999999"), None);
        assert!(split_body(b"garbage", 3).is_none());
    }

    #[test]
    fn channels_round_trip_with_colons_and_unicode() {
        for ch in ["news", "a:b:c", "é".repeat(100).as_str(), ":"] {
            let rc = redis_channel("prj_0011", ch);
            assert_eq!(parse_channel(&rc), Some(("prj_0011", ch)));
        }
        assert_eq!(parse_channel("other:prj_1:x"), None);
        assert_eq!(parse_channel("ringcast:m:prj_1"), None);
        assert_eq!(parse_channel("ringcast:m::x"), None);
    }

    #[test]
    fn payloads_round_trip_and_garbage_is_refused() {
        let p = encode_payload(42, b"\x81\x02hi");
        assert_eq!(decode_payload(&p), Some((42, None, &b"\x81\x02hi"[..])));
        assert_eq!(decode_payload(b""), None);
        assert_eq!(decode_payload(&p[..HEADER_LEN]), None);
        let mut other = p.clone();
        other[0] = 2;
        assert_eq!(decode_payload(&other), None);
        let except = SocketId::from_parts(7, (3 << 40) | 9).unwrap();
        let p = encode_payload_except(42, except, b"\x81\x02hi");
        assert_eq!(
            decode_payload(&p),
            Some((42, Some(except), &b"\x81\x02hi"[..]))
        );
        assert_eq!(decode_payload(&p[..HEADER_LEN + 12]), None);
        let mut out_of_range = p.clone();
        out_of_range[HEADER_LEN + 4..HEADER_LEN + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode_payload(&out_of_range), None);
    }
}
