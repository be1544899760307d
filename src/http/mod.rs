//! HTTP/1.1 for the REST interface and the WebSocket upgrade.
//!
//! - [`parse`]: request heads (httparse) as offsets into the read buffer.
//! - [`conn`]: one connection's state ([`conn::HttpConn`]) and its read → serve →
//!   flush steps, keep-alive and pipelining; the routing table, which hands each
//!   request to its endpoint as an [`outcome::Request`] and takes back an
//!   [`outcome::Outcome`]; [`publish`], [`history`], [`health`] and [`upgrade`] are its
//!   endpoints, [`pusher_ws`] and [`pusher_rest`] (with [`pusher_terminate`]) the Pusher protocol's; [`upgrade_limit`] is
//!   `max_upgrades_per_second` at both upgrades; [`response`] writes every answer from the one error table
//!   ([`crate::error`]).
//! - [`idempotent`]: the `Idempotency-Key` header around the publish endpoints.
//! - [`users`]: ending a user's access (disconnect, block, unsubscribe, show).
//! - [`transport`]: plain TCP or TLS under the same loop; [`service`]: what one worker's
//!   HTTP side holds (the node, its shard, the publish parser, id generator).
//!
//! Why httparse directly and not monoio-http's codec: the hot path wants the head as
//! offsets into the connection's own read buffer (no `http::HeaderMap`, no per-request
//! header allocation), pipelined requests served from one read and answered in one
//! write, and the WebSocket upgrade taken over on the same socket mid-buffer. monoio-http's
//! HTTP/1 codec decodes into owned `http::Request` values with a `HeaderMap`, which costs
//! allocations per request and hides the buffer we need for the upgrade; the part we would
//! keep from it (httparse) is what we use here.

pub(crate) mod channels;
pub(crate) mod conn;
pub(crate) mod console;
pub(crate) mod health;
pub(crate) mod history;
pub(crate) mod idempotent;
pub(crate) mod outcome;
pub(crate) mod parse;
pub(crate) mod publish;
pub(crate) mod pusher_rest;
pub(crate) mod pusher_terminate;
pub(crate) mod pusher_ws;
pub(crate) mod response;
pub(crate) mod service;
pub(crate) mod transport;
pub(crate) mod upgrade;
pub(crate) mod upgrade_limit;
pub(crate) mod users;

pub(crate) use response::ApiError;
pub(crate) use service::Service;

/// Errors found while parsing a request head. Each maps to one [`ApiError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    #[error("request head too large")]
    HeadersTooLarge,
    #[error("chunked bodies are not accepted")]
    LengthRequired,
}

impl From<HttpError> for ApiError {
    fn from(e: HttpError) -> ApiError {
        match e {
            HttpError::BadRequest(why) => ApiError::BadRequest(why),
            HttpError::HeadersTooLarge => ApiError::HeadersTooLarge,
            HttpError::LengthRequired => ApiError::LengthRequired,
        }
    }
}
