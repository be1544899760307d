//! Trend of a sampled series (soak mode): least-squares slope per minute and the
//! range of the samples taken after warm-up, so a reader can tell a leak (steady
//! growth) from noise (a flat band).
//!
//! Invariant: pure functions over `(seconds, value)` points; no I/O.

use crate::stats::slope;
use serde_json::{json, Value};

/// Summary of the points at or after `warmup_s`: count, first/last/min/max value,
/// least-squares slope per minute (None with fewer than 2 points or zero spread in
/// time), and the growth that slope would give over one hour.
pub fn summary(points: &[(f64, f64)], warmup_s: f64) -> Value {
    let kept: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0 >= warmup_s).collect();
    let per_min = slope(&kept).map(|s| s * 60.0);
    let min = kept.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let max = kept.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    if kept.is_empty() {
        return json!({"samples": 0, "slope_per_min": null});
    }
    json!({
        "samples": kept.len(),
        "from_s": (kept[0].0 * 10.0).round() / 10.0,
        "to_s": (kept[kept.len() - 1].0 * 10.0).round() / 10.0,
        "first": kept[0].1,
        "last": kept[kept.len() - 1].1,
        "min": min,
        "max": max,
        "slope_per_min": per_min.map(round3),
        "slope_per_hour": per_min.map(|s| round3(s * 60.0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_series_after_warmup_has_zero_slope() {
        // Grows during the first 300 s, flat afterwards.
        let pts: Vec<(f64, f64)> = (0..180)
            .map(|i| {
                let t = f64::from(i) * 10.0;
                (t, if t < 300.0 { t * 1000.0 } else { 300_000.0 })
            })
            .collect();
        let s = summary(&pts, 300.0);
        assert_eq!(s["samples"], 150);
        assert_eq!(s["slope_per_min"].as_f64(), Some(0.0));
        assert_eq!(s["min"].as_f64(), s["max"].as_f64());
        // Without the warm-up cut, the early growth shows as a positive slope.
        assert!(summary(&pts, 0.0)["slope_per_min"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn linear_growth_is_reported_per_minute_and_hour() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i) * 60.0, f64::from(i) * 5.0))
            .collect();
        let s = summary(&pts, 0.0);
        assert_eq!(s["slope_per_min"].as_f64(), Some(5.0));
        assert_eq!(s["slope_per_hour"].as_f64(), Some(300.0));
        assert_eq!(s["first"].as_f64(), Some(0.0));
        assert_eq!(s["last"].as_f64(), Some(45.0));
    }

    #[test]
    fn too_few_points_give_no_slope() {
        assert_eq!(summary(&[], 0.0)["samples"], 0);
        assert!(summary(&[(400.0, 1.0)], 300.0)["slope_per_min"].is_null());
        assert!(summary(&[(1.0, 1.0), (2.0, 2.0)], 300.0)["slope_per_min"].is_null());
    }
}
