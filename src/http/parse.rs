//! Request head parsing: httparse over the connection's read buffer, kept as offsets.
//!
//! [`parse_head`] returns `Ok(None)` when the head is not complete yet (nothing is
//! consumed), `Ok(Some(head))` with byte ranges into the same buffer (no header value is
//! copied), or an [`HttpError`] for input that can never become a valid request. Only
//! the headers ringcast acts on are kept; the rest are checked for size and count only.
//!
//! Framing rules (request smuggling defences): a `Transfer-Encoding` header is answered
//! with 411 (ringcast does not accept chunked request bodies; backends send
//! `Content-Length`), `Transfer-Encoding` together with `Content-Length` is a 400,
//! and several `Content-Length` headers must agree or the request is a 400.

use std::ops::Range;

use super::HttpError;

/// Request method, reduced to what the router distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Other,
}

/// A parsed request head; every range indexes the buffer given to [`parse_head`].
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    pub method: Option<Method>,
    pub path: Range<usize>,
    pub query: Option<Range<usize>>,
    /// Bytes of the head including the final CRLF CRLF.
    pub head_len: usize,
    pub content_length: Option<usize>,
    pub content_type: Option<Range<usize>>,
    pub api_key: Option<Range<usize>>,
    pub connection_close: bool,
    pub connection_upgrade: bool,
    pub upgrade_websocket: bool,
    pub ws_key: Option<Range<usize>>,
    pub ws_version: Option<Range<usize>>,
    pub http10: bool,
}

impl RequestHead {
    pub fn method(&self) -> Method {
        self.method.unwrap_or(Method::Other)
    }

    /// Whether the connection should stay open after this request.
    pub fn keep_alive(&self) -> bool {
        !self.connection_close && !self.http10
    }
}

/// Parse the head at the start of `buf`. `max_head` bounds the head in bytes (431 when
/// exceeded, even while incomplete) and `max_headers` the header count (431).
pub fn parse_head(
    buf: &[u8],
    max_head: usize,
    max_headers: usize,
) -> Result<Option<RequestHead>, HttpError> {
    // httparse needs a slot per header; a fixed stack array keeps this allocation-free.
    const SLOTS: usize = 128;
    let mut slots = [httparse::EMPTY_HEADER; SLOTS];
    let limit = max_headers.min(SLOTS);
    let mut req = httparse::Request::new(&mut slots[..limit]);
    let status = match req.parse(buf) {
        Ok(status) => status,
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadersTooLarge),
        Err(_) => return Err(HttpError::BadRequest("malformed request head")),
    };
    let head_len = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => {
            if buf.len() > max_head {
                return Err(HttpError::HeadersTooLarge);
            }
            return Ok(None);
        }
    };
    if head_len > max_head {
        return Err(HttpError::HeadersTooLarge);
    }
    let base = buf.as_ptr() as usize;
    let range_of = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };

    let mut head = RequestHead {
        head_len,
        ..RequestHead::default()
    };
    head.method = Some(match req.method {
        Some("GET") => Method::Get,
        Some("HEAD") => Method::Head,
        Some("POST") => Method::Post,
        _ => Method::Other,
    });
    head.http10 = req.version == Some(0);
    let target = req
        .path
        .ok_or(HttpError::BadRequest("missing request target"))?;
    let target_range = range_of(target.as_bytes());
    match target.find('?') {
        Some(q) => {
            head.path = target_range.start..target_range.start + q;
            head.query = Some(target_range.start + q + 1..target_range.end);
        }
        None => head.path = target_range,
    }

    let mut saw_transfer_encoding = false;
    for h in req.headers.iter() {
        let name = h.name;
        let value = h.value;
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_content_length(value)?;
            if head.content_length.is_some_and(|prev| prev != n) {
                return Err(HttpError::BadRequest("conflicting Content-Length headers"));
            }
            head.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            saw_transfer_encoding = true;
        } else if name.eq_ignore_ascii_case("content-type") {
            head.content_type = Some(range_of(value));
        } else if name.eq_ignore_ascii_case("x-api-key") {
            head.api_key = Some(range_of(value));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',') {
                let token = trim(token);
                if token.eq_ignore_ascii_case(b"close") {
                    head.connection_close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    head.connection_upgrade = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && head.http10 {
                    head.http10 = false;
                }
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            head.upgrade_websocket = value
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"websocket"));
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            head.ws_key = Some(range_of(trim(value)));
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            head.ws_version = Some(range_of(trim(value)));
        }
    }
    if saw_transfer_encoding {
        if head.content_length.is_some() {
            return Err(HttpError::BadRequest(
                "both Transfer-Encoding and Content-Length are present",
            ));
        }
        return Err(HttpError::LengthRequired);
    }
    Ok(Some(head))
}

fn parse_content_length(value: &[u8]) -> Result<usize, HttpError> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(HttpError::BadRequest("invalid Content-Length"));
    }
    value.iter().try_fold(0usize, |acc, &d| {
        acc.checked_mul(10)
            .and_then(|v| v.checked_add((d - b'0') as usize))
            .ok_or(HttpError::BadRequest("invalid Content-Length"))
    })
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Whether a Content-Type value names JSON (`application/json`, any parameters).
pub(crate) fn is_json_media_type(value: &[u8]) -> bool {
    let media = value.split(|&b| b == b';').next().unwrap_or(b"");
    trim(media).eq_ignore_ascii_case(b"application/json")
}

/// Find a query parameter's raw (still percent-encoded) value.
pub(crate) fn query_param<'a>(query: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    query.split(|&b| b == b'&').find_map(|pair| {
        let mut it = pair.splitn(2, |&b| b == b'=');
        let k = it.next()?;
        (k == name).then(|| it.next().unwrap_or(b""))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<RequestHead>, HttpError> {
        parse_head(s.as_bytes(), 16 * 1024, 64)
    }

    #[test]
    fn incomplete_head_is_not_an_error() {
        assert!(parse("POST /api/v1/publish HTTP/1.1\r\nHost: x\r\n")
            .unwrap()
            .is_none());
    }

    #[test]
    fn parses_publish_head_into_offsets() {
        let raw = "POST /api/v1/publish?x=1 HTTP/1.1\r\nX-Api-Key: sk_abc\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 12\r\n\r\n{}";
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.method(), Method::Post);
        assert_eq!(&raw[head.path.clone()], "/api/v1/publish");
        assert_eq!(&raw[head.query.clone().unwrap()], "x=1");
        assert_eq!(&raw[head.api_key.clone().unwrap()], "sk_abc");
        assert!(is_json_media_type(
            raw[head.content_type.clone().unwrap()].as_bytes()
        ));
        assert_eq!(head.content_length, Some(12));
        assert_eq!(head.head_len, raw.len() - 2);
        assert!(head.keep_alive());
    }

    #[test]
    fn framing_attacks_are_rejected() {
        let conflicting = "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(matches!(parse(conflicting), Err(HttpError::BadRequest(_))));
        let negative = "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n";
        assert!(matches!(parse(negative), Err(HttpError::BadRequest(_))));
        let huge = "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert!(matches!(parse(huge), Err(HttpError::BadRequest(_))));
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(parse(chunked), Err(HttpError::LengthRequired)));
        let both = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n";
        assert!(matches!(parse(both), Err(HttpError::BadRequest(_))));
        assert!(matches!(
            parse("GARBAGE\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
    }

    #[test]
    fn head_limits_give_431() {
        let long = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n", "a".repeat(20_000));
        assert!(matches!(parse(&long), Err(HttpError::HeadersTooLarge)));
        let mut many = String::from("GET / HTTP/1.1\r\n");
        for i in 0..100 {
            many.push_str(&format!("X-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert!(matches!(parse(&many), Err(HttpError::HeadersTooLarge)));
    }

    #[test]
    fn query_params() {
        assert_eq!(query_param(b"a=1&key=pk_x", b"key"), Some(&b"pk_x"[..]));
        assert_eq!(query_param(b"a=1", b"key"), None);
    }
}
