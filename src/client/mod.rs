//! ringcast's client protocol over an established WebSocket: what a browser may say
//! ([`session`]), the frames the server answers with ([`frames`]), private
//! channels' grants and per-worker expiry timer ([`private`]), and client events
//! relayed between the subscribers of a private channel ([`events`]), and what a
//! subscribe may cost a worker ([`admit`]: each connection's budget, the cache of
//! verified tokens); the Pusher
//! protocol 7 as a second session type over the same parts ([`pusher`]).
//!
//! Sits above the shard core (it subscribes through [`crate::shard::Shard`], which
//! mirrors transitions to the interest filter and the cluster) and above the transport
//! (`ws`), which it drives through the `ws::conn::Session` trait. It knows the project a
//! connection belongs to; the transport does not.

pub(crate) mod admit;
pub(crate) mod ctx;
pub(crate) mod events;
pub(crate) mod private;
pub(crate) mod pusher;
pub(crate) mod session;
pub(crate) mod subs;

pub(crate) use crate::wire::native::connected_frame;
pub(crate) use admit::Admission;
pub(crate) use ctx::SessionCtx;
pub(crate) use events::EventContext;
pub(crate) use private::Expiry;
pub(crate) use pusher::PusherSession;
pub(crate) use session::ClientSession;
