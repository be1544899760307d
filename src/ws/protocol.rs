//! ringcast's client protocol over an established WebSocket (contract.md):
//! subscribe / unsubscribe / ping from the client; subscribed / unsubscribed / pong /
//! error replies from the server.
//!
//! Invariants: errors that a client can cause with a frame (bad JSON, unknown type,
//! invalid channel, too many subscriptions) are answered with an error frame and keep
//! the connection open; only binary frames (1003) and protocol violations close it.
//! Subscribing twice is idempotent (one delivery per publish, whatever happens), as is
//! unsubscribing from a channel one is not in. Client frames are parsed with simd-json in
//! place: the payload buffer is ours and mutable.

use std::rc::Rc;

use bytes::Bytes;
use simd_json::prelude::{ValueAsScalar, ValueObjectAccess};

use crate::publish::encode::write_json_str;
use crate::publish::parse::validate_name;
use crate::server::worker::Worker;

use super::conn::{Session, WsConn};
use super::frame::{self, CloseReason, Opcode, UNSUPPORTED_DATA};

/// One client's protocol state, owned by its reader task.
pub struct ClientSession {
    worker: Rc<Worker>,
    /// Channels this connection is subscribed to (bounded by config).
    subscriptions: Vec<Box<str>>,
}

impl ClientSession {
    pub fn new(worker: Rc<Worker>) -> ClientSession {
        ClientSession {
            worker,
            subscriptions: Vec::new(),
        }
    }

    fn subscribe(&mut self, conn: &Rc<WsConn>, channel: &str) {
        if self.subscriptions.iter().any(|c| &**c == channel) {
            conn.send(reply("subscribed", channel));
            return;
        }
        let max = self.worker.shared.config.max_subscriptions_per_connection;
        if self.subscriptions.len() >= max {
            conn.send(error_frame(
                "too_many_subscriptions",
                "this connection has reached its subscription limit",
            ));
            return;
        }
        let first = {
            let mut registry = self.worker.registry.borrow_mut();
            let first = registry.subscribers(conn.meta.project, channel).is_none();
            registry.subscribe(conn.meta.project, channel, conn);
            first
        };
        if first {
            self.interest(conn.meta.project, channel, true);
        }
        self.subscriptions.push(channel.into());
        conn.send(reply("subscribed", channel));
    }

    fn unsubscribe(&mut self, conn: &Rc<WsConn>, channel: &str) {
        if let Some(pos) = self.subscriptions.iter().position(|c| &**c == channel) {
            self.subscriptions.swap_remove(pos);
            let last = {
                let mut registry = self.worker.registry.borrow_mut();
                registry.unsubscribe(conn.meta.project, channel, conn.id)
                    && registry.subscribers(conn.meta.project, channel).is_none()
            };
            if last {
                self.interest(conn.meta.project, channel, false);
            }
        }
        conn.send(reply("unsubscribed", channel));
    }
}

impl ClientSession {
    /// Cluster mode: tell the bridge that this worker's first subscriber of a channel
    /// arrived (`on`) or its last one left, so the node subscribes in Redis only to
    /// channels someone here wants. Never per client, never on the fan-out path.
    fn interest(&self, project: u32, channel: &str, on: bool) {
        if let Some(cluster) = &self.worker.shared.cluster {
            cluster.interest(project, channel, on);
        }
    }
}

impl Session for ClientSession {
    fn on_message(
        &mut self,
        conn: &Rc<WsConn>,
        opcode: Opcode,
        payload: &mut [u8],
    ) -> Result<(), CloseReason> {
        if opcode != Opcode::Text {
            return Err(CloseReason::new(
                UNSUPPORTED_DATA,
                "binary frames are not supported",
            ));
        }
        // simd-json builds (and drops) a value tree recursively: bound the nesting first
        // so a deeply nested frame cannot exhaust the worker's stack.
        if nesting_depth(payload) > MAX_CLIENT_JSON_DEPTH {
            conn.send(error_frame(
                "invalid_json",
                "the frame is nested too deeply",
            ));
            return Ok(());
        }
        let value = match simd_json::to_borrowed_value(payload) {
            Ok(v) => v,
            Err(_) => {
                conn.send(error_frame("invalid_json", "the frame is not valid JSON"));
                return Ok(());
            }
        };
        let Some(kind) = value.get("type").and_then(|t| t.as_str()) else {
            conn.send(error_frame(
                "unknown_type",
                "the frame needs a string field 'type'",
            ));
            return Ok(());
        };
        match kind {
            "ping" => {
                conn.send(Bytes::from_static(PONG));
            }
            "subscribe" | "unsubscribe" => {
                let channel = match value.get("channel").and_then(|c| c.as_str()) {
                    Some(c) => c,
                    None => {
                        conn.send(error_frame(
                            "invalid_channel",
                            "the field 'channel' must be a string",
                        ));
                        return Ok(());
                    }
                };
                if validate_name("channel", channel).is_err() {
                    conn.send(error_frame(
                        "invalid_channel",
                        "a channel is 1 to 100 characters without control characters",
                    ));
                    return Ok(());
                }
                if kind == "subscribe" {
                    self.subscribe(conn, channel);
                } else {
                    self.unsubscribe(conn, channel);
                }
            }
            _ => {
                conn.send(error_frame(
                    "unknown_type",
                    "type must be subscribe, unsubscribe or ping",
                ));
            }
        }
        Ok(())
    }

    fn on_end(&mut self, conn: &Rc<WsConn>) {
        let mut registry = self.worker.registry.borrow_mut();
        let cluster = self.worker.shared.cluster.as_deref();
        for channel in self.subscriptions.drain(..) {
            if registry.unsubscribe(conn.meta.project, &channel, conn.id)
                && registry.subscribers(conn.meta.project, &channel).is_none()
            {
                if let Some(cluster) = cluster {
                    cluster.interest(conn.meta.project, &channel, false);
                }
            }
        }
        drop(registry);
        self.worker.remove_ws(conn);
    }
}

/// Client frames are flat control messages; anything nested deeper is refused.
const MAX_CLIENT_JSON_DEPTH: usize = 32;

/// Deepest `{`/`[` nesting of a JSON text, ignoring brackets inside strings. Stops
/// counting once past the limit; malformed text is left to the parser.
fn nesting_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
                if max > MAX_CLIENT_JSON_DEPTH {
                    return max;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// `{"type":"pong"}` as a complete frame.
const PONG: &[u8] = b"\x81\x0f{\"type\":\"pong\"}";

fn reply(kind: &str, channel: &str) -> Bytes {
    let mut json = Vec::with_capacity(48 + channel.len());
    json.extend_from_slice(b"{\"type\":\"");
    json.extend_from_slice(kind.as_bytes());
    json.extend_from_slice(b"\",\"channel\":");
    write_json_str(&mut json, channel);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// An error frame that keeps the connection open.
pub fn error_frame(code: &str, message: &str) -> Bytes {
    let mut json = Vec::with_capacity(48 + message.len());
    json.extend_from_slice(b"{\"type\":\"error\",\"code\":");
    write_json_str(&mut json, code);
    json.extend_from_slice(b",\"message\":");
    write_json_str(&mut json, message);
    json.push(b'}');
    frame::frame(Opcode::Text, &json)
}

/// The frame sent right after the upgrade.
pub fn connected_frame(connection_id: &str, heartbeat_s: u64) -> Bytes {
    let json = format!(
        "{{\"type\":\"connected\",\"connection_id\":\"{connection_id}\",\"heartbeat_s\":{heartbeat_s}}}"
    );
    frame::frame(Opcode::Text, json.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_depth_ignores_strings() {
        assert_eq!(nesting_depth(br#"{"type":"ping"}"#), 1);
        assert_eq!(nesting_depth(br#"{"a":[[{}]]}"#), 4);
        assert_eq!(nesting_depth(br#"{"a":"[[[[\"[["}"#), 1);
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(nesting_depth(deep.as_bytes()) > MAX_CLIENT_JSON_DEPTH);
    }

    #[test]
    fn pong_constant_is_a_valid_frame() {
        assert_eq!(PONG[1] as usize, PONG.len() - 2);
        let v: serde_json::Value = serde_json::from_slice(&PONG[2..]).unwrap();
        assert_eq!(v["type"], "pong");
    }

    #[test]
    fn replies_escape_channels() {
        let f = reply("subscribed", "a\"b");
        let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
        assert_eq!(v["channel"], "a\"b");
        let e = error_frame("invalid_json", "bad");
        let v: serde_json::Value = serde_json::from_slice(&e[2..]).unwrap();
        assert_eq!(v["code"], "invalid_json");
    }
}
