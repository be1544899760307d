//! ringcast's client protocols over an established WebSocket, as one session core with
//! a codec per protocol (sans-IO in the shape of quinn-proto): a codec ([`codec`]:
//! native or Pusher protocol 7) decodes a frame into a [`command`], the core
//! ([`session`]) applies it and answers with a reply or a refusal from the one table of
//! client errors ([`error`]), which the codec writes in its protocol. Around the core:
//! what a credential proves ([`credential`]), private channels' grants and per-worker
//! expiry timer ([`private`]), client events relayed between the subscribers of a
//! private channel ([`events`]), what a subscribe may cost a worker ([`admit`]: each
//! connection's budget, the cache of verified tokens), the channels one connection
//! holds ([`subs`]), who the connection is ([`user`]: connection tokens, Pusher sign-in). The frames themselves are written by `crate::wire` (native and
//! Pusher).
//!
//! Sits above the shard core (it subscribes through [`crate::shard::Shard`], which
//! mirrors transitions to the interest filter and the cluster) and above the transport
//! (`ws`), which it drives through the `ws::conn::Session` trait. It knows the project a
//! connection belongs to; the transport does not.

pub(crate) mod admit;
pub(crate) mod codec;
pub(crate) mod command;
pub(crate) mod credential;
pub(crate) mod ctx;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod private;
pub(crate) mod session;
pub(crate) mod subs;
pub(crate) mod user;

pub(crate) use crate::wire::native::connected_frame;
pub(crate) use admit::Admission;
pub(crate) use ctx::SessionCtx;
pub(crate) use events::EventContext;
pub(crate) use private::Expiry;
pub(crate) use session::{NativeSession, PusherSession};
