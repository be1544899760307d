//! ringcast: a real-time publish service. A backend POSTs `{channel, event, data}` with a
//! secret key; every WebSocket client of that project subscribed to exactly that channel
//! receives it.
//!
//! Layers, top first. A module names modules of its own layer or below, never above;
//! inside a layer, and among the files of one folder, no import cycle.
//! `scripts/check-layers.py` reads this list (the `//! N. name:` lines and the
//! `[`module`]` links on them) and fails CI on an upward import, a cycle, or a module
//! that is missing from it.
//!
//! 9. entry: [`server`] (the composition root: start-up, one pinned monoio worker per
//!    core, listeners, accept loop, timers, signals, graceful shutdown; the only module
//!    that starts `http::conn::serve`), [`admin`] (the project/key subcommands),
//!    [`tools`] (`ringcast publish`/`subscribe`, real clients of a running server).
//! 8. http: [`http`]: HTTP/1.1 head parsing (httparse), the connection loop and its
//!    routing table,
//!    `/health`, the publish endpoint, the WebSocket and Pusher upgrades, the Pusher
//!    REST API, the response writer.
//! 7. node: [`node`]: what all workers of a node share (config, key snapshot,
//!    mailboxes, cluster bridge, health flags); what an accepted publish or client
//!    event asks of its node (`publish::Fanout`: mailboxes, relay, history backend).
//! 6. requests: [`publish`] (parse with simd-json, validate, quota, encode once, hand to
//!    the mailboxes), [`client`] (the client protocols on a WebSocket: one session
//!    core, a codec each for native and Pusher), [`error`] (the one table of REST
//!    rejections).
//! 5. cross-node: [`cluster`] (the Redis bridge: relay out, interest-routed
//!    subscriptions in, on its own threads), [`presence`] (the node's presence and
//!    occupancy hub on its control-plane thread), [`webhook`] (a bounded queue from any
//!    thread, one scheduler thread, one sender thread per sending project).
//! 4. shard: [`shard`]: one core's data-plane state: subscription registry, registered
//!    WebSockets, mailbox (the only cross-core path), interest filter, stop state,
//!    fan-out.
//! 3. projects: [`project`] (what a project, a key, a token secret and a webhook
//!    setting are), [`auth`] (the in-memory key snapshot, its watcher, token and Pusher
//!    signature verification), [`store`] (SQLite/Redis project and key store),
//!    [`config`] (every knob, its default and unit).
//! 2. transports: [`ws`] (WebSocket as pure transport: handshake answer, frame codec,
//!    reassembly, permessage-deflate (negotiation, once-per-message deflate, bounded
//!    inflate), the connection's reader and writer; knows no project, key or channel),
//!    [`wire`] (every byte format written to a socket or to Redis: the native, Pusher
//!    protocol 7 and cluster relay frames and payloads, and the checks of relayed ones),
//!    [`tls`] (the rustls transport), [`history`] (offsets, epochs, the per-node ring
//!    buffers, and the one `Backend` trait where history lives: this node or Redis),
//!    [`admission`] (the node-wide upgrade rate, the shutdown drain spread, trusted
//!    proxies).
//! 1. leaves: [`engine`] (per worker, wakes parked idle connections by readiness
//!    without a task per connection), [`metrics`] (per-worker counters rendered as
//!    Prometheus text), [`quota`] (per-project GCRA on atomics), [`redis_link`] (the
//!    Redis client, timeouts and backoff every cluster-mode part shares), [`apikey`],
//!    [`sealed`], [`cli`], [`close`], [`dialect`], [`ids`], [`json`], [`names`],
//!    [`percent`], [`reply`] (key kinds and hashing, the sealed master key, argument
//!    parsing, close codes, which protocol a connection speaks, ids, JSON escaping,
//!    channel names, URL percent-decoding, one-shot answers from a control-plane thread).
//!
//! Invariants that hold across modules: the hot path never blocks and never allocates
//! per subscriber; one published message is encoded once into one `Bytes` that every
//! subscriber on every core shares; every queue a client or a publisher can fill is
//! bounded (control envelopes and the cluster's interest changes are not: workers and the
//! control plane produce them, a few per change).
//!
//! The public surface below is what the binary, the tests, the benches and the examples
//! need; everything else is crate-private. Bench-only hooks need the `bench` feature.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(rust_2018_idioms)]
#![warn(unreachable_pub)]

mod admin;
mod admission;
mod apikey;
mod auth;
mod cli;
mod client;
mod close;
mod cluster;
mod config;
mod dialect;
mod engine;
mod error;
mod history;
mod http;
mod ids;
mod json;
mod metrics;
mod names;
mod node;
mod percent;
mod presence;
mod project;
mod publish;
mod quota;
mod redis_link;
mod reply;
mod sealed;
mod server;
mod shard;
mod store;
mod tls;
pub mod tools;
mod webhook;
mod wire;
mod ws;

// The binary: argument parsing and the two entry points.
pub use admin::run as run_admin;
pub use cli::{Cli, Command, ConfigCommand};
pub use config::run_show as config_show;
pub use server::{run_cli as run_serve, AlreadyLogged};

// Configuration and the control plane (property tests, control-plane benches).
pub use apikey::{generate_key, hash_key, key_prefix, KeyKind};
pub use auth::cache::KeyCache;
pub use auth::jwt_crypto::{install as install_jwt_verifiers, RING_VERIFIERS as JWT_VERIFIERS};
pub use config::Config;
pub use history::spec::HistorySpec;
pub use project::{HookKind, HookKinds, KeyRecord, ProjectRecord, UserBlockRecord, WebhookSpec};
pub use quota::rate_limit::RateLimit;
pub use quota::Quota;
pub use store::StoreContents;

// Parsers and codecs (property tests, hot-path benches).
pub use auth::pusher::{
    check_rest as pusher_check_rest, parse_query as pusher_parse_query, Query as PusherQuery,
    QueryError as PusherQueryError, RestAuthError as PusherRestAuthError,
};
pub use http::parse::parse_head;
pub use publish::parse::PublishParser;
pub use wire::native::message_frame;

/// Private-channel token verification on its own (the `jwt_token` fuzz target): the
/// one entry point a `subscribe`/`refresh` token goes through, [`token::TokenKeys::verify`]
/// (header and claims decoding, the key and algorithm rules, the claim checks).
pub mod token {
    pub use crate::auth::token::{Grant, TokenKeys, TokenRefusal};

    /// The keys of a project with one token secret (`secret`: the bytes of the whole
    /// `ts_...` string) and the given public keys (`(kid, PEM)`, P-256 or Ed25519; a
    /// PEM that does not parse is skipped).
    pub fn keys(secret: &[u8], public_keys: &[(&str, &str)]) -> TokenKeys {
        let mut keys = TokenKeys::default();
        keys.add_secret(secret, None);
        keys.finish();
        for (kid, pem) in public_keys {
            if let Ok((alg, pem)) = crate::auth::token::parse_public_key(pem.as_bytes()) {
                keys.add_key(kid, alg, &pem);
            }
        }
        keys
    }
}

// The WebSocket transport on its own: the Autobahn echo example runs exactly the
// server's frame codec, reassembly, reader and writer under an echo session.
pub use close::{code as close_code, Disconnect};
pub use engine::{install as install_engine, Engine};
pub use http::response::{write_error, Extra};
pub use http::upgrade::validate as validate_upgrade;
pub use ws::conn::OwnFrame;
pub use ws::conn::{
    read_loop, start_parked, write_loop, PlainWriter, ReadCtx, ReadLimits, Session, WsConn,
};
pub use ws::deflate::configure as configure_compression;
pub use ws::deflate::negotiate::acceptable as deflate_offer_acceptable;
pub use ws::deflate::{OnceFrame, SharedFrame};
pub use ws::frame::{decode_frame, frame, Opcode};
pub use ws::handshake::{write_switching, write_switching_with};
pub use ws::message::{Assembler, Incoming};

/// Hooks for the criterion benches: the fan-out and the mailboxes without sockets.
#[cfg(feature = "bench")]
pub mod bench {
    pub use crate::dialect::Dialect;
    pub use crate::publish::idempotency::bench_cycle as idempotency_cycle;
    pub use crate::shard::fan_out;
    pub use crate::shard::interest::channel_hash;
    pub use crate::shard::mailbox::{Broadcast, BroadcastBatch, Mailboxes};
    pub use crate::shard::registry::Registry;

    /// permessage-deflate of one message (raw deflate, sync flush, tail removed): what
    /// the first worker with a compressing subscriber pays once per message.
    pub fn deflate_message(data: &[u8]) -> Option<Vec<u8>> {
        crate::ws::deflate::codec::deflate(data)
    }

    /// A node's channel history on its own: what a history publish does under its lock.
    pub struct HistoryBench(crate::history::History);

    impl HistoryBench {
        /// A single node's history with a budget of `max_bytes`.
        pub fn new(max_bytes: usize) -> HistoryBench {
            HistoryBench(crate::history::History::new(
                max_bytes,
                crate::history::Recoveries::Allowed,
            ))
        }

        /// Record one message of `channel` (project `project`, history `spec`) as a
        /// publish does: take the next position, append, enforce the byte budget.
        /// Returns the offset it got.
        pub fn append(
            &self,
            project: u32,
            channel: &str,
            spec: crate::HistorySpec,
            frame: bytes::Bytes,
        ) -> u64 {
            let mut h = self.0.lock();
            let p = h.position(project, channel, spec);
            let at = crate::history::Position {
                offset: p.offset + 1,
                epoch: p.epoch,
            };
            let entry = crate::history::Entry::new(at.offset, frame.clone(), "e", frame, "id");
            h.push(project, channel, spec, at, entry);
            h.enforce_budget();
            at.offset
        }
    }
}
