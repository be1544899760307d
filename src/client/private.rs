//! Private channels on one worker: which channels need a token ([`needs_token`]), the
//! grant a verified token gives one connection on one channel ([`Grant`]), and the
//! per-worker expiry timer ([`Expiry`]) that ends a subscription at `exp + 5 s` unless a
//! `refresh` moved its `exp`.
//!
//! Invariants:
//! - The fan-out never looks at a clock or a grant: a private subscription is an
//!   ordinary registry entry, and expiry removes it. The only per-grant costs are at
//!   subscribe, refresh, unsubscribe and expiry (an ordered-map insert or removal).
//! - A connection token's deadline (`client::user`) is a grant of the empty channel
//!   ([`crate::auth::token::CONNECTION`]): at it the connection closes with 4011.
//! - One timer per worker (an ordered map of deadlines and one task sleeping until the
//!   earliest), never one per subscription.
//! - An expired grant is unsubscribed and answered `unsubscribed` + `token_expired` in
//!   one synchronous step on the worker, so no broadcast handled after it reaches the
//!   connection on that channel. The session notices the ended grant (`ended`) the next
//!   time it handles a frame.
//! - Every armed deadline belongs to a live grant: unsubscribe, connection end and
//!   refresh disarm it, so the map holds at most one entry per private subscription.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::auth::token::LEEWAY_S;
use crate::close::Disconnect;
use crate::shard::registry::Unsubscribed;
use crate::shard::Shard;
use crate::ws::conn::WsConn;

use crate::wire::native::unsubscribed_with_reason;

/// Channels whose subscribers need a token signed by the application (`presence-`
/// channels are private channels too).
pub(crate) fn needs_token(channel: &str) -> bool {
    channel.starts_with("private-") || channel.starts_with("presence-")
}

/// Unix seconds now (read once per subscribe or refresh, never per message).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Where a grant sits in the timer: its deadline and a tie-breaking sequence number.
type Slot = (Instant, u64);

/// One connection's right to one private channel, until `exp + LEEWAY_S`.
pub(crate) struct Grant {
    project: u32,
    pub(crate) channel: Box<str>,
    conn_id: u64,
    conn: Weak<WsConn>,
    /// The `sub` of the token that opened it; a refresh may not change it.
    pub(crate) sub: Option<Box<str>>,
    exp: Cell<u64>,
    slot: Cell<Option<Slot>>,
    /// Set when the timer ended the subscription (or the session dropped it).
    ended: Cell<bool>,
}

impl Grant {
    pub(crate) fn new(
        project: u32,
        channel: &str,
        conn: &Rc<WsConn>,
        sub: Option<String>,
        exp: u64,
    ) -> Rc<Grant> {
        Rc::new(Grant {
            project,
            channel: channel.into(),
            conn_id: conn.id,
            conn: Rc::downgrade(conn),
            sub: sub.map(String::into_boxed_str),
            exp: Cell::new(exp),
            slot: Cell::new(None),
            ended: Cell::new(false),
        })
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.get()
    }

    pub(crate) fn exp(&self) -> u64 {
        self.exp.get()
    }
}

/// The per-worker expiry timer of private subscriptions.
pub(crate) struct Expiry {
    shard: Rc<Shard>,
    deadlines: RefCell<BTreeMap<Slot, Weak<Grant>>>,
    next_seq: Cell<u64>,
    /// Set when an earlier deadline was armed while the task slept.
    woken: Cell<bool>,
    task: Cell<Option<Waker>>,
}

impl Expiry {
    pub(crate) fn new(shard: Rc<Shard>) -> Rc<Expiry> {
        Rc::new(Expiry {
            shard,
            deadlines: RefCell::new(BTreeMap::new()),
            next_seq: Cell::new(0),
            woken: Cell::new(false),
            task: Cell::new(None),
        })
    }

    /// The worker-clock instant of `exp + LEEWAY_S` (unix seconds).
    fn deadline(exp: u64) -> Instant {
        let now = Instant::now();
        // `exp` comes from a token: an absurd one (year 10^11) must not overflow.
        let far = now + Duration::from_secs(1 << 32);
        let Some(end) = UNIX_EPOCH.checked_add(Duration::from_secs(exp.saturating_add(LEEWAY_S)))
        else {
            return far;
        };
        match end.duration_since(SystemTime::now()) {
            Ok(left) => now.checked_add(left).map_or(far, |at| at.min(far)),
            Err(_) => now,
        }
    }

    /// Arm (or re-arm, after a refresh) the grant's deadline from its `exp`.
    pub(crate) fn arm(&self, grant: &Rc<Grant>, exp: u64) {
        self.disarm(grant);
        grant.exp.set(exp);
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        let slot = (Self::deadline(exp), seq);
        let mut deadlines = self.deadlines.borrow_mut();
        let earliest = deadlines.keys().next().is_none_or(|first| slot < *first);
        deadlines.insert(slot, Rc::downgrade(grant));
        grant.slot.set(Some(slot));
        drop(deadlines);
        if earliest {
            self.woken.set(true);
            if let Some(w) = self.task.take() {
                w.wake();
            }
        }
    }

    /// Forget the grant's deadline (unsubscribe, connection end, before a re-arm).
    pub(crate) fn disarm(&self, grant: &Grant) {
        if let Some(slot) = grant.slot.take() {
            self.deadlines.borrow_mut().remove(&slot);
        }
    }

    /// End a grant that never went live (its presence join was refused): the session
    /// prunes it, and its channel, on its next frame.
    pub(crate) fn end(&self, grant: &Grant) {
        self.disarm(grant);
        grant.ended.set(true);
    }

    /// End every grant whose deadline is at or before `now`: unsubscribe it and tell
    /// the client. Returns how many ended.
    pub(crate) fn fire_due(&self, now: Instant) -> usize {
        let mut ended = 0;
        loop {
            let due = {
                let mut deadlines = self.deadlines.borrow_mut();
                match deadlines.first_key_value() {
                    Some((slot, _)) if slot.0 <= now => deadlines.pop_first(),
                    _ => None,
                }
            };
            let Some((_, grant)) = due else {
                return ended;
            };
            let Some(grant) = grant.upgrade() else {
                continue;
            };
            grant.slot.set(None);
            if grant.ended.replace(true) {
                continue;
            }
            ended += 1;
            if grant.channel.is_empty() {
                // A connection token's deadline (`client::user`): the connection ends.
                if let Some(conn) = grant.conn.upgrade() {
                    conn.close(Disconnect::TOKEN_EXPIRED);
                }
                continue;
            }
            let (left, cancelled) = self
                .shard
                .leave(grant.project, &grant.channel, grant.conn_id);
            // A channel the server took already (`shard::users`) was answered then; a
            // join still waiting (history from Redis, presence from the hub) is the
            // session's channel and is answered now.
            let held = left != Unsubscribed::NotSubscribed || cancelled;
            if let (true, Some(conn)) = (held, grant.conn.upgrade()) {
                conn.send(unsubscribed_with_reason(&grant.channel, "token_expired"));
            }
        }
    }

    /// Deadlines armed now (tests).
    #[cfg(test)]
    pub(crate) fn armed(&self) -> usize {
        self.deadlines.borrow().len()
    }

    /// The worker's timer task: sleep until the earliest deadline (or until an earlier
    /// one is armed), end what is due, repeat. With no private subscription it sleeps
    /// on its waker and costs nothing.
    pub(crate) async fn run(self: Rc<Self>) {
        loop {
            let next = self.deadlines.borrow().keys().next().map(|slot| slot.0);
            match next {
                None => self.armed_earlier().await,
                Some(at) => {
                    let now = Instant::now();
                    if at > now {
                        let this = self.clone();
                        monoio::select! {
                            _ = monoio::time::sleep(at - now) => {},
                            _ = this.armed_earlier() => {},
                        }
                    }
                    self.fire_due(Instant::now());
                }
            }
        }
    }

    /// Resolves once [`Expiry::arm`] armed a deadline earlier than every other.
    async fn armed_earlier(&self) {
        poll_fn(|cx| {
            if self.woken.replace(false) {
                return Poll::Ready(());
            }
            self.task.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::tests::shard;

    #[test]
    fn due_grants_end_once_and_refresh_moves_the_deadline() {
        let (shard, _m) = shard(None);
        let expiry = Expiry::new(shard.clone());
        let conn = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
        shard.subscribe(9, "private-a", &conn);
        shard.subscribe(9, "private-b", &conn);
        let now = unix_now();
        let a = Grant::new(9, "private-a", &conn, None, now);
        let b = Grant::new(9, "private-b", &conn, None, now);
        expiry.arm(&a, now);
        expiry.arm(&b, now);
        // b is refreshed: its first deadline is replaced, not kept beside the new one.
        expiry.arm(&b, now + 3600);
        assert_eq!(expiry.armed(), 2);
        assert_eq!(
            expiry.fire_due(Instant::now()),
            0,
            "exp + 5 s is not reached"
        );
        let later = Instant::now() + Duration::from_secs(LEEWAY_S + 2);
        assert_eq!(expiry.fire_due(later), 1);
        assert!(a.is_ended() && !b.is_ended());
        assert_eq!(shard.subscriber_count(9, "private-a"), 0);
        assert_eq!(shard.subscriber_count(9, "private-b"), 1);
        let frames = conn.take_queued();
        assert_eq!(frames.len(), 1);
        let v: serde_json::Value = serde_json::from_slice(&frames[0][2..]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type":"unsubscribed","channel":"private-a","reason":"token_expired"})
        );
        expiry.disarm(&b);
        assert_eq!(expiry.armed(), 0);
        assert_eq!(expiry.fire_due(later + Duration::from_secs(7200)), 0);
    }

    /// Review of issue 25: a grant whose join still waits at its deadline (a cluster
    /// history subscribe waiting for Redis, a presence join waiting for the hub) is
    /// ended as a held one: the join is cancelled and the client told `token_expired`.
    #[test]
    fn a_pending_join_at_its_deadline_is_told_token_expired() {
        use crate::shard::tests::{cancelled_presence, no_answer, shard_with};
        use crate::shard::tests::{HistorySink, SilentHub};
        use crate::shard::JoinRequest;
        use bytes::Bytes;
        use std::sync::Arc;
        let sink = Arc::new(HistorySink::default());
        let hub = Arc::new(SilentHub::default());
        let (shard, _m) = shard_with(Some(sink.clone()), Some(hub));
        let expiry = Expiry::new(shard.clone());
        let conn = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
        fn answer(_: &str, _: Option<(u64, &str)>, _: Option<bool>) -> Option<Bytes> {
            Some(Bytes::from_static(b"subscribed"))
        }
        let req = JoinRequest {
            project: 9,
            channel: "private-a",
            history: crate::history::HistorySpec::parse("10/60s").unwrap(),
            since: None,
            again: false,
            presence: None,
        };
        shard.join(&conn, req, answer);
        shard.join(&conn, cancelled_presence(9, "presence-b"), no_answer);
        assert_eq!(sink.0.lock().unwrap().len(), 1, "the join waits for Redis");
        let now = unix_now();
        let a = Grant::new(9, "private-a", &conn, None, now);
        let b = Grant::new(9, "presence-b", &conn, None, now);
        expiry.arm(&a, now);
        expiry.arm(&b, now);
        let later = Instant::now() + Duration::from_secs(LEEWAY_S + 2);
        assert_eq!(expiry.fire_due(later), 2);
        let mut told: Vec<serde_json::Value> = conn
            .take_queued()
            .iter()
            .map(|f| serde_json::from_slice(&f[2..]).unwrap())
            .collect();
        told.sort_by_key(|v| v["channel"].as_str().map(str::to_owned));
        assert_eq!(
            told,
            vec![
                serde_json::json!({"type":"unsubscribed","channel":"presence-b","reason":"token_expired"}),
                serde_json::json!({"type":"unsubscribed","channel":"private-a","reason":"token_expired"}),
            ]
        );
        assert_eq!(shard.subscriber_count(9, "private-a"), 0);
    }

    #[test]
    fn absurd_expiry_times_do_not_overflow() {
        let soon = Instant::now() + Duration::from_secs(10);
        assert!(Expiry::deadline(u64::MAX) > soon);
        assert!(Expiry::deadline(u64::MAX / 2) > soon);
        assert!(Expiry::deadline(0) <= Instant::now());
    }

    #[test]
    fn only_private_and_presence_channels_need_tokens() {
        assert!(needs_token("private-x"));
        assert!(needs_token("presence-room"));
        assert!(!needs_token("news"));
        assert!(!needs_token("Private-x"));
        assert!(!needs_token("xprivate-"));
    }
}
