//! What every worker of one node shares: the configuration, the key snapshot, the
//! mailboxes of all workers, the cluster bridge, and the node's health flags.
//!
//! Read-mostly; nothing here is locked on the hot path. A [`Node`] is made once by the
//! server at start and handed to every worker behind an `Arc`. It is what an accepted
//! publish or client event asks of its node ([`Fanout`]: the mailboxes, the relay, the
//! history backend); the hand-over itself is `publish`'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::auth::KeyCache;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::history::backend::Backend;
use crate::history::History;
use crate::publish::Fanout;
use crate::shard::mailbox::{Mailboxes, Relay};
use crate::webhook::Webhooks;

pub(crate) struct Node {
    pub config: Config,
    pub keys: Arc<KeyCache>,
    pub mailboxes: Mailboxes,
    /// Cluster mode's Redis bridge; `None` on a single node. Its `is_ok` is the
    /// `"cluster"` health check.
    pub cluster: Option<Arc<Cluster>>,
    /// Set once at SIGTERM/SIGINT; publishes and upgrades are refused from then on.
    pub shutting_down: AtomicBool,
    /// Whether the key store answered on its last check.
    pub db_ok: Arc<AtomicBool>,
    /// This node's channel history (where a single node assigns offsets; in cluster
    /// mode it keeps nothing, and serves no recovery, but the shards ask it for
    /// nothing then either).
    pub history: Arc<History>,
    /// Where history lives, chosen once at start: [`Node::history`] on a single node,
    /// Redis (the cluster bridge) in cluster mode.
    pub backend: Arc<dyn Backend>,
    /// Metrics are served (`metrics_listen`): time each publish for the histogram.
    /// Counters are kept either way (the logs' slow-consumer summary reads them).
    pub metrics_timing: bool,
    /// The node's presence and occupancy hub (its own thread).
    pub presence: Arc<crate::presence::Hub>,
    /// `ws_connect_rate_per_ip`; `None` when off (the default).
    pub connect_rate: Option<crate::quota::connect_rate::ConnectRate>,
    /// `max_upgrades_per_second`; `None` when off.
    pub upgrades: Option<crate::admission::upgrades::UpgradeBucket>,
    /// `trusted_proxies` (empty: no peer is trusted).
    pub trusted: crate::admission::trusted::TrustedProxies,
    /// The webhook sender: `emit` from any thread (client events on the workers,
    /// occupancy and presence transitions from the control plane).
    pub webhooks: Arc<Webhooks>,
}

impl Node {
    pub(crate) fn is_shutting_down(&self) -> bool {
        // Acquire pairs with the SeqCst store at shutdown. Nothing orders a publish that
        // saw `false` here before the Shutdown envelopes: it may queue its envelope
        // behind them, and is then delivered only if the worker drains it before its
        // WebSockets are closed. A 202 answered while shutdown begins is best-effort
        // (RELIABILITY.md).
        self.shutting_down.load(Ordering::Acquire)
    }
}

impl Fanout for Node {
    fn mailboxes(&self) -> &Mailboxes {
        &self.mailboxes
    }

    fn relay(&self) -> Option<&dyn Relay> {
        self.cluster.as_deref().map(|c| c as &dyn Relay)
    }

    fn shutting_down(&self) -> bool {
        self.is_shutting_down()
    }

    fn history(&self) -> &dyn Backend {
        &*self.backend
    }
}
