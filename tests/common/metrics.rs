//! Scraping a server's metrics listener (`metrics_listen`) the way Prometheus does: one
//! `GET /metrics` on a fresh connection, the samples read from the text format. The one
//! scrape every test binary uses.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{parse_response, raw_to, Server};

/// `GET /metrics`, the connection closed after the answer.
pub const METRICS_REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";

/// The body of one scrape of the listener at `addr` (the answer must be 200).
pub fn scrape_at(addr: SocketAddr) -> String {
    let answer = raw_to(addr, METRICS_REQUEST);
    let (status, head, _) = parse_response(&answer);
    assert_eq!(status, 200, "{head}");
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_string())
}

/// Every sample of a scrape's body: series (name and labels, as written) → value. A
/// line that is neither a comment nor a sample fails the test: the format is checked.
pub fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_string(), value.parse().expect("a sample value"))
        })
        .collect()
}

/// The samples of one scrape of the listener at `addr`.
pub fn samples_at(addr: SocketAddr) -> HashMap<String, f64> {
    samples(&scrape_at(addr))
}

/// One series of a scrape (name and labels, as written); the test fails when it is not
/// there.
pub fn sample(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no series {series} in {samples:?}"))
}

/// The first scrape of the listener at `addr` of which `done` holds, within 5 s (else
/// the last one, for the caller's assertions to show). A worker counts what it sends
/// just after writing it, so a client can read a frame before the counter has moved.
pub fn samples_when(
    addr: SocketAddr,
    done: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = samples_at(addr);
        if done(&now) || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    fn metrics_addr(&self) -> SocketAddr {
        self.metrics.expect("the server prints its metrics address")
    }

    /// The body of one scrape of this server's metrics listener.
    pub fn scrape_text(&self) -> String {
        scrape_at(self.metrics_addr())
    }

    /// One scrape of this server's metrics listener: its samples.
    pub fn scrape(&self) -> HashMap<String, f64> {
        samples_at(self.metrics_addr())
    }

    /// [`samples_when`] of this server's metrics listener.
    pub fn scrape_when(
        &self,
        done: impl Fn(&HashMap<String, f64>) -> bool,
    ) -> HashMap<String, f64> {
        samples_when(self.metrics_addr(), done)
    }
}
