//! Who a connection is, as far as one worker must know it: the index of this worker's
//! connections that have a user, by (project index, user id), and what ending a user's
//! access does to them ([`UserEnd`]: close with 4010, or a server-side unsubscribe).
//!
//! A connection gets a user from a native connection token (`?token=` on the upgrade) or
//! a Pusher `pusher:signin`; the session (`client::session`) joins it here with
//! [`Shard::user_join`] and keeps the returned [`UserConn`] in its extras, and leaves
//! with [`Shard::user_leave`] when it ends. `Mailboxes::end_user` (the REST endpoints'
//! entry, any thread) puts one [`super::mailbox::Envelope::EndUser`] into every worker's
//! mailbox; each worker ends its own connections of that user ([`Shard::end_user`]).
//!
//! Invariants:
//! - A connection without a user costs nothing here: no entry, no allocation, no field
//!   in the connection or the member table; only connections with a user are indexed
//!   and counted.
//! - The index and the node-wide counts ([`UserCounts`], one per worker, read by
//!   `Mailboxes::user_connections`) change together, at join and leave only (never on
//!   the fan-out path); the count's lock is per worker, so a connect takes an
//!   uncontended lock and only a REST read of a user's state touches them all.
//! - A server-side unsubscribe leaves the registry (and the presence hub) in one
//!   synchronous step, so no broadcast handled after it reaches the connection on that
//!   channel; the session forgets the channel (and its grant) the next time it runs
//!   ([`UserConn::take_removed`]), as it does with a grant the expiry timer ended.
//! - `removed` holds only channels the connection held or had a join of still waiting
//!   (which the session counts as its own), each once: an idle connection's list is
//!   bounded by its subscriptions, whatever names the REST call is given.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex, PoisonError};

use super::registry::Unsubscribed;
use super::Shard;
use crate::close::Disconnect;
use crate::dialect::Dialect;
use crate::ws::conn::WsConn;

/// What ending a user's access does to each of that user's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserEnd {
    /// Close with 4010 `disconnected` (Pusher: `pusher:error` 4009, then close 4009, as
    /// Pusher's `terminate_connections` does; pusher-js does not reconnect).
    Disconnect,
    /// Leave this channel: native connections get
    /// `{"type":"unsubscribed","channel":c,"reason":"server"}`; Pusher connections just
    /// stop receiving it (Pusher's protocol has no frame for it).
    Unsubscribe(Arc<str>),
}

/// One connection's user on this worker, shared by its session and the worker's index.
pub(crate) struct UserConn {
    pub(crate) project: u32,
    pub(crate) user: Arc<str>,
    conn_id: u64,
    conn: Weak<WsConn>,
    /// Channels the server unsubscribed this connection from, for its session to forget.
    removed: RefCell<Vec<Arc<str>>>,
}

impl UserConn {
    /// The channels the server took from this connection since the last call.
    pub(crate) fn take_removed(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut *self.removed.borrow_mut())
    }

    /// Whether the server took a channel from this connection that its session has not
    /// forgotten yet (one borrow; no allocation).
    pub(crate) fn has_removed(&self) -> bool {
        !self.removed.borrow().is_empty()
    }
}

/// This worker's connections with a user: project → user → connections.
#[derive(Default)]
pub(super) struct Users {
    map: HashMap<u32, HashMap<Arc<str>, Vec<Rc<UserConn>>>>,
    len: usize,
}

/// One worker's count of connections per (project, user), readable from any thread
/// (`Mailboxes::user_connections`). Written only by its worker.
#[derive(Default)]
pub(crate) struct UserCounts(Mutex<HashMap<u32, HashMap<Arc<str>, u32>>>);

impl UserCounts {
    fn add(&self, project: u32, user: &Arc<str>, delta: i32) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let users = map.entry(project).or_default();
        let n = users.entry(user.clone()).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            users.remove(user);
            if users.is_empty() {
                map.remove(&project);
            }
        }
    }

    /// Connections of `user` in project `project` on this worker.
    pub(crate) fn get(&self, project: u32, user: &str) -> u32 {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&project)
            .and_then(|users| users.get(user))
            .copied()
            .unwrap_or(0)
    }
}

impl Shard {
    /// `conn` is `user`'s in project `project` from now on: index and count it. The
    /// session keeps the result and gives it back to [`Shard::user_leave`].
    pub(crate) fn user_join(
        &self,
        project: u32,
        user: Arc<str>,
        conn: &Rc<WsConn>,
    ) -> Rc<UserConn> {
        let entry = Rc::new(UserConn {
            project,
            user: user.clone(),
            conn_id: conn.id,
            conn: Rc::downgrade(conn),
            removed: RefCell::default(),
        });
        self.mailbox.users.add(project, &user, 1);
        let mut users = self.users.borrow_mut();
        users
            .map
            .entry(project)
            .or_default()
            .entry(user)
            .or_default()
            .push(entry.clone());
        users.len += 1;
        let n = users.len;
        crate::metrics::with(|m| m.set_user_connections(n));
        entry
    }

    /// The connection of `entry` has no user here any more (it ended).
    pub(crate) fn user_leave(&self, entry: &UserConn) {
        let mut users = self.users.borrow_mut();
        let Some(project) = users.map.get_mut(&entry.project) else {
            return;
        };
        let Some(conns) = project.get_mut(&*entry.user) else {
            return;
        };
        let Some(pos) = conns.iter().position(|c| c.conn_id == entry.conn_id) else {
            return;
        };
        conns.swap_remove(pos);
        if conns.is_empty() {
            project.remove(&*entry.user);
            if project.is_empty() {
                users.map.remove(&entry.project);
            }
        }
        users.len -= 1;
        let n = users.len;
        drop(users);
        self.mailbox.users.add(entry.project, &entry.user, -1);
        crate::metrics::with(|m| m.set_user_connections(n));
    }

    /// Connections with a user on this worker.
    #[cfg(test)]
    pub(crate) fn user_connections(&self) -> usize {
        self.users.borrow().len
    }

    /// End `user`'s access on this worker (an `EndUser` envelope).
    pub(super) fn end_user(&self, project: u32, user: &str, end: &UserEnd) {
        // A snapshot: closing and unsubscribing must not run under the index's borrow.
        let conns: Vec<Rc<UserConn>> = match self
            .users
            .borrow()
            .map
            .get(&project)
            .and_then(|users| users.get(user))
        {
            Some(conns) => conns.clone(),
            None => return,
        };
        for entry in conns {
            let Some(conn) = entry.conn.upgrade() else {
                continue;
            };
            match end {
                UserEnd::Disconnect => {
                    if conn.dialect() == Dialect::Pusher {
                        // What Pusher sends before its 4009 close (soketi and Pusher's
                        // own servers alike); the close itself is translated by dialect.
                        conn.send(crate::wire::pusher::error(
                            Some(crate::close::code::PUSHER_TERMINATED),
                            "You got disconnected by the app.",
                        ));
                    }
                    conn.close(Disconnect::USER_DISCONNECTED);
                }
                UserEnd::Unsubscribe(channel) => {
                    let (t, cancelled) = self.leave(project, channel, entry.conn_id);
                    if t == Unsubscribed::NotSubscribed && !cancelled {
                        // Neither held nor joining: nothing to tell, nothing for the
                        // session to forget (an idle connection must not collect
                        // every name the REST call is given).
                        continue;
                    }
                    // A join still waiting (history from Redis, presence from the hub)
                    // is the session's channel too: told and forgotten as a held one.
                    let mut removed = entry.removed.borrow_mut();
                    if !removed.contains(channel) {
                        removed.push(channel.clone());
                    }
                    drop(removed);
                    if conn.dialect() == Dialect::Native {
                        conn.send(crate::wire::native::unsubscribed_with_reason(
                            channel, "server",
                        ));
                    }
                }
            }
        }
    }
}
