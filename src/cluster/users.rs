//! Ending a user's access on every node: how a disconnect or a server-side unsubscribe
//! asked on one node (REST, Pusher `terminate_connections`) or by the admin CLI reaches
//! every node's connections of that user within 1 s.
//!
//! Design: the store is the relay. The node that takes the request applies it to its
//! own workers at once ([`end_here`]) and writes an end record
//! ([`crate::project::UserEndRecord`]) to the store (SQLite or Redis); every other
//! process's key watcher reads new end records at each poll (`key_refresh_ms`, 250 ms
//! by default) and applies them with [`on_end`]. Why not Redis pub/sub beside the
//! publish relay: the admin CLI, which has no running server to talk to, must reach
//! every server too, and so must a second server process on the same SQLite data
//! directory; one path serves all three, needs no new thread or connection, and an end
//! record asked while a node is briefly away is still applied when it comes back (if
//! younger than [`crate::project::users::END_MAX_AGE_S`]). The price: `connections`
//! in `GET /api/v1/users/{id}` is this node's count (no node answers another's
//! question), and a disconnect costs one store write (on SQLite that write also makes
//! the other processes' watchers reload their key snapshot once, as SQLite's
//! `data_version` moves on any commit; bounded by the poll interval and the quota).
//!
//! Invariants: [`end_here`] never blocks and never touches the store (it runs on
//! workers); records of projects this node does not know are ignored.

use std::sync::Arc;

use crate::auth::KeyCache;
use crate::project::UserEndRecord;
use crate::shard::mailbox::Mailboxes;

pub(crate) use crate::shard::users::UserEnd as End;

/// Apply `end` to this node's connections of `user` in the project with this index
/// (one control envelope per worker; never blocks).
pub(crate) fn end_here(mailboxes: &Mailboxes, project_index: u32, user: Arc<str>, end: End) {
    mailboxes.end_user(project_index, user, end);
}

/// This node's connections of `user` in the project.
pub(crate) fn connections_here(mailboxes: &Mailboxes, project_index: u32, user: &str) -> u32 {
    mailboxes.user_connections(project_index, user)
}

/// The key watcher's handler of other processes' end records.
pub(crate) fn on_end(
    mailboxes: Mailboxes,
    keys: Arc<KeyCache>,
) -> Box<dyn Fn(&UserEndRecord) + Send> {
    Box::new(move |record| {
        let Some(index) = keys.load().project(&record.project_id).map(|p| p.index) else {
            return;
        };
        let end = match &record.channel {
            None => End::Disconnect,
            Some(c) => End::Unsubscribe(c.as_str().into()),
        };
        end_here(&mailboxes, index, record.user_id.as_str().into(), end);
    })
}
