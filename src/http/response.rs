//! Every REST answer ringcast gives, from one table.
//!
//! [`ApiError`] knows its status, its snake_case code and its human message, so a 400,
//! 401, 413, 415, 429 or 503 is never assembled ad hoc. Response heads are written
//! straight into the connection's output buffer; nothing here allocates beyond growing
//! that buffer. Messages are our own ASCII text, so they need no JSON escaping.

use std::io::Write;

/// A REST error with everything needed to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    InvalidJson,
    NotAnObject,
    MissingField(&'static str),
    InvalidField(&'static str, &'static str),
    FieldTooLong(&'static str),
    Unauthorized(&'static str),
    PayloadTooLarge,
    UnsupportedMediaType,
    RateLimited,
    Unavailable(&'static str),
    NotFound,
    /// The methods the path does accept, for the `Allow` header (RFC 9110 §15.5.6).
    MethodNotAllowed(&'static str),
    BadRequest(&'static str),
    LengthRequired,
    HeadersTooLarge,
    RequestTimeout,
    TooManyConnections,
}

impl ApiError {
    pub fn status(&self) -> u16 {
        match self {
            ApiError::InvalidJson
            | ApiError::NotAnObject
            | ApiError::MissingField(_)
            | ApiError::InvalidField(..)
            | ApiError::FieldTooLong(_)
            | ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::NotFound => 404,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::RequestTimeout => 408,
            ApiError::LengthRequired => 411,
            ApiError::PayloadTooLarge => 413,
            ApiError::UnsupportedMediaType => 415,
            ApiError::RateLimited => 429,
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
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::RateLimited => "rate_limited",
            ApiError::Unavailable(_) | ApiError::TooManyConnections => "unavailable",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::LengthRequired => "length_required",
            ApiError::HeadersTooLarge => "headers_too_large",
            ApiError::RequestTimeout => "request_timeout",
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
            ApiError::Unauthorized(why) => write!(out, "{why}"),
            ApiError::PayloadTooLarge => {
                write!(
                    out,
                    "the request body is larger than the configured maximum"
                )
            }
            ApiError::UnsupportedMediaType => {
                write!(out, "Content-Type must be application/json")
            }
            ApiError::RateLimited => write!(out, "the project is over its rate quota"),
            ApiError::Unavailable(why) => write!(out, "{why}"),
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
        )
    }

    /// The error body `{"error":{"code":..,"message":..}}`.
    pub fn body(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(128);
        body.extend_from_slice(b"{\"error\":{\"code\":\"");
        body.extend_from_slice(self.code().as_bytes());
        body.extend_from_slice(b"\",\"message\":\"");
        self.write_message(&mut body);
        body.extend_from_slice(b"\"}}");
        body
    }
}

/// Rate headers carried by publish responses once the key's project is known.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateHeaders {
    pub limit: u32,
    pub remaining: u32,
    pub reset_s: u64,
}

/// Extra headers of one response.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extra {
    pub rate: Option<RateHeaders>,
    pub retry_after_s: Option<u64>,
    pub close: bool,
}

fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Append a complete JSON response to `out`.
pub fn write_json(out: &mut Vec<u8>, status: u16, body: &[u8], extra: Extra) {
    write_response(out, status, body, extra, None);
}

fn write_response(out: &mut Vec<u8>, status: u16, body: &[u8], extra: Extra, allow: Option<&str>) {
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        reason(status),
        body.len()
    );
    if let Some(rate) = extra.rate {
        let _ = write!(
            out,
            "RateLimit-Limit: {}\r\nRateLimit-Remaining: {}\r\nRateLimit-Reset: {}\r\n",
            rate.limit, rate.remaining, rate.reset_s
        );
    }
    if let Some(secs) = extra.retry_after_s {
        let _ = write!(out, "Retry-After: {secs}\r\n");
    }
    if let Some(methods) = allow {
        let _ = write!(out, "Allow: {methods}\r\n");
    }
    if extra.close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// Append the error response for `err`.
pub fn write_error(out: &mut Vec<u8>, err: ApiError, mut extra: Extra) {
    extra.close |= err.closes_connection();
    if matches!(err, ApiError::Unavailable(_) | ApiError::TooManyConnections) {
        extra.retry_after_s.get_or_insert(1);
    }
    let allow = match err {
        ApiError::MethodNotAllowed(methods) => Some(methods),
        _ => None,
    };
    write_response(out, err.status(), &err.body(), extra, allow);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_json_with_code_and_message() {
        let all = [
            ApiError::InvalidJson,
            ApiError::MissingField("channel"),
            ApiError::InvalidField("data", "must be an object or a string"),
            ApiError::FieldTooLong("event"),
            ApiError::Unauthorized("missing X-Api-Key"),
            ApiError::PayloadTooLarge,
            ApiError::UnsupportedMediaType,
            ApiError::RateLimited,
            ApiError::Unavailable("shutting down"),
            ApiError::HeadersTooLarge,
        ];
        for err in all {
            let v: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
            assert_eq!(v["error"]["code"], err.code());
            assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        }
    }

    #[test]
    fn method_not_allowed_names_the_allowed_methods() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            ApiError::MethodNotAllowed("GET, HEAD"),
            Extra::default(),
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 405 "));
        assert!(text.contains("\r\nAllow: GET, HEAD\r\n"));
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let mut out = Vec::new();
        write_error(&mut out, ApiError::Unavailable("full"), Extra::default());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "));
        assert!(text.contains("Retry-After: 1\r\n"));
    }
}
