//! The one seam between channel history and its callers: where a history project's
//! messages get their positions, where kept messages are read back, and who decides a
//! publish with an `Idempotency-Key`. Chosen once at start (`server`): this node's
//! [`History`] on a single node, the cluster bridge's Redis history in cluster mode
//! (`cluster::history` implements [`Backend`] for it). The publish endpoints and the
//! REST read ask the node's backend and never which one it is; neither names the
//! cluster.
//!
//! Invariants, for every backend:
//! - A publish is all or nothing: every frame of it gets a position and is delivered,
//!   or none is and nothing is kept ([`Sequenced`]).
//! - A channel's frames reach every subscriber in offset order: on a single node the
//!   history lock covers offset assignment, encoding and the hand-over to the mailboxes
//!   ([`Backend::publish`] for [`History`]); in cluster mode Redis runs one script per
//!   publish and every node receives the positioned frames in that order.
//! - A read writes nothing (a channel never published to answers offset 0 under the
//!   epoch its first message will take).
//!
//! What a subscribe asks of history (its position, its replay, and the rule that the
//! replay and the live frames meet with no gap and no duplicate) is bound to the
//! worker's mailbox; it lives in `shard::join`, which asks this node's [`History`] or
//! the cluster through the shard's interest sink.

use std::collections::HashMap;

use bytes::Bytes;

use super::{Entry, History, HistorySpec, Position};
use crate::ids::SocketId;
use crate::reply::{Reply, Unreachable};
use crate::wire::native::message_frame_at;

/// The project a call is for: its dense index (this node's tables) and its id (Redis'
/// keys).
#[derive(Clone, Copy)]
pub(crate) struct Project<'a> {
    pub index: u32,
    pub id: &'a str,
}

/// One message to one channel, as the publish endpoint accepted it (a message to
/// several channels is one of these per channel).
pub(crate) struct Message<'a> {
    pub channel: &'a str,
    pub event: &'a str,
    /// The raw JSON text of `data`.
    pub data: &'a [u8],
    pub id: &'a str,
    /// The connection the message must not reach (`socket_id`).
    pub except: Option<SocketId>,
}

/// A publish of a history project's messages (already admitted: quota taken, ids
/// given; one [`Message`] per message per channel, in request order).
pub(crate) struct PublishAsk<'a> {
    pub project: Project<'a>,
    pub spec: HistorySpec,
    pub msgs: &'a [Message<'a>],
}

/// A positioned frame for this node's workers.
pub(crate) struct Framed<'a> {
    pub channel: &'a str,
    pub frame: Bytes,
    pub except: Option<SocketId>,
}

/// Hands a publish's positioned frames, in order, to this node's workers (all or
/// none): `false` when any mailbox refused, and then nothing was queued.
pub(crate) type Handover<'h> = &'h mut dyn FnMut(Vec<Framed<'_>>) -> bool;

/// Where a publish stands once its backend took it.
pub(crate) enum Sequenced {
    /// Placed and handed over on this node: the first frame's position (the answer of a
    /// single-channel publish); `None` when the mailboxes refused it (nothing kept).
    Here(Option<Position>),
    /// Redis places it and every node (this one included) delivers it: the positions
    /// of every frame, in order, once Redis answered; [`Unreachable`]: not published
    /// (or published without this answer: RELIABILITY.md).
    Later(Reply<Result<Vec<Position>, Unreachable>>),
}

/// One kept message as a read returns it.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub offset: u64,
    pub event: Box<str>,
    /// The raw JSON text of `data`.
    pub data: Bytes,
    pub id: Box<str>,
}

/// A channel's position and kept messages, oldest first.
#[derive(Debug)]
pub(crate) struct Read {
    pub position: Position,
    pub messages: Vec<Kept>,
}

/// A REST read: without `since` the newest `limit` messages, with it the first `limit`
/// after it.
pub(crate) struct ReadAsk<'a> {
    pub channel: &'a str,
    pub spec: HistorySpec,
    pub since: Option<u64>,
    pub limit: usize,
}

/// What a read gave: now, or once Redis answered.
pub(crate) enum ReadAnswer {
    Here(Read),
    Later(Reply<Result<Read, Unreachable>>),
}

/// The answer of an accepted keyed request, as its node writes it: `head`, then (when
/// `positioned`) `,"offset":N,"epoch":"E"` of the first frame, then `tail`. Redis
/// stores it, so a retry on any node gets the same bytes.
pub(crate) struct Template {
    pub status: u16,
    pub head: Vec<u8>,
    pub tail: &'static [u8],
    pub positioned: bool,
}

/// A request's `Idempotency-Key` and the terms it is decided under.
#[derive(Clone, Copy)]
pub(crate) struct KeyTerms<'a> {
    pub key: &'a [u8],
    /// SHA-256 of the request body.
    pub body_hash: [u8; 32],
    /// `idempotency_window_s`, in milliseconds.
    pub window_ms: u64,
    /// `idempotency_max_keys_per_project`.
    pub max_keys: usize,
}

/// A publish with an `Idempotency-Key`, for a backend that decides keys.
pub(crate) struct KeyedAsk<'a> {
    pub terms: KeyTerms<'a>,
    pub answer: Template,
    /// The project's history setting (off: published without positions).
    pub spec: HistorySpec,
    pub messages: &'a [Message<'a>],
}

/// What the backend decided for a keyed publish.
#[derive(Debug)]
pub(crate) enum Keyed {
    /// Published now; the positions of a history publish's frames, in order, and how
    /// many older keys of the project were forgotten to stay within the bound.
    Published(Vec<Position>, u64),
    /// Accepted before with the same body: its answer.
    Replay { status: u16, body: Bytes },
    /// Known with another body.
    Reused,
}

/// Where a node's channel history lives (see the module docs).
pub(crate) trait Backend: Send + Sync {
    /// Give each of `ask`'s messages the next offset of its channel and deliver it;
    /// this node's frames go through `hand`.
    fn publish(&self, ask: PublishAsk<'_>, hand: Handover<'_>) -> Sequenced;

    /// A channel's position and kept messages (`GET /api/v1/history`).
    fn read(&self, project: Project<'_>, ask: ReadAsk<'_>) -> ReadAnswer;

    /// Whether this backend decides keyed publishes ([`Backend::keyed`]); when not, the
    /// HTTP layer claims keys on this node (`publish::idempotency`) and never passes one.
    fn decides_keys(&self) -> bool;

    /// Claim `ask`'s key, publish it (with positions when its project keeps history)
    /// and store its answer, or answer the stored one, in one step.
    fn keyed(&self, project: Project<'_>, ask: KeyedAsk<'_>) -> Reply<Result<Keyed, Unreachable>>;
}

/// A single node: offsets are given under the history lock, which also covers the
/// encoding and the hand-over, so every mailbox receives a channel's frames in offset
/// order and a publish the mailboxes refuse (503) leaves the history as it was.
impl Backend for History {
    fn publish(&self, ask: PublishAsk<'_>, hand: Handover<'_>) -> Sequenced {
        let PublishAsk {
            project,
            spec,
            msgs,
        } = ask;
        let mut history = self.lock();
        let mut frames = Vec::with_capacity(msgs.len());
        let mut kept = Vec::with_capacity(msgs.len());
        // The last position given to each channel in this request (only when there are
        // several frames: a channel may come back, and its log is not written yet).
        let mut given: HashMap<&str, Position> = HashMap::new();
        let mut first = None;
        for msg in msgs {
            let last = match given.get(msg.channel) {
                Some(p) => *p,
                None => history.position(project.index, msg.channel, spec),
            };
            let pos = Position {
                offset: last.offset + 1,
                epoch: last.epoch,
            };
            first.get_or_insert(pos);
            if msgs.len() > 1 {
                given.insert(msg.channel, pos);
            }
            let (frame, span) = message_frame_at(
                msg.channel,
                msg.event,
                msg.data,
                msg.id,
                pos.offset,
                pos.epoch.as_str(),
            );
            kept.push((pos, frame.clone(), span));
            frames.push(Framed {
                channel: msg.channel,
                frame,
                except: msg.except,
            });
        }
        if !hand(frames) {
            return Sequenced::Here(None);
        }
        for (msg, (pos, frame, span)) in msgs.iter().zip(kept) {
            let data = frame.slice(span);
            let entry = Entry::new(pos.offset, frame, msg.event, data, msg.id);
            history.push(project.index, msg.channel, spec, pos, entry);
        }
        history.enforce_budget();
        Sequenced::Here(first)
    }

    fn read(&self, project: Project<'_>, ask: ReadAsk<'_>) -> ReadAnswer {
        let (position, entries) =
            self.lock()
                .read(project.index, ask.channel, ask.spec, ask.since, ask.limit);
        let messages = entries
            .into_iter()
            .map(|e| Kept {
                offset: e.offset,
                event: e.event,
                data: e.data,
                id: e.id,
            })
            .collect();
        ReadAnswer::Here(Read { position, messages })
    }

    fn decides_keys(&self) -> bool {
        false
    }

    /// Never asked (`decides_keys` is false: the HTTP layer claims keys on a single
    /// node); were it asked, the request is refused as unreachable (503) rather than
    /// published without its key's protection.
    fn keyed(&self, _: Project<'_>, _: KeyedAsk<'_>) -> Reply<Result<Keyed, Unreachable>> {
        let (tx, reply) = crate::reply::reply();
        drop(tx);
        reply
    }
}
