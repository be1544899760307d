//! Long-run truths that only show under churn: accepting and closing many connections
//! must not grow the server's memory.
//!
//! The regression this guards: the accept loop once made a new stop-wait future per
//! accept, and each poll of it pushed a waker clone into a list that was only cleared at
//! shutdown: ~27 bytes per accepted connection, never returned (8 MB per 300,000). The
//! first fix deduplicated wakers with `Waker::will_wake`, which held in debug builds but
//! not in release ones (+6.5 MB per 300,000), so `scripts/test.sh` runs this test again
//! against the release binary (`RINGCAST_TEST_BIN`).

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{rss_kib, Server};

/// Open and reset `n` connections from a few threads. Each close is an RST (linger 0):
/// no TIME_WAIT, so the loopback port range is never exhausted.
fn churn(addr: SocketAddr, n: usize) {
    let threads = 4;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut done = 0;
                while done < n / threads {
                    if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        done += 1;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("churn thread");
    }
}

/// Wait until the server has served every reset connection: its RSS stops moving and
/// `/health` answers.
fn settle(server: &Server) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = rss_kib(server.pid());
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let (status, _) = server.health();
        let now = rss_kib(server.pid());
        if status == 200 && now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the server's memory did not settle within 20 s ({last} → {now} KiB)"
        );
        last = now;
    }
}

#[test]
fn three_hundred_thousand_connections_leave_memory_where_it_was() {
    let server = Server::start();
    // Warm-up: let the allocator's pools, the runtime's slabs and the kernel's socket
    // caches reach their working size before the baseline is taken.
    churn(server.addr, 20_000);
    let before = settle(&server);
    churn(server.addr, 300_000);
    let after = settle(&server);
    let grown = after.saturating_sub(before);
    eprintln!("RSS before {before} KiB, after 300,000 connections {after} KiB (+{grown} KiB)");
    assert!(
        grown <= 2048,
        "RSS grew by {grown} KiB over 300,000 accepted connections (limit 2048 KiB)"
    );
}
