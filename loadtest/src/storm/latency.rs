//! Publish→delivery latency of the storm fleet: the publisher stamps each message's
//! `data` with its send time (`"t"`, unix ns of this machine's clock, `stats::unix_ns`),
//! and a client records receive time − stamp for every live delivery (never for a
//! replay after a resubscribe: its age is the outage, not the path).
//!
//! Invariants:
//! - One HDR histogram per generator process (1 ns..60 s, 3 significant digits, the
//!   same bounds as every other loadtest histogram), so the histograms of all processes
//!   have the same buckets and merge exactly by adding counts per bucket value.
//! - The JSON form carries the summary and every non-empty bucket as `[value_ns,
//!   count]` (`value_ns` the bucket's highest equivalent value, as HDR reports
//!   percentiles), which is what `storm.sh` merges into the fleet's percentiles.

use crate::stats;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

pub struct Latency {
    h: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            h: stats::new_histogram(),
        }
    }
}

impl std::fmt::Debug for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Latency({} recorded)", self.h.len())
    }
}

impl Latency {
    /// A live delivery stamped `sent_ns`, received now.
    pub fn record_since(&mut self, sent_ns: u64) {
        self.record_ns(stats::unix_ns().saturating_sub(sent_ns));
    }

    fn record_ns(&mut self, ns: u64) {
        stats::record(&mut self.h, ns);
    }

    /// The summary (µs) plus `buckets`: `[[value_ns, count], ...]`, ascending.
    pub fn to_json(&self) -> Value {
        let mut v = stats::summarize(&self.h).to_json();
        let buckets: Vec<[u64; 2]> = self
            .h
            .iter_recorded()
            .map(|x| [x.value_iterated_to(), x.count_at_value()])
            .collect();
        if let Some(o) = v.as_object_mut() {
            o.insert("buckets".into(), json!(buckets));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_every_recording_and_merge_by_value() {
        let mut a = Latency::default();
        let mut b = Latency::default();
        for ns in [1_000, 1_000, 2_000_000, 50_000_000] {
            a.record_ns(ns);
        }
        b.record_ns(2_000_000);
        let (ja, jb) = (a.to_json(), b.to_json());
        assert_eq!(ja["count"], 4);
        let buckets = |j: &Value| -> Vec<(u64, u64)> {
            j["buckets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
                .collect()
        };
        let ba = buckets(&ja);
        assert_eq!(ba.iter().map(|x| x.1).sum::<u64>(), 4);
        assert_eq!(ba.len(), 3);
        // The same latency lands on the same bucket value in another process's histogram.
        let bb = buckets(&jb);
        assert_eq!(bb.len(), 1);
        assert!(ba.iter().any(|x| x.0 == bb[0].0));
        // A stamp from the future (clock step) is counted, not dropped.
        a.record_since(u64::MAX);
        assert_eq!(a.to_json()["count"], 5);
    }
}
