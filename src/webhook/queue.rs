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
use crate::project::HookKind;

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
mod tests;
