//! Cluster mode: this node's cache of recently replayed history frames, so that clients
//! recovering the same messages on one node share one frame and one compressed form
//! (`ws::deflate::SharedFrame`) instead of each getting its own, deflated again.
//!
//! Invariants:
//! - It lives on the subscriber thread, the only one that builds replays: no lock.
//! - A frame is keyed by (project, channel, epoch, offset), which names one message as
//!   long as an epoch never serves two histories of a channel: a history starts under
//!   its window's first epoch (`cluster::history`), or a random one when `ringcast:hn`
//!   shows an earlier history in the same window. Only if Redis evicted both the
//!   position hash and that set within one window could the same key name another
//!   message (clients would face the same ambiguity).
//! - Bounded in bytes (`replay_cache_bytes`): each frame counts its plain bytes, its
//!   channel name and a fixed overhead, and its compressed form once made; above the
//!   bound the oldest frames go first. A worker makes the compressed form, so it is
//!   counted when the frame is next looked up here (until then it is uncounted, and
//!   smaller than the frame it came from). 0 turns the cache off: nothing is kept or
//!   looked up.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use crate::ws::deflate::{OnceFrame, SharedFrame};

/// Bytes counted per frame beyond its bytes and its channel name (its map slots, its
/// place in the eviction order, the shared frame's header).
const FRAME_OVERHEAD: usize = 128;

/// The default of `replay_cache_bytes`.
pub(crate) const DEFAULT_BYTES: usize = 8 << 20;

static MAX_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_BYTES);

/// Set the node's bound (at start, before the subscriber thread runs).
pub(crate) fn configure(max_bytes: usize) {
    MAX_BYTES.store(max_bytes, Ordering::Relaxed);
}

/// (project, epoch, offset) of a frame, under its channel.
type Key = (u32, [u8; 8], u64);

/// One kept frame in eviction order, with the bytes it counted when kept (its
/// compressed form's are in the map).
struct Kept {
    channel: Rc<str>,
    key: Key,
    plain: usize,
}

/// Recently replayed frames (see the module docs).
pub(crate) struct ReplayCache {
    max_bytes: usize,
    /// Channel → its kept frames (by channel first, so a lookup by `&str` allocates
    /// nothing).
    /// Each frame with its compressed form's bytes counted so far.
    frames: HashMap<Rc<str>, HashMap<Key, (SharedFrame, usize)>>,
    /// Oldest first.
    order: VecDeque<Kept>,
    bytes: usize,
}

impl ReplayCache {
    /// A cache bounded by the node's `replay_cache_bytes`.
    pub(crate) fn configured() -> ReplayCache {
        ReplayCache::new(MAX_BYTES.load(Ordering::Relaxed))
    }

    pub(crate) fn new(max_bytes: usize) -> ReplayCache {
        ReplayCache {
            max_bytes,
            frames: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }

    /// The frame of message (`project`, `channel`, `epoch`, `offset`): the kept one, or
    /// `build()`'s, kept from now on.
    pub(crate) fn frame(
        &mut self,
        project: u32,
        channel: &str,
        epoch: &str,
        offset: u64,
        build: impl FnOnce() -> Bytes,
    ) -> SharedFrame {
        let Some(epoch) = epoch_key(epoch).filter(|_| self.max_bytes > 0) else {
            return OnceFrame::shared(build());
        };
        let key = (project, epoch, offset);
        if let Some((f, counted)) = self.frames.get_mut(channel).and_then(|m| m.get_mut(&key)) {
            let f = f.clone();
            let made = f.deflated_len();
            if made > *counted {
                self.bytes += made - *counted;
                *counted = made;
                self.evict();
            }
            return f;
        }
        let frame = OnceFrame::shared(build());
        let cost = frame.plain().len() + channel.len() + FRAME_OVERHEAD;
        if cost > self.max_bytes {
            return frame;
        }
        let name = match self.frames.get_key_value(channel) {
            Some((name, _)) => name.clone(),
            None => Rc::from(channel),
        };
        self.frames
            .entry(name.clone())
            .or_default()
            .insert(key, (frame.clone(), 0));
        self.order.push_back(Kept {
            channel: name,
            key,
            plain: cost,
        });
        self.bytes += cost;
        self.evict();
        frame
    }

    /// Drop the oldest frames while over the bound.
    fn evict(&mut self) {
        while self.bytes > self.max_bytes {
            let Some(old) = self.order.pop_front() else {
                return;
            };
            self.bytes -= old.plain;
            if let Some(m) = self.frames.get_mut(&old.channel) {
                if let Some((_, counted)) = m.remove(&old.key) {
                    self.bytes -= counted;
                }
                if m.is_empty() {
                    self.frames.remove(&old.channel);
                }
            }
        }
    }

    /// Frames kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.order.len()
    }
}

/// An epoch as read from Redis (8 characters), or `None` (not cached).
fn epoch_key(epoch: &str) -> Option<[u8; 8]> {
    epoch.as_bytes().try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::frame::{frame, Opcode};
    use std::sync::Arc;

    fn msg(n: usize) -> Bytes {
        frame(Opcode::Text, &vec![b'x'; n])
    }

    #[test]
    fn a_message_is_built_once_and_shared() {
        let mut c = ReplayCache::new(1 << 20);
        let mut built = 0;
        let a = c.frame(1, "c", "0123abcd", 5, || {
            built += 1;
            msg(100)
        });
        let b = c.frame(1, "c", "0123abcd", 5, || {
            built += 1;
            msg(100)
        });
        assert_eq!(built, 1);
        assert!(Arc::ptr_eq(&a, &b));
        // Another offset, epoch, project or channel is another message.
        for (p, ch, e, o) in [
            (1, "c", "0123abcd", 6),
            (1, "c", "ffffffff", 5),
            (2, "c", "0123abcd", 5),
            (1, "d", "0123abcd", 5),
        ] {
            let f = c.frame(p, ch, e, o, || msg(100));
            assert!(!Arc::ptr_eq(&a, &f));
        }
        assert_eq!(c.len(), 5);
    }

    #[test]
    fn bounded_oldest_first_and_off_at_zero() {
        let each = msg(1000).len() + 1 + FRAME_OVERHEAD;
        let mut c = ReplayCache::new(3 * each);
        for o in 1..=5 {
            c.frame(1, "c", "0123abcd", o, || msg(1000));
        }
        assert_eq!(c.len(), 3);
        assert!(c.bytes <= 3 * each);
        // The newest three are kept: 3..=5 hit, 1 is built again.
        let mut built = 0;
        for o in [3, 4, 5, 1] {
            c.frame(1, "c", "0123abcd", o, || {
                built += 1;
                msg(1000)
            });
        }
        assert_eq!(built, 1);

        let mut off = ReplayCache::new(0);
        let a = off.frame(1, "c", "0123abcd", 1, || msg(10));
        let b = off.frame(1, "c", "0123abcd", 1, || msg(10));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(off.len(), 0);
        assert!(off.frames.is_empty());
    }

    #[test]
    fn compressed_forms_count_against_the_bound() {
        let json = "{\"name\":\"some item\",\"price\":12.5},".repeat(100);
        let plain = frame(Opcode::Text, json.as_bytes());
        let each = plain.len() + 1 + FRAME_OVERHEAD;
        let mut c = ReplayCache::new(2 * each + 10);
        let a = c.frame(1, "c", "0123abcd", 1, || plain.clone());
        c.frame(1, "c", "0123abcd", 2, || plain.clone());
        assert_eq!(c.len(), 2);
        assert!(a.deflated().is_some());
        // Looked up again: its compressed form counts now, and the oldest frame that
        // no longer fits goes (here the other one: the hit stays where it was kept,
        // oldest, so it goes first and the lookup still returns it).
        let again = c.frame(1, "c", "0123abcd", 1, || plain.clone());
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(c.len(), 1);
        assert!(c.bytes <= 2 * each + 10);
    }
}
