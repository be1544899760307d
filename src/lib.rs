//! ringcast: a real-time publish service. A backend POSTs `{channel, event, data}` with a
//! secret key; every WebSocket client of that project subscribed to exactly that channel
//! receives it.
//!
//! Layout (one concept per module):
//! - [`cli`]: argument parsing. [`config`]: every knob, its default and unit.
//! - [`server`]: worker threads (one per core, pinned, monoio on io_uring), listeners,
//!   connection dispatch, graceful shutdown.
//! - [`http`]: request head parsing (httparse), body framing, routing, the response and
//!   error table.
//! - [`publish`]: the publish endpoint: simd-json parse, validation, frame encoding.
//! - [`ws`]: upgrade handshake, frame codec, the client protocol per connection.
//! - [`shard`]: a worker's subscription table, its mailbox (the only cross-core path),
//!   the interest filter that lets publishers skip cores without subscribers, and the
//!   fan-out loop.
//! - [`auth`]: keys, their hashes, the in-memory key snapshot and its watcher.
//! - [`quota`]: per-project GCRA on atomics. [`store`]: the SQLite project/key store.
//! - [`admin`]: the project/key subcommands of the CLI.
//! - [`cluster`]: the Redis bridge of cluster mode (relay out, interest-routed
//!   subscriptions in), on its own threads.
//! - [`tls`]: certificate loading and the rustls transport (HTTPS and WSS).
//! - [`ids`]: message and connection ids without cross-core coordination.
//!
//! Invariants that hold across modules: the hot path never blocks and never allocates
//! per subscriber; one published message is encoded once into one `Bytes` that every
//! subscriber on every core shares; every queue a client or a publisher can fill is
//! bounded (control envelopes and the cluster's interest changes are not: workers and the
//! control plane produce them, a few per change).

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(rust_2018_idioms)]

pub mod admin;
pub mod auth;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod http;
pub mod ids;
pub mod publish;
pub mod quota;
pub mod server;
pub mod shard;
pub mod store;
pub mod tls;
pub mod ws;
