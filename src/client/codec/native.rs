//! ringcast's own client protocol (docs/protocol.md): `{"type": ...}` frames in,
//! `subscribed` / `unsubscribed` / `pong` / `refreshed` / `error` frames out.
//!
//! Frames are parsed with simd-json in place; a client event's `data` is re-encoded
//! from the parsed value (one copy per event, never per subscriber).

use std::borrow::Cow;

use bytes::Bytes;
use simd_json::prelude::{TypedScalarValue, ValueAsObject, ValueAsScalar, ValueObjectAccess};

use super::{nesting_depth, refused, Codec, MAX_CLIENT_JSON_DEPTH};
use crate::client::command::{Command, Credential, EventData, Reply, Since, Subscribe};
use crate::client::error::ClientError;
use crate::client::events::{self, Refusal};
use crate::wire::native::{
    channel_error_frame, error_frame, refreshed_frame, reply, subscribed, subscribed_presence, PONG,
};

/// The native protocol.
pub(crate) struct Native;

impl Codec for Native {
    const HISTORY: bool = true;

    fn decode<R>(payload: &mut [u8], apply: impl FnOnce(Command<'_>) -> R) -> R {
        // simd-json builds (and drops) a value tree recursively: bound the nesting first
        // so a deeply nested frame cannot exhaust the worker's stack.
        if nesting_depth(payload) > MAX_CLIENT_JSON_DEPTH {
            return apply(refused(ClientError::Nested, None));
        }
        let Ok(value) = simd_json::to_borrowed_value(payload) else {
            return apply(refused(ClientError::BadJson, None));
        };
        let Some(kind) = value.get("type").and_then(|t| t.as_str()) else {
            return apply(refused(ClientError::NoType, None));
        };
        if kind == "ping" {
            return apply(Command::Ping);
        }
        if !matches!(
            kind,
            "subscribe" | "unsubscribe" | "refresh" | "client_event"
        ) {
            return apply(refused(ClientError::UnknownType, None));
        }
        let token = || value.get("token").and_then(|t| t.as_str());
        if kind == "refresh" && value.get("channel").is_none() {
            // The connection token's refresh (contract 1.3, "Users").
            return apply(Command::Refresh {
                channel: None,
                token: token(),
            });
        }
        let Some(channel) = value.get("channel").and_then(|c| c.as_str()) else {
            return apply(refused(ClientError::ChannelNotString, None));
        };
        if crate::names::check(channel).is_err() {
            return apply(refused(ClientError::InvalidChannel, None));
        }
        let command = match kind {
            "subscribe" => match since(value.get("since")) {
                Err(()) => refused(ClientError::InvalidSince, None),
                Ok(since) => Command::Subscribe(Subscribe {
                    channel: Cow::Borrowed(channel),
                    since,
                    credential: Credential::Token(token()),
                }),
            },
            "refresh" => Command::Refresh {
                channel: Some(channel),
                token: token(),
            },
            "unsubscribe" => Command::Unsubscribe(Cow::Borrowed(channel)),
            _ => {
                let event = value.get("event").and_then(|e| e.as_str()).unwrap_or("");
                let checked = events::check_event(event).and_then(|()| match value.get("data") {
                    Some(d) if d.is_str() || d.as_object().is_some() => Ok(d),
                    _ => Err(Refusal::BadData),
                });
                match checked {
                    Ok(data) => Command::ClientEvent {
                        channel: Cow::Borrowed(channel),
                        event: Cow::Borrowed(event),
                        data: EventData::Value(data),
                    },
                    Err(r) => refused(ClientError::Event(r), Some(Cow::Borrowed(channel))),
                }
            }
        };
        apply(command)
    }

    fn reply(reply_: Reply<'_>) -> Option<Bytes> {
        Some(match reply_ {
            Reply::Pong => Bytes::from_static(PONG),
            Reply::Subscribed {
                channel,
                position,
                recovered,
            } => subscribed(channel, position, recovered),
            Reply::PresenceJoined { channel, members } => subscribed_presence(channel, members),
            Reply::Unsubscribed { channel } => reply("unsubscribed", channel),
            Reply::Refreshed { channel, exp } => refreshed_frame(channel, exp),
            // Pusher's only: the native protocol signs in with the connection token.
            Reply::SignedIn { .. } => return None,
        })
    }

    fn refusal(error: &ClientError, channel: Option<&str>) -> Bytes {
        let form = error.native();
        match channel {
            Some(channel) if form.channel => channel_error_frame(form.code, channel, &form.message),
            _ => error_frame(form.code, &form.message),
        }
    }
}

/// A subscribe's `since`, if given: `Err` when it is not `{offset, epoch}`.
fn since<'v>(value: Option<&'v simd_json::BorrowedValue<'_>>) -> Result<Option<Since<'v>>, ()> {
    let Some(s) = value else {
        return Ok(None);
    };
    let offset = s.get("offset").and_then(|o| o.as_u64());
    let epoch = s.get("epoch").and_then(|e| e.as_str());
    match (offset, epoch) {
        (Some(offset), Some(epoch)) => Ok(Some(Since { offset, epoch })),
        _ => Err(()),
    }
}
