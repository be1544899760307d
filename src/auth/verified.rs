//! One worker's cache of recently verified subscription tokens: a token presented again
//! (a reconnect, a second tab on the same worker, a repeated subscribe or refresh) costs
//! a SHA-256 and a slot compare instead of a signature check.
//!
//! Invariants:
//! - Only a token that verified is cached, under the SHA-256 of (project, channel,
//!   token): a hit is exactly that token for that channel of that project, never a
//!   look-alike (the whole digest is compared, not a short hash).
//! - A hit never outlives what made the token valid: its `exp` (plus the same
//!   [`LEEWAY_S`]), and the deadline of the rotated secret that verified it. Entries
//!   belong to one key snapshot generation; the first lookup under a newer snapshot
//!   empties the cache, so a removed key, a rotated-away secret or a revoked project
//!   stops verifying as soon as the worker sees the new snapshot.
//! - Bounded: [`SLOTS`] direct-mapped slots, a newer token replacing an older one in its
//!   slot. Nothing is allocated until the first token is cached.
//! - Refusals are never cached (a forged token changes at every try; the subscribe
//!   budget of each connection bounds them, see `client::admit`).
//! - Per worker (`!Sync`): no lock, no sharing across cores.

use std::cell::{Cell, RefCell};

use sha2::{Digest, Sha256};

use super::token::{Grant, TokenKeys, TokenRefusal, LEEWAY_S};

/// Entries per worker (a power of two).
pub(crate) const SLOTS: usize = 512;

struct Entry {
    digest: [u8; 32],
    /// Exclusive deadline of the rotated secret that verified it (`None`: no deadline).
    secret_until: Option<u64>,
    grant: Grant,
}

impl Entry {
    fn valid_at(&self, now: u64) -> bool {
        self.grant.exp.saturating_add(LEEWAY_S) >= now
            && self.secret_until.is_none_or(|until| now < until)
    }
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct VerifiedTokens {
    slots: RefCell<Vec<Option<Entry>>>,
    /// The key snapshot generation every entry was verified under.
    generation: Cell<u64>,
    #[cfg(test)]
    checks: Cell<u64>,
}

impl VerifiedTokens {
    /// Verify `token` for `channel` of `project` under `keys` (from the snapshot of
    /// `generation`), at `now` (unix seconds): from the cache when this exact token
    /// verified for this channel under this snapshot and is still valid, otherwise by
    /// [`TokenKeys::verify_until`] (and cached when it verifies).
    pub(crate) fn verify(
        &self,
        keys: &TokenKeys,
        generation: u64,
        project: u32,
        token: &str,
        channel: &str,
        now: u64,
    ) -> Result<Grant, TokenRefusal> {
        if self.generation.replace(generation) != generation {
            // Another snapshot: what verified under the old one may not any more.
            *self.slots.borrow_mut() = Vec::new();
        }
        let digest = digest(project, channel, token);
        let slot = usize::from(u16::from_le_bytes([digest[0], digest[1]])) % SLOTS;
        if let Some(Some(entry)) = self.slots.borrow().get(slot) {
            if entry.digest == digest && entry.valid_at(now) {
                return Ok(entry.grant.clone());
            }
        }
        #[cfg(test)]
        self.checks.set(self.checks.get() + 1);
        let (grant, secret_until) = keys.verify_until(token, channel, now)?;
        let mut slots = self.slots.borrow_mut();
        if slots.is_empty() {
            slots.resize_with(SLOTS, || None);
        }
        slots[slot] = Some(Entry {
            digest,
            secret_until,
            grant: grant.clone(),
        });
        Ok(grant)
    }

    /// Signature checks made so far (tests).
    #[cfg(test)]
    fn checks(&self) -> u64 {
        self.checks.get()
    }
}

/// SHA-256 of the project index, the channel (length-prefixed) and the token.
fn digest(project: u32, channel: &str, token: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(project.to_le_bytes());
    h.update((channel.len() as u64).to_le_bytes());
    h.update(channel.as_bytes());
    h.update(token.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::auth::token::test_tokens::{hs, now};

    #[test]
    fn a_replayed_token_is_checked_once_per_snapshot_and_channel() {
        let mut keys = TokenKeys::default();
        keys.add_secret(b"ts_a", None);
        keys.finish();
        let cache = VerifiedTokens::default();
        let n = now();
        let t = hs(
            "ts_a",
            json!({"channels": ["private-a", "private-b"], "exp": n + 60, "sub": "u"}),
        );
        for _ in 0..3 {
            let g = cache.verify(&keys, 1, 7, &t, "private-a", n).unwrap();
            assert_eq!(g.sub.as_deref(), Some("u"));
        }
        assert_eq!(cache.checks(), 1);
        // Another channel or project is another entry.
        cache.verify(&keys, 1, 7, &t, "private-b", n).unwrap();
        cache.verify(&keys, 1, 8, &t, "private-a", n).unwrap();
        assert_eq!(cache.checks(), 3);
        // A new snapshot without the secret: refused, though it was cached.
        let empty = TokenKeys::default();
        assert_eq!(
            cache.verify(&empty, 2, 7, &t, "private-a", n),
            Err(TokenRefusal::NoSecret)
        );
        // Refusals are not cached; forged tokens are checked every time.
        let forged = hs("ts_b", json!({"channel": "private-a", "exp": n + 60}));
        for _ in 0..2 {
            assert_eq!(
                cache.verify(&keys, 3, 7, &forged, "private-a", n),
                Err(TokenRefusal::Signature)
            );
        }
        assert_eq!(cache.checks(), 6);
    }

    #[test]
    fn a_hit_ends_with_the_token_and_with_its_rotated_secret() {
        let n = now();
        let mut keys = TokenKeys::default();
        keys.add_secret(b"ts_old", Some(n + 100));
        keys.add_secret(b"ts_new", None);
        keys.finish();
        let cache = VerifiedTokens::default();
        let old = hs("ts_old", json!({"channel": "private-a", "exp": n + 1000}));
        assert!(cache.verify(&keys, 1, 1, &old, "private-a", n).is_ok());
        assert!(cache.verify(&keys, 1, 1, &old, "private-a", n + 99).is_ok());
        assert_eq!(cache.checks(), 1);
        // The old secret's grace is over: the same snapshot no longer accepts it.
        assert_eq!(
            cache.verify(&keys, 1, 1, &old, "private-a", n + 100),
            Err(TokenRefusal::Signature)
        );
        let short = hs("ts_new", json!({"channel": "private-a", "exp": n + 10}));
        assert!(cache.verify(&keys, 1, 1, &short, "private-a", n).is_ok());
        assert!(cache
            .verify(&keys, 1, 1, &short, "private-a", n + 10 + LEEWAY_S)
            .is_ok());
        assert_eq!(
            cache.verify(&keys, 1, 1, &short, "private-a", n + 11 + LEEWAY_S),
            Err(TokenRefusal::Expired)
        );
    }
}
