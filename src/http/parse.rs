//! Request head parsing: httparse over the connection's read buffer, kept as offsets.
//!
//! [`parse_head`] returns `Ok(None)` when the head is not complete yet (nothing is
//! consumed), `Ok(Some(head))` with byte ranges into the same buffer (no header value is
//! copied), or an [`HttpError`] for input that can never become a valid request. Only
//! the headers ringcast acts on are kept; the rest are checked for size and count only.
//!
//! Framing rules (request smuggling defences): a `Transfer-Encoding` header is answered
//! with 411 (ringcast does not accept chunked request bodies; backends send
//! `Content-Length`), `Transfer-Encoding` together with `Content-Length` is a 400.
//!
//! Strict HTTP/1.1 (400, the connection then closes): every line of the head ends with
//! CRLF (httparse also takes a bare LF, which a proxy in front may read differently, so
//! the complete head is scanned once for a `\n` without its `\r`), and each header
//! ringcast acts on whose repetition could be read two ways (`Content-Length`,
//! `Content-Type`, `X-Api-Key`, `Host`, `Upgrade`, `Sec-WebSocket-Key`) appears at most
//! once, equal values included: no "first wins" or "last wins" for a proxy and the
//! server to disagree on. Which endpoints refuse a body at all is the router's
//! decision ([`RequestHead::has_body`], `route`).

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
    /// `Idempotency-Key` (publish endpoints). Given twice, an empty range: the publish
    /// refuses it as invalid (400 `invalid_idempotency_key`), not as a framing error.
    pub idempotency_key: Option<Range<usize>>,
    pub connection_close: bool,
    pub connection_upgrade: bool,
    pub upgrade_websocket: bool,
    pub ws_key: Option<Range<usize>>,
    pub ws_version: Option<Range<usize>>,
    /// The first `Sec-WebSocket-Extensions` header (the upgrade's permessage-deflate
    /// offer); read all of them with [`RequestHead::ws_extension_values`].
    pub ws_extensions: Option<Range<usize>>,
    /// Any later `Sec-WebSocket-Extensions` headers, in order: several lines of one
    /// header are one comma-separated list (RFC 7230 §3.2.2). Empty (no allocation) in
    /// the usual one-header case.
    pub ws_extensions_more: Vec<Range<usize>>,
    /// `User-Agent` (upgrades only look at it: Safari 15.0–15.3 gets no compression).
    pub user_agent: Option<Range<usize>>,
    pub http10: bool,
    /// The last `X-Forwarded-For` header (read only for a trusted proxy's requests).
    pub forwarded_for: Option<Range<usize>>,
}

impl RequestHead {
    pub fn method(&self) -> Method {
        self.method.unwrap_or(Method::Other)
    }

    /// Every `Sec-WebSocket-Extensions` value of the request in `buf`, in order: the
    /// offers of all of them, taken in turn, are the one list RFC 7230 makes of them.
    pub fn ws_extension_values<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        self.ws_extensions
            .iter()
            .chain(&self.ws_extensions_more)
            .filter_map(move |r| buf.get(r.clone()))
    }

    /// Whether the connection should stay open after this request.
    pub fn keep_alive(&self) -> bool {
        !self.connection_close && !self.http10
    }

    /// Whether the head declares a body (`Content-Length` above 0; a
    /// `Transfer-Encoding` head never gets past [`parse_head`]). Endpoints that take no
    /// body refuse it from this, before any of it is waited for.
    pub fn has_body(&self) -> bool {
        self.content_length.is_some_and(|n| n > 0)
    }
}

/// Headers that may appear at most once, one bit each (see [`parse_head`]).
mod once {
    pub(super) const CONTENT_LENGTH: u8 = 1 << 0;
    pub(super) const CONTENT_TYPE: u8 = 1 << 1;
    pub(super) const API_KEY: u8 = 1 << 2;
    pub(super) const HOST: u8 = 1 << 3;
    pub(super) const UPGRADE: u8 = 1 << 4;
    pub(super) const WS_KEY: u8 = 1 << 5;
}

/// Mark `bit` as seen; a second sighting is the 400 `why`.
fn first_time(seen: &mut u8, bit: u8, why: &'static str) -> Result<(), HttpError> {
    if *seen & bit != 0 {
        return Err(HttpError::BadRequest(why));
    }
    *seen |= bit;
    Ok(())
}

/// Whether `head` has a line feed not preceded by a carriage return: one memchr pass.
fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// Parse the head at the start of `buf`. `max_head` bounds the head in bytes (431 when
/// exceeded, even while incomplete) and `max_headers` the header count (431).
pub fn parse_head(
    buf: &[u8],
    max_head: usize,
    max_headers: usize,
) -> Result<Option<RequestHead>, HttpError> {
    // httparse needs a slot per header; a fixed stack array keeps this allocation-free,
    // and uninitialised slots spare every request a 4 KiB fill (httparse writes only
    // the slots of the headers it finds, and `req.headers` covers exactly those).
    const SLOTS: usize = 128;
    let mut slots = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; SLOTS];
    let limit = max_headers.min(SLOTS);
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(buf, &mut slots[..limit]) {
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
    // Only the complete head: a prefix is "need more" (a bare LF in it is refused once
    // the head completes, or the request times out), and the body is not the head's.
    if has_bare_lf(&buf[..head_len]) {
        return Err(HttpError::BadRequest(
            "bare LF in the request head (every line must end with CRLF)",
        ));
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
    let mut seen = 0u8;
    for h in req.headers.iter() {
        let name = h.name;
        let value = h.value;
        if name.eq_ignore_ascii_case("host") {
            first_time(&mut seen, once::HOST, "duplicate Host header")?;
        } else if name.eq_ignore_ascii_case("content-length") {
            first_time(
                &mut seen,
                once::CONTENT_LENGTH,
                "duplicate Content-Length header",
            )?;
            head.content_length = Some(parse_content_length(value)?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            saw_transfer_encoding = true;
        } else if name.eq_ignore_ascii_case("content-type") {
            first_time(
                &mut seen,
                once::CONTENT_TYPE,
                "duplicate Content-Type header",
            )?;
            head.content_type = Some(range_of(value));
        } else if name.eq_ignore_ascii_case("x-api-key") {
            first_time(&mut seen, once::API_KEY, "duplicate X-Api-Key header")?;
            head.api_key = Some(range_of(value));
        } else if name.eq_ignore_ascii_case("idempotency-key") {
            head.idempotency_key = match head.idempotency_key {
                None => Some(range_of(value)),
                Some(_) => Some(0..0),
            };
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
            first_time(&mut seen, once::UPGRADE, "duplicate Upgrade header")?;
            head.upgrade_websocket = value
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"websocket"));
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            first_time(
                &mut seen,
                once::WS_KEY,
                "duplicate Sec-WebSocket-Key header",
            )?;
            head.ws_key = Some(range_of(trim(value)));
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            head.ws_version = Some(range_of(trim(value)));
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            if head.ws_extensions.is_none() {
                head.ws_extensions = Some(range_of(value));
            } else {
                head.ws_extensions_more.push(range_of(value));
            }
        } else if name.eq_ignore_ascii_case("user-agent") {
            head.user_agent = Some(range_of(value));
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            head.forwarded_for = Some(range_of(value));
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
    fn every_extensions_header_is_read_in_order() {
        let one = "GET / HTTP/1.1\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n";
        let head = parse(one).unwrap().unwrap();
        let values: Vec<&[u8]> = head.ws_extension_values(one.as_bytes()).collect();
        assert_eq!(values, vec![&b"permessage-deflate"[..]]);
        assert_eq!(
            head.ws_extensions_more.capacity(),
            0,
            "one header: no allocation"
        );
        let three = "GET / HTTP/1.1\r\nSec-WebSocket-Extensions: x-webkit\r\nHost: h\r\nSec-WebSocket-Extensions: foo, bar\r\nsec-websocket-extensions: permessage-deflate; client_max_window_bits\r\n\r\n";
        let head = parse(three).unwrap().unwrap();
        let values: Vec<&[u8]> = head.ws_extension_values(three.as_bytes()).collect();
        assert_eq!(
            values,
            vec![
                &b"x-webkit"[..],
                b"foo, bar",
                b"permessage-deflate; client_max_window_bits"
            ]
        );
        let none = parse("GET / HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(none.ws_extension_values(b"").count(), 0);
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

    fn bad_request(raw: &str) -> &'static str {
        match parse(raw) {
            Err(HttpError::BadRequest(why)) => why,
            other => panic!("{raw:?}: expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn bare_lf_anywhere_in_the_head_is_rejected() {
        // httparse takes every one of these as a complete head.
        for raw in [
            "GET /health HTTP/1.1\nHost: t\r\n\r\n",
            "GET /health HTTP/1.1\r\nHost: t\nX-A: b\r\n\r\n",
            "GET /health HTTP/1.1\r\nHost: t\r\n\n",
            "GET /health HTTP/1.1\nHost: t\n\n",
            "\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n",
            "POST /api/v1/publish HTTP/1.1\r\nX-Api-Key: sk_a\nContent-Length: 2\r\n\r\n{}",
        ] {
            assert!(bad_request(raw).contains("bare LF"), "{raw:?}");
        }
        // CRLF throughout is fine, and a LF in the body is the body's business.
        let ok = "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\na\nb";
        assert_eq!(parse(ok).unwrap().unwrap().content_length, Some(3));
        // An incomplete head stays "need more" (the contract), bare LF or not.
        assert!(parse("GET / HTTP/1.1\nHost: t\r\n").unwrap().is_none());
    }

    #[test]
    fn headers_ringcast_acts_on_may_appear_only_once() {
        let cases = [
            ("X-Api-Key: pk_public\r\nX-Api-Key: sk_secret", "X-Api-Key"),
            ("X-Api-Key: sk_same\r\nx-api-key: sk_same", "X-Api-Key"),
            (
                "Content-Type: text/plain\r\nContent-Type: application/json",
                "Content-Type",
            ),
            ("Content-Length: 2\r\nContent-Length: 2", "Content-Length"),
            ("Content-Length: 2\r\nContent-Length: 3", "Content-Length"),
            ("Host: a\r\nHOST: b", "Host"),
            ("Host: a\r\nHost: a", "Host"),
            ("Upgrade: websocket\r\nUpgrade: websocket", "Upgrade"),
            ("Upgrade: h2c\r\nUpgrade: websocket", "Upgrade"),
            (
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==",
                "Sec-WebSocket-Key",
            ),
        ];
        for (headers, name) in cases {
            let raw = format!("POST /api/v1/publish HTTP/1.1\r\n{headers}\r\n\r\n");
            let why = bad_request(&raw);
            assert_eq!(why, format!("duplicate {name} header"), "{raw:?}");
        }
        // Headers ringcast does not act on, and list headers, may repeat.
        let ok = "GET /health HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nX-A: 2\r\nConnection: keep-alive\r\nConnection: Upgrade\r\n\r\n";
        let head = parse(ok).unwrap().unwrap();
        assert!(head.connection_upgrade);
    }

    #[test]
    fn has_body_is_a_positive_content_length() {
        let head = |extra: &str| {
            parse(&format!("GET /health HTTP/1.1\r\nHost: t\r\n{extra}\r\n"))
                .unwrap()
                .unwrap()
        };
        assert!(!head("").has_body());
        assert!(!head("Content-Length: 0\r\n").has_body());
        assert!(head("Content-Length: 1\r\n").has_body());
        assert!(head("Content-Length: 65536\r\n").has_body());
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
