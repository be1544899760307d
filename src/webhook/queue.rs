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
//! - **Coalescing:** a `channel_vacated` that follows a still-queued `channel_occupied` of
//!   the same channel, with no other event of that channel between, cancels it (the
//!   receiver never heard the channel was occupied, and need not): subscribe/unsubscribe
//!   churn leaves nothing in the queue. The pending occupancy events of a channel always
//!   alternate, so any two adjacent ones cancel out and the receiver's final state is
//!   right whichever pairs are dropped.
//! - **Bounded:** at most `cap` waiting events per project: half of them for occupancy
//!   events, half for member and client events (at least one each), so occupancy churn
//!   can never crowd out `member_added`, `member_removed` or client events (nor those
//!   the occupancy). When an occupancy event finds its half full, the queue first drops a
//!   pair of adjacent occupancy events of one channel (churn, see above); only when
//!   there is none, or for a member or client event, is the new event refused
//!   ([`Pushed::Full`]) and the caller counts it.
//! - **Cost:** every push, cancellation, batch and wake-up question is O(log n) in the
//!   project's waiting events (ordered indexes, no rescans).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    /// When it may leave: the later of `release` and its channel predecessor's `ready`.
    ready: Instant,
    /// The channel's latest event (sequence number, `ready`) before this one came:
    /// restored if this one is cancelled while it is the channel's latest.
    prev: Option<(u64, Instant)>,
    event: HookEvent,
}

/// What the queue knows about one channel with waiting events.
#[derive(Default)]
struct ChannelState {
    /// Waiting events of the channel (the entry goes at 0).
    count: usize,
    /// Its latest waiting event: (sequence number, `ready`).
    last: Option<(u64, Instant)>,
    /// Its waiting occupancy events, oldest first (they alternate; a handful at most).
    occupancy: VecDeque<u64>,
    /// The latest waiting member event of each user.
    members: HashMap<Box<str>, u64>,
    /// Listed in [`ProjectQueue::churned`].
    churned: bool,
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
    /// The sequence number of the next event pushed (queue order).
    next_seq: u64,
    /// Every waiting event, in queue order.
    pending: BTreeMap<u64, Pending>,
    /// Waiting events not yet ready at the last look: (ready, seq).
    later: BTreeSet<(Instant, u64)>,
    /// Events found ready, in queue order, and the same by ready time.
    ready: BTreeSet<u64>,
    ready_by_time: BTreeSet<(Instant, u64)>,
    channels: HashMap<Box<str>, ChannelState>,
    /// Waiting occupancy events (at most half of `cap`).
    occupancy: usize,
    /// Channels that had two or more waiting occupancy events (checked when used; kept
    /// at most about twice the channels by [`ProjectQueue::compact_churned`]).
    churned: Vec<Box<str>>,
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

fn is_occupancy(event: &HookEvent) -> bool {
    matches!(
        event,
        HookEvent::ChannelOccupied { .. } | HookEvent::ChannelVacated { .. }
    )
}

impl ProjectQueue {
    fn new() -> ProjectQueue {
        ProjectQueue {
            next_seq: 0,
            pending: BTreeMap::new(),
            later: BTreeSet::new(),
            ready: BTreeSet::new(),
            ready_by_time: BTreeSet::new(),
            channels: HashMap::new(),
            occupancy: 0,
            churned: Vec::new(),
            flight: Flight::Idle,
        }
    }

    fn len(&self) -> usize {
        self.pending.len()
    }

    /// The event cancelled by `event` pushed at `at`, if any: a held leave of the same
    /// channel (user) that `event` returns to, or a still-queued `channel_occupied` that
    /// `event` (a vacate) undoes with nothing else of its channel after it.
    fn cancelled_by(&self, event: &HookEvent, at: Instant) -> Option<u64> {
        let state = self.channels.get(event.channel())?;
        let (seq, wanted) = match event {
            HookEvent::ChannelOccupied { .. } => {
                (*state.occupancy.back()?, HookKind::ChannelVacated)
            }
            HookEvent::ChannelVacated { .. } => {
                let seq = *state.occupancy.back()?;
                if state.last.map(|(s, _)| s) != Some(seq) {
                    return None;
                }
                (seq, HookKind::ChannelOccupied)
            }
            HookEvent::MemberAdded { user_id, .. } => {
                (*state.members.get(user_id)?, HookKind::MemberRemoved)
            }
            _ => return None,
        };
        let held = self.pending.get(&seq)?;
        let in_grace = held.release > at;
        (held.event.kind() == wanted && (wanted == HookKind::ChannelOccupied || in_grace))
            .then_some(seq)
    }

    /// Queue `event` at the end.
    fn insert(&mut self, release: Instant, event: HookEvent) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let state = self.channels.entry(event.channel().into()).or_default();
        let prev = state.last;
        let ready = prev.map_or(release, |(_, r)| r.max(release));
        state.count += 1;
        state.last = Some((seq, ready));
        match &event {
            HookEvent::ChannelOccupied { channel } | HookEvent::ChannelVacated { channel } => {
                state.occupancy.push_back(seq);
                self.occupancy += 1;
                if state.occupancy.len() >= 2 && !state.churned {
                    state.churned = true;
                    self.churned.push(channel.clone());
                    self.compact_churned();
                }
            }
            HookEvent::MemberAdded { user_id, .. } | HookEvent::MemberRemoved { user_id, .. } => {
                state.members.insert(user_id.clone(), seq);
            }
            HookEvent::ClientEvent { .. } => {}
        }
        self.later.insert((ready, seq));
        self.pending.insert(
            seq,
            Pending {
                release,
                ready,
                prev,
                event,
            },
        );
    }

    /// Take event `seq` out of the queue and out of every index.
    fn remove(&mut self, seq: u64) -> Option<Pending> {
        let p = self.pending.remove(&seq)?;
        if !self.later.remove(&(p.ready, seq)) {
            self.ready.remove(&seq);
            self.ready_by_time.remove(&(p.ready, seq));
        }
        let channel = p.event.channel();
        if let Some(state) = self.channels.get_mut(channel) {
            state.count -= 1;
            if state.count == 0 {
                self.channels.remove(channel);
            } else {
                if state.last.map(|(s, _)| s) == Some(seq) {
                    // Cancelled while the channel's latest: what came after the one before
                    // is timed from that one again.
                    state.last = p.prev;
                }
                match &p.event {
                    HookEvent::MemberAdded { user_id, .. }
                    | HookEvent::MemberRemoved { user_id, .. } => {
                        if state.members.get(user_id) == Some(&seq) {
                            state.members.remove(user_id);
                        }
                    }
                    _ => {
                        if let Some(i) = state.occupancy.iter().position(|s| *s == seq) {
                            state.occupancy.remove(i);
                        }
                    }
                }
            }
        }
        if is_occupancy(&p.event) {
            self.occupancy -= 1;
        }
        Some(p)
    }

    /// Drop the two latest waiting occupancy events of a channel that has two or more:
    /// they alternate, so the receiver's final state of that channel stays right.
    /// Whether there was such a pair.
    fn drop_churn_pair(&mut self) -> bool {
        while let Some(channel) = self.churned.pop() {
            let Some(state) = self.channels.get_mut(&channel) else {
                continue;
            };
            state.churned = false;
            let n = state.occupancy.len();
            if n < 2 {
                continue;
            }
            let (latest, before) = (state.occupancy[n - 1], state.occupancy[n - 2]);
            self.remove(latest);
            self.remove(before);
            if let Some(state) = self.channels.get_mut(&channel) {
                if state.occupancy.len() >= 2 {
                    state.churned = true;
                    self.churned.push(channel);
                }
            }
            return true;
        }
        false
    }

    /// Entries of channels gone (and re-made) stay in the churn list until popped: once
    /// it is more than twice the channels, keep only one entry per channel still listed.
    /// Amortized O(1) per push.
    fn compact_churned(&mut self) {
        if self.churned.len() <= 2 * self.channels.len() + 64 {
            return;
        }
        let channels = &mut self.channels;
        // The first entry of a listed channel clears its mark; later ones are dropped.
        self.churned.retain(|c| match channels.get_mut(c) {
            Some(state) if state.churned => {
                state.churned = false;
                true
            }
            _ => false,
        });
        for c in &self.churned {
            if let Some(state) = channels.get_mut(c) {
                state.churned = true;
            }
        }
    }

    /// Move the events that became ready by `now` to the ready indexes.
    fn promote(&mut self, now: Instant) {
        while let Some(&(ready, seq)) = self.later.first() {
            if ready > now {
                break;
            }
            self.later.pop_first();
            self.ready.insert(seq);
            self.ready_by_time.insert((ready, seq));
        }
    }

    /// When the next batch may leave (ignoring the flight): the earliest ready time of
    /// a waiting event, plus the batching window.
    fn ready_at(&self) -> Option<Instant> {
        let a = self.ready_by_time.first().map(|(t, _)| *t);
        let b = self.later.first().map(|(t, _)| *t);
        a.into_iter().chain(b).min().map(|t| t + BATCH_WINDOW)
    }

    /// Take the events ready at `now`, in order, within the request limits.
    fn take_batch(&mut self, now: Instant) -> Option<Batch> {
        self.promote(now);
        let mut json = String::from("[");
        let mut taken = Vec::new();
        for seq in &self.ready {
            let Some(p) = self.pending.get(seq) else {
                continue;
            };
            let one = p.event.to_json();
            if !taken.is_empty() && json.len() + one.len() > MAX_BATCH_BYTES {
                break;
            }
            if !taken.is_empty() {
                json.push(',');
            }
            json.push_str(&one);
            taken.push(*seq);
            if taken.len() == MAX_EVENTS_PER_REQUEST {
                break;
            }
        }
        for seq in &taken {
            self.remove(*seq);
        }
        json.push(']');
        (!taken.is_empty()).then(|| Batch {
            events_json: json.into(),
            count: taken.len(),
        })
    }

    /// Forget every waiting event; how many there were.
    fn clear(&mut self) -> usize {
        let n = self.pending.len();
        self.pending.clear();
        self.later.clear();
        self.ready.clear();
        self.ready_by_time.clear();
        self.channels.clear();
        self.churned.clear();
        self.occupancy = 0;
        n
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
        let cap = self.cap;
        let queue = self
            .projects
            .entry(project)
            .or_insert_with(ProjectQueue::new);
        if let Some(seq) = queue.cancelled_by(&event, at) {
            queue.remove(seq);
            return Pushed::Cancelled;
        }
        // Half of the queue for occupancy events, half for the others (at least one
        // each): neither kind can crowd out the other.
        let occupancy_share = (cap / 2).max(1);
        let room = if is_occupancy(&event) {
            queue.occupancy < occupancy_share || queue.drop_churn_pair()
        } else {
            queue.len() - queue.occupancy < (cap - cap / 2).max(1)
        };
        if !room {
            return Pushed::Full;
        }
        let release = match event.kind() {
            HookKind::ChannelVacated | HookKind::MemberRemoved => at + GRACE,
            _ => at,
        };
        queue.insert(release, event);
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
            Outcome::Off => Next::Forgotten(batch.count + queue.clear()),
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
        assert_eq!(q.due(t0 + BATCH_WINDOW)[0].batch.count, 2);
        q.finished(1, Outcome::Delivered, t0 + ms(1050));
        let t1 = t0 + ms(1100);
        q.push(1, t1, vacated("a"));
        q.push(1, t1, removed("p", "u1"));
        q.push(1, t1, removed("p", "u2"));
        // A page reload: back within 3 s.
        assert_eq!(q.push(1, t1 + ms(2000), occupied("a")), Pushed::Cancelled);
        assert_eq!(
            q.push(1, t1 + ms(2999), added("p", "u1")),
            Pushed::Cancelled
        );
        // u2 comes back too late: its removal stands, and the new add is sent.
        assert_eq!(q.push(1, t1 + ms(3000), added("p", "u2")), Pushed::Queued);
        let d = q.due(t1 + ms(10_000));
        assert_eq!(
            names(&d[0].batch),
            ["member_removed:p:u2", "member_added:p:u2"]
        );
    }

    #[test]
    fn an_occupancy_still_queued_is_cancelled_by_its_vacate() {
        let t0 = Instant::now();
        let mut q = Queues::new(100);
        // Subscribe/unsubscribe churn: nothing stays queued.
        for i in 0..50 {
            let ch = format!("c{}", i % 7);
            assert_eq!(q.push(1, t0 + ms(i), occupied(&ch)), Pushed::Queued);
            assert_eq!(q.push(1, t0 + ms(i), vacated(&ch)), Pushed::Cancelled);
        }
        assert_eq!(q.waiting(1), 0);
        // Another event of the channel between them: both are kept (the receiver hears
        // of the occupancy the member event belongs to).
        q.push(1, t0, occupied("presence-r"));
        q.push(1, t0, added("presence-r", "u1"));
        assert_eq!(q.push(1, t0, vacated("presence-r")), Pushed::Queued);
        // An occupancy already sent is not cancelled: its vacate is sent after the grace.
        q.push(1, t0, occupied("x"));
        let d = q.due(t0 + BATCH_WINDOW);
        assert_eq!(d[0].batch.count, 3);
        q.finished(1, Outcome::Delivered, t0 + BATCH_WINDOW);
        assert_eq!(q.push(1, t0 + BATCH_WINDOW, vacated("x")), Pushed::Queued);
        let d = q.due(t0 + BATCH_WINDOW + GRACE + BATCH_WINDOW);
        assert_eq!(
            names(&d[0].batch),
            [
                "member_removed:presence-r:u1",
                "channel_vacated:presence-r",
                "channel_vacated:x"
            ]
            .iter()
            .filter(|n| !n.starts_with("member"))
            .copied()
            .collect::<Vec<_>>()
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
    fn a_full_queue_drops_occupancy_churn_before_member_and_client_events() {
        let t0 = Instant::now();
        let mut q = Queues::new(6);
        // Occupancy events may fill half of the queue (3 of 6).
        assert_eq!(q.push(1, t0, occupied("a")), Pushed::Queued);
        assert_eq!(q.push(1, t0, occupied("b")), Pushed::Queued);
        assert_eq!(q.push(1, t0, occupied("c")), Pushed::Queued);
        assert_eq!(q.push(1, t0, occupied("d")), Pushed::Full);
        assert_eq!(q.push(2, t0, occupied("d")), Pushed::Queued, "per project");
        // The other half is for member and client events.
        assert_eq!(q.push(1, t0, added("presence-p", "u1")), Pushed::Queued);
        assert_eq!(q.push(1, t0, client("private-q", 1)), Pushed::Queued);
        assert_eq!(q.push(1, t0, added("presence-p", "u2")), Pushed::Queued);
        assert_eq!(q.push(1, t0, added("presence-p", "u3")), Pushed::Full);
        assert_eq!(
            q.push(1, t0, occupied("d")),
            Pushed::Full,
            "no churn to drop"
        );
        // Cancellation still works when full.
        assert_eq!(q.push(1, t0, vacated("c")), Pushed::Cancelled);
        assert_eq!(q.waiting(1), 5);

        // Churn across a request in flight: a channel's adjacent occupancy events are
        // dropped in pairs to make room.
        let mut q = Queues::new(6);
        q.push(1, t0, occupied("a"));
        assert_eq!(q.due(t0 + BATCH_WINDOW).len(), 1);
        let t1 = t0 + BATCH_WINDOW;
        // a: vacated (held), then back after the grace: two waiting occupancy events.
        q.push(1, t1, vacated("a"));
        let t2 = t1 + GRACE;
        assert_eq!(q.push(1, t2, occupied("a")), Pushed::Queued);
        q.push(1, t2, added("presence-p", "u1"));
        q.push(1, t2, occupied("b"));
        // The occupancy half is full: c makes room by dropping a's vacated+occupied
        // pair (the receiver still holds a as occupied, which it is).
        assert_eq!(q.push(1, t2, occupied("c")), Pushed::Queued);
        assert_eq!(q.waiting(1), 3);
        q.finished(1, Outcome::Delivered, t2);
        let d = q.due(t2 + BATCH_WINDOW);
        assert_eq!(
            names(&d[0].batch),
            [
                "member_added:presence-p:u1",
                "channel_occupied:b",
                "channel_occupied:c"
            ]
        );
    }

    #[test]
    fn the_churn_list_stays_bounded() {
        let t0 = Instant::now();
        let mut q = Queues::new(10_000);
        let mut now = t0;
        for i in 0..2000 {
            let ch = format!("private-{i}");
            // Two waiting occupancy events (a client event between them keeps the
            // vacate from cancelling), then all delivered: the channel's entry goes.
            q.push(1, now, occupied(&ch));
            q.push(1, now, client(&ch, i));
            q.push(1, now, vacated(&ch));
            now += GRACE + BATCH_WINDOW;
            let sent = q.due(now);
            assert_eq!(sent.len(), 1);
            // Something waits at every answer, so the project's queue is kept.
            q.push(1, now, added("presence-keep", &format!("u{i}")));
            q.finished(1, Outcome::Delivered, now);
            let churned = q.projects.get(&1).map_or(usize::MAX, |p| p.churned.len());
            // At most two channels have waiting events at any time.
            assert!(
                churned <= 64 + 2 * 2 + 1,
                "{churned} entries after {i} channels"
            );
        }
    }

    /// Random occupancy changes of a few channels, with member events for pressure, a
    /// small queue, and requests that sometimes fail or stay in flight: the receiver
    /// sees each channel's `channel_occupied`/`channel_vacated` strictly alternate, and
    /// once everything is delivered its state of every channel is the true one.
    #[test]
    fn coalescing_never_leaves_the_receiver_with_a_wrong_occupancy() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..20 {
            let t0 = Instant::now();
            let mut now = t0;
            let mut q = Queues::new(16);
            let mut truth = [false; 6];
            let mut seen: HashMap<String, bool> = HashMap::new();
            let mut in_flight = false;
            let mut deliver = |q: &mut Queues, now: Instant, in_flight: &mut bool, ok: bool| {
                if *in_flight {
                    let outcome = if ok {
                        Outcome::Delivered
                    } else {
                        Outcome::Failed
                    };
                    q.finished(1, outcome, now);
                    *in_flight = false;
                }
                for d in q.due(now) {
                    *in_flight = true;
                    let v: serde_json::Value = serde_json::from_str(&d.batch.events_json).unwrap();
                    if d.attempt > 1 {
                        continue; // already applied at its first attempt
                    }
                    for e in v.as_array().unwrap() {
                        let ch = e["channel"].as_str().unwrap().to_string();
                        let state = seen.entry(ch.clone()).or_insert(false);
                        match e["name"].as_str().unwrap() {
                            "channel_occupied" => {
                                assert!(!*state, "round {round}: occupied twice: {ch}");
                                *state = true;
                            }
                            "channel_vacated" => {
                                assert!(*state, "round {round}: vacated twice: {ch}");
                                *state = false;
                            }
                            _ => {}
                        }
                    }
                }
            };
            for _ in 0..400 {
                now += ms(rand(400));
                let c = rand(6) as usize;
                let ch = format!("c{c}");
                truth[c] = !truth[c];
                let e = if truth[c] {
                    occupied(&ch)
                } else {
                    vacated(&ch)
                };
                assert_ne!(q.push(1, now, e), Pushed::Full, "round {round}");
                if rand(3) == 0 {
                    q.push(1, now, added("presence-m", &format!("u{}", rand(1000))));
                }
                let ok = rand(4) != 0;
                deliver(&mut q, now, &mut in_flight, ok);
            }
            for _ in 0..400 {
                now += Duration::from_secs(61);
                deliver(&mut q, now, &mut in_flight, true);
            }
            assert_eq!(q.waiting(1), 0);
            for (c, occupied) in truth.iter().enumerate() {
                let got = seen.get(&format!("c{c}")).copied().unwrap_or(false);
                assert_eq!(got, *occupied, "round {round}: c{c}");
            }
        }
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

    /// What the scheduler pays per event under churn, with a backlog (the endpoint is slow:
    /// a request is in flight, so nothing leaves): `push`, then the loop's `due` and
    /// `next_wakeup`, as when events arrive one at a time.
    #[test]
    #[ignore = "a measurement: cargo test --lib webhook::queue::tests::push_cost -- --ignored --nocapture"]
    fn push_cost() {
        let t0 = Instant::now();
        let mut q = Queues::new(10_000);
        q.push(1, t0, occupied("first"));
        assert_eq!(q.due(t0 + BATCH_WINDOW).len(), 1, "in flight from now on");
        // Fill: 4,000 channels occupied (sent long ago), each with a held leave and a
        // member event, then churn on them.
        let mut now = t0 + BATCH_WINDOW;
        for i in 0..4000 {
            let ch = format!("presence-c{i}");
            q.push(1, now, added(&ch, "u"));
            q.push(1, now, vacated(&ch));
        }
        const N: u32 = 20_000;
        let start = Instant::now();
        for i in 0..N {
            now += Duration::from_micros(50);
            let ch = format!("c{}", i % 3000);
            let e = if (i / 3000) % 2 == 0 {
                occupied(&ch)
            } else {
                vacated(&ch)
            };
            q.push(1, now, e);
            std::hint::black_box(q.due(now));
            std::hint::black_box(q.next_wakeup());
        }
        let per = start.elapsed() / N;
        println!(
            "in flight, push + due + next_wakeup with a backlog of {}: {per:?}/event",
            q.waiting(1)
        );
        // No request in flight, every event a leave in its grace (nothing is due yet):
        // each loop asks when the next batch may leave.
        let mut q = Queues::new(10_000);
        let mut now = Instant::now();
        let start = Instant::now();
        const HELD: u32 = 5_000;
        for i in 0..HELD {
            now += Duration::from_micros(50);
            q.push(2, now, vacated(&format!("c{i}")));
            assert!(q.due(now).is_empty());
            std::hint::black_box(q.next_wakeup());
        }
        let per = start.elapsed() / HELD;
        println!(
            "idle, held leaves, push + due + next_wakeup up to a backlog of {}: {per:?}/event",
            q.waiting(2)
        );
    }

    #[test]
    fn retry_delays_double_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY_DELAY);
    }
}
