//! The link to Redis that every part of cluster mode shares: the client (`redis://` or
//! `rediss://` with an optional CA file), connecting with timeouts, the reconnect backoff
//! and the namespace of every key ringcast writes.
//!
//! It sits below everything that talks to Redis (the project store, the cluster bridge,
//! the presence hub), so none of them reaches into another for its connection. It knows
//! no key layout beyond [`PREFIX`]; each user owns its own keys under it.
//! Invariant: nothing here runs on a worker thread (every call may block up to its
//! timeout).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Namespace of every Redis key ringcast writes.
pub(crate) const PREFIX: &str = "ringcast:";

/// Why a Redis client could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("invalid Redis URL: {0}")]
    Url(String),
    #[error("cannot read the Redis CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Redis TLS with {}: {reason}", path.display())]
    Tls { path: PathBuf, reason: String },
}

/// A Redis client for `url`: `redis://` or `rediss://` (TLS), with an ACL user and
/// password if the URL carries them. With `ca_file`, TLS trusts exactly the CA
/// certificates in that PEM file instead of the system's roots.
pub(crate) fn client(url: &str, ca_file: Option<&Path>) -> Result<redis::Client, LinkError> {
    let invalid = |e: &dyn std::fmt::Display| LinkError::Url(e.to_string());
    let Some(path) = ca_file else {
        return redis::Client::open(url).map_err(|e| invalid(&e));
    };
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| invalid(&e))?;
    let root_cert = std::fs::read(path).map_err(|source| LinkError::CaFile {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    };
    redis::Client::build_with_tls(info, certs).map_err(|e| LinkError::Tls {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// First reconnect delay; doubles up to [`MAX_BACKOFF`].
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(100);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Connect/read/write timeout of a bridge connection's commands; also how long a dead
/// Redis can go unnoticed at most while the connection is idle (a PING is sent this
/// often).
pub(crate) const BRIDGE_IO_TIMEOUT: Duration = Duration::from_secs(1);

/// Capped exponential backoff with jitter, so that nodes that lost Redis together do not
/// all come back in the same millisecond.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff(MIN_BACKOFF)
    }

    pub(crate) fn reset(&mut self) {
        self.0 = MIN_BACKOFF;
    }

    /// The next delay (between half and all of the current step), then double the step.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.0;
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// Connect with the bridge's timeouts.
pub(crate) fn connect(client: &redis::Client) -> redis::RedisResult<redis::Connection> {
    let conn = client.get_connection_with_timeout(BRIDGE_IO_TIMEOUT)?;
    conn.set_write_timeout(Some(BRIDGE_IO_TIMEOUT))?;
    conn.set_read_timeout(Some(BRIDGE_IO_TIMEOUT))?;
    Ok(conn)
}
