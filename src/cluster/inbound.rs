//! The subscriber thread: Redis → this node's mailboxes, for exactly the channels this
//! node's clients want.
//!
//! State: `wanted`, Redis channel → how many workers have a local subscriber on it. It
//! is updated from the interest queue whether or not Redis is reachable, so after a
//! reconnect the thread re-subscribes to exactly what is wanted *then*, in batches of
//! [`RESUBSCRIBE_BATCH`].
//!
//! History subscribes (a worker's [`HistorySubscribe`], carried by the interest queue
//! so that the gain it counts as and the loss that follows stay in order) are answered
//! here: once the channel's SUBSCRIBE is acknowledged, the read script (on a second,
//! ordinary connection) returns the position and missed messages and, in the same
//! atomic step, PUBLISHes a marker on this node's sync channel. Every message the read
//! covers was published before the marker and every later one after it, so when the
//! marker arrives here the answer ([`Envelope::HistoryReady`]) is pushed into the
//! worker's mailbox exactly between the two: the worker registers the subscriber there.
//! When the connection drops with answers still waiting for their marker, they are
//! answered "position unknown" (messages may have been lost meanwhile). A replay's
//! frames come from this node's cache of recently replayed frames ([`replays`]), so
//! recoveries of the same messages share one frame and one compressed form.
//!
//! The connection reads with a short timeout ([`POLL`]): between reads the thread
//! applies interest changes, so a new subscription reaches Redis within a few
//! milliseconds of a client's `subscribe`. A read timeout leaves the RESP decoder's
//! partial state intact (redis-rs keeps it across `WouldBlock`), so a timeout in the
//! middle of a large message loses nothing. SUBSCRIBE/UNSUBSCRIBE wait for their reply
//! under [`IO_TIMEOUT`] instead; a timeout there drops the connection (its reply stream
//! can no longer be trusted) and the reconnect restores everything.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;

use super::outbound::ProjectIndex;
use super::{
    connect, history, sleep_unless_stopped, wire, Backoff, Cluster, Interest, IO_TIMEOUT,
    RESUBSCRIBE_BATCH,
};
use crate::auth::KeyCache;
use crate::shard::mailbox::{Broadcast, Envelope, HistoryReady, Mailboxes};
use crate::shard::HistorySubscribe;
use crate::ws::deflate::SharedFrame;

mod replays;

use replays::ReplayCache;

/// Set the node's `replay_cache_bytes` (at start, before the subscriber thread runs).
pub(crate) fn configure_replay_cache(max_bytes: usize) {
    replays::configure(max_bytes);
}

/// Longest a read waits before the thread looks at interest changes again.
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// Subscription changes to send to Redis, and history subscribes to answer once they
/// are acknowledged.
#[derive(Default)]
struct Pending {
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
    recover: Vec<(Box<str>, Box<HistorySubscribe>)>,
}

/// History subscribes whose read is done, by marker, waiting for the marker to come
/// back on the sync channel (see `cluster::history`).
type Awaiting = HashMap<u64, (usize, u64, HistoryReady)>;

/// Answer every waiting history subscribe "position unknown": the connection that
/// would have carried its marker (and the messages before it) is gone.
fn give_up(mailboxes: &Mailboxes, awaiting: &mut Awaiting, pending: &mut Pending) {
    for (_, (worker, ticket, _)) in awaiting.drain() {
        unknown(mailboxes, worker, ticket);
    }
    for (_, req) in pending.recover.drain(..) {
        unknown(mailboxes, req.worker, req.ticket);
    }
}

fn unknown(mailboxes: &Mailboxes, worker: usize, ticket: u64) {
    mailboxes.control_to(
        worker,
        Envelope::HistoryReady {
            ticket,
            ready: HistoryReady::Unknown,
        },
    );
}

/// Gains to confirm to their workers once the SUBSCRIBEs of this round are answered
/// (or at once when Redis is away). A gain on a channel this node already has in Redis
/// waits for the same round: it costs at most one round trip, never a wrong answer.
#[derive(Default)]
struct Confirmations(Vec<Interest>);

impl Confirmations {
    /// Tell each worker its gain is live; empties the list.
    fn send(&mut self, mailboxes: &Mailboxes) {
        for i in self.0.drain(..) {
            mailboxes.control_to(
                i.worker,
                Envelope::InterestReady {
                    project: i.project,
                    channel: i.channel,
                    ticket: i.ticket,
                },
            );
        }
    }
}

/// Apply queued interest changes to `wanted`; collect the Redis-level transitions.
fn drain_interest(
    rx: &Receiver<Interest>,
    keys: &KeyCache,
    projects: &mut ProjectIndex,
    wanted: &mut HashMap<String, u32>,
    pending: &mut Pending,
    confirm: &mut Confirmations,
) {
    while let Ok(change) = rx.try_recv() {
        let Some(project) = projects.get(keys, change.project) else {
            // A project this node no longer knows: nothing to subscribe, but the
            // worker must not wait for ever.
            if let Some(req) = change.recover {
                pending.recover.push((Box::from(""), req));
            } else if change.on {
                confirm.0.push(change);
            }
            continue;
        };
        let name = wire::redis_channel(&project.id, &change.channel);
        if change.on {
            let count = wanted.entry(name.clone()).or_insert(0);
            *count += 1;
            if *count == 1 {
                pending.unsubscribe.retain(|c| *c != name);
                pending.subscribe.push(name);
            }
            match change.recover {
                // Answered by its `HistoryReady` once the SUBSCRIBE is acknowledged.
                Some(req) => pending.recover.push((project.id.as_str().into(), req)),
                None => confirm.0.push(change),
            }
        } else if let Some(count) = wanted.get_mut(&name) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                wanted.remove(&name);
                pending.subscribe.retain(|c| *c != name);
                pending.unsubscribe.push(name);
            }
        }
    }
}

pub(crate) fn run(
    cluster: &Cluster,
    client: &redis::Client,
    keys: &KeyCache,
    mailboxes: &Mailboxes,
    rx: &Receiver<Interest>,
) {
    let mut backoff = Backoff::new();
    let mut projects = ProjectIndex::new();
    let mut wanted: HashMap<String, u32> = HashMap::new();
    // Set once Redis was lost: its return is then a warning too (see `outbound`).
    let mut lost = false;
    let mut confirm = Confirmations::default();
    let mut awaiting = Awaiting::new();
    let mut replays = ReplayCache::configured();
    while !cluster.stopping() {
        let mut pending = Pending::default();
        drain_interest(
            rx,
            keys,
            &mut projects,
            &mut wanted,
            &mut pending,
            &mut confirm,
        );
        // History subscribes cannot wait for a reconnect: answered now (no position),
        // the reconnect restores their channels.
        give_up(mailboxes, &mut awaiting, &mut pending);
        let conns = connect(client).and_then(|sub| {
            let mut data = connect(client)?;
            history::load_scripts(&mut data)?;
            Ok((sub, data))
        });
        // Whether Redis is away now: then wait (draining interest) before reconnecting.
        let away = match conns {
            Err(e) => {
                if cluster.inbound_ok.swap(false, Ordering::Relaxed) || !lost {
                    tracing::warn!(error = %e, "cluster subscriber: Redis unavailable");
                    lost = true;
                }
                // Redis is away: answer the waiting subscribers now (local delivery
                // works; the reconnect restores the subscriptions).
                confirm.send(mailboxes);
                true
            }
            Ok((mut conn, mut data)) => {
                let result = subscribed_loop(
                    cluster,
                    &mut conn,
                    &mut data,
                    &mut awaiting,
                    &mut replays,
                    keys,
                    mailboxes,
                    rx,
                    &mut projects,
                    &mut wanted,
                    &mut backoff,
                    &mut lost,
                    &mut confirm,
                );
                cluster.inbound_ok.store(false, Ordering::Relaxed);
                // Whatever the loop could not confirm (the connection failed mid-way) is
                // answered now, as while Redis is away.
                confirm.send(mailboxes);
                give_up(mailboxes, &mut awaiting, &mut Pending::default());
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "cluster subscriber: Redis connection lost; reconnecting");
                    lost = true;
                }
                result.is_err()
            }
        };
        if away {
            let delay = backoff.next_delay();
            wait_draining(
                cluster,
                rx,
                keys,
                &mut projects,
                &mut wanted,
                &mut confirm,
                mailboxes,
                delay,
            );
        }
    }
}

/// Wait `delay` before reconnecting, applying interest changes every few milliseconds
/// meanwhile: the interest queue never holds more than that much of them, and what
/// the node wants is kept in `wanted` only, one entry per channel (bounded by the
/// workers' subscription caps), however long Redis stays away.
#[allow(clippy::too_many_arguments)]
fn wait_draining(
    cluster: &Cluster,
    rx: &Receiver<Interest>,
    keys: &KeyCache,
    projects: &mut ProjectIndex,
    wanted: &mut HashMap<String, u32>,
    confirm: &mut Confirmations,
    mailboxes: &Mailboxes,
    delay: Duration,
) {
    let deadline = Instant::now() + delay;
    while !cluster.stopping() && Instant::now() < deadline {
        // The Redis-level transitions need not be kept: the reconnect subscribes to
        // everything in `wanted`.
        let mut pending = Pending::default();
        drain_interest(rx, keys, projects, wanted, &mut pending, confirm);
        confirm.send(mailboxes);
        give_up(mailboxes, &mut Awaiting::new(), &mut pending);
        sleep_unless_stopped(
            cluster,
            POLL.min(deadline.saturating_duration_since(Instant::now())),
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn subscribed_loop(
    cluster: &Cluster,
    conn: &mut redis::Connection,
    data: &mut redis::Connection,
    awaiting: &mut Awaiting,
    replays: &mut ReplayCache,
    keys: &KeyCache,
    mailboxes: &Mailboxes,
    rx: &Receiver<Interest>,
    projects: &mut ProjectIndex,
    wanted: &mut HashMap<String, u32>,
    backoff: &mut Backoff,
    lost: &mut bool,
    confirm: &mut Confirmations,
) -> redis::RedisResult<()> {
    let sync = cluster.sync_channel();
    let mut next_marker = 0u64;
    let mut pubsub = conn.as_pubsub();
    // Restore: everything wanted now, in bounded batches.
    pubsub.set_read_timeout(Some(IO_TIMEOUT))?;
    pubsub.subscribe(&sync)?;
    let all: Vec<&String> = wanted.keys().collect();
    for chunk in all.chunks(RESUBSCRIBE_BATCH) {
        pubsub.subscribe(chunk)?;
    }
    // A PING round trip proves the connection works even with nothing to restore.
    pubsub.ping::<()>()?;
    confirm.send(mailboxes);
    if !cluster.inbound_ok.swap(true, Ordering::Relaxed) {
        if *lost {
            tracing::warn!(
                channels = wanted.len(),
                "cluster subscriber: Redis is back; subscriptions restored"
            );
        } else {
            tracing::info!(
                channels = wanted.len(),
                "cluster subscriber connected to Redis"
            );
        }
        *lost = false;
    }
    backoff.reset();
    pubsub.set_read_timeout(Some(POLL))?;
    let mut last_traffic = Instant::now();
    let own = cluster.node_id();
    while !cluster.stopping() {
        let mut pending = Pending::default();
        drain_interest(rx, keys, projects, wanted, &mut pending, confirm);
        if !pending.subscribe.is_empty() || !pending.unsubscribe.is_empty() {
            pubsub.set_read_timeout(Some(IO_TIMEOUT))?;
            // `subscribe` returns once Redis acknowledged every channel of the chunk:
            // from then on a PUBLISH on any node reaches this connection.
            for chunk in pending.subscribe.chunks(RESUBSCRIBE_BATCH) {
                pubsub.subscribe(chunk)?;
            }
            for chunk in pending.unsubscribe.chunks(RESUBSCRIBE_BATCH) {
                pubsub.unsubscribe(chunk)?;
            }
            pubsub.set_read_timeout(Some(POLL))?;
        }
        confirm.send(mailboxes);
        // Every channel of these subscribes is SUBSCRIBEd (acknowledged above or
        // earlier): read their positions now; each read leaves its marker on `sync`.
        for (project_id, req) in pending.recover.drain(..) {
            next_marker += 1;
            let marker = next_marker;
            match recovery_read(data, replays, &project_id, &req, &sync, marker) {
                Ok(Some(ready)) => {
                    awaiting.insert(marker, (req.worker, req.ticket, ready));
                }
                Ok(None) => unknown(mailboxes, req.worker, req.ticket),
                Err(e) => {
                    unknown(mailboxes, req.worker, req.ticket);
                    return Err(e);
                }
            }
        }
        // Take what has arrived; a timeout means "nothing more for now". Under steady
        // traffic there is no timeout: the round also ends after `POLL`, so interest
        // changes and history subscribes are never starved by a busy channel.
        let round = Instant::now();
        while round.elapsed() < POLL {
            match pubsub.get_message() {
                Ok(msg) => {
                    last_traffic = Instant::now();
                    if msg.get_channel_name() == sync {
                        release(mailboxes, awaiting, msg.get_payload_bytes());
                    } else {
                        deliver(cluster, keys, mailboxes, own, &msg);
                    }
                }

                Err(e) if e.is_timeout() => break,
                Err(e) => return Err(e),
            }
        }
        if last_traffic.elapsed() >= IO_TIMEOUT {
            // Quiet connection: make sure it is still alive (a half-open TCP connection
            // would otherwise look healthy forever).
            pubsub.set_read_timeout(Some(IO_TIMEOUT))?;
            pubsub.ping::<()>()?;
            pubsub.set_read_timeout(Some(POLL))?;
            redis::cmd("PING").query::<()>(data)?;
            last_traffic = Instant::now();
        }
    }
    Ok(())
}

/// Read a history subscribe's position (and replay) with the sync marker. `Ok(None)`:
/// Redis answered something unusable (the subscriber gets no position).
fn recovery_read(
    data: &mut redis::Connection,
    replays: &mut ReplayCache,
    project_id: &str,
    req: &HistorySubscribe,
    sync: &str,
    marker: u64,
) -> redis::RedisResult<Option<HistoryReady>> {
    if project_id.is_empty() {
        return Ok(None);
    }
    let since = req.since.as_ref().map(|s| s.0);
    let count = if since.is_some() {
        req.size as usize
    } else {
        0
    };
    let marker_text = marker.to_string();
    let cmd = history::read_cmd(
        project_id,
        &req.channel,
        req.ttl_s,
        since,
        count,
        Some((sync, &marker_text)),
    );
    let mut v: redis::Value = cmd.query(data)?;
    if history::is_noscript(&v) {
        history::load_scripts(data)?;
        v = cmd.query(data)?;
    }
    let Some(read) = history::parse_read(v, since, usize::MAX) else {
        return Ok(None);
    };
    let epoch = read.position.epoch;
    let replay = req.since.as_ref().and_then(|(since, want)| {
        if !history::complete(&read, *since, want) {
            return None;
        }
        let frames: Vec<SharedFrame> = read
            .entries
            .iter()
            .map(|e| {
                replays.frame(req.project, &req.channel, epoch.as_str(), e.offset, || {
                    wire::frame_with_position(&e.body, e.offset, epoch.as_str())
                })
            })
            .collect();
        let cost: usize = frames
            .iter()
            .map(|f| crate::ws::conn::WsConn::cost_of(f.plain()))
            .sum();
        // Larger than the connection may queue: recovered false rather than a 4008.
        (cost <= req.budget).then_some(frames)
    });
    Ok(Some(HistoryReady::Position {
        offset: read.position.offset,
        epoch: epoch.as_str().into(),
        replay,
    }))
}

/// A marker came back: every message its read covered is in the mailboxes, none
/// after it is: the subscribe goes live now.
fn release(mailboxes: &Mailboxes, awaiting: &mut Awaiting, payload: &[u8]) {
    let Some(marker) = std::str::from_utf8(payload)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return;
    };
    if let Some((worker, ticket, ready)) = awaiting.remove(&marker) {
        mailboxes.control_to(worker, Envelope::HistoryReady { ticket, ready });
    }
}

/// Hand one message from another node to every worker.
fn deliver(cluster: &Cluster, keys: &KeyCache, mailboxes: &Mailboxes, own: u64, msg: &redis::Msg) {
    let Some((project_id, channel)) = wire::parse_channel(msg.get_channel_name()) else {
        return;
    };
    let payload = msg.get_payload_bytes();
    if matches!(
        payload.first(),
        Some(&wire::VERSION_HISTORY | &wire::VERSION_HISTORY_EXCEPT)
    ) {
        return deliver_positioned(cluster, keys, mailboxes, project_id, channel, payload);
    }
    if payload.first() == Some(&crate::presence::remote::VERSION_PRESENCE) {
        return deliver_presence(cluster, keys, mailboxes, own, project_id, channel, payload);
    }
    let Some((origin, except, frame)) = wire::decode_payload(payload) else {
        drop_received(cluster);
        return;
    };
    if origin == own {
        return; // already delivered locally when it was accepted
    }
    if !wire::check_frame(frame, channel) {
        // Not what a ringcast node publishes: never forward foreign bytes to browsers.
        if let Some(dropped) = drop_received(cluster) {
            tracing::warn!(
                dropped,
                "cluster subscriber: dropping a malformed frame received from Redis"
            );
        }
        return;
    }
    let snapshot = keys.load();
    let Some(project) = snapshot.project(project_id) else {
        drop_received(cluster);
        return;
    };
    // One copy per message per node; every local subscriber shares it.
    let frame = Bytes::copy_from_slice(frame);
    let broadcast = Arc::new(Broadcast::new(project.index, channel.into(), frame, except));
    enqueue(cluster, mailboxes, broadcast);
}

/// A presence frame another node's hub decided (a member joined or left anywhere):
/// to this node's subscribers of the channel, never refused (see
/// `Envelope::Presence`).
fn deliver_presence(
    cluster: &Cluster,
    keys: &KeyCache,
    mailboxes: &Mailboxes,
    own: u64,
    project_id: &str,
    channel: &str,
    payload: &[u8],
) {
    let snapshot = keys.load();
    let decoded = wire::decode_presence(payload);
    let (Some((origin, frame)), Some(project)) = (decoded, snapshot.project(project_id)) else {
        drop_received(cluster);
        return;
    };
    if origin == own {
        return; // this node's hub gave it to its own workers
    }
    if !crate::shard::is_presence(channel) || !wire::check_presence_frame(frame, channel) {
        drop_received(cluster);
        return;
    }
    mailboxes.presence(Arc::new(Broadcast::plain(
        project.index,
        channel.into(),
        Bytes::copy_from_slice(frame),
    )));
}

/// A message of a history channel (any node's, this one's included: Redis gave it its
/// position, and local subscribers get it from here too, in offset order). Its frame
/// is made once per node.
fn deliver_positioned(
    cluster: &Cluster,
    keys: &KeyCache,
    mailboxes: &Mailboxes,
    project_id: &str,
    channel: &str,
    payload: &[u8],
) {
    let snapshot = keys.load();
    let (Some(m), Some(project)) = (wire::decode_history(payload), snapshot.project(project_id))
    else {
        drop_received(cluster);
        return;
    };
    let frame = wire::frame_with_position(m.body, m.offset, m.epoch);
    if !wire::check_frame(&frame, channel) {
        // Not what a ringcast publish makes: never forward foreign bytes to browsers.
        drop_received(cluster);
        return;
    }
    let broadcast = Arc::new(Broadcast::new(
        project.index,
        channel.into(),
        frame,
        m.except,
    ));
    enqueue(cluster, mailboxes, broadcast);
}

/// Count one received message dropped. `Some(count)` when the count so far is a power
/// of two: a drop worth a warning is logged then, so a flood logs a few lines only.
fn drop_received(cluster: &Cluster) -> Option<u64> {
    let dropped = cluster
        .stats
        .receive_dropped
        .fetch_add(1, Ordering::Relaxed);
    dropped.is_power_of_two().then_some(dropped)
}

/// Hand a received message to the workers, counting it; full mailboxes drop it (the
/// subscriber thread never waits on workers), logged at each power of two.
fn enqueue(cluster: &Cluster, mailboxes: &Mailboxes, broadcast: Arc<Broadcast>) {
    if mailboxes.broadcast(broadcast) {
        cluster.stats.received.fetch_add(1, Ordering::Relaxed);
    } else {
        if let Some(dropped) = drop_received(cluster) {
            tracing::warn!(
                dropped,
                "cluster subscriber: mailboxes full; dropping received messages"
            );
        }
    }
}
