//! What one worker's HTTP side holds: the node it belongs to, its own shard, and the
//! per-worker scratch of the publish path (the simd-json parser and the id generator,
//! shared with client events), and the worker's expiry timer of private subscriptions.
//!
//! Made once per worker by the server and shared by that worker's connection tasks
//! through an `Rc`: nothing here crosses cores.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use crate::client::{Admission, EventContext, Expiry, SessionCtx};
use crate::config::Config;
use crate::ids::IdGen;
use crate::node::Node;
use crate::publish::PublishParser;
use crate::shard::Shard;
use crate::ws::conn::{ReadCtx, ReadLimits};

pub(crate) struct Service {
    pub node: Arc<Node>,
    pub shard: Rc<Shard>,
    pub parser: RefCell<PublishParser>,
    pub ids: Rc<IdGen>,
    /// The worker's expiry timer of private subscriptions (its task runs in the worker).
    pub expiry: Rc<Expiry>,
    /// What every client session of the worker shares: the shard, the expiry timer,
    /// the client-event relay, the presence hub, and the subscribe admission (the
    /// per-connection rate and the cache of verified tokens).
    /// It also holds what every WebSocket reader of the worker shares (`read`: its
    /// limits, the worker's clock), once, not per connection.
    pub sessions: Rc<SessionCtx>,
}

impl Service {
    pub(crate) fn new(node: Arc<Node>, shard: Rc<Shard>) -> Service {
        let ids = Rc::new(IdGen::new(shard.index()));
        let events = EventContext::new(
            node.clone(),
            ids.clone(),
            shard.index(),
            node.config.max_body_bytes,
            Some(node.webhooks.clone()),
        );
        let admission = Admission::new(
            node.config.subscribe_rate_per_connection,
            node.config.max_subscriptions_per_connection,
        );
        let expiry = Expiry::new(shard.clone());
        let clock_shard = shard.clone();
        let read = ReadCtx {
            limits: ReadLimits {
                max_message: node.config.max_frame_bytes,
                max_fragments: node.config.max_fragments_per_message,
                pause_backlog: node.config.read_pause_bytes(),
            },
            clock: Box::new(move || clock_shard.clock()),
        };
        let sessions = SessionCtx::new(shard.clone(), expiry.clone(), events, admission, read);
        Service {
            sessions,
            node,
            expiry,
            shard,
            parser: RefCell::new(PublishParser::new()),
            ids,
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.node.config
    }
}
