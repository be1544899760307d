//! What a client asks for, whichever protocol it speaks: a codec (`client::codec`)
//! decodes a text frame into one [`Command`], the session core (`client::session`)
//! applies it and says what to answer with a [`Reply`] or a
//! [`super::error::ClientError`], and the codec writes that answer in its protocol.
//!
//! Invariants: a command borrows from the frame it was decoded from (no copy of a
//! channel name or a token); a codec has already applied every check that needs only
//! the frame (JSON shape, channel and event names, `since`'s shape, a client event's
//! `data`), so the session core checks only what needs the connection's state.

use std::borrow::Cow;

use super::error::ClientError;

/// One decoded client frame.
pub(crate) enum Command<'a> {
    /// Answer with a pong.
    Ping,
    /// Nothing to do (Pusher's `pusher:pong`).
    Ignore,
    Subscribe(Subscribe<'a>),
    /// Leave a channel (answered `unsubscribed` natively; Pusher answers nothing).
    Unsubscribe(Cow<'a, str>),
    /// A new token for a held private channel, or without `channel` for the
    /// connection (native only).
    Refresh {
        channel: Option<&'a str>,
        token: Option<&'a str>,
    },
    /// Pusher's user authentication (`pusher:signin`): `user_data` (a JSON object text
    /// with the user's `id`) and `auth` (`<key>:<signature>`), both as received.
    Signin {
        user_data: Cow<'a, str>,
        auth: Cow<'a, str>,
    },
    /// A `client-` event for the channel's other subscribers.
    ClientEvent {
        channel: Cow<'a, str>,
        event: Cow<'a, str>,
        data: EventData<'a>,
    },
    /// The frame was refused as it stands; `channel` when the answer names one.
    Refused {
        error: ClientError,
        channel: Option<Cow<'a, str>>,
    },
}

/// A client event's `data`: a JSON object or string, as the native message frame
/// carries it.
pub(crate) enum EventData<'a> {
    /// The JSON text itself (Pusher: as sent, or its text in a string).
    Text(Cow<'a, [u8]>),
    /// A native frame's parsed value (simd-json parses in place, so the text is gone):
    /// re-encoded only once the event is accepted, never for a refused one.
    Value(&'a simd_json::BorrowedValue<'a>),
}

impl EventData<'_> {
    /// The JSON text to relay.
    pub(crate) fn text(&self) -> Cow<'_, [u8]> {
        use simd_json::prelude::Writable;
        match self {
            EventData::Text(t) => Cow::Borrowed(t),
            EventData::Value(v) => Cow::Owned(v.encode().into_bytes()),
        }
    }
}

/// A subscribe.
pub(crate) struct Subscribe<'a> {
    pub(crate) channel: Cow<'a, str>,
    /// The last position the client saw (native only).
    pub(crate) since: Option<Since<'a>>,
    pub(crate) credential: Credential<'a>,
}

/// A subscribe's `since`: the last position the client saw.
pub(crate) struct Since<'a> {
    pub(crate) offset: u64,
    pub(crate) epoch: &'a str,
}

/// What a subscribe offers for a `private-` or `presence-` channel (ignored on others).
pub(crate) enum Credential<'a> {
    /// Native: a JWT (`token`), if one was sent.
    Token(Option<&'a str>),
    /// Pusher: `auth` (`<key>:<signature>`, empty counts as none) and, for presence,
    /// `channel_data` (the member).
    Signature {
        auth: Option<&'a str>,
        channel_data: Option<&'a str>,
    },
}

/// What the session core answers with (refusals are [`ClientError`]s).
pub(crate) enum Reply<'a> {
    Pong,
    /// The subscription is live: its position when the channel keeps history, and
    /// whether a `since` was recovered.
    Subscribed {
        channel: &'a str,
        position: Option<(u64, &'a str)>,
        recovered: Option<bool>,
    },
    /// A presence subscription is live: `members` is the member list as a JSON object
    /// (user id to info).
    PresenceJoined {
        channel: &'a str,
        members: &'a str,
    },
    Unsubscribed {
        channel: &'a str,
    },
    /// A refresh moved the channel's expiry (or, without `channel`, the connection
    /// token's) to `exp` (unix seconds).
    Refreshed {
        channel: Option<&'a str>,
        exp: u64,
    },
    /// A `pusher:signin` was accepted: the connection's user is `user_data`'s.
    SignedIn {
        user_data: &'a str,
    },
}
