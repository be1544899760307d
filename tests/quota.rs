//! Per-project quotas, black-box: the real binary, real HTTP. Bursts are sent pipelined on
//! one connection where the count must be exact (the server answers them within
//! microseconds, so no refill sneaks in), and over many separate connections where the
//! point is that they land on different workers.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const BODY: &str = r#"{"channel":"c","event":"e","data":{}}"#;

/// Send `n` pipelined publishes on one connection; the status of each, in order.
fn burst(s: &Server, key: &str, n: usize) -> Vec<u16> {
    let mut req = Vec::new();
    for i in 0..n {
        let close = if i + 1 == n {
            "Connection: close\r\n"
        } else {
            ""
        };
        req.extend_from_slice(
            format!(
                "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{close}\r\n{BODY}",
                BODY.len()
            )
            .as_bytes(),
        );
    }
    let mut conn = s.connect();
    conn.write_all(&req).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let statuses: Vec<u16> = text
        .match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect();
    assert_eq!(statuses.len(), n, "{text}");
    statuses
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[test]
fn ten_per_second_bursts_then_429_then_refills_and_others_are_unaffected() {
    let s = Server::start();
    let limited = s.project("limited", "10/s");
    let other = s.project("other", "10/s");

    let first = burst(&s, &limited.secret, 15);
    assert_eq!(&first[..10], &[202; 10], "{first:?}");
    assert_eq!(&first[10..], &[429; 5], "{first:?}");

    // The flooded project's neighbour still has its whole burst.
    let theirs = burst(&s, &other.secret, 10);
    assert_eq!(theirs, vec![202; 10]);

    // The 429 carries Retry-After and the rate headers.
    let (status, head, body) = s.raw_publish(&limited.secret, "application/json", BODY.as_bytes());
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(header(&head, "retry-after").as_deref(), Some("1"));
    assert_eq!(header(&head, "ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(header(&head, "ratelimit-remaining").as_deref(), Some("0"));

    // A second later the whole burst is back, and no more than it.
    std::thread::sleep(Duration::from_millis(1100));
    let again = burst(&s, &limited.secret, 12);
    assert_eq!(count(&again, 202), 10, "{again:?}");
    assert_eq!(&again[10..], &[429; 2], "{again:?}");
}

#[test]
fn the_quota_is_exact_across_workers() {
    let s = Arc::new(Server::start_with(Options::default().workers(2)));
    // 20/min refills one unit every 3 s: the whole run fits well inside one refill.
    let p = s.project("shared", "20/min");
    let accepted = Arc::new(AtomicU32::new(0));
    let denied = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (s, key) = (s.clone(), p.secret.clone());
            let (accepted, denied) = (accepted.clone(), denied.clone());
            std::thread::spawn(move || {
                // One connection per request: SO_REUSEPORT hashes each new connection
                // to a worker, so the 200 requests are spread over both.
                for _ in 0..25 {
                    match s.raw_publish(&key, "application/json", BODY.as_bytes()).0 {
                        202 => accepted.fetch_add(1, Ordering::Relaxed),
                        429 => denied.fetch_add(1, Ordering::Relaxed),
                        other => panic!("unexpected status {other}"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "too slow to be exact"
    );
    assert_eq!(accepted.load(Ordering::Relaxed), 20);
    assert_eq!(denied.load(Ordering::Relaxed), 180);
}

#[test]
fn set_rate_limit_applies_to_the_running_server_within_a_second() {
    let s = Server::start();
    let p = s.project("changing", "2/min");
    assert_eq!(burst(&s, &p.secret, 3), vec![202, 202, 429]);

    // Raise it: the used share carries over, so the new rate refills it (10 ms a unit).
    cli(&s.data_dir, &["project", "set-rate-limit", &p.id, "100/s"]);
    let changed = Instant::now();
    loop {
        let (status, head, _) = s.raw_publish(&p.secret, "application/json", BODY.as_bytes());
        if status == 202 {
            assert_eq!(header(&head, "ratelimit-limit").as_deref(), Some("100"));
            break;
        }
        assert_eq!(status, 429);
        assert!(
            changed.elapsed() < Duration::from_secs(1),
            "the new limit was not applied within 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Lower it: within a second the server enforces the new, smaller limit.
    cli(&s.data_dir, &["project", "set-rate-limit", &p.id, "1/min"]);
    let changed = Instant::now();
    loop {
        let (status, head, _) = s.raw_publish(&p.secret, "application/json", BODY.as_bytes());
        if header(&head, "ratelimit-limit").as_deref() == Some("1") {
            break;
        }
        assert!(matches!(status, 202 | 429), "{status}");
        assert!(
            changed.elapsed() < Duration::from_secs(1),
            "the new limit was not applied within 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = burst(&s, &p.secret, 3);
    assert!(count(&after, 202) <= 1, "{after:?}");
    assert_eq!(after[2], 429);
}
