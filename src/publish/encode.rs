//! Encoding a broadcast once: the complete WebSocket text frame (header + JSON) that
//! every subscriber on every core receives unchanged.
//!
//! Server-to-client frames are unmasked, so the bytes are identical for all
//! subscribers: the frame is built in one exactly-sized allocation and frozen into a
//! `Bytes` that the fan-out only reference-counts.

use std::ops::Range;

use bytes::Bytes;

pub(crate) use crate::json::{json_str_len, write_json_str};
use crate::ws::frame::{header_len, write_header, Opcode};

/// The broadcast frame of a message of a history project: the same JSON with
/// `"offset":N,"epoch":"..."` after `id`; also the span of `data` inside the frame
/// (history keeps the frame and serves `data` from it without a copy).
pub(crate) fn message_frame_at(
    channel: &str,
    event: &str,
    data: &[u8],
    id: &str,
    offset: u64,
    epoch: &str,
) -> (Bytes, Range<usize>) {
    const A: &[u8] = b"{\"type\":\"message\",\"channel\":";
    const B: &[u8] = b",\"event\":";
    const C: &[u8] = b",\"data\":";
    const D: &[u8] = b",\"id\":\"";
    const E: &[u8] = b"\",\"offset\":";
    const F: &[u8] = b",\"epoch\":";
    // History projects only: one small allocation for the number is fine here.
    let offset_text = offset.to_string();
    let payload_len = A.len()
        + json_str_len(channel)
        + B.len()
        + json_str_len(event)
        + C.len()
        + data.len()
        + D.len()
        + id.len()
        + E.len()
        + offset_text.len()
        + F.len()
        + json_str_len(epoch)
        + 1;
    let mut out = Vec::with_capacity(header_len(payload_len) + payload_len);
    write_header(&mut out, Opcode::Text, payload_len);
    out.extend_from_slice(A);
    write_json_str(&mut out, channel);
    out.extend_from_slice(B);
    write_json_str(&mut out, event);
    out.extend_from_slice(C);
    let data_start = out.len();
    out.extend_from_slice(data);
    let data_end = out.len();
    out.extend_from_slice(D);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(E);
    out.extend_from_slice(offset_text.as_bytes());
    out.extend_from_slice(F);
    write_json_str(&mut out, epoch);
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    (Bytes::from(out), data_start..data_end)
}

/// The broadcast frame for one accepted publish.
pub fn message_frame(channel: &str, event: &str, data: &[u8], id: &str) -> Bytes {
    const A: &[u8] = b"{\"type\":\"message\",\"channel\":";
    const B: &[u8] = b",\"event\":";
    const C: &[u8] = b",\"data\":";
    const D: &[u8] = b",\"id\":\"";
    const E: &[u8] = b"\"}";
    let payload_len = A.len()
        + json_str_len(channel)
        + B.len()
        + json_str_len(event)
        + C.len()
        + data.len()
        + D.len()
        + id.len()
        + E.len();
    let mut out = Vec::with_capacity(header_len(payload_len) + payload_len);
    write_header(&mut out, Opcode::Text, payload_len);
    out.extend_from_slice(A);
    write_json_str(&mut out, channel);
    out.extend_from_slice(B);
    write_json_str(&mut out, event);
    out.extend_from_slice(C);
    out.extend_from_slice(data);
    out.extend_from_slice(D);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(E);
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (body, _) = crate::cluster::wire::message_body("c:1", "e\"", br#"{"a":[1]}"#, "abc");
        let remote = crate::cluster::wire::frame_with_position(&body, 42, "00ff00ff");
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
}
