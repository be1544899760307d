//! The quota thread (`ringcast-quota`): keeps every project's [`Lease`] on this node
//! topped up from the cluster-wide token bucket in Redis (see [`crate::quota::lease`]).
//!
//! Every [`TICK`] it looks at each project of the key snapshot: a project whose balance
//! fell under half a block gets one block requested through the atomic
//! [`LEASE_SCRIPT`] (or, when a batch larger than that was refused for want of tokens,
//! that batch's size: see [`Lease::wanted`]). Idle projects cost nothing. When Redis cannot be reached, every
//! lease goes offline (the local GCRA alone decides, so publishing keeps working) until
//! a request succeeds again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{connect, sleep_unless_stopped, Backoff, Cluster};
use crate::auth::KeyCache;
use crate::quota::lease::{block_size, Lease, LEASE_SCRIPT};
use crate::redis_link::PREFIX;

/// How often balances are checked. A busy project spends half a block in more than this
/// only above 5 × its per-second count per node, and then waits at most one tick.
pub(crate) const TICK: Duration = Duration::from_millis(20);

pub(crate) fn run(cluster: &Cluster, client: &redis::Client, keys: &KeyCache) {
    let script = redis::Script::new(LEASE_SCRIPT);
    let mut backoff = Backoff::new();
    let mut conn: Option<redis::Connection> = None;
    let mut leases: HashMap<String, Arc<Lease>> = HashMap::new();
    // Log transitions only: an outage is one warning when leasing fails and one when a
    // lease succeeds again, not a line per retry.
    let mut failing = false;
    while !cluster.stopping() {
        if conn.is_none() {
            match connect(client) {
                Ok(c) => {
                    conn = Some(c);
                    backoff.reset();
                }
                Err(_) => {
                    sleep_unless_stopped(cluster, backoff.next_delay());
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let snapshot = keys.load_full();
        let mut failed = false;
        for project in snapshot.projects() {
            let lease = match project.quota.lease() {
                Some(l) => Arc::clone(l),
                None => Arc::clone(project.quota.attach_lease(Arc::new(Lease::new()))),
            };
            leases.insert(project.id.clone(), Arc::clone(&lease));
            let limit = project.quota.limit();
            // A block, or what a refused batch wanted when more (never above the
            // limit: a larger batch is refused before it asks the lease).
            let wanted = lease.wanted().min(i64::from(limit.count));
            let block = block_size(limit).max(wanted);
            if lease.is_online() && lease.balance() * 2 >= block && lease.balance() >= wanted {
                continue;
            }
            let period_ms = limit.per.period_ns() / 1_000_000;
            let granted = script
                .key(format!("{PREFIX}quota:{}", project.id))
                .arg(limit.count)
                .arg(period_ms)
                .arg(block)
                .invoke::<i64>(c);
            match granted {
                Ok(n) => {
                    lease.grant(n);
                    lease.set_online(true);
                    if failing {
                        tracing::warn!("cluster quota: leasing from Redis again");
                        failing = false;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "cluster quota: cannot lease from Redis; local limits only");
                        failing = true;
                    }
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            conn = None;
            for lease in leases.values() {
                lease.set_online(false);
            }
            sleep_unless_stopped(cluster, backoff.next_delay());
            continue;
        }
        sleep_unless_stopped(cluster, TICK);
    }
}
