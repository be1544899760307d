//! Reading the few fields the storm client needs (`type`, `channel`, `offset`, `epoch`,
//! `recovered`, and the publisher's send stamp `t`) straight out of a server frame, without building a JSON value.
//!
//! Invariants:
//! - Never allocates, never panics: a missing or malformed field is `None`.
//! - Sound for ringcast's frames as documented (`docs/protocol.md`, "Server to client"):
//!   the storm publisher's `data` is `{"k":<n>,"t":<unix ns>}`, so no key searched for
//!   here other than `t` can occur inside a payload, and `t` occurs only there.

/// The string value of `"key":"..."` (no escapes: names and epochs have none).
pub fn str_field<'a>(frame: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let at = find_key(frame, key)?;
    let rest = frame.get(at..)?;
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    (rest.get(end) == Some(&b'"')).then(|| &rest[..end])
}

/// The unsigned integer value of `"key":N`.
pub fn u64_field(frame: &[u8], key: &str) -> Option<u64> {
    let at = find_key(frame, key)?;
    let digits = frame[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 || digits > 19 {
        return None;
    }
    std::str::from_utf8(&frame[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// `"key":true` / `"key":false`.
pub fn bool_field(frame: &[u8], key: &str) -> Option<bool> {
    let at = find_key(frame, key)?;
    let rest = &frame[at..];
    if rest.starts_with(b"true") {
        Some(true)
    } else if rest.starts_with(b"false") {
        Some(false)
    } else {
        None
    }
}

/// An epoch as its 8 bytes.
pub fn epoch(frame: &[u8]) -> Option<[u8; 8]> {
    str_field(frame, "epoch")?.try_into().ok()
}

/// Index just after `"key":` (and any spaces), first occurrence.
fn find_key(frame: &[u8], key: &str) -> Option<usize> {
    let k = key.as_bytes();
    let n = k.len() + 3;
    let mut i = 0;
    while i + n <= frame.len() {
        if frame[i] == b'"'
            && frame[i + 1..].starts_with(k)
            && frame.get(i + 1 + k.len()) == Some(&b'"')
            && frame.get(i + 2 + k.len()) == Some(&b':')
        {
            let mut j = i + n;
            while frame.get(j) == Some(&b' ') {
                j += 1;
            }
            return Some(j);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_message_and_subscribed_frames() {
        let m = br#"{"type":"message","channel":"ltall","event":"s","data":{"k":7},"id":"d4f6","offset":42,"epoch":"9f3a01c2"}"#;
        assert_eq!(str_field(m, "type"), Some(&b"message"[..]));
        assert_eq!(str_field(m, "channel"), Some(&b"ltall"[..]));
        assert_eq!(u64_field(m, "offset"), Some(42));
        assert_eq!(epoch(m), Some(*b"9f3a01c2"));
        let s = br#"{"type":"subscribed","channel":"c","recovered":true,"offset":45,"epoch":"9f3a01c2"}"#;
        assert_eq!(bool_field(s, "recovered"), Some(true));
        assert_eq!(u64_field(s, "offset"), Some(45));
    }

    #[test]
    fn reads_the_publishers_send_stamp() {
        let m = br#"{"type":"message","channel":"ltall","event":"s","data":{"k":7,"t":1795000000123456789},"id":"d4f6","offset":42,"epoch":"9f3a01c2"}"#;
        // `"type":` is not `"t":`; the stamp is read from `data`.
        assert_eq!(u64_field(m, "t"), Some(1_795_000_000_123_456_789));
        assert_eq!(u64_field(m, "k"), Some(7));
        assert_eq!(u64_field(m, "offset"), Some(42));
        // A frame without a stamp (another publisher) has none.
        assert_eq!(
            u64_field(br#"{"type":"message","data":{"k":1}}"#, "t"),
            None
        );
    }

    #[test]
    fn missing_or_malformed_is_none() {
        assert_eq!(u64_field(br#"{"offset":}"#, "offset"), None);
        assert_eq!(u64_field(br#"{"offset""#, "offset"), None);
        assert_eq!(str_field(br#"{"type":"unterminated"#, "type"), None);
        assert_eq!(epoch(br#"{"epoch":"short"}"#), None);
        assert_eq!(bool_field(b"", "recovered"), None);
        // A key that is only a suffix of another does not match.
        assert_eq!(u64_field(br#"{"xoffset":3}"#, "offset"), None);
    }
}
