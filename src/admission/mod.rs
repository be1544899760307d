//! Admission (contract 1.3, "Admission: reconnect storms and real client addresses"):
//! what decides who may start a connection, and how this node lets connections go.
//!
//! - [`upgrades`]: `max_upgrades_per_second`, one node-wide GCRA bucket on atomics that
//!   every worker checks on a WebSocket upgrade; over it the upgrade is answered with
//!   a 101 and an immediate close (1013 `retry_after=<s>`, Pusher 4100) whose wait is
//!   jittered.
//! - [`drain`]: `drain_spread_s`, the schedule that spreads a worker's 1001 closes at
//!   shutdown so clients do not all reconnect to the other nodes in the same instant.
//! - [`trusted`]: `trusted_proxies`, the peers whose word about the client address is
//!   taken, and `X-Forwarded-For` read from those peers only.
//! - [`proxy`]: the PROXY protocol header (v1 text, v2 binary), parsed from bytes;
//!   [`accept`] reads it off a new connection from a trusted peer, bounded.
//!
//! Invariants: nothing here is consulted per message; with `trusted_proxies` empty no
//! connection is read before HTTP, and with `max_upgrades_per_second` at 0 (off) the
//! upgrade pays nothing. The header of an untrusted peer is never parsed: its bytes go
//! to the HTTP parser, which refuses them (400, then close).
//!
//! This module names only `quota` (the GCRA it reuses); `shard`, `http` and `server`
//! name it.

pub(crate) mod accept;
pub(crate) mod drain;
pub(crate) mod proxy;
pub(crate) mod trusted;
pub(crate) mod upgrades;
