//! Every refusal a client's frame can meet, in one table ([`ClientError`]): for each, the
//! native `error` frame (its `code`, its sentence, whether it names the channel), the
//! Pusher form (a `pusher:subscription_error` with `type` and `status`, or a
//! `pusher:error` with an optional `code`) and, for the one that ends the connection,
//! its close code. The codecs (`client::codec`) write the frames from this table; the
//! session core only says which refusal it met.
//!
//! Invariants: a refusal never closes the connection except [`ClientError::Binary`]
//! (1003); every refusal on a subscribe names the channel in its Pusher form (pusher-js
//! routes `pusher:subscription_error` by channel); the native codes are the ones
//! `docs/protocol.md` lists.

use std::borrow::Cow;

use crate::auth::pusher::ChannelAuthError;
use crate::auth::token::TokenRefusal;
use crate::close::Disconnect;

use super::events::Refusal;

/// Why a client frame did nothing (besides its answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientError {
    /// A binary frame: neither protocol has one (the connection closes).
    Binary,
    /// JSON nested deeper than [`super::codec::MAX_CLIENT_JSON_DEPTH`].
    Nested,
    /// Not JSON (Pusher: not a JSON object with a string `event`).
    BadJson,
    /// A native frame without a string `type`.
    NoType,
    /// A `type` (native) or `event` (Pusher) the protocol does not have.
    UnknownType,
    /// A native frame whose `channel` is missing or not a string.
    ChannelNotString,
    /// A channel name outside the naming rule.
    InvalidChannel,
    /// A native `since` that is not `{offset, epoch}`.
    InvalidSince,
    /// `pusher:subscribe` without its data object.
    SubscribeData,
    /// `pusher:unsubscribe` without its data object.
    UnsubscribeData,
    /// `pusher:signin` without its data object (`user_data` and `auth`, strings).
    SigninData,
    /// A `pusher:signin` whose `auth` does not verify.
    Signin(ChannelAuthError),
    /// The key in a `pusher:signin`'s `auth` is not an active public key of the project.
    SigninKey,
    /// A `pusher:signin` whose `user_data` names no acceptable user.
    SigninUser(&'static str),
    /// A `pusher:signin` of a blocked user.
    SigninBlocked,
    /// A second `pusher:signin` naming another user (a connection's user never changes).
    SigninOtherUser,
    /// A Pusher cache channel (not offered).
    CacheChannel,
    /// The connection holds `max_subscriptions_per_connection` channels.
    TooManySubscriptions,
    /// The worker holds as many subscriptions as it may.
    ServerFull,
    /// Over the connection's subscribe budget; the sentence says when to retry.
    RateLimited(String),
    /// A native token was refused.
    Token(TokenRefusal),
    /// A Pusher presence subscribe without `channel_data`.
    NeedsChannelData,
    /// A Pusher private subscribe without `auth`.
    AuthMissing,
    /// A Pusher `auth` that does not verify.
    Auth(ChannelAuthError),
    /// The key in a Pusher `auth` is not an active public key of the project.
    KeyNotPublic,
    /// A Pusher `channel_data` that names no acceptable member.
    Member(&'static str),
    /// A held presence channel asked again under another user (the session's check).
    SubjectChanged,
    /// The presence hub holds this connection under another user (its own guard).
    OtherUser,
    /// The presence channel has `max_presence_members` members.
    PresenceFull,
    /// The member list could not be encoded for Pusher.
    MemberList,
    /// A client event that was not relayed.
    Event(Refusal),
}

/// A refusal's native form: `{"type":"error","code":..,"message":..}`, with the channel
/// when `channel` is set.
pub(crate) struct NativeForm<'e> {
    pub(crate) code: &'static str,
    pub(crate) message: Cow<'e, str>,
    pub(crate) channel: bool,
}

/// A refusal's Pusher form.
pub(crate) enum PusherForm {
    /// `pusher:subscription_error` for the channel: `{type, error, status}`.
    Subscription { kind: &'static str, status: u16 },
    /// `pusher:error` with `{code?, message}`.
    Error { code: Option<u16> },
}

impl ClientError {
    /// The close code, for the one refusal that ends the connection.
    pub(crate) fn close(&self) -> Option<Disconnect> {
        match self {
            ClientError::Binary => Some(Disconnect::BINARY_UNSUPPORTED),
            _ => None,
        }
    }

    /// The native error frame's fields.
    pub(crate) fn native(&self) -> NativeForm<'_> {
        use ClientError as E;
        let (code, message, channel): (&'static str, Cow<'_, str>, bool) = match self {
            E::Binary => (
                "unsupported",
                "binary frames are not supported".into(),
                false,
            ),
            E::Nested => (
                "invalid_json",
                "the frame is nested too deeply".into(),
                false,
            ),
            E::BadJson => ("invalid_json", "the frame is not valid JSON".into(), false),
            E::NoType => (
                "unknown_type",
                "the frame needs a string field 'type'".into(),
                false,
            ),
            E::UnknownType
            | E::SubscribeData
            | E::UnsubscribeData
            | E::SigninData
            | E::Signin(_)
            | E::SigninKey
            | E::SigninUser(_)
            | E::SigninBlocked
            | E::SigninOtherUser => (
                "unknown_type",
                "type must be subscribe, unsubscribe, refresh, client_event or ping".into(),
                false,
            ),
            E::ChannelNotString => (
                "invalid_channel",
                "the field 'channel' must be a string".into(),
                false,
            ),
            E::InvalidChannel | E::CacheChannel => (
                "invalid_channel",
                "a channel is 1 to 100 characters without control characters".into(),
                false,
            ),
            E::InvalidSince => (
                "invalid_since",
                "since must be {\"offset\": integer >= 0, \"epoch\": string}".into(),
                false,
            ),
            E::TooManySubscriptions => (
                "too_many_subscriptions",
                "this connection has reached its subscription limit".into(),
                false,
            ),
            E::ServerFull => (
                "too_many_subscriptions",
                "the server holds as many subscriptions as it may; try again later".into(),
                false,
            ),
            E::RateLimited(why) => ("rate_limited", why.as_str().into(), true),
            E::Token(r) => ("forbidden", r.to_string().into(), true),
            E::SubjectChanged | E::OtherUser => (
                "forbidden",
                TokenRefusal::SubjectChanged.to_string().into(),
                true,
            ),
            E::NeedsChannelData | E::AuthMissing | E::KeyNotPublic | E::Member(_) => {
                ("forbidden", TokenRefusal::Missing.to_string().into(), true)
            }
            E::Auth(e) => ("forbidden", e.to_string().into(), true),
            E::PresenceFull => (
                "presence_full",
                "the presence channel has as many members as it may hold".into(),
                true,
            ),
            E::MemberList => (
                "internal",
                "the member list could not be encoded".into(),
                true,
            ),
            E::Event(r) => (r.code(), r.message().into(), true),
        };
        NativeForm {
            code,
            message,
            channel,
        }
    }

    /// The Pusher frame's form and sentence.
    pub(crate) fn pusher(&self) -> (PusherForm, Cow<'_, str>) {
        use ClientError as E;
        use PusherForm::{Error, Subscription};
        let sub = |kind, status| Subscription { kind, status };
        match self {
            E::Binary => (Error { code: None }, "binary frames are not supported".into()),
            E::Nested => (
                Error { code: None },
                "the frame is nested too deeply".into(),
            ),
            E::BadJson | E::NoType => (
                Error { code: None },
                "a frame is a JSON object with a string event".into(),
            ),
            E::UnknownType | E::ChannelNotString | E::InvalidSince => (
                Error { code: None },
                "unsupported event: send pusher:subscribe, pusher:unsubscribe, pusher:ping or a client- event".into(),
            ),
            E::SubscribeData => (
                Error { code: None },
                "pusher:subscribe needs data {\"channel\": string, \"auth\"?: string, \"channel_data\"?: string}".into(),
            ),
            E::UnsubscribeData => (
                Error { code: None },
                "pusher:unsubscribe needs data {\"channel\": string}".into(),
            ),
            // Pusher's code for a connection that is not authorised (the connection
            // stays open: the application may sign in again).
            E::SigninData => (
                Error { code: Some(4009) },
                "pusher:signin needs data {\"user_data\": string, \"auth\": string}".into(),
            ),
            E::Signin(e) => (
                Error { code: Some(4009) },
                match e {
                    ChannelAuthError::Malformed => "auth must be <key>:<64 hex digits>",
                    ChannelAuthError::NoSecret => {
                        "the project has no token secret; create one with `ringcast project rotate-token-secret`"
                    }
                    ChannelAuthError::Signature => "Invalid signature",
                }
                .into(),
            ),
            E::SigninKey => (
                Error { code: Some(4009) },
                "the key in auth is not an active public key of this app".into(),
            ),
            E::SigninUser(why) => (Error { code: Some(4009) }, (*why).into()),
            E::SigninBlocked => (
                Error { code: Some(4009) },
                TokenRefusal::Blocked.to_string().into(),
            ),
            E::SigninOtherUser => (
                Error { code: Some(4009) },
                "this connection is signed in as another user".into(),
            ),
            E::InvalidChannel => (
                sub("InvalidChannel", 400),
                "a channel name is 1 to 100 characters without control characters".into(),
            ),
            E::CacheChannel => (
                sub("UnsupportedFeature", 400),
                "cache channels are not supported".into(),
            ),
            E::TooManySubscriptions => (
                sub("LimitReached", 429),
                "this connection has reached its subscription limit".into(),
            ),
            E::ServerFull => (
                sub("LimitReached", 429),
                "the server holds as many subscriptions as it may; try again later".into(),
            ),
            E::RateLimited(why) => (sub("LimitReached", 429), why.as_str().into()),
            E::Token(r) => (sub("AuthError", 401), r.to_string().into()),
            E::NeedsChannelData => (
                sub("AuthError", 400),
                "a presence channel needs channel_data".into(),
            ),
            E::AuthMissing => (
                sub("AuthError", 401),
                "this channel needs auth (key:signature) from your auth endpoint".into(),
            ),
            E::Auth(e) => (
                sub("AuthError", 401),
                match e {
                    ChannelAuthError::Malformed => "auth must be <key>:<64 hex digits>",
                    ChannelAuthError::NoSecret => {
                        "the project has no token secret; create one with `ringcast project rotate-token-secret`"
                    }
                    ChannelAuthError::Signature => "invalid signature",
                }
                .into(),
            ),
            E::KeyNotPublic => (
                sub("AuthError", 401),
                "the key in auth is not an active public key of this app".into(),
            ),
            E::Member(why) => (sub("AuthError", 400), (*why).into()),
            E::SubjectChanged => (
                sub("AuthError", 403),
                "this connection is a member of the channel under another user_id; unsubscribe first".into(),
            ),
            E::OtherUser => (
                sub("AuthError", 403),
                "this connection is a member of the channel under another user_id".into(),
            ),
            E::PresenceFull => (
                sub("LimitReached", 403),
                "the presence channel has as many members as it may hold".into(),
            ),
            E::MemberList => (
                sub("InternalError", 500),
                "the member list could not be encoded".into(),
            ),
            E::Event(r) => (
                Error {
                    code: (*r == Refusal::ConnectionRate).then_some(4301),
                },
                r.message().into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal on a subscribe names its channel in both protocols (a client
    /// routes it by channel), and only a binary frame closes.
    #[test]
    fn subscribe_refusals_name_the_channel_and_only_binary_closes() {
        let on_subscribe = [
            ClientError::RateLimited("later".into()),
            ClientError::Token(TokenRefusal::Expired),
            ClientError::PresenceFull,
            ClientError::SubjectChanged,
            ClientError::OtherUser,
        ];
        for e in on_subscribe {
            assert!(e.native().channel, "{e:?}");
            assert!(
                matches!(e.pusher().0, PusherForm::Subscription { .. }),
                "{e:?}"
            );
            assert!(e.close().is_none());
        }
        assert_eq!(
            ClientError::Binary.close(),
            Some(Disconnect::BINARY_UNSUPPORTED)
        );
    }

    #[test]
    fn client_event_refusals_keep_their_codes_and_4301_for_the_rate() {
        let e = ClientError::Event(Refusal::ConnectionRate);
        assert_eq!(e.native().code, "rate_limited");
        assert!(matches!(
            e.pusher().0,
            PusherForm::Error { code: Some(4301) }
        ));
        let e = ClientError::Event(Refusal::BadData);
        assert_eq!(e.native().code, "invalid_data");
        assert!(matches!(e.pusher().0, PusherForm::Error { code: None }));
    }
}
