//! The webhook queues of every project, as a pure state machine: what to send, when, and
//! what to do after an attempt. No threads, no sockets, no clock of its own: every call
//! is given `now`, so the tests drive time by hand.
//!
//! Rules (contract 1.2 "Webhooks" and its settling rules):
//! - **Batching:** a project's events go out in one request once the earliest of them
//!   has been ready for [`BATCH_WINDOW`]; every event ready by then rides along (at most
//!   [`MAX_EVENTS_PER_REQUEST`] events and about [`MAX_BATCH_BYTES`] of JSON).
//! - **Grace:** `channel_vacated` and `member_removed` become ready [`GRACE`] after they
//!   happened. An `channel_occupied` (`member_added` of the same user) on that channel
//!   within the grace cancels both: the receiver never hears of the flap.
//! - **Order per channel:** an event is never ready before an earlier event of the same
//!   channel (its *effective* ready time is the latest of its own and its channel
//!   predecessors'), so a held `member_removed` also holds what followed it there.
//! - **One request in flight per project**; a failed batch is retried, the same events,
//!   after 1 s, 2 s, 4 s ... (at most [`MAX_RETRY_DELAY`]) until [`RETRY_FOR`] has passed
//!   since its first attempt, and at least once; nothing of the project is sent before
//!   it succeeds or is given up.
//! - **Bounded:** at most `cap` waiting events per project; one more is refused
//!   ([`Pushed::Full`]) and the caller counts it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::HookEvent;
use crate::store::HookKind;

/// How long events are collected into one request.
pub(crate) const BATCH_WINDOW: Duration = Duration::from_secs(1);
/// How long `channel_vacated` and `member_removed` wait for the channel/user to return.
pub(crate) const GRACE: Duration = Duration::from_secs(3);
/// How long a failed batch keeps being retried, from its first attempt.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(300);
/// The first retry's delay; each further one doubles it.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts, so a receiver that comes back within the
/// 5 minutes is reached soon after.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// Most events in one request: a receiver handles a request in one go, so a backlog
/// leaves in several modest requests rather than one huge one.
pub(crate) const MAX_EVENTS_PER_REQUEST: usize = 100;
/// A batch stops growing once its events' JSON passes this many bytes (client events
/// carry data of up to `max_body_bytes` each); it always holds at least one event.
pub(crate) const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// An event waiting in a project's queue.
struct Pending {
    /// When it may leave on its own (`at`, or `at + GRACE` for a leave).
    release: Instant,
    event: HookEvent,
}

/// The events of one request, encoded once: the `[...]` of the body's `events`.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    pub events_json: Arc<str>,
    pub count: usize,
}

/// Where a project's one request stands.
enum Flight {
    Idle,
    /// An attempt is being made (the sender will report it).
    Sending {
        batch: Batch,
        first_attempt: Instant,
        attempts: u32,
    },
    /// The last attempt failed; the next one is due at `retry_at`.
    Waiting {
        batch: Batch,
        first_attempt: Instant,
        attempts: u32,
        retry_at: Instant,
    },
}

struct ProjectQueue {
    pending: VecDeque<Pending>,
    flight: Flight,
}

/// What happened to a pushed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// It cancelled a held leave of the same channel/user (and is dropped with it).
    Cancelled,
    /// The project's queue is full: dropped.
    Full,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A 2xx answer.
    Delivered,
    /// A non-2xx answer, no answer in time, or no connection.
    Failed,
    /// The project has no webhook any more: drop its queue.
    Off,
}

/// What [`Queues::finished`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Done,
    /// Retried at this instant.
    RetryAt(Instant),
    /// Retried for [`RETRY_FOR`]: these many events are dropped.
    GaveUp(usize),
    /// The webhook was turned off: these many events (batch and queue) are dropped.
    Forgotten(usize),
}

/// One request to make now.
#[derive(Debug, Clone)]
pub(crate) struct Dispatch {
    pub project: u32,
    pub batch: Batch,
    /// 1 for the first attempt of this batch.
    pub attempt: u32,
}

/// Every project's queue.
pub(crate) struct Queues {
    projects: HashMap<u32, ProjectQueue>,
    cap: usize,
}

/// Whether `later` cancels the held `earlier` (a leave) of the same channel.
fn cancels(later: &HookEvent, earlier: &HookEvent) -> bool {
    match (later, earlier) {
        (HookEvent::ChannelOccupied { channel: a }, HookEvent::ChannelVacated { channel: b }) => {
            a == b
        }
        (
            HookEvent::MemberAdded {
                channel: a,
                user_id: u,
            },
            HookEvent::MemberRemoved {
                channel: b,
                user_id: v,
            },
        ) => a == b && u == v,
        _ => false,
    }
}

/// Whether `a` is the event a cancellation looks for when `b` arrives: the latest
/// earlier event about the same thing (the channel for occupancy, the user for members).
fn same_subject(a: &HookEvent, b: &HookEvent) -> bool {
    use HookEvent::*;
    match (a, b) {
        (
            ChannelOccupied { channel: x } | ChannelVacated { channel: x },
            ChannelOccupied { channel: y } | ChannelVacated { channel: y },
        ) => x == y,
        (
            MemberAdded {
                channel: x,
                user_id: u,
            }
            | MemberRemoved {
                channel: x,
                user_id: u,
            },
            MemberAdded {
                channel: y,
                user_id: v,
            }
            | MemberRemoved {
                channel: y,
                user_id: v,
            },
        ) => x == y && u == v,
        _ => false,
    }
}

impl ProjectQueue {
    /// Each pending event's effective ready time (its own, or a channel predecessor's
    /// if later), in queue order.
    fn effective_release(&self) -> Vec<Instant> {
        let mut last: HashMap<&str, Instant> = HashMap::new();
        self.pending
            .iter()
            .map(|p| {
                let channel = p.event.channel();
                let eff = match last.get(channel) {
                    Some(prev) if *prev > p.release => *prev,
                    _ => p.release,
                };
                last.insert(channel, eff);
                eff
            })
            .collect()
    }

    /// When the next batch may leave (ignoring the flight).
    fn ready_at(&self) -> Option<Instant> {
        self.effective_release()
            .into_iter()
            .min()
            .map(|t| t + BATCH_WINDOW)
    }

    /// Take the events ready at `now`, in order, within the request limits.
    fn take_batch(&mut self, now: Instant) -> Option<Batch> {
        let eff = self.effective_release();
        let mut json = String::from("[");
        let mut count = 0;
        let mut keep = VecDeque::with_capacity(self.pending.len());
        let mut full = false;
        for (p, ready) in std::mem::take(&mut self.pending).into_iter().zip(eff) {
            if full || ready > now {
                keep.push_back(p);
                continue;
            }
            let one = p.event.to_json();
            if count > 0 && json.len() + one.len() > MAX_BATCH_BYTES {
                full = true;
                keep.push_back(p);
                continue;
            }
            if count > 0 {
                json.push(',');
            }
            json.push_str(&one);
            count += 1;
            full = count == MAX_EVENTS_PER_REQUEST;
        }
        self.pending = keep;
        json.push(']');
        (count > 0).then(|| Batch {
            events_json: json.into(),
            count,
        })
    }
}

impl Queues {
    /// Queues of at most `cap` waiting events per project.
    pub(crate) fn new(cap: usize) -> Queues {
        Queues {
            projects: HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// An event of `project` that happened at `at`.
    pub(crate) fn push(&mut self, project: u32, at: Instant, event: HookEvent) -> Pushed {
        let queue = self
            .projects
            .entry(project)
            .or_insert_with(|| ProjectQueue {
                pending: VecDeque::new(),
                flight: Flight::Idle,
            });
        if matches!(
            event.kind(),
            HookKind::ChannelOccupied | HookKind::MemberAdded
        ) {
            let latest = queue
                .pending
                .iter()
                .rposition(|p| same_subject(&p.event, &event));
            if let Some(i) = latest {
                let held = &queue.pending[i];
                if held.release > at && cancels(&event, &held.event) {
                    queue.pending.remove(i);
                    return Pushed::Cancelled;
                }
            }
        }
        if queue.pending.len() >= self.cap {
            return Pushed::Full;
        }
        let release = match event.kind() {
            HookKind::ChannelVacated | HookKind::MemberRemoved => at + GRACE,
            _ => at,
        };
        queue.pending.push_back(Pending { release, event });
        Pushed::Queued
    }

    /// The requests to make now: a retry that is due, or a new batch of a project with
    /// nothing in flight whose events are ready. Each is marked in flight.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Dispatch> {
        let mut out = Vec::new();
        for (&project, queue) in &mut self.projects {
            match &queue.flight {
                Flight::Sending { .. } => {}
                Flight::Waiting {
                    batch,
                    first_attempt,
                    attempts,
                    retry_at,
                } => {
                    if *retry_at <= now {
                        let (batch, first_attempt, attempt) =
                            (batch.clone(), *first_attempt, attempts + 1);
                        out.push(Dispatch {
                            project,
                            batch: batch.clone(),
                            attempt,
                        });
                        queue.flight = Flight::Sending {
                            batch,
                            first_attempt,
                            attempts: attempt,
                        };
                    }
                }
                Flight::Idle => {
                    if queue.ready_at().is_some_and(|t| t <= now) {
                        if let Some(batch) = queue.take_batch(now) {
                            out.push(Dispatch {
                                project,
                                batch: batch.clone(),
                                attempt: 1,
                            });
                            queue.flight = Flight::Sending {
                                batch,
                                first_attempt: now,
                                attempts: 1,
                            };
                        }
                    }
                }
            }
        }
        out
    }

    /// The project's attempt ended with `outcome` at `now`.
    pub(crate) fn finished(&mut self, project: u32, outcome: Outcome, now: Instant) -> Next {
        let Some(queue) = self.projects.get_mut(&project) else {
            return Next::Done;
        };
        let flight = std::mem::replace(&mut queue.flight, Flight::Idle);
        let Flight::Sending {
            batch,
            first_attempt,
            attempts,
        } = flight
        else {
            return Next::Done;
        };
        let next = match outcome {
            Outcome::Delivered => Next::Done,
            Outcome::Off => {
                let dropped = batch.count + queue.pending.len();
                queue.pending.clear();
                Next::Forgotten(dropped)
            }
            Outcome::Failed => {
                let delay = retry_delay(attempts);
                let retry_at = now + delay;
                // At least one retry, then only while within RETRY_FOR of the first try.
                if attempts >= 2 && retry_at > first_attempt + RETRY_FOR {
                    Next::GaveUp(batch.count)
                } else {
                    queue.flight = Flight::Waiting {
                        batch,
                        first_attempt,
                        attempts,
                        retry_at,
                    };
                    Next::RetryAt(retry_at)
                }
            }
        };
        if queue.pending.is_empty() && matches!(queue.flight, Flight::Idle) {
            self.projects.remove(&project);
        }
        next
    }

    /// The earliest instant at which [`Queues::due`] may have something, if any.
    pub(crate) fn next_wakeup(&self) -> Option<Instant> {
        self.projects
            .values()
            .filter_map(|q| match &q.flight {
                Flight::Sending { .. } => None,
                Flight::Waiting { retry_at, .. } => Some(*retry_at),
                Flight::Idle => q.ready_at(),
            })
            .min()
    }

    /// Whether the project has a request in flight (being made or waiting to retry).
    pub(crate) fn in_flight(&self, project: u32) -> bool {
        self.projects
            .get(&project)
            .is_some_and(|q| !matches!(q.flight, Flight::Idle))
    }

    /// Events waiting (not in a request) for `project`.
    #[cfg(test)]
    fn waiting(&self, project: u32) -> usize {
        self.projects.get(&project).map_or(0, |q| q.pending.len())
    }
}

/// The wait after the `attempts`-th failed attempt: 1 s, 2 s, 4 s, ... at most
/// [`MAX_RETRY_DELAY`].
pub(crate) fn retry_delay(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    (FIRST_RETRY * (1u32 << doublings)).min(MAX_RETRY_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occupied(c: &str) -> HookEvent {
        HookEvent::ChannelOccupied { channel: c.into() }
    }
    fn vacated(c: &str) -> HookEvent {
        HookEvent::ChannelVacated { channel: c.into() }
    }
    fn added(c: &str, u: &str) -> HookEvent {
        HookEvent::MemberAdded {
            channel: c.into(),
            user_id: u.into(),
        }
    }
    fn removed(c: &str, u: &str) -> HookEvent {
        HookEvent::MemberRemoved {
            channel: c.into(),
            user_id: u.into(),
        }
    }
    fn client(c: &str, n: u32) -> HookEvent {
        HookEvent::ClientEvent {
            channel: c.into(),
            event: "client-x".into(),
            data: format!("{{\"n\":{n}}}").into(),
            socket_id: "1.2".into(),
            user_id: None,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The (name, channel[, user]) of each event of a batch.
    fn names(batch: &Batch) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&batch.events_json).unwrap();
        let events = v.as_array().unwrap();
        assert_eq!(events.len(), batch.count);
        events
            .iter()
            .map(|e| {
                let mut s = format!(
                    "{}:{}",
                    e["name"].as_str().unwrap(),
                    e["channel"].as_str().unwrap()
                );
                if let Some(u) = e.get("user_id").and_then(|u| u.as_str()) {
                    s.push(':');
                    s.push_str(u);
                }
                s
            })
            .collect()
    }

    #[test]
    fn events_within_a_second_leave_in_one_request() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        assert_eq!(q.push(7, t0, occupied("a")), Pushed::Queued);
        assert_eq!(q.push(7, t0 + ms(300), occupied("b")), Pushed::Queued);
        assert_eq!(q.push(7, t0 + ms(900), added("p", "u1")), Pushed::Queued);
        assert_eq!(q.next_wakeup(), Some(t0 + BATCH_WINDOW));
        assert!(q.due(t0 + ms(999)).is_empty(), "the window is still open");
        let d = q.due(t0 + BATCH_WINDOW);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].project, 7);
        assert_eq!(d[0].attempt, 1);
        assert_eq!(
            names(&d[0].batch),
            [
                "channel_occupied:a",
                "channel_occupied:b",
                "member_added:p:u1"
            ]
        );
        // Nothing else may leave while it is in flight.
        q.push(7, t0 + ms(1100), occupied("c"));
        assert!(q.due(t0 + ms(5000)).is_empty());
        assert_eq!(q.next_wakeup(), None, "only the sender's answer wakes it");
        assert_eq!(q.finished(7, Outcome::Delivered, t0 + ms(5000)), Next::Done);
        // The next batch: its first event happened long enough ago.
        let d = q.due(t0 + ms(5000));
        assert_eq!(names(&d[0].batch), ["channel_occupied:c"]);
    }

    #[test]
    fn projects_are_independent() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, occupied("a"));
        q.push(2, t0, occupied("a"));
        let d = q.due(t0 + BATCH_WINDOW);
        assert_eq!(d.len(), 2);
        // Project 1's endpoint is stuck; project 2 goes on.
        q.finished(2, Outcome::Delivered, t0 + ms(1100));
        q.push(2, t0 + ms(1200), occupied("b"));
        let d = q.due(t0 + ms(2200));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].project, 2);
        assert!(q.in_flight(1));
    }

    #[test]
    fn a_leave_waits_three_seconds() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, vacated("a"));
        q.push(1, t0, removed("p", "u1"));
        assert!(q.due(t0 + ms(3999)).is_empty());
        assert_eq!(q.next_wakeup(), Some(t0 + GRACE + BATCH_WINDOW));
        let d = q.due(t0 + GRACE + BATCH_WINDOW);
        assert_eq!(
            names(&d[0].batch),
            ["channel_vacated:a", "member_removed:p:u1"]
        );
    }

    #[test]
    fn coming_back_within_the_grace_cancels_both() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, occupied("a"));
        q.push(1, t0, added("p", "u1"));
        q.push(1, t0 + ms(100), vacated("a"));
        q.push(1, t0 + ms(100), removed("p", "u1"));
        q.push(1, t0 + ms(100), removed("p", "u2"));
        // A page reload: back within 3 s.
        assert_eq!(q.push(1, t0 + ms(2000), occupied("a")), Pushed::Cancelled);
        assert_eq!(
            q.push(1, t0 + ms(3099), added("p", "u1")),
            Pushed::Cancelled
        );
        // u2 comes back too late: its removal stands, and the new add is sent.
        assert_eq!(q.push(1, t0 + ms(3100), added("p", "u2")), Pushed::Queued);
        let d = q.due(t0 + ms(10_000));
        assert_eq!(
            names(&d[0].batch),
            [
                "channel_occupied:a",
                "member_added:p:u1",
                "member_removed:p:u2",
                "member_added:p:u2"
            ]
        );
    }

    #[test]
    fn only_the_latest_event_of_the_subject_is_cancelled() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        // Another user's removal is not touched by u1's return; an add with no held
        // removal is just queued.
        q.push(1, t0, removed("p", "u2"));
        assert_eq!(q.push(1, t0 + ms(10), added("p", "u1")), Pushed::Queued);
        assert_eq!(q.push(1, t0 + ms(20), occupied("p")), Pushed::Queued);
        assert_eq!(q.waiting(1), 3);
        // A leave already sent is never cancelled.
        let d = q.due(t0 + ms(5000));
        assert_eq!(d[0].batch.count, 3);
        q.finished(1, Outcome::Delivered, t0 + ms(5000));
        q.push(1, t0 + ms(5000), vacated("x"));
        let d = q.due(t0 + ms(9000));
        assert_eq!(names(&d[0].batch), ["channel_vacated:x"]);
        assert_eq!(q.push(1, t0 + ms(9001), occupied("x")), Pushed::Queued);
    }

    #[test]
    fn a_held_leave_holds_what_follows_on_its_channel_only() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, removed("presence-p", "u1"));
        q.push(1, t0 + ms(10), client("presence-p", 1));
        q.push(1, t0 + ms(20), client("private-q", 2));
        // At 1.02 s only the other channel's event is ready.
        let d = q.due(t0 + ms(1020));
        assert_eq!(names(&d[0].batch), ["client_event:private-q"]);
        q.finished(1, Outcome::Delivered, t0 + ms(1100));
        assert!(q.due(t0 + ms(3999)).is_empty());
        let d = q.due(t0 + ms(4000));
        assert_eq!(
            names(&d[0].batch),
            ["member_removed:presence-p:u1", "client_event:presence-p"]
        );
    }

    #[test]
    fn failures_are_retried_with_backoff_then_given_up() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, client("private-a", 1));
        let mut now = t0 + BATCH_WINDOW;
        let first = q.due(now);
        let events = first[0].batch.events_json.clone();
        let mut delays = Vec::new();
        let mut attempts = 1;
        loop {
            // Each attempt takes the full 5 s timeout.
            now += Duration::from_secs(5);
            match q.finished(1, Outcome::Failed, now) {
                Next::RetryAt(at) => {
                    delays.push((at - now).as_secs());
                    // New events wait behind the retry, which is never overtaken.
                    q.push(1, now, client("private-a", 2));
                    assert!(q.due(at - ms(1)).is_empty());
                    now = at;
                    let d = q.due(now);
                    assert_eq!(d.len(), 1);
                    attempts += 1;
                    assert_eq!(d[0].attempt, attempts);
                    assert_eq!(d[0].batch.events_json, events, "the same events again");
                }
                Next::GaveUp(n) => {
                    assert_eq!(n, 1);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(&delays[..7], [1, 2, 4, 8, 16, 32, 60]);
        assert!(delays[7..].iter().all(|d| *d == 60));
        assert!(now - t0 >= RETRY_FOR - MAX_RETRY_DELAY && now - t0 <= RETRY_FOR + ms(6000));
        // The events that waited now leave.
        let d = q.due(now);
        assert_eq!(d[0].attempt, 1);
        assert!(d[0].batch.count >= 1);
    }

    #[test]
    fn a_failure_is_retried_at_least_once_and_a_success_ends_it() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, occupied("a"));
        q.due(t0 + BATCH_WINDOW);
        // An attempt that itself outlived RETRY_FOR still gets one retry.
        let late = t0 + RETRY_FOR + Duration::from_secs(10);
        assert!(matches!(
            q.finished(1, Outcome::Failed, late),
            Next::RetryAt(_)
        ));
        assert_eq!(q.due(late + FIRST_RETRY)[0].attempt, 2);
        assert_eq!(
            q.finished(1, Outcome::Delivered, late + ms(1100)),
            Next::Done
        );
        assert!(!q.in_flight(1));
        assert_eq!(q.next_wakeup(), None);
    }

    #[test]
    fn turning_the_webhook_off_forgets_the_queue() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        q.push(1, t0, occupied("a"));
        q.due(t0 + BATCH_WINDOW);
        q.push(1, t0 + ms(1500), occupied("b"));
        q.push(1, t0 + ms(1600), occupied("c"));
        assert_eq!(
            q.finished(1, Outcome::Off, t0 + ms(2000)),
            Next::Forgotten(3)
        );
        assert_eq!(q.waiting(1), 0);
        assert_eq!(q.next_wakeup(), None);
    }

    #[test]
    fn a_full_queue_refuses_more_and_cancellation_still_works() {
        let t0 = Instant::now();
        let mut q = Queues::new(3);
        assert_eq!(q.push(1, t0, occupied("a")), Pushed::Queued);
        assert_eq!(q.push(1, t0, vacated("a")), Pushed::Queued);
        assert_eq!(q.push(1, t0, occupied("b")), Pushed::Queued);
        assert_eq!(q.push(1, t0, occupied("c")), Pushed::Full);
        assert_eq!(q.push(2, t0, occupied("c")), Pushed::Queued, "per project");
        assert_eq!(q.push(1, t0 + ms(10), occupied("a")), Pushed::Cancelled);
        assert_eq!(q.waiting(1), 2);
    }

    #[test]
    fn a_long_backlog_leaves_in_bounded_requests_in_order() {
        let t0 = Instant::now();
        let mut q = Queues::new(1000);
        for n in 0..250 {
            q.push(1, t0, client("private-a", n));
        }
        let mut seen = Vec::new();
        let mut now = t0 + BATCH_WINDOW;
        for expected in [100, 100, 50] {
            let d = q.due(now);
            assert_eq!(d[0].batch.count, expected);
            let v: serde_json::Value = serde_json::from_str(&d[0].batch.events_json).unwrap();
            for e in v.as_array().unwrap() {
                let data: serde_json::Value =
                    serde_json::from_str(e["data"].as_str().unwrap()).unwrap();
                seen.push(data["n"].as_u64().unwrap());
            }
            q.finished(1, Outcome::Delivered, now);
            now += ms(10);
        }
        assert_eq!(seen, (0..250).collect::<Vec<_>>());
        // Large events: the batch stops near MAX_BATCH_BYTES, never empty.
        let big = "x".repeat(400 * 1024);
        for _ in 0..3 {
            q.push(
                1,
                now,
                HookEvent::ClientEvent {
                    channel: "private-a".into(),
                    event: "client-x".into(),
                    data: format!("\"{big}\"").into(),
                    socket_id: "1.2".into(),
                    user_id: None,
                },
            );
        }
        let d = q.due(now + BATCH_WINDOW);
        assert_eq!(d[0].batch.count, 2);
    }

    #[test]
    fn retry_delays_double_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY_DELAY);
    }
}
