//! A worker's share of the fan-out: its mailbox ([`mailbox`], the only cross-core
//! path), its subscription table ([`registry`]) and the drain loop that connects them.
//!
//! Invariants: a broadcast is looked up once per worker and its one `Bytes` frame is
//! handed to each local subscriber by reference count; nothing is allocated or copied
//! per subscriber, and a full or slow subscriber never delays the others (its own
//! bounded queue decides, see `ws::conn`).

pub mod interest;
pub mod mailbox;
pub mod registry;

use std::rc::Rc;

use crate::server::worker::Worker;
use crate::ws::conn::CLOSE_REVOKED;

use mailbox::{Broadcast, Envelope};
use registry::Registry;

/// Deliver one broadcast to this worker's subscribers of its channel. Returns how
/// many connections took the frame.
pub fn fan_out(registry: &Registry, msg: &Broadcast) -> usize {
    let Some(subs) = registry.subscribers(msg.project, &msg.channel) else {
        return 0;
    };
    let mut delivered = 0;
    for conn in subs.values() {
        if conn.send(msg.frame.clone()) {
            delivered += 1;
        }
    }
    delivered
}

/// Close every local connection whose key is no longer active.
pub fn enforce_revocations(worker: &Worker) {
    let snapshot = worker.shared.keys.load();
    let conns: Vec<_> = worker.conns.borrow().values().cloned().collect();
    for conn in conns {
        if conn.is_open() && !snapshot.is_active(&conn.meta.key_id) {
            conn.close(CLOSE_REVOKED, "key revoked");
        }
    }
}

/// Take and handle everything in the worker's mailbox now; returns how many envelopes.
///
/// Called by the drain loop below, and also by busy connection tasks: monoio handles
/// wake-ups from other threads only when its local run queue empties, so a worker kept
/// busy by its own HTTP traffic would otherwise leave its mailbox (fed by the other
/// cores) undrained until it fills. Draining here is safe: fan-out is synchronous and
/// never awaits.
pub fn drain(worker: &Worker) -> usize {
    let mut n = 0;
    while let Some(envelope) = worker.mailbox.try_recv() {
        n += 1;
        match envelope {
            Envelope::Broadcast(msg) => {
                fan_out(&worker.registry.borrow(), &msg);
            }
            Envelope::KeysChanged => enforce_revocations(worker),
            Envelope::Shutdown => worker.begin_shutdown(),
        }
    }
    n
}

/// The drain loop: wake on the doorbell, drain the whole mailbox, repeat.
pub async fn run_mailbox(worker: Rc<Worker>) {
    let mailbox = worker.mailbox.clone();
    loop {
        mailbox.ready().await;
        drain(&worker);
    }
}
