//! The session core: one client's protocol state over an established WebSocket, the
//! same for both protocols. A codec (`client::codec`: [`Native`] or [`Pusher`])
//! decodes each text frame into a `Command`; [`ClientSession`] applies it against the
//! shard (a subscribe is one `Shard::join`, which asks the presence hub or the history
//! as the channel needs) and the client-event relay, and answers with a `Reply` or a
//! `ClientError` that the codec writes in its protocol.
//!
//! Invariants: errors that a client can cause with a frame (bad JSON, unknown type,
//! invalid channel, too many subscriptions, a refused credential) are answered and keep
//! the connection open; only binary frames (1003) and protocol violations close it.
//! Subscribing twice is idempotent (one delivery per publish, whatever happens), as is
//! unsubscribing from a channel one is not in.
//!
//! A subscribe checks, in this order: the channel (the codec), the credential's
//! presence (`private-`/`presence-` channels), room for one more channel (when not held),
//! the connection's budget (`client::admit`: charged unless a public channel is held
//! already; a held private channel's credential is checked again, as a refresh), then
//! the credential itself (`client::credential`). So a refusal for another reason costs
//! no budget, and no credential is verified unpaid.
//!
//! Private and presence channels: each held one has a grant (`client::private`) in the
//! session's extras (made on the first private subscribe or client event; most
//! connections never make one). Native grants end at the token's `exp` (the worker's
//! expiry timer) unless a `refresh` moves it; Pusher grants never end. A grant the timer
//! or the presence hub ended is pruned, with its channel, when the next frame arrives.
//! A connection is at most one member of a presence channel: a second subscribe under
//! another user is refused, never a second member beside the first.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use crate::auth::token::{TokenRefusal, CONNECTION};
use crate::auth::ProjectState;
use crate::close::Disconnect;
use crate::history::spec::HistorySpec;
use crate::ids::SocketId;
use crate::shard::{is_presence, JoinRequest, Presence, PresenceRefusal, PresenceReply};
use crate::ws::conn::{ReadCtx, Session, WsConn};
use crate::ws::frame::Opcode;

use super::admit::Budget;
use super::codec::{Codec, Native, Pusher};
use super::command::{Command, Credential, EventData, Reply, Since, Subscribe};
use super::credential::{self, Member};
use super::ctx::SessionCtx;
use super::error::ClientError;
use super::events::{self, ClientEvent, RateLog, Refusal};
use super::private::{needs_token, Grant};
use super::subs::Subs;
use super::user::{ConnUser, UserState};

/// A session of ringcast's own protocol.
pub(crate) type NativeSession = ClientSession<Native>;
/// A session of the Pusher protocol.
pub(crate) type PusherSession = ClientSession<Pusher>;

/// One client's protocol state, owned by its reader. Kept small (it is inline in every
/// connection's reader): the worker-wide parts are one shared [`SessionCtx`], the
/// protocol is a type (no byte), the connection id is computed when a client event needs
/// it, one channel is held inline, and grants and the client-event log exist only once
/// used.
pub(crate) struct ClientSession<C: Codec> {
    ctx: Rc<SessionCtx>,
    /// The project whose channels this connection sees (from its key).
    project: Arc<ProjectState>,
    /// Channels this connection holds, answered or waiting for the presence hub
    /// (bounded by `max_subscriptions_per_connection`, which `ctx.admission` holds).
    subscriptions: Subs,
    /// Grants and the client-event log: `None` until the first private subscribe or
    /// client event (most connections never make one).
    extras: Option<Box<Extras>>,
    /// This connection's subscribe budget.
    budget: Budget,
    codec: PhantomData<C>,
}

/// A session's rarely used state.
#[derive(Default)]
struct Extras {
    /// One grant per private or presence channel in `subscriptions`.
    grants: Vec<Rc<Grant>>,
    /// This connection's recent client events (made on its first one).
    event_log: Option<Box<RateLog>>,
    /// The connection's user (a connection token or a Pusher sign-in; `client::user`):
    /// boxed, so a connection with private channels and no user pays 8 bytes for it.
    user: Option<Box<UserState>>,
}

/// `size_of` of a session's extras and of its user, for the per-connection budget
/// (`http::upgrade::sizes`).
#[cfg(test)]
pub(crate) const EXTRAS_SIZES: (usize, usize) = (
    std::mem::size_of::<Extras>(),
    std::mem::size_of::<UserState>(),
);

impl<C: Codec> ClientSession<C> {
    pub(crate) fn new(ctx: Rc<SessionCtx>, project: Arc<ProjectState>) -> ClientSession<C> {
        ClientSession {
            ctx,
            project,
            subscriptions: Subs::None,
            extras: None,
            budget: Budget::default(),
            codec: PhantomData,
        }
    }

    /// Channels this session holds.
    #[cfg(test)]
    pub(crate) fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.subscriptions.iter()
    }

    /// The grants held (none without extras).
    fn grants(&self) -> &[Rc<Grant>] {
        self.extras.as_ref().map_or(&[], |x| &x.grants)
    }

    /// The extras, made on first use.
    fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// The connection's user, if it has one.
    fn user(&self) -> Option<&UserState> {
        self.extras.as_ref().and_then(|x| x.user.as_deref())
    }

    /// Make `user` this connection's user (a verified connection token at the upgrade,
    /// or an accepted sign-in): index it in the worker and arm its token's expiry.
    pub(crate) fn set_user(&mut self, conn: &Rc<WsConn>, user: ConnUser) {
        let entry = self
            .ctx
            .shard
            .user_join(self.project.index, user.sub.clone(), conn);
        let grant = user.exp.map(|exp| {
            let grant = Grant::new(self.project.index, CONNECTION, conn, None, exp);
            self.ctx.expiry.arm(&grant, exp);
            grant
        });
        self.extras().user = Some(Box::new(UserState {
            entry,
            grant,
            info: user.info,
        }));
    }

    /// A verified channel credential, seen from the connection's user: it may not name
    /// another user, and it names the connection's user (and `info`) where it names none
    /// (contract 1.3). A blocked user's credential is refused.
    fn as_connection_user(&self, member: &mut Member) -> Result<(), ClientError> {
        if let Some(state) = self.user() {
            match member.sub.as_deref() {
                Some(sub) if sub != &**state.user() => {
                    return Err(ClientError::Token(TokenRefusal::NotConnectionUser));
                }
                Some(_) => {}
                None => member.sub = Some(state.user().to_string()),
            }
            if member.info.is_none() {
                member.info = state.info.as_deref().map(str::to_owned);
            }
        }
        self.not_blocked(member.sub.as_deref())
    }

    /// A credential naming a blocked user is refused (`forbidden`).
    fn not_blocked(&self, sub: Option<&str>) -> Result<(), ClientError> {
        match sub {
            Some(sub) if super::user::blocked(&self.project, sub, super::private::unix_now()) => {
                Err(ClientError::Token(TokenRefusal::Blocked))
            }
            _ => Ok(()),
        }
    }

    fn grant(&self, channel: &str) -> Option<Rc<Grant>> {
        self.grants()
            .iter()
            .find(|g| &*g.channel == channel)
            .cloned()
    }

    /// Apply one command; refusals are answered here.
    fn apply(&mut self, conn: &Rc<WsConn>, command: Command<'_>) {
        let refused = match command {
            Command::Ping => {
                send_reply::<C>(conn, Reply::Pong);
                return;
            }
            Command::Ignore => return,
            Command::Subscribe(sub) => match self.subscribe_checked(conn, &sub) {
                Ok(()) => return,
                Err(e) => (e, Some(sub.channel)),
            },
            Command::Unsubscribe(channel) => {
                self.unsubscribe(conn, &channel);
                return;
            }
            Command::Refresh { channel, token } => match self.refresh(conn, channel, token) {
                Ok(()) => return,
                Err(e) => (e, channel.map(Cow::Borrowed)),
            },
            Command::Signin { user_data, auth } => match self.signin(conn, &user_data, &auth) {
                Ok(()) => return,
                Err(e) => (e, None),
            },
            Command::ClientEvent {
                channel,
                event,
                data,
            } => match self.client_event(conn, &channel, &event, &data) {
                Ok(()) => return,
                Err(r) => (ClientError::Event(r), Some(channel)),
            },
            Command::Refused { error, channel } => (error, channel),
        };
        let (error, channel) = refused;
        conn.send(C::refusal(&error, channel.as_deref()));
    }

    /// Take one subscribe or refresh from this connection's budget.
    fn within_budget(&mut self) -> Result<(), ClientError> {
        if self
            .ctx
            .admission
            .take(&mut self.budget, crate::quota::now_ns())
        {
            return Ok(());
        }
        Err(ClientError::RateLimited(self.ctx.admission.refusal()))
    }

    /// Whether this connection may take one more channel.
    fn room_for_one_more(&self) -> Result<(), ClientError> {
        if self.subscriptions.len() >= self.ctx.admission.max_subscriptions() {
            return Err(ClientError::TooManySubscriptions);
        }
        if self.ctx.shard.subscriptions_full() {
            return Err(ClientError::ServerFull);
        }
        Ok(())
    }

    /// A subscribe, in the order the module's doc gives.
    fn subscribe_checked(
        &mut self,
        conn: &Rc<WsConn>,
        sub: &Subscribe<'_>,
    ) -> Result<(), ClientError> {
        let channel = &*sub.channel;
        if !needs_token(channel) {
            // A public channel: free when held already (answered again).
            if !self.subscriptions.contains(channel) {
                self.room_for_one_more()?;
                self.within_budget()?;
            }
            self.subscribe(conn, channel, sub.since.as_ref(), None);
            return Ok(());
        }
        let presence = is_presence(channel);
        // The credential must be there before anything is charged.
        let offered = match sub.credential {
            Credential::Token(token) => token.ok_or(ClientError::Token(TokenRefusal::Missing))?,
            Credential::Signature { auth, channel_data } => {
                if presence && channel_data.is_none() {
                    return Err(ClientError::NeedsChannelData);
                }
                auth.ok_or(ClientError::AuthMissing)?
            }
        };
        let holds = self.subscriptions.contains(channel);
        if !holds {
            self.room_for_one_more()?;
        }
        // A held channel's credential is checked too (it acts as a refresh): charged.
        self.within_budget()?;
        let member = match sub.credential {
            Credential::Token(_) => {
                let mut member = credential::token(&self.ctx, &self.project, channel, offered)?;
                self.as_connection_user(&mut member)?;
                member
            }
            Credential::Signature { channel_data, .. } => {
                let socket_id = SocketId::local(self.ctx.shard.index(), conn.id).text();
                let member = credential::signature(
                    &self.ctx,
                    &self.project,
                    socket_id.as_str(),
                    channel,
                    offered,
                    channel_data,
                )?;
                // A presence member naming a blocked user is refused like a channel
                // token naming one (Pusher's members stay `channel_data`'s).
                self.not_blocked(member.sub.as_deref())?;
                member
            }
        };
        // Joined through the node's presence hub, if it has one.
        let hub = presence && self.ctx.shard.has_presence_hub();
        if holds {
            // Subscribed already: the credential acts as a refresh, and the subscribe is
            // answered as any repeated one. (A held channel without a grant is a Pusher
            // private channel: nothing to compare or move.)
            if let Some(held) = self.grant(channel) {
                if held.sub.as_deref() != member.sub.as_deref() {
                    return Err(ClientError::SubjectChanged);
                }
                if let Some(exp) = member.exp {
                    self.ctx.expiry.arm(&held, exp);
                }
                if let (true, Some(user)) = (hub, held.sub.as_deref()) {
                    // Answered with the member list again; membership is unchanged.
                    let presence = self.presence(&held, user, member.info);
                    self.subscribe(conn, channel, None, Some(presence));
                    return Ok(());
                }
            }
            self.subscribe(conn, channel, sub.since.as_ref(), None);
            return Ok(());
        }
        if hub {
            // Presence channels keep no history: `since` is not used. The channel counts
            // as held from now on, so an unsubscribe or close before the hub's answer
            // still tells the hub.
            let user = credential::user_ok(member.sub.as_deref())?;
            let grant = self.hold_grant(conn, channel, &member);
            let presence = self.presence(&grant, user, member.info);
            self.subscribe(conn, channel, None, Some(presence));
            return Ok(());
        }
        self.subscribe(conn, channel, sub.since.as_ref(), None);
        // A grant only when it carries something: an end (native tokens) or a user. A
        // Pusher private subscription has neither, and costs no more than a public one.
        if member.exp.is_some() || member.sub.is_some() {
            self.hold_grant(conn, channel, &member);
        }
        Ok(())
    }

    /// Keep the grant of a newly held private channel (armed when it ends).
    fn hold_grant(&mut self, conn: &Rc<WsConn>, channel: &str, member: &Member) -> Rc<Grant> {
        let grant = Grant::new(
            self.project.index,
            channel,
            conn,
            member.sub.clone(),
            member.exp.unwrap_or(u64::MAX),
        );
        if let Some(exp) = member.exp {
            self.ctx.expiry.arm(&grant, exp);
        }
        self.extras().grants.push(grant.clone());
        grant
    }

    /// Join `channel` (room and budget were checked), or answer again when held: the
    /// shard carries every step (the presence hub's member list, history position,
    /// replay, the ordering rule).
    fn subscribe(
        &mut self,
        conn: &Rc<WsConn>,
        channel: &str,
        since: Option<&Since<'_>>,
        presence: Option<Presence>,
    ) {
        let again = self.subscriptions.contains(channel);
        let history = if C::HISTORY {
            self.project.history.get()
        } else {
            HistorySpec::default()
        };
        let req = JoinRequest {
            project: self.project.index,
            channel,
            history,
            since: since.map(|s| (s.offset, s.epoch)),
            again,
            presence,
        };
        self.ctx.shard.join(conn, req, subscribed::<C>);
        if !again {
            self.subscriptions.push(channel);
        }
    }

    /// A presence join of `user` holding `grant`, answered in this protocol: a refusal
    /// ends the grant (the session prunes it, and its channel, on its next frame).
    fn presence(&self, grant: &Rc<Grant>, user: &str, info: Option<String>) -> Presence {
        let (expiry, grant) = (self.ctx.expiry.clone(), grant.clone());
        Presence {
            user_id: user.into(),
            info: info.map(String::into_boxed_str),
            reply: PresenceReply {
                joined: presence_joined::<C>,
                refused: presence_refused::<C>,
                forget: Box::new(move || expiry.end(&grant)),
            },
        }
    }

    /// `refresh` (native): a new token for the same user moves a deadline: with
    /// `channel`, a channel token moves its held private subscription's; without, a
    /// connection token moves the connection's. A refused one leaves the old `exp` in
    /// force.
    fn refresh(
        &mut self,
        conn: &Rc<WsConn>,
        channel: Option<&str>,
        token: Option<&str>,
    ) -> Result<(), ClientError> {
        let held = match channel {
            Some(channel) => self
                .grant(channel)
                .ok_or(ClientError::Token(TokenRefusal::NotSubscribed))?,
            None => self
                .user()
                .and_then(|u| u.grant.clone())
                .ok_or(ClientError::Token(TokenRefusal::NoConnectionToken))?,
        };
        let token = token.ok_or(ClientError::Token(TokenRefusal::Missing))?;
        self.within_budget()?;
        let exp = match channel {
            Some(channel) => self.channel_token_exp(channel, token, &held)?,
            None => self.connection_token_exp(token)?,
        };
        if let Some(exp) = exp {
            self.ctx.expiry.arm(&held, exp);
        }
        send_reply::<C>(
            conn,
            Reply::Refreshed {
                channel,
                exp: held.exp(),
            },
        );
        Ok(())
    }

    /// The `exp` of a channel token refreshing `held`, once it holds for the same user.
    fn channel_token_exp(
        &self,
        channel: &str,
        token: &str,
        held: &Grant,
    ) -> Result<Option<u64>, ClientError> {
        let mut member = credential::token(&self.ctx, &self.project, channel, token)?;
        self.as_connection_user(&mut member)?;
        if member.sub.as_deref() != held.sub.as_deref() {
            return Err(ClientError::Token(TokenRefusal::SubjectChanged));
        }
        Ok(member.exp)
    }

    /// The `exp` of a connection token refreshing the connection's, once it holds for
    /// the connection's user.
    fn connection_token_exp(&self, token: &str) -> Result<Option<u64>, ClientError> {
        let user = super::user::connection_token(&self.ctx, &self.project, token)
            .map_err(ClientError::Token)?;
        if self.user().is_some_and(|u| u.user() != &user.sub) {
            return Err(ClientError::Token(TokenRefusal::NotConnectionUser));
        }
        Ok(user.exp)
    }

    /// `pusher:signin`: the user `user_data` names becomes the connection's user, once
    /// its signature holds (charged to the subscribe budget). Signing in again as the
    /// same user is answered again; as another user, refused.
    fn signin(
        &mut self,
        conn: &Rc<WsConn>,
        user_data: &str,
        auth: &str,
    ) -> Result<(), ClientError> {
        self.within_budget()?;
        let socket_id = SocketId::local(self.ctx.shard.index(), conn.id).text();
        let user = super::user::signin(
            &self.ctx,
            &self.project,
            socket_id.as_str(),
            user_data,
            auth,
        )?;
        match self.user() {
            Some(held) if held.user() != &user.sub => return Err(ClientError::SigninOtherUser),
            Some(_) => {}
            None => self.set_user(conn, user),
        }
        send_reply::<C>(conn, Reply::SignedIn { user_data });
        Ok(())
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

    /// Drop the channels whose grant the expiry timer or the presence hub ended, and
    /// those the server unsubscribed this connection's user from (the registry and the
    /// client were told already).
    fn prune_ended(&mut self) {
        let Some(extras) = self.extras.as_mut() else {
            return;
        };
        if let Some(user) = extras.user.as_ref().filter(|u| u.entry.has_removed()) {
            for channel in user.entry.take_removed() {
                if let Some(pos) = extras.grants.iter().position(|g| *g.channel == *channel) {
                    let grant = extras.grants.swap_remove(pos);
                    self.ctx.expiry.end(&grant);
                }
                self.subscriptions.remove(&channel);
            }
        }
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

    /// A client event the codec found well formed: relay it to the channel's other
    /// subscribers, or say why not (see `client::events`).
    fn client_event(
        &mut self,
        conn: &Rc<WsConn>,
        channel: &str,
        event: &str,
        data: &EventData<'_>,
    ) -> Result<(), Refusal> {
        if !events::allowed(&self.project) {
            return Err(Refusal::Off);
        }
        events::check_channel(channel)?;
        // A grant that ended was pruned, with its channel, before this frame.
        if !self.subscriptions.contains(channel) {
            return Err(Refusal::NotSubscribed);
        }
        let log = self.extras().event_log.get_or_insert_with(Box::default);
        if !log.admit(crate::quota::now_ns()) {
            return Err(Refusal::ConnectionRate);
        }
        // A presence channel always holds a grant, with its member's user.
        let grant = is_presence(channel).then(|| self.grant(channel)).flatten();
        let user_id = grant.as_ref().and_then(|g| g.sub.as_deref());
        // The id the client was given when it connected (`upgrade::start`).
        let socket_id = SocketId::local(self.ctx.shard.index(), conn.id).text();
        // Encoded now that it is accepted: one copy per event, never per subscriber.
        let data = data.text();
        let ev = ClientEvent {
            channel,
            event,
            data: &data,
            user_id,
            socket_id: socket_id.as_str(),
        };
        events::relay(&self.ctx.events, &self.project, conn.id, &ev)
    }

    fn unsubscribe(&mut self, conn: &Rc<WsConn>, channel: &str) {
        self.drop_grant(channel);
        if self.subscriptions.remove(channel) {
            self.ctx
                .shard
                .unsubscribe(self.project.index, channel, conn.id);
        }
        send_reply::<C>(conn, Reply::Unsubscribed { channel });
    }
}

/// Send the answer `r`, if the protocol answers it.
fn send_reply<C: Codec>(conn: &Rc<WsConn>, r: Reply<'_>) {
    if let Some(frame) = C::reply(r) {
        conn.send(frame);
    }
}

/// The protocol's answer to a subscribe that went live (`shard::Answer`).
fn subscribed<C: Codec>(
    channel: &str,
    position: Option<(u64, &str)>,
    recovered: Option<bool>,
) -> Option<bytes::Bytes> {
    C::reply(Reply::Subscribed {
        channel,
        position,
        recovered,
    })
}

/// The protocol's answer to a presence join that went live (`shard::PresenceReply`).
fn presence_joined<C: Codec>(channel: &str, members: &str) -> Option<bytes::Bytes> {
    C::reply(Reply::PresenceJoined { channel, members })
}

/// The protocol's refusal of a presence join the hub refused (`shard::PresenceReply`).
fn presence_refused<C: Codec>(channel: &str, why: PresenceRefusal) -> bytes::Bytes {
    let error = match why {
        PresenceRefusal::Full => ClientError::PresenceFull,
        PresenceRefusal::OtherUser => ClientError::OtherUser,
    };
    C::refusal(&error, Some(channel))
}

impl<C: Codec> Session for ClientSession<C> {
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), Disconnect> {
        if opcode != Opcode::Text {
            return Err(ClientError::Binary
                .close()
                .unwrap_or(Disconnect::BINARY_UNSUPPORTED));
        }
        self.prune_ended();
        C::decode(payload, |command| self.apply(conn, command));
        Ok(())
    }

    fn read_ctx(&self) -> &ReadCtx {
        &self.ctx.read
    }

    fn on_end(&mut self, conn: &Rc<WsConn>) {
        self.prune_ended();
        if let Some(extras) = self.extras.take() {
            for grant in extras.grants {
                self.ctx.expiry.disarm(&grant);
            }
            if let Some(user) = extras.user {
                if let Some(grant) = &user.grant {
                    self.ctx.expiry.disarm(grant);
                }
                self.ctx.shard.user_leave(&user.entry);
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

#[cfg(test)]
mod tests;
