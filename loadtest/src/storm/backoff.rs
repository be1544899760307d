//! The JavaScript client's reconnect timing (`clients/js/ringcast.js`: `backoffDelay`,
//! `closeDelay`, and the defaults of its constructor), ported so the native storm
//! fleet comes back the way a browser fleet would.
//!
//! Invariants:
//! - Same arithmetic and the same defaults as the JS client (min 500 ms, max 20 s,
//!   shutdown spread 3 s, 1013 `retry_after` bounded to 1..60 s plus up to 1 s of
//!   jitter); a change there must be made here too (the unit tests pin the JS tests'
//!   own figures).
//! - Randomness comes from the caller (`Rng`), so tests are exact.

/// `minReconnectDelayMs` default of the JS client.
pub const MIN_RECONNECT_MS: u64 = 500;
/// `maxReconnectDelayMs` default of the JS client.
pub const MAX_RECONNECT_MS: u64 = 20_000;
/// `shutdownReconnectSpreadMs` default: the first reconnect after 1001 is spread over it.
pub const SHUTDOWN_SPREAD_MS: u64 = 3_000;
/// A connection that lasted this long resets the attempt counter (`_stableMs`).
pub const STABLE_MS: u64 = if MAX_RECONNECT_MS > 5_000 {
    MAX_RECONNECT_MS
} else {
    5_000
};

/// xorshift64*: cheap, seedable, good enough for jitter.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Delay before reconnect attempt `attempt` (0 for the first after a loss): exponential
/// backoff with full jitter, uniform in [min, min(max, min * 2^(attempt+1))].
pub fn backoff_delay(attempt: u32, min_ms: u64, max_ms: u64, r: f64) -> u64 {
    let max = max_ms.max(min_ms);
    let cap = (min_ms as f64 * 2f64.powi(attempt.saturating_add(1).min(30) as i32)).min(max as f64);
    (min_ms as f64 + r * (cap - min_ms as f64)).round() as u64
}

/// The least wait a close asks for, if any: 1013 with `retry_after=<s>` waits s seconds
/// (bounded to 1..60) plus up to 1 s of jitter; 1001 is spread uniformly over
/// [min, spread]; every other code asks nothing (backoff alone applies).
pub fn close_delay(code: u16, reason: &str, min_ms: u64, spread_ms: u64, r: f64) -> Option<u64> {
    if code == 1013 {
        let secs = retry_after(reason)?;
        return Some((secs.clamp(1, 60) as f64 * 1000.0 + r * 1000.0).round() as u64);
    }
    if code != 1001 {
        return None;
    }
    Some((min_ms as f64 + r * spread_ms.saturating_sub(min_ms) as f64).round() as u64)
}

/// `retry_after=<1 to 4 digits>` as a word of the reason (the JS client's regex:
/// not preceded by a letter or `_`, not followed by a digit).
pub fn retry_after(reason: &str) -> Option<u64> {
    let b = reason.as_bytes();
    let pat = b"retry_after=";
    let mut from = 0;
    while let Some(p) = reason[from..].find("retry_after=").map(|p| p + from) {
        from = p + 1;
        if p > 0 && (b[p - 1].is_ascii_lowercase() || b[p - 1] == b'_') {
            continue;
        }
        let digits = b[p + pat.len()..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if (1..=4).contains(&digits) {
            let s = &reason[p + pat.len()..p + pat.len() + digits];
            return s.parse().ok();
        }
    }
    None
}

/// The wait before the next attempt: the larger of the close's own ask and the backoff
/// (the JS client's `_lost`).
pub fn next_delay(attempt: u32, close: Option<u64>, r_backoff: f64) -> u64 {
    close.unwrap_or(0).max(backoff_delay(
        attempt,
        MIN_RECONNECT_MS,
        MAX_RECONNECT_MS,
        r_backoff,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_matches_the_js_tests() {
        // clients/js/test/backoff.test.js figures.
        assert_eq!(backoff_delay(0, 500, 20_000, 0.0), 500);
        assert_eq!(backoff_delay(0, 500, 20_000, 1.0), 1000);
        assert_eq!(backoff_delay(1, 500, 20_000, 1.0), 2000);
        assert_eq!(backoff_delay(3, 500, 20_000, 1.0), 8000);
        assert_eq!(backoff_delay(10, 500, 20_000, 1.0), 20_000);
        assert_eq!(backoff_delay(100, 500, 20_000, 0.5), 10_250);
        assert_eq!(backoff_delay(2, 500, 20_000, 0.5), 2250);
        // max below min: min wins.
        assert_eq!(backoff_delay(4, 500, 100, 1.0), 500);
    }

    #[test]
    fn close_delay_matches_the_js_tests() {
        assert_eq!(
            close_delay(1013, "retry_after=3", 500, 3000, 0.0),
            Some(3000)
        );
        assert_eq!(
            close_delay(1013, "retry_after=3", 500, 3000, 0.5),
            Some(3500)
        );
        assert_eq!(
            close_delay(1013, "retry_after=0", 500, 3000, 0.0),
            Some(1000)
        );
        assert_eq!(
            close_delay(1013, "retry_after=9999", 500, 3000, 0.0),
            Some(60_000)
        );
        assert_eq!(close_delay(1013, "xretry_after=3", 500, 3000, 0.0), None);
        assert_eq!(close_delay(1013, "retry_after=12345", 500, 3000, 0.0), None);
        assert_eq!(close_delay(1013, "", 500, 3000, 0.0), None);
        assert_eq!(
            close_delay(1013, "busy; retry_after=2", 500, 3000, 0.0),
            Some(2000)
        );
        assert_eq!(close_delay(1001, "", 500, 3000, 0.0), Some(500));
        assert_eq!(close_delay(1001, "", 500, 3000, 1.0), Some(3000));
        assert_eq!(close_delay(1006, "", 500, 3000, 0.3), None);
        assert_eq!(close_delay(4009, "", 500, 3000, 0.3), None);
    }

    #[test]
    fn next_delay_takes_the_larger() {
        assert_eq!(next_delay(0, Some(3000), 1.0), 3000);
        assert_eq!(next_delay(5, Some(1000), 1.0), 20_000);
        assert_eq!(next_delay(0, None, 0.0), 500);
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = Rng::new(42);
        let xs: Vec<f64> = (0..10_000).map(|_| r.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
