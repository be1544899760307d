//! The Pusher Channels protocol 7 over an established WebSocket (`/app/{key}`): the
//! second client protocol, over the same shard, presence hub, client-event relay and
//! quotas as [`super::session::ClientSession`].
//!
//! What a pusher-js client may send: `pusher:ping` / `pusher:pong`, `pusher:subscribe`
//! (public; `private-`, `private-encrypted-` and `presence-` with Pusher's HMAC `auth`,
//! and `channel_data` for presence), `pusher:unsubscribe`, and `client-*` events. Frames
//! the server sends are built by `crate::pusher_frame`; broadcasts reach this connection
//! in their Pusher form because its `WsConn` speaks `Dialect::Pusher`.
//!
//! Invariants:
//! - No frame a client sends closes the connection, except a binary frame (1003) and
//!   WebSocket protocol violations (the transport's). Subscription problems are
//!   `pusher:subscription_error` naming the channel (`{type, error, status}`); anything
//!   else is a `pusher:error`, with code 4301 for the client-event rate only.
//! - A Pusher-authorised subscription has no expiry (Pusher has none); it ends with an
//!   unsubscribe, the connection, or the key's revocation (4001).
//! - A subscribe that would do work takes one unit of the connection's budget
//!   (`client::admit`) after every check that refuses for another reason and before its
//!   `auth` is checked; over it: `LimitReached` 429, nothing else happens.
//! - A connection is one member of a presence channel: a second subscribe to a held
//!   presence channel with another `user_id` is refused (as a native refresh cannot
//!   change `sub`), never a second member beside the first.
//! - Presence: one member set with native clients (the hub is protocol-blind); a member's
//!   user id is `channel_data`'s `user_id` as a string (the number 10 is the user "10").
//!   `user_info` is kept when it is an object of at most 1 KiB; any other value is left
//!   out (native frames carry `info` only as an object).

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::auth::pusher::{check_channel_auth, ChannelAuthError};
use crate::auth::token::MAX_INFO_BYTES;
use crate::auth::ProjectState;
use crate::close::Disconnect;
use crate::ids::{SocketId, SocketIdText};
use crate::presence::{Hub, Join};
use crate::shard::mailbox::PresenceAnswer;
use crate::shard::{is_presence, PresenceDone};
use crate::wire::pusher as pusher_frame;
use crate::ws::conn::{ReadCtx, Session, WsConn};
use crate::ws::frame::Opcode;

use super::admit::Budget;
use super::ctx::SessionCtx;
use super::events::{self, ClientEvent, RateLog, Refusal};
use super::private::{needs_token, unix_now};
use super::session::{nesting_depth, MAX_CLIENT_JSON_DEPTH};
use super::subs::Subs;

/// Channel prefixes of Pusher features ringcast does not offer.
const CACHE_PREFIXES: [&str; 4] = [
    "cache-",
    "private-cache-",
    "presence-cache-",
    "private-encrypted-cache-",
];

/// Most characters of a presence `user_id` (as the native token's `sub`).
const MAX_USER_ID_CHARS: usize = 128;

/// A client frame: `event`, optional `channel`, optional `data` (kept raw).
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    event: Cow<'a, str>,
    #[serde(borrow, default)]
    channel: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

/// `pusher:subscribe`'s and `pusher:unsubscribe`'s `data`.
#[derive(Deserialize)]
struct SubscribeData {
    channel: String,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    channel_data: Option<String>,
}

/// A subscription refusal: `pusher:subscription_error`'s `type`, `error`, `status`.
struct SubError {
    kind: &'static str,
    error: Cow<'static, str>,
    status: u16,
}

impl SubError {
    fn new(kind: &'static str, error: impl Into<Cow<'static, str>>, status: u16) -> SubError {
        SubError {
            kind,
            error: error.into(),
            status,
        }
    }
}

/// One Pusher client's protocol state, owned by its reader task. Kept small as
/// [`super::ClientSession`] is: the worker-wide parts are one shared [`SessionCtx`], the
/// socket id is computed on use, and presence and client-event state exist only once
/// used.
pub(crate) struct PusherSession {
    ctx: Rc<SessionCtx>,
    project: Arc<ProjectState>,
    /// Channels held, answered or waiting for the presence hub.
    subscriptions: Subs,
    /// Presence members and the client-event log: `None` until the first presence
    /// subscribe or client event.
    extras: Option<Box<Extras>>,
    /// This connection's subscribe budget.
    budget: Budget,
}

/// A Pusher session's rarely used state.
#[derive(Default)]
struct Extras {
    /// (presence channel, the member's user id) for each presence channel held.
    members: Vec<(Box<str>, Box<str>)>,
    /// Presence channels the hub refused (`presence_full`) since the last frame: the
    /// hub's answer runs outside the session, so it leaves the name here.
    refused: Rc<RefCell<Vec<Box<str>>>>,
    event_log: Option<Box<RateLog>>,
}

impl PusherSession {
    pub(crate) fn new(ctx: Rc<SessionCtx>, project: Arc<ProjectState>) -> PusherSession {
        PusherSession {
            ctx,
            project,
            subscriptions: Subs::None,
            extras: None,
            budget: Budget::default(),
        }
    }

    /// The extras, made on first use.
    fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// The presence members held (none without extras).
    fn members(&self) -> &[(Box<str>, Box<str>)] {
        self.extras.as_ref().map_or(&[], |x| &x.members)
    }

    /// The socket id the client was given (`upgrade::start`), for Pusher's auth string
    /// and client events.
    fn socket_id(&self, conn: &WsConn) -> SocketIdText {
        SocketId::local(self.ctx.shard.index(), conn.id).text()
    }

    /// Take one subscribe from this connection's budget, or say why not.
    fn within_budget(&mut self) -> Result<(), SubError> {
        if self
            .ctx
            .admission
            .take(&mut self.budget, crate::quota::now_ns())
        {
            return Ok(());
        }
        Err(SubError::new(
            "LimitReached",
            self.ctx.admission.refusal(),
            429,
        ))
    }

    fn holds(&self, channel: &str) -> bool {
        self.subscriptions.contains(channel)
    }

    /// Forget the presence channels the hub refused (they were never registered).
    fn prune_refused(&mut self) {
        let Some(extras) = self.extras.as_ref() else {
            return;
        };
        let refused = std::mem::take(&mut *extras.refused.borrow_mut());
        for channel in refused {
            self.forget(&channel);
        }
    }

    fn forget(&mut self, channel: &str) -> bool {
        if let Some(extras) = self.extras.as_mut() {
            extras.members.retain(|(c, _)| &**c != channel);
        }
        self.subscriptions.remove(channel)
    }

    fn subscribe(&mut self, conn: &Rc<WsConn>, data: Option<&RawValue>) {
        let Some(sub) = data.and_then(object_of::<SubscribeData>) else {
            conn.send(pusher_frame::error(
                None,
                "pusher:subscribe needs data {\"channel\": string, \"auth\"?: string, \"channel_data\"?: string}",
            ));
            return;
        };
        let channel = sub.channel.as_str();
        if let Err(e) = self.try_subscribe(conn, &sub) {
            conn.send(pusher_frame::subscription_error(
                channel, e.kind, &e.error, e.status,
            ));
        }
    }

    fn try_subscribe(&mut self, conn: &Rc<WsConn>, sub: &SubscribeData) -> Result<(), SubError> {
        let channel = sub.channel.as_str();
        if crate::names::check(channel).is_err() {
            return Err(SubError::new(
                "InvalidChannel",
                "a channel name is 1 to 100 characters without control characters",
                400,
            ));
        }
        if CACHE_PREFIXES.iter().any(|p| channel.starts_with(p)) {
            return Err(SubError::new(
                "UnsupportedFeature",
                "cache channels are not supported",
                400,
            ));
        }
        let presence = is_presence(channel);
        let again = self.holds(channel);
        if !again {
            if self.subscriptions.len() >= self.ctx.admission.max_subscriptions() {
                return Err(SubError::new(
                    "LimitReached",
                    "this connection has reached its subscription limit",
                    429,
                ));
            }
            if self.ctx.shard.subscriptions_full() {
                return Err(SubError::new(
                    "LimitReached",
                    "the server holds as many subscriptions as it may; try again later",
                    429,
                ));
            }
        }
        if needs_token(channel) {
            let channel_data = if presence {
                Some(sub.channel_data.as_deref().ok_or_else(|| {
                    SubError::new("AuthError", "a presence channel needs channel_data", 400)
                })?)
            } else {
                None
            };
            let auth = sub
                .auth
                .as_deref()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    SubError::new(
                        "AuthError",
                        "this channel needs auth (key:signature) from your auth endpoint",
                        401,
                    )
                })?;
            // A held channel's auth is checked again: charged like a new subscribe.
            self.within_budget()?;
            self.authorize(conn, channel, auth, channel_data)?;
        } else if !again {
            self.within_budget()?;
        }
        match (&self.ctx.presence, presence) {
            (Some(hub), true) => {
                let (user, info) = member_of(sub.channel_data.as_deref().unwrap_or(""))?;
                let hub = hub.clone();
                if again {
                    let held = self.members().iter().find(|(c, _)| &**c == channel);
                    if held.is_some_and(|(_, u)| **u != *user) {
                        return Err(SubError::new(
                            "AuthError",
                            "this connection is a member of the channel under another user_id; unsubscribe first",
                            403,
                        ));
                    }
                } else {
                    self.subscriptions.push(channel);
                    self.extras()
                        .members
                        .push((channel.into(), user.as_str().into()));
                }
                self.join(&hub, conn, channel, &user, info, again);
            }
            _ => {
                if !again {
                    self.ctx.shard.subscribe(self.project.index, channel, conn);
                    self.subscriptions.push(channel);
                }
                self.ctx.shard.reply_when_live(
                    self.project.index,
                    channel,
                    conn,
                    pusher_frame::subscription_succeeded(channel, "{}"),
                );
            }
        }
        Ok(())
    }

    /// Pusher's channel authorisation: `auth` = `<key>:<hex HMAC-SHA256>` over
    /// `<socket_id>:<channel>[:<channel_data>]` with one of the project's token secrets
    /// in force, `<key>` an active public key of this project.
    fn authorize(
        &self,
        conn: &WsConn,
        channel: &str,
        auth: &str,
        channel_data: Option<&str>,
    ) -> Result<(), SubError> {
        let snapshot = self.ctx.shard.keys().load();
        let secrets = snapshot
            .token_keys(self.project.index)
            .map(|k| k.secrets_at(unix_now()))
            .unwrap_or_default();
        let key = check_channel_auth(
            auth,
            self.socket_id(conn).as_str(),
            channel,
            channel_data,
            &secrets,
        )
        .map_err(|e| {
            let why = match e {
                ChannelAuthError::Malformed => "auth must be <key>:<64 hex digits>",
                ChannelAuthError::NoSecret => {
                    "the project has no token secret; create one with `ringcast project rotate-token-secret`"
                }
                ChannelAuthError::Signature => "invalid signature",
            };
            SubError::new("AuthError", why, 401)
        })?;
        match snapshot.lookup(key) {
            Some(entry)
                if entry.kind == crate::apikey::KeyKind::Public
                    && entry.project.index == self.project.index =>
            {
                Ok(())
            }
            _ => Err(SubError::new(
                "AuthError",
                "the key in auth is not an active public key of this app",
                401,
            )),
        }
    }

    /// Join a presence channel through the node's hub; its answer registers the
    /// subscription and sends `subscription_succeeded` with the member hash. `again`:
    /// the channel is held already (a refused answer then leaves it held).
    fn join(
        &mut self,
        hub: &Hub,
        conn: &Rc<WsConn>,
        channel: &str,
        user: &str,
        info: Option<String>,
        again: bool,
    ) {
        let project = self.project.index;
        let (c, refused) = (conn.clone(), self.extras().refused.clone());
        let ch: Box<str> = channel.into();
        let done: PresenceDone = Box::new(move |shard, answer| match answer {
            PresenceAnswer::Joined(object) => {
                shard.subscribe(project, &ch, &c);
                let frame = match pusher_frame::presence_data(&object) {
                    Ok(data) => pusher_frame::subscription_succeeded(&ch, &data),
                    Err(_) => pusher_frame::subscription_error(
                        &ch,
                        "InternalError",
                        "the member list could not be encoded",
                        500,
                    ),
                };
                shard.reply_when_live(project, &ch, &c, frame);
            }
            PresenceAnswer::Full => {
                refused.borrow_mut().push(ch.clone());
                // The pending join counts as held until now: let the hub forget it.
                shard.unsubscribe(project, &ch, c.id);
                c.send(pusher_frame::subscription_error(
                    &ch,
                    "LimitReached",
                    "the presence channel has as many members as it may hold",
                    403,
                ));
            }
            PresenceAnswer::OtherUser => {
                // The hub's own guard (the session refuses this first).
                if !again {
                    refused.borrow_mut().push(ch.clone());
                    shard.unsubscribe(project, &ch, c.id);
                }
                c.send(pusher_frame::subscription_error(
                    &ch,
                    "AuthError",
                    "this connection is a member of the channel under another user_id",
                    403,
                ));
            }
        });
        let ticket = self
            .ctx
            .shard
            .presence_wait(conn.id, project, channel, done);
        hub.join(Join {
            project,
            channel: channel.into(),
            user_id: user.into(),
            info: info.map(String::into_boxed_str),
            worker: self.ctx.shard.index(),
            conn: conn.id,
            ticket,
        });
    }

    fn unsubscribe(&mut self, conn: &Rc<WsConn>, data: Option<&RawValue>) {
        let Some(sub) = data.and_then(object_of::<SubscribeData>) else {
            conn.send(pusher_frame::error(
                None,
                "pusher:unsubscribe needs data {\"channel\": string}",
            ));
            return;
        };
        // Pusher answers nothing, even for a channel not held.
        if self.forget(&sub.channel) {
            self.ctx
                .shard
                .unsubscribe(self.project.index, &sub.channel, conn.id);
        }
    }

    /// A `client-*` event: relayed to the channel's other subscribers of both protocols,
    /// or answered with a `pusher:error` saying why not.
    fn client_event(
        &mut self,
        conn: &Rc<WsConn>,
        event: &str,
        channel: Option<&str>,
        data: Option<&RawValue>,
    ) -> Result<(), Refusal> {
        events::check_event(event)?;
        let channel = channel
            .filter(|c| crate::names::check(c).is_ok())
            .ok_or(Refusal::NotSubscribed)?;
        let data = data.ok_or(Refusal::BadData)?.get().trim();
        // The native frame carries an object or a string; any other value travels as
        // its JSON text in a string (what pusher-js receivers get in any case).
        let text: Cow<'_, [u8]> = match data.as_bytes().first() {
            Some(b'{') | Some(b'"') => Cow::Borrowed(data.as_bytes()),
            Some(_) => {
                let mut out = Vec::with_capacity(data.len() + 2);
                crate::json::write_json_str(&mut out, data);
                Cow::Owned(out)
            }
            None => return Err(Refusal::BadData),
        };
        if !events::allowed(&self.project) {
            return Err(Refusal::Off);
        }
        events::check_channel(channel)?;
        if !self.holds(channel) {
            return Err(Refusal::NotSubscribed);
        }
        let log = self.extras().event_log.get_or_insert_with(Box::default);
        if !log.admit(crate::quota::now_ns()) {
            return Err(Refusal::ConnectionRate);
        }
        let socket_id = self.socket_id(conn);
        let user_id = self
            .members()
            .iter()
            .find(|(c, _)| &**c == channel)
            .map(|(_, u)| &**u);
        let ev = ClientEvent {
            channel,
            event,
            data: &text,
            user_id,
            socket_id: socket_id.as_str(),
        };
        events::relay(&self.ctx.events, &self.project, conn.id, &ev)
    }
}

/// `data` as an object of `T`: either a JSON object or a string holding one (both are
/// sent by Pusher clients in the wild).
fn object_of<T: for<'de> Deserialize<'de>>(data: &RawValue) -> Option<T> {
    let raw = data.get().trim();
    if raw.starts_with('"') {
        let inner: String = serde_json::from_str(raw).ok()?;
        serde_json::from_str(&inner).ok()
    } else {
        serde_json::from_str(raw).ok()
    }
}

/// The member a presence `channel_data` names: (user id as a string, `user_info` as
/// compact JSON text when it is an object).
fn member_of(channel_data: &str) -> Result<(String, Option<String>), SubError> {
    let bad = |why: &'static str| SubError::new("AuthError", why, 400);
    let serde_json::Value::Object(mut fields) = serde_json::from_str(channel_data)
        .map_err(|_| bad("channel_data must be a JSON object"))?
    else {
        return Err(bad("channel_data must be a JSON object"));
    };
    let user = match fields.remove("user_id") {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        _ => return Err(bad("channel_data needs a user_id (a string or an integer)")),
    };
    if !(1..=MAX_USER_ID_CHARS).contains(&user.chars().count()) {
        return Err(bad("user_id must be 1 to 128 characters"));
    }
    let info = match fields.remove("user_info") {
        Some(v @ serde_json::Value::Object(_)) => {
            let text = v.to_string();
            if text.len() > MAX_INFO_BYTES {
                return Err(bad("user_info must be at most 1 KiB of JSON"));
            }
            Some(text)
        }
        _ => None,
    };
    Ok((user, info))
}

impl Session for PusherSession {
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), Disconnect> {
        if opcode != Opcode::Text {
            return Err(Disconnect::BINARY_UNSUPPORTED);
        }
        if nesting_depth(payload) > MAX_CLIENT_JSON_DEPTH {
            conn.send(pusher_frame::error(None, "the frame is nested too deeply"));
            return Ok(());
        }
        let frame: Frame<'_> = match serde_json::from_slice(payload) {
            Ok(f) => f,
            Err(_) => {
                conn.send(pusher_frame::error(
                    None,
                    "a frame is a JSON object with a string event",
                ));
                return Ok(());
            }
        };
        self.prune_refused();
        match &*frame.event {
            "pusher:ping" => {
                conn.send(pusher_frame::pong());
            }
            "pusher:pong" => {}
            "pusher:subscribe" => self.subscribe(conn, frame.data),
            "pusher:unsubscribe" => self.unsubscribe(conn, frame.data),
            "pusher:signin" => {
                conn.send(pusher_frame::error(
                    None,
                    "user authentication (pusher:signin) is not supported",
                ));
            }
            e if e.starts_with(events::EVENT_PREFIX) => {
                let channel = frame.channel.as_deref();
                if let Err(refusal) = self.client_event(conn, e, channel, frame.data) {
                    let code = (refusal == Refusal::ConnectionRate).then_some(4301);
                    conn.send(pusher_frame::error(code, refusal.message()));
                }
            }
            _ => {
                conn.send(pusher_frame::error(
                    None,
                    "unsupported event: send pusher:subscribe, pusher:unsubscribe, pusher:ping or a client- event",
                ));
            }
        }
        Ok(())
    }

    fn read_ctx(&self) -> &ReadCtx {
        &self.ctx.read
    }

    fn on_end(&mut self, conn: &Rc<WsConn>) {
        self.prune_refused();
        for channel in self.subscriptions.take_all() {
            self.ctx
                .shard
                .unsubscribe(self.project.index, &channel, conn.id);
        }
        self.extras = None;
        self.ctx.shard.remove(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_come_from_channel_data_as_node_and_python_write_it() {
        let (u, i) = member_of(r#"{"user_id":"u1","user_info":{"name":"Ann"}}"#)
            .ok()
            .unwrap();
        assert_eq!(
            (u.as_str(), i.as_deref()),
            ("u1", Some(r#"{"name":"Ann"}"#))
        );
        let (u, i) = member_of(r#"{"user_id": 10, "user_info": {"name": "Bo"}}"#)
            .ok()
            .unwrap();
        assert_eq!((u.as_str(), i.as_deref()), ("10", Some(r#"{"name":"Bo"}"#)));
        let (u, i) = member_of(r#"{"user_id":"u2","user_info":true}"#)
            .ok()
            .unwrap();
        assert_eq!((u.as_str(), i), ("u2", None));
        for bad in [
            "",
            "[]",
            r#"{"user_info":{}}"#,
            r#"{"user_id":""}"#,
            r#"{"user_id":1.5}"#,
            r#"{"user_id":null}"#,
        ] {
            assert!(member_of(bad).is_err(), "{bad}");
        }
        let big = format!(
            r#"{{"user_id":"u","user_info":{{"x":"{}"}}}}"#,
            "a".repeat(1100)
        );
        assert!(member_of(&big).is_err());
    }

    #[test]
    fn subscribe_data_may_be_an_object_or_a_string_holding_one() {
        let raw: Box<RawValue> = serde_json::from_str(r#"{"channel":"a","auth":"k:s"}"#).unwrap();
        let d: SubscribeData = object_of(&raw).unwrap();
        assert_eq!((d.channel.as_str(), d.auth.as_deref()), ("a", Some("k:s")));
        let raw: Box<RawValue> = serde_json::from_str(r#""{\"channel\":\"b\"}""#).unwrap();
        let d: SubscribeData = object_of(&raw).unwrap();
        assert_eq!(d.channel, "b");
        let raw: Box<RawValue> = serde_json::from_str("12").unwrap();
        assert!(object_of::<SubscribeData>(&raw).is_none());
    }
}
