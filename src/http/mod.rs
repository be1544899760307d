//! HTTP/1.1 for the REST interface: head parsing ([`parse`]), the response and error
//! table ([`response`]), and the keep-alive connection loop with routing ([`conn`]).
//!
//! Why httparse directly and not monoio-http's codec: the hot path wants the head as
//! offsets into the connection's own read buffer (no `http::HeaderMap`, no per-request
//! header allocation), pipelined requests served from one read and answered in one
//! write, and the WebSocket upgrade taken over on the same socket mid-buffer. monoio-http's
//! HTTP/1 codec decodes into owned `http::Request` values with a `HeaderMap`, which costs
//! allocations per request and hides the buffer we need for the upgrade; the part we would
//! keep from it (httparse) is what we use here.

pub mod conn;
pub mod parse;
pub mod response;

pub use response::ApiError;

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
