//! One client's protocol session over an established WebSocket: subscribe /
//! unsubscribe / ping from the client; subscribed / unsubscribed / pong / error replies
//! from the server (docs/protocol.md).
//!
//! Invariants: errors that a client can cause with a frame (bad JSON, unknown type,
//! invalid channel, too many subscriptions) are answered with an error frame and keep
//! the connection open; only binary frames (1003) and protocol violations close it.
//! Subscribing twice is idempotent (one delivery per publish, whatever happens), as is
//! unsubscribing from a channel one is not in. Client frames are parsed with simd-json in
//! place: the payload buffer is ours and mutable.
//!
//! Private channels (`client::private`): a subscribe to one is verified (its `token`)
//! before it subscribes and refused with `forbidden` and no subscription; `refresh`
//! moves a held grant's expiry.
//!
//! Subscribes and refreshes that would do work take one unit of the connection's budget
//! (`client::admit`) after every check that refuses for another reason and before any
//! token is verified; over it they are answered `rate_limited` and do nothing.
//!
//! The grants live beside `subscriptions`, in the session's extras (made on the first
//! private subscribe or client event; most connections never make one); one the
//! worker's expiry timer ended is pruned from both when the next frame arrives.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use simd_json::prelude::{ValueAsScalar, ValueObjectAccess};

use crate::auth::token::{Grant as TokenGrant, TokenRefusal};
use crate::auth::ProjectState;
use crate::close::Disconnect;
use crate::ids::SocketId;
use crate::shard::registry::Subscribed;
use crate::ws::conn::{ReadCtx, Session, WsConn};
use crate::ws::frame::Opcode;

use super::admit::Budget;
use super::ctx::SessionCtx;
use super::events::{self, ClientEvent, RateLog, Refusal};
use super::private::{needs_token, unix_now, Grant};
use super::subs::Subs;
use crate::presence::{Hub, Join};
use crate::shard::mailbox::PresenceAnswer;
use crate::shard::{is_presence, PresenceDone};
use crate::wire::native::{
    channel_error_frame, error_frame, refreshed_frame, reply, subscribed, subscribed_presence, PONG,
};

/// A subscribe's `since`: the last position the client saw.
struct Since<'a> {
    offset: u64,
    epoch: &'a str,
}

/// One client's protocol state, owned by its reader task. Kept small (it is inline in
/// every connection's reader): the worker-wide parts are one shared [`SessionCtx`], the
/// connection id is computed when a client event needs it, one channel is held
/// inline, and grants and the client-event log exist only once used.
pub(crate) struct ClientSession {
    ctx: Rc<SessionCtx>,
    /// The project whose channels this connection sees (from its key).
    project: Arc<ProjectState>,
    /// Channels this connection is subscribed to (bounded by
    /// `max_subscriptions_per_connection`, which `ctx.admission` holds).
    subscriptions: Subs,
    /// Grants and the client-event log: `None` until the first private subscribe or
    /// client event (most connections never make one).
    extras: Option<Box<Extras>>,
    /// This connection's subscribe budget.
    budget: Budget,
}

/// A session's rarely used state.
#[derive(Default)]
struct Extras {
    /// One grant per private channel in `subscriptions`.
    grants: Vec<Rc<Grant>>,
    /// This connection's recent client events (made on its first one).
    event_log: Option<Box<RateLog>>,
}

impl ClientSession {
    pub(crate) fn new(ctx: Rc<SessionCtx>, project: Arc<ProjectState>) -> ClientSession {
        ClientSession {
            ctx,
            project,
            subscriptions: Subs::None,
            extras: None,
            budget: Budget::default(),
        }
    }

    /// The grants held (none without extras).
    fn grants(&self) -> &[Rc<Grant>] {
        self.extras.as_ref().map_or(&[], |x| &x.grants)
    }

    /// The extras, made on first use.
    fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// Take one subscribe or refresh from this connection's budget; over it, answer
    /// `rate_limited` (the frame then does nothing).
    fn within_budget(&mut self, conn: &Rc<WsConn>, channel: &str) -> bool {
        if self
            .ctx
            .admission
            .take(&mut self.budget, crate::quota::now_ns())
        {
            return true;
        }
        conn.send(channel_error_frame(
            "rate_limited",
            channel,
            &self.ctx.admission.refusal(),
        ));
        false
    }

    /// A subscribe to a public channel: free when the channel is held already (answered
    /// again) or refused for the subscription limit, charged otherwise.
    fn subscribe_public(&mut self, conn: &Rc<WsConn>, channel: &str, since: Option<Since<'_>>) {
        let held = self.subscriptions.contains(channel);
        if !held && (!self.room_for_one_more(conn) || !self.within_budget(conn, channel)) {
            return;
        }
        self.subscribe(conn, channel, since);
    }

    /// Whether this connection may take one more channel; answers the client if not.
    fn room_for_one_more(&self, conn: &Rc<WsConn>) -> bool {
        if self.subscriptions.len() >= self.ctx.admission.max_subscriptions() {
            conn.send(error_frame(
                "too_many_subscriptions",
                "this connection has reached its subscription limit",
            ));
            return false;
        }
        if self.ctx.shard.subscriptions_full() {
            conn.send(error_frame(
                "too_many_subscriptions",
                "the server holds as many subscriptions as it may; try again later",
            ));
            return false;
        }
        true
    }

    /// Channels this session holds.
    #[cfg(test)]
    pub(crate) fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.subscriptions.iter()
    }

    fn subscribe(&mut self, conn: &Rc<WsConn>, channel: &str, since: Option<Since<'_>>) {
        let spec = self.project.history.get();
        if self.subscriptions.contains(channel) {
            // Already live on this channel: nothing to replay (it would duplicate).
            if spec.is_on() && self.ask_cluster(conn, channel, None, since.is_some(), true) {
                return;
            }
            if spec.is_on() {
                let pos =
                    self.ctx
                        .shard
                        .history()
                        .lock()
                        .position(self.project.index, channel, spec);
                let recovered = since.map(|_| false);
                // Behind the first `subscribed` if that one still waits for the cluster.
                self.ctx.shard.reply_when_live(
                    self.project.index,
                    channel,
                    conn,
                    subscribed(channel, Some((pos.offset, pos.epoch.as_str())), recovered),
                );
            } else {
                let reply = subscribed(channel, None, since.map(|_| false));
                self.ctx
                    .shard
                    .reply_when_live(self.project.index, channel, conn, reply);
            }
            return;
        }
        if !self.room_for_one_more(conn) {
            return;
        }
        if !spec.is_on() {
            let t = self.ctx.shard.subscribe(self.project.index, channel, conn);
            debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
            self.subscriptions.push(channel);
            // `since` on a channel without history: nothing can be recovered. The shard
            // holds the answer until the subscription is live cluster-wide.
            let reply = subscribed(channel, None, since.map(|_| false));
            self.ctx
                .shard
                .reply_when_live(self.project.index, channel, conn, reply);
            return;
        }
        // A history channel in cluster mode: Redis knows its position.
        let wanted = since
            .as_ref()
            .map(|s| (s.offset, Box::<str>::from(s.epoch)));
        if self.ask_cluster(conn, channel, wanted, since.is_some(), false) {
            self.subscriptions.push(channel);
            return;
        }
        // A history channel. Under the history lock (no publish of the channel can get
        // an offset meanwhile), only: move out what this worker's mailbox already holds
        // (frames at or below the position read next, which the new subscriber must not
        // get), make later publishes of the channel reach this mailbox, and read the
        // position and the missed frames. After releasing it: fan the moved envelopes
        // out (the new subscriber is not registered yet, so it gets none of them), then
        // register it; every later frame has a higher offset and sits in the mailbox
        // until the worker drains it, after this synchronous code, so it reaches the
        // subscriber live, after the replay. No fan-out happens under the lock.
        // A replay larger than half the connection's send backlog is not attempted
        // (recovered: false): it would close the connection with 4008, and the client
        // would reconnect with the same `since` forever.
        let budget = conn.backlog_limit() / 2;
        let (mail, position, replay) = {
            let mut history = self.ctx.shard.history().lock();
            let mail = self.ctx.shard.take_mail();
            self.ctx.shard.hold_interest(self.project.index, channel);
            let (position, replay) = match &since {
                None => (history.position(self.project.index, channel, spec), None),
                Some(s) => {
                    let r = history.recover(
                        self.project.index,
                        channel,
                        spec,
                        s.offset,
                        s.epoch,
                        budget,
                    );
                    (r.position, r.frames)
                }
            };
            (mail, position, replay)
        };
        for envelope in mail {
            self.ctx.shard.handle(envelope);
        }
        let t = self.ctx.shard.subscribe(self.project.index, channel, conn);
        debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
        self.ctx.shard.release_interest(self.project.index, channel);
        self.subscriptions.push(channel);
        let recovered = since.map(|_| replay.is_some());
        // `subscribed` and the replay leave once the subscription is live cluster-wide,
        // in this order (the shard holds them together while it waits).
        let reply = subscribed(
            channel,
            Some((position.offset, position.epoch.as_str())),
            recovered,
        );
        self.ctx
            .shard
            .reply_when_live(self.project.index, channel, conn, reply);
        // Replayed messages are deliveries too (counted once per recovery).
        let mut replayed = 0u64;
        for frame in replay.into_iter().flatten() {
            replayed += u64::from(self.ctx.shard.reply_when_live(
                self.project.index,
                channel,
                conn,
                frame,
            ));
        }
        if replayed > 0 {
            crate::metrics::with(|m| m.deliveries(replayed));
        }
    }

    /// Cluster mode: have the cluster answer a subscribe to a history channel. The
    /// shard runs the continuation when Redis' answer reaches this worker's mailbox,
    /// between the messages the position covers and the later ones: the subscriber
    /// is registered there (unless `again`: it already is), so the replay and the live
    /// messages meet with no gap and no duplicate. `false`: not in cluster mode.
    fn ask_cluster(
        &self,
        conn: &Rc<WsConn>,
        channel: &str,
        since: Option<(u64, Box<str>)>,
        recovering: bool,
        again: bool,
    ) -> bool {
        let spec = self.project.history.get();
        let project = self.project.index;
        let budget = conn.backlog_limit() / 2;
        let c = conn.clone();
        let ch: Box<str> = channel.into();
        let done: crate::shard::HistoryDone = Box::new(move |shard, ready| {
            if !again {
                let t = shard.subscribe(project, &ch, &c);
                debug_assert_ne!(t, Subscribed::Already, "the session and the registry agree");
            }
            history_answer(&c, &ch, recovering, ready);
        });
        self.ctx
            .shard
            .history_subscribe(conn.id, project, channel, since, spec, budget, done)
    }

    /// Subscribe to a private channel: the checks that need no token, the budget, the
    /// token, then as any subscribe.
    fn subscribe_private(
        &mut self,
        conn: &Rc<WsConn>,
        channel: &str,
        token: Option<&str>,
        since: Option<Since<'_>>,
    ) {
        let Some(token) = token else {
            return forbidden(conn, channel, TokenRefusal::Missing);
        };
        let held = self.grant(channel);
        if held.is_none() && !self.room_for_one_more(conn) {
            return;
        }
        // A held channel's token is checked too (it acts as a refresh): charged.
        if !self.within_budget(conn, channel) {
            return;
        }
        let granted = match self.verify(channel, token) {
            Ok(g) => g,
            Err(refusal) => return forbidden(conn, channel, refusal),
        };
        if let Some(held) = held {
            // Subscribed already: a fresh token acts as a refresh; `subscribe` answers
            // as for any repeated subscribe.
            if held.sub.as_deref() != granted.sub.as_deref() {
                return forbidden(conn, channel, TokenRefusal::SubjectChanged);
            }
            self.ctx.expiry.arm(&held, granted.exp);
            if let (Some(hub), Some(user)) = (&self.ctx.presence, held.sub.clone()) {
                if is_presence(channel) {
                    // Answered with the member list again; membership is unchanged.
                    return self.join_presence(hub, conn, &held, &user, granted.info, true);
                }
            }
            return self.subscribe(conn, channel, since);
        }
        if is_presence(channel) {
            if let Some(hub) = self.ctx.presence.clone() {
                return self.subscribe_presence(&hub, conn, channel, granted);
            }
        }
        self.subscribe(conn, channel, since);
        if self.subscriptions.contains(channel) {
            let grant = Grant::new(self.project.index, channel, conn, granted.sub, granted.exp);
            self.ctx.expiry.arm(&grant, granted.exp);
            self.extras().grants.push(grant);
        }
    }

    /// Subscribe to a presence channel: a member (the token's `sub`) joins through the
    /// node's hub, which answers with the member list (or `presence_full`). The channel
    /// counts as held from now on, so an unsubscribe or close before the answer still
    /// tells the hub. Presence channels keep no history: `since` is not used.
    fn subscribe_presence(
        &mut self,
        hub: &Arc<Hub>,
        conn: &Rc<WsConn>,
        channel: &str,
        granted: TokenGrant,
    ) {
        let user = match granted.sub {
            Some(ref u) if (1..=128).contains(&u.chars().count()) => u.clone(),
            _ => return forbidden(conn, channel, TokenRefusal::NoSubject),
        };
        if !self.room_for_one_more(conn) {
            return;
        }
        self.subscriptions.push(channel);
        let grant = Grant::new(
            self.project.index,
            channel,
            conn,
            Some(user.clone()),
            granted.exp,
        );
        self.ctx.expiry.arm(&grant, granted.exp);
        self.extras().grants.push(grant.clone());
        self.join_presence(hub, conn, &grant, &user, granted.info, false);
    }

    /// Ask the hub to add this connection to the channel's members; the answer arrives
    /// in this worker's mailbox and registers the subscription there (see
    /// `presence`'s ordering invariant). `again`: the channel is held already (a
    /// refused answer then leaves the held membership alone).
    fn join_presence(
        &self,
        hub: &Hub,
        conn: &Rc<WsConn>,
        grant: &Rc<Grant>,
        user: &str,
        info: Option<String>,
        again: bool,
    ) {
        let project = self.project.index;
        let channel = grant.channel.clone();
        let (c, g, expiry) = (conn.clone(), grant.clone(), self.ctx.expiry.clone());
        let ch = channel.clone();
        let done: PresenceDone = Box::new(move |shard, answer| match answer {
            PresenceAnswer::Joined(object) => {
                shard.subscribe(project, &ch, &c);
                shard.reply_when_live(project, &ch, &c, subscribed_presence(&ch, &object));
            }
            PresenceAnswer::Full => {
                expiry.end(&g);
                c.send(channel_error_frame(
                    "presence_full",
                    &ch,
                    "the presence channel has as many members as it may hold",
                ));
            }
            PresenceAnswer::OtherUser => {
                // The hub holds this connection under another user (the session
                // refuses that first; this is the hub's own guard).
                if !again {
                    expiry.end(&g);
                }
                forbidden(&c, &ch, TokenRefusal::SubjectChanged);
            }
        });
        let ticket = self
            .ctx
            .shard
            .presence_wait(conn.id, project, &channel, done);
        hub.join(Join {
            project,
            channel,
            user_id: user.into(),
            info: info.map(String::into_boxed_str),
            worker: self.ctx.shard.index(),
            conn: conn.id,
            ticket,
        });
    }

    /// `refresh`: a new token for a held private subscription moves its expiry. A
    /// refused one leaves the old `exp` in force.
    fn refresh(&mut self, conn: &Rc<WsConn>, channel: &str, token: Option<&str>) {
        let Some(held) = self.grant(channel) else {
            return forbidden(conn, channel, TokenRefusal::NotSubscribed);
        };
        let Some(token) = token else {
            return forbidden(conn, channel, TokenRefusal::Missing);
        };
        if !self.within_budget(conn, channel) {
            return;
        }
        match self.verify(channel, token) {
            Err(refusal) => forbidden(conn, channel, refusal),
            Ok(g) if g.sub.as_deref() != held.sub.as_deref() => {
                forbidden(conn, channel, TokenRefusal::SubjectChanged)
            }
            Ok(g) => {
                self.ctx.expiry.arm(&held, g.exp);
                conn.send(refreshed_frame(channel, held.exp()));
            }
        }
    }

    /// Check a token for `channel` against the project's token keys, now (through the
    /// worker's cache of verified tokens). Callers took it from the budget first.
    fn verify(&self, channel: &str, token: &str) -> Result<TokenGrant, TokenRefusal> {
        let snapshot = self.ctx.shard.keys().load();
        self.ctx
            .admission
            .verify(&snapshot, self.project.index, token, channel, unix_now())
    }

    fn grant(&self, channel: &str) -> Option<Rc<Grant>> {
        self.grants()
            .iter()
            .find(|g| &*g.channel == channel)
            .cloned()
    }

    /// Forget the grant of a channel being left (its deadline too).
    fn drop_grant(&mut self, channel: &str) {
        let Some(extras) = self.extras.as_mut() else {
            return;
        };
        if let Some(pos) = extras.grants.iter().position(|g| &*g.channel == channel) {
            let grant = extras.grants.swap_remove(pos);
            self.ctx.expiry.disarm(&grant);
        }
    }

    /// Drop the channels whose grant the expiry timer ended (it already unsubscribed
    /// them from the registry and told the client).
    fn prune_ended(&mut self) {
        let Some(extras) = self.extras.as_mut() else {
            return;
        };
        if !extras.grants.iter().any(|g| g.is_ended()) {
            return;
        }
        let subscriptions = &mut self.subscriptions;
        extras.grants.retain(|g| {
            if !g.is_ended() {
                return true;
            }
            subscriptions.remove(&g.channel);
            false
        });
    }

    /// A `client_event` frame whose channel name is valid: relay it to the channel's
    /// other subscribers, or answer why not (see `client::events`).
    fn client_event(
        &mut self,
        conn: &Rc<WsConn>,
        channel: &str,
        value: &simd_json::BorrowedValue<'_>,
    ) -> Result<(), Refusal> {
        use simd_json::prelude::{TypedScalarValue, ValueAsObject, Writable};
        let event = value.get("event").and_then(|e| e.as_str()).unwrap_or("");
        events::check_event(event)?;
        let data = match value.get("data") {
            Some(d) if d.is_str() || d.as_object().is_some() => d,
            _ => return Err(Refusal::BadData),
        };
        if !events::allowed(&self.project) {
            return Err(Refusal::Off);
        }
        events::check_channel(channel)?;
        // Private channels always hold a grant; one the expiry timer ended was pruned.
        let grant = self.grant(channel).ok_or(Refusal::NotSubscribed)?;
        let log = self.extras().event_log.get_or_insert_with(Box::default);
        if !log.admit(crate::quota::now_ns()) {
            return Err(Refusal::ConnectionRate);
        }
        // Re-encoded from the parsed value (simd-json parsed the frame in place): one
        // copy per event, never per subscriber.
        let data = data.encode();
        let user_id = if channel.starts_with("presence-") {
            grant.sub.as_deref()
        } else {
            None
        };
        // The id the client was given in its `connected` frame (`upgrade::start`).
        let socket_id = SocketId::local(self.ctx.shard.index(), conn.id).text();
        let ev = ClientEvent {
            channel,
            event,
            data: data.as_bytes(),
            user_id,
            socket_id: socket_id.as_str(),
        };
        events::relay(&self.ctx.events, &self.project, conn.id, &ev)
    }

    fn unsubscribe(&mut self, conn: &Rc<WsConn>, channel: &str) {
        if self.subscriptions.remove(channel) {
            self.ctx
                .shard
                .unsubscribe(self.project.index, channel, conn.id);
        }
        conn.send(reply("unsubscribed", channel));
    }
}

/// Send a cluster-mode history subscribe's answer: `subscribed` with the position
/// Redis gave (none when Redis could not be asked), then the replay.
fn history_answer(
    conn: &Rc<WsConn>,
    channel: &str,
    recovering: bool,
    ready: crate::shard::mailbox::HistoryReady,
) {
    use crate::shard::mailbox::HistoryReady;
    match ready {
        HistoryReady::Position {
            offset,
            epoch,
            replay,
        } => {
            let recovered = recovering.then_some(replay.is_some());
            conn.send(subscribed(channel, Some((offset, &epoch)), recovered));
            let mut replayed = 0u64;
            for frame in replay.into_iter().flatten() {
                replayed += u64::from(conn.send(frame));
            }
            if replayed > 0 {
                crate::metrics::with(|m| m.deliveries(replayed));
            }
        }
        HistoryReady::Unknown => {
            conn.send(subscribed(channel, None, recovering.then_some(false)));
        }
    }
}

impl Session for ClientSession {
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), Disconnect> {
        if opcode != Opcode::Text {
            return Err(Disconnect::BINARY_UNSUPPORTED);
        }
        // simd-json builds (and drops) a value tree recursively: bound the nesting first
        // so a deeply nested frame cannot exhaust the worker's stack.
        if nesting_depth(payload) > MAX_CLIENT_JSON_DEPTH {
            conn.send(error_frame(
                "invalid_json",
                "the frame is nested too deeply",
            ));
            return Ok(());
        }
        let value = match simd_json::to_borrowed_value(payload) {
            Ok(v) => v,
            Err(_) => {
                conn.send(error_frame("invalid_json", "the frame is not valid JSON"));
                return Ok(());
            }
        };
        let Some(kind) = value.get("type").and_then(|t| t.as_str()) else {
            conn.send(error_frame(
                "unknown_type",
                "the frame needs a string field 'type'",
            ));
            return Ok(());
        };
        self.prune_ended();
        match kind {
            "ping" => {
                conn.send(Bytes::from_static(PONG));
            }
            "subscribe" | "unsubscribe" | "refresh" | "client_event" => {
                let channel = match value.get("channel").and_then(|c| c.as_str()) {
                    Some(c) => c,
                    None => {
                        conn.send(error_frame(
                            "invalid_channel",
                            "the field 'channel' must be a string",
                        ));
                        return Ok(());
                    }
                };
                if crate::names::check(channel).is_err() {
                    conn.send(error_frame(
                        "invalid_channel",
                        "a channel is 1 to 100 characters without control characters",
                    ));
                    return Ok(());
                }
                if kind == "client_event" {
                    if let Err(refusal) = self.client_event(conn, channel, &value) {
                        conn.send(channel_error_frame(
                            refusal.code(),
                            channel,
                            refusal.message(),
                        ));
                    }
                } else if kind == "subscribe" {
                    let since = match value.get("since") {
                        None => None,
                        Some(s) => {
                            let offset = s.get("offset").and_then(|o| o.as_u64());
                            let epoch = s.get("epoch").and_then(|e| e.as_str());
                            match (offset, epoch) {
                                (Some(offset), Some(epoch)) => Some(Since { offset, epoch }),
                                _ => {
                                    conn.send(error_frame(
                                        "invalid_since",
                                        "since must be {\"offset\": integer >= 0, \"epoch\": string}",
                                    ));
                                    return Ok(());
                                }
                            }
                        }
                    };
                    if needs_token(channel) {
                        let token = value.get("token").and_then(|t| t.as_str());
                        self.subscribe_private(conn, channel, token, since);
                    } else {
                        self.subscribe_public(conn, channel, since);
                    }
                } else if kind == "refresh" {
                    let token = value.get("token").and_then(|t| t.as_str());
                    self.refresh(conn, channel, token);
                } else {
                    self.drop_grant(channel);
                    self.unsubscribe(conn, channel);
                }
            }
            _ => {
                conn.send(error_frame(
                    "unknown_type",
                    "type must be subscribe, unsubscribe, refresh, client_event or ping",
                ));
            }
        }
        Ok(())
    }

    fn read_ctx(&self) -> &ReadCtx {
        &self.ctx.read
    }

    fn on_end(&mut self, conn: &Rc<WsConn>) {
        if let Some(extras) = self.extras.take() {
            for grant in extras.grants {
                self.ctx.expiry.disarm(&grant);
            }
        }
        for channel in self.subscriptions.take_all() {
            self.ctx
                .shard
                .unsubscribe(self.project.index, &channel, conn.id);
        }
        self.ctx.shard.remove(conn);
    }
}

/// Refuse a private subscribe or refresh.
fn forbidden(conn: &Rc<WsConn>, channel: &str, refusal: TokenRefusal) {
    conn.send(channel_error_frame(
        "forbidden",
        channel,
        &refusal.to_string(),
    ));
}

/// Client frames are flat control messages; anything nested deeper is refused.
pub(crate) const MAX_CLIENT_JSON_DEPTH: usize = 32;

/// Deepest `{`/`[` nesting of a JSON text, ignoring brackets inside strings. Stops
/// counting once past the limit; malformed text is left to the parser.
pub(crate) fn nesting_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
                if max > MAX_CLIENT_JSON_DEPTH {
                    return max;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests;
