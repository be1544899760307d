//! JSON text written by hand on the hot path: string escaping for the frames and
//! replies the server encodes itself (broadcasts, subscribe replies, error frames).
//!
//! Output is always valid JSON for any `&str` input: quotes, backslashes and every
//! control character (including DEL) are escaped. [`escape_chunks`] holds the one
//! escape table; [`write_json_str`] and [`json_str_len`] agree with it byte for byte. A
//! leaf: it names no other module.

/// Walk `s` as the inside of a JSON string: `emit` receives, in order, runs of bytes
/// that stand for themselves and the escape sequence of each byte that needs one. The
/// concatenation of what it receives is the escaped text, without the quotes.
///
/// Generic over the receiver so that an encoder can escape text that is itself being
/// escaped (a JSON document inside a JSON string, as the Pusher frames need) without a
/// scratch buffer. Escaping never splits a multi-byte UTF-8 sequence: every byte that
/// gets an escape is ASCII.
#[inline]
pub(crate) fn escape_chunks(s: &[u8], mut emit: impl FnMut(&[u8])) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let control;
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => {
                control = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(b >> 4) as usize],
                    HEX[(b & 0xf) as usize],
                ];
                &control
            }
            _ => continue,
        };
        if start < i {
            emit(&s[start..i]);
        }
        emit(esc);
        start = i + 1;
    }
    if start < s.len() {
        emit(&s[start..]);
    }
}

/// JSON string escaping of `s`, appended to `out` with the quotes.
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escape_chunks(s.as_bytes(), |chunk| out.extend_from_slice(chunk));
    out.push(b'"');
}

/// Length of `write_json_str(s)`'s output.
pub(crate) fn json_str_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f | 0x7f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// `v` in decimal, written into the end of `buf` (`u64::MAX` has 20 digits): the one
/// integer writer of the hand-written frames and answers (no `core::fmt` on hot paths).
pub(crate) fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_and_lengths_agree() {
        for b in 0u8..=0x7f {
            let s = format!("a{}b", b as char);
            let mut out = Vec::new();
            write_json_str(&mut out, &s);
            assert_eq!(out.len(), json_str_len(&s), "byte {b:#x}");
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s, "byte {b:#x}");
        }
        let s = "é\u{1F600}\"\\\n\u{7f}x";
        let mut out = Vec::new();
        write_json_str(&mut out, s);
        assert_eq!(&out[..], "\"é\u{1F600}\\\"\\\\\\n\\u007fx\"".as_bytes());
        assert_eq!(out.len(), json_str_len(s));
    }
}
