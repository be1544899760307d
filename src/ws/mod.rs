//! WebSocket as pure transport: the opening handshake's answer ([`handshake`]), the
//! frame codec ([`frame`]), message reassembly ([`message`]), permessage-deflate
//! ([`deflate`]) and the connection's reader and writer ([`conn`]) driving a
//! [`conn::Session`].
//!
//! Invariant: nothing here knows a project, a key or a channel. What a message means is
//! the session's business (`crate::client` on the server; an echo session in
//! `examples/ws_echo.rs`, which the Autobahn suite runs, so it tests exactly the
//! transport the server runs). Close codes come from the one table in `crate::close`.

pub(crate) mod conn;
pub(crate) mod deflate;
pub(crate) mod frame;
pub(crate) mod handshake;
pub(crate) mod message;
