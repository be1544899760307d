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

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::{
    mint_token_secret, rotated_expiry, validate_project_name, HookKinds, KeyRecord, ProjectRecord,
    Store, StoreContents, StoreError, TokenKeyAlg, TokenKeyRecord, TokenSecretRecord, WebhookSpec,
    FIRST_PUSHER_APP_ID,
};
use crate::apikey::{generate_id, hash_key, key_prefix, KeyHash, KeyKind};
use crate::history::HistorySpec;
use crate::quota::RateLimit;
use crate::sealed::MasterKey;

/// File name of the database inside the data directory.
pub(super) const DB_FILE: &str = "ringcast.db";

/// How long a writer waits for another process's write lock before giving up. Admin
/// writes are tiny, so a few seconds only expires when something is truly stuck.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema version this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 7;

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

fn read_token_secrets(conn: &Connection) -> Result<Vec<TokenSecretRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, project_id, sealed, expires_at FROM token_secrets ORDER BY created_at, rowid",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(TokenSecretRecord {
            id: r.get(0)?,
            project_id: r.get(1)?,
            sealed: r.get(2)?,
            expires_at: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn read_token_keys(conn: &Connection) -> Result<Vec<TokenKeyRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, project_id, alg, public_pem FROM token_keys ORDER BY created_at, rowid",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok::<(String, String, String, String), _>((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })?;
    rows.map(|row| {
        let (id, project_id, alg, public_pem) = row?;
        let alg = TokenKeyAlg::parse(&alg)
            .ok_or_else(|| StoreError::Corrupt(format!("token key {id}: unknown alg {alg:?}")))?;
        Ok(TokenKeyRecord {
            id,
            project_id,
            alg,
            public_pem,
        })
    })
    .collect()
}

fn project_not_found(id: &str) -> StoreError {
    StoreError::NotFound(format!("no project with id {id:?}"))
}

fn insert_key(
    tx: &Transaction<'_>,
    project_id: &str,
    kind: KeyKind,
) -> Result<(KeyRecord, String), StoreError> {
    let (record, key) = KeyRecord::mint(project_id, kind);
    tx.execute(
        "INSERT INTO keys (id, project_id, kind, hash, prefix, created_at, public_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            record.id,
            record.project_id,
            kind.as_str(),
            &record.hash.0[..],
            record.prefix,
            unix_now(),
            record.public_key,
        ],
    )?;
    Ok((record, key))
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

const SELECT_PROJECTS: &str = "SELECT id, name, rate_limit, history, max_connections, client_events, webhook_url, webhook_events, pusher_app_id, pusher_enabled FROM projects";
const SELECT_KEYS: &str =
    "SELECT id, project_id, kind, revoked_at IS NOT NULL, prefix, hash, public_key FROM keys";

fn read_projects(
    conn: &Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<ProjectRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!("{SELECT_PROJECTS} {filter}"))?;
    let rows = stmt.query_map(args, |r| {
        Ok::<RawProject, _>((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
        ))
    })?;
    rows.map(|row| {
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
        ) = row?;
        let rate_limit = RateLimit::parse(&rate_limit)
            .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?;
        let history = HistorySpec::parse(&history)
            .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?;
        let max_connections = max_connections
            .map(u64::try_from)
            .transpose()
            .map_err(|_| StoreError::Corrupt(format!("project {id}: negative max_connections")))?;
        let webhook = match (url, events) {
            (Some(url), Some(events)) => Some(WebhookSpec {
                url,
                events: HookKinds::parse(&events)
                    .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?,
            }),
            _ => None,
        };
        // NULL only after a raw edit: the migration numbers every row and creation
        // always assigns one.
        let pusher_app_id = app_id
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("project {id}: no pusher_app_id")))?;
        Ok(ProjectRecord {
            id,
            name,
            rate_limit,
            history,
            max_connections,
            client_events,
            webhook,
            pusher_app_id,
            pusher,
        })
    })
    .collect()
}

fn read_keys(
    conn: &Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<KeyRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!("{SELECT_KEYS} {filter}"))?;
    let rows = stmt.query_map(args, |r| {
        Ok::<RawKey, _>((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ))
    })?;
    rows.map(|row| {
        let (id, project_id, kind, revoked, prefix, hash, public_key) = row?;
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
    })
    .collect()
}

impl Store for SqliteStore {
    fn create_project(
        &mut self,
        name: &str,
        rate_limit: RateLimit,
        history: HistorySpec,
        master: &MasterKey,
    ) -> Result<(ProjectRecord, String, String, String), StoreError> {
        validate_project_name(name)?;
        let mut project = ProjectRecord {
            id: generate_id("prj_"),
            name: name.to_string(),
            rate_limit,
            history,
            max_connections: None,
            client_events: false,
            webhook: None,
            pusher_app_id: FIRST_PUSHER_APP_ID,
            pusher: true,
        };
        let (token_record, token_secret) = mint_token_secret(&project.id, master)?;
        self.write(|tx| {
            // Under the write lock: no other process can take the same number.
            let app_id: i64 = tx.query_row(
                "SELECT COALESCE(MAX(pusher_app_id) + 1, ?1) FROM projects",
                [FIRST_PUSHER_APP_ID as i64],
                |r| r.get(0),
            )?;
            project.pusher_app_id = u64::try_from(app_id)
                .map_err(|_| StoreError::Corrupt(format!("negative pusher_app_id {app_id}")))?;
            tx.execute(
                "INSERT INTO projects (id, name, rate_limit, history, created_at, pusher_app_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    project.id,
                    project.name,
                    rate_limit.to_string(),
                    history.to_string(),
                    unix_now(),
                    app_id,
                ],
            )?;
            let (_, secret) = insert_key(tx, &project.id, KeyKind::Secret)?;
            let (_, public) = insert_key(tx, &project.id, KeyKind::Public)?;
            insert_token_secret(tx, &token_record)?;
            Ok((project, secret, public, token_secret))
        })
    }

    fn rotate_token_secret(
        &mut self,
        project_id: &str,
        master: &MasterKey,
        grace_s: u64,
    ) -> Result<String, StoreError> {
        let (record, secret) = mint_token_secret(project_id, master)?;
        self.write(|tx| {
            if !project_exists(tx, project_id)? {
                return Err(project_not_found(project_id));
            }
            let now = unix_now();
            let mut stmt = tx
                .prepare_cached("SELECT id, expires_at FROM token_secrets WHERE project_id = ?1")?;
            let old = stmt
                .query_map([project_id], |r| {
                    Ok::<(String, Option<i64>), _>((r.get(0)?, r.get(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            for (id, expires_at) in old {
                tx.execute(
                    "UPDATE token_secrets SET expires_at = ?1 WHERE id = ?2",
                    params![rotated_expiry(expires_at, now, grace_s), id],
                )?;
            }
            insert_token_secret(tx, &record)?;
            Ok(secret)
        })
    }

    fn add_token_key(
        &mut self,
        project_id: &str,
        alg: TokenKeyAlg,
        public_pem: &str,
    ) -> Result<TokenKeyRecord, StoreError> {
        self.write(|tx| {
            if !project_exists(tx, project_id)? {
                return Err(project_not_found(project_id));
            }
            let record = TokenKeyRecord {
                id: generate_id("tk_"),
                project_id: project_id.to_string(),
                alg,
                public_pem: public_pem.to_string(),
            };
            tx.execute(
                "INSERT INTO token_keys (id, project_id, alg, public_pem, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    record.id,
                    record.project_id,
                    alg.as_str(),
                    record.public_pem,
                    unix_now()
                ],
            )?;
            Ok(record)
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
                return Err(StoreError::NotFound(format!(
                    "project {project_id:?} has no token key {key_id:?}"
                )));
            }
            Ok(())
        })
    }

    fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError> {
        read_projects(&self.conn, "ORDER BY created_at, rowid", [])
    }

    fn set_rate_limit(
        &mut self,
        project_id: &str,
        rate_limit: RateLimit,
    ) -> Result<ProjectRecord, StoreError> {
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET rate_limit = ?1 WHERE id = ?2",
                params![rate_limit.to_string(), project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn set_history(
        &mut self,
        project_id: &str,
        history: HistorySpec,
    ) -> Result<ProjectRecord, StoreError> {
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET history = ?1 WHERE id = ?2",
                params![history.to_string(), project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn set_client_events(
        &mut self,
        project_id: &str,
        on: bool,
    ) -> Result<ProjectRecord, StoreError> {
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET client_events = ?1 WHERE id = ?2",
                params![on, project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn set_pusher(&mut self, project_id: &str, on: bool) -> Result<ProjectRecord, StoreError> {
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET pusher_enabled = ?1 WHERE id = ?2",
                params![on, project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn set_webhook(
        &mut self,
        project_id: &str,
        webhook: Option<WebhookSpec>,
    ) -> Result<ProjectRecord, StoreError> {
        let (url, events) = match &webhook {
            Some(w) => (Some(w.url.as_str()), Some(w.events.to_string())),
            None => (None, None),
        };
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET webhook_url = ?1, webhook_events = ?2 WHERE id = ?3",
                params![url, events, project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn set_max_connections(
        &mut self,
        project_id: &str,
        max_connections: Option<u64>,
    ) -> Result<ProjectRecord, StoreError> {
        let value = max_connections
            .map(i64::try_from)
            .transpose()
            .map_err(|_| StoreError::Invalid("max_connections is too large".into()))?;
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE projects SET max_connections = ?1 WHERE id = ?2",
                params![value, project_id],
            )?;
            if changed == 0 {
                return Err(project_not_found(project_id));
            }
            read_projects(tx, "WHERE id = ?1", [project_id])?
                .pop()
                .ok_or_else(|| project_not_found(project_id))
        })
    }

    fn create_key(
        &mut self,
        project_id: &str,
        kind: KeyKind,
    ) -> Result<(KeyRecord, String), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, project_id)? {
                return Err(project_not_found(project_id));
            }
            insert_key(tx, project_id, kind)
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
            let id = id.ok_or_else(|| StoreError::NotFound(format!("no key matches {shown:?}")))?;
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
        let keys = read_keys(
            &tx,
            "WHERE project_id = ?1 ORDER BY created_at, rowid",
            [project_id],
        )?;
        tx.commit()?;
        Ok(keys)
    }

    fn load_all(&mut self) -> Result<StoreContents, StoreError> {
        // A deferred transaction is one WAL snapshot: projects and keys from the same
        // commit, never a key whose project is missing from this read.
        let tx = self.conn.transaction()?;
        let projects = read_projects(&tx, "ORDER BY created_at, rowid", [])?;
        let keys = read_keys(&tx, "ORDER BY created_at, rowid", [])?;
        let token_secrets = read_token_secrets(&tx)?;
        let token_keys = read_token_keys(&tx)?;
        tx.commit()?;
        Ok(StoreContents {
            projects,
            keys,
            token_secrets,
            token_keys,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rl(s: &str) -> RateLimit {
        RateLimit::parse(s).unwrap()
    }

    #[test]
    fn projects_and_keys_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        assert!(store.is_empty().unwrap());
        store.change_token().unwrap();

        let (project, secret, public, _) = store
            .create_project("orders", rl("50/s"), HistorySpec::OFF, &MasterKey::random())
            .unwrap();
        assert!(project.id.starts_with("prj_"));
        assert_eq!(project.name, "orders");
        assert_eq!(project.rate_limit, rl("50/s"));
        assert_eq!(KeyKind::of_key(&secret), Some(KeyKind::Secret));
        assert_eq!(KeyKind::of_key(&public), Some(KeyKind::Public));
        assert!(!store.is_empty().unwrap());
        assert_eq!(project.pusher_app_id, 1_000_000);
        assert!(project.pusher, "on by default");

        assert_eq!(store.list_projects().unwrap(), vec![project.clone()]);

        let updated = store.set_rate_limit(&project.id, rl("6000/min")).unwrap();
        assert_eq!(updated.rate_limit, rl("6000/min"));
        assert_eq!(store.list_projects().unwrap()[0].rate_limit, rl("6000/min"));

        let (extra, extra_key) = store.create_key(&project.id, KeyKind::Public).unwrap();
        assert!(extra.id.starts_with("key_"));
        assert_eq!(extra.hash, hash_key(&extra_key));
        assert_eq!(extra.prefix, key_prefix(&extra_key));

        let keys = store.list_keys(&project.id).unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[0].kind, KeyKind::Secret);
        assert_eq!(keys[0].hash, hash_key(&secret));
        assert_eq!(keys[1].hash, hash_key(&public));
        assert_eq!(keys[0].public_key, None, "a secret key is never kept whole");
        assert_eq!(keys[1].public_key.as_deref(), Some(public.as_str()));
        assert_eq!(extra.public_key.as_deref(), Some(extra_key.as_str()));
        assert_eq!(keys[2], extra);
        assert!(keys.iter().all(|k| !k.revoked));

        // Revoke by full key, then by id; again is fine.
        assert_eq!(store.revoke_key(&secret).unwrap(), keys[0].id);
        assert_eq!(store.revoke_key(&extra.id).unwrap(), extra.id);
        assert_eq!(store.revoke_key(&extra.id).unwrap(), extra.id);
        let keys = store.list_keys(&project.id).unwrap();
        assert_eq!(
            keys.iter().map(|k| k.revoked).collect::<Vec<_>>(),
            [true, false, true]
        );

        let all = store.load_all().unwrap();
        assert_eq!(all.projects, vec![updated]);
        assert_eq!(all.keys, keys);

        // Reopening sees the same data (and does not re-run the migration).
        drop(store);
        let mut again = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(again.load_all().unwrap().keys, keys);
    }

    #[test]
    fn the_database_never_holds_a_full_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let (_, secret, public, token) = store
            .create_project("p", rl("1/s"), HistorySpec::OFF, &MasterKey::random())
            .unwrap();
        drop(store);
        let mut bytes = Vec::new();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
        }
        for key in [secret, token] {
            let needle = &key.as_bytes()[3..];
            assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        }
        // A public key is public (every web page carries one): kept whole, for the
        // webhook's X-Pusher-Key.
        let needle = &public.as_bytes()[3..];
        assert!(bytes.windows(needle.len()).any(|w| w == needle));
    }

    #[test]
    fn token_secrets_rotate_with_a_grace_and_keys_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let master = MasterKey::random();
        let (project, _, _, first) = store
            .create_project("p", rl("1/s"), HistorySpec::OFF, &master)
            .unwrap();
        let all = store.load_all().unwrap();
        assert_eq!(all.token_secrets.len(), 1);
        let opened = master
            .open(&project.id, &all.token_secrets[0].sealed)
            .unwrap();
        assert_eq!(opened, first.as_bytes());
        assert_eq!(all.token_secrets[0].expires_at, None);

        let before = unix_now();
        let second = store.rotate_token_secret(&project.id, &master, 60).unwrap();
        assert_ne!(first, second);
        let all = store.load_all().unwrap();
        assert_eq!(all.token_secrets.len(), 2);
        let old_until = all.token_secrets[0].expires_at.unwrap();
        assert!(old_until >= before + 60 && old_until <= unix_now() + 60);
        assert_eq!(all.token_secrets[1].expires_at, None);
        // A later rotation with a longer grace never extends an earlier deadline.
        store
            .rotate_token_secret(&project.id, &master, 3600)
            .unwrap();
        let all = store.load_all().unwrap();
        assert_eq!(all.token_secrets[0].expires_at, Some(old_until));
        assert!(all.token_secrets[1].expires_at.unwrap() > old_until);

        let key = store
            .add_token_key(
                &project.id,
                TokenKeyAlg::EdDsa,
                "-----BEGIN PUBLIC KEY-----",
            )
            .unwrap();
        assert!(key.id.starts_with("tk_"));
        assert_eq!(store.load_all().unwrap().token_keys, vec![key.clone()]);
        let nf = |r: Result<(), StoreError>| matches!(r, Err(StoreError::NotFound(_)));
        assert!(nf(store.remove_token_key("prj_nope", &key.id)));
        store.remove_token_key(&project.id, &key.id).unwrap();
        assert!(nf(store.remove_token_key(&project.id, &key.id)));
        assert!(store.load_all().unwrap().token_keys.is_empty());
        assert!(matches!(
            store.rotate_token_secret("prj_nope", &master, 0),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn unknown_ids_are_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let nf = |r: Result<_, StoreError>| matches!(r, Err(StoreError::NotFound(_)));
        assert!(nf(store.set_rate_limit("prj_nope", rl("1/s")).map(|_| ())));
        assert!(nf(store.set_pusher("prj_nope", false).map(|_| ())));
        assert!(nf(store
            .create_key("prj_nope", KeyKind::Secret)
            .map(|_| ())));
        assert!(nf(store.list_keys("prj_nope").map(|_| ())));
        assert!(nf(store.revoke_key("key_nope").map(|_| ())));
        assert!(nf(store
            .revoke_key(&crate::apikey::generate_key(KeyKind::Secret))
            .map(|_| ())));
        assert!(nf(store.revoke_key("").map(|_| ())));
        let err = store
            .revoke_key(&crate::apikey::generate_key(KeyKind::Public))
            .unwrap_err();
        assert!(err.to_string().contains('…'), "full key echoed: {err}");
    }

    #[test]
    fn invalid_names_are_refused_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let before = store.change_token().unwrap();
        assert!(matches!(
            store.create_project("", rl("1/s"), HistorySpec::OFF, &MasterKey::random()),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(store.change_token().unwrap(), before);
        assert!(store.is_empty().unwrap());
    }

    #[test]
    fn change_token_sees_other_connections_and_own_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mut watcher = SqliteStore::open(dir.path()).unwrap();
        let mut admin = SqliteStore::open(dir.path()).unwrap();
        let t0 = watcher.change_token().unwrap();
        assert_eq!(watcher.change_token().unwrap(), t0, "stable without writes");

        let (project, _, _, _) = admin
            .create_project("p", rl("1/s"), HistorySpec::OFF, &MasterKey::random())
            .unwrap();
        let t1 = watcher.change_token().unwrap();
        assert_ne!(t1, t0);

        admin.set_rate_limit(&project.id, rl("2/s")).unwrap();
        let t2 = watcher.change_token().unwrap();
        assert_ne!(t2, t1);

        // A commit by the watching connection itself.
        watcher.create_key(&project.id, KeyKind::Public).unwrap();
        let t3 = watcher.change_token().unwrap();
        assert_ne!(t3, t2);

        // A raw write by a tool that knows nothing of the counter.
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.execute("UPDATE projects SET name = 'renamed'", [])
            .unwrap();
        assert_ne!(watcher.change_token().unwrap(), t3);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(SqliteStore::open(dir.path()).unwrap());
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(raw);
        assert!(matches!(
            SqliteStore::open(dir.path()),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }

    /// A database left at any older schema opens, migrates to the current one and keeps
    /// its projects; every later column works on it.
    #[test]
    fn every_older_schema_migrates() {
        for version in 1..SCHEMA_VERSION {
            let dir = tempfile::tempdir().unwrap();
            let mut raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
            let tx = raw.transaction().unwrap();
            for step in &MIGRATIONS[..version as usize] {
                tx.execute_batch(step).unwrap();
            }
            // Inserted newest-stamped first: app ids follow insertion (rowid) order.
            tx.execute(
                "INSERT INTO projects (id, name, rate_limit, created_at) VALUES ('prj_old', 'old', '5/s', 1), ('prj_older', 'older', '5/s', 0)",
                [],
            )
            .unwrap();
            tx.pragma_update(None, "user_version", version).unwrap();
            tx.commit().unwrap();
            drop(raw);

            let mut store = SqliteStore::open(dir.path()).unwrap();
            let projects = store.list_projects().unwrap();
            assert_eq!(projects.len(), 2, "schema {version}");
            assert_eq!(projects[1].name, "old");
            assert_eq!(
                (projects[1].pusher_app_id, projects[0].pusher_app_id),
                (1_000_000, 1_000_001),
                "schema {version}"
            );
            assert!(projects.iter().all(|p| p.pusher), "schema {version}");
            let old = &projects[1];
            assert_eq!(old.max_connections, None, "schema {version}");
            let project = store.set_max_connections("prj_old", Some(7)).unwrap();
            assert_eq!(project.max_connections, Some(7), "schema {version}");
            assert!(!old.client_events, "schema {version}: off by default");
            let project = store.set_client_events("prj_old", true).unwrap();
            assert!(project.client_events, "schema {version}");
            assert_eq!(project.max_connections, Some(7), "schema {version}");
            assert_eq!(old.webhook, None, "schema {version}: off by default");
            let hook = WebhookSpec {
                url: "https://example.com/hook".into(),
                events: HookKinds::DEFAULT,
            };
            let project = store.set_webhook("prj_old", Some(hook.clone())).unwrap();
            assert_eq!(project.webhook, Some(hook), "schema {version}");
            assert!(project.client_events, "schema {version}");
            let project = store.set_webhook("prj_old", None).unwrap();
            assert_eq!(project.webhook, None, "schema {version}");
            let project = store.set_pusher("prj_old", false).unwrap();
            assert!(!project.pusher, "schema {version}");
            assert_eq!(project.pusher_app_id, 1_000_000, "schema {version}");
            store
                .rotate_token_secret("prj_old", &MasterKey::random(), 0)
                .unwrap();
            let (new, ..) = store
                .create_project("new", rl("1/s"), HistorySpec::OFF, &MasterKey::random())
                .unwrap();
            assert_eq!(new.pusher_app_id, 1_000_002, "schema {version}");
            assert!(new.pusher, "schema {version}");
            let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
            let now: i64 = raw
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .unwrap();
            assert_eq!(now, SCHEMA_VERSION, "schema {version}");
        }
    }

    #[test]
    fn concurrent_opens_of_a_fresh_directory_agree() {
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let path = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    let mut store = SqliteStore::open(&path).unwrap();
                    store
                        .create_project(
                            &format!("p{i}"),
                            rl("1/s"),
                            HistorySpec::OFF,
                            &MasterKey::random(),
                        )
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let projects = store.list_projects().unwrap();
        assert_eq!(projects.len(), 4);
        assert_eq!(store.load_all().unwrap().keys.len(), 8);
        // Four writers at once still got four different, consecutive app ids.
        let mut ids: Vec<u64> = projects.iter().map(|p| p.pusher_app_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, [1_000_000, 1_000_001, 1_000_002, 1_000_003]);
    }
}
