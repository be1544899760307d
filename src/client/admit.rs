//! What a subscribe or a token refresh may cost a worker: each connection's budget of
//! them ([`Budget`], `subscribe_rate_per_connection`, contract 1.3) and the worker's
//! shared means of checking tokens within it ([`Admission`]: the rate and the cache of
//! verified tokens, `auth::verified`).
//!
//! Invariants:
//! - A token bucket per connection of burst `max_subscriptions_per_connection`,
//!   refilled at `subscribe_rate_per_connection` per second, kept as one GCRA
//!   timestamp (8 bytes inline in the session; nothing allocated, whatever the client
//!   does). Over it the frame is answered `rate_limited` and has no other effect; the
//!   connection stays open.
//! - Only a subscribe or refresh that would do work is charged: the sessions take from
//!   the budget after every check that refuses for another reason (name, subscription
//!   limit, a channel already held without a token to check, a missing token), and a
//!   token's signature is checked only after the budget said yes.
//! - One [`Admission`] per worker, shared by its sessions through an `Rc`.

use std::rc::Rc;

use crate::auth::cache::KeySnapshot;
use crate::auth::token::{Grant, TokenRefusal};
use crate::auth::verified::VerifiedTokens;

/// One connection's subscribe budget: the GCRA "theoretical arrival time" of its next
/// subscribe (nanoseconds of `quota::now_ns`; 0 before the first).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Budget {
    tat_ns: u64,
}

/// A worker's subscribe admission: the per-connection limits (how many channels, how
/// many subscribes per second) and the verified tokens.
pub(crate) struct Admission {
    /// `max_subscriptions_per_connection`: the most channels a connection holds, and
    /// the burst of its budget.
    max_subscriptions: usize,
    /// Nanoseconds between two subscribes at the sustained rate.
    interval_ns: u64,
    /// Subscribes per second (for the refusal's message).
    rate: u32,
    tokens: VerifiedTokens,
}

impl Admission {
    /// `rate`: `subscribe_rate_per_connection` (at least 1; 0 is read as 1);
    /// `max_subscriptions`: `max_subscriptions_per_connection`.
    pub(crate) fn new(rate: u32, max_subscriptions: usize) -> Rc<Admission> {
        let rate = rate.max(1);
        Rc::new(Admission {
            max_subscriptions,
            interval_ns: 1_000_000_000 / u64::from(rate),
            rate,
            tokens: VerifiedTokens::default(),
        })
    }

    /// The most channels one connection may hold.
    pub(crate) fn max_subscriptions(&self) -> usize {
        self.max_subscriptions
    }

    /// Take one subscribe from `budget` at `now_ns`; `false`: over it, and the budget
    /// is unchanged.
    pub(crate) fn take(&self, budget: &mut Budget, now_ns: u64) -> bool {
        let burst = u64::try_from(self.max_subscriptions.max(1)).unwrap_or(u64::MAX);
        let tolerance = self.interval_ns.saturating_mul(burst - 1);
        let start = budget.tat_ns.max(now_ns);
        if start - now_ns > tolerance {
            return false;
        }
        budget.tat_ns = start.saturating_add(self.interval_ns);
        true
    }

    /// The sentence of a `rate_limited` answer.
    pub(crate) fn refusal(&self) -> String {
        format!(
            "more than {} subscribes and token refreshes per second on this connection (burst {}); try again later",
            self.rate, self.max_subscriptions
        )
    }

    /// Check `token` for `channel` of project `project` against the snapshot's token
    /// keys at `now` (unix seconds), through the worker's cache of verified tokens.
    pub(crate) fn verify(
        &self,
        snapshot: &KeySnapshot,
        project: u32,
        token: &str,
        channel: &str,
        now: u64,
    ) -> Result<Grant, TokenRefusal> {
        let keys = snapshot.token_keys(project).ok_or(TokenRefusal::NoSecret)?;
        self.tokens
            .verify(keys, snapshot.generation(), project, token, channel, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn the_budget_is_a_burst_then_the_rate() {
        let a = Admission::new(20, 100);
        let mut b = Budget::default();
        let t0 = 5 * S;
        let taken = (0..150).filter(|_| a.take(&mut b, t0)).count();
        assert_eq!(taken, 100, "the burst");
        // One second later: 20 more, not 21.
        let t1 = t0 + S;
        let taken = (0..50).filter(|_| a.take(&mut b, t1)).count();
        assert_eq!(taken, 20);
        // Idle long enough, the whole burst is back, and no more.
        let t2 = t1 + 3600 * S;
        let taken = (0..150).filter(|_| a.take(&mut b, t2)).count();
        assert_eq!(taken, 100);
        // A burst of 1 is the plain rate.
        let a = Admission::new(20, 1);
        let mut one = Budget::default();
        assert!(a.take(&mut one, t0));
        assert!(!a.take(&mut one, t0 + S / 40));
        assert!(a.take(&mut one, t0 + S / 20));
        assert_eq!(std::mem::size_of::<Budget>(), 8);
    }
}
