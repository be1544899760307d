//! Users in the Redis store. Layout (under the store's namespace):
//! - `require_user` set: ids of the projects whose WebSockets need a connection token;
//! - `user_blocks:<project id>` hash: user id → unix seconds until which the user is
//!   blocked, or `-` for ever (one hash per project, so bounding a project's blocks is
//!   one `HLEN`);
//! - `user_ends` sorted set: end records as JSON, scored by their `seq` (from the
//!   `user_end_seq` counter), trimmed to [`MAX_STORED_ENDS`].
//!
//! Invariants: a block or lift is one Lua script (drop the project's expired blocks,
//! check the bound, write, bump `version`), so two writers cannot both pass the bound
//! and every node reloads; an end record does not bump `version` (nodes read it by
//! `seq`, see [`crate::auth::watcher`]), and takes its `seq` in the same script that
//! adds it, so records become visible in `seq` order and no reader skips one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{k, project_not_found, RedisStore};
use crate::project::users::{ENDS_PER_READ, MAX_STORED_ENDS};
use crate::project::{UserBlockRecord, UserEndRecord};
use crate::store::{unix_now, StoreError, UserStore};

fn blocks_key(project_id: &str) -> String {
    k(&format!("user_blocks:{project_id}"))
}

/// The stored form of a block's `until`.
fn until_text(until: Option<i64>) -> String {
    until.map_or_else(|| "-".to_string(), |t| t.to_string())
}

fn parse_until(text: &str) -> Result<Option<i64>, StoreError> {
    match text {
        "-" => Ok(None),
        t => t
            .parse()
            .map(Some)
            .map_err(|_| StoreError::Corrupt(format!("user block until {t:?}"))),
    }
}

/// KEYS: blocks hash, version. ARGV: user, until text, now, max. Returns 1 (stored),
/// 0 (over the bound).
const BLOCK: &str = r"
local all = redis.call('HGETALL', KEYS[1])
local now = tonumber(ARGV[3])
for i = 1, #all, 2 do
  local u = all[i + 1]
  if u ~= '-' and tonumber(u) <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
   and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCR', KEYS[2])
return 1
";

/// KEYS: the end counter, the end records' sorted set. ARGV: the record's JSON after its
/// opening `{"seq":0,`, the rank below which older records are trimmed. The `seq` is
/// taken and the record added in one step: with an INCR and a ZADD apart, a reader
/// could see a later `seq` before an earlier one was added, move its cursor past it
/// and never read it. Returns the `seq`.
const ADD_END: &str = r#"
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, '{"seq":' .. seq .. ',' .. ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, tonumber(ARGV[2]))
return seq
"#;

/// KEYS: blocks hash, version. ARGV: user, now. Returns whether a block was in force.
const UNBLOCK: &str = r"
local u = redis.call('HGET', KEYS[1], ARGV[1])
if not u then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
if u ~= '-' and tonumber(u) <= tonumber(ARGV[2]) then return 0 end
return 1
";

#[derive(Serialize, Deserialize)]
struct StoredEnd {
    seq: u64,
    project_id: String,
    user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    channel: Option<String>,
    origin: u64,
    created_at: i64,
}

/// The blocks that hold now, of the projects `project_ids` (after `load_all`'s read:
/// a block written in between moved `version`, so the next poll reads it again).
pub(super) fn read_blocks(
    store: &mut RedisStore,
    project_ids: &[String],
) -> Result<Vec<UserBlockRecord>, StoreError> {
    if project_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for id in project_ids {
        pipe.cmd("HGETALL").arg(blocks_key(id));
    }
    let hashes: Vec<HashMap<String, String>> = store.with(|c| pipe.query(c))?;
    let now = unix_now();
    let mut out = Vec::new();
    for (project_id, hash) in project_ids.iter().zip(hashes) {
        for (user_id, until) in hash {
            let block = UserBlockRecord {
                project_id: project_id.clone(),
                user_id,
                until: parse_until(&until)?,
            };
            if block.holds_at(now) {
                out.push(block);
            }
        }
    }
    Ok(out)
}

impl UserStore for RedisStore {
    fn requires_user(&mut self, project_id: &str) -> Result<bool, StoreError> {
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        self.with(|c| {
            redis::cmd("SISMEMBER")
                .arg(k("require_user"))
                .arg(project_id)
                .query(c)
        })
    }

    fn block_user(&mut self, block: &UserBlockRecord, max: usize) -> Result<(), StoreError> {
        if !self.project_exists(&block.project_id)? {
            return Err(project_not_found(&block.project_id));
        }
        let stored: i64 = self.with(|c| {
            redis::Script::new(BLOCK)
                .key(blocks_key(&block.project_id))
                .key(k("version"))
                .arg(&block.user_id)
                .arg(until_text(block.until))
                .arg(unix_now())
                .arg(max)
                .invoke(c)
        })?;
        if stored == 0 {
            return Err(StoreError::TooManyBlocks(max));
        }
        Ok(())
    }

    fn unblock_user(&mut self, project_id: &str, user_id: &str) -> Result<bool, StoreError> {
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        let held: i64 = self.with(|c| {
            redis::Script::new(UNBLOCK)
                .key(blocks_key(project_id))
                .key(k("version"))
                .arg(user_id)
                .arg(unix_now())
                .invoke(c)
        })?;
        Ok(held == 1)
    }

    fn user_block(
        &mut self,
        project_id: &str,
        user_id: &str,
    ) -> Result<Option<UserBlockRecord>, StoreError> {
        if !self.project_exists(project_id)? {
            return Err(project_not_found(project_id));
        }
        let until: Option<String> = self.with(|c| {
            redis::cmd("HGET")
                .arg(blocks_key(project_id))
                .arg(user_id)
                .query(c)
        })?;
        let Some(until) = until else {
            return Ok(None);
        };
        let block = UserBlockRecord {
            project_id: project_id.to_string(),
            user_id: user_id.to_string(),
            until: parse_until(&until)?,
        };
        Ok(block.holds_at(unix_now()).then_some(block))
    }

    fn add_user_end(&mut self, end: &UserEndRecord) -> Result<(), StoreError> {
        // The record without its `seq`: the script takes the next one and writes it in
        // front, in the same step as the ZADD (see ADD_END).
        let json = serde_json::to_string(&StoredEnd {
            seq: 0,
            project_id: end.project_id.clone(),
            user_id: end.user_id.clone(),
            channel: end.channel.clone(),
            origin: end.origin,
            created_at: end.created_at,
        })
        .map_err(|e| StoreError::Corrupt(format!("cannot encode end record: {e}")))?;
        let rest = json
            .strip_prefix("{\"seq\":0,")
            .ok_or_else(|| StoreError::Corrupt("end record encoding".into()))?;
        // Keep the newest MAX_STORED_ENDS: ranks 0 .. -(MAX + 1) are the older ones.
        let oldest_kept = -(i64::try_from(MAX_STORED_ENDS).unwrap_or(i64::MAX)) - 1;
        self.with(|c| {
            redis::Script::new(ADD_END)
                .key(k("user_end_seq"))
                .key(k("user_ends"))
                .arg(rest)
                .arg(oldest_kept)
                .invoke::<i64>(c)
                .map(drop)
        })
    }

    fn user_ends_after(
        &mut self,
        after: Option<u64>,
    ) -> Result<(Vec<UserEndRecord>, u64), StoreError> {
        let Some(after) = after else {
            let last: Option<u64> =
                self.with(|c| redis::cmd("GET").arg(k("user_end_seq")).query(c))?;
            return Ok((Vec::new(), last.unwrap_or(0)));
        };
        let found: Vec<String> = self.with(|c| {
            redis::cmd("ZRANGEBYSCORE")
                .arg(k("user_ends"))
                .arg(format!("({after}"))
                .arg("+inf")
                .arg("LIMIT")
                .arg(0)
                .arg(ENDS_PER_READ)
                .query(c)
        })?;
        let mut ends = Vec::with_capacity(found.len());
        for json in found {
            let s: StoredEnd = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("end record: {e}")))?;
            ends.push(UserEndRecord {
                seq: s.seq,
                project_id: s.project_id,
                user_id: s.user_id,
                channel: s.channel,
                origin: s.origin,
                created_at: s.created_at,
            });
        }
        let next = ends.last().map_or(after, |e| e.seq);
        Ok((ends, next))
    }
}
