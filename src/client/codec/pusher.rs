//! The Pusher Channels protocol 7 (`/app/{key}`): `{"event": ...}` frames in,
//! `pusher:subscription_succeeded` / `pusher:subscription_error` / `pusher:pong` /
//! `pusher:error` frames out (`crate::wire::pusher` writes them).
//!
//! What a pusher-js client may send: `pusher:ping` / `pusher:pong`, `pusher:subscribe`
//! (`data` an object, or a string holding one, as Pusher clients in the wild send
//! both), `pusher:unsubscribe`, `pusher:signin` (answered `pusher:signin_success`, or
//! `pusher:error` 4009), `client-*` events. Subscription problems are
//! `pusher:subscription_error` naming the channel; anything else is a `pusher:error`,
//! with code 4301 for the client-event rate only.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{nesting_depth, refused, Codec, MAX_CLIENT_JSON_DEPTH};
use crate::client::command::{Command, Credential, EventData, Reply, Subscribe};
use crate::client::error::{ClientError, PusherForm};
use crate::client::events::{self, Refusal};
use crate::wire::pusher as pusher_frame;

/// Channel prefixes of Pusher features ringcast does not offer.
const CACHE_PREFIXES: [&str; 4] = [
    "cache-",
    "private-cache-",
    "presence-cache-",
    "private-encrypted-cache-",
];

/// The Pusher protocol.
pub(crate) struct Pusher;

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

/// `pusher:signin`'s `data`.
#[derive(Deserialize)]
struct SigninData {
    user_data: String,
    auth: String,
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

impl Codec for Pusher {
    const HISTORY: bool = false;

    fn decode<R>(payload: &mut [u8], apply: impl FnOnce(Command<'_>) -> R) -> R {
        if nesting_depth(payload) > MAX_CLIENT_JSON_DEPTH {
            return apply(refused(ClientError::Nested, None));
        }
        let Ok(frame) = serde_json::from_slice::<Frame<'_>>(payload) else {
            return apply(refused(ClientError::BadJson, None));
        };
        match &*frame.event {
            "pusher:ping" => apply(Command::Ping),
            "pusher:pong" => apply(Command::Ignore),
            "pusher:subscribe" => {
                let Some(sub) = frame.data.and_then(object_of::<SubscribeData>) else {
                    return apply(refused(ClientError::SubscribeData, None));
                };
                let channel = sub.channel.as_str();
                let bad = if crate::names::check(channel).is_err() {
                    Some(ClientError::InvalidChannel)
                } else if CACHE_PREFIXES.iter().any(|p| channel.starts_with(p)) {
                    Some(ClientError::CacheChannel)
                } else {
                    None
                };
                if let Some(error) = bad {
                    return apply(refused(error, Some(Cow::Borrowed(channel))));
                }
                apply(Command::Subscribe(Subscribe {
                    channel: Cow::Borrowed(channel),
                    since: None,
                    credential: Credential::Signature {
                        auth: sub.auth.as_deref().filter(|a| !a.is_empty()),
                        channel_data: sub.channel_data.as_deref(),
                    },
                }))
            }
            "pusher:unsubscribe" => match frame.data.and_then(object_of::<SubscribeData>) {
                None => apply(refused(ClientError::UnsubscribeData, None)),
                Some(sub) => apply(Command::Unsubscribe(Cow::Borrowed(&sub.channel))),
            },
            "pusher:signin" => match frame.data.and_then(object_of::<SigninData>) {
                None => apply(refused(ClientError::SigninData, None)),
                Some(d) => apply(Command::Signin {
                    user_data: Cow::Owned(d.user_data),
                    auth: Cow::Owned(d.auth),
                }),
            },
            e if e.starts_with(events::EVENT_PREFIX) => {
                match client_event(e, frame.channel.as_deref(), frame.data) {
                    Ok((channel, data)) => apply(Command::ClientEvent {
                        channel: Cow::Borrowed(channel),
                        event: Cow::Borrowed(e),
                        data: EventData::Text(data),
                    }),
                    Err(r) => apply(refused(ClientError::Event(r), None)),
                }
            }
            _ => apply(refused(ClientError::UnknownType, None)),
        }
    }

    fn reply(reply: Reply<'_>) -> Option<Bytes> {
        match reply {
            Reply::Pong => Some(pusher_frame::pong()),
            Reply::Subscribed { channel, .. } => {
                Some(pusher_frame::subscription_succeeded(channel, "{}"))
            }
            Reply::PresenceJoined { channel, members } => {
                Some(match pusher_frame::presence_data(members) {
                    Ok(data) => pusher_frame::subscription_succeeded(channel, &data),
                    Err(_) => Self::refusal(&ClientError::MemberList, Some(channel)),
                })
            }
            Reply::SignedIn { user_data } => Some(pusher_frame::signin_success(user_data)),
            // Pusher answers an unsubscribe with nothing; it has no refresh.
            Reply::Unsubscribed { .. } | Reply::Refreshed { .. } => None,
        }
    }

    fn refusal(error: &ClientError, channel: Option<&str>) -> Bytes {
        match (error.pusher(), channel) {
            ((PusherForm::Subscription { kind, status }, message), Some(channel)) => {
                pusher_frame::subscription_error(channel, kind, &message, status)
            }
            ((PusherForm::Subscription { .. }, message), None) => {
                pusher_frame::error(None, &message)
            }
            ((PusherForm::Error { code }, message), _) => pusher_frame::error(code, &message),
        }
    }
}

/// A `client-*` event's channel and `data` as the native message frame carries it: an
/// object or a string as sent; any other value as its JSON text in a string (what
/// pusher-js receivers get in any case).
fn client_event<'a>(
    event: &str,
    channel: Option<&'a str>,
    data: Option<&'a RawValue>,
) -> Result<(&'a str, Cow<'a, [u8]>), Refusal> {
    events::check_event(event)?;
    let channel = channel
        .filter(|c| crate::names::check(c).is_ok())
        .ok_or(Refusal::NotSubscribed)?;
    let data = data.ok_or(Refusal::BadData)?.get().trim();
    let text = match data.as_bytes().first() {
        Some(b'{') | Some(b'"') => Cow::Borrowed(data.as_bytes()),
        Some(_) => {
            let mut out = Vec::with_capacity(data.len() + 2);
            crate::json::write_json_str(&mut out, data);
            Cow::Owned(out)
        }
        None => return Err(Refusal::BadData),
    };
    Ok((channel, text))
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn frames_decode_to_commands() {
        let mut f = br#"{"event":"pusher:subscribe","data":{"channel":"cache-x"}}"#.to_vec();
        let code = Pusher::decode(&mut f, |c| match c {
            Command::Refused { error, channel } => (error, channel.map(|c| c.into_owned())),
            _ => panic!("refused expected"),
        });
        assert_eq!(code, (ClientError::CacheChannel, Some("cache-x".into())));
        let mut f = br#"{"event":"client-x","channel":"private-a","data":12}"#.to_vec();
        let data = Pusher::decode(&mut f, |c| match c {
            Command::ClientEvent { data, .. } => data.text().into_owned(),
            _ => panic!("client event expected"),
        });
        assert_eq!(data, b"\"12\"");
    }
}
