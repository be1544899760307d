//! A connection's own frames ([`WsConn::send`]): replies, and replayed messages.
//!
//! Invariants:
//! - On a connection that agreed to permessage-deflate, a message frame at or above the
//!   node's threshold whose payload fits the agreed window goes compressed; anything
//!   else goes plain. The check is the live fan-out's (`WsConn::deflate_fits` on
//!   `ws::deflate::payload_len`, `codec::compress_large`).
//! - A reply (`Bytes`) is this connection's alone: it is deflated here if it goes
//!   compressed. A replayed message ([`SharedFrame`]) is shared by every connection
//!   recovering it: its compressed form is made at most once for the node, by the
//!   first compressing connection that takes it, and shared by the rest.
//! - A compressed frame is counted (`ringcast_compressed_frames_total`, bytes saved)
//!   only when the connection took it.

use std::rc::Rc;

use bytes::Bytes;

use super::WsConn;
use crate::ws::deflate::{codec, payload_len, SharedFrame};

/// A frame a connection queues as its own (see [`WsConn::send`]).
#[derive(Debug)]
pub enum OwnFrame {
    /// A reply made for this connection.
    Reply(Bytes),
    /// A message replayed from history, shared with other connections.
    Replay(SharedFrame),
}

impl From<Bytes> for OwnFrame {
    fn from(frame: Bytes) -> OwnFrame {
        OwnFrame::Reply(frame)
    }
}

impl From<SharedFrame> for OwnFrame {
    fn from(frame: SharedFrame) -> OwnFrame {
        OwnFrame::Replay(frame)
    }
}

impl WsConn {
    /// Queue a frame of this connection's own (a reply, a replayed message). Returns
    /// `false` when the connection is closing or was just closed for exceeding its
    /// backlog. Never blocks, never copies the frame. Compressed as the module docs say.
    pub fn send(self: &Rc<Self>, frame: impl Into<OwnFrame>) -> bool {
        match frame.into() {
            OwnFrame::Reply(frame) => self.send_reply(frame),
            OwnFrame::Replay(frame) => self.send_replay(&frame),
        }
    }

    fn send_reply(self: &Rc<Self>, frame: Bytes) -> bool {
        if self.takes_deflated(&frame) {
            if let Some(small) = codec::compress_large(&frame) {
                return self.send_compressed(&small, frame.len());
            }
        }
        self.enqueue(&frame, true)
    }

    fn send_replay(self: &Rc<Self>, frame: &SharedFrame) -> bool {
        let plain = frame.plain();
        if self.takes_deflated(plain) {
            if let Some(small) = frame.deflated() {
                return self.send_compressed(small, plain.len());
            }
        }
        self.enqueue(plain, true)
    }

    /// Whether this connection takes `frame` compressed, if it has a compressed form.
    #[inline]
    fn takes_deflated(&self, frame: &[u8]) -> bool {
        self.compresses() && self.deflate_fits(payload_len(frame))
    }

    /// Queue `small`, the compressed form of a frame of `plain` bytes, and count it
    /// once taken (not by a closing connection).
    fn send_compressed(self: &Rc<Self>, small: &Bytes, plain: usize) -> bool {
        let taken = self.enqueue(small, true);
        if taken {
            let saved = plain.saturating_sub(small.len()) as u64;
            crate::metrics::with(|m| m.compressed(1, saved));
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::deflate::OnceFrame;
    use crate::ws::frame::{frame, Opcode};

    fn conn(id: u64, window: Option<u8>) -> Rc<WsConn> {
        Rc::new(WsConn::new(id, -1, 1 << 20, 0).with_compression(window))
    }

    #[test]
    fn a_replayed_frame_is_deflated_once_for_every_compressing_connection() {
        let json = "{\"name\":\"some item\",\"price\":12.5},".repeat(40);
        let plain = frame(Opcode::Text, json.as_bytes());
        let shared = OnceFrame::shared(plain.clone());
        let (a, b, off) = (conn(1, Some(15)), conn(2, Some(15)), conn(3, None));
        // 9 bits: messages of at most 512 bytes only; this one is larger.
        let small_window = conn(4, Some(9));
        for c in [&off, &small_window] {
            assert!(c.send(shared.clone()));
            assert_eq!(c.take_queued(), vec![plain.clone()]);
        }
        assert_eq!(shared.deflated_len(), 0, "no taker yet: never deflated");
        assert!(a.send(shared.clone()));
        assert!(b.send(shared.clone()));
        let (fa, fb) = (a.take_queued().remove(0), b.take_queued().remove(0));
        assert_eq!(fa[0], 0xC1);
        assert_eq!(fa.as_ptr(), fb.as_ptr(), "one compressed frame for both");
        assert!(fa.len() < plain.len() / 2);
    }
}
