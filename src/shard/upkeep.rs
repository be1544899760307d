//! A worker's upkeep of its shard, outside any one connection: the mailbox drain loop,
//! the send-budget watch (closing the largest queues with 4008 first), the revocation
//! sweep, the heartbeat pass and shutdown. Each runs on the worker that owns the shard;
//! none blocks, and each pass walks the worker's connections at most once.

use super::*;

impl Shard {
    /// The drain loop: wake on the doorbell, drain the whole mailbox, repeat.
    pub(crate) async fn run_mailbox(self: Rc<Self>) {
        let mailbox = self.mailbox.clone();
        loop {
            mailbox.ready().await;
            self.drain();
        }
    }

    /// The budget loop: whenever this worker's WebSocket queues together hold more than
    /// `worker_send_budget_bytes`, close the largest ones with 4008 until they hold no
    /// more than the budget. Closing a slow consumer frees its queue at once.
    pub(crate) async fn run_budget(self: Rc<Self>) {
        let backlog = self.backlog.clone();
        loop {
            backlog.over_budget().await;
            self.shed();
        }
    }

    /// Close the connections holding the most against the budget until it holds.
    /// Runs only when over the budget: the sort is never on the fan-out path.
    pub(crate) fn shed(&self) {
        let mut heavy: Vec<_> = self
            .members
            .borrow()
            .iter()
            .filter(|m| m.conn.is_open() && m.conn.charged_bytes() > 0)
            .map(|m| m.conn.clone())
            .collect();
        heavy.sort_unstable_by_key(|c| std::cmp::Reverse(c.charged_bytes()));
        let mut closed = 0usize;
        for conn in heavy {
            if self.backlog.total() <= self.backlog.budget() {
                break;
            }
            conn.close(Disconnect::SLOW_CONSUMER);
            closed += 1;
        }
        tracing::warn!(
            worker = self.index,
            closed,
            budget = self.backlog.budget(),
            "worker send budget exceeded: closed the largest queues with 4008"
        );
    }

    /// Close every local connection whose key is no longer active, and every Pusher
    /// connection of a project whose Pusher switch is now off.
    pub(crate) fn enforce_revocations(&self) {
        // Key ids no member holds any more (their connections ended since the last
        // sweep): forget them, so rotating keys does not grow the set.
        self.key_ids.borrow_mut().retain(|id| id.held());
        let snapshot = self.keys.load();
        let revoked: Vec<_> = self
            .members
            .borrow()
            .iter()
            .filter(|m| {
                m.conn.is_open()
                    && (!snapshot.is_active(m.key_id.as_str())
                        || m.pusher.as_ref().is_some_and(|p| !p.pusher_enabled()))
            })
            .map(|m| m.conn.clone())
            .collect();
        for conn in revoked {
            conn.close(Disconnect::KEY_REVOKED);
        }
    }

    /// One heartbeat tick: ping connections quiet for a period, close those silent for
    /// three. One pass per worker per period (not a timer per connection) keeps idle
    /// connections small.
    pub(crate) fn heartbeat(&self, period: Duration) {
        let period = period.as_secs().max(1);
        let now = self.clock();
        let conns = self.websocket_list();
        let ping = frame::frame(Opcode::Ping, &[]);
        for conn in conns {
            let silent = u64::from(now.saturating_sub(conn.last_seen()));
            if silent >= 3 * period {
                conn.close(Disconnect::HEARTBEAT_TIMEOUT);
            } else if silent >= period {
                conn.send_shared(&ping);
            }
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_set()
    }

    /// Stop accepting and close every WebSocket with 1001 after what is queued.
    pub(crate) fn begin_shutdown(&self) {
        if !self.stop.set() {
            return;
        }
        // Spread over `drain_spread_s`, so clients do not all reconnect at once.
        let conns = self.websocket_list();
        crate::admission::drain::spread(conns, |conn| conn.close(Disconnect::SHUTDOWN));
    }

    /// Resolves once shutdown began.
    pub(crate) fn stopped(&self) -> stop::Wait<'_> {
        self.stop.wait()
    }
}
