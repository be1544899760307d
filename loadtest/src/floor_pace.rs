//! The rate-matched floor: the same frame and sockets as the max-rate floor, but
//! sent in the shape of a fan-out scenario. Each round writes one frame to the next
//! `per_round` sockets (cycling over all of them, like the subscribers of one
//! channel), `rounds_per_s` rounds per second, and the sender sleeps between rounds,
//! so its readers sleep in epoll between bursts and every burst pays the kernel's
//! wake-up of a sleeping reader, as a server's fan-out does.
//!
//! Invariants: round `i` starts no earlier than `i / rounds_per_s` after the start
//! (a fixed schedule: a late round does not move the later ones); the sender never
//! busy-waits (it sleeps until the next round's start); the run ends at the end of
//! the last round's period, so `frames / elapsed` is the achieved rate; sockets are
//! nonblocking and a full one is counted (`eagain`), never waited on.

use crate::floor_send::{uring_round, write_round, Counts, SendStats};
use crate::stats::thread_cpu_s;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The shape of a rate-matched run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    pub rounds_per_s: f64,
    /// Sockets written per round (at most the socket count).
    pub per_round: usize,
}

impl Pace {
    /// Refuses a rate or a round size that cannot be run.
    pub fn new(rounds_per_s: f64, per_round: usize, sockets: usize) -> Result<Self, String> {
        if !(rounds_per_s.is_finite() && rounds_per_s > 0.0 && rounds_per_s <= 1e6) {
            return Err(format!(
                "--rounds-per-s must be in (0, 1000000], not {rounds_per_s}"
            ));
        }
        if per_round == 0 || per_round > sockets {
            return Err(format!(
                "--per-round must be 1..={sockets} (the socket count), not {per_round}"
            ));
        }
        Ok(Self {
            rounds_per_s,
            per_round,
        })
    }

    /// When round `i` starts, from the start of the run.
    pub fn offset(&self, round: u64) -> Duration {
        Duration::from_secs_f64(round as f64 / self.rounds_per_s)
    }

    /// Rounds that start within `d`: those with `offset(i) < d`.
    pub fn rounds_in(&self, d: Duration) -> u64 {
        // The nanosecond rounding keeps e.g. 3 s at 4/s at exactly 12, not 13.
        let exact = d.as_secs_f64() * self.rounds_per_s;
        let rounded = (exact * 1e9).round() / 1e9;
        rounded.ceil() as u64
    }

    /// The first socket of round `i`: rounds take consecutive windows, cycling.
    pub fn first_socket(&self, round: u64, sockets: usize) -> usize {
        ((round as u128 * self.per_round as u128) % sockets as u128) as usize
    }

    /// A round counts as late when it starts after the next round's start: the
    /// sender could not hold the schedule (a few µs of timer slack is not late).
    pub fn is_late(&self, round: u64, started: Duration) -> bool {
        started >= self.offset(round + 1)
    }
}

/// What a paced run adds to the sender's figures.
pub struct PacedStats {
    pub send: SendStats,
    pub rounds: u64,
    pub late_rounds: u64,
}

/// How a round's frames leave: one `write(2)` per socket, or io_uring sends.
pub enum Sender<'a> {
    Write,
    Uring {
        ring: &'a mut io_uring::IoUring,
        batch: usize,
    },
}

/// Run the schedule for `d`: the sender's CPU over all of it (sleeps included,
/// which cost none), and the wall time to the end of the last round's period.
pub fn run(
    writers: &[TcpStream],
    frame: &[u8],
    pace: Pace,
    mut sender: Sender<'_>,
    d: Duration,
) -> Result<PacedStats, String> {
    let rounds = pace.rounds_in(d);
    let mut totals = Counts::default();
    let mut late_rounds = 0;
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    for round in 0..rounds {
        sleep_until(t0, pace.offset(round));
        if pace.is_late(round, t0.elapsed()) {
            late_rounds += 1;
        }
        let first = pace.first_socket(round, writers.len());
        let c = match &mut sender {
            Sender::Write => write_round(writers, frame, first, pace.per_round),
            Sender::Uring { ring, batch } => {
                uring_round(ring, writers, frame, first, pace.per_round, *batch)?
            }
        };
        totals.add(c);
    }
    // The last round's period belongs to the run, as a scenario's last publish does.
    sleep_until(t0, pace.offset(rounds));
    Ok(PacedStats {
        send: SendStats::since(totals, cpu0, t0),
        rounds,
        late_rounds,
    })
}

fn sleep_until(t0: Instant, offset: Duration) {
    let now = t0.elapsed();
    if offset > now {
        std::thread::sleep(offset - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_of_the_three_shapes() {
        // fanout: 4 rounds/s of all 9,900 sockets.
        let p = Pace::new(4.0, 9900, 9900).unwrap();
        assert_eq!(p.rounds_in(Duration::from_secs(10)), 40);
        assert_eq!(p.offset(1), Duration::from_millis(250));
        assert_eq!(p.first_socket(0, 9900), 0);
        assert_eq!(p.first_socket(7, 9900), 0);
        // wide: 2,000 rounds/s of 10 sockets, windows walk the 9,900 and wrap.
        let p = Pace::new(2000.0, 10, 9900).unwrap();
        assert_eq!(p.rounds_in(Duration::from_secs(3)), 6000);
        assert_eq!(p.offset(3), Duration::from_micros(1500));
        assert_eq!(p.first_socket(1, 9900), 10);
        assert_eq!(p.first_socket(989, 9900), 9890);
        assert_eq!(p.first_socket(990, 9900), 0);
        // burst: 1,000 rounds/s of all 100.
        let p = Pace::new(1000.0, 100, 100).unwrap();
        assert_eq!(p.rounds_in(Duration::from_secs(3)), 3000);
        assert_eq!(p.first_socket(5, 100), 0);
    }

    #[test]
    fn rounds_in_counts_rounds_that_start_before_the_end() {
        let p = Pace::new(4.0, 1, 1).unwrap();
        assert_eq!(p.rounds_in(Duration::ZERO), 0);
        assert_eq!(p.rounds_in(Duration::from_millis(1)), 1);
        assert_eq!(p.rounds_in(Duration::from_millis(250)), 1);
        assert_eq!(p.rounds_in(Duration::from_millis(251)), 2);
        // A rate whose period is not a whole number of nanoseconds.
        let p = Pace::new(3.0, 1, 1).unwrap();
        assert_eq!(p.rounds_in(Duration::from_secs(1)), 3);
    }

    #[test]
    fn a_window_that_does_not_divide_the_sockets_wraps() {
        let p = Pace::new(1.0, 4, 10).unwrap();
        let firsts: Vec<usize> = (0..5).map(|i| p.first_socket(i, 10)).collect();
        assert_eq!(firsts, [0, 4, 8, 2, 6]);
    }

    #[test]
    fn late_only_after_the_next_round_was_due() {
        let p = Pace::new(1000.0, 1, 1).unwrap();
        assert!(!p.is_late(2, Duration::from_micros(2000)));
        assert!(!p.is_late(2, Duration::from_micros(2999)));
        assert!(p.is_late(2, Duration::from_micros(3000)));
    }

    #[test]
    fn impossible_shapes_are_refused() {
        assert!(Pace::new(0.0, 1, 1).is_err());
        assert!(Pace::new(f64::NAN, 1, 1).is_err());
        assert!(Pace::new(-1.0, 1, 1).is_err());
        assert!(Pace::new(4.0, 0, 10).is_err());
        assert!(Pace::new(4.0, 11, 10).is_err());
        assert!(Pace::new(4.0, 10, 10).is_ok());
    }

    #[test]
    fn counts_add_up() {
        let mut c = Counts::default();
        c.add(Counts {
            frames: 3,
            writes: 4,
            eagain: 1,
        });
        c.add(Counts {
            frames: 2,
            writes: 2,
            eagain: 0,
        });
        assert_eq!(
            c,
            Counts {
                frames: 5,
                writes: 6,
                eagain: 1
            }
        );
    }
}
