//! One core's share of the data plane: the [`Shard`] owns this worker's subscription
//! table ([`registry`]), its WebSocket connections, its mailbox ([`mailbox`], the only
//! cross-core path), admission (the open-connection bound) and its stop state
//! ([`stop`]); [`interest`] publishes which channels it has subscribers for.
//!
//! Invariants:
//! - A broadcast is looked up once per worker and its one `Bytes` frame is handed to
//!   each local subscriber by reference count; nothing is allocated or copied per
//!   subscriber, and a full or slow subscriber never delays the others (its own bounded
//!   queue decides, see `ws::conn`).
//! - Registry transitions (first subscriber of a channel here, last one gone) are turned
//!   into interest-filter and cluster updates in exactly one place: [`Shard::subscribe`]
//!   and [`Shard::unsubscribe`].
//! - Everything here is thread-local (`Rc`, `RefCell`, `Cell`): the type system keeps a
//!   shard on its own core. Nothing here knows HTTP, keys' text, or the client protocol's
//!   frames; the transport below (`ws`) knows no project.

// The bench feature re-exports the fan-out and mailbox types; without it they are
// crate-private in effect.
#![cfg_attr(not(feature = "bench"), allow(unreachable_pub))]

mod dialect;
mod fanout;
pub(crate) mod interest;
mod join;
pub(crate) mod mailbox;
mod members;
pub(crate) mod registry;
pub(crate) mod stop;
mod subscribers;
mod upkeep;
pub(crate) mod users;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::auth::{KeyCache, ProjectState};
use crate::close::Disconnect;
use crate::history::History;
use crate::ws::conn::{OwnFrame, WorkerBacklog, WsConn};
use crate::ws::frame::{self, Opcode};

use interest::channel_hash;
use mailbox::{Broadcast, Envelope, Mailbox};
use members::{KeyId, Member, Members};
use registry::{Registry, Subscribed, Unsubscribed};
use stop::StopSignal;

#[cfg(feature = "bench")]
pub use fanout::fan_out;
use fanout::{fan_out_skipping, Pick};
pub(crate) use join::{JoinRequest, Presence, PresenceRefusal, PresenceReply};

/// Told when this core gains its first subscriber of a channel or loses its last one
/// (cluster mode: the node subscribes in Redis only to channels someone here wants).
/// Called on a worker, at most once per transition, never on the fan-out path: it must
/// not block.
///
/// For a gain (`on`), the sink must later put [`Envelope::InterestReady`] with the same
/// `ticket` into worker `worker`'s mailbox, once the node receives the channel's
/// messages from the other nodes (or cannot: Redis away). Until then the shard holds the
/// `subscribed` replies of that channel, so a client told `subscribed` misses no
/// message published anywhere in the cluster after it.
pub(crate) trait InterestSink: Send + Sync {
    fn interest(&self, worker: usize, project: u32, channel: &str, on: bool, ticket: u64);

    /// Cluster mode: a subscribe to a channel of a history project, whose position
    /// (and replay) only Redis knows. Counts as a gain of interest (`on`) for the
    /// channel; the sink answers with [`Envelope::HistoryReady`] carrying `ticket` in
    /// worker `worker`'s mailbox, placed after every message the position covers and
    /// before any later one. `false`: not in cluster mode (the node's history decides).
    fn history_subscribe(&self, _req: HistorySubscribe) -> bool {
        false
    }
}

/// Told of every change in this worker's subscriber count of a channel, asked for every
/// presence join, and told of every presence channel a connection leaves or gives up
/// joining (the node's presence and occupancy hub). Called on a worker at subscribe and
/// unsubscribe, never on the fan-out path; it must not block.
pub(crate) trait ChannelWatch: Send + Sync {
    /// `delta` is +1 (a connection subscribed) or -1 (one left).
    fn count(&self, worker: usize, project: u32, channel: &str, delta: i32);
    /// Add a connection to a presence channel's members: the answer comes back as
    /// [`Envelope::PresenceReady`] with the join's ticket in worker `join.worker`'s
    /// mailbox (`Shard::join` waits for it).
    fn join(&self, join: PresenceJoin);
    /// Connection `conn` of worker `worker` is no longer in (nor joining) a presence
    /// channel. Said for every way a subscription ends, whether or not it was live.
    fn leave(&self, worker: usize, conn: u64, project: u32, channel: &str);
}

/// A connection asks to join a presence channel (its credential was verified).
pub(crate) struct PresenceJoin {
    pub project: u32,
    pub channel: Box<str>,
    pub user_id: Box<str>,
    /// The credential's `info` as compact JSON text (an object).
    pub info: Option<Box<str>>,
    pub worker: usize,
    pub conn: u64,
    /// The shard's ticket for the answer.
    pub ticket: u64,
}

/// Channels with members: presence channels.
pub(crate) fn is_presence(channel: &str) -> bool {
    channel.starts_with("presence-")
}

/// Replies held until the cluster confirmed a channel's subscription (see
/// [`InterestSink`]). Lives only for the Redis round trip of a first subscriber.
struct Awaiting {
    project: u32,
    channel: Box<str>,
    ticket: u64,
    replies: Vec<(Rc<WsConn>, Held)>,
}

/// A frame waiting behind a cluster confirmation: the connection's own reply, or a
/// broadcast of the channel that arrived before that reply could go out (it must not
/// overtake the `subscribed` it follows).
enum Held {
    Own(OwnFrame),
    Shared(Bytes),
}

impl Held {
    fn send(self, conn: &Rc<WsConn>) -> bool {
        match self {
            Held::Own(frame) => conn.send(frame),
            Held::Shared(frame) => conn.send_shared(&frame),
        }
    }
}

/// A cluster-mode subscribe to a history channel, for the sink.
#[derive(Debug)]
pub(crate) struct HistorySubscribe {
    pub worker: usize,
    pub ticket: u64,
    pub project: u32,
    pub channel: Box<str>,
    /// The client's `since` (offset, epoch).
    pub since: Option<(u64, Box<str>)>,
    pub size: u32,
    pub ttl_s: u32,
    /// Most bytes a replay may queue (see `WsConn::cost_of`).
    pub budget: usize,
}

/// `size_of` of a member's entry, for the per-connection budget (`http::upgrade::sizes`).
#[cfg(test)]
pub(crate) const MEMBER_SIZE: usize = members::ENTRY_SIZE;

/// What a shard needs from the node at start.
pub(crate) struct ShardSetup {
    pub index: usize,
    pub keys: Arc<KeyCache>,
    pub mailbox: Arc<Mailbox>,
    pub sink: Option<Arc<dyn InterestSink>>,
    /// Open connections (HTTP and WebSocket) this worker accepts at once.
    pub max_connections: usize,
    /// The node's channel history (subscribes to history channels read it).
    pub history: Arc<History>,
    /// Bytes all this worker's WebSocket queues may hold (`worker_send_budget_bytes`).
    pub send_budget: usize,
    /// Subscriptions this worker holds at most (`max_subscriptions_per_worker`).
    pub max_subscriptions: usize,
    /// The node's presence and occupancy hub.
    pub watch: Option<Arc<dyn ChannelWatch>>,
}

/// One worker's data-plane state.
pub(crate) struct Shard {
    index: usize,
    keys: Arc<KeyCache>,
    mailbox: Arc<Mailbox>,
    sink: Option<Arc<dyn InterestSink>>,
    registry: RefCell<Registry>,
    members: RefCell<Members>,
    /// The key ids `members` hold, one string each (pruned at each revocation sweep of
    /// the ids no member holds any more).
    key_ids: RefCell<HashSet<KeyId>>,
    /// Channels whose first local subscriber waits for the cluster (few, short-lived:
    /// a linear scan is cheaper than hashing a channel name).
    awaiting: RefCell<Vec<Awaiting>>,
    next_ticket: Cell<u64>,
    backlog: Rc<WorkerBacklog>,
    max_subscriptions: usize,
    max_connections: usize,
    open: Cell<usize>,
    /// (connection, channel) subscriptions on this worker, for the metrics gauge and
    /// `max_subscriptions_per_worker`.
    subscriptions: Cell<usize>,
    next_conn: Cell<u64>,
    started: Instant,
    stop: StopSignal,
    history: Arc<History>,
    /// Joins waiting for Redis or the presence hub (`join`).
    pending: RefCell<Vec<join::Pending>>,
    watch: Option<Arc<dyn ChannelWatch>>,
    /// Connections with a user, by project and user (`users`).
    users: RefCell<users::Users>,
}

/// One admitted connection; the shard's open count drops when it does.
pub(crate) struct ConnGuard(Rc<Shard>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get().saturating_sub(1));
    }
}

/// One of a project's WebSocket connections on this node; released on drop.
pub(crate) struct ProjectSlot(Arc<AtomicUsize>);

impl ProjectSlot {
    /// Take a slot unless the project is at `limit` (0 = unlimited).
    pub(crate) fn take(counter: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        let prev = counter.fetch_add(1, Ordering::AcqRel);
        if limit > 0 && prev >= limit {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ProjectSlot(counter.clone()))
    }
}

impl Drop for ProjectSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shard {
    pub(crate) fn new(setup: ShardSetup) -> Shard {
        Shard {
            index: setup.index,
            keys: setup.keys,
            mailbox: setup.mailbox,
            sink: setup.sink,
            registry: RefCell::new(Registry::new()),
            members: RefCell::new(Members::with_capacity(setup.max_connections)),
            key_ids: RefCell::default(),
            awaiting: RefCell::new(Vec::new()),
            next_ticket: Cell::new(0),
            backlog: Rc::new(WorkerBacklog::new(setup.send_budget)),
            max_subscriptions: setup.max_subscriptions,
            max_connections: setup.max_connections,
            open: Cell::new(0),
            subscriptions: Cell::new(0),
            next_conn: Cell::new(0),
            started: Instant::now(),
            stop: StopSignal::default(),
            history: setup.history,
            pending: RefCell::new(Vec::new()),
            watch: setup.watch,
            users: RefCell::default(),
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Whether this node has a presence hub: a presence channel's join then waits for
    /// its member list (see [`Shard::join`]); without one it is a private channel.
    pub(crate) fn has_presence_hub(&self) -> bool {
        self.watch.is_some()
    }

    /// The node's key snapshot holder (the client protocol verifies tokens with it).
    pub(crate) fn keys(&self) -> &Arc<KeyCache> {
        &self.keys
    }

    /// Coarse worker clock in seconds (heartbeat bookkeeping).
    pub(crate) fn clock(&self) -> u32 {
        self.started.elapsed().as_secs() as u32
    }

    /// Count a new connection, or `None` when the worker is at its limit.
    pub(crate) fn admit(self: &Rc<Self>) -> Option<ConnGuard> {
        if self.open.get() >= self.max_connections {
            return None;
        }
        self.open.set(self.open.get() + 1);
        Some(ConnGuard(self.clone()))
    }

    pub(crate) fn next_conn_id(&self) -> u64 {
        let id = self.next_conn.get() + 1;
        self.next_conn.set(id);
        id
    }

    /// Whether this worker may take one more subscription (`max_subscriptions_per_worker`).
    pub(crate) fn subscriptions_full(&self) -> bool {
        self.subscriptions.get() >= self.max_subscriptions
    }

    /// Make a WebSocket known to the shard (revocation, heartbeat, shutdown reach it)
    /// and count its queue against the worker's budget.
    ///
    /// The key is checked again here: it was checked when the upgrade was decided, and
    /// a revocation swept this shard's sockets in between would have missed this one.
    /// The snapshot is swapped before the sweep is queued, and both run on this thread,
    /// so after this check no revocation can miss the connection.
    pub(crate) fn register(
        &self,
        conn: Rc<WsConn>,
        key_id: Box<str>,
        pusher: Option<Arc<ProjectState>>,
    ) {
        conn.attach_budget(self.backlog.clone());
        if self.stop.is_set() {
            conn.close(Disconnect::SHUTDOWN);
        } else if !self.keys.load().is_active(&key_id)
            || pusher.as_ref().is_some_and(|p| !p.pusher_enabled())
        {
            conn.close(Disconnect::KEY_REVOKED);
        }
        let key_id = self.intern_key_id(&key_id);
        let mut members = self.members.borrow_mut();
        members.insert(Member {
            conn,
            key_id,
            pusher,
        });
        let open = members.len();
        crate::metrics::with(|m| m.set_connections(open));
    }

    /// The worker's one copy of `key_id`.
    fn intern_key_id(&self, key_id: &str) -> KeyId {
        let mut ids = self.key_ids.borrow_mut();
        if let Some(id) = ids.get(key_id) {
            return id.clone();
        }
        let id = KeyId::new(key_id);
        ids.insert(id.clone());
        id
    }

    /// Forget a WebSocket whose connection ended.
    pub(crate) fn remove(&self, conn: &WsConn) {
        let mut members = self.members.borrow_mut();
        members.remove(conn);
        let open = members.len();
        crate::metrics::with(|m| m.set_connections(open));
    }

    /// Mirror a change of this worker's subscription count into its metrics gauge.
    fn count_subscriptions(&self, delta: isize) {
        let n = self.subscriptions.get().saturating_add_signed(delta);
        self.subscriptions.set(n);
        crate::metrics::with(|m| m.set_subscriptions(n));
    }

    /// A snapshot of the registered WebSockets, for a pass that may close some (closing
    /// must not happen while the table is borrowed).
    fn websocket_list(&self) -> Vec<Rc<WsConn>> {
        self.members
            .borrow()
            .iter()
            .map(|m| m.conn.clone())
            .collect()
    }

    /// Registered WebSockets.
    pub(crate) fn websockets(&self) -> usize {
        self.members.borrow().len()
    }

    /// Subscribe `conn` to a project's channel, mirroring a first subscriber into the
    /// interest filter and the cluster. In cluster mode a first subscriber opens a wait
    /// for the cluster's confirmation: the frames given to [`Shard::reply_when_live`]
    /// for that channel (its `subscribed`, a replay) are held until then (see
    /// [`InterestSink`]).
    pub(crate) fn subscribe(&self, project: u32, channel: &str, conn: &Rc<WsConn>) -> Subscribed {
        let t = self.registry.borrow_mut().subscribe(project, channel, conn);
        if t != Subscribed::Already {
            self.count_subscriptions(1);
            if let Some(watch) = &self.watch {
                watch.count(self.index, project, channel, 1);
            }
        }
        if t == Subscribed::First {
            self.mailbox.interest.add(channel_hash(project, channel));
            if let Some(sink) = &self.sink {
                let ticket = self.new_ticket();
                self.awaiting.borrow_mut().push(Awaiting {
                    project,
                    channel: channel.into(),
                    ticket,
                    replies: Vec::new(),
                });
                sink.interest(self.index, project, channel, true, ticket);
            }
        }
        t
    }

    /// Send `reply` to `conn` now, or after the channel's pending cluster confirmation
    /// (a later subscriber, or a repeated subscribe, never overtakes the first one).
    pub(crate) fn reply_when_live(
        &self,
        project: u32,
        channel: &str,
        conn: &Rc<WsConn>,
        reply: impl Into<OwnFrame>,
    ) -> bool {
        let mut awaiting = self.awaiting.borrow_mut();
        match awaiting
            .iter_mut()
            .find(|a| a.project == project && &*a.channel == channel)
        {
            Some(a) => {
                a.replies.push((conn.clone(), Held::Own(reply.into())));
                true
            }
            None => {
                drop(awaiting);
                conn.send(reply)
            }
        }
    }

    /// The cluster confirmed the subscription given `ticket`: release its replies.
    fn interest_ready(&self, project: u32, channel: &str, ticket: u64) {
        let mut awaiting = self.awaiting.borrow_mut();
        let Some(pos) = awaiting
            .iter()
            .position(|a| a.project == project && &*a.channel == channel && a.ticket == ticket)
        else {
            return;
        };
        let done = awaiting.swap_remove(pos);
        drop(awaiting);
        for (conn, held) in done.replies {
            held.send(&conn);
        }
    }

    /// Send at once the held reply of `conn` on a channel it is leaving, so that its
    /// `subscribed` still comes before its `unsubscribed`.
    fn release_held(&self, project: u32, channel: &str, conn_id: u64, last: bool) {
        let mut awaiting = self.awaiting.borrow_mut();
        let Some(pos) = awaiting
            .iter()
            .position(|a| a.project == project && &*a.channel == channel)
        else {
            return;
        };
        let a = &mut awaiting[pos];
        let (mut held, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut a.replies)
            .into_iter()
            .partition(|(c, _)| c.id == conn_id);
        a.replies = kept;
        if last {
            // Nobody is left to wait for it; a later first subscriber gets a new ticket.
            held.extend(awaiting.swap_remove(pos).replies);
        }
        drop(awaiting);
        for (conn, frame) in held {
            frame.send(&conn);
        }
    }

    /// Unsubscribe, mirroring a last subscriber gone into the interest filter and the
    /// cluster.
    pub(crate) fn unsubscribe(&self, project: u32, channel: &str, conn_id: u64) -> Unsubscribed {
        self.leave(project, channel, conn_id).0
    }

    /// [`Shard::unsubscribe`], also saying whether a join of the channel was still
    /// waiting (and is cancelled): the session holds such a channel as well, so whoever
    /// takes it from the connection (a server unsubscribe, an expiry) must tell it.
    pub(crate) fn leave(&self, project: u32, channel: &str, conn_id: u64) -> (Unsubscribed, bool) {
        let cancelled = self.cancel_pending(project, channel, conn_id);
        let t = self
            .registry
            .borrow_mut()
            .unsubscribe(project, channel, conn_id);
        if t != Unsubscribed::NotSubscribed {
            self.count_subscriptions(-1);
            if let Some(watch) = &self.watch {
                watch.count(self.index, project, channel, -1);
            }
        }
        if is_presence(channel) {
            if let Some(watch) = &self.watch {
                watch.leave(self.index, conn_id, project, channel);
            }
        }
        if self.sink.is_some() && t != Unsubscribed::NotSubscribed {
            self.release_held(project, channel, conn_id, t == Unsubscribed::Last);
        }
        if t == Unsubscribed::Last {
            self.mailbox.interest.remove(channel_hash(project, channel));
            if let Some(sink) = &self.sink {
                sink.interest(self.index, project, channel, false, 0);
            }
        }
        (t, cancelled)
    }

    /// Local subscribers of a channel.
    #[cfg(test)]
    pub(crate) fn subscriber_count(&self, project: u32, channel: &str) -> usize {
        self.registry
            .borrow()
            .subscribers(project, channel)
            .map_or(0, |s| s.len())
    }

    /// Whether anything waits in this shard's mailbox. Cheap: two atomic loads.
    pub(crate) fn has_mail(&self) -> bool {
        self.mailbox.has_mail()
    }

    /// Take and handle everything in the mailbox now; returns how many envelopes.
    ///
    /// Called by [`Shard::run_mailbox`], and also by busy connection tasks: monoio
    /// handles wake-ups from other threads only when its local run queue empties, so a
    /// worker kept busy by its own HTTP traffic would otherwise leave its mailbox (fed
    /// by the other cores) undrained until it fills. Draining there is safe: fan-out is
    /// synchronous and never awaits.
    pub(crate) fn drain(&self) -> usize {
        let mut n = 0;
        while let Some(envelope) = self.mailbox.try_recv() {
            n += 1;
            self.handle(envelope);
        }
        n
    }

    /// Take everything in the mailbox now without handling it: a history subscribe does
    /// this under the history lock (only moves, no fan-out) and hands the envelopes to
    /// [`Shard::handle`] after releasing it.
    pub(crate) fn take_mail(&self) -> Vec<Envelope> {
        let mut out = Vec::new();
        while let Some(envelope) = self.mailbox.try_recv() {
            out.push(envelope);
        }
        out
    }

    /// Handle one envelope taken from the mailbox.
    pub(crate) fn handle(&self, envelope: Envelope) {
        match envelope {
            Envelope::Broadcast(msg) => {
                let delivered = self.deliver(&self.registry.borrow(), &msg);
                // Once per broadcast per worker, never per subscriber.
                crate::metrics::with(|m| m.deliveries(delivered as u64));
            }
            Envelope::Batch(batch) => {
                let registry = self.registry.borrow();
                let delivered: usize = batch.iter().map(|msg| self.deliver(&registry, msg)).sum();
                // Once per envelope per worker.
                crate::metrics::with(|m| m.deliveries(delivered as u64));
            }
            Envelope::KeysChanged => self.enforce_revocations(),
            Envelope::Shutdown => self.begin_shutdown(),
            Envelope::InterestReady {
                project,
                channel,
                ticket,
            } => self.interest_ready(project, &channel, ticket),
            Envelope::HistoryReady { ticket, ready } => self.history_ready(ticket, ready),
            // Presence frames are not messages: not counted as deliveries.
            Envelope::Presence(msg) => {
                self.deliver(&self.registry.borrow(), &msg);
            }
            Envelope::PresenceReady { ticket, answer } => self.presence_ready(ticket, answer),
            Envelope::Run(task) => (task.0)(),
            Envelope::EndUser { project, user, end } => self.end_user(project, &user, &end),
        }
    }

    /// Fan a broadcast out; while a cluster confirmation of its channel is pending, the
    /// subscribers whose `subscribed` is held get the frame queued behind it instead.
    /// Outside that window (always, in single-node mode) this is one empty-Vec check.
    fn deliver(&self, registry: &Registry, msg: &Broadcast) -> usize {
        let mut awaiting = self.awaiting.borrow_mut();
        let Some(a) = awaiting
            .iter_mut()
            .find(|a| a.project == msg.project && a.channel == msg.channel)
        else {
            drop(awaiting);
            return fan_out_skipping(registry, msg, msg.skip_on(self.index));
        };
        let Some(subs) = registry.subscribers(msg.project, &msg.channel) else {
            return 0;
        };
        let skip = msg.skip_on(self.index);
        let mut waiting: Vec<u64> = a.replies.iter().map(|(c, _)| c.id).collect();
        waiting.sort_unstable();
        let mut delivered = 0;
        let mut pick = Pick::new(msg);
        for conn in subs.values() {
            if conn.id == skip {
                continue;
            }
            let Some(frame) = pick.frame(conn) else {
                continue;
            };
            if waiting.binary_search(&conn.id).is_ok() {
                // Counted where chosen, like a frame sent at once (it leaves once the
                // held `subscribed` does; a connection closing meanwhile is rare).
                a.replies.push((conn.clone(), Held::Shared(frame.clone())));
                pick.sent(conn.dialect(), frame);
                delivered += 1;
            } else if conn.send_shared(frame) {
                pick.sent(conn.dialect(), frame);
                delivered += 1;
            }
        }
        pick.count();
        delivered
    }

    /// Make publishes of a channel reach this worker's mailbox before it has a
    /// subscriber (one count in the interest filter); [`Shard::release_interest`] takes
    /// the count back once the subscriber holds its own.
    pub(crate) fn hold_interest(&self, project: u32, channel: &str) {
        self.mailbox.interest.add(channel_hash(project, channel));
    }

    pub(crate) fn release_interest(&self, project: u32, channel: &str) {
        self.mailbox.interest.remove(channel_hash(project, channel));
    }
}

#[cfg(test)]
pub(crate) mod tests;
