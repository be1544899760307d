//! Message and connection identifiers.
//!
//! An id is 20 lowercase hex characters: a 32-bit random node prefix drawn once per
//! process, a 12-bit worker index and a 36-bit per-worker counter (wrapping after 6.8e10 ids). Ids are unique per
//! process without any cross-core coordination (each worker counts on its own), and
//! unique across nodes with overwhelming probability thanks to the prefix. Generating
//! one never allocates: it formats into a fixed array.

use std::sync::OnceLock;

/// Length of every id in bytes.
pub(crate) const ID_LEN: usize = 20;

/// A formatted id, kept inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Id([u8; ID_LEN]);

impl Id {
    pub(crate) fn as_str(&self) -> &str {
        // Only hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl std::fmt::Debug for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn node_prefix() -> u32 {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    *PREFIX.get_or_init(rand::random::<u32>)
}

/// A per-worker id source. Not `Sync` on purpose: each worker owns one.
#[derive(Debug)]
pub(crate) struct IdGen {
    high: u64,
    counter: std::cell::Cell<u64>,
}

impl IdGen {
    pub(crate) fn new(worker: usize) -> IdGen {
        IdGen {
            high: ((node_prefix() as u64) << 12) | (worker as u64 & 0xfff),
            counter: std::cell::Cell::new(0),
        }
    }

    pub(crate) fn next_id(&self) -> Id {
        let n = self.counter.get().wrapping_add(1) & ((1u64 << 36) - 1);
        self.counter.set(n);
        let mut out = [0u8; ID_LEN];
        write_hex(&mut out[..11], self.high, 11);
        write_hex(&mut out[11..], n, 9);
        Id(out)
    }
}

fn write_hex(out: &mut [u8], mut value: u64, digits: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out[i] = HEX[(value & 0xf) as usize];
        value >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_hex() {
        let a = IdGen::new(0);
        let b = IdGen::new(1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            for id in [a.next_id(), b.next_id()] {
                assert_eq!(id.as_str().len(), ID_LEN);
                assert!(id.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
                assert!(seen.insert(id));
            }
        }
    }
}
