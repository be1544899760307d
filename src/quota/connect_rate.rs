//! `ws_connect_rate_per_ip`: new WebSocket connections per second per client address,
//! counted for the whole node (all workers), so that spreading connections over the
//! workers does not multiply the limit.
//!
//! A fixed one-second window per address: simple, and for a flood the difference from a
//! sliding window is at most one extra window's worth. State: 64 shards of
//! `address → (second, count)` behind a mutex each; a check takes one shard lock for a
//! few nanoseconds, and only on a WebSocket upgrade (never per message). Off (0, the
//! default) the server does not build this at all: no cost.
//!
//! Bounded: a shard that grows past [`SHARD_CAP`] addresses drops every entry of an
//! earlier second first (they can no longer refuse anything); if the current second
//! alone fills it (a flood from that many addresses), new addresses are admitted
//! without being counted rather than growing the map.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

const SHARDS: usize = 64;
/// Addresses one shard remembers at most (64 × 16,384 ≈ 1 M addresses, ~40 MB).
const SHARD_CAP: usize = 16_384;

pub(crate) struct ConnectRate {
    per_second: u32,
    /// [`SHARD_CAP`], smaller in unit tests.
    cap: usize,
    start: Instant,
    hasher: std::collections::hash_map::RandomState,
    shards: Vec<Mutex<HashMap<IpAddr, (u32, u32)>>>,
}

impl ConnectRate {
    /// `None` when `per_second` is 0 (off).
    pub(crate) fn new(per_second: u32) -> Option<ConnectRate> {
        (per_second > 0).then(|| ConnectRate {
            per_second,
            cap: SHARD_CAP,
            start: Instant::now(),
            hasher: Default::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        })
    }

    /// Count one new connection from `ip`; `false` when it is over the limit for this
    /// second (the caller answers 429 with `Retry-After: 1`).
    pub(crate) fn admit(&self, ip: IpAddr) -> bool {
        self.admit_at(ip, self.start.elapsed().as_secs() as u32)
    }

    fn admit_at(&self, ip: IpAddr, now: u32) -> bool {
        let shard = &self.shards[self.hasher.hash_one(ip) as usize % SHARDS];
        // A poisoned shard only means a panic elsewhere mid-update (the process aborts
        // on panics anyway); the counts are still usable.
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&ip) && map.len() >= self.cap {
            map.retain(|_, (second, _)| *second == now);
            if map.len() >= self.cap {
                return true;
            }
        }
        let entry = map.entry(ip).or_insert((now, 0));
        if entry.0 != now {
            *entry = (now, 0);
        }
        if entry.1 >= self.per_second {
            return false;
        }
        entry.1 += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_is_none() {
        assert!(ConnectRate::new(0).is_none());
    }

    #[test]
    fn per_address_per_second() {
        let r = ConnectRate::new(3).unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!((0..3).all(|_| r.admit_at(a, 5)));
        assert!(!r.admit_at(a, 5));
        assert!(r.admit_at(b, 5), "another address has its own count");
        assert!(r.admit_at(a, 6), "a new second starts a new count");
    }

    #[test]
    fn the_map_is_bounded() {
        let mut r = ConnectRate::new(1).unwrap();
        r.cap = 16;
        // Stale seconds are dropped; a full current second admits uncounted.
        for i in 0..(SHARDS * 16 * 4) as u32 {
            r.admit_at(IpAddr::from(i.to_be_bytes()), i / 1000);
        }
        let total: usize = r.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * 16);
    }
}
