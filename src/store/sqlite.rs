//! [`SqliteStore`]: projects and keys in `<data-dir>/ringcast.db`.
//!
//! Several processes use the same file at once (a running server's watcher, admin
//! commands), so:
//! - WAL mode lets the watcher read while an admin command writes; `busy_timeout` makes
//!   a writer wait for another writer instead of failing at once.
//! - Every write runs in a `BEGIN IMMEDIATE` transaction (the write lock is taken up
//!   front, so two writers never deadlock upgrading read locks) and bumps the
//!   `change_counter` row in the same transaction.
//! - [`Store::change_token`] combines `PRAGMA data_version` (changes when *another*
//!   connection committed, even a tool that does not know about the counter) with the
//!   counter (changes on this connection's own commits too).
//! - The schema version lives in `PRAGMA user_version`; migrations run inside an
//!   immediate transaction so two processes opening a fresh directory at once do not
//!   both create the schema.
//!
//! Never stores a full key: only its SHA-256 and display prefix. Token secrets only
//! sealed (`token_secrets.sealed`), token keys only as public keys.
//!
//! Pusher app ids: `projects.pusher_app_id` (unique index) is the largest one so far
//! plus one, taken inside the creating write transaction, so two processes creating at
//! once cannot pick the same number. Projects are never deleted, so the largest is also
//! the high-water mark and no id is ever handed out twice; if deletion comes, the mark
//! must move to `meta`.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::{
    no_key_matches, no_token_key, project_not_found, rotated_expiry, MintedProject, Store,
    StoreContents, StoreError,
};
use crate::apikey::{hash_key, key_prefix, KeyHash, KeyKind};
use crate::history::HistorySpec;
use crate::project::{
    HookKinds, KeyRecord, ProjectChange, ProjectRecord, TokenKeyAlg, TokenKeyRecord,
    TokenSecretRecord, WebhookSpec, FIRST_PUSHER_APP_ID,
};

mod users;
use crate::quota::RateLimit;

/// File name of the database inside the data directory.
pub(super) const DB_FILE: &str = "ringcast.db";

/// How long a writer waits for another process's write lock before giving up. Admin
/// writes are tiny, so a few seconds only expires when something is truly stuck.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema version this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 8;

/// Migrations, index i brings the schema from version i to i + 1.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: projects, keys, and the change counter the watcher polls.
    "CREATE TABLE projects (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        rate_limit  TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE keys (
        id          TEXT PRIMARY KEY,
        project_id  TEXT NOT NULL REFERENCES projects(id),
        kind        TEXT NOT NULL CHECK (kind IN ('secret', 'public')),
        hash        BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
        prefix      TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        revoked_at  INTEGER
    );
    CREATE INDEX keys_by_project ON keys(project_id);
    CREATE TABLE meta (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );
    INSERT INTO meta (name, value) VALUES ('change_counter', 0);",
    // 1 -> 2: channel history per project ("off" or "SIZE/TTLs").
    "ALTER TABLE projects ADD COLUMN history TEXT NOT NULL DEFAULT 'off';",
    // 2 -> 3: private channels: sealed token secrets and registered public keys.
    "CREATE TABLE token_secrets (
        id          TEXT PRIMARY KEY,
        project_id  TEXT NOT NULL REFERENCES projects(id),
        sealed      BLOB NOT NULL,
        created_at  INTEGER NOT NULL,
        expires_at  INTEGER
    );
    CREATE INDEX token_secrets_by_project ON token_secrets(project_id);
    CREATE TABLE token_keys (
        id          TEXT PRIMARY KEY,
        project_id  TEXT NOT NULL REFERENCES projects(id),
        alg         TEXT NOT NULL CHECK (alg IN ('ES256', 'EdDSA')),
        public_pem  TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE INDEX token_keys_by_project ON token_keys(project_id);",
    // 3 -> 4: a project's own WebSocket connection limit (NULL: the node's default).
    "ALTER TABLE projects ADD COLUMN max_connections INTEGER;",
    // 4 -> 5: client events allowed on the project's private/presence channels (0: off).
    "ALTER TABLE projects ADD COLUMN client_events INTEGER NOT NULL DEFAULT 0;",
    // 5 -> 6: webhooks (URL and event list; NULL: off), and public keys kept whole (the
    // webhook's X-Pusher-Key; older public keys stay hash-only, NULL here).
    "ALTER TABLE projects ADD COLUMN webhook_url TEXT;
    ALTER TABLE projects ADD COLUMN webhook_events TEXT;
    ALTER TABLE keys ADD COLUMN public_key TEXT;",
    // 6 -> 7: every project is also a Pusher app: a numeric app id (existing projects
    // numbered from 1000000 in creation order) and the Pusher switch (on by default).
    // Pure SQL, so it runs in the migration's immediate transaction like the others.
    "ALTER TABLE projects ADD COLUMN pusher_app_id INTEGER;
    ALTER TABLE projects ADD COLUMN pusher_enabled INTEGER NOT NULL DEFAULT 1;
    UPDATE projects SET pusher_app_id = 1000000
        + (SELECT COUNT(*) FROM projects AS p WHERE p.rowid < projects.rowid);
    CREATE UNIQUE INDEX projects_pusher_app_id ON projects(pusher_app_id);",
    // 7 -> 8: users: `--require-user`, blocks (until NULL: for ever) and end records
    // (see `users`).
    "ALTER TABLE projects ADD COLUMN require_user INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE user_blocks (
        project_id  TEXT NOT NULL REFERENCES projects(id),
        user_id     TEXT NOT NULL,
        until       INTEGER,
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (project_id, user_id)
    );
    CREATE TABLE user_ends (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        project_id  TEXT NOT NULL,
        user_id     TEXT NOT NULL,
        channel     TEXT,
        origin      INTEGER NOT NULL,
        created_at  INTEGER NOT NULL
    );",
];

/// A connection to the SQLite store. One per thread; not shared.
pub(crate) struct SqliteStore {
    conn: Connection,
}

impl SqliteStore {
    /// Open (creating if needed) `data_dir/ringcast.db` and bring its schema up to date.
    pub(crate) fn open(data_dir: &Path) -> Result<SqliteStore, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::Io {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let path = data_dir.join(DB_FILE);
        let mut conn = Connection::open(&path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Returns the mode now in force; a filesystem without shared memory (some network
        // mounts) keeps the rollback journal, which is slower but still correct.
        // Switching a fresh file to WAL needs an exclusive lock, and SQLite does not call
        // the busy handler for it: when several processes (or the CLI and a starting
        // server) open a new directory at once, retry for as long as the busy timeout.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mode: String = loop {
            match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
                Ok(mode) => break mode,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e.into()),
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), %mode, "SQLite WAL mode unavailable");
        }
        conn.pragma_update(None, "foreign_keys", true)?;
        migrate(&mut conn)?;
        Ok(SqliteStore { conn })
    }

    /// Run `f` in an immediate write transaction that also bumps the change counter.
    fn write<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = f(&tx)?;
        tx.execute(
            "UPDATE meta SET value = value + 1 WHERE name = 'change_counter'",
            [],
        )?;
        tx.commit()?;
        Ok(value)
    }
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Read inside the write lock: another process may have migrated meanwhile.
    let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let start = usize::try_from(found)
        .map_err(|_| StoreError::Corrupt(format!("negative schema version {found}")))?;
    for step in &MIGRATIONS[start..] {
        tx.execute_batch(step)?;
    }
    if found != SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(())
}

use super::unix_now;

fn insert_token_secret(tx: &Transaction<'_>, record: &TokenSecretRecord) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO token_secrets (id, project_id, sealed, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            record.id,
            record.project_id,
            record.sealed,
            unix_now(),
            record.expires_at
        ],
    )?;
    Ok(())
}

/// Run `select` then `filter` (a `WHERE` or `ORDER BY` tail) with `args` and make a
/// record of each row, read first into its raw tuple `R` (the columns in the order of
/// the SELECT), so a corrupt value is a [`StoreError::Corrupt`] from `record`, never a
/// panic.
fn read_rows<R, T>(
    conn: &Connection,
    select: &str,
    filter: &str,
    args: impl rusqlite::Params,
    record: impl Fn(R) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError>
where
    R: for<'r> TryFrom<&'r rusqlite::Row<'r>, Error = rusqlite::Error>,
{
    let mut stmt = conn.prepare_cached(&format!("{select} {filter}"))?;
    let rows = stmt.query_map(args, |r| R::try_from(r))?;
    rows.map(|row| record(row?)).collect()
}

fn read_token_secrets(conn: &Connection) -> Result<Vec<TokenSecretRecord>, StoreError> {
    read_rows(
        conn,
        "SELECT id, project_id, sealed, expires_at FROM token_secrets",
        BY_AGE,
        [],
        |(id, project_id, sealed, expires_at): (String, String, Vec<u8>, Option<i64>)| {
            Ok(TokenSecretRecord {
                id,
                project_id,
                sealed,
                expires_at,
            })
        },
    )
}

fn read_token_keys(conn: &Connection) -> Result<Vec<TokenKeyRecord>, StoreError> {
    read_rows(
        conn,
        "SELECT id, project_id, alg, public_pem FROM token_keys",
        BY_AGE,
        [],
        |(id, project_id, alg, public_pem): (String, String, String, String)| {
            let alg = TokenKeyAlg::parse(&alg).ok_or_else(|| {
                StoreError::Corrupt(format!("token key {id}: unknown alg {alg:?}"))
            })?;
            Ok(TokenKeyRecord {
                id,
                project_id,
                alg,
                public_pem,
            })
        },
    )
}

fn insert_key(tx: &Transaction<'_>, record: &KeyRecord) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO keys (id, project_id, kind, hash, prefix, created_at, public_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            record.id,
            record.project_id,
            record.kind.as_str(),
            &record.hash.0[..],
            record.prefix,
            unix_now(),
            record.public_key,
        ],
    )?;
    Ok(())
}

fn project_exists(conn: &Connection, project_id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .query_row("SELECT 1 FROM projects WHERE id = ?1", [project_id], |_| {
            Ok(())
        })
        .optional()?
        .is_some())
}

/// A project row as read, before its rate limit is validated.
type RawProject = (
    String,
    String,
    String,
    String,
    Option<i64>,
    bool,
    Option<String>,
    Option<String>,
    Option<i64>,
    bool,
);
/// A key row as read: id, project_id, kind, revoked, prefix, hash, public key.
type RawKey = (
    String,
    String,
    String,
    bool,
    String,
    Vec<u8>,
    Option<String>,
);

/// The columns a project change sets (`col = ?1, ...`) and their values, in order.
fn project_update(change: &ProjectChange) -> Result<(&'static str, Vec<Value>), StoreError> {
    let flag = |on: bool| Value::Integer(i64::from(on));
    Ok(match change {
        ProjectChange::RateLimit(r) => ("rate_limit = ?1", vec![Value::Text(r.to_string())]),
        ProjectChange::History(h) => ("history = ?1", vec![Value::Text(h.to_string())]),
        ProjectChange::ClientEvents(on) => ("client_events = ?1", vec![flag(*on)]),
        ProjectChange::Pusher(on) => ("pusher_enabled = ?1", vec![flag(*on)]),
        ProjectChange::RequireUser(on) => ("require_user = ?1", vec![flag(*on)]),
        ProjectChange::MaxConnections(n) => {
            let n = n
                .map(i64::try_from)
                .transpose()
                .map_err(|_| StoreError::Invalid("max_connections is too large".into()))?;
            (
                "max_connections = ?1",
                vec![n.map_or(Value::Null, Value::Integer)],
            )
        }
        ProjectChange::Webhook(w) => (
            "webhook_url = ?1, webhook_events = ?2",
            match w {
                Some(w) => vec![
                    Value::Text(w.url.clone()),
                    Value::Text(w.events.to_string()),
                ],
                None => vec![Value::Null, Value::Null],
            },
        ),
    })
}

const SELECT_PROJECTS: &str = "SELECT id, name, rate_limit, history, max_connections, client_events, webhook_url, webhook_events, pusher_app_id, pusher_enabled FROM projects";
/// Oldest first, as created.
const BY_AGE: &str = "ORDER BY created_at, rowid";
const SELECT_KEYS: &str =
    "SELECT id, project_id, kind, revoked_at IS NOT NULL, prefix, hash, public_key FROM keys";

/// A project row of [`SELECT_PROJECTS`] as a record; a value no build writes is
/// [`StoreError::Corrupt`], checked in the order of the columns.
fn project_record(raw: RawProject) -> Result<ProjectRecord, StoreError> {
    let (
        id,
        name,
        rate_limit,
        history,
        max_connections,
        client_events,
        url,
        events,
        app_id,
        pusher,
    ) = raw;
    let corrupt =
        |what: &dyn std::fmt::Display| StoreError::Corrupt(format!("project {id}: {what}"));
    Ok(ProjectRecord {
        rate_limit: RateLimit::parse(&rate_limit).map_err(|e| corrupt(&e))?,
        history: HistorySpec::parse(&history).map_err(|e| corrupt(&e))?,
        max_connections: max_connections
            .map(u64::try_from)
            .transpose()
            .map_err(|_| corrupt(&"negative max_connections"))?,
        webhook: match (url, events) {
            (Some(url), Some(events)) => Some(WebhookSpec {
                url,
                events: HookKinds::parse(&events).map_err(|e| corrupt(&e))?,
            }),
            _ => None,
        },
        // NULL only after a raw edit: the migration numbers every row and creation
        // always assigns one.
        pusher_app_id: app_id
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| corrupt(&"no pusher_app_id"))?,
        id,
        name,
        client_events,
        pusher,
    })
}

/// A key row of [`SELECT_KEYS`] as a record.
fn key_record(raw: RawKey) -> Result<KeyRecord, StoreError> {
    let (id, project_id, kind, revoked, prefix, hash, public_key) = raw;
    let kind = KeyKind::parse(&kind)
        .ok_or_else(|| StoreError::Corrupt(format!("key {id}: unknown kind {kind:?}")))?;
    let hash = <[u8; 32]>::try_from(hash.as_slice())
        .map_err(|_| StoreError::Corrupt(format!("key {id}: hash is not 32 bytes")))?;
    Ok(KeyRecord {
        id,
        project_id,
        kind,
        revoked,
        prefix,
        hash: KeyHash(hash),
        public_key,
    })
}

impl Store for SqliteStore {
    fn insert_project(&mut self, minted: &MintedProject) -> Result<u64, StoreError> {
        let project = minted.project();
        self.write(|tx| {
            // Under the write lock: no other process can take the same number.
            let app_id: i64 = tx.query_row(
                "SELECT COALESCE(MAX(pusher_app_id) + 1, ?1) FROM projects",
                [FIRST_PUSHER_APP_ID as i64],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO projects (id, name, rate_limit, history, created_at, pusher_app_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    project.id,
                    project.name,
                    project.rate_limit.to_string(),
                    project.history.to_string(),
                    unix_now(),
                    app_id,
                ],
            )?;
            for key in &minted.keys {
                insert_key(tx, key)?;
            }
            insert_token_secret(tx, &minted.token_secret)?;
            u64::try_from(app_id)
                .map_err(|_| StoreError::Corrupt(format!("negative pusher_app_id {app_id}")))
        })
    }

    fn add_token_secret(
        &mut self,
        record: &TokenSecretRecord,
        grace_s: u64,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, &record.project_id)? {
                return Err(project_not_found(&record.project_id));
            }
            let now = unix_now();
            let mut stmt = tx
                .prepare_cached("SELECT id, expires_at FROM token_secrets WHERE project_id = ?1")?;
            let old = stmt
                .query_map([&record.project_id], |r| {
                    Ok::<(String, Option<i64>), _>((r.get(0)?, r.get(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            for (id, expires_at) in old {
                tx.execute(
                    "UPDATE token_secrets SET expires_at = ?1 WHERE id = ?2",
                    params![rotated_expiry(expires_at, now, grace_s), id],
                )?;
            }
            insert_token_secret(tx, record)
        })
    }

    fn add_token_key(&mut self, record: &TokenKeyRecord) -> Result<(), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, &record.project_id)? {
                return Err(project_not_found(&record.project_id));
            }
            tx.execute(
                "INSERT INTO token_keys (id, project_id, alg, public_pem, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    record.id,
                    record.project_id,
                    record.alg.as_str(),
                    record.public_pem,
                    unix_now()
                ],
            )?;
            Ok(())
        })
    }

    fn remove_token_key(&mut self, project_id: &str, key_id: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, project_id)? {
                return Err(project_not_found(project_id));
            }
            let removed = tx.execute(
                "DELETE FROM token_keys WHERE id = ?1 AND project_id = ?2",
                params![key_id, project_id],
            )?;
            if removed == 0 {
                return Err(no_token_key(project_id, key_id));
            }
            Ok(())
        })
    }

    fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError> {
        read_rows(&self.conn, SELECT_PROJECTS, BY_AGE, [], project_record)
    }

    fn set_project(
        &mut self,
        project_id: &str,
        change: &ProjectChange,
    ) -> Result<ProjectRecord, StoreError> {
        let (columns, mut values) = project_update(change)?;
        values.push(Value::Text(project_id.to_owned()));
        let sql = format!("UPDATE projects SET {columns} WHERE id = ?{}", values.len());
        self.write(|tx| {
            if tx.execute(&sql, rusqlite::params_from_iter(&values))? == 0 {
                return Err(project_not_found(project_id));
            }
            read_rows(
                tx,
                SELECT_PROJECTS,
                "WHERE id = ?1",
                [project_id],
                project_record,
            )?
            .pop()
            .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn insert_key(&mut self, record: &KeyRecord) -> Result<(), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, &record.project_id)? {
                return Err(project_not_found(&record.project_id));
            }
            insert_key(tx, record)
        })
    }

    fn revoke_key(&mut self, key_or_id: &str) -> Result<String, StoreError> {
        self.write(|tx| {
            // A full key is recognised by its prefix; ids start with `key_`.
            let (id, shown) = if KeyKind::of_key(key_or_id).is_some() {
                let hash = hash_key(key_or_id);
                let id: Option<String> = tx
                    .query_row("SELECT id FROM keys WHERE hash = ?1", [&hash.0[..]], |r| {
                        r.get(0)
                    })
                    .optional()?;
                // Never echo a full (possibly valid) key into logs or terminals.
                (id, key_prefix(key_or_id))
            } else {
                let id: Option<String> = tx
                    .query_row("SELECT id FROM keys WHERE id = ?1", [key_or_id], |r| {
                        r.get(0)
                    })
                    .optional()?;
                (id, key_or_id.to_string())
            };
            let id = id.ok_or_else(|| no_key_matches(&shown))?;
            // COALESCE keeps the first revocation time: revoking twice is a no-op.
            tx.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2",
                params![unix_now(), id],
            )?;
            Ok(id)
        })
    }

    fn list_keys(&mut self, project_id: &str) -> Result<Vec<KeyRecord>, StoreError> {
        // One read transaction so "project exists" and its keys agree.
        let tx = self.conn.transaction()?;
        if !project_exists(&tx, project_id)? {
            return Err(project_not_found(project_id));
        }
        let keys = read_rows(
            &tx,
            SELECT_KEYS,
            "WHERE project_id = ?1 ORDER BY created_at, rowid",
            [project_id],
            key_record,
        )?;
        tx.commit()?;
        Ok(keys)
    }

    fn load_all(&mut self) -> Result<StoreContents, StoreError> {
        // A deferred transaction is one WAL snapshot: projects and keys from the same
        // commit, never a key whose project is missing from this read.
        let tx = self.conn.transaction()?;
        let projects = read_rows(&tx, SELECT_PROJECTS, BY_AGE, [], project_record)?;
        let keys = read_rows(&tx, SELECT_KEYS, BY_AGE, [], key_record)?;
        let token_secrets = read_token_secrets(&tx)?;
        let token_keys = read_token_keys(&tx)?;
        let (require_user, user_blocks) = users::read_all(&tx)?;
        tx.commit()?;
        Ok(StoreContents {
            projects,
            keys,
            token_secrets,
            token_keys,
            require_user,
            user_blocks,
        })
    }

    fn change_token(&mut self) -> Result<u64, StoreError> {
        let data_version: i64 = self
            .conn
            .pragma_query_value(None, "data_version", |r| r.get(0))?;
        let counter: i64 = self.conn.query_row(
            "SELECT value FROM meta WHERE name = 'change_counter'",
            [],
            |r| r.get(0),
        )?;
        // Both only grow; data_version in the high half, counter in the low half, so a
        // change of either changes the token.
        Ok(((data_version as u64) << 32) ^ (counter as u64))
    }

    fn is_empty(&mut self) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT NOT EXISTS (SELECT 1 FROM projects)", [], |r| {
                r.get(0)
            })?)
    }
}

/// A store in a fresh directory with one project (`p`, 10/s, no history): the opening of
/// every unit test that needs a project to act on (stores, watcher, admin commands).
#[cfg(test)]
pub(crate) fn test_store_with_project() -> (tempfile::TempDir, SqliteStore, ProjectRecord) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = SqliteStore::open(dir.path()).expect("open store");
    let new = crate::project::NewProject {
        name: "p",
        rate_limit: RateLimit::parse("10/s").expect("rate"),
        history: HistorySpec::OFF,
    };
    let made = store
        .create_project(new, &crate::sealed::MasterKey::random())
        .expect("create project");
    (dir, store, made.project)
}

#[cfg(test)]
mod tests;
