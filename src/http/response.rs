//! Writing HTTP answers: response heads and JSON bodies straight into the connection's
//! output buffer, and every REST error from the one table in [`crate::error`].
//!
//! Nothing here allocates beyond growing that buffer (and the few bytes of a head that
//! [`write_json_with`] puts in front of a body written in place).

use std::io::Write;

pub(crate) use crate::error::ApiError;

/// Rate headers carried by publish responses once the key's project is known.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateHeaders {
    pub limit: u32,
    pub remaining: u32,
    pub reset_s: u64,
}

impl RateHeaders {
    /// The headers of a quota decision.
    pub(crate) fn of(d: &crate::quota::Decision) -> RateHeaders {
        RateHeaders {
            limit: d.limit,
            remaining: d.remaining,
            reset_s: d.reset_s,
        }
    }

    /// The project's quota as it stands, peeked: what an answer that spent nothing
    /// carries.
    pub(crate) fn peek(project: &crate::auth::ProjectState) -> RateHeaders {
        RateHeaders::of(&project.quota.peek(crate::quota::now_ns()))
    }
}

/// Extra headers of one response.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extra {
    pub rate: Option<RateHeaders>,
    pub retry_after_s: Option<u64>,
    pub close: bool,
    /// A refused batch: `"index"` of the first invalid message in the error object.
    pub error_index: Option<usize>,
    /// The answer is a keyed publish's remembered one: `Idempotent-Replayed: true`.
    pub replayed: bool,
}

fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Append `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 20];
    out.extend_from_slice(crate::json::decimal(n, &mut buf));
}

/// Append a complete response with another content type (the console's page and script).
pub(crate) fn write_body(out: &mut Vec<u8>, content_type: &str, body: &[u8], head_only: bool) {
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.extend_from_slice(body);
    }
}

/// Append a complete JSON response to `out`.
pub(crate) fn write_json(out: &mut Vec<u8>, status: u16, body: &[u8], extra: Extra) {
    write_response(out, status, body, extra, None);
}

/// Append a complete JSON response whose body `fill` writes straight into `out`: a large
/// body (a history answer, a listing) is never built apart and copied. The head goes in
/// front of it once its length is known (one move of the body within `out`).
pub(crate) fn write_json_with(
    out: &mut Vec<u8>,
    status: u16,
    extra: Extra,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    let start = out.len();
    fill(out);
    let mut head = Vec::with_capacity(192);
    write_head(&mut head, status, out.len() - start, extra, None);
    out.splice(start..start, head);
}

fn write_response(out: &mut Vec<u8>, status: u16, body: &[u8], extra: Extra, allow: Option<&str>) {
    write_head(out, status, body.len(), extra, allow);
    out.extend_from_slice(body);
}

/// The status line and headers of a JSON response with a body of `len` bytes.
fn write_head(out: &mut Vec<u8>, status: u16, len: usize, extra: Extra, allow: Option<&str>) {
    // Every answer (every publish) writes this head: appended piece by piece, not
    // through `core::fmt` (which was ~3% of a publish's CPU).
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
    push_decimal(out, len as u64);
    out.extend_from_slice(b"\r\n");
    if let Some(rate) = extra.rate {
        out.extend_from_slice(b"RateLimit-Limit: ");
        push_decimal(out, u64::from(rate.limit));
        out.extend_from_slice(b"\r\nRateLimit-Remaining: ");
        push_decimal(out, u64::from(rate.remaining));
        out.extend_from_slice(b"\r\nRateLimit-Reset: ");
        push_decimal(out, rate.reset_s);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(secs) = extra.retry_after_s {
        out.extend_from_slice(b"Retry-After: ");
        push_decimal(out, secs);
        out.extend_from_slice(b"\r\n");
    }
    if extra.replayed {
        out.extend_from_slice(b"Idempotent-Replayed: true\r\n");
    }
    if let Some(methods) = allow {
        out.extend_from_slice(b"Allow: ");
        out.extend_from_slice(methods.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if extra.close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Append the error response for `err`.
pub fn write_error(out: &mut Vec<u8>, err: ApiError, mut extra: Extra) {
    extra.close |= err.closes_connection();
    if matches!(
        err,
        ApiError::Unavailable(_)
            | ApiError::TooManyConnections
            | ApiError::ConnectRateLimited
            | ApiError::IdempotencyKeyInProgress
    ) {
        extra.retry_after_s.get_or_insert(1);
    }
    let allow = match err {
        ApiError::MethodNotAllowed(methods) => Some(methods),
        _ => None,
    };
    write_response(
        out,
        err.status(),
        &err.body_with_index(extra.error_index),
        extra,
        allow,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_what_a_formatter_would_write() {
        for (n, text) in [
            (0u64, "0"),
            (7, "7"),
            (10, "10"),
            (u64::MAX, "18446744073709551615"),
        ] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, text.as_bytes());
        }
        let mut out = Vec::new();
        let extra = Extra {
            rate: Some(RateHeaders {
                limit: 100,
                remaining: 0,
                reset_s: 59,
            }),
            retry_after_s: Some(3),
            close: true,
            ..Extra::default()
        };
        write_head(&mut out, 429, 1234, extra, Some("GET, POST"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n\
             Content-Length: 1234\r\nRateLimit-Limit: 100\r\nRateLimit-Remaining: 0\r\n\
             RateLimit-Reset: 59\r\nRetry-After: 3\r\nAllow: GET, POST\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn error_bodies_are_json_with_code_and_message() {
        let all = [
            ApiError::InvalidJson,
            ApiError::MissingField("channel"),
            ApiError::InvalidField("data", "must be an object or a string"),
            ApiError::FieldTooLong("event"),
            ApiError::Unauthorized(crate::auth::KeyRefusal::Missing(
                crate::apikey::KeyKind::Secret,
            )),
            ApiError::PayloadTooLarge,
            ApiError::UnsupportedMediaType,
            ApiError::RateLimited,
            ApiError::Unavailable(crate::error::Unavailable::ShuttingDown),
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
    fn a_body_written_in_place_gets_the_same_answer() {
        let mut direct = b"before".to_vec();
        write_json(&mut direct, 200, br#"{"a":1}"#, Extra::default());
        let mut in_place = b"before".to_vec();
        write_json_with(&mut in_place, 200, Extra::default(), |out| {
            out.extend_from_slice(br#"{"a":1}"#)
        });
        assert_eq!(direct, in_place);
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            ApiError::Unavailable(crate::error::Unavailable::QueueFull),
            Extra::default(),
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "));
        assert!(text.contains("Retry-After: 1\r\n"));
    }
}
