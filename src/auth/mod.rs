//! Authentication of publishes and WebSocket connections by API key.
//!
//! - [`key`]: key kinds, generation, SHA-256 hashing, display prefixes.
//! - [`cache`]: the immutable in-memory [`KeySnapshot`] workers read without locks, and
//!   the [`KeyCache`] that swaps in a new one.
//! - [`watcher`]: the control-plane thread that rebuilds the cache when the store changes.
//!
//! Invariant: the data plane only ever touches [`KeyCache::load`] and what a snapshot
//! returns; it never reaches the store, never blocks and never sees a full key that it
//! did not receive from a client.

pub mod cache;
pub mod key;
pub mod watcher;

pub use cache::{KeyCache, KeyEntry, KeySnapshot, ProjectState};
pub use key::{generate_key, hash_key, key_prefix, KeyHash, KeyKind};
pub use watcher::{spawn_watcher, Watcher};
