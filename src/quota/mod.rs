//! Per-project publish quotas: the [`RateLimit`] a user writes (`100/s`, `6000/min`) and
//! the [`Quota`] that enforces it with GCRA (the generic cell rate algorithm) on atomics.
//!
//! GCRA keeps one number per project, the *theoretical arrival time* (TAT): the instant
//! at which the project's bucket would be empty again if nothing else arrived. A request
//! at `now` is allowed when pushing the TAT one emission interval further stays within
//! one burst of `now`; a denied request leaves the TAT untouched. Burst = `count`,
//! emission interval = `period / count`, so an idle project may send `count` at once and
//! then `count` per period.
//!
//! Invariants:
//! - [`Quota::check`] never blocks, never allocates and takes no lock: a CAS loop on one
//!   `AtomicU64`, so workers on every core share a project's quota exactly (N threads
//!   racing on a fresh `1000/min` quota get exactly 1000 allowed between them).
//! - The limit is packed into a second `AtomicU64`, so a check always sees a consistent
//!   (count, period) pair, and [`Quota::set_limit`] applies from the next check on.
//! - [`Quota::peek`] reads the same state without taking a unit (rate headers of answers
//!   that consumed nothing); it never changes the TAT.
//! - Time is monotonic nanoseconds from [`now_ns`]; a clock that appears to go backwards
//!   (a caller passing an older `now`) only makes the quota stricter, never looser.

pub(crate) mod connect_rate;
pub(crate) mod lease;
pub(crate) mod rate_limit;

pub(crate) use rate_limit::{RateLimit, RateLimitError};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Monotonic nanoseconds since a process-wide epoch (the first call).
///
/// `Instant` is monotonic but opaque; quotas need a plain integer to store in an atomic.
/// u64 nanoseconds last 584 years of process uptime.
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    // `as u64` cannot truncate within 584 years of uptime.
    Instant::now().duration_since(epoch).as_nanos() as u64
}

/// The outcome of one [`Quota::check`], with everything the rate headers need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The burst size (`RateLimit-Limit`).
    pub limit: u32,
    /// Requests that would still be allowed right now, after this one (`RateLimit-Remaining`).
    pub remaining: u32,
    /// Whole seconds (rounded up) until the bucket is full again (`RateLimit-Reset`).
    pub reset_s: u64,
    /// Whole seconds (rounded up, at least 1) before a retry can succeed; 0 when allowed.
    pub retry_after_s: u64,
}

/// One project's quota, shared by every worker through an `Arc<ProjectState>`.
#[derive(Debug)]
pub struct Quota {
    /// The packed [`RateLimit`] (see [`RateLimit::pack`]).
    limit: AtomicU64,
    /// Theoretical arrival time, in [`now_ns`] nanoseconds. 0 = never used.
    tat: AtomicU64,
    /// Cluster mode: this node's share of the cluster-wide budget (see [`lease`]).
    /// Unset on a single node; set once, by the cluster's quota thread.
    lease: OnceLock<Arc<lease::Lease>>,
}

impl Quota {
    pub fn new(limit: RateLimit) -> Quota {
        Quota {
            limit: AtomicU64::new(limit.pack()),
            tat: AtomicU64::new(0),
            lease: OnceLock::new(),
        }
    }

    /// Cluster mode: spend leased tokens too (first caller wins; returns the lease in
    /// force).
    pub fn attach_lease(&self, lease: Arc<lease::Lease>) -> &Arc<lease::Lease> {
        self.lease.get_or_init(|| lease)
    }

    pub fn lease(&self) -> Option<&Arc<lease::Lease>> {
        self.lease.get()
    }

    /// Change the limit, effective from the next check. The share of the burst already
    /// used is carried over (a project that had used all of `100/min` has used all of
    /// its new `1000/s` too, and refills at the new rate), so lowering a limit cannot be
    /// escaped and moving between `/min` and `/s` never leaves a project waiting for a
    /// debt measured in the old period.
    pub fn set_limit(&self, limit: RateLimit) {
        self.set_limit_at(limit, now_ns());
    }

    /// [`Quota::set_limit`] with an explicit clock (tests, benches).
    pub fn set_limit_at(&self, limit: RateLimit, now_ns: u64) {
        let old = RateLimit::unpack(self.limit.swap(limit.pack(), Ordering::Relaxed));
        if old == limit {
            return;
        }
        let (old_burst, new_burst) = (old.burst_ns(), limit.burst_ns());
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let debt = tat.saturating_sub(now_ns);
            if debt == 0 {
                return; // a full bucket stays full
            }
            // Checks racing with this see the new limit with the old debt for a moment:
            // at most a few requests' worth, once per limit change.
            let scaled = (u128::from(debt) * u128::from(new_burst) / u128::from(old_burst.max(1)))
                .min(u128::from(new_burst)) as u64;
            match self.tat.compare_exchange_weak(
                tat,
                now_ns.saturating_add(scaled),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => tat = actual,
            }
        }
    }

    pub fn limit(&self) -> RateLimit {
        RateLimit::unpack(self.limit.load(Ordering::Relaxed))
    }

    /// A new quota with this one's limit and position (for replacing the struct that
    /// holds it without handing the project a fresh burst).
    pub fn clone_state(&self) -> Quota {
        Quota {
            limit: AtomicU64::new(self.limit.load(Ordering::Relaxed)),
            tat: AtomicU64::new(self.tat.load(Ordering::Relaxed)),
            lease: self.lease.clone(),
        }
    }

    /// Take one unit of quota at `now_ns` if the project has one.
    pub fn check(&self, now_ns: u64) -> Decision {
        self.check_n(now_ns, 1)
    }

    /// Take `units` units at once, or none: one CAS moves the TAT `units` emission
    /// intervals (a batch or a multi-channel publish reserves its whole cost in one
    /// step, so it is either affordable whole or refused whole). `units` is at least 1.
    pub fn check_n(&self, now_ns: u64, units: u32) -> Decision {
        let units = units.max(1);
        let limit = self.limit();
        let interval = limit.emission_interval_ns();
        let burst = limit.burst_ns();
        let cost = interval.saturating_mul(u64::from(units));
        // Cluster mode: no leased token, no publish (whatever this node's GCRA says).
        let lease = self.lease.get();
        if lease.is_some_and(|l| !l.try_take_n(units)) {
            return Decision {
                allowed: false,
                limit: limit.count,
                remaining: 0,
                reset_s: 1,
                retry_after_s: 1,
            };
        }

        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now_ns);
            let new_tat = start.saturating_add(cost);
            let debt = new_tat - now_ns; // no underflow: new_tat >= start >= now_ns
            if debt > burst {
                if let Some(lease) = lease {
                    lease.refund_n(units);
                }
                // Denied: the TAT stays put. Retry when `debt` has drained to `burst`.
                let wait = debt - burst;
                let pending = tat.saturating_sub(now_ns);
                return Decision {
                    allowed: false,
                    limit: limit.count,
                    remaining: 0,
                    reset_s: ceil_seconds(pending),
                    retry_after_s: ceil_seconds(wait).max(1),
                };
            }
            // Relaxed suffices: the TAT is the only shared state and the CAS itself
            // orders competing updates; nothing else is published through it.
            match self
                .tat
                .compare_exchange_weak(tat, new_tat, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Decision {
                        allowed: true,
                        limit: limit.count,
                        // At most `count` since debt >= interval.
                        remaining: ((burst - debt) / interval.max(1)) as u32,
                        reset_s: ceil_seconds(debt),
                        retry_after_s: 0,
                    };
                }
                Err(actual) => tat = actual,
            }
        }
    }

    /// Give back `units` that [`Quota::check_n`] took for a publish that was then
    /// refused (503): the TAT moves back by their cost (GCRA costs add up, so this
    /// undoes exactly that reservation whatever came after it), and leased tokens
    /// return.
    pub fn refund_n(&self, units: u32) {
        let cost = self
            .limit()
            .emission_interval_ns()
            .saturating_mul(u64::from(units.max(1)));
        // The closure always returns Some: the update cannot fail.
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(tat.saturating_sub(cost))
            });
        if let Some(lease) = self.lease.get() {
            lease.refund_n(units.max(1));
        }
    }

    /// What the project's quota looks like at `now_ns`, without taking a unit:
    /// `allowed` says whether a check now would pass, `remaining` how many would.
    pub fn peek(&self, now_ns: u64) -> Decision {
        let limit = self.limit();
        let interval = limit.emission_interval_ns();
        let burst = limit.burst_ns();
        let tat = self.tat.load(Ordering::Relaxed);
        let debt_now = tat.saturating_sub(now_ns);
        let debt_next = debt_now.saturating_add(interval);
        let allowed = debt_next <= burst;
        Decision {
            allowed,
            limit: limit.count,
            // Capped: a limit change can leave a debt the new burst does not cover.
            remaining: (burst.saturating_sub(debt_now) / interval.max(1))
                .min(u64::from(limit.count)) as u32,
            reset_s: ceil_seconds(debt_now),
            retry_after_s: if allowed {
                0
            } else {
                ceil_seconds(debt_next - burst).max(1)
            },
        }
    }
}

fn ceil_seconds(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    const SEC: u64 = NANOS_PER_SECOND;

    fn limit(s: &str) -> RateLimit {
        RateLimit::parse(s).unwrap()
    }

    #[test]
    fn burst_then_denial_then_refill() {
        let q = Quota::new(limit("10/s"));
        let t0 = 5 * SEC;
        for i in 0..10 {
            let d = q.check(t0);
            assert!(d.allowed, "request {i} of the burst");
            assert_eq!(d.limit, 10);
            assert_eq!(d.remaining, 9 - i);
            assert_eq!(d.retry_after_s, 0);
        }
        let d = q.check(t0);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_s, 1);
        assert_eq!(d.reset_s, 1);

        // One emission interval (100 ms) later, exactly one more fits.
        let t1 = t0 + SEC / 10;
        assert!(q.check(t1).allowed);
        assert!(!q.check(t1).allowed);

        // A full period later the whole burst is back.
        let t2 = t1 + SEC;
        let allowed = (0..20).filter(|_| q.check(t2).allowed).count();
        assert_eq!(allowed, 10);
    }

    #[test]
    fn peek_agrees_with_check_and_takes_nothing() {
        let q = Quota::new(limit("10/s"));
        let t0 = 5 * SEC;
        let d = q.peek(t0);
        assert!(d.allowed);
        assert_eq!(
            (d.limit, d.remaining, d.reset_s, d.retry_after_s),
            (10, 10, 0, 0)
        );
        for i in 0..10 {
            let after = q.check(t0);
            assert_eq!(q.peek(t0).remaining, after.remaining, "after check {i}");
            assert_eq!(q.peek(t0).reset_s, after.reset_s);
        }
        // Peeking at an empty bucket any number of times leaves it as it was.
        for _ in 0..100 {
            let d = q.peek(t0);
            assert!(!d.allowed);
            assert_eq!(d.remaining, 0);
            assert_eq!(d.retry_after_s, 1);
        }
        let denied = q.check(t0);
        assert_eq!(q.peek(t0).retry_after_s, denied.retry_after_s);
        assert!(q.check(t0 + SEC / 10).allowed);
        assert!(!q.check(t0 + SEC / 10).allowed);
    }

    #[test]
    fn per_minute_retry_after_counts_whole_seconds() {
        let q = Quota::new(limit("2/min"));
        let t0 = SEC;
        assert!(q.check(t0).allowed);
        assert!(q.check(t0).allowed);
        let d = q.check(t0);
        assert!(!d.allowed);
        // One token every 30 s.
        assert_eq!(d.retry_after_s, 30);
        assert_eq!(d.reset_s, 60);
        let d = q.check(t0 + 29 * SEC + 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_s, 1);
        assert!(q.check(t0 + 30 * SEC).allowed);
    }

    #[test]
    fn sustained_rate_matches_the_limit() {
        let q = Quota::new(limit("100/s"));
        // One request every millisecond for 10 s: burst of 100 + 100/s * 10 s.
        let allowed = (0..10_000u64)
            .filter(|ms| q.check(SEC + ms * 1_000_000).allowed)
            .count();
        assert!((1_099..=1_100).contains(&allowed), "allowed {allowed}");
    }

    #[test]
    fn set_limit_applies_to_the_next_check_and_keeps_the_used_share() {
        let q = Quota::new(limit("1/s"));
        assert!(q.check(SEC).allowed);
        assert!(!q.check(SEC).allowed);
        q.set_limit_at(limit("100/s"), SEC);
        assert_eq!(q.limit(), limit("100/s"));
        // The whole burst was used: still nothing now, then the new rate refills it.
        assert!(!q.check(SEC).allowed);
        let allowed = (0..200)
            .filter(|_| q.check(SEC + SEC / 100).allowed)
            .count();
        assert_eq!(allowed, 1);
        let allowed = (0..200).filter(|_| q.check(3 * SEC).allowed).count();
        assert_eq!(allowed, 100);
    }

    #[test]
    fn moving_from_per_minute_to_per_second_does_not_strand_a_debt() {
        let q = Quota::new(limit("100/min"));
        let t = 10 * SEC;
        assert_eq!((0..200).filter(|_| q.check(t).allowed).count(), 100);
        q.set_limit_at(limit("1000/s"), t);
        // 60 s of old debt became 1 s (a full new burst), not 60 s.
        assert!(q.check(t + SEC / 1000).allowed);
        assert_eq!(
            (0..2000).filter(|_| q.check(t + 2 * SEC).allowed).count(),
            1000
        );

        // And back: a half-used 1000/s is a half-used 10/min.
        let q = Quota::new(limit("1000/s"));
        assert_eq!((0..500).filter(|_| q.check(t).allowed).count(), 500);
        q.set_limit_at(limit("10/min"), t);
        assert_eq!((0..20).filter(|_| q.check(t).allowed).count(), 5);
    }

    #[test]
    fn set_limit_on_an_idle_quota_keeps_it_full() {
        let q = Quota::new(limit("5/s"));
        q.set_limit_at(limit("3/min"), SEC);
        assert_eq!((0..10).filter(|_| q.check(SEC).allowed).count(), 3);
    }

    #[test]
    fn an_older_now_is_never_looser() {
        let q = Quota::new(limit("3/s"));
        for _ in 0..3 {
            assert!(q.check(10 * SEC).allowed);
        }
        assert!(!q.check(9 * SEC).allowed);
        assert!(!q.check(0).allowed);
    }

    #[test]
    fn threads_share_a_quota_exactly() {
        let q = Arc::new(Quota::new(limit("1000/min")));
        let allowed = Arc::new(AtomicU32::new(0));
        let now = now_ns();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let q = Arc::clone(&q);
                let allowed = Arc::clone(&allowed);
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        if q.check(now).allowed {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(allowed.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn extreme_limits_do_not_overflow() {
        let q = Quota::new(limit("10000000/s"));
        let d = q.check(u64::MAX - 5);
        assert!(d.allowed);
        // Near the end of u64 time the TAT saturates; checks must still not panic.
        let q = Quota::new(limit("1/min"));
        let _ = q.check(u64::MAX);
        let _ = q.check(u64::MAX);
    }

    #[test]
    fn check_n_takes_all_units_or_none() {
        let q = Quota::new(limit("10/s"));
        let t0 = 5 * SEC;
        let d = q.check_n(t0, 7);
        assert!(d.allowed);
        assert_eq!(d.remaining, 3);
        // 4 do not fit in the 3 left: refused whole, nothing taken.
        let d = q.check_n(t0, 4);
        assert!(!d.allowed);
        assert_eq!(q.peek(t0).remaining, 3);
        assert!(q.check_n(t0, 3).allowed);
        assert!(!q.check(t0).allowed);
        // More than the burst can never pass.
        let q = Quota::new(limit("10/s"));
        assert!(!q.check_n(t0, 11).allowed);
        assert_eq!(q.peek(t0).remaining, 10);
        // Four 100 ms intervals later, exactly 4 units fit.
        let q = Quota::new(limit("10/s"));
        assert!(q.check_n(t0, 10).allowed);
        assert!(!q.check_n(t0 + 4 * SEC / 10, 5).allowed);
        assert!(q.check_n(t0 + 4 * SEC / 10, 4).allowed);
    }

    #[test]
    fn check_n_spends_leased_tokens_whole() {
        let q = Quota::new(limit("100/s"));
        let lease = q.attach_lease(Arc::new(lease::Lease::new())).clone();
        lease.set_online(true);
        lease.grant(5);
        assert!(!q.check_n(SEC, 6).allowed, "only 5 leased");
        assert_eq!(lease.balance(), 5, "a refused batch takes no token");
        assert!(q.check_n(SEC, 5).allowed);
        assert_eq!(lease.balance(), 0);
    }

    #[test]
    fn now_ns_is_monotonic() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
    }
}
