//! Scraping a server's metrics listener (`metrics_listen`) the way Prometheus does: one
//! `GET /metrics` on a fresh connection, the samples read from the text format.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::{raw_to, Server};

/// `GET /metrics`, the connection closed after the answer.
pub const METRICS_REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";

/// The whole answer (head and body) of one scrape of the listener at `addr`.
pub fn scrape_at(addr: SocketAddr) -> String {
    String::from_utf8_lossy(&raw_to(addr, METRICS_REQUEST)).into_owned()
}

/// Every sample of a scrape's answer: series (name and labels, as written) → value.
pub fn samples(answer: &str) -> HashMap<String, f64> {
    let body = answer.split_once("\r\n\r\n").map_or(answer, |(_, b)| b);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

impl Server {
    /// One scrape of this server's metrics listener: the whole answer.
    pub fn scrape_text(&self) -> String {
        scrape_at(self.metrics.expect("the server prints its metrics address"))
    }

    /// One scrape of this server's metrics listener: its samples.
    pub fn scrape(&self) -> HashMap<String, f64> {
        samples(&self.scrape_text())
    }

    /// The first scrape of which `done` holds, within 5 s (else the last one, for the
    /// caller's assertions to show). A worker counts its deliveries just after writing
    /// the frames, so a client can read a frame before the counter has moved.
    pub fn scrape_when(
        &self,
        done: impl Fn(&HashMap<String, f64>) -> bool,
    ) -> HashMap<String, f64> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let samples = self.scrape();
            if done(&samples) || std::time::Instant::now() >= deadline {
                return samples;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
