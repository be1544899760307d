//! `max_upgrades_per_second` at the WebSocket upgrade (native and Pusher): over the
//! node-wide rate the upgrade still completes its 101, and the connection is closed at
//! once, before any WebSocket state is made for it. Native clients get 1013 with the
//! reason `retry_after=<seconds>` (1 to 10, jittered: see `crate::admission::upgrades`),
//! written here; Pusher clients get a `pusher:error` 4100 and the close 4100 (pusher-js
//! reconnects after its own delay), written by `pusher_ws` the way every Pusher refusal
//! is sent.

use std::rc::Rc;

use super::outcome::Outcome;
use super::Service;
use crate::admission::upgrades;
use crate::close::code;
use crate::ws::frame::close_frame;
use crate::ws::handshake::write_switching;

/// Take one upgrade from the node's bucket: `None` when it may go on (or the limit is
/// off), else the seconds the refused client is asked to wait.
pub(crate) fn over_rate(svc: &Rc<Service>) -> Option<u64> {
    let retry_after = svc.node.upgrades.as_ref()?.admit().err()?;
    crate::metrics::with(|m| m.upgrade_refused());
    Some(retry_after)
}

/// The native refusal: the 101, then the close 1013 `retry_after=<seconds>`; the
/// connection ends once they are written.
pub(crate) fn refuse_native(out: &mut Vec<u8>, ws_key: &[u8], retry_after: u64) -> Outcome {
    write_switching(out, ws_key);
    let reason = upgrades::reason(retry_after);
    out.extend_from_slice(&close_frame(code::TRY_AGAIN_LATER, &reason));
    Outcome::Answered { close: true }
}
