//! What one client saw on one channel, and the lost/duplicated accounting against what
//! the publisher was answered for.
//!
//! Invariants:
//! - A `Track` is small (its bitset grows only with the offsets it actually sees, one bit
//!   per offset after the client's first position), so ~19,000 clients × 2 channels fit.
//! - An offset is counted `duplicate` when its bit is already set (under the same
//!   epoch), `lost` when the publisher was answered for it, it lies after the client's
//!   first position, and its bit is not set at the end.
//! - An epoch change (the channel's history was lost) is counted, never silently merged:
//!   offsets of another epoch are not compared with this one's.

use std::collections::HashMap;

/// One client's record of one channel.
#[derive(Debug, Default, Clone)]
pub struct Track {
    /// Epoch of the first position (8 hex characters; zeros until known).
    pub epoch: [u8; 8],
    /// The channel's latest offset when this client first subscribed: it expects every
    /// accepted offset above it.
    pub start: u64,
    /// Highest offset received (or `start`): the `since` of the next resubscribe.
    pub last: u64,
    /// Bit `o - start - 1` set once offset `o` was received.
    bits: Vec<u64>,
    pub duplicates: u32,
    /// Messages of another epoch than `epoch` (history lost: not comparable).
    pub foreign_epoch: u32,
    /// Offsets not above `start` (should not happen: counted, not recorded).
    pub before_start: u32,
    /// Set once the first `subscribed` gave the start position.
    pub started: bool,
}

impl Track {
    /// The first `subscribed` of this channel: the client expects every offset above it.
    pub fn start_at(&mut self, offset: u64, epoch: [u8; 8]) {
        if !self.started {
            self.started = true;
            self.start = offset;
            self.last = offset;
            self.epoch = epoch;
        }
    }

    /// A `message` frame with this position.
    pub fn receive(&mut self, offset: u64, epoch: [u8; 8]) {
        if epoch != self.epoch {
            self.foreign_epoch += 1;
            return;
        }
        if offset <= self.start {
            self.before_start += 1;
            return;
        }
        let i = (offset - self.start - 1) as usize;
        let (w, b) = (i / 64, i % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        if self.bits[w] & (1 << b) != 0 {
            self.duplicates += 1;
        } else {
            self.bits[w] |= 1 << b;
        }
        self.last = self.last.max(offset);
    }

    pub fn has(&self, offset: u64) -> bool {
        if offset <= self.start {
            return false;
        }
        let i = (offset - self.start - 1) as usize;
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Accepted offsets (of this epoch) above `start` that never arrived.
    pub fn lost(&self, accepted: &[u64]) -> u64 {
        accepted
            .iter()
            .filter(|&&o| o > self.start && !self.has(o))
            .count() as u64
    }
}

/// Every (channel, offset) the publisher was answered for, per channel, sorted, with
/// the channel's epoch (one per channel while Redis keeps its position).
#[derive(Debug, Default)]
pub struct Accepted {
    pub by_channel: HashMap<String, (String, Vec<u64>)>,
}

impl Accepted {
    /// Parse the publisher's file: one `channel offset epoch` line per accepted publish.
    pub fn parse(text: &str) -> Accepted {
        let mut a = Accepted::default();
        for line in text.lines() {
            let mut it = line.split(' ');
            let (Some(ch), Some(off), Some(ep)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Ok(off) = off.parse::<u64>() else {
                continue;
            };
            let e = a
                .by_channel
                .entry(ch.to_string())
                .or_insert_with(|| (ep.to_string(), Vec::new()));
            e.1.push(off);
        }
        for (_, v) in a.by_channel.values_mut() {
            v.sort_unstable();
        }
        a
    }

    /// Offsets accepted on `channel` under `epoch` (empty when none or another epoch).
    pub fn offsets(&self, channel: &str, epoch: &[u8; 8]) -> &[u64] {
        match self.by_channel.get(channel) {
            Some((e, v)) if e.as_bytes() == epoch => v,
            _ => &[],
        }
    }

    /// Offsets accepted twice for one channel (the publisher's own duplicate: a retry
    /// that published again instead of being answered from the idempotency key).
    pub fn publisher_duplicates(&self) -> u64 {
        self.by_channel
            .values()
            .map(|(_, v)| v.windows(2).filter(|w| w[0] == w[1]).count() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: [u8; 8] = *b"9f3a01c2";

    #[test]
    fn counts_lost_and_duplicates() {
        let mut t = Track::default();
        t.start_at(10, E);
        t.start_at(99, E); // a resubscribe's position does not move the start
        for o in [11, 12, 14, 14, 15, 200] {
            t.receive(o, E);
        }
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.last, 200);
        // 9 and 10 are at or before the start: not expected.
        let accepted = [9, 10, 11, 12, 13, 14, 15, 16, 200];
        assert_eq!(t.lost(&accepted), 2); // 13 and 16
        assert!(t.has(200) && !t.has(13) && !t.has(10));
    }

    #[test]
    fn other_epoch_and_old_offsets_are_counted_apart() {
        let mut t = Track::default();
        t.start_at(5, E);
        t.receive(6, *b"00000000");
        t.receive(5, E);
        t.receive(3, E);
        assert_eq!((t.foreign_epoch, t.before_start, t.duplicates), (1, 2, 0));
        assert_eq!(t.lost(&[6]), 1);
    }

    #[test]
    fn accepted_file_round_trip() {
        let a = Accepted::parse(
            "ltall 2 9f3a01c2\nltall 1 9f3a01c2\nltu3 1 abcdef01\nbad line\nltall 2 9f3a01c2\n",
        );
        assert_eq!(a.offsets("ltall", &E), &[1, 2, 2]);
        assert_eq!(a.offsets("ltall", b"00000000"), &[] as &[u64]);
        assert_eq!(a.offsets("ltu3", b"abcdef01"), &[1]);
        assert_eq!(a.publisher_duplicates(), 1);
    }
}
