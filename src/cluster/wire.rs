//! What travels through Redis: the pub/sub channel name of a (project, channel) pair and
//! the payload of one relayed publish.
//!
//! - Channel: `ringcast:m:<project id>:<channel>`. Project ids (`prj_` + hex) never
//!   contain `:`, so the first `:` after the prefix splits the two unambiguously, and a
//!   channel name may contain any character, `:` included. Project *ids* are used, not the
//!   dense per-process indexes, because indexes differ between nodes.
//! - Payload: [`VERSION`], the origin node id (8 bytes, little endian), then the complete
//!   WebSocket frame exactly as the origin encoded it. The frame is not re-encoded on the
//!   receiving node: it is copied once into a `Bytes` that all its subscribers share.
//!
//! Decoding never panics on foreign input: anything malformed is `None`.

/// Prefix of every message channel ringcast subscribes to or publishes on.
pub(crate) const CHANNEL_PREFIX: &str = "ringcast:m:";

/// Payload format version; a node drops payloads of another version (a mixed-version
/// cluster during an upgrade loses cross-node messages between the two versions rather
/// than delivering frames it cannot vouch for).
pub(crate) const VERSION: u8 = 1;

/// Bytes before the frame in a payload.
pub(crate) const HEADER_LEN: usize = 9;

/// The Redis channel of `channel` in project `project_id`.
pub(crate) fn redis_channel(project_id: &str, channel: &str) -> String {
    let mut s = String::with_capacity(CHANNEL_PREFIX.len() + project_id.len() + 1 + channel.len());
    s.push_str(CHANNEL_PREFIX);
    s.push_str(project_id);
    s.push(':');
    s.push_str(channel);
    s
}

/// Split a Redis channel into (project id, channel).
pub(crate) fn parse_channel(redis_channel: &str) -> Option<(&str, &str)> {
    let rest = redis_channel.strip_prefix(CHANNEL_PREFIX)?;
    let (project, channel) = rest.split_once(':')?;
    (!project.is_empty() && !channel.is_empty()).then_some((project, channel))
}

/// The payload for `frame` published by node `origin`.
pub(crate) fn encode_payload(origin: u64, frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + frame.len());
    out.push(VERSION);
    out.extend_from_slice(&origin.to_le_bytes());
    out.extend_from_slice(frame);
    out
}

/// (origin node, frame) of a payload.
pub(crate) fn decode_payload(payload: &[u8]) -> Option<(u64, &[u8])> {
    if payload.len() <= HEADER_LEN || payload[0] != VERSION {
        return None;
    }
    let origin = u64::from_le_bytes(payload[1..HEADER_LEN].try_into().ok()?);
    Some((origin, &payload[HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(decode_payload(&p), Some((42, &b"\x81\x02hi"[..])));
        assert_eq!(decode_payload(b""), None);
        assert_eq!(decode_payload(&p[..HEADER_LEN]), None);
        let mut other = p.clone();
        other[0] = 2;
        assert_eq!(decode_payload(&other), None);
    }
}
