//! A minimal HTTP/1.1 response parser for the publish client and the WebSocket
//! upgrade: status code, and how many bytes the whole response occupies.
//!
//! Invariants:
//! - Never allocates, never panics on any input; works on one contiguous buffer.
//! - Incomplete input is `Ok(None)` (nothing consumed); only malformed input is `Err`.
//! - Bodies are located, not copied: the caller drops `total_len` bytes.

/// A response head larger than this is refused: both servers send a few hundred bytes.
pub const MAX_HEAD: usize = 16 * 1024;

/// One complete response in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Bytes of the head (status line, headers and the blank line).
    pub head_len: usize,
    /// Head plus body: how many bytes this response occupies.
    pub total_len: usize,
    /// The server said `Connection: close`: no further response on this socket.
    pub close: bool,
}

/// Why a response was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpError {
    /// Not `HTTP/1.x NNN ...`.
    BadStatusLine,
    /// A header line without a colon, or a bad Content-Length / chunk size.
    BadHeader,
    /// The head is longer than `MAX_HEAD`.
    HeadTooLarge,
    /// A body without Content-Length or chunked encoding on a keep-alive connection.
    NoLength,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            HttpError::BadStatusLine => "malformed status line",
            HttpError::BadHeader => "malformed header",
            HttpError::HeadTooLarge => "response head too large",
            HttpError::NoLength => "response body has no length",
        };
        f.write_str(s)
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| p + from)
}

fn parse_decimal(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 15 {
        return None;
    }
    s.iter().try_fold(0usize, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + usize::from(b - b'0'))
    })
}

fn parse_hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 12 {
        return None;
    }
    s.iter().try_fold(0usize, |acc, &b| {
        let d = (b as char).to_digit(16)?;
        Some(acc * 16 + d as usize)
    })
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// Parse the first response in `buf`. With `head_only` the body is not waited for
/// (the WebSocket upgrade: what follows a 101 is the frame stream).
pub fn parse_response(buf: &[u8], head_only: bool) -> Result<Option<Response>, HttpError> {
    let line_end = match find_crlf(buf, 0) {
        Some(e) => e,
        None if buf.len() > MAX_HEAD => return Err(HttpError::HeadTooLarge),
        None => return Ok(None),
    };
    let line = &buf[..line_end];
    if line.len() < 12 || !line.starts_with(b"HTTP/1.") || line[8] != b' ' {
        return Err(HttpError::BadStatusLine);
    }
    let status = parse_decimal(&line[9..12]).ok_or(HttpError::BadStatusLine)? as u16;
    if line.len() > 12 && line[12] != b' ' {
        return Err(HttpError::BadStatusLine);
    }

    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut close = false;
    let mut pos = line_end + 2;
    let head_len = loop {
        let end = match find_crlf(buf, pos) {
            Some(e) => e,
            None if buf.len() > MAX_HEAD => return Err(HttpError::HeadTooLarge),
            None => return Ok(None),
        };
        if end == pos {
            break end + 2;
        }
        if end > MAX_HEAD {
            return Err(HttpError::HeadTooLarge);
        }
        let header = &buf[pos..end];
        let colon = header
            .iter()
            .position(|&b| b == b':')
            .ok_or(HttpError::BadHeader)?;
        let name = &header[..colon];
        let value = trim(&header[colon + 1..]);
        if name.eq_ignore_ascii_case(b"content-length") {
            content_length = Some(parse_decimal(value).ok_or(HttpError::BadHeader)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = value.eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            close = value.eq_ignore_ascii_case(b"close");
        }
        pos = end + 2;
    };

    let no_body = head_only || status / 100 == 1 || status == 204 || status == 304;
    let total_len = if no_body {
        head_len
    } else if chunked {
        match chunked_len(buf, head_len)? {
            Some(n) => n,
            None => return Ok(None),
        }
    } else if let Some(n) = content_length {
        if buf.len() < head_len + n {
            return Ok(None);
        }
        head_len + n
    } else {
        return Err(HttpError::NoLength);
    };
    Ok(Some(Response {
        status,
        head_len,
        total_len,
        close,
    }))
}

/// End offset of a chunked body starting at `pos`, trailers included.
fn chunked_len(buf: &[u8], mut pos: usize) -> Result<Option<usize>, HttpError> {
    // Bounded: each iteration consumes at least one chunk-size line.
    loop {
        let Some(end) = find_crlf(buf, pos) else {
            return Ok(None);
        };
        let size_field = &buf[pos..end];
        let size_field = match size_field.iter().position(|&b| b == b';') {
            Some(semi) => &size_field[..semi],
            None => size_field,
        };
        let size = parse_hex(trim(size_field)).ok_or(HttpError::BadHeader)?;
        pos = end + 2;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let Some(end) = find_crlf(buf, pos) else {
                    return Ok(None);
                };
                if end == pos {
                    return Ok(Some(end + 2));
                }
                pos = end + 2;
            }
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err(HttpError::BadHeader);
        }
        pos += size + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_response() {
        let r = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"id\":\"abc\"}HTTP/1.1";
        let p = parse_response(r, false).unwrap().unwrap();
        assert_eq!(p.status, 202);
        assert_eq!(p.total_len, r.len() - 8);
        assert!(!p.close);
        for cut in 0..p.total_len {
            assert_eq!(parse_response(&r[..cut], false), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn chunked_response_with_trailer() {
        let r = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\nX-T: 1\r\n\r\n";
        let p = parse_response(r, false).unwrap().unwrap();
        assert_eq!((p.status, p.total_len, p.close), (201, r.len(), true));
        for cut in 0..r.len() {
            assert_eq!(parse_response(&r[..cut], false), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn upgrade_head_only() {
        let r = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02{}";
        let p = parse_response(r, true).unwrap().unwrap();
        assert_eq!((p.status, p.total_len), (101, r.len() - 4));
    }

    #[test]
    fn status_without_reason_and_no_body_statuses() {
        let p = parse_response(b"HTTP/1.1 204\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!((p.status, p.total_len), (204, 16));
    }

    #[test]
    fn malformed_inputs_are_errors() {
        assert_eq!(
            parse_response(b"HTTX/1.1 200 OK\r\n\r\n", false),
            Err(HttpError::BadStatusLine)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 2x0 OK\r\n\r\n", false),
            Err(HttpError::BadStatusLine)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", false),
            Err(HttpError::BadHeader)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false),
            Err(HttpError::BadHeader)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\n\r\nbody", false),
            Err(HttpError::NoLength)
        );
        let mut huge = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        huge.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse_response(&huge, false), Err(HttpError::HeadTooLarge));
        assert_eq!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                false
            ),
            Err(HttpError::BadHeader)
        );
    }
}
