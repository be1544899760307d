//! ringcast's client protocol over an established WebSocket: what a browser may say
//! ([`session`]), the frames the server answers with ([`frames`]), and private
//! channels' grants and per-worker expiry timer ([`private`]).
//!
//! Sits above the shard core (it subscribes through [`crate::shard::Shard`], which
//! mirrors transitions to the interest filter and the cluster) and above the transport
//! (`ws`), which it drives through the `ws::conn::Session` trait. It knows the project a
//! connection belongs to; the transport does not.

pub(crate) mod frames;
pub(crate) mod private;
pub(crate) mod session;

pub(crate) use frames::connected_frame;
pub(crate) use private::Expiry;
pub(crate) use session::ClientSession;
