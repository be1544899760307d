//! [`PrehashedMap`]: a `HashMap` for keys that already are uniform hashes (a key's
//! SHA-256 in the key snapshot, an idempotency key's id), so SipHash over them would
//! only cost time.
//!
//! Flooding is not a concern for these maps: a client cannot choose the SHA-256 of what
//! it sends, nor the keyed hash an idempotency key is turned into.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map whose keys are hashed by [`PrehashedHasher`].
pub(crate) type PrehashedMap<K, V> = HashMap<K, V, BuildHasherDefault<PrehashedHasher>>;

/// Takes the bits of an already uniform key as they are.
#[derive(Default)]
pub(crate) struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]` hashes as a length prefix and then its bytes; folding every write
        // keeps this correct whatever the call pattern, and the last 8-byte chunk of
        // a digest dominates.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    /// A `u128` id: its low bits as they are, one store.
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}
