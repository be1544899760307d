//! The relay thread: local publishes → Redis PUBLISH, pipelined.
//!
//! It blocks on the relay queue, then takes everything already waiting (up to
//! [`MAX_BATCH`]) and sends it as one pipeline: under load one round trip carries
//! hundreds of messages; when idle a single message goes out at once (no batching
//! delay). While Redis is unreachable the queue is drained and dropped (counted), so
//! nothing stale is published minutes later when Redis returns.
//!
//! Project indexes are per process; the channel name in Redis needs the project *id*, so
//! the thread keeps an index → id table rebuilt whenever the key snapshot changes
//! (indexes are never reused, so a table entry never goes stale).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Receiver;

use super::{connect, next_batch, sleep_unless_stopped, wire, Backoff, Cluster, MAX_BATCH};
use crate::auth::KeyCache;
use crate::shard::mailbox::Broadcast;

pub(crate) use crate::auth::cache::ProjectIndex;

pub(crate) fn run(
    cluster: &Cluster,
    client: &redis::Client,
    keys: &KeyCache,
    rx: &Receiver<Arc<Broadcast>>,
) {
    let mut backoff = Backoff::new();
    let mut projects = ProjectIndex::new();
    let mut batch: Vec<Arc<Broadcast>> = Vec::with_capacity(MAX_BATCH);
    // Set once Redis was lost: its return is then a warning too, so that an operator
    // filtering on warnings sees both ends of an outage.
    let mut lost = false;
    while !cluster.stopping() {
        let mut conn = match connect(client).and_then(|mut c| {
            redis::cmd("PING").query::<()>(&mut c)?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                if cluster.outbound_ok.swap(false, Ordering::Relaxed) || !lost {
                    tracing::warn!(error = %e, "cluster relay: Redis unavailable");
                    lost = true;
                }
                drop_queued(cluster, rx);
                sleep_unless_stopped(cluster, backoff.next_delay());
                continue;
            }
        };
        if !cluster.outbound_ok.swap(true, Ordering::Relaxed) {
            if lost {
                tracing::warn!("cluster relay: Redis is back");
            } else {
                tracing::info!("cluster relay connected to Redis");
            }
            lost = false;
        }
        backoff.reset();
        if let Err(e) = relay_until_error(cluster, &mut conn, keys, rx, &mut projects, &mut batch) {
            cluster.outbound_ok.store(false, Ordering::Relaxed);
            tracing::warn!(error = %e, "cluster relay: Redis connection lost; reconnecting");
            lost = true;
            cluster
                .stats
                .relay_dropped
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.clear();
        }
    }
    cluster.outbound_ok.store(false, Ordering::Relaxed);
}

fn drop_queued(cluster: &Cluster, rx: &Receiver<Arc<Broadcast>>) {
    let mut n = 0u64;
    while rx.try_recv().is_ok() {
        n += 1;
    }
    cluster.stats.relay_dropped.fetch_add(n, Ordering::Relaxed);
}

fn relay_until_error(
    cluster: &Cluster,
    conn: &mut redis::Connection,
    keys: &KeyCache,
    rx: &Receiver<Arc<Broadcast>>,
    projects: &mut ProjectIndex,
    batch: &mut Vec<Arc<Broadcast>>,
) -> redis::RedisResult<()> {
    let node = cluster.node_id();
    while !cluster.stopping() {
        if !next_batch(conn, rx, batch)? {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for msg in batch.iter() {
            let Some(project) = projects.get(keys, msg.project) else {
                continue;
            };
            pipe.cmd("PUBLISH")
                .arg(wire::redis_channel(&project.id, &msg.channel))
                .arg(match msg.except {
                    // A connection of another node: that node must leave it out.
                    Some(except) if !except.is_here() => {
                        wire::encode_payload_except(node, except, &msg.frame)
                    }
                    _ => wire::encode_payload(node, &msg.frame),
                })
                .ignore();
        }
        if !pipe.is_empty() {
            pipe.query::<()>(conn)?;
        }
        cluster
            .stats
            .relayed
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch.clear();
    }
    Ok(())
}
