//! Every WebSocket close the server sends, from one table: its code and its reason.
//!
//! A close is a [`Disconnect`]: a code (RFC 6455 §7.4 or ringcast's 4xxx range) and a
//! short reason sent in the close frame. Every place that ends a connection names one of
//! the constants below instead of writing a code and a string of its own, so the table
//! here is the complete list of ways the server closes a socket (docs/protocol.md lists
//! them for users). Reasons are our own ASCII text and fit the 123 bytes a close frame
//! leaves for them.
//!
//! A connection speaking the Pusher protocol gets the same closes translated by
//! `dialect::Dialect::translate`: pusher-js decides whether to reconnect from the code
//! alone, and ringcast's 4008/4009 sit in the range where it gives up for good
//! (4000–4099).
//!
//! This module is a leaf: it names no other module of the crate.

/// Close codes on the wire.
pub mod code {
    /// Normal closure (also the answer to a close frame that carried no code).
    pub const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// The peer broke the WebSocket protocol.
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// A data type the server does not accept (binary frames).
    pub const UNSUPPORTED_DATA: u16 = 1003;
    /// Text that is not UTF-8.
    pub const INVALID_PAYLOAD: u16 = 1007;
    /// A frame or message beyond the configured size, or a message in more fragments
    /// than allowed.
    pub const TOO_BIG: u16 = 1009;
    /// Try again later: over `max_upgrades_per_second`; the reason is
    /// `retry_after=<seconds>`.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The key the connection was opened with was revoked.
    pub const KEY_REVOKED: u16 = 4001;
    /// The connection's send backlog exceeded `send_backlog_bytes`.
    pub const SLOW_CONSUMER: u16 = 4008;
    /// Nothing heard from the client within three heartbeat periods.
    pub const HEARTBEAT_TIMEOUT: u16 = 4009;
    /// The application ended this user's access (`POST /api/v1/users/{id}/disconnect`,
    /// a block); clients do not reconnect by themselves.
    pub const USER_DISCONNECTED: u16 = 4010;
    /// The connection token expired (`exp` + 5 s) without a refresh; the JS client gets
    /// a new token and reconnects.
    pub const TOKEN_EXPIRED: u16 = 4011;
    /// Pusher: the app terminated this user's connections (`terminate_connections`);
    /// in 4000–4099, so pusher-js does not reconnect ("refused").
    pub const PUSHER_TERMINATED: u16 = 4009;
    /// Pusher: over capacity or a limit; pusher-js reconnects after a delay ("backoff").
    pub const PUSHER_OVER_CAPACITY: u16 = 4100;
    /// Pusher: the server is going away; pusher-js reconnects at once ("retry").
    pub const PUSHER_RECONNECT_NOW: u16 = 4200;
    /// Pusher: no traffic, reconnect at once ("retry").
    pub const PUSHER_PONG_TIMEOUT: u16 = 4201;
    /// Pusher: an unsupported protocol version; reconnecting cannot help ("refused").
    pub const PUSHER_BAD_PROTOCOL: u16 = 4007;
}

/// One way the server ends a WebSocket connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnect {
    pub code: u16,
    pub reason: &'static str,
}

impl Disconnect {
    /// The answer to a peer's close frame: its own code, no reason.
    pub const fn echo(code: u16) -> Disconnect {
        Disconnect { code, reason: "" }
    }

    // Protocol violations found by the frame decoder and the reassembler.
    pub const MALFORMED_HEADER: Disconnect = d(code::PROTOCOL_ERROR, "malformed frame header");
    pub const RESERVED_BITS: Disconnect = d(code::PROTOCOL_ERROR, "reserved bits set");
    pub const RESERVED_OPCODE: Disconnect = d(code::PROTOCOL_ERROR, "reserved opcode");
    pub const UNMASKED: Disconnect = d(code::PROTOCOL_ERROR, "client frames must be masked");
    pub const INVALID_CONTROL: Disconnect = d(code::PROTOCOL_ERROR, "invalid control frame");
    pub const INTERLEAVED_MESSAGE: Disconnect = d(
        code::PROTOCOL_ERROR,
        "new message before the previous one ended",
    );
    pub const ORPHAN_CONTINUATION: Disconnect =
        d(code::PROTOCOL_ERROR, "continuation without a start");
    pub const ONE_BYTE_CLOSE: Disconnect = d(code::PROTOCOL_ERROR, "close payload of one byte");
    pub const INVALID_CLOSE_CODE: Disconnect = d(code::PROTOCOL_ERROR, "invalid close code");
    pub const INVALID_UTF8: Disconnect = d(code::INVALID_PAYLOAD, "text is not UTF-8");
    pub const CLOSE_REASON_NOT_UTF8: Disconnect =
        d(code::INVALID_PAYLOAD, "close reason is not UTF-8");
    pub const FRAME_TOO_LARGE: Disconnect = d(code::TOO_BIG, "frame too large");
    pub const MESSAGE_TOO_LARGE: Disconnect = d(code::TOO_BIG, "message too large");
    /// A compressed message inflating past the message limit (inflating stopped there).
    pub const INFLATED_TOO_LARGE: Disconnect = d(code::TOO_BIG, "inflated message too large");
    pub const INVALID_COMPRESSED: Disconnect = d(code::INVALID_PAYLOAD, "invalid compressed data");
    pub const TOO_MANY_FRAGMENTS: Disconnect = d(code::TOO_BIG, "message in too many fragments");

    // Decided by the client protocol and the server.
    pub const BINARY_UNSUPPORTED: Disconnect =
        d(code::UNSUPPORTED_DATA, "binary frames are not supported");
    pub const SHUTDOWN: Disconnect = d(code::GOING_AWAY, "server shutting down");
    pub const KEY_REVOKED: Disconnect = d(code::KEY_REVOKED, "key revoked");
    pub const SLOW_CONSUMER: Disconnect =
        d(code::SLOW_CONSUMER, "slow consumer: send backlog exceeded");
    pub const HEARTBEAT_TIMEOUT: Disconnect = d(
        code::HEARTBEAT_TIMEOUT,
        "no traffic within the heartbeat timeout",
    );
    /// The application ended this user's access (disconnect or block).
    pub const USER_DISCONNECTED: Disconnect = d(code::USER_DISCONNECTED, "disconnected");
    /// The connection token's `exp` + 5 s passed without a refresh.
    pub const TOKEN_EXPIRED: Disconnect = d(code::TOKEN_EXPIRED, "token expired");
    /// Pusher: the `protocol` query parameter names a version we do not speak.
    pub const PUSHER_BAD_PROTOCOL: Disconnect =
        d(code::PUSHER_BAD_PROTOCOL, "unsupported protocol version");
    /// Pusher: the key in the path is not an active public key with the Pusher API on.
    pub const PUSHER_APP_REFUSED: Disconnect =
        d(code::KEY_REVOKED, "unknown, revoked or disabled app key");
    /// Pusher: no room (worker admission, the project's connection limit, the per-IP
    /// connect rate); pusher-js retries after a delay.
    pub const PUSHER_OVER_CAPACITY: Disconnect =
        d(code::PUSHER_OVER_CAPACITY, "over capacity, try again later");
}

const fn d(code: u16, reason: &'static str) -> Disconnect {
    Disconnect { code, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_fit_a_close_frame() {
        for d in [
            Disconnect::MALFORMED_HEADER,
            Disconnect::INTERLEAVED_MESSAGE,
            Disconnect::TOO_MANY_FRAGMENTS,
            Disconnect::SLOW_CONSUMER,
            Disconnect::HEARTBEAT_TIMEOUT,
        ] {
            assert!(d.reason.len() <= 123 && d.reason.is_ascii());
        }
    }
}
