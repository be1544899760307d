//! The shared writer of the frames built from parts: the payload is produced twice by the
//! same code, once into a byte counter and once into a buffer of exactly that size behind
//! the frame header, so the header is right and nothing is copied again. Also the JSON
//! pieces those payloads are made of: a JSON object given as a table of fields
//! ([`object`]), whose values are string literals, numbers, checked JSON text, nested
//! objects, or a JSON document written into a string.
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
struct Esc<'a>(&'a mut dyn Sink);

impl Sink for Esc<'_> {
    fn put(&mut self, bytes: &[u8]) {
        json::escape_chunks(bytes, |chunk| self.0.put(chunk));
    }
}

/// `s` as a JSON string literal.
fn str_lit(out: &mut dyn Sink, s: &str) {
    out.put(b"\"");
    Esc(&mut *out).put(s.as_bytes());
    out.put(b"\"");
}

/// `n` in decimal.
pub(super) fn num(out: &mut dyn Sink, n: u64) {
    let mut buf = [0u8; 20];
    out.put(json::decimal(n, &mut buf));
}

/// A value of a frame's JSON object ([`object`]).
#[derive(Clone, Copy)]
pub(super) enum Val<'a> {
    /// The field is left out (an optional field that is not there).
    Absent,
    /// A JSON string of this text, escaped.
    Str(&'a str),
    /// JSON text the caller checked (an object, a string literal), copied as it is.
    Json(&'a str),
    /// A number, in decimal.
    Num(u64),
    /// `true` or `false`.
    Bool(bool),
    /// A nested object.
    Obj(&'a [Field<'a>]),
    /// The JSON text of the value as a JSON string: Pusher's double-encoded `data`.
    Quoted(&'a Val<'a>),
}

/// A field of a frame's JSON object: its key (a literal that needs no escaping) and
/// its value.
pub(super) type Field<'a> = (&'static str, Val<'a>);

/// `{"key":value,...}` of the fields that are not [`Val::Absent`], in their order.
/// Every server frame but the message frame is one such object.
pub(super) fn object(out: &mut dyn Sink, fields: &[Field<'_>]) {
    let mut written = false;
    for (key, val) in fields {
        if let Val::Absent = val {
            continue;
        }
        out.put(if written { b",\"" } else { b"{\"" });
        out.put(key.as_bytes());
        out.put(b"\":");
        value(out, val);
        written = true;
    }
    out.put(if written { b"}" } else { b"{}" });
}

/// One value of [`object`] (nothing for [`Val::Absent`], which `object` skips with its
/// key).
fn value(out: &mut dyn Sink, val: &Val<'_>) {
    match *val {
        Val::Absent => {}
        Val::Str(s) => str_lit(out, s),
        Val::Json(text) => out.put(text.as_bytes()),
        Val::Num(n) => num(out, n),
        Val::Bool(b) => out.put(if b { b"true" } else { b"false" }),
        Val::Obj(fields) => object(out, fields),
        Val::Quoted(inner) => {
            out.put(b"\"");
            value(&mut Esc(&mut *out), inner);
            out.put(b"\"");
        }
    }
}

/// The text frame of one JSON object ([`object`]).
pub(super) fn object_frame(fields: &[Field<'_>]) -> Bytes {
    build(|out| object(out, fields))
}

/// A text frame whose payload `write` produces: counted first, then written into one
/// buffer of the exact size.
fn build(write: impl Fn(&mut dyn Sink)) -> Bytes {
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
