//! Measurement: latency histograms and their summary, the harness's own CPU time
//! (getrusage), the server's CPU, RSS and fd count from /proc, and a least-squares
//! slope for soak samples.
//!
//! Invariants: nothing here touches a socket; /proc read failures become `None`,
//! never a panic (a server may exit mid-run).

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// Latencies are recorded in nanoseconds, up to one minute, at 3 significant digits:
/// sub-microsecond resolution for loopback, and nothing we could see is out of range.
pub const HIST_MAX_NS: u64 = 60_000_000_000;

/// A new latency histogram (ns).
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts; failure would be a bug here.
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// Record a latency, clamping into the histogram's range so a clock step or a
/// pathological delay is counted rather than dropped.
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, HIST_MAX_NS));
}

/// Wall-clock now in Unix nanoseconds: the timestamp publishers embed in `data`.
/// Publisher and subscribers share this machine's clock, so the difference is the
/// publish-to-delivery latency.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Summarise a nanosecond histogram.
pub fn summarize(h: &Histogram<u64>) -> LatencySummary {
    let us = |ns: u64| ns as f64 / 1000.0;
    if h.is_empty() {
        return LatencySummary {
            count: 0,
            mean_us: 0.0,
            p50_us: 0.0,
            p90_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
        };
    }
    LatencySummary {
        count: h.len(),
        mean_us: h.mean() / 1000.0,
        p50_us: us(h.value_at_quantile(0.50)),
        p90_us: us(h.value_at_quantile(0.90)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    }
}

impl LatencySummary {
    /// The JSON object of this summary (µs, rounded to 0.1 µs).
    pub fn to_json(self) -> Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "count": self.count, "mean_us": r(self.mean_us), "p50_us": r(self.p50_us),
            "p90_us": r(self.p90_us), "p99_us": r(self.p99_us), "p999_us": r(self.p999_us),
            "max_us": r(self.max_us),
        })
    }
}

/// CPU seconds (user + system) of this process so far.
pub fn self_cpu_s() -> f64 {
    rusage_cpu_s(libc::RUSAGE_SELF)
}

/// CPU seconds (user + system) of the calling thread so far.
pub fn thread_cpu_s() -> f64 {
    rusage_cpu_s(libc::RUSAGE_THREAD)
}

fn rusage_cpu_s(who: libc::c_int) -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One reading of a server process from /proc.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcSample {
    /// utime + stime, seconds (all threads of the process).
    pub cpu_s: f64,
    /// VmRSS, bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub fds: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime in clock ticks from the text of /proc/PID/stat. The command name
/// may hold spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After ')': field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS in bytes from the text of /proc/PID/status.
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Read one process; `None` if it is gone.
pub fn sample_pid(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Some(ProcSample {
        cpu_s: parse_stat_ticks(&stat)? as f64 / clock_ticks(),
        rss_bytes: parse_status_rss(&status)?,
        fds,
    })
}

/// The sum over all given server processes (e.g. nginx master + workers). Processes
/// that cannot be read count as zero and are reported by `missing`.
pub fn sample_pids(pids: &[u32]) -> (ProcSample, usize) {
    let mut sum = ProcSample::default();
    let mut missing = 0;
    for &pid in pids {
        match sample_pid(pid) {
            Some(s) => {
                sum.cpu_s += s.cpu_s;
                sum.rss_bytes += s.rss_bytes;
                sum.fds += s.fds;
            }
            None => missing += 1,
        }
    }
    (sum, missing)
}

/// Least-squares slope of `(x, y)` points; `None` with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_distribution() {
        let mut h = new_histogram();
        for i in 1..=1000u64 {
            record(&mut h, i * 1000); // 1..1000 µs
        }
        let s = summarize(&h);
        assert_eq!(s.count, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p90_us - 900.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_us - 1000.0).abs() < 1.0, "{s:?}");
        assert!((s.mean_us - 500.5).abs() < 1.0, "{s:?}");
        let j = s.to_json();
        assert_eq!(j["count"], 1000);
    }

    #[test]
    fn summary_of_empty_and_clamped() {
        let mut h = new_histogram();
        assert_eq!(summarize(&h).count, 0);
        record(&mut h, 0);
        record(&mut h, u64::MAX);
        let s = summarize(&h);
        assert_eq!(s.count, 2);
        assert!(s.max_us >= 59_000_000.0);
    }

    #[test]
    fn parses_proc_stat_with_odd_comm() {
        let stat =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 99 1000 200";
        assert_eq!(parse_stat_ticks(stat), Some(300));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn parses_vmrss() {
        let status = "Name:\tringcast\nVmPeak:\t 100 kB\nVmRSS:\t    2048 kB\nThreads:\t3\n";
        assert_eq!(parse_status_rss(status), Some(2048 * 1024));
        assert_eq!(parse_status_rss("Name: x\n"), None);
    }

    #[test]
    fn slope_of_line() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 2.0)).collect();
        assert!((slope(&pts).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 1.0)]), None);
    }

    #[test]
    fn own_process_is_readable() {
        let s = sample_pid(std::process::id()).unwrap();
        assert!(s.rss_bytes > 0 && s.fds > 0);
        assert!(self_cpu_s() >= 0.0);
    }
}
