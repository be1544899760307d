//! WebSocket: the upgrade handshake ([`handshake`]), the frame codec ([`frame`]),
//! message reassembly ([`message`]), the connection's reader and writer ([`conn`]) and
//! ringcast's client protocol on top ([`protocol`]).
//!
//! The layers below `protocol` know nothing of channels or keys; `examples/ws_echo.rs`
//! runs them with an echo session so the Autobahn suite tests exactly the code the
//! server runs.

pub mod conn;
pub mod frame;
pub mod handshake;
pub mod message;
pub mod protocol;
