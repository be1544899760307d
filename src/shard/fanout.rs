//! Fan-out of one broadcast to a worker's subscribers of its channel: which of the
//! message's shared frames each connection takes (native or Pusher, plain or
//! permessage-deflate), and the send.
//!
//! Invariants: nothing is allocated per subscriber; each subscriber costs an id compare,
//! a dialect/flag check and a reference to one of at most four frames, each made at
//! most once per message for the whole node (`Broadcast::frame_for`,
//! `Broadcast::deflated_for`) and only when a subscriber needs it. The compression
//! counters are summed here and written once per fan-out.

use bytes::Bytes;

use super::mailbox::Broadcast;
use super::registry::Registry;
use crate::dialect::Dialect;
use crate::ws::conn::WsConn;
use crate::ws::deflate::payload_len;

/// The frames of one broadcast as its subscribers ask for them, looked up once each.
pub(super) struct Pick<'a> {
    msg: &'a Broadcast,
    /// Per dialect (native, Pusher): the plain payload's length, once asked for (a
    /// connection with a small window takes only short ones; it is checked before
    /// anything is deflated, so a message nobody can take compressed is never deflated).
    plain: [Option<usize>; 2],
    /// Per dialect: the compressed frame, once asked for (`None` inside: it would not
    /// shrink, or is under the threshold).
    deflated: [Option<Option<&'a Bytes>>; 2],
    /// Per dialect: compressed frames sent. The bytes saved follow from these and the
    /// two frames' lengths, once per fan-out ([`Pick::count`]).
    compressed: [u64; 2],
}

fn slot(dialect: Dialect) -> usize {
    usize::from(dialect == Dialect::Pusher)
}

impl<'a> Pick<'a> {
    pub(super) fn new(msg: &'a Broadcast) -> Pick<'a> {
        Pick {
            msg,
            plain: [None, None],
            deflated: [None, None],
            compressed: [0, 0],
        }
    }

    /// The frame `conn` receives (`None`: this message has no form for its protocol).
    #[inline]
    pub(super) fn frame(&mut self, conn: &WsConn) -> Option<&'a Bytes> {
        let dialect = conn.dialect();
        if conn.compresses() {
            if let Some(f) = self.deflated(dialect, conn) {
                return Some(f);
            }
        }
        self.msg.frame_for(dialect)
    }

    /// The compressed frame for `dialect` if `conn`'s window takes it; deflated (once
    /// for the node) only then.
    #[inline]
    fn deflated(&mut self, dialect: Dialect, conn: &WsConn) -> Option<&'a Bytes> {
        let msg = self.msg;
        let i = slot(dialect);
        let len = *self.plain[i]
            .get_or_insert_with(|| msg.frame_for(dialect).map_or(0, |f| payload_len(f)));
        if !conn.deflate_fits(len) {
            return None;
        }
        *self.deflated[i].get_or_insert_with(|| msg.deflated_for(dialect))
    }

    /// What a compressing native connection receives (the channel has no Pusher
    /// subscriber here: the native-only loop).
    #[inline]
    fn native_deflated(&mut self, conn: &WsConn) -> &'a Bytes {
        self.deflated(Dialect::Native, conn)
            .unwrap_or(&self.msg.frame)
    }

    /// `frame` (from [`Pick::frame`]) went to a connection speaking `dialect`: count it
    /// if compressed (RSV1).
    #[inline]
    pub(super) fn sent(&mut self, dialect: Dialect, frame: &Bytes) {
        if frame.first().is_some_and(|b| b & 0x40 != 0) {
            self.compressed[slot(dialect)] += 1;
        }
    }

    /// Write the counters (once per fan-out): frames sent compressed, and the bytes they
    /// saved (per dialect, the plain frame's length less the compressed one's).
    pub(super) fn count(&self) {
        let mut frames = 0;
        let mut saved = 0;
        for (i, dialect) in [Dialect::Native, Dialect::Pusher].into_iter().enumerate() {
            let n = self.compressed[i];
            if let (true, Some(Some(small))) = (n > 0, self.deflated[i]) {
                let plain = self.msg.frame_for(dialect).map_or(0, Bytes::len);
                frames += n;
                saved += n * plain.saturating_sub(small.len()) as u64;
            }
        }
        if frames > 0 {
            crate::metrics::with(|m| m.compressed(frames, saved));
        }
    }
}

/// Deliver one broadcast to a registry's subscribers of its channel. Returns how many
/// connections took the frame. (The shard itself calls [`fan_out_skipping`].)
#[cfg(feature = "bench")]
pub fn fan_out(registry: &Registry, msg: &Broadcast) -> usize {
    fan_out_skipping(registry, msg, 0)
}

/// [`fan_out`] leaving out connection `skip` (a client event's sender; 0: nobody, no
/// connection has id 0). One integer compare per subscriber, nothing allocated.
pub(super) fn fan_out_skipping(registry: &Registry, msg: &Broadcast, skip: u64) -> usize {
    let Some(subs) = registry.subscribers(msg.project, &msg.channel) else {
        return 0;
    };
    let mut delivered = 0;
    let mut pick = Pick::new(msg);
    if subs.pusher() == 0 {
        // Only native subscribers: the Pusher frames are never looked at.
        for conn in subs.values() {
            if conn.id == skip {
                continue;
            }
            let frame = if conn.compresses() {
                pick.native_deflated(conn)
            } else {
                &msg.frame
            };
            if conn.send_shared(frame) {
                pick.sent(Dialect::Native, frame);
                delivered += 1;
            }
        }
        pick.count();
        return delivered;
    }
    for conn in subs.values() {
        if conn.id == skip {
            continue;
        }
        let Some(frame) = pick.frame(conn) else {
            continue;
        };
        if conn.send_shared(frame) {
            pick.sent(conn.dialect(), frame);
            delivered += 1;
        }
    }
    pick.count();
    delivered
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::wire::native::message_frame;
    use crate::ws::deflate::codec::inflate;
    use crate::ws::frame::data_payload;

    fn conn(id: u64, dialect: Dialect, window: Option<u8>) -> Rc<WsConn> {
        Rc::new(
            WsConn::new(id, -1, 1 << 20, 0)
                .with_dialect(dialect)
                .with_compression(window),
        )
    }

    /// The payload of a queued frame, inflated when RSV1 is set.
    fn text(frame: &[u8]) -> Vec<u8> {
        if frame[0] & 0x40 == 0 {
            return data_payload(frame).unwrap().1.to_vec();
        }
        let mut plain = frame.to_vec();
        plain[0] &= !0x40;
        let mut out = Vec::new();
        inflate(data_payload(&plain).unwrap().1, 1 << 20, &mut out).unwrap();
        out
    }

    #[test]
    fn each_subscriber_gets_the_one_frame_it_agreed_to() {
        let data = format!(
            "[{}]",
            vec!["{\"k\":\"some value\",\"n\":12345}"; 60].join(",")
        );
        let frame = message_frame("c", "e", data.as_bytes(), "id1");
        let msg = Broadcast::plain(1, "c".into(), frame.clone());
        let mut registry = Registry::new();
        let plain = conn(1, Dialect::Native, None);
        let deflating = conn(2, Dialect::Native, Some(15));
        let deflating2 = conn(3, Dialect::Native, Some(15));
        // A 9-bit window takes compressed only messages of at most 512 bytes.
        let small_window = conn(4, Dialect::Native, Some(9));
        for c in [&plain, &deflating, &deflating2, &small_window] {
            registry.subscribe(1, "c", c);
        }
        assert_eq!(fan_out_skipping(&registry, &msg, 0), 4);
        let got: Vec<Bytes> = [&plain, &deflating, &deflating2, &small_window]
            .iter()
            .map(|c| c.take_queued().remove(0))
            .collect();
        assert_eq!(got[0], frame);
        assert_eq!(got[0][0], 0x81);
        assert_eq!(got[1][0], 0xC1);
        assert!(got[1].len() * 3 < frame.len());
        // Compressed once: both compressing subscribers hold the same bytes.
        assert_eq!(got[1].as_ptr(), got[2].as_ptr());
        assert_eq!(text(&got[1]), text(&frame));
        assert_eq!(got[3], frame);

        // With a Pusher subscriber on the channel: each protocol's compressed form.
        let pusher = conn(5, Dialect::Pusher, Some(15));
        registry.subscribe(1, "c", &pusher);
        let msg = Broadcast::plain(1, "c".into(), frame.clone());
        assert_eq!(fan_out_skipping(&registry, &msg, 0), 5);
        let p = pusher.take_queued().remove(0);
        assert_eq!(p[0], 0xC1);
        assert_eq!(text(&p), text(msg.frame_for(Dialect::Pusher).unwrap()));
        assert_eq!(deflating.take_queued().remove(0)[0], 0xC1);
        assert_eq!(plain.take_queued().remove(0), frame);
    }

    #[test]
    fn small_messages_go_plain_to_everyone() {
        let frame = message_frame("c", "e", b"{\"a\":1}", "id1");
        let msg = Broadcast::plain(1, "c".into(), frame.clone());
        let mut registry = Registry::new();
        let deflating = conn(1, Dialect::Native, Some(15));
        registry.subscribe(1, "c", &deflating);
        assert_eq!(fan_out_skipping(&registry, &msg, 0), 1);
        assert_eq!(deflating.take_queued(), vec![frame]);
    }
}
