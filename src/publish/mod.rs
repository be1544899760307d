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
//! History: a project that keeps it hands its messages to the node's history backend
//! (`history::backend::Backend`, chosen at start: this node's lock, or Redis in cluster
//! mode), which positions them and hands this node's frames to the mailboxes through
//! [`Fanout`]; this module never names the cluster.
//!
//! Idempotent publish ([`idempotency`]): on a single node the HTTP layer claims a keyed
//! request's key before it comes here and never passes a [`Keyed`]; where the history
//! backend decides keys (cluster mode) it passes one, and the backend publishes the
//! request by Redis' idempotent script ([`keyed_publish`]), which answers a retry from
//! what it stored.

pub(crate) mod idempotency;
pub(crate) mod parse;
pub(crate) mod pusher;

use std::sync::Arc;

use crate::auth::ProjectState;
use crate::error::{ApiError, Unavailable};
use crate::history::backend::{
    self, Backend, Framed, KeyTerms, KeyedAsk, Message, Project, PublishAsk, Sequenced, Template,
};
use crate::history::{HistorySpec, Position};
use crate::ids::{Id, IdGen};
use crate::quota::{now_ns, Decision};
use crate::reply::{Reply, Unreachable};
use crate::shard::mailbox::{Broadcast, BroadcastBatch, Mailboxes, Relay};
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
    pub terms: KeyTerms<'a>,
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

/// What an accepted publish (or client event) needs of its node: the mailboxes of its
/// workers, the relay to other nodes, the shutdown flag, the history backend. The hand
/// over itself is written here once ([`Fanout::broadcast`]), for every node kind.
pub(crate) trait Fanout {
    /// Every worker's mailbox on this node.
    fn mailboxes(&self) -> &Mailboxes;
    /// Cluster mode's relay to the other nodes; `None` on a single node.
    fn relay(&self) -> Option<&dyn Relay>;
    /// Hand one encoded message to every worker that wants it, and (cluster mode) to
    /// the other nodes; `false` when any mailbox or the relay is full (nothing sent).
    /// Only what was accepted locally is relayed: a `false` means no node delivers it.
    /// The relay is an `Arc` clone into a bounded queue: no allocation, no wait.
    fn broadcast(&self, msg: Arc<Broadcast>) -> bool {
        match self.relay() {
            None => self.mailboxes().broadcast(msg),
            Some(relay) => {
                if !relay.room(1) || !self.mailboxes().broadcast(Arc::clone(&msg)) {
                    return false;
                }
                relay.relay(msg);
                true
            }
        }
    }
    /// Hand several encoded messages to every worker in one push each, in order, and
    /// relay them; `false` (and nothing queued) when any mailbox or the relay is full.
    fn broadcast_batch(&self, batch: BroadcastBatch) -> bool {
        let relay = self.relay();
        // No room to relay it: 503 rather than a 202 whose relays are dropped.
        if relay.is_some_and(|r| !r.room(batch.len())) {
            return false;
        }
        if !self.mailboxes().broadcast_batch(Arc::clone(&batch)) {
            return false;
        }
        if let Some(relay) = relay {
            // Per-channel order holds: the relay queue is FIFO and one thread drains it.
            for msg in batch.iter() {
                relay.relay(Arc::clone(msg));
            }
        }
        true
    }
    /// Whether the service is shutting down.
    fn shutting_down(&self) -> bool;
    /// Where the node's channel history lives (only history projects and keyed
    /// publishes it decides touch it).
    fn history(&self) -> &dyn Backend;
}

/// What [`accept`] or [`accept_batch`] decided: answered now, or (cluster mode, a
/// history project) once Redis gave the messages their positions.
pub(crate) enum Decided {
    Now(Answer),
    Later(Later),
}

/// What a publish waits for from its history backend.
enum Waiting {
    /// A history publish's positions ([`Sequenced::Later`]).
    Positions(Reply<Result<Vec<Position>, Unreachable>>),
    /// A keyed publish's decision ([`keyed_publish`]).
    Keyed(Reply<Result<backend::Keyed, Unreachable>>),
}

/// A publish waiting for its history backend (Redis: see [`sequence`], [`keyed_publish`]).
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
        use backend::Keyed as K;
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

/// The messages of a request, one per message per channel, in request order, with
/// their ids.
fn messages<'a>(msgs: &'a [Publish<'a>], ids: &'a [Id]) -> Vec<Message<'a>> {
    let mut out = Vec::with_capacity(units(msgs) as usize);
    for (msg, id) in msgs.iter().zip(ids) {
        for &channel in msg.channels.as_slice() {
            out.push(Message {
                channel,
                event: msg.event,
                data: msg.data,
                id: id.as_str(),
                except: msg.except,
            });
        }
    }
    out
}

/// The ids of an accepted request, in message order.
fn id_list(accepted: &Accepted) -> &[Id] {
    match accepted {
        Accepted::One(id, _) => std::slice::from_ref(id),
        Accepted::Many(ids) => ids,
        Accepted::Replayed(_) => &[],
    }
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

/// A request whose quota was taken and whose ids were given, on its way out.
struct Admitted<'r, 'a> {
    project: &'r Arc<ProjectState>,
    spec: HistorySpec,
    msgs: &'r [Publish<'a>],
    accepted: Accepted,
    rate: Decision,
    units: u32,
}

impl Admitted<'_, '_> {
    /// One message to one channel: its answer carries the position.
    fn single(&self) -> bool {
        self.msgs.len() == 1 && self.msgs[0].channels.is_single()
    }

    /// The project as the history backend names it.
    fn project(&self) -> Project<'_> {
        Project {
            index: self.project.index,
            id: &self.project.id,
        }
    }

    /// Accepted now.
    fn answer(self) -> Answer {
        Answer {
            outcome: Ok(self.accepted),
            index: None,
            rate: self.rate,
            retry_after_s: None,
            units: self.units,
        }
    }

    /// Waiting for the backend's `reply`.
    fn later(self, reply: Waiting, single: bool) -> Later {
        Later {
            reply,
            project: Arc::clone(self.project),
            single,
            accepted: self.accepted,
            rate: self.rate,
            units: self.units,
        }
    }
}

/// A request with an `Idempotency-Key`, where the history backend decides keys
/// (cluster mode: Redis' idempotent script claims the key, publishes, through
/// history's script for a history project, and stores the answer, or answers the
/// stored one; see `cluster::idempotency`). Backend away: 503, nothing published.
fn keyed_publish(history: &dyn Backend, a: Admitted<'_, '_>, keyed: &Keyed<'_>) -> Later {
    let single = a.single();
    let answer = if keyed.pusher {
        Template {
            status: 200,
            head: b"{".to_vec(),
            tail: b"}",
            positioned: false,
        }
    } else {
        let (head, tail) = answer_head(&a.accepted).unwrap_or_default();
        Template {
            status: 202,
            head,
            tail,
            positioned: a.spec.is_on() && single,
        }
    };
    let ask = KeyedAsk {
        terms: keyed.terms,
        answer,
        spec: a.spec,
        messages: &messages(a.msgs, id_list(&a.accepted)),
    };
    let reply = history.keyed(a.project(), ask);
    a.later(Waiting::Keyed(reply), single && !keyed.pusher)
}

/// Publish a history project's messages through the node's history backend: each frame
/// gets the next offset of its channel, and this node's positioned frames are handed to
/// the mailboxes all or none. On a single node that happens now, under the history lock
/// (`Decided::Now`, with the first frame's position; a refused hand-over is a 503 that
/// leaves the history as it was); in cluster mode once Redis placed them.
fn sequence(fanout: &dyn Fanout, mut a: Admitted<'_, '_>) -> Decided {
    let single = a.single();
    let index = a.project.index;
    let mut hand = |frames: Vec<Framed<'_>>| {
        let mut out: Vec<Arc<Broadcast>> = frames
            .into_iter()
            .map(|f| Arc::new(Broadcast::new(index, f.channel.into(), f.frame, f.except)))
            .collect();
        match out.len() {
            1 => fanout.broadcast(out.swap_remove(0)),
            _ => fanout.broadcast_batch(out.into()),
        }
    };
    let msgs = messages(a.msgs, id_list(&a.accepted));
    let ask = PublishAsk {
        project: a.project(),
        spec: a.spec,
        msgs: &msgs,
    };
    match fanout.history().publish(ask, &mut hand) {
        Sequenced::Here(None) => {
            Decided::Now(unavailable(a.project, Unavailable::QueueFull, a.units))
        }
        Sequenced::Here(Some(first)) => {
            if let Accepted::One(_, position) = &mut a.accepted {
                // The answer carries a position only for a single-channel publish.
                *position = Some(first).filter(|_| single);
            }
            Decided::Now(a.answer())
        }
        Sequenced::Later(reply) => Decided::Later(a.later(Waiting::Positions(reply), single)),
    }
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
fn encode_into(project: u32, msg: &Publish<'_>, id: &str, out: &mut Vec<Arc<Broadcast>>) {
    for channel in msg.channels.as_slice() {
        let frame = encode::message_frame(channel, msg.event, msg.data, id);
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
    take(
        project,
        std::slice::from_ref(msg),
        ids,
        fanout,
        keyed,
        false,
    )
}

/// [`publish_one`] and [`publish_batch`] once their messages are valid: the quota of
/// all of them in one step (429), shutting down (503), one id per message (the batch's
/// answer lists them: `many`), then out ([`admitted`]).
fn take(
    project: &Arc<ProjectState>,
    msgs: &[Publish<'_>],
    ids: &IdGen,
    fanout: &dyn Fanout,
    keyed: Option<&Keyed<'_>>,
    many: bool,
) -> Decided {
    let units = units(msgs);
    let rate = match reserve(project, units) {
        Ok(d) => d,
        Err(answer) => return Decided::Now(answer),
    };
    if fanout.shutting_down() {
        return Decided::Now(unavailable(project, Unavailable::ShuttingDown, units));
    }
    let accepted = match many {
        false => Accepted::One(ids.next_id(), None),
        true => Accepted::Many(msgs.iter().map(|_| ids.next_id()).collect()),
    };
    let a = Admitted {
        project,
        spec: project.history.get(),
        msgs,
        accepted,
        rate,
        units,
    };
    admitted(fanout, a, keyed)
}

/// A request whose quota was taken and ids given: decided by the history backend when
/// it is keyed and the backend decides keys, sequenced by it when the project keeps
/// history, else encoded once per frame and handed to the mailboxes now.
fn admitted(fanout: &dyn Fanout, a: Admitted<'_, '_>, keyed: Option<&Keyed<'_>>) -> Decided {
    let history = fanout.history();
    if let Some(keyed) = keyed.filter(|_| history.decides_keys()) {
        return Decided::Later(keyed_publish(history, a, keyed));
    }
    if a.spec.is_on() {
        return sequence(fanout, a);
    }
    let (index, ids) = (a.project.index, id_list(&a.accepted));
    let queued = if a.units == 1 {
        // The common case: one frame, one envelope, no list.
        let (msg, id) = (&a.msgs[0], ids[0].as_str());
        let channel = msg.channel();
        let frame = encode::message_frame(channel, msg.event, msg.data, id);
        fanout.broadcast(Arc::new(Broadcast::new(
            index,
            channel.into(),
            frame,
            msg.except,
        )))
    } else {
        let mut frames = Vec::with_capacity(a.units as usize);
        for (msg, id) in a.msgs.iter().zip(ids) {
            encode_into(index, msg, id.as_str(), &mut frames);
        }
        fanout.broadcast_batch(frames.into())
    };
    if !queued {
        return Decided::Now(unavailable(a.project, Unavailable::QueueFull, a.units));
    }
    Decided::Now(a.answer())
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
    take(project, msgs, ids, fanout, keyed, true)
}
