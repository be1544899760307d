//! The WebSocket opening handshake (RFC 6455 §4.2) on an already parsed request head.
//!
//! [`validate`] checks the request is a well-formed version-13 upgrade and returns the
//! client's key; [`write_switching`] writes the 101 answer with `Sec-WebSocket-Accept`
//! (computed by tungstenite). No extension and no subprotocol is negotiated, so the
//! frames that follow carry no RSV bits.

use crate::http::parse::{Method, RequestHead};
use crate::http::ApiError;

/// Check the upgrade request; returns the `Sec-WebSocket-Key` value.
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

/// Append the 101 response.
pub fn write_switching(out: &mut Vec<u8>, key: &[u8]) {
    let accept = tungstenite::handshake::derive_accept_key(key);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse::parse_head;

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
