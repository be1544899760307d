//! Every REST rejection ringcast gives, from one table.
//!
//! [`ApiError`] knows its status, its snake_case code and its human message, so a 400,
//! 401, 413, 415, 429 or 503 is never assembled ad hoc (`http::response` writes it).
//! Refusals carry typed reasons ([`KeyRefusal`], [`Unavailable`]) rather than loose
//! strings, so the same refusal reads the same on every path. Messages are our own
//! ASCII text, so they need no JSON escaping.

use std::io::Write;

pub(crate) use crate::auth::pusher::RestAuthError;
pub(crate) use crate::auth::token::TokenRefusal;
pub(crate) use crate::auth::KeyRefusal;

/// Why the service cannot take a request now (503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// SIGTERM arrived: publishes and new WebSockets are refused while draining.
    ShuttingDown,
    /// A worker's mailbox is at capacity; nothing was queued anywhere.
    QueueFull,
    /// The project holds `max_ws_connections_per_project` sockets on this node.
    ProjectConnectionLimit,
    /// Cluster mode, a project with history: Redis, which gives messages their
    /// offsets, did not answer. Nothing was published.
    HistoryUnreachable,
    /// The presence and occupancy state could not be read (its thread is gone).
    StateUnreachable,
    /// The project store (SQLite or Redis) did not answer a user block or end, or its
    /// queue of waiting requests is full.
    StoreUnreachable,
}

impl Unavailable {
    pub fn message(self) -> &'static str {
        match self {
            Unavailable::ShuttingDown => "the service is shutting down",
            Unavailable::QueueFull => "a shard queue is full; retry shortly",
            Unavailable::ProjectConnectionLimit => {
                "the project has reached its WebSocket connection limit"
            }
            Unavailable::HistoryUnreachable => {
                "channel history (Redis) is unreachable; retry shortly"
            }
            Unavailable::StateUnreachable => {
                "channel occupancy and presence cannot be read now; retry shortly"
            }
            Unavailable::StoreUnreachable => {
                "the project store cannot be reached now; retry shortly"
            }
        }
    }
}

/// Why a Pusher REST request is refused with 403 (Pusher's status for "app disabled or
/// over message quota"; the native API answers the quota with 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    /// The project has the Pusher API off (`project set-limits --pusher off`).
    PusherDisabled,
    /// Over the project's rate quota: `Retry-After` says when to try again.
    OverQuota,
    /// The request costs more units than the project's whole burst (no `Retry-After`).
    OverBurst,
}

/// A REST error with everything needed to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    InvalidJson,
    NotAnObject,
    MissingField(&'static str),
    InvalidField(&'static str, &'static str),
    FieldTooLong(&'static str),
    Unauthorized(KeyRefusal),
    /// A WebSocket upgrade's connection token (`?token=`) was refused, or the project
    /// requires one and none was given (401 `invalid_token`).
    InvalidToken(TokenRefusal),
    PayloadTooLarge,
    UnsupportedMediaType,
    RateLimited,
    /// A request that costs more units than the project's whole burst: no wait makes
    /// it affordable, so it gets no `Retry-After`.
    OverBurst,
    /// Over `ws_connect_rate_per_ip` (429, `Retry-After: 1`).
    ConnectRateLimited,
    Unavailable(Unavailable),
    NotFound,
    /// The methods the path does accept, for the `Allow` header (RFC 9110 §15.5.6).
    MethodNotAllowed(&'static str),
    BadRequest(&'static str),
    LengthRequired,
    HeadersTooLarge,
    RequestTimeout,
    TooManyConnections,
    /// `GET /api/v1/history` for a project that keeps no history.
    HistoryOff,
    /// `GET /api/v1/history` with an `epoch` that is not the channel's.
    EpochMismatch,
    /// A Pusher REST query string that does not parse (a key given twice, a bad `%`
    /// escape, too many parameters) or carries a parameter the endpoint refuses.
    InvalidQuery(&'static str),
    /// A Pusher `info` list that asks for an unknown attribute, has an empty item, or
    /// asks `user_count` of a channel that is not a presence channel.
    InvalidInfo(&'static str),
    /// A Pusher REST request whose signature (or app id and `auth_key`) does not hold.
    PusherUnauthorized(RestAuthError),
    /// 403 (Pusher REST only).
    Forbidden(Forbidden),
    /// An `Idempotency-Key` that is empty, longer than 255 characters, not printable
    /// ASCII, or given twice.
    IdempotencyKeyInvalid,
    /// A remembered `Idempotency-Key` sent with another body (422).
    IdempotencyKeyReused,
    /// The first request with this `Idempotency-Key` is still being processed (409,
    /// `Retry-After: 1`).
    IdempotencyKeyInProgress,
    /// `POST /api/v1/users/{id}/block` when the project already holds
    /// `max_blocked_users_per_project` blocks in force (409).
    TooManyBlocks,
}

impl ApiError {
    pub fn status(&self) -> u16 {
        match self {
            ApiError::InvalidJson
            | ApiError::NotAnObject
            | ApiError::MissingField(_)
            | ApiError::InvalidField(..)
            | ApiError::FieldTooLong(_)
            | ApiError::BadRequest(_)
            | ApiError::InvalidQuery(_)
            | ApiError::InvalidInfo(_)
            | ApiError::IdempotencyKeyInvalid => 400,
            ApiError::Unauthorized(_)
            | ApiError::PusherUnauthorized(_)
            | ApiError::InvalidToken(_) => 401,
            ApiError::Forbidden(_) => 403,
            ApiError::NotFound | ApiError::HistoryOff => 404,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::RequestTimeout => 408,
            ApiError::EpochMismatch
            | ApiError::IdempotencyKeyInProgress
            | ApiError::TooManyBlocks => 409,
            ApiError::LengthRequired => 411,
            ApiError::PayloadTooLarge => 413,
            ApiError::UnsupportedMediaType => 415,
            ApiError::IdempotencyKeyReused => 422,
            ApiError::RateLimited | ApiError::OverBurst | ApiError::ConnectRateLimited => 429,
            ApiError::HeadersTooLarge => 431,
            ApiError::Unavailable(_) | ApiError::TooManyConnections => 503,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson => "invalid_json",
            ApiError::NotAnObject => "invalid_json",
            ApiError::MissingField(_) => "missing_field",
            ApiError::InvalidField(..) => "invalid_field",
            ApiError::FieldTooLong(_) => "field_too_long",
            ApiError::Unauthorized(_) | ApiError::PusherUnauthorized(_) => "unauthorized",
            ApiError::InvalidToken(_) => "invalid_token",
            ApiError::InvalidQuery(_) => "invalid_query",
            ApiError::InvalidInfo(_) => "invalid_info",
            ApiError::Forbidden(Forbidden::PusherDisabled) => "pusher_disabled",
            ApiError::Forbidden(Forbidden::OverQuota | Forbidden::OverBurst) => "rate_limited",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::RateLimited | ApiError::OverBurst | ApiError::ConnectRateLimited => {
                "rate_limited"
            }
            ApiError::Unavailable(_) | ApiError::TooManyConnections => "unavailable",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::LengthRequired => "length_required",
            ApiError::HeadersTooLarge => "headers_too_large",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::HistoryOff => "history_off",
            ApiError::EpochMismatch => "epoch_mismatch",
            ApiError::IdempotencyKeyInvalid => "invalid_idempotency_key",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::IdempotencyKeyInProgress => "idempotency_key_in_progress",
            ApiError::TooManyBlocks => "too_many_blocks",
        }
    }

    /// Write the human sentence for this error.
    pub fn write_message(&self, out: &mut Vec<u8>) {
        let _ = match self {
            ApiError::InvalidJson => write!(out, "the request body is not valid JSON"),
            ApiError::NotAnObject => write!(out, "the request body must be a JSON object"),
            ApiError::MissingField(f) => write!(out, "the field '{f}' is required"),
            ApiError::InvalidField(f, why) => write!(out, "the field '{f}' {why}"),
            ApiError::FieldTooLong(f) => {
                write!(out, "the field '{f}' is longer than 100 characters")
            }
            ApiError::Unauthorized(why) => write!(out, "{}", why.message()),
            // The one message here that is not written for JSON (it names fields in
            // quotes): escaped.
            ApiError::InvalidToken(why) => {
                let text = format!("connection token refused: {why}");
                write!(out, "{}", text.replace('\\', "\\\\").replace('"', "\\\""))
            }
            ApiError::PayloadTooLarge => {
                write!(
                    out,
                    "the request body is larger than the configured maximum"
                )
            }
            ApiError::UnsupportedMediaType => {
                write!(out, "Content-Type must be application/json")
            }
            ApiError::RateLimited | ApiError::Forbidden(Forbidden::OverQuota) => {
                write!(out, "the project is over its rate quota")
            }
            ApiError::OverBurst | ApiError::Forbidden(Forbidden::OverBurst) => write!(
                out,
                "the request costs more units (one per message per channel) than the project's whole rate quota; it can never be accepted: split it"
            ),
            ApiError::ConnectRateLimited => write!(
                out,
                "too many new connections from this address; retry shortly"
            ),
            ApiError::Unavailable(why) => write!(out, "{}", why.message()),
            ApiError::TooManyConnections => {
                write!(out, "the server has too many open connections")
            }
            ApiError::NotFound => write!(out, "no such endpoint"),
            ApiError::MethodNotAllowed(_) => write!(out, "method not allowed on this endpoint"),
            ApiError::BadRequest(why) => write!(out, "{why}"),
            ApiError::LengthRequired => write!(
                out,
                "a Content-Length is required (chunked request bodies are not accepted)"
            ),
            ApiError::HeadersTooLarge => write!(out, "the request head is too large"),
            ApiError::RequestTimeout => write!(out, "the request head took too long"),
            ApiError::HistoryOff => write!(out, "the project keeps no channel history"),
            ApiError::TooManyBlocks => write!(
                out,
                "the project already blocks as many users as max_blocked_users_per_project allows; lift a block first"
            ),
            ApiError::EpochMismatch => write!(
                out,
                "the channel's history has another epoch: positions of the old one are gone"
            ),
            ApiError::InvalidQuery(why) | ApiError::InvalidInfo(why) => write!(out, "{why}"),
            ApiError::IdempotencyKeyInvalid => write!(
                out,
                "Idempotency-Key must be given once, as 1 to 255 printable ASCII characters"
            ),
            ApiError::IdempotencyKeyReused => write!(
                out,
                "this Idempotency-Key was used with another request body within the idempotency window"
            ),
            ApiError::IdempotencyKeyInProgress => write!(
                out,
                "the first request with this Idempotency-Key is still being processed; retry shortly"
            ),
            ApiError::PusherUnauthorized(why) => write!(out, "{why}"),
            ApiError::Forbidden(Forbidden::PusherDisabled) => write!(
                out,
                "the Pusher API is off for this app (ringcast project set-limits PROJECT_ID --pusher on)"
            ),
        };
    }

    /// Whether the connection must be closed after answering (the request stream can no
    /// longer be trusted or read in step).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ApiError::BadRequest(_)
                | ApiError::LengthRequired
                | ApiError::HeadersTooLarge
                | ApiError::RequestTimeout
                | ApiError::PayloadTooLarge
                | ApiError::TooManyConnections
                // A refused connection token: the next try costs a new connection, so
                // one connection cannot make the worker check forged tokens in a loop.
                | ApiError::InvalidToken(_)
        )
    }

    /// The error body `{"error":{"code":..,"message":..}}`.
    pub fn body(&self) -> Vec<u8> {
        self.body_with_index(None)
    }

    /// The error body, with `"index": i` in the error object when a batch's message `i`
    /// is the one refused.
    pub fn body_with_index(&self, index: Option<usize>) -> Vec<u8> {
        let mut body = Vec::with_capacity(128);
        body.extend_from_slice(b"{\"error\":{\"code\":\"");
        body.extend_from_slice(self.code().as_bytes());
        body.extend_from_slice(b"\",\"message\":\"");
        self.write_message(&mut body);
        body.push(b'"');
        if let Some(i) = index {
            let _ = write!(body, ",\"index\":{i}");
        }
        body.extend_from_slice(b"}}");
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_token_is_401_invalid_token_in_valid_json() {
        for why in [
            TokenRefusal::Expired,
            TokenRefusal::Missing,
            TokenRefusal::NoUser,
        ] {
            let e = ApiError::InvalidToken(why);
            assert_eq!((e.status(), e.code()), (401, "invalid_token"));
            let body: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(body["error"]["code"], "invalid_token");
            assert!(body["error"]["message"]
                .as_str()
                .unwrap()
                .ends_with(&why.to_string()));
        }
    }
}
