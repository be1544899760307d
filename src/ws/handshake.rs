//! The server's half of the WebSocket opening handshake (RFC 6455 §4.2.2): the 101
//! answer with `Sec-WebSocket-Accept` (computed by tungstenite). No extension and no
//! subprotocol is negotiated, so the frames that follow carry no RSV bits. Checking the
//! request itself is the HTTP layer's job (`http::upgrade::validate`): this module
//! knows no HTTP parser.

/// Append the 101 response for the client's `Sec-WebSocket-Key`.
pub fn write_switching(out: &mut Vec<u8>, key: &[u8]) {
    let accept = tungstenite::handshake::derive_accept_key(key);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}
