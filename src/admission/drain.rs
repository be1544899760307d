//! `drain_spread_s`: at shutdown a worker closes its WebSockets with 1001 spread evenly
//! over this time instead of all at once, so that a node leaving (a deploy, a rolling
//! restart) sends its clients to the other nodes as a stream, not a wall.
//!
//! Each worker spreads its own connections over the whole time, so the node's closes
//! are spread too. Connection `i` of `n` is closed at `i × spread / n`: the first at
//! once, one connection alone at once (nothing to spread). One task per worker walks
//! the list in [`TICK`] steps: no timer per connection.
//!
//! The time is installed once per worker thread ([`install`]) before it serves, read by
//! the shard when shutdown begins; a thread that never installed it closes at once.

use std::cell::Cell;
use std::time::Duration;

/// How often the spreading task wakes to close the connections whose time came.
pub(crate) const TICK: Duration = Duration::from_millis(10);

thread_local! {
    static SPREAD: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// This worker's `drain_spread_s`.
pub(crate) fn install(spread: Duration) {
    SPREAD.with(|s| s.set(spread));
}

/// How many of `n` connections are closed by `elapsed` into a spread of `spread`.
pub(crate) fn due(n: usize, elapsed: Duration, spread: Duration) -> usize {
    if n <= 1 || spread.is_zero() || elapsed >= spread {
        return n;
    }
    // Connection i is due at i × spread / n: those with i ≤ elapsed × n / spread.
    let i = (elapsed.as_nanos() * n as u128 / spread.as_nanos()) as usize;
    (i + 1).min(n)
}

/// Close `items` (each with `close`) spread over this worker's drain time: the first
/// now, the rest from one task on this worker's runtime.
pub(crate) fn spread<T: 'static>(items: Vec<T>, close: impl Fn(&T) + 'static) {
    let spread = SPREAD.with(Cell::get);
    let n = items.len();
    let now = due(n, Duration::ZERO, spread);
    for item in &items[..now] {
        close(item);
    }
    if now == n {
        return;
    }
    monoio::spawn(async move {
        let start = std::time::Instant::now();
        let mut done = now;
        while done < n {
            monoio::time::sleep(TICK).await;
            let until = due(n, start.elapsed(), spread);
            for item in &items[done..until] {
                close(item);
            }
            done = until;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const S2: Duration = Duration::from_secs(2);

    #[test]
    fn one_or_no_spread_closes_at_once() {
        assert_eq!(due(1, Duration::ZERO, S2), 1);
        assert_eq!(due(20, Duration::ZERO, Duration::ZERO), 20);
        assert_eq!(due(0, Duration::ZERO, S2), 0);
    }

    #[test]
    fn closes_are_even_over_the_spread() {
        assert_eq!(due(20, Duration::ZERO, S2), 1);
        assert_eq!(due(20, Duration::from_millis(100), S2), 2);
        assert_eq!(due(20, Duration::from_millis(999), S2), 10);
        assert_eq!(due(20, Duration::from_millis(1900), S2), 20);
        assert_eq!(due(20, S2, S2), 20);
        // Monotonic, never past n.
        let mut last = 0;
        for ms in 0..2500 {
            let d = due(7, Duration::from_millis(ms), S2);
            assert!(d >= last && d <= 7);
            last = d;
        }
    }
}
