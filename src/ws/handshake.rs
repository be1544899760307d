//! The server's half of the WebSocket opening handshake (RFC 6455 §4.2.2): the 101
//! answer with `Sec-WebSocket-Accept` (computed by tungstenite) and, when the upgrade
//! agreed to it, the permessage-deflate extension (`ws::deflate::negotiate`). No
//! subprotocol is negotiated. Checking the request itself is the HTTP layer's job
//! (`http::upgrade::validate`): this module knows no HTTP parser.

/// Append the 101 response for the client's `Sec-WebSocket-Key` (no extension).
pub fn write_switching(out: &mut Vec<u8>, key: &[u8]) {
    write_switching_with(out, key, None);
}

/// [`write_switching`]; `deflate`: answer with permessage-deflate (no context takeover
/// either way) with this server window (bits, from the offer), so frames that follow
/// may carry RSV1.
pub fn write_switching_with(out: &mut Vec<u8>, key: &[u8], deflate: Option<u8>) {
    let accept = tungstenite::handshake::derive_accept_key(key);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept.as_bytes());
    if let Some(window) = deflate {
        out.extend_from_slice(b"\r\nSec-WebSocket-Extensions: ");
        super::deflate::negotiate::write_response(out, window);
    }
    out.extend_from_slice(b"\r\n\r\n");
}
