//! permessage-deflate (RFC 7692) the encode-once way: what the upgrade agrees to
//! ([`negotiate`]), and the one-shot compressor and bounded inflater ([`codec`]).
//!
//! Invariants:
//! - Only `server_no_context_takeover; client_no_context_takeover` is ever agreed, so
//!   every message is compressed on its own: one compressed frame serves every
//!   subscriber, and no connection keeps compressor or inflater state. The compressor
//!   and the inflater are per worker thread, reset for each message.
//! - Whether a connection compresses is one flag in its record (`WsConn::compresses`),
//!   set before the connection is shared.
//! - Frames below the node's threshold (`ws_compression_min_bytes`, [`min_bytes`]) go
//!   plain: the threshold is node-wide (every worker shares the one compressed frame of
//!   a message), set once at start by [`configure`].
//! - A frame sent outside the live fan-out to many connections (a replay) carries its
//!   own once-made compressed form ([`shared`]).

pub(crate) mod codec;
pub(crate) mod negotiate;
pub(crate) mod shared;

pub use shared::{OnceFrame, SharedFrame};

use std::sync::atomic::{AtomicUsize, Ordering};

/// `ws_compression`: `on` (the default) or `off` (every offer declined; no frame is
/// ever compressed and the compressed slots of a message are never touched).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    On,
    Off,
}

impl Compression {
    pub fn is_on(self) -> bool {
        self == Compression::On
    }
}

/// The default of `ws_compression_min_bytes`.
pub(crate) const DEFAULT_MIN_BYTES: usize = 512;

static MIN_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MIN_BYTES);

/// Set the node's threshold (at start, before any worker runs).
pub fn configure(min_bytes: usize) {
    MIN_BYTES.store(min_bytes, Ordering::Relaxed);
}

/// Smallest payload a message frame is compressed at.
#[inline]
pub(crate) fn min_bytes() -> usize {
    MIN_BYTES.load(Ordering::Relaxed)
}

/// A server message frame's payload length (at most the frame's: any other frame is
/// treated as too long for a small window), for `WsConn::deflate_fits`.
#[inline]
pub(crate) fn payload_len(frame: &[u8]) -> usize {
    crate::ws::frame::data_payload(frame).map_or(frame.len(), |(_, p)| p.len())
}

#[cfg(test)]
mod tests {
    /// The flag costs nothing: it sits in padding of the connection record (80 B; 96 B
    /// in its `Rc` allocation).
    #[test]
    fn the_connection_record_keeps_its_size() {
        assert_eq!(std::mem::size_of::<crate::ws::conn::WsConn>(), 80);
    }
}
