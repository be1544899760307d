//! Cluster mode: the bridge between this node's workers and the other nodes, through
//! Redis pub/sub. The bridge is "just another producer" into the same per-worker
//! mailboxes as local publishes.
//!
//! Two control-plane threads, each with its own Redis connection (workers never touch
//! Redis and never wait for it):
//! - [`outbound`] (`ringcast-relay`): every publish accepted on this node is queued here
//!   as the same `Arc<Broadcast>` the local workers got (a reference count, no copy, no
//!   allocation on the publish path) through a bounded crossbeam queue, and PUBLISHed to
//!   the Redis channel of its (project id, channel), in batches pipelined on one
//!   connection: one round trip per batch, not per message. A full queue drops the relay
//!   (counted) and never delays the publish: local subscribers are served regardless.
//! - [`inbound`] (`ringcast-subscribe`): SUBSCRIBEs to exactly the Redis channels that
//!   this node's clients want. Workers report a channel's first local subscriber and its
//!   last unsubscribe ([`Cluster::interest`]); the thread keeps a per-node refcount (how
//!   many workers want it), so Redis sees one subscription per node and channel, never
//!   one per client. Received messages from other nodes are pushed into every worker's
//!   mailbox with [`Mailboxes::broadcast`]; this node's own messages (which Redis echoes
//!   back) are skipped by origin id, so each publish is delivered exactly once per
//!   subscriber cluster-wide.
//!
//! - [`leases`] (`ringcast-quota`): tops up each project's leased share of the
//!   cluster-wide quota (blocks of tokens from an atomic Lua script; see
//!   [`crate::quota::lease`]).
//! - [`users`]: a user's disconnect or unsubscribe on every node, through the store
//!   (end records the key watcher of every process applies), not through pub/sub.
//! - [`history`] (`ringcast-history`): projects with history publish through Redis, not
//!   through the relay: one script call per request gives each message its offset, keeps
//!   it in the channel's stream and PUBLISHes it to every node, this one included
//!   (history messages are delivered from Redis on every node, so every subscriber sees
//!   offset order). The thread also serves REST history reads. A subscribe to a history
//!   channel is answered by the subscriber thread (`inbound`), which reads the position
//!   and replay once the channel's SUBSCRIBE is acknowledged.
//!
//! Faults: when either connection fails, [`Cluster::is_ok`] turns false (`/health`
//! answers 503 with `"cluster"` failing), the thread reconnects with capped, jittered
//! exponential backoff, and the inbound thread restores its subscriptions in batches of
//! [`RESUBSCRIBE_BATCH`] channels per SUBSCRIBE. Messages published while Redis is away
//! are delivered locally and not relayed (Redis pub/sub has no replay): cross-node
//! delivery is at most once across an outage and exactly once otherwise.
//!
//! Ordering: one publisher connection's publishes are accepted in order on one worker,
//! queued in order on one relay queue, published in order on one Redis connection and
//! received in order on one subscriber connection, so subscribers on every node see
//! them in publish order per channel.

mod backend;
pub(crate) mod history;
pub(crate) mod idempotency;
pub(crate) mod inbound;
pub(crate) mod leases;
pub(crate) mod outbound;
pub(crate) mod users;

// The relay's payloads and frame checks (`crate::wire::relay`), under the name the
// bridge's files import them by (`super::wire`).
use crate::wire::relay as wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::auth::KeyCache;
use crate::shard::mailbox::{Broadcast, Mailboxes};

/// Relays waiting for the outbound thread. At ~1 µs per pipelined PUBLISH this is tens
/// of milliseconds of backlog: more would only deliver stale messages after a stall.
pub(crate) const RELAY_QUEUE: usize = 16_384;
/// Most PUBLISH commands in one pipeline.
pub(crate) const MAX_BATCH: usize = 512;

/// Wait for the next request of a Redis writer thread and take what else is queued, up
/// to [`MAX_BATCH`], so that one pipelined round trip serves them all. While idle, ping
/// Redis every [`IO_TIMEOUT`] so that health tells the truth. `Ok(false)`: the senders
/// are gone (shutdown); an error means the connection is lost.
pub(crate) fn next_batch<T>(
    conn: &mut redis::Connection,
    rx: &Receiver<T>,
    batch: &mut Vec<T>,
) -> redis::RedisResult<bool> {
    loop {
        match rx.recv_timeout(IO_TIMEOUT) {
            Ok(first) => {
                batch.push(first);
                break;
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                redis::cmd("PING").query::<()>(conn)?;
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(false),
        }
    }
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
    Ok(true)
}
/// Channels per SUBSCRIBE when restoring after a reconnect (no storm of single commands,
/// no single enormous command either).
pub(crate) const RESUBSCRIBE_BATCH: usize = 256;
pub(crate) use crate::redis_link::{connect, Backoff, BRIDGE_IO_TIMEOUT as IO_TIMEOUT};
#[cfg(test)]
use crate::redis_link::{MAX_BACKOFF, MIN_BACKOFF};

/// Why the cluster bridge could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    /// No Redis client from the URL and CA file (the message says which).
    #[error(transparent)]
    Link(#[from] crate::redis_link::LinkError),
    #[error("cannot start cluster thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// A change of this node's interest in a (project, channel): sent by a worker when its
/// first local subscriber arrives (`on`) or its last one leaves.
#[derive(Debug)]
pub(crate) struct Interest {
    /// The worker that reported it (and that waits for the confirmation of a gain).
    pub worker: usize,
    pub project: u32,
    pub channel: Box<str>,
    pub on: bool,
    /// The worker's ticket for a gain, echoed in its `InterestReady`.
    pub ticket: u64,
    /// A history subscribe (always with `on`): the subscriber thread reads the
    /// channel's position once Redis acknowledged its SUBSCRIBE (see `inbound`).
    pub recover: Option<Box<crate::shard::HistorySubscribe>>,
}

/// Counters, for logs and metrics.
#[derive(Debug, Default)]
pub(crate) struct ClusterStats {
    pub relayed: AtomicU64,
    /// Relays dropped: the queue was full or Redis was away.
    pub relay_dropped: AtomicU64,
    pub received: AtomicU64,
    /// Remote messages dropped: a mailbox was full, or the project is unknown here.
    pub receive_dropped: AtomicU64,
    /// History publishes or reads Redis answered with something unexpected.
    pub history_errors: AtomicU64,
}

/// The handle workers and the server hold.
pub(crate) struct Cluster {
    node_id: u64,
    relay_tx: Sender<Arc<Broadcast>>,
    interest_tx: Sender<Interest>,
    history_tx: Sender<history::Request>,
    inbound_ok: AtomicBool,
    outbound_ok: AtomicBool,
    stop: AtomicBool,
    pub stats: ClusterStats,
}

impl Cluster {
    /// Start both bridge threads. Connection failures are not errors here: the threads
    /// keep retrying and health reports the cluster as failing meanwhile.
    pub(crate) fn start(
        url: &str,
        ca_file: Option<&std::path::Path>,
        keys: Arc<KeyCache>,
        mailboxes: Mailboxes,
    ) -> Result<(Arc<Cluster>, Vec<JoinHandle<()>>), ClusterError> {
        let client = crate::redis_link::client(url, ca_file)?;
        let (relay_tx, relay_rx) = crossbeam_channel::bounded(RELAY_QUEUE);
        // Unbounded on purpose: losing an interest change would silently cut a channel
        // off. Its size is bounded by subscribe/unsubscribe traffic, which the thread
        // drains every few milliseconds.
        let (interest_tx, interest_rx) = crossbeam_channel::unbounded();
        let (history_tx, history_rx) = crossbeam_channel::bounded(history::QUEUE);
        let cluster = Arc::new(Cluster {
            node_id: rand::random(),
            relay_tx,
            interest_tx,
            history_tx,
            inbound_ok: AtomicBool::new(false),
            outbound_ok: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stats: ClusterStats::default(),
        });
        let relay = spawn_outbound(&cluster, client.clone(), keys.clone(), relay_rx)?;
        let (c, k) = (cluster.clone(), keys.clone());
        let quota_client = client.clone();
        let quota = std::thread::Builder::new()
            .name("ringcast-quota".into())
            .spawn(move || leases::run(&c, &quota_client, &k))?;
        let (c, history_client) = (cluster.clone(), client.clone());
        let history = std::thread::Builder::new()
            .name("ringcast-history".into())
            .spawn(move || history::run(&c, &history_client, &history_rx))?;
        let subscribe = spawn_inbound(&cluster, client, keys, mailboxes, interest_rx)?;
        // The server watches these: each runs until `stop`, and one that ends before
        // ends the process (see `server::serve`).
        Ok((cluster, vec![relay, quota, history, subscribe]))
    }

    /// This node's random id, carried in every payload it publishes.
    pub(crate) fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Queue a locally accepted publish for the other nodes. Never blocks, never
    /// allocates (an `Arc` clone into a preallocated ring).
    pub(crate) fn relay(&self, msg: Arc<Broadcast>) {
        match self.relay_tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.relay_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether the relay queue has room for `frames` more relays now (at most the
    /// whole queue is asked for). A publish checks it before answering 202, so one
    /// large batch cannot make later accepted publishes be dropped silently; racing
    /// publishers can still overfill it by what they check at the same moment.
    pub(crate) fn relay_room(&self, frames: usize) -> bool {
        self.relay_tx.len() + frames.min(RELAY_QUEUE) <= RELAY_QUEUE
    }

    /// Hand a history publish or read to the history thread. `false` (the request's
    /// reply then answers [`history::Unreachable`]) when its queue is full.
    pub(crate) fn history(&self, request: history::Request) -> bool {
        self.history_tx.try_send(request).is_ok()
    }

    /// The pub/sub channel on which this node's recovery reads leave their markers.
    pub(crate) fn sync_channel(&self) -> String {
        format!("ringcast:sync:{:016x}", self.node_id)
    }

    /// Both Redis connections are up.
    pub(crate) fn is_ok(&self) -> bool {
        self.inbound_ok.load(Ordering::Relaxed) && self.outbound_ok.load(Ordering::Relaxed)
    }

    /// Ask both threads to exit (within about [`IO_TIMEOUT`]).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

fn spawn_outbound(
    cluster: &Arc<Cluster>,
    client: redis::Client,
    keys: Arc<KeyCache>,
    rx: Receiver<Arc<Broadcast>>,
) -> std::io::Result<JoinHandle<()>> {
    let cluster = cluster.clone();
    std::thread::Builder::new()
        .name("ringcast-relay".into())
        .spawn(move || outbound::run(&cluster, &client, &keys, &rx))
}

fn spawn_inbound(
    cluster: &Arc<Cluster>,
    client: redis::Client,
    keys: Arc<KeyCache>,
    mailboxes: Mailboxes,
    rx: Receiver<Interest>,
) -> std::io::Result<JoinHandle<()>> {
    let cluster = cluster.clone();
    std::thread::Builder::new()
        .name("ringcast-subscribe".into())
        .spawn(move || inbound::run(&cluster, &client, &keys, &mailboxes, &rx))
}

/// Sleep `d` in small steps, returning early when the cluster is stopping.
pub(crate) fn sleep_unless_stopped(cluster: &Cluster, d: Duration) {
    let deadline = std::time::Instant::now() + d;
    while !cluster.stopping() {
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}

/// A channel's first local subscriber on a worker (`on`) or its last one leaving, from
/// the shard. Called only on those transitions, never per client or per message.
///
/// A gain is confirmed back to the worker (`Envelope::InterestReady`) by the subscriber
/// thread once Redis acknowledged the SUBSCRIBE that covers it, or at once while Redis
/// is away (the worker then answers `subscribed` without cross-node delivery, which
/// returns with the reconnect).
impl crate::shard::InterestSink for Cluster {
    fn interest(&self, worker: usize, project: u32, channel: &str, on: bool, ticket: u64) {
        let _ = self.interest_tx.send(Interest {
            worker,
            project,
            channel: channel.into(),
            on,
            ticket,
            recover: None,
        });
    }

    fn history_subscribe(&self, req: crate::shard::HistorySubscribe) -> bool {
        // The same queue as interest changes: the gain this request counts as and
        // the loss its answer leads to stay in order.
        let _ = self.interest_tx.send(Interest {
            worker: req.worker,
            project: req.project,
            channel: req.channel.clone(),
            on: true,
            // No `InterestReady` for this gain: its `HistoryReady` answers it.
            ticket: 0,
            recover: Some(Box::new(req)),
        });
        true
    }
}

impl crate::shard::mailbox::Relay for Cluster {
    fn room(&self, frames: usize) -> bool {
        self.relay_room(frames)
    }

    fn relay(&self, msg: Arc<Broadcast>) {
        Cluster::relay(self, msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_a_cap_with_jitter() {
        let mut b = Backoff::new();
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = b.next_delay();
            assert!(last <= MAX_BACKOFF);
        }
        assert!(last >= MAX_BACKOFF / 2);
        b.reset();
        assert!(b.next_delay() <= MIN_BACKOFF);
    }
}
