//! Which channels a worker has subscribers for, readable by every core without a lock.
//!
//! A counting filter: 4096 atomic counters indexed by a hash of (project, channel). A
//! worker's registry increments a slot when a channel gets its first local subscriber
//! and decrements it when the last one leaves; a publisher on any core skips a worker
//! whose slot is zero. A zero is exact (no subscriber on that worker can be missed); a
//! non-zero may be a collision, which only costs one needless mailbox push. So a publish
//! to a channel nobody on a core listens to costs that core nothing: no queue traffic,
//! no wake-up. Collisions chosen by a client cannot make anything wrong, only slower.
//!
//! Ordering: the increment happens before the `subscribed` reply is queued, so a
//! publish made after the client saw `subscribed` always finds the slot set.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

const SLOTS: usize = 4096;

/// Hash of a (project, channel) pair, the same on every core.
pub fn channel_hash(project: u32, channel: &str) -> u64 {
    // SipHash with fixed keys: deterministic across threads and cheap for short names.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    project.hash(&mut h);
    channel.hash(&mut h);
    h.finish()
}

pub struct InterestFilter {
    slots: Box<[AtomicU32]>,
}

impl Default for InterestFilter {
    fn default() -> Self {
        InterestFilter {
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

impl InterestFilter {
    fn slot(&self, hash: u64) -> &AtomicU32 {
        &self.slots[(hash as usize) & (SLOTS - 1)]
    }

    /// A channel gained its first local subscriber.
    pub fn add(&self, hash: u64) {
        self.slot(hash).fetch_add(1, Ordering::SeqCst);
    }

    /// A channel lost its last local subscriber.
    pub fn remove(&self, hash: u64) {
        let _ = self
            .slot(hash)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Whether the worker may have subscribers for this hash (false means surely not).
    pub fn may_want(&self, hash: u64) -> bool {
        self.slot(hash).load(Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_slot() {
        let f = InterestFilter::default();
        let a = channel_hash(1, "news");
        assert!(!f.may_want(a));
        f.add(a);
        f.add(a);
        f.remove(a);
        assert!(f.may_want(a));
        f.remove(a);
        assert!(!f.may_want(a));
        f.remove(a); // never underflows
        assert!(!f.may_want(a));
        assert_ne!(channel_hash(1, "news"), channel_hash(2, "news"));
        assert_eq!(channel_hash(1, "news"), channel_hash(1, "news"));
    }
}
