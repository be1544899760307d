//! A worker's table of open WebSockets: each registered connection with what the shard
//! must know of it beyond the transport (its key, its Pusher project).
//!
//! A slab, not a map: an entry is 24 bytes, the connection carries its own index
//! ([`WsConn::slot`]), so leaving needs no hash and no lookup, and freed entries are
//! reused through a free list threaded through them. A hash map's buckets are scattered
//! over its whole table, so its unused room is resident too (it was ~67 B per connection
//! at 5,000 per worker); a vector's unused tail is never written, so it costs address
//! space, not memory.
//!
//! Invariants: an occupied entry's connection has `slot() == Some(its index)`, and no
//! other connection does; `len` counts the occupied entries.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;

use crate::auth::ProjectState;
use crate::ws::conn::WsConn;

/// A key id, interned per worker: thousands of connections of one key share one
/// string, and each holds a thin pointer to it.
#[derive(Clone)]
pub(super) struct KeyId(Rc<Box<str>>);

impl KeyId {
    pub(super) fn new(id: &str) -> KeyId {
        KeyId(Rc::new(id.into()))
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a connection still holds this id (besides the interning set).
    pub(super) fn held(&self) -> bool {
        Rc::strong_count(&self.0) > 1
    }
}

impl Borrow<str> for KeyId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq for KeyId {
    fn eq(&self, other: &KeyId) -> bool {
        *self.0 == *other.0
    }
}

impl Eq for KeyId {}

impl Hash for KeyId {
    // As `str` hashes: `Borrow<str>` lookups must find it.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

/// A registered WebSocket and what the shard must know of it beyond the transport.
pub(super) struct Member {
    pub(super) conn: Rc<WsConn>,
    /// Id of the key it was opened with: revocation closes it.
    pub(super) key_id: KeyId,
    /// A Pusher-protocol connection's project: turning its Pusher switch off closes it
    /// like a revocation. `None` for native connections.
    pub(super) pusher: Option<Arc<ProjectState>>,
}

/// One slot: a member, or the index of the next free slot (`u32::MAX`: none).
enum Entry {
    Used(Member),
    Free(u32),
}

/// No next free slot.
const NONE: u32 = u32::MAX;

/// The table (see the module doc).
pub(super) struct Members {
    entries: Vec<Entry>,
    /// Head of the free list.
    free: u32,
    len: usize,
}

impl Default for Members {
    fn default() -> Members {
        Members {
            entries: Vec::new(),
            free: NONE,
            len: 0,
        }
    }
}

impl Members {
    /// A table with room for `n` connections: address space, not memory, until they
    /// come (see `Engine::reserve`: no doubling copies during a connection storm).
    pub(super) fn with_capacity(n: usize) -> Members {
        let mut entries = Vec::new();
        // Best effort: a bound too large to reserve only means the table grows as it fills.
        let _ = entries.try_reserve_exact(n);
        Members {
            entries,
            ..Members::default()
        }
    }

    /// Take a connection in; it learns its index.
    pub(super) fn insert(&mut self, member: Member) {
        let conn = member.conn.clone();
        let index = if self.free != NONE {
            let index = self.free;
            let slot = &mut self.entries[index as usize];
            self.free = match slot {
                Entry::Free(next) => *next,
                // The free list only threads free slots.
                Entry::Used(_) => NONE,
            };
            *slot = Entry::Used(member);
            index
        } else {
            self.entries.push(Entry::Used(member));
            // Bounded by the worker's connection limit, far below u32::MAX.
            (self.entries.len() - 1) as u32
        };
        conn.set_slot(Some(index));
        self.len += 1;
    }

    /// Let a connection go (nothing when it is not in the table).
    pub(super) fn remove(&mut self, conn: &WsConn) -> Option<Member> {
        let index = conn.slot()?;
        let slot = self.entries.get_mut(index as usize)?;
        match slot {
            Entry::Used(m) if m.conn.id == conn.id => {}
            _ => return None,
        }
        let Entry::Used(member) = std::mem::replace(slot, Entry::Free(self.free)) else {
            return None;
        };
        self.free = index;
        self.len -= 1;
        conn.set_slot(None);
        Some(member)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Member> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Used(m) => Some(m),
            Entry::Free(_) => None,
        })
    }
}

#[cfg(test)]
pub(super) const ENTRY_SIZE: usize = std::mem::size_of::<Entry>();

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64) -> Member {
        Member {
            conn: Rc::new(WsConn::new(id, -1, 1 << 20, 0)),
            key_id: KeyId::new("k1"),
            pusher: None,
        }
    }

    #[test]
    fn an_entry_is_three_words() {
        assert_eq!(ENTRY_SIZE, 24);
    }

    #[test]
    fn slots_are_reused_and_each_connection_knows_its_own() {
        let mut t = Members::default();
        let ms: Vec<Member> = (1..=5).map(member).collect();
        let conns: Vec<Rc<WsConn>> = ms.iter().map(|m| m.conn.clone()).collect();
        for m in ms {
            t.insert(m);
        }
        assert_eq!(t.len(), 5);
        assert_eq!(conns[2].slot(), Some(2));
        assert!(t.remove(&conns[2]).is_some());
        assert!(
            t.remove(&conns[2]).is_none(),
            "a second remove finds nothing"
        );
        assert_eq!(conns[2].slot(), None);
        assert!(t.remove(&conns[0]).is_some());
        assert_eq!(t.len(), 3);
        // Free slots are taken last-freed first; nothing grows.
        let a = member(6);
        let b = member(7);
        let (ca, cb) = (a.conn.clone(), b.conn.clone());
        t.insert(a);
        t.insert(b);
        assert_eq!((ca.slot(), cb.slot()), (Some(0), Some(2)));
        assert_eq!(t.entries.len(), 5);
        let mut ids: Vec<u64> = t.iter().map(|m| m.conn.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![2, 4, 5, 6, 7]);
        // A connection that is not (or no longer) in the table is not confused with the
        // one now in its old slot.
        let stranger = WsConn::new(99, -1, 1 << 20, 0);
        stranger.set_slot(Some(0));
        assert!(t.remove(&stranger).is_none());
        assert_eq!(t.len(), 5);
    }
}
