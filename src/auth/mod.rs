//! Authentication of publishes and WebSocket connections by API key.
//!
//! - [`cache`]: the immutable in-memory [`KeySnapshot`] workers read without locks, and
//!   the [`KeyCache`] that swaps in a new one.
//! - [`watcher`]: the control-plane thread that rebuilds the cache when the store changes.
//! - [`token`]: private-channel subscription tokens (JWT): the keys that verify a
//!   project's tokens, and the one verification a subscribe or refresh goes through.
//! - [`jwt_crypto`]: the signature checks behind jsonwebtoken (ring for ES256/EdDSA).
//! - [`prehashed`]: the map for keys that already are uniform hashes (a key's SHA-256,
//!   an idempotency key's id).
//! - [`verified`]: a worker's cache of recently verified tokens (a replay costs a hash).
//! - [`pusher`]: Pusher signatures: the signed REST query (`auth_signature`, `body_md5`,
//!   timestamp window) and a private/presence subscribe's `auth`, under the token secrets.
//!
//! Invariant: the data plane only ever touches [`KeyCache::load`] and what a snapshot
//! returns; it never reaches the store, never blocks and never sees a full key that it
//! did not receive from a client.

pub(crate) mod cache;
pub(crate) mod jwt_crypto;
pub(crate) mod prehashed;
pub(crate) mod pusher;
pub(crate) mod token;
pub(crate) mod verified;
pub(crate) mod watcher;

pub(crate) use cache::{KeyCache, KeyRefusal, ProjectState};
pub(crate) use watcher::spawn_watcher;
