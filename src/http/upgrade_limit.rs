//! `max_upgrades_per_second` at the WebSocket upgrade (native and Pusher): over the
//! node-wide rate the upgrade still completes its 101, and the connection is closed at
//! once, before any WebSocket state is made for it. Native clients get 1013 with the
//! reason `retry_after=<seconds>` (1 to 10, jittered: see `crate::admission::upgrades`);
//! Pusher clients get a `pusher:error` 4100 and the close 4100 (pusher-js reconnects
//! after its own delay), the way every Pusher refusal is sent.

use std::rc::Rc;

use super::outcome::Outcome;
use super::Service;
use crate::admission::upgrades;
use crate::close::{code, Dialect};
use crate::ws::frame::close_frame;
use crate::ws::handshake::write_switching;

/// `None`: the upgrade may go on. `Some`: it was answered (101, then the close).
pub(crate) fn over_rate(
    svc: &Rc<Service>,
    out: &mut Vec<u8>,
    ws_key: &[u8],
    dialect: Dialect,
) -> Option<Outcome> {
    let bucket = svc.node.upgrades.as_ref()?;
    let retry_after = bucket.admit().err()?;
    Some(match dialect {
        Dialect::Native => {
            write_switching(out, ws_key);
            let reason = upgrades::reason(retry_after);
            out.extend_from_slice(&close_frame(code::TRY_AGAIN_LATER, &reason));
            Outcome::Answered { close: true }
        }
        Dialect::Pusher => super::pusher_ws::refuse(
            out,
            ws_key,
            crate::close::Disconnect::PUSHER_OVER_CAPACITY,
        ),
    })
}
