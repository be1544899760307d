//! `GET /app/{key}`: the Pusher protocol's WebSocket upgrade.
//!
//! A request that is not a valid WebSocket upgrade is answered in HTTP as on
//! `/api/v1/ws` (no Pusher client sends one). Every other refusal is made after the
//! 101, in band: pusher-js treats an HTTP refusal as a broken transport and retries it
//! forever, while a `pusher:error` frame and a close code tell it what to do. The order
//! of checks: `protocol` (5 to 7; absent means 7) → 4007; the server stopping → 4200;
//! the per-IP connect rate → 4100; the key (an active public key) and the project's
//! Pusher switch → 4001; `max_upgrades_per_second` → 4100; the project's connection
//! limit → 4100. A refused upgrade's
//! bytes (101, the error frame, the close frame) are one HTTP answer after which the
//! socket is closed: no WebSocket state is ever made for it.

use super::outcome::{answer, Outcome, Request};
use super::parse::query_param;
use super::upgrade::validate;
use crate::apikey::KeyKind;
use crate::close::Disconnect;
use crate::dialect::Dialect;
use crate::wire::pusher as pusher_frame;
use crate::ws::frame::close_frame;
use crate::ws::handshake::write_switching;

/// Protocol versions whose frames are the ones we send (5 and 6 differ from 7 only in
/// what they ignore).
const PROTOCOLS: std::ops::RangeInclusive<u32> = 5..=7;

pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>, key: &[u8]) -> Outcome {
    let svc = r.svc;
    let ws_key = match validate(r.head, r.bytes) {
        Ok(k) => k,
        Err(err) => return answer(out, err),
    };
    let protocol = query_param(r.query(), b"protocol");
    let protocol_ok = match protocol {
        None => true,
        Some(p) => std::str::from_utf8(p)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|p| PROTOCOLS.contains(&p)),
    };
    if !protocol_ok {
        return refuse(out, ws_key, Disconnect::PUSHER_BAD_PROTOCOL);
    }
    if svc.shard.is_stopping() {
        return refuse(out, ws_key, Dialect::Pusher.translate(Disconnect::SHUTDOWN));
    }
    if let (Some(rate), Some(ip)) = (&svc.node.connect_rate, r.peer) {
        if !rate.admit(ip) {
            return refuse(out, ws_key, Disconnect::PUSHER_OVER_CAPACITY);
        }
    }
    let keys = svc.node.keys.load();
    let entry = match keys.authenticate(Some(key), KeyKind::Public) {
        Ok(entry) if entry.project.pusher_enabled() => entry,
        _ => return refuse(out, ws_key, Disconnect::PUSHER_APP_REFUSED),
    };
    if super::upgrade_limit::over_rate(svc).is_some() {
        return refuse(out, ws_key, Disconnect::PUSHER_OVER_CAPACITY);
    }
    // Pusher has no connection token: its connections sign in (`pusher:signin`).
    super::upgrade::switch(r, out, ws_key, entry, Dialect::Pusher, None)
        .unwrap_or_else(|| refuse(out, ws_key, Disconnect::PUSHER_OVER_CAPACITY))
}

/// The 101, then `pusher:error` with the close's code and reason, then the close frame;
/// the connection ends once they are written.
fn refuse(out: &mut Vec<u8>, ws_key: &[u8], why: Disconnect) -> Outcome {
    write_switching(out, ws_key);
    out.extend_from_slice(&pusher_frame::error(Some(why.code), why.reason));
    out.extend_from_slice(&close_frame(why.code, why.reason));
    Outcome::Answered { close: true }
}
