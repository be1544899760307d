//! What the store keeps about a project's users: blocks (a user refused until a time or
//! for ever) and "end" records (a disconnect or a server-side unsubscribe that every
//! node applies to its own connections of that user).
//!
//! Plain data, like the rest of [`crate::project`]. Invariants every store keeps:
//! - A user id is 1 to [`MAX_USER_ID_CHARS`] characters (checked by [`valid_user_id`]
//!   before anything is stored or looked up).
//! - A block past its `until` is treated as absent everywhere: reads leave it out, and
//!   a store drops it at the next block of the same project.
//! - End records are short-lived: a node applies only those younger than
//!   [`END_MAX_AGE_S`] (an old disconnect must never close a connection made since),
//!   and a store keeps at most [`MAX_STORED_ENDS`] of them.

/// Longest user id, in characters (the contract's bound on `sub`).
pub(crate) const MAX_USER_ID_CHARS: usize = 200;

/// How old an end record may be and still be applied by a node (seconds).
pub(crate) const END_MAX_AGE_S: i64 = 5;

/// Most end records a store keeps (older ones are dropped as new ones come).
pub(crate) const MAX_STORED_ENDS: usize = 10_000;

/// Most end records one watcher poll reads.
pub(crate) const ENDS_PER_READ: usize = 1_000;

/// This process's origin id on the end records it writes: random, never 0 (the admin
/// CLI's), the same for the process's whole life.
pub(crate) fn process_origin() -> u64 {
    static ORIGIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(|| loop {
        let n: u64 = rand::random();
        if n != 0 {
            break n;
        }
    })
}

/// Whether `user` is a user id the contract allows: 1 to 200 characters, no control
/// characters (it is printed in logs, terminals and JSON).
/// The latest `until` a block takes (the last second of the year 9999: every client
/// language represents it exactly; REST and the CLI both refuse later ones).
pub(crate) const MAX_UNTIL: i64 = 253_402_300_799;

pub(crate) fn valid_user_id(user: &str) -> bool {
    !user.is_empty()
        && user.chars().count() <= MAX_USER_ID_CHARS
        && !user.chars().any(char::is_control)
}

/// A user of a project refused until `until` (unix seconds) or, with `None`, for ever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserBlockRecord {
    pub project_id: String,
    pub user_id: String,
    pub until: Option<i64>,
}

impl UserBlockRecord {
    /// Whether the block still holds at `now` (unix seconds).
    pub fn holds_at(&self, now: i64) -> bool {
        self.until.is_none_or(|until| until > now)
    }
}

/// One end of a user's access, for every node to apply to its own connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserEndRecord {
    /// Order of writing, given by the store (0 before it is stored).
    pub seq: u64,
    pub project_id: String,
    pub user_id: String,
    /// `None`: disconnect every connection of the user; `Some(c)`: unsubscribe them
    /// from channel `c`.
    pub channel: Option<String>,
    /// Which process wrote it (a server that already applied it locally skips it; the
    /// admin CLI writes 0).
    pub origin: u64,
    /// Unix seconds when it was written.
    pub created_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids() {
        assert!(valid_user_id("u"));
        assert!(valid_user_id(&"é".repeat(200)));
        assert!(!valid_user_id(&"é".repeat(201)));
        assert!(!valid_user_id(""));
        assert!(!valid_user_id("a\nb"));
    }

    #[test]
    fn a_block_holds_until_its_time() {
        let mut b = UserBlockRecord {
            project_id: "p".into(),
            user_id: "u".into(),
            until: Some(10),
        };
        assert!(b.holds_at(9));
        assert!(!b.holds_at(10));
        b.until = None;
        assert!(b.holds_at(i64::MAX));
    }
}
