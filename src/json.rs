//! JSON text written by hand on the hot path: string escaping for the frames and
//! replies the server encodes itself (broadcasts, subscribe replies, error frames).
//!
//! Output is always valid JSON for any `&str` input: quotes, backslashes and every
//! control character (including DEL) are escaped. A leaf: it names no other module.

/// JSON string escaping of `s`, appended to `out` with the quotes.
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => {
                out.extend_from_slice(&bytes[start..i]);
                let hex = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    hex[(b >> 4) as usize],
                    hex[(b & 0xf) as usize],
                ]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
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
