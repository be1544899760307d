//! The shared writer of the frames built from parts: the payload is produced twice by the
//! same code, once into a byte counter and once into a buffer of exactly that size behind
//! the frame header, so the header is right and nothing is copied again. Also the JSON
//! pieces those payloads are made of (a string literal, a number, a JSON document written
//! into a string).
//!
//! Not for the message frame: that one is on the hot path and written with its length
//! computed up front (`native::message_frame`), without a dynamic sink.

use bytes::Bytes;

use crate::json;
use crate::ws::frame::{self, Opcode};

/// Where an encoder writes its payload: a byte counter or the frame buffer.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

/// Counts what would be written.
struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Writes what it is given into the inner sink as the inside of a JSON string. Nested,
/// it escapes twice (text inside a JSON document inside a JSON string).
pub(super) struct Esc<'a>(pub(super) &'a mut dyn Sink);

impl Sink for Esc<'_> {
    fn put(&mut self, bytes: &[u8]) {
        json::escape_chunks(bytes, |chunk| self.0.put(chunk));
    }
}

/// `s` as a JSON string literal.
pub(super) fn str_lit(out: &mut dyn Sink, s: &str) {
    out.put(b"\"");
    Esc(&mut *out).put(s.as_bytes());
    out.put(b"\"");
}

/// `n` in decimal.
pub(super) fn num(out: &mut dyn Sink, n: u64) {
    let mut buf = [0u8; 20];
    out.put(json::decimal(n, &mut buf));
}

/// A text frame whose payload `write` produces: counted first, then written into one
/// buffer of the exact size.
pub(super) fn build(write: impl Fn(&mut dyn Sink)) -> Bytes {
    let mut count = Count(0);
    write(&mut count);
    let len = count.0;
    let total = frame::header_len(len) + len;
    let mut out = Vec::with_capacity(total);
    frame::write_header(&mut out, Opcode::Text, len);
    write(&mut out);
    debug_assert_eq!(
        out.len(),
        total,
        "the counted and the written payload differ"
    );
    Bytes::from(out)
}
