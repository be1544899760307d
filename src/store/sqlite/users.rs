//! Users in the SQLite store: `projects.require_user`, the `user_blocks` table (until
//! NULL: for ever) and the `user_ends` table (end records, ordered by `seq`).
//!
//! Invariants: a block write runs in [`SqliteStore::write`], so it moves the change token
//! and every watcher reloads its snapshot; an end record does not bump the counter (it is
//! read by `seq`, not by a rebuild), and the table is trimmed to
//! [`MAX_STORED_ENDS`] rows in the same transaction that adds one.

use std::collections::HashSet;

use rusqlite::{params, OptionalExtension, Transaction, TransactionBehavior};

use super::{project_exists, project_not_found, unix_now, SqliteStore};
use crate::project::users::{ENDS_PER_READ, MAX_STORED_ENDS};
use crate::project::{UserBlockRecord, UserEndRecord};
use crate::store::{StoreError, UserStore};

/// `require_user` projects and the blocks that hold now, inside `load_all`'s read.
pub(super) fn read_all(
    tx: &Transaction<'_>,
) -> Result<(HashSet<String>, Vec<UserBlockRecord>), StoreError> {
    let mut stmt = tx.prepare_cached("SELECT id FROM projects WHERE require_user != 0")?;
    let require = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<HashSet<_>, _>>()?;
    let mut stmt = tx.prepare_cached(
        "SELECT project_id, user_id, until FROM user_blocks WHERE until IS NULL OR until > ?1",
    )?;
    let blocks = stmt
        .query_map([unix_now()], |r| {
            Ok(UserBlockRecord {
                project_id: r.get(0)?,
                user_id: r.get(1)?,
                until: r.get(2)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((require, blocks))
}

impl UserStore for SqliteStore {
    fn requires_user(&mut self, project_id: &str) -> Result<bool, StoreError> {
        self.conn
            .query_row(
                "SELECT require_user != 0 FROM projects WHERE id = ?1",
                [project_id],
                |r| r.get(0),
            )
            .optional()?
            .ok_or_else(|| project_not_found(project_id))
    }

    fn block_user(&mut self, block: &UserBlockRecord, max: usize) -> Result<(), StoreError> {
        self.write(|tx| {
            if !project_exists(tx, &block.project_id)? {
                return Err(project_not_found(&block.project_id));
            }
            let now = unix_now();
            tx.execute(
                "DELETE FROM user_blocks WHERE project_id = ?1 AND until IS NOT NULL AND until <= ?2",
                params![block.project_id, now],
            )?;
            let others: i64 = tx.query_row(
                "SELECT COUNT(*) FROM user_blocks WHERE project_id = ?1 AND user_id != ?2",
                params![block.project_id, block.user_id],
                |r| r.get(0),
            )?;
            if usize::try_from(others).unwrap_or(usize::MAX) >= max {
                return Err(StoreError::TooManyBlocks(max));
            }
            tx.execute(
                "INSERT INTO user_blocks (project_id, user_id, until, created_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (project_id, user_id) DO UPDATE SET until = excluded.until",
                params![block.project_id, block.user_id, block.until, now],
            )?;
            Ok(())
        })
    }

    fn unblock_user(&mut self, project_id: &str, user_id: &str) -> Result<bool, StoreError> {
        let now = unix_now();
        self.write(|tx| {
            if !project_exists(tx, project_id)? {
                return Err(project_not_found(project_id));
            }
            // An expired block is lifted too, but it was not in force.
            let held: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM user_blocks WHERE project_id = ?1 AND user_id = ?2
                 AND (until IS NULL OR until > ?3))",
                params![project_id, user_id, now],
                |r| r.get(0),
            )?;
            tx.execute(
                "DELETE FROM user_blocks WHERE project_id = ?1 AND user_id = ?2",
                params![project_id, user_id],
            )?;
            Ok(held)
        })
    }

    fn user_block(
        &mut self,
        project_id: &str,
        user_id: &str,
    ) -> Result<Option<UserBlockRecord>, StoreError> {
        if !project_exists(&self.conn, project_id)? {
            return Err(project_not_found(project_id));
        }
        let until: Option<Option<i64>> = self
            .conn
            .query_row(
                "SELECT until FROM user_blocks WHERE project_id = ?1 AND user_id = ?2
                 AND (until IS NULL OR until > ?3)",
                params![project_id, user_id, unix_now()],
                |r| r.get(0),
            )
            .optional()?;
        Ok(until.map(|until| UserBlockRecord {
            project_id: project_id.to_string(),
            user_id: user_id.to_string(),
            until,
        }))
    }

    fn add_user_end(&mut self, end: &UserEndRecord) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The origin is a random u64; SQLite integers are signed, so it goes as bits.
        tx.execute(
            "INSERT INTO user_ends (project_id, user_id, channel, origin, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                end.project_id,
                end.user_id,
                end.channel,
                end.origin as i64,
                end.created_at
            ],
        )?;
        let keep = i64::try_from(MAX_STORED_ENDS).unwrap_or(i64::MAX);
        tx.execute(
            "DELETE FROM user_ends WHERE seq <= (SELECT MAX(seq) FROM user_ends) - ?1",
            [keep],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn user_ends_after(
        &mut self,
        after: Option<u64>,
    ) -> Result<(Vec<UserEndRecord>, u64), StoreError> {
        let last: i64 =
            self.conn
                .query_row("SELECT COALESCE(MAX(seq), 0) FROM user_ends", [], |r| {
                    r.get(0)
                })?;
        let Some(after) = after else {
            return Ok((Vec::new(), last.max(0) as u64));
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, project_id, user_id, channel, origin, created_at FROM user_ends
             WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?;
        let ends = stmt
            .query_map(
                params![
                    i64::try_from(after).unwrap_or(i64::MAX),
                    ENDS_PER_READ as i64
                ],
                |r| {
                    Ok(UserEndRecord {
                        seq: r.get::<_, i64>(0)?.max(0) as u64,
                        project_id: r.get(1)?,
                        user_id: r.get(2)?,
                        channel: r.get(3)?,
                        origin: r.get::<_, i64>(4)? as u64,
                        created_at: r.get(5)?,
                    })
                },
            )?
            .collect::<Result<Vec<_>, _>>()?;
        let next = ends.last().map_or(after, |e| e.seq);
        Ok((ends, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::ProjectChange;
    use crate::store::Store;

    fn store_with_project() -> (tempfile::TempDir, SqliteStore, String) {
        let (dir, store, p) = crate::store::test_store_with_project();
        (dir, store, p.id)
    }

    fn block(p: &str, u: &str, until: Option<i64>) -> UserBlockRecord {
        UserBlockRecord {
            project_id: p.into(),
            user_id: u.into(),
            until,
        }
    }

    #[test]
    fn blocks_set_lift_expire_and_survive_reopening() {
        let (dir, mut store, p) = store_with_project();
        let now = unix_now();
        assert_eq!(store.user_block(&p, "u1").unwrap(), None);
        let before = store.change_token().unwrap();
        store.block_user(&block(&p, "u1", None), 10).unwrap();
        assert_ne!(
            store.change_token().unwrap(),
            before,
            "a block reloads snapshots"
        );
        store
            .block_user(&block(&p, "u2", Some(now + 3600)), 10)
            .unwrap();
        // Expired at once: stored, but never read back.
        store
            .block_user(&block(&p, "u3", Some(now - 1)), 10)
            .unwrap();
        assert_eq!(
            store.user_block(&p, "u1").unwrap(),
            Some(block(&p, "u1", None))
        );
        assert_eq!(store.user_block(&p, "u3").unwrap(), None);
        let all = store.load_all().unwrap().user_blocks;
        assert_eq!(all.len(), 2, "{all:?}");

        drop(store);
        let mut store = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(
            store.user_block(&p, "u2").unwrap(),
            Some(block(&p, "u2", Some(now + 3600)))
        );
        assert!(store.unblock_user(&p, "u2").unwrap());
        assert!(
            !store.unblock_user(&p, "u2").unwrap(),
            "nothing left to lift"
        );
        assert!(
            !store.unblock_user(&p, "u3").unwrap(),
            "expired: not in force"
        );
        assert_eq!(store.user_block(&p, "u2").unwrap(), None);
        assert!(matches!(
            store.block_user(&block("prj_nope", "u", None), 10),
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.user_block("prj_nope", "u"),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn blocks_are_bounded_per_project_and_expired_ones_make_room() {
        let (_dir, mut store, p) = store_with_project();
        let now = unix_now();
        store.block_user(&block(&p, "a", Some(now - 5)), 2).unwrap();
        store.block_user(&block(&p, "b", None), 2).unwrap();
        // "a" expired: dropped, so "c" fits.
        store.block_user(&block(&p, "c", None), 2).unwrap();
        assert!(matches!(
            store.block_user(&block(&p, "d", None), 2),
            Err(StoreError::TooManyBlocks(2))
        ));
        // Changing an existing block is not a new one.
        store
            .block_user(&block(&p, "c", Some(now + 60)), 2)
            .unwrap();
    }

    #[test]
    fn require_user_is_a_project_change() {
        let (_dir, mut store, p) = store_with_project();
        assert!(!store.requires_user(&p).unwrap());
        assert!(store.load_all().unwrap().require_user.is_empty());
        store
            .set_project(&p, &ProjectChange::RequireUser(true))
            .unwrap();
        assert!(store.requires_user(&p).unwrap());
        assert!(store.load_all().unwrap().require_user.contains(&p));
    }

    #[test]
    fn end_records_are_read_in_order_from_a_cursor() {
        let (_dir, mut store, p) = store_with_project();
        let (none, start) = store.user_ends_after(None).unwrap();
        assert!(none.is_empty());
        let end = |u: &str, channel: Option<&str>| UserEndRecord {
            seq: 0,
            project_id: p.clone(),
            user_id: u.into(),
            channel: channel.map(Into::into),
            origin: u64::MAX,
            created_at: unix_now(),
        };
        let token = store.change_token().unwrap();
        store.add_user_end(&end("u1", None)).unwrap();
        store.add_user_end(&end("u2", Some("news"))).unwrap();
        assert_eq!(store.change_token().unwrap(), token, "ends move no token");
        let (ends, next) = store.user_ends_after(Some(start)).unwrap();
        assert_eq!(ends.len(), 2);
        assert_eq!(ends[0].user_id, "u1");
        assert_eq!(ends[0].origin, u64::MAX, "the origin keeps all 64 bits");
        assert_eq!(ends[1].channel.as_deref(), Some("news"));
        assert_eq!(next, ends[1].seq);
        let (again, same) = store.user_ends_after(Some(next)).unwrap();
        assert!(again.is_empty());
        assert_eq!(same, next);
    }
}
