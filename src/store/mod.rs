//! The project/key store: the durable side of the control plane.
//!
//! [`Store`] is a trait with two implementations: [`SqliteStore`] (one file in the data
//! directory, single node) and [`RedisStore`] (cluster mode, `--redis URL`: every node
//! and every admin command share one Redis).
//! Invariants every implementation keeps:
//! - Of a secret key only its [`crate::apikey::KeyHash`] and display prefix are stored, never the full
//!   key, which is returned once, by the call that created it. Public keys are public
//!   (every web page carries one) and are kept whole too, for the webhook's
//!   `X-Pusher-Key`.
//! - A project token secret (`ts_...`) is stored only sealed under the master key
//!   ([`crate::sealed`]); the clear secret is returned once, by the call that made it.
//!   Of a token key (ES256/EdDSA) only the public half is ever stored.
//! - Every committed change makes [`Store::change_token`] return a different value, in
//!   every process watching the same store, so running servers notice it.
//! - Revocation is permanent: a revoked key never becomes active again.
//! - Every project has a Pusher app id ([`crate::project::ProjectRecord::pusher_app_id`]): unique,
//!   from [`crate::project::FIRST_PUSHER_APP_ID`] upwards, never changed and never given to another
//!   project (Pusher clients and servers have it configured; a reused one would send
//!   their calls to a stranger's project).
//! - A backend stores what it is given: names are checked and keys and token secrets
//!   minted once, above every backend, by the trait's provided methods ([`mint`]).
//! - Nothing here runs on a worker thread: store calls may block on I/O and locks.

mod mint;
mod redis;
mod sqlite;

pub(crate) use self::redis::RedisStore;
#[cfg(test)]
pub(crate) use sqlite::test_store_with_project;
pub(crate) use sqlite::SqliteStore;

use std::path::{Path, PathBuf};

use crate::apikey::KeyKind;
use crate::project::{
    CreatedProject, KeyRecord, NewProject, ProjectChange, ProjectRecord, TokenKeyRecord,
    TokenSecretRecord, UserBlockRecord, UserEndRecord, MAX_PROJECT_NAME_CHARS,
};
use crate::sealed::{MasterKey, SealError};

use mint::mint_token_secret;
pub(crate) use mint::MintedProject;

/// One consistent read of the whole store (revoked keys included), from which the
/// in-memory key snapshot is built.
#[derive(Clone, Debug, Default)]
pub struct StoreContents {
    pub projects: Vec<ProjectRecord>,
    pub keys: Vec<KeyRecord>,
    /// Token secrets, oldest first, expired ones included (the snapshot drops them).
    pub token_secrets: Vec<TokenSecretRecord>,
    pub token_keys: Vec<TokenKeyRecord>,
    /// Ids of the projects whose WebSockets need a connection token (`--require-user on`).
    pub require_user: std::collections::HashSet<String>,
    /// Every block that still holds (expired ones are left out).
    pub user_blocks: Vec<UserBlockRecord>,
}

/// Work for the store, run on the key watcher's thread with its connection (the REST
/// user endpoints run on workers, which never touch the store). What it returns runs
/// after the watcher's next poll, so an answer sent from there is sent once the node's
/// snapshot has the change.
pub(crate) type StoreJob = Box<dyn FnOnce(&mut dyn Store) -> AfterJob + Send>;

/// The second half of a [`StoreJob`] (typically: send the answer).
pub(crate) type AfterJob = Box<dyn FnOnce() + Send>;

/// Unix seconds now.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// When the secrets a rotation replaces stop verifying: `grace_s` from now, or earlier
/// if an earlier rotation already said so.
pub(crate) fn rotated_expiry(current: Option<i64>, now: i64, grace_s: u64) -> i64 {
    let until = now.saturating_add(i64::try_from(grace_s).unwrap_or(i64::MAX));
    current.map_or(until, |c| c.min(until))
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
    #[error(transparent)]
    Seal(#[from] SealError),
    /// No Redis client could be made from the URL and CA file given.
    #[error(transparent)]
    Link(#[from] crate::redis_link::LinkError),
    /// The project already has `max_blocked_users_per_project` blocks in force.
    #[error(
        "the project already blocks {0} users (max_blocked_users_per_project); lift some first"
    )]
    TooManyBlocks(usize),
}

// The not-found sentences both stores give, written once so SQLite and Redis say the
// same thing (the admin commands print them).

/// No project has the id `id`.
fn project_not_found(id: &str) -> StoreError {
    StoreError::NotFound(format!("no project with id {id:?}"))
}

/// The project exists but has no token key `key_id`.
fn no_token_key(project_id: &str, key_id: &str) -> StoreError {
    StoreError::NotFound(format!(
        "project {project_id:?} has no token key {key_id:?}"
    ))
}

/// No API key matches `shown` (a key's prefix or an id: never a whole key).
fn no_key_matches(shown: &str) -> StoreError {
    StoreError::NotFound(format!("no key matches {shown:?}"))
}

/// Projects and keys, wherever they live. Methods take `&mut self` because a store is a
/// connection: one per thread (admin command, watcher), never shared.
pub(crate) trait Store: UserStore + Send {
    /// A new project with one secret key, one public key and a token secret (sealed
    /// with `master`), returned with those three in clear (shown once, never stored in
    /// clear).
    fn create_project(
        &mut self,
        new: NewProject<'_>,
        master: &MasterKey,
    ) -> Result<CreatedProject, StoreError> {
        let minted = MintedProject::new(new, master)?;
        let pusher_app_id = self.insert_project(&minted)?;
        Ok(minted.created(pusher_app_id))
    }

    /// Store a minted project with its keys and token secret, in one change; returns
    /// the Pusher app id it numbered for it.
    fn insert_project(&mut self, minted: &MintedProject) -> Result<u64, StoreError>;

    /// A new token secret for a project; the project's other secrets stop verifying
    /// `grace_s` seconds from now (0: at once). Returns the clear new secret.
    fn rotate_token_secret(
        &mut self,
        project_id: &str,
        master: &MasterKey,
        grace_s: u64,
    ) -> Result<String, StoreError> {
        let (record, secret) = mint_token_secret(project_id, master)?;
        self.add_token_secret(&record, grace_s)?;
        Ok(secret)
    }

    /// Store a new token secret of its project (NotFound when there is no such
    /// project); the project's other secrets stop verifying `grace_s` seconds from now.
    fn add_token_secret(
        &mut self,
        record: &TokenSecretRecord,
        grace_s: u64,
    ) -> Result<(), StoreError>;

    /// Register a public key (already checked by `auth::token::parse_public_key`, its
    /// record made by [`TokenKeyRecord::new`]). NotFound when there is no such project.
    fn add_token_key(&mut self, record: &TokenKeyRecord) -> Result<(), StoreError>;

    /// Remove a registered key of that project (NotFound when it has no such key).
    fn remove_token_key(&mut self, project_id: &str, key_id: &str) -> Result<(), StoreError>;

    /// All projects, oldest first.
    fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError>;

    /// Apply one change to a project's settings (`project set-*`); returns the updated
    /// project. NotFound when no project has that id.
    fn set_project(
        &mut self,
        project_id: &str,
        change: &ProjectChange,
    ) -> Result<ProjectRecord, StoreError>;

    /// A new key for an existing project; returns its record and the full key.
    fn create_key(
        &mut self,
        project_id: &str,
        kind: KeyKind,
    ) -> Result<(KeyRecord, String), StoreError> {
        let (record, key) = KeyRecord::mint(project_id, kind);
        self.insert_key(&record)?;
        Ok((record, key))
    }

    /// Store a new key of its project (NotFound when there is no such project).
    fn insert_key(&mut self, record: &KeyRecord) -> Result<(), StoreError>;

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

/// The users half of a store (issue 25): `require_user`, blocks and end records. Each
/// store implements it in its own `users` module.
pub(crate) trait UserStore {
    /// Whether the project needs a connection token on every WebSocket.
    fn requires_user(&mut self, project_id: &str) -> Result<bool, StoreError>;

    /// Block a user (replacing a block already there). The project's expired blocks
    /// are dropped first; then `TooManyBlocks` when the project already has `max`
    /// others. NotFound when no project has that id.
    fn block_user(&mut self, block: &UserBlockRecord, max: usize) -> Result<(), StoreError>;

    /// Lift a block; `Ok(false)` when there was none in force.
    fn unblock_user(&mut self, project_id: &str, user_id: &str) -> Result<bool, StoreError>;

    /// The user's block if one holds now.
    fn user_block(
        &mut self,
        project_id: &str,
        user_id: &str,
    ) -> Result<Option<UserBlockRecord>, StoreError>;

    /// Store an end record (its `seq` is given here) for every node to apply; keeps at
    /// most [`crate::project::users::MAX_STORED_ENDS`]. Does not move the change token:
    /// ends are read by [`Store::user_ends_after`], not by a snapshot rebuild.
    fn add_user_end(&mut self, end: &UserEndRecord) -> Result<(), StoreError>;

    /// End records written after `after`, oldest first, at most
    /// [`crate::project::users::ENDS_PER_READ`], and the cursor to pass next. `None`:
    /// no records, only the current cursor (where a starting watcher begins).
    fn user_ends_after(
        &mut self,
        after: Option<u64>,
    ) -> Result<(Vec<UserEndRecord>, u64), StoreError>;
}

/// Open the store the command line points at: SQLite in `data_dir`, or Redis at `redis`
/// in cluster mode (the data directory is then not used for keys).
pub(crate) fn open_store(
    data_dir: &Path,
    redis: Option<&str>,
    redis_ca_file: Option<&Path>,
) -> Result<Box<dyn Store>, StoreError> {
    match redis {
        Some(url) => Ok(Box::new(RedisStore::open(url, redis_ca_file)?)),
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
        let err = open_store(dir.path(), Some("not a url"), None)
            .err()
            .unwrap();
        assert!(
            matches!(err, StoreError::Link(crate::redis_link::LinkError::Url(_))),
            "{err}"
        );
        // Nothing listens on port 1: the store cannot open, and says it is Redis.
        let err = open_store(dir.path(), Some("redis://127.0.0.1:1"), None)
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::Redis(_)), "{err}");
    }

    #[test]
    fn an_unreadable_redis_ca_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("no-such-ca.pem");
        let err = open_store(dir.path(), Some("rediss://127.0.0.1:1"), Some(&ca))
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                StoreError::Link(crate::redis_link::LinkError::CaFile { .. })
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.starts_with("cannot read the Redis CA file "), "{text}");
        assert!(text.contains("no-such-ca.pem"), "{text}");
    }
}
