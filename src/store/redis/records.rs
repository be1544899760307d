//! How projects, keys and token secrets are stored in Redis (the JSON records and the
//! hashes and sets of the layout in the parent module's doc) and how they read back
//! into [`ProjectRecord`] and [`KeyRecord`]. Pure decoding: no connection here, so a
//! corrupt value is a [`StoreError::Corrupt`] naming what it was, never a panic.

use std::collections::{HashMap, HashSet};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::k;
use crate::apikey::{KeyHash, KeyKind};
use crate::history::HistorySpec;
use crate::project::{
    HookKinds, KeyRecord, ProjectRecord, TokenKeyAlg, TokenKeyRecord, TokenSecretRecord,
    WebhookSpec,
};
use crate::quota::RateLimit;
use crate::store::StoreError;

#[derive(Serialize, Deserialize)]
pub(super) struct StoredProject {
    pub(super) name: String,
    pub(super) seq: u64,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredKey {
    pub(super) project_id: String,
    pub(super) kind: String,
    pub(super) prefix: String,
    /// Hex SHA-256 of the full key.
    pub(super) hash: String,
    pub(super) seq: u64,
    /// The whole key, for a public key only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) public_key: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredWebhook {
    pub(super) url: String,
    pub(super) events: String,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredTokenSecret {
    pub(super) project_id: String,
    /// Standard base64 of the sealed bytes.
    pub(super) sealed: String,
    pub(super) expires_at: Option<i64>,
    pub(super) seq: u64,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredTokenKey {
    pub(super) project_id: String,
    pub(super) alg: String,
    pub(super) public_pem: String,
    pub(super) seq: u64,
}

pub(super) fn encode_json<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(format!("cannot encode: {e}")))
}

pub(super) fn decode_token_secrets(
    raw: HashMap<String, String>,
) -> Result<Vec<(String, StoredTokenSecret)>, StoreError> {
    let mut out = raw
        .into_iter()
        .map(|(id, json)| {
            serde_json::from_str::<StoredTokenSecret>(&json)
                .map(|s| (id.clone(), s))
                .map_err(|e| StoreError::Corrupt(format!("token secret {id}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_by_key(|(_, s)| s.seq);
    Ok(out)
}

pub(super) fn token_secret_records(
    raw: HashMap<String, String>,
) -> Result<Vec<TokenSecretRecord>, StoreError> {
    decode_token_secrets(raw)?
        .into_iter()
        .map(|(id, s)| {
            let sealed = base64::engine::general_purpose::STANDARD
                .decode(&s.sealed)
                .map_err(|e| StoreError::Corrupt(format!("token secret {id}: {e}")))?;
            Ok(TokenSecretRecord {
                id,
                project_id: s.project_id,
                sealed,
                expires_at: s.expires_at,
            })
        })
        .collect()
}

pub(super) fn token_key_records(
    raw: HashMap<String, String>,
) -> Result<Vec<TokenKeyRecord>, StoreError> {
    let mut out = Vec::with_capacity(raw.len());
    for (id, json) in raw {
        let stored: StoredTokenKey = serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("token key {id}: {e}")))?;
        let alg = TokenKeyAlg::parse(&stored.alg)
            .ok_or_else(|| StoreError::Corrupt(format!("token key {id}: unknown alg")))?;
        out.push((
            stored.seq,
            TokenKeyRecord {
                id,
                project_id: stored.project_id,
                alg,
                public_pem: stored.public_pem,
            },
        ));
    }
    out.sort_by_key(|(seq, _)| *seq);
    Ok(out.into_iter().map(|(_, k)| k).collect())
}

/// Everything stored about projects, as read in one MULTI/EXEC.
pub(super) struct ProjectFields {
    pub(super) projects: HashMap<String, String>,
    pub(super) limits: HashMap<String, String>,
    pub(super) histories: HashMap<String, String>,
    pub(super) max_connections: HashMap<String, u64>,
    pub(super) client_events: HashSet<String>,
    pub(super) webhooks: HashMap<String, String>,
    pub(super) app_ids: HashMap<String, u64>,
    pub(super) pusher_off: HashSet<String>,
}

/// Queue the reads of [`ProjectFields`], in the order [`ProjectFields::take`] takes
/// their replies back.
pub(super) fn add_project_reads(pipe: &mut redis::Pipeline) {
    add_reads(
        pipe,
        &[
            ("HGETALL", "projects"),
            ("HGETALL", "rate_limits"),
            ("HGETALL", "histories"),
            ("HGETALL", "max_connections"),
            ("SMEMBERS", "client_events"),
            ("HGETALL", "webhooks"),
            ("HGETALL", "pusher_app_ids"),
            ("SMEMBERS", "pusher_off"),
        ],
    );
}

/// Queue one whole-key read per `(command, key)`: `HGETALL` of a hash or `SMEMBERS`
/// of a set, the key under ringcast's prefix. Replies come back in this order.
pub(super) fn add_reads(pipe: &mut redis::Pipeline, reads: &[(&str, &str)]) {
    for (command, key) in reads {
        pipe.cmd(command).arg(k(key));
    }
}

/// The next reply of a MULTI/EXEC, as a `T`.
pub(super) fn next_reply<T: redis::FromRedisValue>(
    replies: &mut std::vec::IntoIter<redis::Value>,
) -> Result<T, StoreError> {
    let value = replies
        .next()
        .ok_or_else(|| StoreError::Redis("a reply is missing from MULTI/EXEC".into()))?;
    redis::from_redis_value(value).map_err(|e| StoreError::Redis(e.to_string()))
}

impl ProjectFields {
    /// Take the replies of [`add_project_reads`] from the front of `replies`.
    pub(super) fn take(
        replies: &mut std::vec::IntoIter<redis::Value>,
    ) -> Result<ProjectFields, StoreError> {
        Ok(ProjectFields {
            projects: next_reply(replies)?,
            limits: next_reply(replies)?,
            histories: next_reply(replies)?,
            max_connections: next_reply(replies)?,
            client_events: next_reply(replies)?,
            webhooks: next_reply(replies)?,
            app_ids: next_reply(replies)?,
            pusher_off: next_reply(replies)?,
        })
    }

    pub(super) fn lacks_app_id(&self) -> bool {
        self.projects
            .keys()
            .any(|id| !self.app_ids.contains_key(id))
    }
}

/// The projects of `projects` (the stored hash) that have no app id in `app_ids`,
/// oldest first.
pub(super) fn unnumbered(
    projects: &HashMap<String, String>,
    app_ids: &HashMap<String, u64>,
) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for (id, json) in projects {
        if app_ids.contains_key(id) {
            continue;
        }
        let stored: StoredProject = serde_json::from_str(json)
            .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?;
        out.push((stored.seq, id.clone()));
    }
    out.sort_unstable();
    Ok(out.into_iter().map(|(_, id)| id).collect())
}

pub(super) fn decode_projects(fields: ProjectFields) -> Result<Vec<ProjectRecord>, StoreError> {
    let ProjectFields {
        projects,
        limits,
        histories,
        max_connections,
        client_events,
        webhooks,
        app_ids,
        pusher_off,
    } = fields;
    let mut out = Vec::with_capacity(projects.len());
    for (id, json) in projects {
        let stored: StoredProject = serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?;
        let limit = limits
            .get(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("project {id}: no rate limit")))?;
        let rate_limit = RateLimit::parse(limit)
            .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?;
        // Absent: a project created before history existed, or never given one.
        let history = match histories.get(&id) {
            Some(h) => HistorySpec::parse(h)
                .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?,
            None => HistorySpec::OFF,
        };
        let webhook = match webhooks.get(&id) {
            Some(json) => {
                let hook: StoredWebhook = serde_json::from_str(json)
                    .map_err(|e| StoreError::Corrupt(format!("project {id} webhook: {e}")))?;
                Some(WebhookSpec {
                    url: hook.url,
                    events: HookKinds::parse(&hook.events)
                        .map_err(|e| StoreError::Corrupt(format!("project {id}: {e}")))?,
                })
            }
            None => None,
        };
        let pusher_app_id = *app_ids
            .get(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("project {id}: no Pusher app id")))?;
        out.push((
            stored.seq,
            ProjectRecord {
                webhook,
                max_connections: max_connections.get(&id).copied(),
                client_events: client_events.contains(&id),
                pusher_app_id,
                pusher: !pusher_off.contains(&id),
                id,
                name: stored.name,
                rate_limit,
                history,
            },
        ));
    }
    out.sort_by_key(|(seq, _)| *seq);
    Ok(out.into_iter().map(|(_, p)| p).collect())
}

pub(super) fn decode_keys(
    keys: HashMap<String, String>,
    revoked: &HashSet<String>,
    only_project: Option<&str>,
) -> Result<Vec<KeyRecord>, StoreError> {
    let mut out = Vec::new();
    for (id, json) in keys {
        let stored: StoredKey = serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("key {id}: {e}")))?;
        if only_project.is_some_and(|p| p != stored.project_id) {
            continue;
        }
        let kind = KeyKind::parse(&stored.kind)
            .ok_or_else(|| StoreError::Corrupt(format!("key {id}: unknown kind")))?;
        let hash = hex::decode(&stored.hash)
            .ok()
            .and_then(|h| <[u8; 32]>::try_from(h.as_slice()).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("key {id}: hash is not 32 bytes")))?;
        out.push((
            stored.seq,
            KeyRecord {
                revoked: revoked.contains(&id),
                id,
                project_id: stored.project_id,
                kind,
                prefix: stored.prefix,
                hash: KeyHash(hash),
                public_key: stored.public_key,
            },
        ));
    }
    out.sort_by_key(|(seq, _)| *seq);
    Ok(out.into_iter().map(|(_, k)| k).collect())
}
