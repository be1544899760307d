//! What every session of one worker shares: the shard (and through it the presence
//! hub), the expiry timer of private subscriptions, the client-event relay and the
//! subscribe admission. One `Rc` per worker, so a session carries 8 bytes for them
//! instead of a handle each (issue 21: an idle connection's bytes).

use std::rc::Rc;

use crate::shard::Shard;
use crate::ws::conn::ReadCtx;

use super::admit::Admission;
use super::events::EventContext;
use super::private::Expiry;

/// The worker-wide parts of a client session (native and Pusher).
pub(crate) struct SessionCtx {
    pub(crate) shard: Rc<Shard>,
    /// The worker's expiry timer of private subscriptions (native sessions only).
    pub(crate) expiry: Rc<Expiry>,
    /// The worker's client-event relay and id source.
    pub(crate) events: Rc<EventContext>,
    /// The worker's subscribe admission (rate, verified tokens, subscription limit).
    pub(crate) admission: Rc<Admission>,
    /// The worker's reader knobs and clock (`Session::read_ctx`).
    pub(crate) read: ReadCtx,
}

impl SessionCtx {
    pub(crate) fn new(
        shard: Rc<Shard>,
        expiry: Rc<Expiry>,
        events: Rc<EventContext>,
        admission: Rc<Admission>,
        read: ReadCtx,
    ) -> Rc<SessionCtx> {
        Rc::new(SessionCtx {
            shard,
            expiry,
            events,
            admission,
            read,
        })
    }
}
