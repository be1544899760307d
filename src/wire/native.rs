//! The native protocol's server frames: the message frame of a publish or a client
//! event, the presence frame, and the replies (`subscribed`, `error`, `pong`,
//! `connected`, ...).
//!
//! The message JSON is spelled once, by [`Message`]:
//! `{"type":"message","channel":…,"event":…,"data":…,"id":"…"` then one of three tails:
//! `}` (a publish, [`message_frame`]), `,"offset":N,"epoch":"…"}` (a history project,
//! [`message_frame_at`] here and [`frame_with_position`] for the body Redis relays), or
//! `,"user_id":…}` (a client event on a presence channel, [`client_event_frame`]). So a
//! frame a node builds from a relayed history body is byte for byte the frame the origin
//! would have built itself, and the relay's frame check accepts exactly these.
//!
//! Invariants: the message frame is built in one exactly-sized allocation with no
//! dynamic dispatch (it is on the hot path); the other frames are tables of fields
//! written by `super::write::object_frame` (one allocation). Names are escaped; `data`, `info` and the
//! presence object are JSON text the caller checked and are copied as they are.

use std::ops::Range;

use bytes::Bytes;

use super::write::{num, object, object_frame, Val, Val::*};
use crate::json::{decimal, json_str_len, write_json_str};
use crate::ws::frame::{header_len, write_header, Opcode};

/// Largest `info` of a presence member, as compact JSON text: what a token's `info`
/// claim or a Pusher `channel_data` may carry, and what a presence frame relayed through
/// Redis may splice into clients' frames.
pub(crate) const MAX_INFO_BYTES: usize = 1024;

/// Longest user id of a presence member, in characters.
pub(crate) const MAX_USER_ID_CHARS: usize = 128;

// The message JSON, in order. `split_body` reads it back with the same pieces.
const TYPE_CHANNEL: &[u8] = b"{\"type\":\"message\",\"channel\":";
const EVENT: &[u8] = b",\"event\":";
const DATA: &[u8] = b",\"data\":";
const ID: &[u8] = b",\"id\":\"";
const OFFSET: &[u8] = b",\"offset\":";
const EPOCH: &[u8] = b",\"epoch\":";
const USER_ID: &[u8] = b",\"user_id\":";

/// The fields every message frame starts with; `data` is JSON text (an object or a
/// string), `id` needs no escaping (ids are made by ringcast: base62).
struct Message<'a> {
    channel: &'a str,
    event: &'a str,
    data: &'a [u8],
    id: &'a str,
}

impl Message<'_> {
    /// Bytes of [`Message::write`].
    #[inline]
    fn len(&self) -> usize {
        TYPE_CHANNEL.len()
            + json_str_len(self.channel)
            + EVENT.len()
            + json_str_len(self.event)
            + DATA.len()
            + self.data.len()
            + ID.len()
            + self.id.len()
            + 1
    }

    /// `{"type":"message","channel":…,"event":…,"data":…,"id":"…"` (no closing brace);
    /// returns where `data` lies in `out`.
    #[inline]
    fn write(&self, out: &mut Vec<u8>) -> Range<usize> {
        out.extend_from_slice(TYPE_CHANNEL);
        write_json_str(out, self.channel);
        out.extend_from_slice(EVENT);
        write_json_str(out, self.event);
        out.extend_from_slice(DATA);
        let start = out.len();
        out.extend_from_slice(self.data);
        let end = out.len();
        out.extend_from_slice(ID);
        out.extend_from_slice(self.id.as_bytes());
        out.push(b'"');
        start..end
    }
}

/// Bytes of a history position's tail without the closing brace:
/// `,"offset":N,"epoch":"…"`.
#[inline]
fn position_len(offset_text: &[u8], epoch: &str) -> usize {
    OFFSET.len() + offset_text.len() + EPOCH.len() + json_str_len(epoch)
}

#[inline]
fn write_position(out: &mut Vec<u8>, offset_text: &[u8], epoch: &str) {
    out.extend_from_slice(OFFSET);
    out.extend_from_slice(offset_text);
    out.extend_from_slice(EPOCH);
    write_json_str(out, epoch);
}

/// A buffer of exactly `payload_len` bytes behind a text frame header.
#[inline]
fn text_frame_buffer(payload_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(header_len(payload_len) + payload_len);
    write_header(&mut out, Opcode::Text, payload_len);
    out
}

/// The broadcast frame for one accepted publish.
pub fn message_frame(channel: &str, event: &str, data: &[u8], id: &str) -> Bytes {
    let m = Message {
        channel,
        event,
        data,
        id,
    };
    let mut out = text_frame_buffer(m.len() + 1);
    m.write(&mut out);
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

/// The broadcast frame of a message of a history project: the same JSON with
/// `"offset":N,"epoch":"..."` after `id`; also the span of `data` inside the frame
/// (history keeps the frame and serves `data` from it without a copy).
pub(crate) fn message_frame_at(
    channel: &str,
    event: &str,
    data: &[u8],
    id: &str,
    offset: u64,
    epoch: &str,
) -> (Bytes, Range<usize>) {
    let m = Message {
        channel,
        event,
        data,
        id,
    };
    let mut digits = [0u8; 20];
    let offset_text = decimal(offset, &mut digits);
    let mut out = text_frame_buffer(m.len() + position_len(offset_text, epoch) + 1);
    let span = m.write(&mut out);
    write_position(&mut out, offset_text, epoch);
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    (Bytes::from(out), span)
}

/// The JSON of a message without its position and closing brace, and where `data`
/// starts in it: what the cluster's publish script keeps and relays (`super::relay`).
pub(crate) fn message_body(channel: &str, event: &str, data: &[u8], id: &str) -> (Vec<u8>, usize) {
    let m = Message {
        channel,
        event,
        data,
        id,
    };
    let mut out = Vec::with_capacity(m.len());
    let span = m.write(&mut out);
    debug_assert_eq!(out.len(), out.capacity());
    (out, span.start)
}

/// The frame of a history message from its relayed `body` ([`message_body`]): the
/// body, its position and the closing brace, in one exactly-sized allocation; the same
/// bytes as [`message_frame_at`].
pub(crate) fn frame_with_position(body: &[u8], offset: u64, epoch: &str) -> Bytes {
    let mut digits = [0u8; 20];
    let offset_text = decimal(offset, &mut digits);
    let mut out = text_frame_buffer(body.len() + position_len(offset_text, epoch) + 1);
    out.extend_from_slice(body);
    write_position(&mut out, offset_text, epoch);
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

/// Split a kept body into (event, data, id) for REST history; `None` when it is not
/// what [`message_body`] makes.
pub(crate) fn split_body(body: &[u8], data_start: usize) -> Option<(String, &[u8], &str)> {
    let head = body.get(..data_start)?;
    let head = head.strip_suffix(DATA)?;
    // A `,"` never occurs inside a JSON string (a quote in it is escaped), so the
    // first `,"event":` is the field.
    let at = memchr::memmem::find(head, EVENT)?;
    let event: String = serde_json::from_slice(&head[at + EVENT.len()..]).ok()?;
    let tail = &body[data_start..];
    let id_at = memchr::memmem::rfind(tail, ID)?;
    let data = &tail[..id_at];
    let id = tail[id_at + ID.len()..].strip_suffix(b"\"")?;
    Some((event, data, std::str::from_utf8(id).ok()?))
}

/// The message frame of a client event: a publish's message frame (same fields, same
/// order) plus `"user_id"` when the sender's grant on a presence channel names one.
/// Encoded once per event, in one exactly-sized allocation.
pub(crate) fn client_event_frame(
    channel: &str,
    event: &str,
    data: &[u8],
    id: &str,
    user_id: Option<&str>,
) -> Bytes {
    let m = Message {
        channel,
        event,
        data,
        id,
    };
    let user_len = user_id.map_or(0, |u| USER_ID.len() + json_str_len(u));
    let mut out = text_frame_buffer(m.len() + user_len + 1);
    m.write(&mut out);
    if let Some(user) = user_id {
        out.extend_from_slice(USER_ID);
        write_json_str(&mut out, user);
    }
    out.push(b'}');
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

/// `{"type":"presence","channel":...,"action":"join"|"leave","user_id":...[,"info":{...}]}`.
/// `action` is one of the two literals; `info` is a checked JSON object.
pub(crate) fn presence_frame(channel: &str, action: &str, user: &str, info: Option<&str>) -> Bytes {
    object_frame(&[
        ("type", Str("presence")),
        ("channel", Str(channel)),
        ("action", Str(action)),
        ("user_id", Str(user)),
        ("info", info.map_or(Absent, Json)),
    ])
}

/// The hub's presence object, `{"count":N,"members":[...]}` ([`write_members`]): what a
/// presence `subscribed` carries and a presence query answers.
pub(crate) fn presence_object<'a>(
    members: impl ExactSizeIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut out = Vec::with_capacity(32 + 48 * members.len());
    out.extend_from_slice(b"{\"count\":");
    num(&mut out, members.len() as u64);
    out.extend_from_slice(b",\"members\":");
    write_members(&mut out, members);
    out.push(b'}');
    // Only JSON text was written: names escaped, info already JSON.
    String::from_utf8(out).unwrap_or_default()
}

/// `[{"user_id":"u1","info":{...}},...]` (`info` left out for a member without one).
pub(crate) fn write_members<'a>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'a str, Option<&'a str>)>,
) {
    out.push(b'[');
    for (i, (user, info)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        object(
            out,
            &[("user_id", Str(user)), ("info", info.map_or(Absent, Json))],
        );
    }
    out.push(b']');
}

/// `{"type":"pong"}` as a complete frame.
pub(crate) const PONG: &[u8] = b"\x81\x0f{\"type\":\"pong\"}";

/// `{"type":"<kind>","channel":…}` (`kind` a literal: `subscribed`, `unsubscribed`).
pub(crate) fn reply(kind: &str, channel: &str) -> Bytes {
    object_frame(&[("type", Str(kind)), ("channel", Str(channel))])
}

/// `subscribed` with what a history channel adds: its position and, for a subscribe
/// with `since`, whether the missed messages follow (`recovered`).
pub(crate) fn subscribed(
    channel: &str,
    position: Option<(u64, &str)>,
    recovered: Option<bool>,
) -> Bytes {
    object_frame(&[
        ("type", Str("subscribed")),
        ("channel", Str(channel)),
        ("recovered", recovered.map_or(Absent, Bool)),
        ("offset", position.map_or(Absent, |(offset, _)| Num(offset))),
        ("epoch", position.map_or(Absent, |(_, epoch)| Str(epoch))),
    ])
}

/// `subscribed` on a presence channel: the hub's presence object ([`presence_object`])
/// under `"presence"`.
pub(crate) fn subscribed_presence(channel: &str, presence: &str) -> Bytes {
    object_frame(&[
        ("type", Str("subscribed")),
        ("channel", Str(channel)),
        ("presence", Json(presence)),
    ])
}

/// An error frame that keeps the connection open.
pub(crate) fn error_frame(code: &str, message: &str) -> Bytes {
    error(code, Absent, message)
}

/// An error frame about one channel (`forbidden` for a refused token).
pub(crate) fn channel_error_frame(code: &str, channel: &str, message: &str) -> Bytes {
    error(code, Str(channel), message)
}

/// `{"type":"error","code":…[,"channel":…],"message":…}`.
fn error(code: &str, channel: Val<'_>, message: &str) -> Bytes {
    object_frame(&[
        ("type", Str("error")),
        ("code", Str(code)),
        ("channel", channel),
        ("message", Str(message)),
    ])
}

/// `unsubscribed` sent by the server on its own (e.g. `token_expired`).
pub(crate) fn unsubscribed_with_reason(channel: &str, reason: &str) -> Bytes {
    object_frame(&[
        ("type", Str("unsubscribed")),
        ("channel", Str(channel)),
        ("reason", Str(reason)),
    ])
}

/// The answer to an accepted `refresh`: the new `exp` now in force; without `channel`
/// for the connection token's refresh.
pub(crate) fn refreshed_frame(channel: Option<&str>, exp: u64) -> Bytes {
    object_frame(&[
        ("type", Str("refreshed")),
        ("channel", channel.map_or(Absent, Str)),
        ("exp", Num(exp)),
    ])
}

/// The frame sent right after the upgrade (`connection_id` is made by ringcast, so its
/// escaping changes nothing), with the connection token's user when there is one.
pub(crate) fn connected_frame(connection_id: &str, heartbeat_s: u64, user: Option<&str>) -> Bytes {
    object_frame(&[
        ("type", Str("connected")),
        ("connection_id", Str(connection_id)),
        ("heartbeat_s", Num(heartbeat_s)),
        ("user_id", user.map_or(Absent, Str)),
    ])
}

#[cfg(test)]
mod tests;
