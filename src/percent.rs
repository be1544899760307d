//! Percent-decoding of URL query values and path segments, the one decoder every caller
//! uses. Callers choose what `+` means: a space in a form-encoded query value (the native
//! REST queries, as browsers and HTTP clients send them), itself where a signature covers
//! the raw text (Pusher's signed queries and the `{channel}` path segment).
//! Invariant: the result is the exact bytes the escapes name, and valid UTF-8, or an error;
//! an escape is `%` and exactly two hexadecimal digits (no sign, no one-digit form).

/// What a `+` stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plus {
    /// `+` is a space (`application/x-www-form-urlencoded`).
    Space,
    /// `+` is itself.
    Literal,
}

/// Why a text does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PercentError {
    /// A `%` not followed by two hexadecimal digits.
    Escape,
    /// The decoded bytes are not UTF-8.
    Utf8,
}

/// Decode `%XX` escapes (and `+` as `plus` says).
pub(crate) fn decode(raw: &[u8], plus: Plus) -> Result<String, PercentError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hi = raw.get(i + 1).and_then(|&b| hex_digit(b));
                let lo = raw.get(i + 2).and_then(|&b| hex_digit(b));
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(PercentError::Escape);
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus == Plus::Space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| PercentError::Utf8)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_plus_and_errors() {
        assert_eq!(decode(b"a%20b+c", Plus::Space).unwrap(), "a b c");
        assert_eq!(decode(b"a%20b+c", Plus::Literal).unwrap(), "a b+c");
        assert_eq!(decode(b"%C3%A9", Plus::Space).unwrap(), "é");
        for bad in [&b"%"[..], b"%4", b"%zz", b"%+f", b"%-1"] {
            assert_eq!(
                decode(bad, Plus::Space),
                Err(PercentError::Escape),
                "{bad:?}"
            );
        }
        assert_eq!(decode(b"%C3", Plus::Literal), Err(PercentError::Utf8));
        assert_eq!(decode(b"\xff", Plus::Literal), Err(PercentError::Utf8));
    }
}
