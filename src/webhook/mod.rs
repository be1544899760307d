//! Webhooks: tell a project's backend, in Pusher's webhook format, when its channels are
//! occupied or vacated, when presence members come and go, and (if it asks) about
//! client events. Set per project with `ringcast project set-webhook`. Above `auth` and
//! `store`; named by `client`, `node` and `server`.
//!
//! Shape: [`Webhooks::emit`] (any thread: a worker for client events; the presence hub
//! reports transitions through the [`crate::presence::Transitions`] impl) puts an event on one bounded queue; one scheduler thread
//! (`ringcast-webhooks`) keeps every project's queue ([`queue`]: batching, the 3 s grace,
//! cancellation, order per channel, retries) and hands each ready request to that
//! project's own sender thread ([`send`]), so a slow or dead endpoint only ever holds up
//! its own project. Sender threads are made when a project first sends and end after a
//! minute without work.
//!
//! Invariants:
//! - `emit` never blocks, and for a project without a webhook, or one that does not want
//!   that kind of event, it only reads the key snapshot: no allocation, no queue. The
//!   caller checks [`Webhooks::wants`] before building an event.
//! - Bounded: the hand-over queue holds at most `webhook_queue_events` events, and each
//!   project at most `webhook_queue_events` waiting ones, half of them for occupancy
//!   events (churn is coalesced, see [`queue`]); an event that does not fit is dropped,
//!   counted (`ringcast_webhook_events_dropped_total`) and logged, at most one line per
//!   10 s.
//! - Destinations: unless `webhook_allow_private_addresses`, a sender connects only to
//!   public addresses, checked on the resolver's answer ([`address`]).
//! - Delivery is at least once while the node runs: a failed request is retried with
//!   the same events (re-stamped and re-signed) for 5 minutes, one request in flight
//!   per project. Events still queued when the process ends are lost.
//! - Names only auth, store, config and the presence hub's `Transitions` trait: it sits
//!   below the client protocol and the node, which call it.

mod address;
mod queue;
mod send;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

pub(crate) use crate::project::HookKind;

use crate::auth::KeyCache;
use crate::config::Config;
use queue::{Dispatch, Next, Outcome, Pushed, Queues};

/// A sender thread with nothing to do for this long ends (the next request makes a
/// new one).
const SENDER_IDLE: Duration = Duration::from_secs(60);
/// At most one log line per this long for each kind of trouble.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One thing a project's webhook may report. Strings are boxed once by the caller;
/// `data` of a client event is the JSON text of its data (an object or a string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookEvent {
    ChannelOccupied {
        channel: Box<str>,
    },
    ChannelVacated {
        channel: Box<str>,
    },
    MemberAdded {
        channel: Box<str>,
        user_id: Box<str>,
    },
    MemberRemoved {
        channel: Box<str>,
        user_id: Box<str>,
    },
    ClientEvent {
        channel: Box<str>,
        event: Box<str>,
        data: Box<str>,
        socket_id: Box<str>,
        user_id: Option<Box<str>>,
    },
}

impl HookEvent {
    pub(crate) fn kind(&self) -> HookKind {
        match self {
            HookEvent::ChannelOccupied { .. } => HookKind::ChannelOccupied,
            HookEvent::ChannelVacated { .. } => HookKind::ChannelVacated,
            HookEvent::MemberAdded { .. } => HookKind::MemberAdded,
            HookEvent::MemberRemoved { .. } => HookKind::MemberRemoved,
            HookEvent::ClientEvent { .. } => HookKind::ClientEvent,
        }
    }

    pub(crate) fn channel(&self) -> &str {
        match self {
            HookEvent::ChannelOccupied { channel }
            | HookEvent::ChannelVacated { channel }
            | HookEvent::MemberAdded { channel, .. }
            | HookEvent::MemberRemoved { channel, .. }
            | HookEvent::ClientEvent { channel, .. } => channel,
        }
    }

    /// The event as one element of the body's `events`, as Pusher sends it: a client
    /// event's `data` is a string (an object is sent as its JSON text, a string as is).
    pub(crate) fn to_json(&self) -> String {
        let mut out = serde_json::Map::new();
        out.insert("name".into(), self.kind().as_str().into());
        out.insert("channel".into(), self.channel().into());
        match self {
            HookEvent::ChannelOccupied { .. } | HookEvent::ChannelVacated { .. } => {}
            HookEvent::MemberAdded { user_id, .. } | HookEvent::MemberRemoved { user_id, .. } => {
                out.insert("user_id".into(), (**user_id).into());
            }
            HookEvent::ClientEvent {
                event,
                data,
                socket_id,
                user_id,
                ..
            } => {
                out.insert("event".into(), (**event).into());
                let data =
                    serde_json::from_str::<String>(data).unwrap_or_else(|_| data.to_string());
                out.insert("data".into(), data.into());
                out.insert("socket_id".into(), (**socket_id).into());
                if let Some(user_id) = user_id {
                    out.insert("user_id".into(), (**user_id).into());
                }
            }
        }
        serde_json::Value::Object(out).to_string()
    }
}

/// An event on its way to the scheduler.
struct Queued {
    project: u32,
    at: Instant,
    event: HookEvent,
}

/// Counters the metrics scrape reads (node-wide; written off the hot path only: a
/// drop, or a request).
#[derive(Debug, Default)]
pub(crate) struct WebhookStats {
    /// Events refused because a queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Events of batches given up after 5 minutes of retries.
    pub dropped_retries_exhausted: AtomicU64,
    /// Requests answered 2xx.
    pub requests_ok: AtomicU64,
    /// Requests answered otherwise, or not at all within 5 s.
    pub requests_failed: AtomicU64,
}

/// At most one log line per [`LOG_EVERY`], from any thread, without a lock.
#[derive(Debug)]
struct LogLimit {
    start: Instant,
    /// Milliseconds after `start` of the last line, plus one (0: never).
    last: AtomicU64,
}

impl LogLimit {
    fn new() -> LogLimit {
        LogLimit {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn allow(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now - last < LOG_EVERY.as_millis() as u64 {
            return false;
        }
        self.last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// The node's webhook sender. Made once by the server; shared as `Arc`.
pub(crate) struct Webhooks {
    keys: Arc<KeyCache>,
    tx: Sender<Queued>,
    stats: Arc<WebhookStats>,
    drop_log: LogLimit,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("queued", &self.tx.len())
            .finish_non_exhaustive()
    }
}

impl Webhooks {
    /// Start the scheduler thread. If the thread cannot be made (the system is out of
    /// threads) it says so in the log, and every event is then dropped and counted.
    pub(crate) fn start(config: &Config, keys: Arc<KeyCache>) -> Arc<Webhooks> {
        let cap = config.webhook_queue_events.max(1);
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let stats = Arc::new(WebhookStats::default());
        let scheduler = Scheduler {
            rx,
            keys: keys.clone(),
            stats: stats.clone(),
            queues: Queues::new(cap),
            senders: HashMap::new(),
            trouble_log: LogLimit::new(),
            allow_private: config.webhook_allow_private_addresses,
        };
        if let Err(e) = std::thread::Builder::new()
            .name("ringcast-webhooks".into())
            .spawn(move || scheduler.run())
        {
            tracing::error!(error = %e, "cannot start the webhook sender: webhooks are dropped");
        }
        Arc::new(Webhooks {
            keys,
            tx,
            stats,
            drop_log: LogLimit::new(),
        })
    }

    /// Whether `project` (its dense index) has a webhook that sends `kind` events.
    pub(crate) fn wants(&self, project: u32, kind: HookKind) -> bool {
        self.keys
            .load()
            .webhook(project)
            .is_some_and(|w| w.events.contains(kind))
    }

    /// Queue `event` of `project` for its webhook. Never blocks; a project without a
    /// webhook, or not wanting this kind, costs one snapshot read.
    pub(crate) fn emit(&self, project: u32, event: HookEvent) {
        if self.wants(project, event.kind()) {
            self.enqueue(project, event);
        }
    }

    /// Hand an event that is wanted to the scheduler, or count and log its drop.
    fn enqueue(&self, project: u32, event: HookEvent) {
        let queued = Queued {
            project,
            at: Instant::now(),
            event,
        };
        if let Err(e) = self.tx.try_send(queued) {
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            if self.drop_log.allow() {
                let why = match e {
                    TrySendError::Full(_) => "the webhook queue is full (webhook_queue_events)",
                    TrySendError::Disconnected(_) => "the webhook sender is not running",
                };
                tracing::warn!(
                    dropped_total = self.stats.dropped_queue_full.load(Ordering::Relaxed),
                    "webhook event dropped: {why}"
                );
            }
        }
    }

    /// The counters for the metrics scrape.
    pub(crate) fn stats(&self) -> &WebhookStats {
        &self.stats
    }
}

/// The presence hub's transitions become webhook events; the strings are copied only
/// for a project whose webhook wants that kind.
impl crate::presence::Transitions for Webhooks {
    fn occupied(&self, project: u32, channel: &str) {
        if self.wants(project, HookKind::ChannelOccupied) {
            let channel = channel.into();
            self.enqueue(project, HookEvent::ChannelOccupied { channel });
        }
    }

    fn vacated(&self, project: u32, channel: &str) {
        if self.wants(project, HookKind::ChannelVacated) {
            let channel = channel.into();
            self.enqueue(project, HookEvent::ChannelVacated { channel });
        }
    }

    fn member_added(&self, project: u32, channel: &str, user_id: &str) {
        if self.wants(project, HookKind::MemberAdded) {
            let (channel, user_id) = (channel.into(), user_id.into());
            self.enqueue(project, HookEvent::MemberAdded { channel, user_id });
        }
    }

    fn member_removed(&self, project: u32, channel: &str, user_id: &str) {
        if self.wants(project, HookKind::MemberRemoved) {
            let (channel, user_id) = (channel.into(), user_id.into());
            self.enqueue(project, HookEvent::MemberRemoved { channel, user_id });
        }
    }
}

/// A project's sender thread, as the scheduler sees it.
struct SenderHandle {
    jobs: Sender<Dispatch>,
    last_used: Instant,
}

struct Scheduler {
    rx: Receiver<Queued>,
    keys: Arc<KeyCache>,
    stats: Arc<WebhookStats>,
    queues: Queues,
    senders: HashMap<u32, SenderHandle>,
    trouble_log: LogLimit,
    /// `webhook_allow_private_addresses`: the senders' address policy is off.
    allow_private: bool,
}

impl Scheduler {
    fn run(mut self) {
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<(u32, Outcome)>();
        loop {
            let now = Instant::now();
            let wait = self
                .queues
                .next_wakeup()
                .map_or(SENDER_IDLE, |t| t.saturating_duration_since(now))
                .min(SENDER_IDLE);
            crossbeam_channel::select! {
                recv(self.rx) -> msg => {
                    let Ok(first) = msg else {
                        // The node dropped its `Webhooks`: the process is ending.
                        return;
                    };
                    self.push(first);
                    // Take the whole burst before deciding what is due.
                    while let Ok(more) = self.rx.try_recv() {
                        self.push(more);
                    }
                }
                recv(done_rx) -> done => {
                    if let Ok((project, outcome)) = done {
                        self.finished(project, outcome);
                    }
                }
                default(wait) => {}
            }
            let now = Instant::now();
            for dispatch in self.queues.due(now) {
                self.dispatch(dispatch, &done_tx, now);
            }
            let queues = &self.queues;
            self.senders.retain(|project, s| {
                queues.in_flight(*project) || now.duration_since(s.last_used) < SENDER_IDLE
            });
        }
    }

    fn push(&mut self, q: Queued) {
        if self.queues.push(q.project, q.at, q.event) == Pushed::Full {
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            if self.trouble_log.allow() {
                tracing::warn!(
                    project_index = q.project,
                    dropped_total = self.stats.dropped_queue_full.load(Ordering::Relaxed),
                    "webhook event dropped: the project's webhook queue is full (webhook_queue_events)"
                );
            }
        }
    }

    fn finished(&mut self, project: u32, outcome: Outcome) {
        match outcome {
            Outcome::Delivered => self.stats.requests_ok.fetch_add(1, Ordering::Relaxed),
            Outcome::Failed => self.stats.requests_failed.fetch_add(1, Ordering::Relaxed),
            Outcome::Off => 0,
        };
        match self.queues.finished(project, outcome, Instant::now()) {
            Next::GaveUp(n) => {
                self.stats
                    .dropped_retries_exhausted
                    .fetch_add(n as u64, Ordering::Relaxed);
                tracing::warn!(
                    project_index = project,
                    events = n,
                    "webhook request given up after 5 minutes of retries; its events are dropped"
                );
            }
            Next::Forgotten(n) if n > 0 => {
                tracing::info!(
                    project_index = project,
                    events = n,
                    "webhook turned off: its queued events are dropped"
                );
            }
            _ => {}
        }
    }

    /// Hand a request to the project's sender thread, making one if needed.
    fn dispatch(&mut self, dispatch: Dispatch, done: &Sender<(u32, Outcome)>, now: Instant) {
        let project = dispatch.project;
        if let Some(sender) = self.senders.get_mut(&project) {
            sender.last_used = now;
            // One request in flight per project, so the slot is always free.
            match sender.jobs.try_send(dispatch) {
                Ok(()) => return,
                Err(e) => {
                    self.senders.remove(&project);
                    return self.spawn_sender(e.into_inner(), done, now);
                }
            }
        }
        self.spawn_sender(dispatch, done, now);
    }

    fn spawn_sender(&mut self, dispatch: Dispatch, done: &Sender<(u32, Outcome)>, now: Instant) {
        let project = dispatch.project;
        let (jobs, rx) = crossbeam_channel::bounded::<Dispatch>(1);
        let keys = self.keys.clone();
        let done = done.clone();
        let allow_private = self.allow_private;
        let spawned = std::thread::Builder::new()
            .name(format!("ringcast-hook-{project}"))
            .spawn(move || sender_loop(project, rx, done, keys, allow_private));
        match spawned {
            Ok(_) => {
                // The channel is empty and its receiver alive: this cannot fail.
                let _ = jobs.try_send(dispatch);
                self.senders.insert(
                    project,
                    SenderHandle {
                        jobs,
                        last_used: now,
                    },
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a webhook sender thread; retrying");
                // Counted as a failed attempt, so the batch is retried with backoff.
                self.finished(project, Outcome::Failed);
            }
        }
    }
}

/// A project's sender thread: one attempt at a time, each reported to the scheduler.
/// Ends when the scheduler drops its end (idle for a minute, or shutting down).
fn sender_loop(
    project: u32,
    jobs: Receiver<Dispatch>,
    done: Sender<(u32, Outcome)>,
    keys: Arc<KeyCache>,
    allow_private: bool,
) {
    let agent = send::agent(allow_private);
    let mut last_log: Option<Instant> = None;
    while let Ok(job) = jobs.recv() {
        let (outcome, failure) = send::attempt(&agent, &keys, project, &job.batch.events_json);
        if let Some(failure) = failure {
            if last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                last_log = Some(Instant::now());
                tracing::warn!(
                    project_index = project,
                    attempt = job.attempt,
                    events = job.batch.count,
                    "webhook request failed ({failure}); it is retried"
                );
            }
        }
        if done.send((project, outcome)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_encode_as_pusher_sends_them() {
        let v = |e: HookEvent| serde_json::from_str::<serde_json::Value>(&e.to_json()).unwrap();
        assert_eq!(
            v(HookEvent::ChannelOccupied {
                channel: "news".into()
            }),
            serde_json::json!({"name": "channel_occupied", "channel": "news"})
        );
        assert_eq!(
            v(HookEvent::MemberRemoved {
                channel: "presence-r".into(),
                user_id: "u\"1".into()
            }),
            serde_json::json!({"name": "member_removed", "channel": "presence-r", "user_id": "u\"1"})
        );
        // Object data is sent as its JSON text; string data as the string itself.
        assert_eq!(
            v(HookEvent::ClientEvent {
                channel: "presence-r".into(),
                event: "client-typing".into(),
                data: "{\"a\":[1,\"é\"]}".into(),
                socket_id: "123.456".into(),
                user_id: Some("u1".into()),
            }),
            serde_json::json!({"name": "client_event", "channel": "presence-r",
                "event": "client-typing", "data": "{\"a\":[1,\"é\"]}",
                "socket_id": "123.456", "user_id": "u1"})
        );
        assert_eq!(
            v(HookEvent::ClientEvent {
                channel: "private-r".into(),
                event: "client-x".into(),
                data: "\"hi \\\"there\\\"\"".into(),
                socket_id: "1.2".into(),
                user_id: None,
            }),
            serde_json::json!({"name": "client_event", "channel": "private-r",
                "event": "client-x", "data": "hi \"there\"", "socket_id": "1.2"})
        );
    }

    /// A `Webhooks` whose scheduler is not running: the test reads its queue.
    fn detached(keys: Arc<KeyCache>, cap: usize) -> (Webhooks, Receiver<Queued>) {
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let hooks = Webhooks {
            keys,
            tx,
            stats: Arc::default(),
            drop_log: LogLimit::new(),
        };
        (hooks, rx)
    }

    /// A test project with a webhook for `events`, or none.
    fn record(
        id: &str,
        events: Option<crate::project::HookKinds>,
    ) -> crate::project::ProjectRecord {
        crate::project::ProjectRecord {
            webhook: events.map(|events| crate::project::WebhookSpec {
                url: "http://127.0.0.1:9/".into(),
                events,
            }),
            ..crate::project::test_project(id)
        }
    }

    #[test]
    fn emit_queues_only_what_a_webhook_wants_and_counts_what_does_not_fit() {
        use crate::project::HookKinds;
        use crate::store::StoreContents;
        let keys = KeyCache::new();
        keys.rebuild(StoreContents {
            projects: vec![
                record("prj_none", None),
                record("prj_default", Some(HookKinds::DEFAULT)),
            ],
            ..StoreContents::default()
        });
        let (none, default) = {
            let snap = keys.load();
            (
                snap.project("prj_none").unwrap().index,
                snap.project("prj_default").unwrap().index,
            )
        };
        let (hooks, rx) = detached(keys, 2);
        let occupied = |c: &str| HookEvent::ChannelOccupied { channel: c.into() };
        let client = HookEvent::ClientEvent {
            channel: "private-a".into(),
            event: "client-x".into(),
            data: "{}".into(),
            socket_id: "1".into(),
            user_id: None,
        };
        assert!(!hooks.wants(none, HookKind::ChannelOccupied));
        assert!(!hooks.wants(default, HookKind::ClientEvent));
        assert!(hooks.wants(default, HookKind::MemberRemoved));
        assert!(
            !hooks.wants(999, HookKind::ChannelOccupied),
            "unknown index"
        );
        hooks.emit(none, occupied("a"));
        hooks.emit(default, client);
        assert!(rx.is_empty(), "not wanted: not queued");
        hooks.emit(default, occupied("a"));
        hooks.emit(default, occupied("b"));
        hooks.emit(default, occupied("c"));
        assert_eq!(rx.len(), 2);
        assert_eq!(hooks.stats().dropped_queue_full.load(Ordering::Relaxed), 1);
        let first = rx.try_recv().unwrap();
        assert_eq!((first.project, first.event), (default, occupied("a")));
    }

    /// What a caller pays per transition: `wants` for a project without a webhook (the
    /// common case), and `emit` of a wanted event into the queue.
    #[test]
    #[ignore = "a measurement: cargo test --release --lib webhook::tests::emit_cost -- --ignored --nocapture"]
    fn emit_cost() {
        use crate::project::HookKinds;
        use crate::store::StoreContents;
        let keys = KeyCache::new();
        let projects = (0..1000)
            .map(|i| {
                record(
                    &format!("prj_{i}"),
                    (i == 999).then_some(HookKinds::DEFAULT),
                )
            })
            .collect();
        keys.rebuild(StoreContents {
            projects,
            ..StoreContents::default()
        });
        let (plain, hooked) = {
            let snap = keys.load();
            (
                snap.project("prj_0").unwrap().index,
                snap.project("prj_999").unwrap().index,
            )
        };
        const N: u32 = 1_000_000;
        let (hooks, rx) = detached(keys, N as usize);
        let start = Instant::now();
        let mut wanted = 0;
        for _ in 0..N {
            wanted +=
                u32::from(hooks.wants(std::hint::black_box(plain), HookKind::ChannelOccupied));
        }
        let no_hook = start.elapsed() / N;
        assert_eq!(wanted, 0);
        let start = Instant::now();
        for _ in 0..N {
            hooks.emit(
                hooked,
                HookEvent::ChannelOccupied {
                    channel: "news".into(),
                },
            );
        }
        let queued = start.elapsed() / N;
        assert_eq!(rx.len(), N as usize);
        println!("wants, no webhook: {no_hook:?}/call; emit into the queue (event built, wants, try_send): {queued:?}/call");
    }

    #[test]
    fn the_log_limit_lets_one_line_through_per_period() {
        let limit = LogLimit::new();
        assert!(limit.allow());
        assert!(!limit.allow());
        assert!(!limit.allow());
    }
}
