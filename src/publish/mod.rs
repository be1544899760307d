//! The publish endpoints' work once the HTTP layer has authenticated the key and read
//! the body: parse and validate ([`parse`]), apply the quota, encode once (`crate::wire::native`)
//! and hand the encoded frames to the mailbox of every worker that has subscribers of
//! their channels ([`Fanout`]). One message to one channel is one frame and one
//! envelope; a message to several channels, or a batch, is one frame per message per
//! channel, all handed to each worker in one envelope, after the whole quota was
//! reserved in one step.
//!
//! Order of checks, so that the cheapest refusal comes first: body parse and validation
//! (400) → quota (429) → shutting down / mailboxes (503). The answer is a value
//! ([`Answer`]); writing it as HTTP is the caller's job. Nothing here blocks or
//! allocates per subscriber: the frame is one `Bytes`.
//!
//! Two APIs publish through here: the native one ([`accept`], [`accept_batch`]: parse,
//! then publish) and Pusher's REST API, whose bodies [`pusher`] validates into the same
//! [`parse::Publish`] messages before [`publish_one`] / [`publish_batch`] take them, so
//! quota, encoding, history and hand-over are one code path for both.
//!
//! Idempotent publish ([`idempotency`]): on a single node the HTTP layer claims a keyed
//! request's key before it comes here and never passes a [`Keyed`]; in cluster mode it
//! passes one, and the request is published by Redis' idempotent script
//! ([`keyed_publish`]), which answers a retry from what it stored.

pub(crate) mod idempotency;
pub(crate) mod parse;
pub(crate) mod pusher;

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::ProjectState;
use crate::cluster::history::{Item, PublishRequest, Reply, Request, Unreachable};
use crate::cluster::Cluster;
use crate::error::{ApiError, Unavailable};
use crate::history::{Entry, History, HistorySpec, Position};
use crate::ids::{Id, IdGen};
use crate::quota::{now_ns, Decision};
use crate::shard::mailbox::{Broadcast, BroadcastBatch};
use crate::wire::native as encode;

pub(crate) use parse::PublishParser;
use parse::{BatchError, BatchLimits, Publish};

/// What an accepted request gave: one id (`/publish`; with its position when it went
/// to one channel of a history project) or one per message (`/batch`).
#[derive(Debug)]
pub(crate) enum Accepted {
    One(Id, Option<Position>),
    Many(Vec<Id>),
    /// Cluster mode: a keyed request accepted before (on any node); its answer as
    /// Redis stored it. Nothing was published.
    Replayed(idempotency::Stored),
}

/// Cluster mode: the `Idempotency-Key` of a request and what its answer is made of.
pub(crate) struct Keyed<'a> {
    pub key: &'a [u8],
    /// [`idempotency::body_hash`] of the request body.
    pub hash: [u8; 32],
    pub window_ms: u64,
    /// `idempotency_max_keys_per_project`.
    pub max_keys: usize,
    /// Pusher's API (answer 200 `{}`), or native (202 with the ids).
    pub pusher: bool,
}

/// The outcome of one publish, for the caller to write.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The accepted message ids, or why the request was refused.
    pub outcome: Result<Accepted, ApiError>,
    /// For a refused batch: the index of the first invalid message.
    pub index: Option<usize>,
    /// The project's quota after this request (taken on success, peeked on a refusal
    /// that spent nothing).
    pub rate: Decision,
    /// `Retry-After` for a 429.
    pub retry_after_s: Option<u64>,
    /// Quota units the accepted request spent (one per message per channel); 0 when
    /// refused. The `ringcast_messages_published_total` counter adds it.
    pub units: u32,
}

impl Answer {
    fn refused(error: ApiError, index: Option<usize>, rate: Decision) -> Answer {
        Answer {
            outcome: Err(error),
            index,
            rate,
            retry_after_s: None,
            units: 0,
        }
    }
}

/// What the caller needs to broadcast an accepted publish.
pub(crate) trait Fanout {
    /// Hand one encoded message to every worker; `false` when any mailbox is full.
    fn broadcast(&self, msg: Arc<Broadcast>) -> bool;
    /// Hand several encoded messages to every worker in one push each, in order;
    /// `false` (and nothing queued) when any mailbox is full.
    fn broadcast_batch(&self, batch: BroadcastBatch) -> bool;
    /// Whether the service is shutting down.
    fn shutting_down(&self) -> bool;
    /// The node's channel history (only history projects touch it).
    fn history(&self) -> &History;
    /// Cluster mode's bridge: history projects publish through Redis.
    fn cluster(&self) -> Option<&Arc<Cluster>>;
}

/// What [`accept`] or [`accept_batch`] decided: answered now, or (cluster mode, a
/// history project) once Redis gave the messages their positions.
pub(crate) enum Decided {
    Now(Answer),
    Later(Later),
}

/// What a publish waits for from Redis.
enum Waiting {
    /// A history publish's positions ([`cluster_publish`]).
    Positions(Reply<Result<Vec<Position>, Unreachable>>),
    /// A keyed publish's decision ([`keyed_publish`]).
    Keyed(Reply<Result<crate::cluster::idempotency::Keyed, Unreachable>>),
}

/// A publish waiting for Redis (see [`cluster_publish`], [`keyed_publish`]).
pub(crate) struct Later {
    reply: Waiting,
    project: Arc<ProjectState>,
    accepted: Accepted,
    /// Whether the answer carries the position (one message, one channel).
    single: bool,
    rate: Decision,
    units: u32,
}

impl Later {
    /// Wait for Redis (the worker serves others meanwhile) and give the answer.
    pub(crate) async fn wait(self) -> Answer {
        use crate::cluster::idempotency::Keyed as K;
        let got = match self.reply {
            Waiting::Positions(r) => r.wait().await,
            Waiting::Keyed(r) => match r.wait().await {
                Ok(K::Published(positions, evicted)) => {
                    if evicted > 0 {
                        crate::metrics::with(|m| m.idempotency_keys_evicted(evicted));
                    }
                    Ok(positions)
                }
                Ok(K::Replay { status, body }) => {
                    // Answered before: nothing published, nothing spent.
                    self.project.quota.refund_n(self.units);
                    crate::metrics::with(|m| m.idempotent_replay());
                    let stored = idempotency::Stored { status, body };
                    return Answer {
                        outcome: Ok(Accepted::Replayed(stored)),
                        index: None,
                        rate: self.project.quota.peek(now_ns()),
                        retry_after_s: None,
                        units: 0,
                    };
                }
                Ok(K::Reused) => {
                    self.project.quota.refund_n(self.units);
                    crate::metrics::with(|m| m.idempotency_key_reused());
                    let rate = self.project.quota.peek(now_ns());
                    return Answer::refused(ApiError::IdempotencyKeyReused, None, rate);
                }
                Err(e) => Err(e),
            },
        };
        match got {
            Ok(positions) => {
                let accepted = match self.accepted {
                    Accepted::One(id, _) => {
                        Accepted::One(id, positions.first().copied().filter(|_| self.single))
                    }
                    many => many,
                };
                Answer {
                    outcome: Ok(accepted),
                    index: None,
                    rate: self.rate,
                    retry_after_s: None,
                    units: self.units,
                }
            }
            // Not published (or, when Redis stopped answering after running the
            // script, published without this answer: RELIABILITY.md).
            Err(Unreachable) => {
                unavailable(&self.project, Unavailable::HistoryUnreachable, self.units)
            }
        }
    }
}

/// Cluster mode, a history project: Redis gives each message of each channel its
/// offset, keeps it and publishes it to every node (this one included, which delivers
/// it to its subscribers from there, in offset order), in one script call for the
/// whole request. Each frame's body is encoded once here; each node adds the position.
fn cluster_publish(
    cluster: &Cluster,
    project: &Arc<ProjectState>,
    spec: HistorySpec,
    msgs: &[Publish<'_>],
    accepted: Accepted,
    rate: Decision,
    units: u32,
) -> Later {
    let items = history_items(msgs, &accepted, units);
    let (tx, reply) = crate::cluster::history::reply();
    // A full queue drops the request, and with it `tx`: the reply answers 503 at once.
    cluster.history(Request::Publish(PublishRequest {
        project_id: project.id.as_str().into(),
        size: spec.size,
        ttl_s: spec.ttl_s,
        items,
        reply: tx,
    }));
    Later {
        reply: Waiting::Positions(reply),
        project: Arc::clone(project),
        single: msgs.len() == 1 && msgs[0].channels.is_single(),
        accepted,
        rate,
        units,
    }
}

/// The ids of an accepted request, in message order.
fn id_strs(accepted: &Accepted) -> Vec<&str> {
    match accepted {
        Accepted::One(id, _) => vec![id.as_str()],
        Accepted::Many(ids) => ids.iter().map(|i| i.as_str()).collect(),
        Accepted::Replayed(_) => Vec::new(),
    }
}

/// Cluster mode, a history project: each frame's body for Redis' publish script.
fn history_items(msgs: &[Publish<'_>], accepted: &Accepted, units: u32) -> Vec<Item> {
    let mut items = Vec::with_capacity(units as usize);
    for (msg, id) in msgs.iter().zip(id_strs(accepted)) {
        for &channel in msg.channels.as_slice() {
            let (body, data_start) =
                crate::wire::native::message_body(channel, msg.event, msg.data, id);
            items.push(Item {
                channel: channel.into(),
                body,
                data_start,
                except: msg.except,
            });
        }
    }
    items
}

/// The body of an accepted native answer: `{"id":...}` (with `offset`/`epoch` for a
/// single-channel history publish) or `{"ids":[...]}`. `None` for a replay, whose
/// body is the stored one.
pub(crate) fn answer_body(accepted: &Accepted) -> Option<Vec<u8>> {
    let (mut body, tail) = answer_head(accepted)?;
    if let Accepted::One(_, Some(pos)) = accepted {
        body.extend_from_slice(b",\"offset\":");
        body.extend_from_slice(pos.offset.to_string().as_bytes());
        body.extend_from_slice(b",\"epoch\":\"");
        body.extend_from_slice(pos.epoch.as_str().as_bytes());
        body.push(b'"');
    }
    body.extend_from_slice(tail);
    Some(body)
}

/// A native answer's body before its position, and what closes it. Ids are hex: no
/// escaping.
fn answer_head(accepted: &Accepted) -> Option<(Vec<u8>, &'static [u8])> {
    match accepted {
        Accepted::One(id, _) => {
            let mut body = Vec::with_capacity(80);
            body.extend_from_slice(b"{\"id\":\"");
            body.extend_from_slice(id.as_str().as_bytes());
            body.push(b'"');
            Some((body, b"}"))
        }
        Accepted::Many(ids) => {
            let mut body = Vec::with_capacity(9 + ids.len() * 23);
            body.extend_from_slice(b"{\"ids\":[");
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                body.push(b'"');
                body.extend_from_slice(id.as_str().as_bytes());
                body.push(b'"');
            }
            body.push(b']');
            Some((body, b"}"))
        }
        Accepted::Replayed(_) => None,
    }
}

/// Cluster mode, a request with an `Idempotency-Key`: Redis' idempotent script claims
/// the key, publishes (through history's script for a history project; by PUBLISH
/// to every node, this one included, otherwise) and stores the answer, or answers
/// the stored one (see `cluster::idempotency`). Redis away: 503, nothing published.
#[allow(clippy::too_many_arguments)]
fn keyed_publish(
    cluster: &Cluster,
    project: &Arc<ProjectState>,
    spec: HistorySpec,
    msgs: &[Publish<'_>],
    accepted: Accepted,
    rate: Decision,
    units: u32,
    keyed: &Keyed<'_>,
) -> Later {
    use crate::cluster::idempotency::{self as idem, KeyedRequest, Template};
    let single = msgs.len() == 1 && msgs[0].channels.is_single();
    let answer = if keyed.pusher {
        Template {
            status: 200,
            head: b"{".to_vec(),
            tail: b"}",
            positioned: false,
        }
    } else {
        let (head, tail) = answer_head(&accepted).unwrap_or_default();
        Template {
            status: 202,
            head,
            tail,
            positioned: spec.is_on() && single,
        }
    };
    let publish = if spec.is_on() {
        idem::Publish::History {
            size: spec.size,
            ttl_s: spec.ttl_s,
            items: history_items(msgs, &accepted, units),
        }
    } else {
        let mut frames = Vec::with_capacity(units as usize);
        for (msg, id) in msgs.iter().zip(id_strs(&accepted)) {
            for &channel in msg.channels.as_slice() {
                let frame = encode::message_frame(channel, msg.event, msg.data, id);
                // Origin 0: every node delivers it, this one included.
                let payload = match msg.except {
                    Some(e) => crate::wire::relay::encode_payload_except(0, e, &frame),
                    None => crate::wire::relay::encode_payload(0, &frame),
                };
                let name = crate::wire::relay::redis_channel(project.id.as_str(), channel);
                frames.push((name, payload));
            }
        }
        idem::Publish::Plain(frames)
    };
    let (tx, reply) = crate::cluster::history::reply();
    // A full queue drops the request, and with it `tx`: the reply answers 503 at once.
    cluster.history(Request::Scripted(Box::new(KeyedRequest {
        project_id: project.id.as_str().into(),
        key: keyed.key.into(),
        body_hash: keyed.hash,
        window_ms: keyed.window_ms,
        max_keys: keyed.max_keys,
        answer,
        publish,
        reply: tx,
    })));
    Later {
        reply: Waiting::Keyed(reply),
        project: Arc::clone(project),
        single: single && !keyed.pusher,
        accepted,
        rate,
        units,
    }
}

/// Publish `msgs` of a history project: under the history lock, give each message of
/// each channel its offset, encode it with its position, hand all of them to the
/// mailboxes and, once they were accepted, record them, before the lock is released, so
/// every mailbox gets a channel's frames in offset order and a refused publish (503)
/// leaves the history exactly as it was. Returns the position of the first frame (the
/// answer of a single-channel publish), `None` when the mailboxes refused.
fn publish_with_history(
    project: &ProjectState,
    spec: HistorySpec,
    msgs: &[Publish<'_>],
    ids: &[Id],
    fanout: &dyn Fanout,
) -> Option<Option<Position>> {
    let n = units(msgs) as usize;
    let mut history = fanout.history().lock();
    let mut frames = Vec::with_capacity(n);
    let mut kept = Vec::with_capacity(n);
    // The last position given to each channel in this request (only when there are
    // several frames: a channel may come back, and its log is not written yet).
    let mut given: HashMap<&str, Position> = HashMap::new();
    let mut first = None;
    for (msg, id) in msgs.iter().zip(ids) {
        for &channel in msg.channels.as_slice() {
            let last = match given.get(channel) {
                Some(p) => *p,
                None => history.position(project.index, channel, spec),
            };
            let pos = Position {
                offset: last.offset + 1,
                epoch: last.epoch,
            };
            first.get_or_insert(pos);
            if n > 1 {
                given.insert(channel, pos);
            }
            let (frame, span) = encode::message_frame_at(
                channel,
                msg.event,
                msg.data,
                id.as_str(),
                pos.offset,
                pos.epoch.as_str(),
            );
            kept.push((pos, span, msg.event, id));
            frames.push(Arc::new(Broadcast::new(
                project.index,
                channel.into(),
                frame,
                msg.except,
            )));
        }
    }
    let queued = if frames.len() == 1 {
        fanout.broadcast(Arc::clone(&frames[0]))
    } else {
        fanout.broadcast_batch(frames.iter().cloned().collect())
    };
    if !queued {
        return None;
    }
    for (msg, (pos, span, event, id)) in frames.iter().zip(kept) {
        let entry = Entry::new(
            pos.offset,
            msg.frame.clone(),
            event,
            msg.frame.slice(span),
            id.as_str(),
        );
        history.push(project.index, &msg.channel, spec, pos, entry);
    }
    history.enforce_budget();
    Some(first)
}

/// Quota units of some messages: one per message per channel.
fn units(msgs: &[Publish<'_>]) -> u32 {
    msgs.iter()
        .map(|m| m.channels.as_slice().len() as u32)
        .sum()
}

/// Take the quota for `units`, or the 429 answer.
fn reserve(project: &ProjectState, units: u32) -> Result<Decision, Answer> {
    if units > project.quota.limit().count {
        // More than a full bucket: waiting cannot help, so no Retry-After.
        return Err(Answer::refused(
            ApiError::OverBurst,
            None,
            project.quota.peek(now_ns()),
        ));
    }
    let decision = project.quota.check_n(now_ns(), units);
    if decision.allowed {
        return Ok(decision);
    }
    Err(Answer {
        outcome: Err(ApiError::RateLimited),
        index: None,
        retry_after_s: Some(decision.retry_after_s.max(1)),
        rate: decision,
        units: 0,
    })
}

/// A 503 for a publish that had taken `units` of quota: they are given back (nothing
/// was published), and the answer shows the quota as it is after that.
fn unavailable(project: &ProjectState, why: Unavailable, units: u32) -> Answer {
    project.quota.refund_n(units);
    Answer::refused(
        ApiError::Unavailable(why),
        None,
        project.quota.peek(now_ns()),
    )
}

/// Encode `msg` once per channel, with id `id`, into `out`.
fn encode_into(project: u32, msg: &Publish<'_>, id: &Id, out: &mut Vec<Arc<Broadcast>>) {
    for channel in msg.channels.as_slice() {
        let frame = encode::message_frame(channel, msg.event, msg.data, id.as_str());
        out.push(Arc::new(Broadcast::new(
            project,
            (*channel).into(),
            frame,
            msg.except,
        )));
    }
}

/// Handle a publish whose body has been read, for an authenticated project.
pub(crate) fn accept(
    project: &Arc<ProjectState>,
    body: &[u8],
    parser: &mut PublishParser,
    ids: &IdGen,
    fanout: &dyn Fanout,
    keyed: Option<&Keyed<'_>>,
) -> Decided {
    let msg = match parser.parse(body) {
        Ok(msg) => msg,
        Err(error) => {
            return Decided::Now(Answer::refused(error, None, project.quota.peek(now_ns())))
        }
    };
    publish_one(project, &msg, ids, fanout, keyed)
}

/// Publish one validated message to its channel or channels: quota (one unit per
/// channel), one id, hand-over to the mailboxes (through history when the project keeps
/// it). What [`accept`] does once the body parsed; the Pusher API's `events` comes here
/// with the message it validated by its own rules.
pub(crate) fn publish_one(
    project: &Arc<ProjectState>,
    msg: &Publish<'_>,
    ids: &IdGen,
    fanout: &dyn Fanout,
    keyed: Option<&Keyed<'_>>,
) -> Decided {
    let spent = units(std::slice::from_ref(msg));
    let decision = match reserve(project, spent) {
        Ok(d) => d,
        Err(answer) => return Decided::Now(answer),
    };
    let cost = units(std::slice::from_ref(msg));
    if fanout.shutting_down() {
        return Decided::Now(unavailable(project, Unavailable::ShuttingDown, cost));
    }
    let id = ids.next_id();
    let spec = project.history.get();
    if let (Some(keyed), Some(cluster)) = (keyed, fanout.cluster()) {
        let accepted = Accepted::One(id, None);
        let msgs = std::slice::from_ref(msg);
        return Decided::Later(keyed_publish(
            cluster, project, spec, msgs, accepted, decision, spent, keyed,
        ));
    }
    if let (true, Some(cluster)) = (spec.is_on(), fanout.cluster()) {
        let accepted = Accepted::One(id, None);
        let msgs = std::slice::from_ref(msg);
        return Decided::Later(cluster_publish(
            cluster, project, spec, msgs, accepted, decision, spent,
        ));
    }
    Decided::Now(accept_now(project, msg, id, spec, decision, spent, fanout))
}

/// The rest of [`accept`] on a single node, or for a project without history.
fn accept_now(
    project: &ProjectState,
    msg: &Publish<'_>,
    id: Id,
    spec: HistorySpec,
    decision: Decision,
    spent: u32,
    fanout: &dyn Fanout,
) -> Answer {
    let cost = spent;
    if spec.is_on() {
        let Some(first) =
            publish_with_history(project, spec, std::slice::from_ref(msg), &[id], fanout)
        else {
            return unavailable(project, Unavailable::QueueFull, cost);
        };
        // The answer carries a position only for a single-channel publish.
        let position = first.filter(|_| msg.channels.is_single());
        return Answer {
            outcome: Ok(Accepted::One(id, position)),
            index: None,
            rate: decision,
            retry_after_s: None,
            units: spent,
        };
    }
    let queued = match &msg.channels {
        parse::Channels::One(channel) => {
            let frame = encode::message_frame(channel, msg.event, msg.data, id.as_str());
            fanout.broadcast(Arc::new(Broadcast::new(
                project.index,
                (*channel).into(),
                frame,
                msg.except,
            )))
        }
        parse::Channels::Many(names) => {
            let mut frames = Vec::with_capacity(names.len());
            encode_into(project.index, msg, &id, &mut frames);
            fanout.broadcast_batch(frames.into())
        }
    };
    if !queued {
        return unavailable(project, Unavailable::QueueFull, cost);
    }
    Answer {
        outcome: Ok(Accepted::One(id, None)),
        index: None,
        rate: decision,
        retry_after_s: None,
        units: spent,
    }
}

/// Handle a batch whose body has been read: validate every message, take the quota of
/// the whole batch in one step, encode each frame once and hand all of them to each
/// interested worker in one push. All or nothing at every step.
pub(crate) fn accept_batch(
    project: &Arc<ProjectState>,
    body: &[u8],
    limits: BatchLimits,
    parser: &mut PublishParser,
    ids: &IdGen,
    fanout: &dyn Fanout,
    keyed: Option<&Keyed<'_>>,
) -> Decided {
    let msgs = match parser.parse_batch(body, limits) {
        Ok(msgs) => msgs,
        Err(BatchError { error, index }) => {
            return Decided::Now(Answer::refused(error, index, project.quota.peek(now_ns())))
        }
    };
    publish_batch(project, &msgs, ids, fanout, keyed)
}

/// Publish validated messages all or nothing: the quota of all of them in one step, one
/// id each, every frame handed to each interested worker in one push (through history
/// when the project keeps it). What [`accept_batch`] does once the body parsed; the
/// Pusher API's `batch_events` comes here with the events it validated.
pub(crate) fn publish_batch(
    project: &Arc<ProjectState>,
    msgs: &[Publish<'_>],
    ids: &IdGen,
    fanout: &dyn Fanout,
    keyed: Option<&Keyed<'_>>,
) -> Decided {
    let units = units(msgs);
    let decision = match reserve(project, units) {
        Ok(d) => d,
        Err(answer) => return Decided::Now(answer),
    };
    if fanout.shutting_down() {
        return Decided::Now(unavailable(project, Unavailable::ShuttingDown, units));
    }
    let id_list: Vec<Id> = msgs.iter().map(|_| ids.next_id()).collect();
    let spec = project.history.get();
    if let (Some(keyed), Some(cluster)) = (keyed, fanout.cluster()) {
        let accepted = Accepted::Many(id_list);
        return Decided::Later(keyed_publish(
            cluster, project, spec, msgs, accepted, decision, units, keyed,
        ));
    }
    if let (true, Some(cluster)) = (spec.is_on(), fanout.cluster()) {
        let accepted = Accepted::Many(id_list);
        return Decided::Later(cluster_publish(
            cluster, project, spec, msgs, accepted, decision, units,
        ));
    }
    Decided::Now(batch_now(
        project, msgs, id_list, spec, decision, units, fanout,
    ))
}

/// The rest of [`accept_batch`] on a single node, or for a project without history.
fn batch_now(
    project: &ProjectState,
    msgs: &[Publish<'_>],
    id_list: Vec<Id>,
    spec: HistorySpec,
    decision: Decision,
    units: u32,
    fanout: &dyn Fanout,
) -> Answer {
    let queued = if spec.is_on() {
        publish_with_history(project, spec, msgs, &id_list, fanout).is_some()
    } else {
        let mut frames = Vec::with_capacity(units as usize);
        for (msg, id) in msgs.iter().zip(&id_list) {
            encode_into(project.index, msg, id, &mut frames);
        }
        fanout.broadcast_batch(frames.into())
    };
    if !queued {
        return unavailable(project, Unavailable::QueueFull, units);
    }
    Answer {
        outcome: Ok(Accepted::Many(id_list)),
        index: None,
        rate: decision,
        retry_after_s: None,
        units,
    }
}
