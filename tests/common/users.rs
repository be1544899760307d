//! Users (issue 25) as the tests act them: connection tokens, native connections as a
//! user, the raw upgrade's answer to a token, Pusher sign-ins. One copy for
//! `users_identity`, `users_end` and `users_cluster` (single node or any cluster node:
//! everything takes the node's address).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    hs256, next_json, parse_response, raw_to, send_json, set_timeout, unix_now, Project, Ws,
};

/// A connection token for `sub`, valid `secs` seconds, signed with the project's token
/// secret (by `jsonwebtoken`, not the server's code).
pub fn conn_token(p: &Project, sub: &str, secs: u64) -> String {
    hs256(
        &p.token_secret,
        json!({"sub": sub, "exp": unix_now() + secs}),
    )
}

/// The native WebSocket URL with `token` (empty: none).
pub fn ws_url(addr: SocketAddr, p: &Project, token: &str) -> String {
    format!("ws://{addr}/api/v1/ws?key={}&token={token}", p.public)
}

/// Connect with a connection token; returns the socket and its `connected` frame.
pub fn connect_as(addr: SocketAddr, p: &Project, token: &str) -> (Ws, Value) {
    let (mut ws, _) = tungstenite::connect(ws_url(addr, p, token)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(15));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    (ws, hello)
}

/// A native connection of `sub` (a fresh 10-minute connection token).
pub fn native_as(addr: SocketAddr, p: &Project, sub: &str) -> Ws {
    let (ws, hello) = connect_as(addr, p, &conn_token(p, sub, 600));
    assert_eq!(hello["user_id"], sub, "{hello}");
    ws
}

/// The upgrade's answer for `token` on a raw connection: status and JSON body.
pub fn upgrade_answer(addr: SocketAddr, p: &Project, token: &str) -> (u16, Value) {
    let req = format!(
        "GET /api/v1/ws?key={}&token={token} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        p.public
    );
    let (status, _, body) = parse_response(&raw_to(addr, req.as_bytes()));
    (status, body)
}

/// The upgrade status of a fresh connection token of `sub`.
pub fn upgrade_status(addr: SocketAddr, p: &Project, sub: &str) -> u16 {
    upgrade_answer(addr, p, &conn_token(p, sub, 600)).0
}

/// `pusher:signin` as pusher-js sends it, signed with `secret` as Pusher's server SDKs
/// sign it; returns the answer.
pub fn signin(ws: &mut Ws, p: &Project, socket_id: &str, user_data: &str, secret: &str) -> Value {
    let sig = super::sign::hmac_hex(secret, &format!("{socket_id}::user::{user_data}"));
    send_json(
        ws,
        json!({"event": "pusher:signin", "data": {"user_data": user_data, "auth": format!("{}:{sig}", p.public)}}),
    );
    next_json(ws)
}

/// A Pusher connection signed in as `user`.
pub fn pusher_as(addr: SocketAddr, p: &Project, user: &str) -> Ws {
    let url = format!(
        "ws://{addr}/app/{}?protocol=7&client=js&version=8.4.0",
        p.public
    );
    let (mut ws, socket_id) = super::pusher_connect(&url);
    let data = json!({ "id": user }).to_string();
    let ok = signin(&mut ws, p, &socket_id, &data, &p.token_secret);
    assert_eq!(ok["event"], "pusher:signin_success", "{ok}");
    ws
}
