//! `max_upgrades_per_second`: WebSocket upgrades this node completes per second, all
//! workers together.
//!
//! The bucket is the crate's GCRA ([`crate::quota::Quota`]: one CAS loop on one
//! `AtomicU64`, no lock), burst one second's worth. A refused upgrade is told when to
//! come back: `retry_after` seconds, 1 to [`MAX_RETRY_AFTER_S`], drawn at random over a
//! window that widens with the pressure (the refusals of the current second divided by
//! the rate: the seconds this node needs to admit everyone refused so far). A small
//! overshoot is asked back within a second or two; a storm is spread over up to ten
//! seconds instead of returning all at once. Off (0) the server builds no bucket.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use crate::quota::rate_limit::Per;
use crate::quota::{now_ns, Quota, RateLimit};

/// The longest wait a refusal asks for (the contract's bound).
pub(crate) const MAX_RETRY_AFTER_S: u64 = 10;

pub(crate) struct UpgradeBucket {
    quota: Quota,
    per_second: u64,
    /// Refusals in the current second: `second << 32 | count`.
    refused: AtomicU64,
}

impl UpgradeBucket {
    /// `None` when `per_second` is 0 (off).
    pub(crate) fn new(per_second: u32) -> Option<UpgradeBucket> {
        (per_second > 0).then(|| UpgradeBucket {
            quota: Quota::new(RateLimit {
                count: per_second,
                per: Per::Second,
            }),
            per_second: u64::from(per_second),
            refused: AtomicU64::new(0),
        })
    }

    /// Take one upgrade: `Ok(())`, or `Err(retry_after_s)` when over the rate.
    pub(crate) fn admit(&self) -> Result<(), u64> {
        self.admit_at(now_ns())
    }

    fn admit_at(&self, now: u64) -> Result<(), u64> {
        if self.quota.check(now).allowed {
            return Ok(());
        }
        let pressure = self.count_refusal(now);
        let window = (1 + pressure / self.per_second).min(MAX_RETRY_AFTER_S);
        Err(rand::rng().random_range(1..=window))
    }

    /// Count one refusal in the current second; returns the refusals so far in it.
    fn count_refusal(&self, now: u64) -> u64 {
        let second = now / 1_000_000_000;
        let mut seen = self.refused.load(Ordering::Relaxed);
        loop {
            let count = if seen >> 32 == second & 0xffff_ffff {
                (seen & 0xffff_ffff) + 1
            } else {
                1
            };
            let next = (second & 0xffff_ffff) << 32 | count.min(0xffff_ffff);
            match self.refused.compare_exchange_weak(
                seen,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return count,
                Err(actual) => seen = actual,
            }
        }
    }
}

/// The close reason of a refused upgrade.
pub(crate) fn reason(retry_after_s: u64) -> String {
    format!("retry_after={retry_after_s}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn off_is_no_bucket() {
        assert!(UpgradeBucket::new(0).is_none());
    }

    #[test]
    fn a_burst_of_one_second_then_refusals_with_bounded_waits() {
        let b = UpgradeBucket::new(5).unwrap();
        let t = 10 * SECOND;
        for _ in 0..5 {
            assert_eq!(b.admit_at(t), Ok(()));
        }
        for _ in 0..1000 {
            let wait = b.admit_at(t).unwrap_err();
            assert!((1..=MAX_RETRY_AFTER_S).contains(&wait), "{wait}");
        }
        // Refilled at the rate: one more a fifth of a second later.
        assert_eq!(b.admit_at(t + SECOND / 5), Ok(()));
    }

    #[test]
    fn waits_widen_with_the_pressure_and_are_jittered() {
        let b = UpgradeBucket::new(10).unwrap();
        let t = 10 * SECOND;
        for _ in 0..10 {
            b.admit_at(t).unwrap();
        }
        // The first refusals of a second: asked back within a second.
        assert_eq!(b.admit_at(t), Err(1));
        // A storm (hundreds refused in the second): spread over up to ten seconds.
        let waits: Vec<u64> = (0..500).map(|_| b.admit_at(t).unwrap_err()).collect();
        let late = &waits[200..];
        assert!(late.iter().any(|&w| w >= 8), "{late:?}");
        assert!(late.iter().any(|&w| w <= 3), "{late:?}");
        // A new second starts counting again.
        let t2 = t + SECOND;
        for _ in 0..10 {
            b.admit_at(t2).unwrap();
        }
        assert_eq!(b.admit_at(t2), Err(1));
    }

    #[test]
    fn reason_text() {
        assert_eq!(reason(3), "retry_after=3");
    }
}
