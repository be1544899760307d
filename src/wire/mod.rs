//! Every byte format the server writes to a socket or to Redis, in one place, and the
//! checks of what comes back from Redis.
//!
//! - [`native`]: the native protocol's server frames: the message frame of a publish
//!   (with a history position, or a client event's `user_id`), the presence frame and the
//!   presence object (member list), the replies (`subscribed`, `error`, `pong`,
//!   `connected`, ...). The message JSON is spelled once, there; the history body that
//!   Redis keeps and relays is a prefix of it.
//! - [`pusher`]: the Pusher Channels (protocol 7) server frames.
//! - [`relay`]: the cluster's Redis payloads (versioned header, origin node, excepted
//!   connection, history position) and the checks a received frame passes before it
//!   reaches a client.
//! - [`write`]: the shared writer of every frame but the message frame: a JSON object
//!   given as a table of fields, counted, then written into one buffer of exactly that
//!   size. A native and a Pusher frame differ only in their tables.
//!
//! Invariants:
//! - Every frame is one complete, final, unmasked WebSocket text frame (header from
//!   `ws::frame`), built in one exactly-sized allocation, so a broadcast is encoded once
//!   and shared as one `Bytes` by every subscriber.
//! - The output is valid JSON for any `&str` input: names and user ids are escaped by
//!   `crate::json`; the parts documented as JSON text (a message's `data`, a member's
//!   `info`, the presence object) are the caller's to have checked and are copied byte for
//!   byte, never parsed or re-serialised.
//! - Decoding what Redis hands over never panics: anything malformed is `None` or
//!   `false`.
//!
//! A transport-level module: it names `ws::frame`, `json`, `names` and `ids`, nothing
//! of the requests, the shard or the cluster, so every writer (publish, client, shard,
//! cluster, presence, http) may call it.

pub(crate) mod native;
pub(crate) mod pusher;
pub(crate) mod relay;
mod write;

/// The payload of a one-frame server text frame, checked to be exactly one frame with a
/// minimal header (the unit tests of the frame writers).
#[cfg(test)]
pub(crate) fn test_payload(f: &bytes::Bytes) -> &str {
    assert_eq!(f[0], 0x81, "final text frame");
    let (start, len) = match f[1] {
        126 => (4, u16::from_be_bytes([f[2], f[3]]) as usize),
        127 => (
            10,
            u64::from_be_bytes(f[2..10].try_into().unwrap()) as usize,
        ),
        n => (2, n as usize),
    };
    assert_eq!(f.len(), start + len, "one frame, exactly");
    assert_eq!(start, crate::ws::frame::header_len(len), "a minimal header");
    std::str::from_utf8(&f[start..]).unwrap()
}
