//! One channel's local subscribers: a dense vector the fan-out walks, and (only for a
//! channel with more than [`LINEAR`] subscribers) a position index by connection id so
//! that unsubscribe is O(1) (swap-remove), and 10k subscribers leaving a channel cost
//! 10k constant steps, not 10k scans.
//!
//! Why not an `IndexMap<u64, Rc<WsConn>>`: it keeps hash, key and value per entry (24 B)
//! plus an 8-B index whose table is resident in full (its entries are scattered). Here a
//! subscriber is its 8-B pointer (the id is read through it) and a 4-B position.
//!
//! Invariants: `conns` holds each connection at most once; while `index` is in use it
//! maps every connection's id to its position in `conns` and nothing else; `pusher`
//! counts the connections of `conns` that speak the Pusher protocol.

use std::rc::Rc;

use hashbrown::HashTable;

use crate::dialect::Dialect;
use crate::ws::conn::WsConn;

/// Up to this many subscribers a channel has no index: a scan of a few pointers is
/// cheaper than hashing, and a small channel allocates nothing more.
const LINEAR: usize = 16;

/// A connection id's hash for the position index. Ids are sequential numbers given by
/// the server (no client chooses them): a multiply spreads them over the buckets (low
/// bits) and the control bytes (high bits).
fn hash_id(id: u64) -> u64 {
    (id ^ (id >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// One channel's local subscribers, and how many of them speak the Pusher protocol (so
/// the fan-out of a channel without any looks at no connection's dialect and never
/// makes the Pusher frame).
#[derive(Default)]
pub struct Subscribers {
    conns: Vec<Rc<WsConn>>,
    /// Position in `conns` by id; empty (and unallocated) while `conns` has at most
    /// [`LINEAR`] entries.
    index: HashTable<u32>,
    pusher: u32,
}

impl Subscribers {
    #[inline]
    pub fn values(&self) -> std::slice::Iter<'_, Rc<WsConn>> {
        self.conns.iter()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Subscribers speaking the Pusher protocol.
    #[inline]
    pub fn pusher(&self) -> u32 {
        self.pusher
    }

    fn position(&self, id: u64) -> Option<usize> {
        if self.index.is_empty() {
            return self.conns.iter().position(|c| c.id == id);
        }
        let conns = &self.conns;
        self.index
            .find(hash_id(id), |&p| conns[p as usize].id == id)
            .map(|&p| p as usize)
    }

    /// Add a connection; `false` if it was already here.
    pub(super) fn insert(&mut self, conn: &Rc<WsConn>) -> bool {
        if self.position(conn.id).is_some() {
            return false;
        }
        self.conns.push(conn.clone());
        let Subscribers { conns, index, .. } = self;
        if !index.is_empty() {
            // In use (it stays down to LINEAR / 2): every member must be in it.
            // Positions are bounded by the worker's subscriptions, far below u32::MAX.
            let p = (conns.len() - 1) as u32;
            index.insert_unique(hash_id(conn.id), p, |&q| hash_id(conns[q as usize].id));
        } else if conns.len() > LINEAR {
            // Crossing the threshold: index everyone.
            index.reserve(conns.len(), |&p| hash_id(conns[p as usize].id));
            for (p, c) in conns.iter().enumerate() {
                index.insert_unique(hash_id(c.id), p as u32, |&q| hash_id(conns[q as usize].id));
            }
        }
        if conn.dialect() == Dialect::Pusher {
            self.pusher += 1;
        }
        true
    }

    /// Remove a connection; `false` if it was not here.
    pub(super) fn remove(&mut self, conn_id: u64) -> bool {
        let Some(pos) = self.position(conn_id) else {
            return false;
        };
        let Subscribers { conns, index, .. } = self;
        if !index.is_empty() {
            if let Ok(entry) = index.find_entry(hash_id(conn_id), |&p| p as usize == pos) {
                entry.remove();
            }
        }
        let last = conns.len() - 1;
        let gone = conns.swap_remove(pos);
        if pos != last && !index.is_empty() {
            // The last connection moved into `pos`: its index entry follows it.
            let moved = conns[pos].id;
            if let Some(p) = index.find_mut(hash_id(moved), |&p| p as usize == last) {
                *p = pos as u32;
            }
        }
        if conns.len() <= LINEAR / 2 && !index.is_empty() {
            *index = HashTable::new();
        }
        if conns.capacity() > 64 && conns.len() < conns.capacity() / 4 {
            conns.shrink_to(conns.len() * 2);
        }
        if gone.dialect() == Dialect::Pusher {
            self.pusher -= 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: u64) -> Rc<WsConn> {
        Rc::new(WsConn::new(id, -1, 1 << 20, 0))
    }

    fn ids(s: &Subscribers) -> Vec<u64> {
        let mut v: Vec<u64> = s.values().map(|c| c.id).collect();
        v.sort_unstable();
        v
    }

    /// Every member is found at its position, and the index (when in use) has exactly
    /// one entry per member.
    fn check(s: &Subscribers) {
        for (p, c) in s.conns.iter().enumerate() {
            assert_eq!(s.position(c.id), Some(p));
        }
        if !s.index.is_empty() {
            assert_eq!(s.index.len(), s.conns.len());
        }
    }

    #[test]
    fn inserts_and_removes_across_the_index_threshold() {
        let mut s = Subscribers::default();
        let conns: Vec<_> = (1..=200).map(conn).collect();
        for c in &conns {
            assert!(s.insert(c));
            assert!(!s.insert(c), "a second insert is refused");
        }
        check(&s);
        assert_eq!(s.len(), 200);
        // Remove from the middle, the front and the back, in an order that moves
        // entries around.
        for id in (1..=200).filter(|i| i % 3 == 0).chain([1, 200, 2]) {
            assert!(s.remove(id));
            assert!(!s.remove(id));
            check(&s);
        }
        let left: Vec<u64> = (1..=200)
            .filter(|i| i % 3 != 0 && ![1, 200, 2].contains(i))
            .collect();
        assert_eq!(ids(&s), left);
        // Down below the threshold the index is dropped, and lookups still work.
        for id in left.iter().skip(5) {
            assert!(s.remove(*id));
        }
        assert!(s.index.is_empty());
        check(&s);
        assert_eq!(ids(&s), left[..5].to_vec());
        assert!(s.capacity_is_bounded());
    }

    #[test]
    fn a_join_between_the_two_thresholds_is_indexed() {
        // 17 build the index; down to 15 it stays; the 16th joiner must be in it (it
        // was not, once: unsubscribing it then found nothing).
        let mut s = Subscribers::default();
        let conns: Vec<_> = (1..=20).map(conn).collect();
        for c in &conns[..17] {
            assert!(s.insert(c));
        }
        assert!(!s.index.is_empty());
        assert!(s.remove(1) && s.remove(2));
        assert!(s.insert(&conns[17]));
        check(&s);
        assert!(!s.insert(&conns[17]), "no second entry");
        assert!(s.remove(18), "the late joiner leaves");
        assert!(!s.remove(18));
        check(&s);
        // Up and down across both thresholds a few times, checking every step.
        let more: Vec<_> = (100..140).map(conn).collect();
        for round in 0..3 {
            for c in &more {
                assert!(s.insert(c), "round {round}");
                check(&s);
            }
            for c in &more {
                assert!(s.remove(c.id), "round {round}");
                check(&s);
            }
        }
        assert_eq!(s.len(), 15);
    }

    impl Subscribers {
        fn capacity_is_bounded(&self) -> bool {
            self.conns.capacity() <= 64.max(self.conns.len() * 4)
        }
    }
}
