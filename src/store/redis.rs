//! [`RedisStore`]: projects and keys in Redis, for cluster mode (`--redis URL`).
//!
//! Every node's watcher and every admin command talk to the same Redis, so a key created
//! or revoked anywhere is seen by every node at its next poll of [`Store::change_token`]
//! (250 ms by default): the token is one `GET` of an integer, cheap enough to poll, which
//! makes a separate pub/sub invalidation channel unnecessary.
//!
//! Layout (all under the [`PREFIX`] namespace), chosen so that no write is a
//! read-modify-write of a shared value:
//! - `projects` hash: id → JSON `{name, seq}` (immutable once written);
//! - `rate_limits` hash: project id → `"100/s"` (a mutable project field);
//! - `histories` hash: project id → `"100/120s"` or `"off"` (mutable; absent = off);
//! - `max_connections` hash: project id → its own WebSocket connection limit (absent:
//!   the node's `max_ws_connections_per_project`);
//! - `client_events` set: ids of the projects that allow client events (absent: off);
//! - `webhooks` hash: project id → JSON `{url, events}` (`events` as printed, e.g.
//!   `"channel_occupied,client_event"`; absent: no webhook);
//! - `pusher_app_ids` hash: project id → its Pusher app id (immutable once written:
//!   only `HSETNX` after creation);
//! - `pusher_app_seq`: the last Pusher app id handed out (`SETNX` to 999999 before each
//!   `INCR`, so the first is 1000000; only ever incremented, so never reused);
//! - `pusher_off` set: ids of the projects with the Pusher protocol off (absent: on);
//! - `keys` hash: key id → JSON `{project_id, kind, prefix, hash, seq[, public_key]}`
//!   (immutable; `public_key`, the whole key, for public keys made since webhooks);
//! - `key_hashes` hash: hex SHA-256 → key id (revocation by full key);
//! - `revoked` set: revoked key ids (revocation is a set insert: idempotent, permanent);
//! - `token_secrets` hash: id → JSON `{project_id, sealed (base64), expires_at, seq}`,
//!   sealed under the master key (never in clear);
//! - `token_keys` hash: id → JSON `{project_id, alg, public_pem, seq}` (public halves only);
//! - `version`: INCR'd in the same MULTI/EXEC as every change (the change token);
//! - `seq`: a counter that orders projects and keys "oldest first";
//! - users (`require_user`, `user_blocks:<project id>`, `user_ends`): see [`users`].
//!
//! Invariants: of secret keys only hashes and display prefixes are stored; every change and its
//! `version` bump commit atomically (MULTI/EXEC); [`Store::load_all`] is one MULTI/EXEC,
//! so it is one consistent view. A failed call drops the connection; the next call
//! reconnects (with [`IO_TIMEOUT`] bounding every wait), so a watcher polling a dead
//! Redis fails fast and recovers by itself.
//!
//! Every project read has a Pusher app id. Projects made before app ids existed (or by
//! an older ringcast sharing the Redis) get one when a store opens (any CLI command,
//! `serve`), and a read that still finds one without (an older CLI created it since)
//! numbers it before answering, so no node ever sees a project without one. Numbering
//! is `INCR` then `HSETNX`: two processes racing on the same project only skip a
//! number, and each write bumps `version` so every node reloads.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;

use super::{
    no_key_matches, no_token_key, project_not_found, rotated_expiry, unix_now, MintedProject,
    Store, StoreContents, StoreError,
};
use crate::apikey::{hash_key, key_prefix, KeyKind};
use crate::project::{
    KeyRecord, ProjectChange, ProjectRecord, TokenKeyRecord, TokenSecretRecord, FIRST_PUSHER_APP_ID,
};
use crate::redis_link::PREFIX;

mod records;
mod users;
use records::*;

/// Longest wait for a connect, a read or a write. A control-plane call that takes longer
/// is treated as Redis being unavailable (health goes degraded, the last snapshot stays).
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// A key of the store's layout, under the namespace.
fn k(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A connection to the Redis store. One per thread; reconnects lazily after an error.
pub(crate) struct RedisStore {
    client: redis::Client,
    conn: Option<redis::Connection>,
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> StoreError {
        StoreError::Redis(e.to_string())
    }
}

impl RedisStore {
    /// Parse `url` and connect once, so a wrong URL or an unreachable Redis fails now;
    /// give every project that lacks one its Pusher app id.
    pub(crate) fn open(url: &str, ca_file: Option<&Path>) -> Result<RedisStore, StoreError> {
        let client = crate::redis_link::client(url, ca_file)?;
        let mut store = RedisStore { client, conn: None };
        store.with(|c| redis::cmd("PING").query::<()>(c))?;
        let (projects, numbered): (u64, u64) = store.with(|c| {
            redis::pipe()
                .cmd("HLEN")
                .arg(k("projects"))
                .cmd("HLEN")
                .arg(k("pusher_app_ids"))
                .query(c)
        })?;
        // App ids are only written for existing projects, so equal counts mean none is
        // missing: the usual case costs no full read.
        if numbered < projects {
            store.backfill_app_ids()?;
        }
        Ok(store)
    }

    /// The next Pusher app id (1000000 first).
    fn next_app_id(&mut self) -> Result<u64, StoreError> {
        let (id,): (u64,) = self.with(|c| {
            redis::pipe()
                .atomic()
                .cmd("SETNX")
                .arg(k("pusher_app_seq"))
                .arg(FIRST_PUSHER_APP_ID - 1)
                .ignore()
                .incr(k("pusher_app_seq"), 1)
                .query(c)
        })?;
        Ok(id)
    }

    /// Number the projects without a Pusher app id, oldest first.
    fn backfill_app_ids(&mut self) -> Result<(), StoreError> {
        let (projects, app_ids): (HashMap<String, String>, HashMap<String, u64>) =
            self.read_atomic(&[("HGETALL", "projects"), ("HGETALL", "pusher_app_ids")])?;
        for project_id in unnumbered(&projects, &app_ids)? {
            let app_id = self.next_app_id()?;
            self.write(|pipe| {
                pipe.hset_nx(k("pusher_app_ids"), &project_id, app_id);
            })?;
        }
        Ok(())
    }

    /// Run `f` on a live connection; on error drop the connection (it may be broken
    /// mid-reply) so the next call starts clean.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        if self.conn.is_none() {
            let conn = self.client.get_connection_with_timeout(IO_TIMEOUT)?;
            conn.set_read_timeout(Some(IO_TIMEOUT))?;
            conn.set_write_timeout(Some(IO_TIMEOUT))?;
            self.conn = Some(conn);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(StoreError::Redis("no connection".into()));
        };
        let result = f(conn);
        if result.is_err() {
            self.conn = None;
        }
        Ok(result?)
    }

    /// Read whole keys in one MULTI/EXEC, so they come from the same instant (see
    /// [`add_reads`]).
    fn read_atomic<T: redis::FromRedisValue>(
        &mut self,
        reads: &[(&str, &str)],
    ) -> Result<T, StoreError> {
        self.with(|c| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            add_reads(&mut pipe, reads);
            pipe.query(c)
        })
    }

    /// Apply the writes `queue` adds in one MULTI/EXEC that also bumps `version` (what
    /// the watcher polls), so a reader sees all of a change or none of it.
    fn write(&mut self, queue: impl FnOnce(&mut redis::Pipeline)) -> Result<(), StoreError> {
        self.with(|c| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            queue(&mut pipe);
            pipe.incr(k("version"), 1).query::<()>(c)
        })
    }

    fn next_seq(&mut self) -> Result<u64, StoreError> {
        self.with(|c| redis::cmd("INCR").arg(k("seq")).query(c))
    }

    fn project_exists(&mut self, project_id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            redis::cmd("HEXISTS")
                .arg(k("projects"))
                .arg(project_id)
                .query(c)
        })
    }

    /// A key's stored JSON.
    fn key_json(&mut self, record: &KeyRecord) -> Result<String, StoreError> {
        let stored = StoredKey {
            project_id: record.project_id.clone(),
            kind: record.kind.as_str().to_string(),
            prefix: record.prefix.clone(),
            hash: record.hash.to_hex(),
            seq: self.next_seq()?,
            public_key: record.public_key.clone(),
        };
        serde_json::to_string(&stored)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode key: {e}")))
    }

    /// A token secret's stored JSON (its sealed bytes in base64).
    fn token_secret_json(&mut self, record: &TokenSecretRecord) -> Result<String, StoreError> {
        encode_json(&StoredTokenSecret {
            project_id: record.project_id.clone(),
            sealed: base64::engine::general_purpose::STANDARD.encode(&record.sealed),
            expires_at: record.expires_at,
            seq: self.next_seq()?,
        })
    }

    /// One project as stored now (after a change, for the CLI's answer).
    fn read_project(&mut self, project_id: &str) -> Result<ProjectRecord, StoreError> {
        self.read_projects()?
            .into_iter()
            .find(|p| p.id == project_id)
            .ok_or_else(|| project_not_found(project_id))
    }

    fn read_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError> {
        let mut attempts = 0;
        loop {
            let mut pipe = redis::pipe();
            pipe.atomic();
            add_project_reads(&mut pipe);
            let replies: Vec<redis::Value> = self.with(|c| pipe.query(c))?;
            let fields = ProjectFields::take(&mut replies.into_iter())?;
            attempts += 1;
            if attempts < NUMBERING_ATTEMPTS && fields.lacks_app_id() {
                self.backfill_app_ids()?;
                continue;
            }
            return decode_projects(fields);
        }
    }
}

/// Reads that find a project without an app id number it and read again, this many
/// times at most (more only if other processes keep creating projects without one).
const NUMBERING_ATTEMPTS: u32 = 3;

/// Queue the writes that store a key: its record (`json`) and its hash's entry.
fn queue_key(pipe: &mut redis::Pipeline, record: &KeyRecord, json: &str) {
    pipe.hset(k("keys"), &record.id, json)
        .hset(k("key_hashes"), record.hash.to_hex(), &record.id);
}

impl Store for RedisStore {
    fn insert_project(&mut self, minted: &MintedProject) -> Result<u64, StoreError> {
        let project = minted.project();
        let app_id = self.next_app_id()?;
        let stored = serde_json::to_string(&StoredProject {
            name: project.name.clone(),
            seq: self.next_seq()?,
        })
        .map_err(|e| StoreError::Corrupt(format!("cannot encode project: {e}")))?;
        let keys = [
            self.key_json(&minted.keys[0])?,
            self.key_json(&minted.keys[1])?,
        ];
        let ts = &minted.token_secret;
        let ts_json = self.token_secret_json(ts)?;
        self.write(|pipe| {
            pipe.hset(k("projects"), &project.id, &stored)
                .hset(
                    k("rate_limits"),
                    &project.id,
                    project.rate_limit.to_string(),
                )
                .hset(k("histories"), &project.id, project.history.to_string());
            for (record, json) in minted.keys.iter().zip(&keys) {
                queue_key(pipe, record, json);
            }
            pipe.hset(k("token_secrets"), &ts.id, &ts_json).hset(
                k("pusher_app_ids"),
                &project.id,
                app_id,
            );
        })?;
        Ok(app_id)
    }

    fn add_token_secret(
        &mut self,
        record: &TokenSecretRecord,
        grace_s: u64,
    ) -> Result<(), StoreError> {
        let project_id = record.project_id.as_str();
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        let new_json = self.token_secret_json(record)?;
        // WATCH the hash: a concurrent rotation makes EXEC fail instead of one rotation
        // silently overwriting the other's deadlines; then read and try again.
        for _ in 0..16 {
            let committed: Option<()> = self.with(|c| {
                redis::cmd("WATCH").arg(k("token_secrets")).query::<()>(c)?;
                let raw: HashMap<String, String> =
                    redis::cmd("HGETALL").arg(k("token_secrets")).query(c)?;
                let old = decode_token_secrets(raw).map_err(|e| {
                    redis::RedisError::from((redis::ErrorKind::Client, "corrupt", e.to_string()))
                })?;
                let now = unix_now();
                let mut pipe = redis::pipe();
                pipe.atomic();
                for (id, mut stored) in old {
                    if stored.project_id != project_id {
                        continue;
                    }
                    stored.expires_at = Some(rotated_expiry(stored.expires_at, now, grace_s));
                    let json = serde_json::to_string(&stored).map_err(|e| {
                        redis::RedisError::from((redis::ErrorKind::Client, "encode", e.to_string()))
                    })?;
                    pipe.hset(k("token_secrets"), id, json).ignore();
                }
                pipe.hset(k("token_secrets"), &record.id, &new_json)
                    .ignore()
                    .incr(k("version"), 1)
                    .ignore();
                pipe.query::<Option<()>>(c)
            })?;
            if committed.is_some() {
                return Ok(());
            }
        }
        Err(StoreError::Redis(
            "token secret rotation kept conflicting with another; try again".into(),
        ))
    }

    fn add_token_key(&mut self, record: &TokenKeyRecord) -> Result<(), StoreError> {
        if !self.project_exists(&record.project_id)? {
            return Err(project_not_found(&record.project_id));
        }
        let json = encode_json(&StoredTokenKey {
            project_id: record.project_id.clone(),
            alg: record.alg.as_str().to_string(),
            public_pem: record.public_pem.clone(),
            seq: self.next_seq()?,
        })?;
        self.write(|pipe| {
            pipe.hset(k("token_keys"), &record.id, &json);
        })
    }

    fn remove_token_key(&mut self, project_id: &str, key_id: &str) -> Result<(), StoreError> {
        let json: Option<String> =
            self.with(|c| redis::cmd("HGET").arg(k("token_keys")).arg(key_id).query(c))?;
        let belongs = json
            .and_then(|j| serde_json::from_str::<StoredTokenKey>(&j).ok())
            .is_some_and(|stored| stored.project_id == project_id);
        if !belongs {
            if !self.project_exists(project_id)? {
                return Err(project_not_found(project_id));
            }
            return Err(no_token_key(project_id, key_id));
        }
        self.write(|pipe| {
            pipe.hdel(k("token_keys"), key_id);
        })?;
        Ok(())
    }

    fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError> {
        self.read_projects()
    }

    fn set_project(
        &mut self,
        project_id: &str,
        change: &ProjectChange,
    ) -> Result<ProjectRecord, StoreError> {
        // Projects are never deleted, so "exists" cannot change before the write.
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        let webhook = match change {
            ProjectChange::Webhook(Some(w)) => Some(encode_json(&StoredWebhook {
                url: w.url.clone(),
                events: w.events.to_string(),
            })?),
            _ => None,
        };
        self.write(|pipe| {
            // Off-by-default flags are sets of the projects that have them on (and
            // `pusher_off` of those that turned Pusher off), so a project stored before
            // the flag existed reads as its default.
            let set = |pipe: &mut redis::Pipeline, name: &str, member: bool| {
                if member {
                    pipe.sadd(k(name), project_id);
                } else {
                    pipe.srem(k(name), project_id);
                }
            };
            match change {
                ProjectChange::RateLimit(r) => {
                    pipe.hset(k("rate_limits"), project_id, r.to_string());
                }
                ProjectChange::History(h) => {
                    pipe.hset(k("histories"), project_id, h.to_string());
                }
                ProjectChange::MaxConnections(Some(n)) => {
                    pipe.hset(k("max_connections"), project_id, *n);
                }
                ProjectChange::MaxConnections(None) => {
                    pipe.hdel(k("max_connections"), project_id);
                }
                ProjectChange::ClientEvents(on) => set(pipe, "client_events", *on),
                ProjectChange::Pusher(on) => set(pipe, "pusher_off", !*on),
                ProjectChange::RequireUser(on) => set(pipe, "require_user", *on),
                ProjectChange::Webhook(_) => {
                    match &webhook {
                        Some(json) => pipe.hset(k("webhooks"), project_id, json),
                        None => pipe.hdel(k("webhooks"), project_id),
                    };
                }
            }
        })?;
        if let ProjectChange::History(_) = change {
            // The project's cluster-mode history is forgotten at every change: messages
            // published while it was off are not in it, so no position taken before may
            // be recovered (the next use starts a new epoch).
            self.with(|c| forget_history(c, project_id))?;
        }
        self.read_project(project_id)
    }

    fn insert_key(&mut self, record: &KeyRecord) -> Result<(), StoreError> {
        if !self.project_exists(&record.project_id)? {
            return Err(project_not_found(&record.project_id));
        }
        let json = self.key_json(record)?;
        self.write(|pipe| queue_key(pipe, record, &json))
    }

    fn revoke_key(&mut self, key_or_id: &str) -> Result<String, StoreError> {
        let (id, shown) = if KeyKind::of_key(key_or_id).is_some() {
            let hex = hash_key(key_or_id).to_hex();
            let id: Option<String> =
                self.with(|c| redis::cmd("HGET").arg(k("key_hashes")).arg(hex).query(c))?;
            // Never echo a full (possibly valid) key into logs or terminals.
            (id, key_prefix(key_or_id))
        } else {
            let exists: bool =
                self.with(|c| redis::cmd("HEXISTS").arg(k("keys")).arg(key_or_id).query(c))?;
            (exists.then(|| key_or_id.to_string()), key_or_id.to_string())
        };
        let id = id.ok_or_else(|| no_key_matches(&shown))?;
        // A set insert: revoking twice is a no-op, and nothing ever removes a member.
        self.write(|pipe| {
            pipe.sadd(k("revoked"), &id);
        })?;
        Ok(id)
    }

    fn list_keys(&mut self, project_id: &str) -> Result<Vec<KeyRecord>, StoreError> {
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        let (keys, revoked): (HashMap<String, String>, HashSet<String>) =
            self.read_atomic(&[("HGETALL", "keys"), ("SMEMBERS", "revoked")])?;
        decode_keys(keys, &revoked, Some(project_id))
    }

    fn load_all(&mut self) -> Result<StoreContents, StoreError> {
        let mut attempts = 0;
        loop {
            // One MULTI/EXEC: projects, limits, keys and revocations from the same instant.
            let mut pipe = redis::pipe();
            pipe.atomic();
            add_project_reads(&mut pipe);
            add_reads(
                &mut pipe,
                &[
                    ("HGETALL", "keys"),
                    ("SMEMBERS", "revoked"),
                    ("HGETALL", "token_secrets"),
                    ("HGETALL", "token_keys"),
                    ("SMEMBERS", "require_user"),
                ],
            );
            let replies: Vec<redis::Value> = self.with(|c| pipe.query(c))?;
            let mut replies = replies.into_iter();
            let fields = ProjectFields::take(&mut replies)?;
            attempts += 1;
            if attempts < NUMBERING_ATTEMPTS && fields.lacks_app_id() {
                self.backfill_app_ids()?;
                continue;
            }
            let keys = next_reply(&mut replies)?;
            let revoked: HashSet<String> = next_reply(&mut replies)?;
            let secrets = next_reply(&mut replies)?;
            let token_keys = next_reply(&mut replies)?;
            let require_user = next_reply(&mut replies)?;
            let projects = decode_projects(fields)?;
            let ids: Vec<String> = projects.iter().map(|p| p.id.clone()).collect();
            return Ok(StoreContents {
                projects,
                keys: decode_keys(keys, &revoked, None)?,
                token_secrets: token_secret_records(secrets)?,
                token_keys: token_key_records(token_keys)?,
                require_user,
                user_blocks: users::read_blocks(self, &ids)?,
            });
        }
    }

    fn change_token(&mut self) -> Result<u64, StoreError> {
        let version: Option<u64> = self.with(|c| redis::cmd("GET").arg(k("version")).query(c))?;
        Ok(version.unwrap_or(0))
    }

    fn is_empty(&mut self) -> Result<bool, StoreError> {
        let n: u64 = self.with(|c| redis::cmd("HLEN").arg(k("projects")).query(c))?;
        Ok(n == 0)
    }
}

/// Delete every history key (position hash, stream) of a project, by SCAN (an admin
/// command: never on a node's path).
fn forget_history(c: &mut redis::Connection, project_id: &str) -> redis::RedisResult<()> {
    use crate::history::{REDIS_META_PREFIX, REDIS_STREAM_PREFIX};
    for prefix in [REDIS_META_PREFIX, REDIS_STREAM_PREFIX] {
        let pattern = format!("{prefix}{project_id}:*");
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query(c)?;
            if !keys.is_empty() {
                redis::cmd("DEL").arg(&keys).query::<()>(c)?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}
