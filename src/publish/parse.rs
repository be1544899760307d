//! Publish body parsing and validation with simd-json.
//!
//! simd-json rewrites its input while unescaping strings, so the body is first copied
//! into a per-worker scratch buffer and parsed there into a reusable tape; `channel` and
//! `event` are borrowed from that scratch. `data` is forwarded byte for byte as the
//! publisher wrote it (subscribers get exactly the published data, key order and number
//! formatting included), so its span is located in the original body by a small scanner
//! that runs only after simd-json has proven the body is valid JSON.
//!
//! Rules (docs/protocol.md): body is a JSON object; `channel` and `event` are strings of
//! 1..=100 Unicode scalar values without ASCII control characters; `data` is an object
//! or a string; unknown fields are ignored; with duplicate keys the last one wins (as
//! in simd-json's and serde_json's object models).

use std::ops::Range;

use simd_json::{Buffers, Node, Tape};

use crate::error::ApiError;
use crate::names::NameError;

/// A validated publish, borrowing from the parser's scratch and the original body.
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    pub channel: &'a str,
    pub event: &'a str,
    /// The raw JSON text of `data`, exactly as published.
    pub data: &'a [u8],
}

/// Reusable parser state: one per worker, so steady-state parsing does not allocate.
pub struct PublishParser {
    buffers: Buffers,
    scratch: Vec<u8>,
    tape: Option<Tape<'static>>,
}

impl Default for PublishParser {
    fn default() -> Self {
        PublishParser {
            buffers: Buffers::new(4096),
            scratch: Vec::with_capacity(4096),
            tape: Some(Tape::null().reset()),
        }
    }
}

#[derive(Clone, Copy)]
enum Kind<'a> {
    Str(&'a str),
    Object,
    Other,
}

/// Numbers, booleans and null are all `Node::Static`, hence `Kind::Other`.
fn kind<'a>(node: &Node<'a>) -> Kind<'a> {
    match node {
        Node::String(s) => Kind::Str(s),
        Node::Object { .. } => Kind::Object,
        _ => Kind::Other,
    }
}

impl PublishParser {
    pub fn new() -> PublishParser {
        PublishParser::default()
    }

    /// Parse and validate `body`.
    pub fn parse<'a>(&'a mut self, body: &'a [u8]) -> Result<Publish<'a>, ApiError> {
        self.scratch.clear();
        self.scratch.extend_from_slice(body);
        let mut tape: Tape<'a> = self.tape.take().unwrap_or_else(Tape::null).reset();
        let result = match simd_json::fill_tape(&mut self.scratch, &mut self.buffers, &mut tape) {
            Ok(()) => fields(&tape.0),
            Err(_) => Err(ApiError::InvalidJson),
        };
        let fields = result;
        self.tape = Some(tape.reset());
        let (channel, event, data_kind) = fields?;
        let data = match data_kind {
            Kind::Object | Kind::Str(_) => top_level_value(body, b"data")
                .map(|r| &body[r])
                .ok_or(ApiError::InvalidJson)?,
            Kind::Other => {
                return Err(ApiError::InvalidField(
                    "data",
                    "must be a JSON object or a string",
                ))
            }
        };
        Ok(Publish {
            channel,
            event,
            data,
        })
    }
}

type Fields<'a> = (&'a str, &'a str, Kind<'a>);

fn fields<'a>(nodes: &[Node<'a>]) -> Result<Fields<'a>, ApiError> {
    let Some(Node::Object { len, .. }) = nodes.first() else {
        return Err(ApiError::NotAnObject);
    };
    let (mut channel, mut event, mut data) = (None, None, None);
    let mut i = 1;
    for _ in 0..*len {
        let key = match nodes.get(i) {
            Some(Node::String(k)) => *k,
            _ => return Err(ApiError::InvalidJson),
        };
        let value = nodes.get(i + 1).ok_or(ApiError::InvalidJson)?;
        match key {
            "channel" => channel = Some(kind(value)),
            "event" => event = Some(kind(value)),
            "data" => data = Some(kind(value)),
            _ => {}
        }
        i += 1 + node_span(value);
    }
    let channel = name_field("channel", channel)?;
    let event = name_field("event", event)?;
    let data = data.ok_or(ApiError::MissingField("data"))?;
    Ok((channel, event, data))
}

/// Number of tape nodes a value occupies, itself included.
fn node_span(node: &Node<'_>) -> usize {
    match node {
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        Node::String(_) | Node::Static(_) => 1,
    }
}

fn name_field<'a>(name: &'static str, value: Option<Kind<'a>>) -> Result<&'a str, ApiError> {
    let s = match value {
        None => return Err(ApiError::MissingField(name)),
        Some(Kind::Str(s)) => s,
        Some(_) => return Err(ApiError::InvalidField(name, "must be a string")),
    };
    validate_name(name, s)?;
    Ok(s)
}

/// A channel or event name, checked by the one rule both APIs share (`crate::names`).
pub(crate) fn validate_name(name: &'static str, s: &str) -> Result<(), ApiError> {
    crate::names::check(s).map_err(|e| match e {
        NameError::Empty => ApiError::InvalidField(name, "must not be empty"),
        NameError::TooLong => ApiError::FieldTooLong(name),
        NameError::ControlCharacter => {
            ApiError::InvalidField(name, "must not contain control characters")
        }
    })
}

/// Span of the value of the last top-level `key` in a JSON object. The text must be
/// valid JSON (simd-json checked it); on anything unexpected the answer is `None`.
pub(crate) fn top_level_value(text: &[u8], key: &[u8]) -> Option<Range<usize>> {
    let mut p = skip_ws(text, 0);
    if text.get(p) != Some(&b'{') {
        return None;
    }
    p += 1;
    let mut found = None;
    loop {
        p = skip_ws(text, p);
        match text.get(p)? {
            b'}' => return found,
            b',' => {
                p += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let key_start = p;
        p = skip_string(text, p)?;
        let raw_key = &text[key_start..p];
        p = skip_ws(text, p);
        if text.get(p) != Some(&b':') {
            return None;
        }
        p = skip_ws(text, p + 1);
        let value_start = p;
        p = skip_value(text, p)?;
        if key_matches(raw_key, key) {
            found = Some(value_start..p);
        }
    }
}

fn key_matches(raw_key: &[u8], key: &[u8]) -> bool {
    let inner = &raw_key[1..raw_key.len() - 1];
    if !inner.contains(&b'\\') {
        return inner == key;
    }
    serde_json::from_slice::<String>(raw_key).is_ok_and(|k| k.as_bytes() == key)
}

fn skip_ws(text: &[u8], mut p: usize) -> usize {
    while matches!(text.get(p), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        p += 1;
    }
    p
}

/// `p` is at an opening quote; returns the index after the closing quote. Jumps from
/// one quote or backslash to the next with memchr (SIMD), so long strings in `data`
/// cost about what copying them costs.
fn skip_string(text: &[u8], mut p: usize) -> Option<usize> {
    p += 1;
    loop {
        p += memchr::memchr2(b'"', b'\\', text.get(p..)?)?;
        match text[p] {
            b'\\' => p += 2,
            _ => return Some(p + 1),
        }
    }
}

fn skip_value(text: &[u8], mut p: usize) -> Option<usize> {
    match text.get(p)? {
        b'"' => skip_string(text, p),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match text.get(p)? {
                    b'"' => {
                        p = skip_string(text, p)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(p + 1);
                        }
                    }
                    _ => {}
                }
                p += 1;
            }
        }
        _ => {
            while !matches!(
                text.get(p),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                p += 1;
            }
            Some(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<(String, String, String), ApiError> {
        let mut p = PublishParser::new();
        let m = p.parse(body.as_bytes())?;
        Ok((
            m.channel.to_string(),
            m.event.to_string(),
            String::from_utf8(m.data.to_vec()).unwrap(),
        ))
    }

    #[test]
    fn valid_publish_keeps_data_verbatim() {
        let (c, e, d) = parse(
            r#"{"channel":"news","event":"order.created","data":{"b":1.50,"a":[1,{"x":"}"}]},"extra":true}"#,
        )
        .unwrap();
        assert_eq!(c, "news");
        assert_eq!(e, "order.created");
        assert_eq!(d, r#"{"b":1.50,"a":[1,{"x":"}"}]}"#);
        let (_, _, d) = parse(r#"{ "data" : "hi \"there\"" , "channel":"c","event":"e"}"#).unwrap();
        assert_eq!(d, r#""hi \"there\"""#);
    }

    #[test]
    fn nested_values_before_fields_are_skipped() {
        let (c, _, d) = parse(
            r#"{"x":{"channel":"no","y":[{"z":1},[2,3]]},"channel":"yes","event":"e","data":"d"}"#,
        )
        .unwrap();
        assert_eq!(c, "yes");
        assert_eq!(d, r#""d""#);
    }

    #[test]
    fn every_400_case() {
        assert_eq!(parse("not json"), Err(ApiError::InvalidJson));
        assert_eq!(parse("[1,2]"), Err(ApiError::NotAnObject));
        assert_eq!(parse(r#""str""#), Err(ApiError::NotAnObject));
        assert_eq!(
            parse(r#"{"event":"e","data":{}}"#),
            Err(ApiError::MissingField("channel"))
        );
        assert_eq!(
            parse(r#"{"channel":"c","data":{}}"#),
            Err(ApiError::MissingField("event"))
        );
        assert_eq!(
            parse(r#"{"channel":"c","event":"e"}"#),
            Err(ApiError::MissingField("data"))
        );
        assert!(matches!(
            parse(r#"{"channel":1,"event":"e","data":{}}"#),
            Err(ApiError::InvalidField("channel", _))
        ));
        for bad in ["1", "null", "[1]", "true"] {
            let body = format!(r#"{{"channel":"c","event":"e","data":{bad}}}"#);
            assert!(matches!(
                parse(&body),
                Err(ApiError::InvalidField("data", _))
            ));
        }
        assert!(matches!(
            parse(r#"{"channel":"","event":"e","data":{}}"#),
            Err(ApiError::InvalidField("channel", _))
        ));
        assert!(matches!(
            parse(r#"{"channel":"a\u0001b","event":"e","data":{}}"#),
            Err(ApiError::InvalidField("channel", _))
        ));
        let long = "a".repeat(101);
        assert_eq!(
            parse(&format!(
                r#"{{"channel":"{long}","event":"e","data":{{}}}}"#
            )),
            Err(ApiError::FieldTooLong("channel"))
        );
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        let ok = "é".repeat(100);
        assert!(parse(&format!(r#"{{"channel":"{ok}","event":"e","data":"x"}}"#)).is_ok());
        let too_long = "é".repeat(101);
        assert_eq!(
            parse(&format!(
                r#"{{"channel":"c","event":"{too_long}","data":"x"}}"#
            )),
            Err(ApiError::FieldTooLong("event"))
        );
    }

    #[test]
    fn duplicate_keys_last_wins_and_escaped_keys_match() {
        let (_, _, d) =
            parse(r#"{"channel":"c","event":"e","data":"first","d\u0061ta":{"k":2}}"#).unwrap();
        assert_eq!(d, r#"{"k":2}"#);
    }

    #[test]
    fn parser_is_reusable() {
        let mut p = PublishParser::new();
        for i in 0..100 {
            let body = format!(r#"{{"channel":"c{i}","event":"e","data":{{"i":{i}}}}}"#);
            let m = p.parse(body.as_bytes()).unwrap();
            assert_eq!(m.channel, format!("c{i}"));
        }
    }
}
