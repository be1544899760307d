//! Cluster-wide quotas: a project's publish budget is one token bucket in Redis, and each
//! node *leases* blocks of tokens from it instead of asking Redis on every publish.
//!
//! The data plane only touches [`Lease::try_take_n`]: one CAS on an `AtomicI64` (never
//! blocks, never allocates). The quota thread of the cluster bridge tops each project's
//! balance up with [`LEASE_SCRIPT`], an atomic Lua script that refills the shared bucket
//! from Redis's own clock (`TIME`, so node clocks never matter) and grants at most the
//! block asked for.
//!
//! Bounds (stated in docs/protocol.md, where it describes quotas in cluster mode):
//! - While Redis answers, every publish accepted anywhere spent a token Redis granted, so
//!   the cluster never accepts more than the project's limit (`count` burst, then `count`
//!   per period). Tokens a node leased and did not use are lost when it stops: the
//!   error is on the strict side, at most `nodes × block` tokens per project.
//! - While a node cannot reach Redis its leases go *offline* and its local GCRA alone
//!   decides (fail open: publishing keeps working), so during an outage the cluster may
//!   accept up to `nodes × limit`.
//!
//! `block` = max(1, count / [`BLOCK_DIVISOR`]): small enough that one node cannot hoard
//! the budget, large enough that a busy project costs Redis ~10 calls per period per node.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use super::RateLimit;

/// A block is this fraction of the limit's count.
pub(crate) const BLOCK_DIVISOR: u32 = 10;

/// KEYS[1] = bucket key; ARGV = count, period in ms, tokens wanted. Returns the tokens
/// granted (0..=wanted). The bucket starts full and expires when idle for two periods.
pub(crate) const LEASE_SCRIPT: &str = r"
local count = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1])
local ts = tonumber(s[2])
if tokens == nil or ts == nil then
  tokens = count
  ts = now
end
if now > ts then
  tokens = math.min(count, tokens + (now - ts) * count / period)
  ts = now
end
local grant = math.min(want, math.floor(tokens))
if grant < 0 then grant = 0 end
tokens = tokens - grant
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('PEXPIRE', KEYS[1], period * 2 + 1000)
return grant
";

/// Tokens per lease request for `limit`.
pub(crate) fn block_size(limit: RateLimit) -> i64 {
    i64::from((limit.count / BLOCK_DIVISOR).max(1))
}

/// One project's leased balance on this node.
#[derive(Debug)]
pub struct Lease {
    balance: AtomicI64,
    /// False while Redis cannot be asked: the local GCRA alone decides.
    online: AtomicBool,
    /// The largest take refused for want of tokens since one that large succeeded:
    /// the quota thread leases at least this many, so a batch bigger than a block
    /// can be afforded.
    wanted: AtomicI64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease::new()
    }
}

impl Lease {
    pub fn new() -> Lease {
        Lease {
            balance: AtomicI64::new(0),
            online: AtomicBool::new(false),
            wanted: AtomicI64::new(0),
        }
    }

    /// Take one leased token. `true` when one was taken, or when the lease is offline.
    #[cfg(test)]
    pub fn try_take(&self) -> bool {
        self.try_take_n(1)
    }

    /// Take `n` leased tokens at once, or none. `true` when they were taken, or when
    /// the lease is offline.
    pub fn try_take_n(&self, n: u32) -> bool {
        if !self.online.load(Ordering::Relaxed) {
            return true;
        }
        let n = i64::from(n);
        let mut cur = self.balance.load(Ordering::Relaxed);
        loop {
            if cur < n {
                self.wanted.fetch_max(n, Ordering::Relaxed);
                return false;
            }
            match self.balance.compare_exchange_weak(
                cur,
                cur - n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // Served: a wish of at most this size is met.
                    let _ = self
                        .wanted
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                            (w != 0 && w <= n).then_some(0)
                        });
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Give back a token taken for a publish that was then refused anyway.
    #[cfg(test)]
    pub fn refund(&self) {
        self.refund_n(1);
    }

    /// Give back `n` tokens taken together.
    pub fn refund_n(&self, n: u32) {
        if self.online.load(Ordering::Relaxed) {
            self.balance.fetch_add(i64::from(n), Ordering::Relaxed);
        }
    }

    /// The largest take refused since one that large succeeded (0 when none): the
    /// quota thread leases at least this many.
    pub fn wanted(&self) -> i64 {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Tokens held now.
    pub fn balance(&self) -> i64 {
        self.balance.load(Ordering::Relaxed)
    }

    /// Add tokens granted by Redis.
    pub fn grant(&self, n: i64) {
        self.balance.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set_online(&self, online: bool) {
        self.online.store(online, Ordering::Relaxed);
    }

    pub fn is_online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_passes_online_spends_the_balance() {
        let l = Lease::new();
        assert!(l.try_take(), "offline: local GCRA decides");
        l.set_online(true);
        assert!(!l.try_take(), "online with nothing leased");
        l.grant(2);
        assert!(l.try_take());
        l.refund();
        assert!(l.try_take());
        assert!(l.try_take());
        assert!(!l.try_take());
        assert_eq!(l.balance(), 0);
    }

    #[test]
    fn a_refused_large_take_raises_the_target_until_served() {
        let l = Lease::new();
        l.set_online(true);
        l.grant(10);
        assert_eq!(l.wanted(), 0);
        assert!(!l.try_take_n(25));
        assert_eq!(l.wanted(), 25);
        l.grant(25);
        assert!(l.try_take_n(25));
        assert_eq!(l.wanted(), 0);
    }

    #[test]
    fn blocks_are_a_tenth_and_at_least_one() {
        assert_eq!(block_size(RateLimit::parse("10/min").unwrap()), 1);
        assert_eq!(block_size(RateLimit::parse("1000/s").unwrap()), 100);
    }
}
