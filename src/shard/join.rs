//! The life of a subscription on this worker, from the session's one request to live.
//! [`Shard::join`] takes a subscribe the session decided to make (room, budget and
//! credential checked) and carries every step: a presence channel is joined through
//! the node's presence hub, registered once the hub accepts and answered with the
//! member list (or refused); a channel without history is registered and answered; a
//! history channel gets its position and, with `since`, its replay, on this node's
//! history or, in cluster mode, through Redis; a channel held already is answered
//! again. Joins that wait for another thread (the cluster's position and replay, the
//! presence hub's member list) wait in one table, [`Pending`], keyed by ticket; an
//! unsubscribe or the connection's end cancels its entry.
//!
//! Invariants (the ordering rule):
//! - A recovering subscriber gets every message after its `since` exactly once and in
//!   order: the replay covers up to the position read, later messages reach it live,
//!   after the replay. On a single node the history lock makes the position and the
//!   mailbox agree (see [`Shard::join`]); in cluster mode Redis' answer arrives in the
//!   mailbox between the messages the position covers and the later ones.
//! - The answer (`subscribed`, then the replay) leaves only once the subscription is
//!   live cluster-wide (`Shard::reply_when_live`), and no broadcast overtakes it.
//! - A presence join is registered only when the hub's answer arrives in the mailbox:
//!   the hub queued it after the join frame of this member, and queues every later
//!   join or leave frame after it, so the member list and the frames agree (see
//!   `presence`). A refused join was counted as held meanwhile: the hub is told to
//!   forget it, and the session forgets its channel.
//! - No fan-out happens under the history lock, and nothing waits on I/O.

use std::rc::Rc;

use bytes::Bytes;

use super::mailbox::{HistoryReady, PresenceAnswer};
use super::registry::Subscribed;
use super::{channel_hash, HistorySubscribe, PresenceJoin, Shard};
use crate::history::HistorySpec;
use crate::ws::conn::WsConn;

/// A subscribe the session asks the shard to make.
pub(crate) struct JoinRequest<'a> {
    pub project: u32,
    pub channel: &'a str,
    /// The project's history setting; off when the channel keeps none or the
    /// protocol does not use it (Pusher).
    pub history: HistorySpec,
    /// The client's `since` (offset, epoch): it asks for what it missed.
    pub since: Option<(u64, &'a str)>,
    /// The connection holds the channel already: answer again, replay nothing.
    pub again: bool,
    /// A presence channel: who joins, and how the answer is told. Used when the node
    /// has a presence hub (then history and `since` are not: presence channels keep
    /// none); without one the channel is joined as a private one.
    pub presence: Option<Presence>,
}

/// Who joins a presence channel, and how the session answers the hub's decision.
pub(crate) struct Presence {
    pub user_id: Box<str>,
    /// The credential's `info` as compact JSON text (an object).
    pub info: Option<Box<str>>,
    pub reply: PresenceReply,
}

/// How the session's protocol answers a presence join once the hub decided.
pub(crate) struct PresenceReply {
    /// The frame for (channel, presence object) of a join that went live, if its
    /// protocol answers one.
    pub joined: fn(&str, &str) -> Option<Bytes>,
    /// The frame refusing the join of a channel.
    pub refused: fn(&str, PresenceRefusal) -> Bytes,
    /// Run when a join is refused and the subscription ends with it: the session
    /// forgets the channel (its grant ends).
    pub forget: Box<dyn FnOnce()>,
}

/// Why the hub refused a presence join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PresenceRefusal {
    /// The channel has `max_presence_members` users and this one is not among them.
    Full,
    /// The hub holds this connection under another user (the session refuses that
    /// first; this is the hub's own guard).
    OtherUser,
}

/// How the session's protocol answers a subscribe: the frame for (channel, position,
/// recovered), if its protocol answers one.
pub(crate) type Answer = fn(&str, Option<(u64, &str)>, Option<bool>) -> Option<Bytes>;

/// What to do once the cluster answered a history subscribe.
pub(crate) type HistoryDone = Box<dyn FnOnce(&Shard, HistoryReady)>;

/// What a pending join waits for.
enum Wait {
    /// Redis' position (and replay) of a history channel ([`HistoryReady`]).
    History(HistoryDone),
    /// The presence hub's answer ([`PresenceAnswer`]) to the join of `conn`.
    Presence {
        conn: Rc<WsConn>,
        again: bool,
        reply: PresenceReply,
    },
}

/// A join waiting for another thread's answer (few, short-lived: a linear scan).
pub(super) struct Pending {
    ticket: u64,
    conn_id: u64,
    project: u32,
    channel: Box<str>,
    wait: Wait,
}

impl Pending {
    fn is(&self, conn_id: u64, project: u32, channel: &str) -> bool {
        self.conn_id == conn_id && self.project == project && &*self.channel == channel
    }
}

impl Shard {
    /// Subscribe `conn` as `req` says and send it `answer`'s frame (and a replay) in
    /// the order the module's invariants give.
    pub(crate) fn join(&self, conn: &Rc<WsConn>, mut req: JoinRequest<'_>, answer: Answer) {
        if let Some(presence) = req.presence.take() {
            if self.ask_hub(conn, &req, presence) {
                return;
            }
        }
        let JoinRequest {
            project,
            channel,
            history: spec,
            since,
            again,
            ..
        } = req;
        // A history channel in cluster mode: Redis knows its position.
        if spec.is_on() && self.ask_cluster(conn, &req, answer) {
            return;
        }
        let recovered = since.map(|_| false);
        if again {
            // Already live on this channel: nothing to replay (it would duplicate).
            let pos = spec
                .is_on()
                .then(|| self.history.lock().position(project, channel, spec));
            let position = pos.as_ref().map(|p| (p.offset, p.epoch.as_str()));
            // Behind the first answer if that one still waits for the cluster.
            if let Some(frame) = answer(channel, position, recovered) {
                self.reply_when_live(project, channel, conn, frame);
            }
            return;
        }
        if !spec.is_on() {
            let t = self.subscribe(project, channel, conn);
            debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
            // `since` on a channel without history: nothing can be recovered. The
            // answer waits until the subscription is live cluster-wide.
            if let Some(frame) = answer(channel, None, recovered) {
                self.reply_when_live(project, channel, conn, frame);
            }
            return;
        }
        // A history channel on this node. Under the history lock (no publish of the
        // channel can get an offset meanwhile), only: move out what this worker's
        // mailbox already holds (frames at or below the position read next, which the
        // new subscriber must not get), make later publishes of the channel reach this
        // mailbox, and read the position and the missed frames. After releasing it: fan
        // the moved envelopes out (the new subscriber is not registered yet, so it gets
        // none of them), then register it; every later frame has a higher offset and
        // sits in the mailbox until the worker drains it, after this synchronous code,
        // so it reaches the subscriber live, after the replay.
        // A replay larger than half the connection's send backlog is not attempted
        // (recovered: false): it would close the connection with 4008, and the client
        // would reconnect with the same `since` forever.
        let budget = conn.backlog_limit() / 2;
        let (mail, position, replay) = {
            let mut history = self.history.lock();
            let mail = self.take_mail();
            self.hold_interest(project, channel);
            let (position, replay) = match since {
                None => (history.position(project, channel, spec), None),
                Some((offset, epoch)) => {
                    let r = history.recover(project, channel, spec, offset, epoch, budget);
                    (r.position, r.frames)
                }
            };
            (mail, position, replay)
        };
        for envelope in mail {
            self.handle(envelope);
        }
        let t = self.subscribe(project, channel, conn);
        debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
        self.release_interest(project, channel);
        let recovered = since.map(|_| replay.is_some());
        // The answer and the replay leave once the subscription is live cluster-wide,
        // in this order (held together while it waits).
        let position = Some((position.offset, position.epoch.as_str()));
        if let Some(frame) = answer(channel, position, recovered) {
            self.reply_when_live(project, channel, conn, frame);
        }
        // Replayed messages are deliveries too (counted once per recovery).
        let mut replayed = 0u64;
        for frame in replay.into_iter().flatten() {
            replayed += u64::from(self.reply_when_live(project, channel, conn, frame));
        }
        if replayed > 0 {
            crate::metrics::with(|m| m.deliveries(replayed));
        }
    }

    /// A presence channel: ask the hub to add `conn` to its members. The join waits in
    /// [`Pending`]; the hub's answer, in mailbox order, registers the subscription and
    /// answers with the member list, or refuses ([`Shard::presence_answer`]). `false`
    /// (and `presence` dropped): this node has no presence hub.
    fn ask_hub(&self, conn: &Rc<WsConn>, req: &JoinRequest<'_>, presence: Presence) -> bool {
        let Some(watch) = &self.watch else {
            return false;
        };
        let ticket = self.new_ticket();
        let wait = Wait::Presence {
            conn: conn.clone(),
            again: req.again,
            reply: presence.reply,
        };
        self.wait(ticket, conn.id, req.project, req.channel, wait);
        watch.join(PresenceJoin {
            project: req.project,
            channel: req.channel.into(),
            user_id: presence.user_id,
            info: presence.info,
            worker: self.index,
            conn: conn.id,
            ticket,
        });
        true
    }

    /// Cluster mode: have the cluster answer a subscribe to a history channel; the
    /// continuation runs when Redis' answer reaches this worker's mailbox, between the
    /// messages the position covers and the later ones: the subscriber is registered
    /// there (unless it already is), so the replay and the live messages meet with no
    /// gap and no duplicate. `false`: not in cluster mode.
    fn ask_cluster(&self, conn: &Rc<WsConn>, req: &JoinRequest<'_>, answer: Answer) -> bool {
        if self.sink.is_none() {
            return false;
        }
        let (project, again) = (req.project, req.again);
        let recovering = req.since.is_some();
        let c = conn.clone();
        let ch: Box<str> = req.channel.into();
        let done: HistoryDone = Box::new(move |shard, ready| {
            if !again {
                let t = shard.subscribe(project, &ch, &c);
                debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
            }
            history_answer(&c, &ch, recovering, ready, answer);
        });
        // A held channel is live already: nothing to replay (it would duplicate), so
        // Redis is asked for the position only (answered `recovered: false`).
        let since = match again {
            true => None,
            false => req.since.map(|(offset, epoch)| (offset, epoch.into())),
        };
        let budget = conn.backlog_limit() / 2;
        self.history_subscribe(
            conn.id,
            project,
            req.channel,
            since,
            req.history,
            budget,
            done,
        )
    }

    /// Cluster mode: ask the cluster for a history channel's position (and replay)
    /// and run `done` when it answers, in mailbox order (see `InterestSink`).
    /// Meanwhile the channel's messages reach this mailbox (they go to the channel's
    /// other subscribers). `false` (and `done` dropped) when not in cluster mode.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn history_subscribe(
        &self,
        conn_id: u64,
        project: u32,
        channel: &str,
        since: Option<(u64, Box<str>)>,
        spec: HistorySpec,
        budget: usize,
        done: HistoryDone,
    ) -> bool {
        let Some(sink) = &self.sink else {
            return false;
        };
        let ticket = self.new_ticket();
        self.mailbox.interest.add(channel_hash(project, channel));
        let asked = sink.history_subscribe(HistorySubscribe {
            worker: self.index,
            ticket,
            project,
            channel: channel.into(),
            since,
            size: spec.size,
            ttl_s: spec.ttl_s,
            budget,
        });
        if !asked {
            self.mailbox.interest.remove(channel_hash(project, channel));
            return false;
        }
        self.wait(ticket, conn_id, project, channel, Wait::History(done));
        true
    }

    /// A new ticket, for a join that waits or a cluster confirmation.
    pub(super) fn new_ticket(&self) -> u64 {
        let ticket = self.next_ticket.get() + 1;
        self.next_ticket.set(ticket);
        ticket
    }

    fn wait(&self, ticket: u64, conn_id: u64, project: u32, channel: &str, wait: Wait) {
        self.pending.borrow_mut().push(Pending {
            ticket,
            conn_id,
            project,
            channel: channel.into(),
            wait,
        });
    }

    /// Take the pending join of `ticket`, if it is still waiting.
    fn take_pending(&self, ticket: u64) -> Option<Pending> {
        let mut pending = self.pending.borrow_mut();
        let at = pending.iter().position(|p| p.ticket == ticket)?;
        Some(pending.swap_remove(at))
    }

    /// The presence hub answered a join.
    pub(super) fn presence_ready(&self, ticket: u64, answer: PresenceAnswer) {
        // None: the connection left first (and told the hub so).
        if let Some(Pending {
            wait: Wait::Presence { conn, again, reply },
            project,
            channel,
            ..
        }) = self.take_pending(ticket)
        {
            self.presence_answer(project, &channel, &conn, again, reply, answer);
        }
    }

    /// Act on the hub's answer to a presence join: register the subscription and
    /// answer with the member list once it is live cluster-wide, or refuse. `again`:
    /// the channel was held already (a refusal as another user then leaves the held
    /// membership alone).
    fn presence_answer(
        &self,
        project: u32,
        channel: &str,
        conn: &Rc<WsConn>,
        again: bool,
        reply: PresenceReply,
        answer: PresenceAnswer,
    ) {
        let refused = match answer {
            PresenceAnswer::Joined(object) => {
                self.subscribe(project, channel, conn);
                if let Some(frame) = (reply.joined)(channel, &object) {
                    self.reply_when_live(project, channel, conn, frame);
                }
                return;
            }
            PresenceAnswer::Full => PresenceRefusal::Full,
            PresenceAnswer::OtherUser if again => {
                conn.send((reply.refused)(channel, PresenceRefusal::OtherUser));
                return;
            }
            PresenceAnswer::OtherUser => PresenceRefusal::OtherUser,
        };
        // The join never went live: the session forgets it (on its next frame); the
        // pending join counted as held until now, so the hub is told to forget it.
        (reply.forget)();
        self.unsubscribe(project, channel, conn.id);
        conn.send((reply.refused)(channel, refused));
    }

    /// The cluster answered a history subscribe: run its continuation, then give back
    /// the interest it held.
    pub(super) fn history_ready(&self, ticket: u64, ready: HistoryReady) {
        // None: cancelled (unsubscribed or closed), its hold given back then.
        if let Some(Pending {
            wait: Wait::History(done),
            project,
            channel,
            ..
        }) = self.take_pending(ticket)
        {
            done(self, ready);
            self.release_history_hold(project, &channel);
        }
    }

    /// Forget `conn_id`'s waiting joins of a channel it leaves (a history subscribe's
    /// hold is given back; a presence join's answer will find nothing). `true` when a
    /// join was waiting: the session counts the channel as its own, so a server
    /// unsubscribe or an expiry must tell it (and the client) as for a held one.
    pub(super) fn cancel_pending(&self, project: u32, channel: &str, conn_id: u64) -> bool {
        let mut holds = 0;
        let mut any = false;
        self.pending.borrow_mut().retain_mut(|p| {
            if !p.is(conn_id, project, channel) {
                return true;
            }
            any = true;
            if matches!(p.wait, Wait::History(_)) {
                holds += 1;
            }
            false
        });
        for _ in 0..holds {
            self.release_history_hold(project, channel);
        }
        any
    }

    fn release_history_hold(&self, project: u32, channel: &str) {
        self.mailbox.interest.remove(channel_hash(project, channel));
        if let Some(sink) = &self.sink {
            sink.interest(self.index, project, channel, false, 0);
        }
    }
}

/// Send a cluster-mode history subscribe's answer: the position Redis gave (none when
/// Redis could not be asked), then the replay.
fn history_answer(
    conn: &Rc<WsConn>,
    channel: &str,
    recovering: bool,
    ready: HistoryReady,
    answer: Answer,
) {
    match ready {
        HistoryReady::Position {
            offset,
            epoch,
            replay,
        } => {
            let recovered = recovering.then_some(replay.is_some());
            if let Some(frame) = answer(channel, Some((offset, &epoch)), recovered) {
                conn.send(frame);
            }
            let mut replayed = 0u64;
            for frame in replay.into_iter().flatten() {
                replayed += u64::from(conn.send(frame));
            }
            if replayed > 0 {
                crate::metrics::with(|m| m.deliveries(replayed));
            }
        }
        HistoryReady::Unknown => {
            if let Some(frame) = answer(channel, None, recovering.then_some(false)) {
                conn.send(frame);
            }
        }
    }
}
