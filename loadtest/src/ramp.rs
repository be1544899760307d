//! `ramp` mode: the fan-out rate raised step by step until p99 publish-to-delivery
//! latency passes a limit (default 250 ms) or anything is lost, then bisected; the
//! answer is the highest rate whose step passed, with its sustained deliveries/s
//! (issue 4's "fanout, rate raised until p99 > 250 ms or anything is lost").
//!
//! Each step is a complete `fanout` run (fresh subscribers, a fresh channel tag, so a
//! late message of one step can never count in another). The search doubles the rate
//! from `--start-rate` until a step fails, halves it if the first step fails, then
//! bisects between the best pass and the lowest failure until they are within
//! `--tolerance` of each other.
//!
//! Invariants: at most `--max-steps` steps, each bounded in time by fanout's own
//! deadlines; rates stay within [`--min-rate`, `--max-rate`].

use serde_json::{json, Value};

/// Where the search is: the highest passing and the lowest failing rate seen.
#[derive(Debug, Clone)]
pub struct Search {
    pub start: f64,
    pub min_rate: f64,
    pub max_rate: f64,
    /// Stop bisecting when hi / lo <= 1 + tolerance.
    pub tolerance: f64,
    pub max_steps: usize,
    pub lo: Option<f64>,
    pub hi: Option<f64>,
    pub steps: usize,
}

/// Round to 3 significant digits, so step rates read well ("12.5", "1250").
pub fn round_rate(r: f64) -> f64 {
    if r <= 0.0 || !r.is_finite() {
        return 0.0;
    }
    let mag = 10f64.powi(r.log10().floor() as i32 - 2);
    (r / mag).round() * mag
}

impl Search {
    pub fn new(start: f64, min_rate: f64, max_rate: f64, tolerance: f64, max_steps: usize) -> Self {
        let min_rate = min_rate.max(0.01);
        let max_rate = max_rate.max(min_rate);
        Search {
            start: start.clamp(min_rate, max_rate),
            min_rate,
            max_rate,
            tolerance: tolerance.max(0.01),
            max_steps,
            lo: None,
            hi: None,
            steps: 0,
        }
    }

    /// The rate of the next step, or None when the search is over.
    pub fn next(&self) -> Option<f64> {
        if self.steps >= self.max_steps {
            return None;
        }
        let r = match (self.lo, self.hi) {
            (None, None) => self.start,
            // Still climbing: double, but stop once the cap itself has passed.
            (Some(lo), None) => {
                if lo >= self.max_rate {
                    return None;
                }
                (lo * 2.0).min(self.max_rate)
            }
            // Nothing passed yet: halve, down to the floor.
            (None, Some(hi)) => {
                if hi <= self.min_rate {
                    return None;
                }
                (hi / 2.0).max(self.min_rate)
            }
            (Some(lo), Some(hi)) => {
                if hi <= lo * (1.0 + self.tolerance) {
                    return None;
                }
                (lo + hi) / 2.0
            }
        };
        let r = round_rate(r);
        // Rounding can land on a rate already decided; then the search is over.
        if self.lo.is_some_and(|lo| r <= lo) || self.hi.is_some_and(|hi| r >= hi) {
            return None;
        }
        Some(r)
    }

    /// Record one step's outcome.
    pub fn record(&mut self, rate: f64, pass: bool) {
        self.steps += 1;
        if pass {
            self.lo = Some(self.lo.map_or(rate, |l| l.max(rate)));
        } else {
            self.hi = Some(self.hi.map_or(rate, |h| h.min(rate)));
        }
    }
}

/// Whether one fanout step passed, and if not, why: every expected delivery arrived
/// exactly once, p99 ≤ `p99_limit_ms`, every publish was accepted, and the publishers
/// held at least 90% of the asked rate (so a slow generator cannot pass a step).
pub fn judge(v: &Value, rate: f64, duration: f64, p99_limit_ms: f64) -> (bool, String) {
    let ratio = v["delivery_ratio"].as_f64().unwrap_or(0.0);
    let dups = v["duplicates"].as_u64().unwrap_or(0);
    let p99_ms = v["latency"]["p99_us"].as_f64().unwrap_or(f64::INFINITY) / 1e3;
    let accepted = v["publish"]["accepted_2xx"].as_u64().unwrap_or(0);
    let sent = v["publish"]["sent"].as_u64().unwrap_or(0);
    let want = (rate * duration * 0.9).floor() as u64;
    let mut why = Vec::new();
    if v["expected"].as_u64().unwrap_or(0) == 0 {
        why.push("nothing expected".to_string());
    }
    if ratio != 1.0 {
        why.push(format!("delivery ratio {ratio}"));
    }
    if dups > 0 {
        why.push(format!("{dups} duplicates"));
    }
    if p99_ms > p99_limit_ms {
        why.push(format!("p99 {p99_ms:.1} ms > {p99_limit_ms} ms"));
    }
    if accepted < sent {
        why.push(format!("{} of {sent} publishes refused", sent - accepted));
    }
    if accepted < want.max(1) {
        why.push(format!(
            "only {accepted} publishes accepted (want >= {want})"
        ));
    }
    (why.is_empty(), why.join("; "))
}

/// The compact record of one step kept in the ramp's JSON line.
pub fn step_json(v: &Value, rate: f64, duration: f64, pass: bool, why: &str) -> Value {
    let received = v["received"].as_u64().unwrap_or(0);
    json!({
        "rate": rate,
        "pass": pass,
        "why": why,
        "subscribers_ready": v["subscribers_ready"],
        "accepted": v["publish"]["accepted_2xx"],
        "expected": v["expected"],
        "received": received,
        "duplicates": v["duplicates"],
        "delivery_ratio": v["delivery_ratio"],
        "sustained_deliveries_per_s": (received as f64 / duration.max(1e-9)).round(),
        "deliveries_per_s": v["deliveries_per_s"],
        "p50_ms": v["latency"]["p50_us"].as_f64().map(|x| (x / 10.0).round() / 100.0),
        "p99_ms": v["latency"]["p99_us"].as_f64().map(|x| (x / 10.0).round() / 100.0),
        "max_ms": v["latency"]["max_us"].as_f64().map(|x| (x / 10.0).round() / 100.0),
        "server_cpu_pct": v["cpu"]["server_cpu_pct"],
        "server_cpu_us_per_delivery": v["cpu"]["server_cpu_us_per_delivery"],
        "harness_cpu_pct": v["cpu"]["harness_cpu_pct"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive the search against a server that passes every rate <= `limit`.
    fn drive(mut s: Search, limit: f64) -> (Search, Vec<f64>) {
        let mut tried = Vec::new();
        for _ in 0..100 {
            let Some(r) = s.next() else { break };
            tried.push(r);
            s.record(r, r <= limit);
        }
        (s, tried)
    }

    #[test]
    fn doubles_then_bisects_to_within_tolerance() {
        let (s, tried) = drive(Search::new(1.0, 0.1, 1e6, 0.1, 20), 37.0);
        assert_eq!(&tried[..7], &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        let (lo, hi) = (s.lo.unwrap(), s.hi.unwrap());
        assert!(lo <= 37.0 && hi > 37.0, "{lo} {hi}");
        assert!(
            hi <= lo * 1.1 + 1e-9 || s.steps == 20,
            "{lo} {hi} {tried:?}"
        );
    }

    #[test]
    fn halves_when_the_first_step_fails() {
        let (s, tried) = drive(Search::new(100.0, 1.0, 1e6, 0.1, 20), 20.0);
        assert_eq!(&tried[..4], &[100.0, 50.0, 25.0, 12.5]);
        assert!(s.lo.unwrap() <= 20.0 && s.lo.unwrap() > 18.0, "{:?}", s.lo);
    }

    #[test]
    fn bounded_by_steps_cap_and_floor() {
        let (s, tried) = drive(Search::new(1.0, 0.1, 1e6, 0.001, 5), 1e9);
        assert_eq!(tried.len(), 5);
        assert_eq!(s.steps, 5);
        // Cap: stops once the cap passed.
        let (s, tried) = drive(Search::new(1.0, 0.1, 8.0, 0.1, 50), 1e9);
        assert_eq!(tried, vec![1.0, 2.0, 4.0, 8.0]);
        assert_eq!(s.lo, Some(8.0));
        // Floor: nothing passes, stops at the floor.
        let (s, tried) = drive(Search::new(8.0, 1.0, 100.0, 0.1, 50), 0.0);
        assert_eq!(tried, vec![8.0, 4.0, 2.0, 1.0]);
        assert_eq!(s.lo, None);
    }

    #[test]
    fn rates_round_to_three_digits() {
        assert_eq!(round_rate(12.3456), 12.3);
        assert_eq!(round_rate(1234.5), 1230.0);
        assert_eq!(round_rate(0.0), 0.0);
        assert_eq!(round_rate(f64::NAN), 0.0);
    }

    fn fanout(ratio: f64, p99_us: f64, sent: u64, accepted: u64) -> Value {
        json!({"delivery_ratio": ratio, "duplicates": 0, "expected": 100, "received": 100,
               "latency": {"p99_us": p99_us, "p50_us": 1000.0, "max_us": p99_us},
               "publish": {"sent": sent, "accepted_2xx": accepted}, "cpu": {}})
    }

    #[test]
    fn judge_checks_loss_latency_and_refusals() {
        assert!(judge(&fanout(1.0, 200_000.0, 50, 50), 10.0, 5.0, 250.0).0);
        let (ok, why) = judge(&fanout(1.0, 300_000.0, 50, 50), 10.0, 5.0, 250.0);
        assert!(!ok && why.contains("p99"), "{why}");
        let (ok, why) = judge(&fanout(0.99, 1000.0, 50, 50), 10.0, 5.0, 250.0);
        assert!(!ok && why.contains("ratio"), "{why}");
        let (ok, why) = judge(&fanout(1.0, 1000.0, 50, 40), 10.0, 5.0, 250.0);
        assert!(!ok && why.contains("refused"), "{why}");
        // The generator fell behind: 20 of 50 asked.
        let (ok, why) = judge(&fanout(1.0, 1000.0, 20, 20), 10.0, 5.0, 250.0);
        assert!(!ok && why.contains("want"), "{why}");
        let s = step_json(&fanout(1.0, 1000.0, 50, 50), 10.0, 5.0, true, "");
        assert_eq!(s["sustained_deliveries_per_s"], 20.0);
        assert_eq!(s["p99_ms"], 1.0);
    }
}
