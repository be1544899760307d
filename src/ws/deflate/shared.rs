//! A message frame sent to many connections outside the live fan-out (a history
//! replay or recovery), with its permessage-deflate form made at most once for the
//! whole node: [`SharedFrame`].
//!
//! Invariants:
//! - The compressed form is made lazily, by the first connection that agreed to
//!   compression and whose window takes the message (`WsConn::send`), and shared by
//!   every later one on any worker: recovering the same messages on N connections
//!   deflates each once, not N times. A node with no compressing connection never
//!   touches the slot.
//! - A frame below the node's threshold, or that would not shrink, is remembered as
//!   "no compressed form" (`None`) and goes plain; it is never tried again.
//! - The frame is immutable once made; the slot is a `OnceLock`, so two workers asking
//!   at once wait for one deflate.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

/// A plain server frame and its once-made compressed form (see the module docs).
#[derive(Debug)]
pub struct OnceFrame {
    plain: Bytes,
    deflated: OnceLock<Option<Bytes>>,
}

/// What a replay hands out: one [`OnceFrame`] per message, shared by every connection
/// (and, single-node, by the history entry that keeps it).
pub type SharedFrame = Arc<OnceFrame>;

impl OnceFrame {
    pub fn new(plain: Bytes) -> OnceFrame {
        OnceFrame {
            plain,
            deflated: OnceLock::new(),
        }
    }

    /// A shared frame.
    pub fn shared(plain: Bytes) -> SharedFrame {
        Arc::new(OnceFrame::new(plain))
    }

    /// The frame as every connection that does not compress receives it.
    #[inline]
    pub fn plain(&self) -> &Bytes {
        &self.plain
    }

    /// The compressed form (deflated here on first use, at most once), or `None`: below
    /// `ws_compression_min_bytes`, or it would not shrink.
    pub fn deflated(&self) -> Option<&Bytes> {
        self.deflated
            .get_or_init(|| super::codec::compress_large(&self.plain))
            .as_ref()
    }

    /// The compressed form's length if it was made (never deflates): what the frame
    /// holds beyond its plain bytes, for memory accounting.
    pub fn deflated_len(&self) -> usize {
        self.deflated
            .get()
            .and_then(Option::as_ref)
            .map_or(0, Bytes::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::frame::{frame, Opcode};

    #[test]
    fn deflated_once_and_remembered() {
        let json = "{\"name\":\"some item\",\"price\":12.5},".repeat(40);
        let f = OnceFrame::shared(frame(Opcode::Text, json.as_bytes()));
        assert_eq!(f.deflated_len(), 0, "nothing made before it is asked for");
        let a = f.deflated().expect("JSON shrinks").clone();
        let b = f.deflated().unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr(), "made once, then shared");
        assert_eq!(f.deflated_len(), a.len());
        assert_eq!(a[0], 0xC1);

        // Below the threshold: remembered as none.
        let small = OnceFrame::new(frame(Opcode::Text, b"{\"a\":1}"));
        assert!(small.deflated().is_none());
        assert_eq!(small.deflated_len(), 0);
    }
}
