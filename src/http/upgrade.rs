//! `GET /api/v1/ws`: the WebSocket upgrade, and the start of the connection it becomes.
//!
//! The request must be a well-formed version-13 upgrade (else 400/405), the server not
//! shutting down (503), `?key=` an active public key (401, checked by the one key check
//! `KeySnapshot::authenticate`), the node under `max_upgrades_per_second` (else 101
//! then close 1013, `super::upgrade_limit`), and the project under its per-node
//! connection limit (503), and `?token=`, when given (or required by the project), a
//! valid connection token (401 `invalid_token`, `client::user`). Then the 101 answer is written and [`start`] hands the socket to the
//! transport (`ws::conn`) with the client protocol (`client::ClientSession`) on top,
//! registered with the worker's shard. The per-project slot and the worker's admission
//! guard live exactly as long as the connection's reader task.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::outcome::{answer, Outcome, Request, Upgrade};
use super::parse::{query_param, Method, RequestHead};
use super::transport::{Transport, WsIo};
use super::{ApiError, Service};
use crate::apikey::KeyKind;
use crate::auth::cache::KeyEntry;
use crate::auth::token::TokenRefusal;
use crate::auth::ProjectState;
use crate::client::user::ConnUser;
use crate::client::{connected_frame, NativeSession, PusherSession};
use crate::dialect::Dialect;
use crate::engine;
use crate::error::Unavailable;
use crate::ids::SocketId;
use crate::shard::{ConnGuard, ProjectSlot, Shard};
use crate::tls::TlsReader;
use crate::wire::pusher as pusher_frame;
use crate::ws::conn::{read_loop, start_parked, PlainWriter, ReadLimits, Session, WsConn, WsRead};
use crate::ws::deflate::negotiate;
use crate::ws::handshake::write_switching_with;

/// Check the upgrade request (RFC 6455 §4.2.1); returns the `Sec-WebSocket-Key` value.
pub fn validate<'a>(head: &RequestHead, buf: &'a [u8]) -> Result<&'a [u8], ApiError> {
    if head.method() != Method::Get {
        return Err(ApiError::MethodNotAllowed("GET"));
    }
    if !head.upgrade_websocket || !head.connection_upgrade {
        return Err(ApiError::BadRequest(
            "this endpoint needs a WebSocket upgrade (Upgrade: websocket, Connection: Upgrade)",
        ));
    }
    match &head.ws_version {
        Some(v) if &buf[v.clone()] == b"13" => {}
        _ => {
            return Err(ApiError::BadRequest(
                "unsupported Sec-WebSocket-Version (13 is required)",
            ))
        }
    }
    let key = head
        .ws_key
        .as_ref()
        .map(|r| &buf[r.clone()])
        .ok_or(ApiError::BadRequest("missing Sec-WebSocket-Key"))?;
    // A valid key is 16 random bytes in base64: 24 characters.
    if key.len() != 24 {
        return Err(ApiError::BadRequest("invalid Sec-WebSocket-Key"));
    }
    Ok(key)
}

pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>) -> Outcome {
    let svc = r.svc;
    let ws_key = match validate(r.head, r.bytes) {
        Ok(k) => k,
        Err(err) => return answer(out, err),
    };
    // Before the key is looked at: a flood of upgrades costs one counter each.
    if let (Some(rate), Some(ip)) = (&svc.node.connect_rate, r.peer) {
        if !rate.admit(ip) {
            return answer(out, ApiError::ConnectRateLimited);
        }
    }
    if svc.shard.is_stopping() {
        return answer(out, ApiError::Unavailable(Unavailable::ShuttingDown));
    }
    let raw_key = query_param(r.query(), b"key");
    let keys = svc.node.keys.load();
    let entry = match keys.authenticate(raw_key, KeyKind::Public) {
        Ok(entry) => entry,
        Err(refusal) => return answer(out, ApiError::Unauthorized(refusal)),
    };
    if let Some(retry_after) = super::upgrade_limit::over_rate(svc) {
        return super::upgrade_limit::refuse_native(out, ws_key, retry_after);
    }
    // After the node's upgrade rate (and the per-IP connect rate): each token checked
    // here took one of their units (and a repeat is a cache hit, `auth::verified`).
    let user = match connection_user(r, &entry.project) {
        Ok(user) => user,
        Err(why) => return answer(out, ApiError::InvalidToken(why)),
    };
    switch(r, out, ws_key, entry, Dialect::Native, user).unwrap_or_else(|| {
        answer(
            out,
            ApiError::Unavailable(Unavailable::ProjectConnectionLimit),
        )
    })
}

/// The last step of both upgrades (native and Pusher): the connection takes its place
/// under the project's per-node limit, and the 101 is written (with permessage-deflate
/// when agreed). `None` at the limit: nothing was written, the caller refuses in its
/// protocol's way.
pub(crate) fn switch(
    r: &Request<'_>,
    out: &mut Vec<u8>,
    ws_key: &[u8],
    entry: &KeyEntry,
    dialect: Dialect,
    user: Option<ConnUser>,
) -> Option<Outcome> {
    let project = &entry.project;
    let limit = project.connection_limit(r.svc.config().max_ws_connections_per_project);
    let slot = ProjectSlot::take(&project.ws_connections, limit)?;
    let deflate = agrees_to_deflate(r);
    write_switching_with(out, ws_key, deflate);
    Some(Outcome::Upgrade(Upgrade {
        project: Arc::clone(project),
        key_id: entry.key_id.as_str().into(),
        slot,
        dialect,
        deflate,
        user,
    }))
}

/// The user of the upgrade's connection token (`?token=`, contract 1.3), or `None`
/// without one (refused when the project requires a user). A JWT is base64url and dots:
/// it is taken as sent, with no percent-decoding to do.
fn connection_user(
    r: &Request<'_>,
    project: &ProjectState,
) -> Result<Option<ConnUser>, TokenRefusal> {
    let token = query_param(r.query(), b"token").filter(|t| !t.is_empty());
    let Some(token) = token else {
        return if crate::client::user::requires_user(project) {
            Err(TokenRefusal::UserRequired)
        } else {
            Ok(None)
        };
    };
    let token = std::str::from_utf8(token).map_err(|_| TokenRefusal::Malformed)?;
    crate::client::user::connection_token(&r.svc.sessions, project, token).map(Some)
}

/// Whether this upgrade (native or Pusher) gets permessage-deflate: `ws_compression` is
/// on, the client offers it in a form the server honours (`ws::deflate::negotiate`), and
/// it is not Safari 15.0–15.3 (which mishandles `client_no_context_takeover`).
/// The server window agreed (bits), or `None`.
pub(crate) fn agrees_to_deflate(r: &Request<'_>) -> Option<u8> {
    if !r.svc.config().ws_compression.is_on() {
        return None;
    }
    // No offer at all: nothing more to look at.
    r.head.ws_extensions.as_ref()?;
    let safari_15 = r
        .part(&r.head.user_agent)
        .is_some_and(negotiate::mishandles_no_context_takeover);
    if safari_15 {
        return None;
    }
    // Several headers are one list: the first acceptable offer of any of them.
    r.head
        .ws_extension_values(r.bytes)
        .find_map(negotiate::acceptable)
}

/// Run an upgraded connection: the pending HTTP answers (the 101 last) are its first
/// queued bytes, then the `connected` frame; it is registered with the shard before
/// anything is written (so revocation reaches it wherever it is); the writer started
/// (on plaintext it lasts only while there is something to write). The reader: on
/// plaintext a record parked in the worker's engine (no task while idle), on TLS a task
/// of its own. Either holds the session.
pub(crate) fn start<S: Transport>(
    svc: Rc<Service>,
    stream: S,
    upgrade: Upgrade,
    answers: Vec<u8>,
    leftover: Vec<u8>,
    guard: ConnGuard,
) {
    let cfg = svc.config();
    let shard = svc.shard.clone();
    let io = match stream.into_ws() {
        Ok(io) => io,
        Err(e) => {
            // Out of descriptors: the client sees the connection close.
            tracing::warn!("websocket: cannot take the socket over: {e}");
            return;
        }
    };
    let fd = match &io {
        WsIo::Plain(fd) => fd.as_raw_fd(),
        WsIo::Tls(fd, ..) => *fd,
    };
    let mut conn = WsConn::new(
        shard.next_conn_id(),
        fd,
        cfg.send_backlog_bytes,
        shard.clock(),
    )
    .with_dialect(upgrade.dialect)
    .with_compression(upgrade.deflate);
    let tls = match io {
        WsIo::Plain(owned) => {
            conn = conn.owning(owned);
            None
        }
        WsIo::Tls(_, rd, wr) => Some((rd, wr)),
    };
    let conn = Rc::new(conn);
    conn.set_write_coalesce(Duration::from_millis(cfg.write_coalesce_ms));
    let connection_id = SocketId::local(shard.index(), conn.id).text();
    let user_id = upgrade.user.as_ref().map(|u| &*u.sub);
    conn.send(match upgrade.dialect {
        Dialect::Native => connected_frame(connection_id.as_str(), cfg.heartbeat_s, user_id),
        Dialect::Pusher => pusher_frame::connection_established(
            connection_id.as_str(),
            u32::try_from(cfg.heartbeat_s).unwrap_or(u32::MAX),
        ),
    });
    let pusher = (upgrade.dialect == Dialect::Pusher).then(|| upgrade.project.clone());
    shard.register(conn.clone(), upgrade.key_id, pusher);
    // An empty leftover still owns the 4 KiB HTTP read buffer: free it now, not when
    // the connection ends (it would be most of an idle connection's memory).
    let pending = if leftover.is_empty() {
        Vec::new()
    } else {
        leftover
    };
    let held = (guard, upgrade.slot);
    // The writer sends the answers, then the `connected` frame queued above; on
    // plaintext it ends once idle and later frames go by direct send.
    let answers = Bytes::from(answers);
    let rd = match tls {
        Some((rd, wr)) => {
            conn.start_writer(wr, answers);
            Some(rd)
        }
        None => {
            conn.start_writer(PlainWriter::new(fd), answers);
            None
        }
    };
    match upgrade.dialect {
        Dialect::Native => {
            let mut session = NativeSession::new(svc.sessions.clone(), upgrade.project);
            if let Some(user) = upgrade.user {
                session.set_user(&conn, user);
            }
            read_side(&svc, rd, conn, session, pending, held);
        }
        Dialect::Pusher => {
            let session = PusherSession::new(svc.sessions.clone(), upgrade.project);
            read_side(&svc, rd, conn, session, pending, held);
        }
    }
}

/// Start the read side: plaintext (`rd` is `None`) parks in the worker's engine (an
/// idle connection is a record, no task); TLS (rustls reads into its own buffers) runs
/// a reader task.
fn read_side<S: Session + 'static>(
    svc: &Rc<Service>,
    rd: Option<TlsReader>,
    conn: Rc<WsConn>,
    session: S,
    pending: Vec<u8>,
    held: (ConnGuard, ProjectSlot),
) {
    match rd {
        None => match engine::current() {
            Some(engine) => start_parked(&engine, conn, session, pending, held),
            None => {
                // Every worker installs its engine before it accepts: not reached.
                tracing::error!("websocket: no connection engine on this worker");
                conn.abort();
                let mut session = session;
                session.on_end(&conn);
            }
        },
        Some(rd) => {
            let shard = svc.shard.clone();
            let limits = svc.sessions.read.limits;
            monoio::spawn(reader_task(rd, conn, session, limits, shard, pending, held));
        }
    }
}

/// The reader's task (TLS). Kept apart from the upgrade so that the task that lives as
/// long as the socket holds only the reader's small state.
async fn reader_task<R: WsRead, S: Session>(
    rd: R,
    conn: Rc<WsConn>,
    mut session: S,
    limits: ReadLimits,
    shard: Rc<Shard>,
    pending: Vec<u8>,
    _held: (ConnGuard, ProjectSlot),
) {
    read_loop(
        rd,
        conn,
        &mut session,
        limits,
        move || shard.clock(),
        pending,
    )
    .await;
}

#[cfg(test)]
mod sizes;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse::parse_head;
    use crate::ws::handshake::write_switching;

    #[test]
    fn rfc_example_accept_key() {
        let raw = "GET /api/v1/ws?key=pk_x HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
        let head = parse_head(raw.as_bytes(), 8192, 64).unwrap().unwrap();
        let key = validate(&head, raw.as_bytes()).unwrap();
        let mut out = Vec::new();
        write_switching(&mut out, key);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    }

    #[test]
    fn non_upgrades_are_refused() {
        let raw = "GET /api/v1/ws HTTP/1.1\r\nHost: h\r\n\r\n";
        let head = parse_head(raw.as_bytes(), 8192, 64).unwrap().unwrap();
        assert!(validate(&head, raw.as_bytes()).is_err());
    }
}
