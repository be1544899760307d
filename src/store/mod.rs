//! The project/key store: the durable side of the control plane.
//!
//! [`Store`] is a trait with two implementations: [`SqliteStore`] (one file in the data
//! directory, single node) and [`RedisStore`] (cluster mode, `--redis URL`: every node
//! and every admin command share one Redis).
//! Invariants every implementation keeps:
//! - Only [`KeyHash`]es and display prefixes of keys are stored, never a full key. A
//!   full key is returned once, by the call that created it.
//! - Every committed change makes [`Store::change_token`] return a different value, in
//!   every process watching the same store, so running servers notice it.
//! - Revocation is permanent: a revoked key never becomes active again.
//! - Nothing here runs on a worker thread: store calls may block on I/O and locks.

pub(crate) mod redis;
mod sqlite;

pub(crate) use self::redis::RedisStore;
pub(crate) use sqlite::SqliteStore;

use std::path::{Path, PathBuf};

use crate::apikey::{KeyHash, KeyKind};
use crate::history::HistorySpec;
use crate::quota::RateLimit;

/// Longest project name, in characters (same bound as channel names).
pub(crate) const MAX_PROJECT_NAME_CHARS: usize = 100;

/// A project as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectRecord {
    pub id: String,
    pub name: String,
    pub rate_limit: RateLimit,
    /// Channel history kept for the project (`off` by default).
    pub history: HistorySpec,
}

/// A key as stored: everything but the key itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub project_id: String,
    pub kind: KeyKind,
    pub revoked: bool,
    /// Display prefix, e.g. `sk_ab12…`.
    pub prefix: String,
    pub hash: KeyHash,
}

impl KeyRecord {
    /// A new random key for a project and the record that stores it (hash and prefix
    /// only). Every store mints keys here, so they all look and hash the same.
    pub fn mint(project_id: &str, kind: KeyKind) -> (KeyRecord, String) {
        use crate::apikey::{generate_id, generate_key, hash_key, key_prefix};
        let key = generate_key(kind);
        let record = KeyRecord {
            id: generate_id("key_"),
            project_id: project_id.to_string(),
            kind,
            revoked: false,
            prefix: key_prefix(&key),
            hash: hash_key(&key),
        };
        (record, key)
    }
}

/// One consistent read of the whole store (revoked keys included), from which the
/// in-memory key snapshot is built.
#[derive(Clone, Debug, Default)]
pub struct StoreContents {
    pub projects: Vec<ProjectRecord>,
    pub keys: Vec<KeyRecord>,
}

/// Why a store operation failed. `NotFound` and `Invalid` carry a sentence for the user.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("database error: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("cannot use data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The database was migrated by a newer ringcast; refusing beats guessing.
    #[error("database schema version {found} is newer than this build supports ({supported}); upgrade ringcast")]
    SchemaTooNew { found: i64, supported: i64 },
    /// A stored row that this build cannot interpret.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// Redis did not answer, or answered with an error (cluster mode).
    #[error("Redis error: {0}")]
    Redis(String),
}

/// Projects and keys, wherever they live. Methods take `&mut self` because a store is a
/// connection: one per thread (admin command, watcher), never shared.
pub(crate) trait Store: Send {
    /// A new project with one secret and one public key. Returns the project, then the
    /// full secret key, then the full public key (shown once, never stored).
    fn create_project(
        &mut self,
        name: &str,
        rate_limit: RateLimit,
        history: HistorySpec,
    ) -> Result<(ProjectRecord, String, String), StoreError>;

    /// All projects, oldest first.
    fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError>;

    /// Change a project's quota; returns the updated project.
    fn set_rate_limit(
        &mut self,
        project_id: &str,
        rate_limit: RateLimit,
    ) -> Result<ProjectRecord, StoreError>;

    /// Change a project's history setting; returns the updated project.
    fn set_history(
        &mut self,
        project_id: &str,
        history: HistorySpec,
    ) -> Result<ProjectRecord, StoreError>;

    /// A new key for an existing project; returns its record and the full key.
    fn create_key(
        &mut self,
        project_id: &str,
        kind: KeyKind,
    ) -> Result<(KeyRecord, String), StoreError>;

    /// Revoke a key given either the full key (matched by hash) or its id. Revoking a
    /// revoked key succeeds again (idempotent). Returns the key id.
    fn revoke_key(&mut self, key_or_id: &str) -> Result<String, StoreError>;

    /// A project's keys, oldest first, revoked ones included.
    fn list_keys(&mut self, project_id: &str) -> Result<Vec<KeyRecord>, StoreError>;

    /// Everything, read consistently.
    fn load_all(&mut self) -> Result<StoreContents, StoreError>;

    /// A value that differs whenever any process committed a change since the last call.
    fn change_token(&mut self) -> Result<u64, StoreError>;

    /// True when there are no projects at all (`serve --dev`).
    fn is_empty(&mut self) -> Result<bool, StoreError>;
}

/// Open the store the command line points at: SQLite in `data_dir`, or Redis at `redis`
/// in cluster mode (the data directory is then not used for keys).
pub(crate) fn open_store(
    data_dir: &Path,
    redis: Option<&str>,
) -> Result<Box<dyn Store>, StoreError> {
    match redis {
        Some(url) => Ok(Box::new(RedisStore::open(url)?)),
        None => Ok(Box::new(SqliteStore::open(data_dir)?)),
    }
}

/// Check a project name: non-empty after trimming, at most [`MAX_PROJECT_NAME_CHARS`]
/// characters, no control characters (it is printed in terminals and JSON).
pub(crate) fn validate_project_name(name: &str) -> Result<(), StoreError> {
    if name.trim().is_empty() {
        return Err(StoreError::Invalid("project name must not be empty".into()));
    }
    if name.chars().count() > MAX_PROJECT_NAME_CHARS {
        return Err(StoreError::Invalid(format!(
            "project name must be at most {MAX_PROJECT_NAME_CHARS} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(StoreError::Invalid(
            "project name must not contain control characters".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_names() {
        assert!(validate_project_name("orders").is_ok());
        assert!(validate_project_name(&"é".repeat(100)).is_ok());
        assert!(validate_project_name(&"é".repeat(101)).is_err());
        assert!(validate_project_name("").is_err());
        assert!(validate_project_name("  ").is_err());
        assert!(validate_project_name("a\nb").is_err());
    }

    #[test]
    fn a_bad_redis_url_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_store(dir.path(), Some("not a url")).err().unwrap();
        assert!(matches!(err, StoreError::Invalid(_)), "{err}");
        // Nothing listens on port 1: the store cannot open, and says it is Redis.
        let err = open_store(dir.path(), Some("redis://127.0.0.1:1"))
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::Redis(_)), "{err}");
    }
}
