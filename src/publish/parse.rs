//! Publish body parsing and validation with simd-json: one message
//! (`{channel|channels, event, data}`) or a batch (`{"messages": [...]}`).
//!
//! simd-json rewrites its input while unescaping strings, so the body is first copied
//! into a per-worker scratch buffer and parsed there into a reusable tape; channel and
//! event names are borrowed from that scratch. `data` is forwarded byte for byte as the
//! publisher wrote it (subscribers get exactly the published data, key order and number
//! formatting included), so its span is located in the original body by a small scanner
//! that runs only after simd-json has proven the body is valid JSON. A batch is parsed
//! once, whole: one tape walk validates every message, one scan finds every `data`.
//! The native body and Pusher's (`super::pusher`) are two [`Format`]s of this one parse:
//! a format names its keys and its rules, and what a valid message becomes; the fields
//! of a message object are read once, by one reader, for both.
//!
//! Rules (docs/protocol.md): body is a JSON object; exactly one of `channel` (a name) or
//! `channels` (1..=100 distinct names) is present; names are 1..=100 Unicode scalar
//! values without ASCII control characters; `event` is such a name and does not start
//! with `pusher:` or `pusher_internal:` (reserved for the Pusher protocol); `data` is an
//! object or a string; `socket_id`, when present, is a connection id
//! (`^\d+\.\d+$`) to leave out; unknown fields are ignored; with duplicate keys the last one
//! wins (as in simd-json's and serde_json's object models). A batch holds
//! 1..=`max_batch_messages` messages, each also within the single-publish size limit;
//! the first invalid one is reported with its index and nothing is accepted.

use std::ops::Range;

use simd_json::{Buffers, Node, Tape};

use crate::error::ApiError;
use crate::ids::{is_socket_id_form, SocketId};
use crate::names::NameError;

/// Most names in one `channels` array.
pub(crate) const MAX_CHANNELS: usize = 100;

/// Event name prefixes reserved for the Pusher protocol's own frames.
const RESERVED_EVENT_PREFIXES: [&str; 2] = ["pusher:", "pusher_internal:"];

/// The channels of one message: one name, or a list of distinct names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channels<'a> {
    One(&'a str),
    Many(Vec<&'a str>),
}

impl<'a> Channels<'a> {
    pub fn as_slice(&self) -> &[&'a str] {
        match self {
            Channels::One(c) => std::slice::from_ref(c),
            Channels::Many(v) => v,
        }
    }

    /// Whether the message named exactly one channel with `channel`.
    pub fn is_single(&self) -> bool {
        matches!(self, Channels::One(_))
    }
}

/// A validated publish, borrowing from the parser's scratch and the original body.
#[derive(Debug, Clone)]
pub struct Publish<'a> {
    pub channels: Channels<'a>,
    pub event: &'a str,
    /// The raw JSON text of `data`, exactly as published.
    pub data: &'a [u8],
    /// The connection to leave out (`socket_id`, Laravel's `toOthers()`).
    pub(crate) except: Option<SocketId>,
}

impl<'a> Publish<'a> {
    /// The first (for `channel`, the only) channel.
    pub fn channel(&self) -> &'a str {
        self.channels.as_slice()[0]
    }
}

/// Why a batch was refused: the error, and the index of the first invalid message when
/// one message is to blame (none for a malformed body or a bad message count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchError {
    pub error: ApiError,
    pub index: Option<usize>,
}

impl From<ApiError> for BatchError {
    fn from(error: ApiError) -> Self {
        BatchError { error, index: None }
    }
}

/// Limits of one batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Most messages (`max_batch_messages`).
    pub max_messages: usize,
    /// Largest message, bytes of its JSON object (`max_body_bytes`).
    pub max_message_bytes: usize,
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
pub(super) enum Kind<'a> {
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

    /// Fill the tape from a scratch copy of `body` and run `walk` over its nodes.
    pub(super) fn with_tape<'a, T>(
        &'a mut self,
        body: &[u8],
        walk: impl FnOnce(&[Node<'a>]) -> T,
        invalid: T,
    ) -> T {
        // A raw NUL is never valid JSON (strings escape control characters), but
        // simd-json ends a number at one (its input padding is NUL) and accepts what
        // follows; `data` would then carry NULs to every subscriber (found by the
        // libFuzzer target fuzz/publish_body). One memchr pass refuses them.
        if memchr::memchr(0, body).is_some() {
            return invalid;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(body);
        let mut tape: Tape<'a> = self.tape.take().unwrap_or_else(Tape::null).reset();
        let result = match simd_json::fill_tape(&mut self.scratch, &mut self.buffers, &mut tape) {
            Ok(()) => walk(&tape.0),
            Err(_) => invalid,
        };
        self.tape = Some(tape.reset());
        result
    }

    /// Parse and validate one message (`POST /api/v1/publish`).
    pub fn parse<'a>(&'a mut self, body: &'a [u8]) -> Result<Publish<'a>, ApiError> {
        self.parse_one::<Native>(body)
    }

    /// Parse and validate a whole batch (`POST /api/v1/publish/batch`): every message or
    /// none.
    pub fn parse_batch<'a>(
        &'a mut self,
        body: &'a [u8],
        limits: BatchLimits,
    ) -> Result<Vec<Publish<'a>>, BatchError> {
        self.parse_many::<Native>(body, limits)
    }

    /// One message of format `F`: its fields read from the tape, then its `data`
    /// located in `body`.
    pub(super) fn parse_one<'a, F: Format>(
        &'a mut self,
        body: &'a [u8],
    ) -> Result<F::Message<'a>, ApiError> {
        let (fields, _) = self.with_tape(
            body,
            |nodes| message_fields::<F>(nodes, 0, false),
            Err(ApiError::InvalidJson),
        )?;
        finish::<F>(fields, body)
    }

    /// A whole batch of format `F` (`{"<F::BATCH_KEY>": [ ... ]}`): every message or
    /// none, the first invalid one with its index. Each message obeys the single-publish
    /// size limit.
    pub(super) fn parse_many<'a, F: Format>(
        &'a mut self,
        body: &'a [u8],
        limits: BatchLimits,
    ) -> Result<Vec<F::Message<'a>>, BatchError> {
        let fields = self.with_tape(
            body,
            |nodes| {
                let (at, len) =
                    batch_array(nodes, F::BATCH_KEY, F::BATCH_WHAT, limits.max_messages)?;
                each_element(nodes, at, len, |nodes, i| {
                    message_fields::<F>(nodes, i, true)
                })
            },
            Err(ApiError::InvalidJson.into()),
        )?;
        finish_batch(
            body,
            F::BATCH_KEY.as_bytes(),
            fields,
            limits.max_message_bytes,
            finish::<F>,
        )
    }
}

/// A publish body format: the native API's or Pusher's REST events. The parse is
/// shared (tape, batch array, the message fields both formats have, size limit per
/// message, locating `data`); a format names its keys, its rule for `data`, its one
/// field of its own, and what a valid message becomes.
pub(super) trait Format {
    /// What the format's own field (Pusher's `info`) says, once checked.
    type Extra;
    /// A valid message.
    type Message<'a>;
    /// The top-level array of a batch body.
    const BATCH_KEY: &'static str;
    /// The error text when that key holds no array.
    const BATCH_WHAT: &'static str;
    /// The key of the event name (native `event`, Pusher's `name`).
    const EVENT_KEY: &'static str;
    /// The format's one field beyond those every format has, if any.
    const EXTRA_KEY: Option<&'static str>;
    /// When each message of a batch must name one `channel` (Pusher's
    /// `batch_events`): the error text for one that names `channels`.
    const BATCH_REFUSES_CHANNELS: Option<&'static str>;
    /// Why a `data` of this kind is refused, or `None` when it is accepted.
    fn refuse_data(data: Kind<'_>) -> Option<&'static str>;
    /// The format's own field (`value`, absent when `None`), checked against the
    /// message's channels.
    fn extra(value: Option<Kind<'_>>, channels: &Channels<'_>) -> Result<Self::Extra, ApiError>;
    /// The message from its fields and its `data`, the raw JSON text as published.
    fn message<'a>(fields: Fields<'a, Self::Extra>, data: &'a [u8]) -> Self::Message<'a>;
}

/// Locate `data` in `text`, the message object's own bytes ([`message_fields`]
/// already checked its kind), and make the message.
fn finish<'a, F: Format>(
    fields: Fields<'a, F::Extra>,
    text: &'a [u8],
) -> Result<F::Message<'a>, ApiError> {
    let data = top_level_value(text, b"data")
        .map(|r| &text[r])
        .ok_or(ApiError::InvalidJson)?;
    Ok(F::message(fields, data))
}

/// The native API's body: `{channel|channels, event, data, socket_id}` and the batch
/// `{"messages": [...]}`.
struct Native;

impl Format for Native {
    type Extra = ();
    type Message<'a> = Publish<'a>;
    const BATCH_KEY: &'static str = "messages";
    const BATCH_WHAT: &'static str = "must be an array of messages";
    const EVENT_KEY: &'static str = "event";
    const EXTRA_KEY: Option<&'static str> = None;
    const BATCH_REFUSES_CHANNELS: Option<&'static str> = None;

    fn refuse_data(data: Kind<'_>) -> Option<&'static str> {
        matches!(data, Kind::Other).then_some("must be a JSON object or a string")
    }

    fn extra(_: Option<Kind<'_>>, _: &Channels<'_>) -> Result<(), ApiError> {
        Ok(())
    }

    fn message<'a>(f: Fields<'a, ()>, data: &'a [u8]) -> Publish<'a> {
        f.publish(data).0
    }
}

/// One message's fields as read from the tape (`extra`: the format's own); `data`
/// still to be located.
pub(super) struct Fields<'a, X> {
    channels: Channels<'a>,
    event: &'a str,
    except: Option<SocketId>,
    extra: X,
}

impl<'a, X> Fields<'a, X> {
    /// The publish these fields make with `data`, and the format's own field.
    pub(super) fn publish(self, data: &'a [u8]) -> (Publish<'a>, X) {
        let publish = Publish {
            channels: self.channels,
            event: self.event,
            data,
            except: self.except,
        };
        (publish, self.extra)
    }
}

/// The array under `key` of a batch body's top-level object: its tape position and
/// length, checked to hold 1..=`max` elements (`what` names them in the error).
fn batch_array(
    nodes: &[Node<'_>],
    key: &'static str,
    what: &'static str,
    max: usize,
) -> Result<(usize, usize), BatchError> {
    let mut found = None;
    object_fields(nodes, 0, |k, at, _| {
        if k == key {
            found = Some(at);
        }
    })?;
    let at = found.ok_or(ApiError::MissingField(key))?;
    let Some(Node::Array { len, .. }) = nodes.get(at) else {
        return Err(ApiError::InvalidField(key, what).into());
    };
    if *len == 0 || *len > max {
        return Err(ApiError::InvalidField(
            key,
            "must hold at least 1 and at most max_batch_messages elements",
        )
        .into());
    }
    Ok((at, *len))
}

/// Each of the `len` objects of the array at tape node `at`, read by `fields` (which
/// returns the nodes each spans), or the first error with its index.
fn each_element<'a, F>(
    nodes: &[Node<'a>],
    at: usize,
    len: usize,
    fields: impl Fn(&[Node<'a>], usize) -> Result<(F, usize), ApiError>,
) -> Result<Vec<F>, BatchError> {
    let mut out = Vec::with_capacity(len);
    let mut i = at + 1;
    for index in 0..len {
        let node = nodes.get(i).ok_or(ApiError::InvalidJson)?;
        let (f, span) = fields(nodes, i).map_err(|error| BatchError {
            error,
            index: Some(index),
        })?;
        debug_assert_eq!(span, node_span(node));
        out.push(f);
        i += span;
    }
    Ok(out)
}

/// The second half of a batch parse: each element of the top-level array `key` (the scanner finds it again, since simd-json
/// accepted the body) is finished with its fields, and may be at most
/// `max_message_bytes` long (the single-publish limit), or the first error with its
/// index.
fn finish_batch<'a, F, T>(
    body: &'a [u8],
    key: &[u8],
    fields: Vec<F>,
    max_message_bytes: usize,
    finish: impl Fn(F, &'a [u8]) -> Result<T, ApiError>,
) -> Result<Vec<T>, BatchError> {
    let array = top_level_value(body, key).ok_or(ApiError::InvalidJson)?;
    let mut spans = array_elements(body, array);
    let mut out = Vec::with_capacity(fields.len());
    for (index, f) in fields.into_iter().enumerate() {
        let at = |error| BatchError {
            error,
            index: Some(index),
        };
        let span = spans.next().ok_or(ApiError::InvalidJson)?;
        if span.len() > max_message_bytes {
            return Err(at(ApiError::PayloadTooLarge));
        }
        out.push(finish(f, &body[span]).map_err(at)?);
    }
    Ok(out)
}

/// The message object of format `F` starting at tape node `at` (`in_batch`: an element
/// of a batch), and the nodes it spans. Checked in this order, so each format reports
/// the same field first: the channels, the event name, `data`'s kind, `socket_id`, the
/// format's own field.
fn message_fields<'a, F: Format>(
    nodes: &[Node<'a>],
    at: usize,
    in_batch: bool,
) -> Result<(Fields<'a, F::Extra>, usize), ApiError> {
    let (mut channel, mut channels, mut event, mut data) = (None, None, None, None);
    let (mut socket_id, mut extra) = (None, None);
    let span = object_fields(nodes, at, |key, value_at, value| match key {
        "channel" => channel = Some(kind(value)),
        "channels" => channels = Some(value_at),
        "data" => data = Some(kind(value)),
        "socket_id" => socket_id = Some(kind(value)),
        _ if key == F::EVENT_KEY => event = Some(kind(value)),
        _ if Some(key) == F::EXTRA_KEY => extra = Some(kind(value)),
        _ => {}
    })?;
    if let Some(why) = F::BATCH_REFUSES_CHANNELS {
        if in_batch && channel.is_none() && channels.is_some() {
            return Err(ApiError::InvalidField("channels", why));
        }
    }
    let channels = channels_field(nodes, channel, channels)?;
    let event = event_name(F::EVENT_KEY, event)?;
    if let Some(why) = F::refuse_data(data.ok_or(ApiError::MissingField("data"))?) {
        return Err(ApiError::InvalidField("data", why));
    }
    let except = socket_id_field(socket_id)?;
    let extra = F::extra(extra, &channels)?;
    Ok((
        Fields {
            channels,
            event,
            except,
            extra,
        },
        span,
    ))
}

/// `channel` or `channels` (exactly one of them): the message's channels.
fn channels_field<'a>(
    nodes: &[Node<'a>],
    channel: Option<Kind<'a>>,
    channels: Option<usize>,
) -> Result<Channels<'a>, ApiError> {
    match (channel, channels) {
        (Some(_), Some(_)) => Err(ApiError::InvalidField(
            "channels",
            "cannot be combined with 'channel'",
        )),
        (None, None) => Err(ApiError::MissingField("channel")),
        (Some(c), None) => Ok(Channels::One(name_field("channel", Some(c))?)),
        (None, Some(at)) => channel_list(nodes, at),
    }
}

/// An event name (field `field`): a valid name outside the reserved prefixes.
fn event_name<'a>(field: &'static str, value: Option<Kind<'a>>) -> Result<&'a str, ApiError> {
    let name = name_field(field, value)?;
    if RESERVED_EVENT_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(ApiError::InvalidField(
            field,
            "must not start with 'pusher:' or 'pusher_internal:' (reserved)",
        ));
    }
    Ok(name)
}

/// `socket_id`, when present: the connection to leave out.
fn socket_id_field(value: Option<Kind<'_>>) -> Result<Option<SocketId>, ApiError> {
    match value {
        None => Ok(None),
        // Any id of the form is accepted (as Pusher does); one outside the ranges
        // ringcast gives out names no connection, so it leaves nobody out.
        Some(Kind::Str(text)) if is_socket_id_form(text) => Ok(SocketId::parse(text)),
        Some(_) => Err(ApiError::InvalidField(
            "socket_id",
            "must be a connection_id (digits, a dot, digits)",
        )),
    }
}

/// `channels`: an array of 1..=100 distinct valid names.
fn channel_list<'a>(nodes: &[Node<'a>], at: usize) -> Result<Channels<'a>, ApiError> {
    let Some(Node::Array { len, .. }) = nodes.get(at) else {
        return Err(ApiError::InvalidField(
            "channels",
            "must be an array of channel names",
        ));
    };
    if *len == 0 || *len > MAX_CHANNELS {
        return Err(ApiError::InvalidField(
            "channels",
            "must hold at least 1 and at most 100 channel names",
        ));
    }
    let mut names = Vec::with_capacity(*len);
    let mut i = at + 1;
    for _ in 0..*len {
        let node = nodes.get(i).ok_or(ApiError::InvalidJson)?;
        let Node::String(name) = node else {
            return Err(ApiError::InvalidField(
                "channels",
                "must be an array of channel names",
            ));
        };
        validate_name("channels", name)?;
        // At most 100 names: a quadratic check is ~5,000 short compares, no hashing.
        if names.contains(name) {
            return Err(ApiError::InvalidField(
                "channels",
                "must not name a channel twice",
            ));
        }
        names.push(*name);
        i += node_span(node);
    }
    Ok(Channels::Many(names))
}

/// Number of tape nodes a value occupies, itself included.
/// Walk the object at tape node `at`: `each(key, index of its value, value)` for every
/// field in order. Returns the nodes the object spans; `NotAnObject` when it is none.
fn object_fields<'a>(
    nodes: &[Node<'a>],
    at: usize,
    mut each: impl FnMut(&'a str, usize, &Node<'a>),
) -> Result<usize, ApiError> {
    let Some(object @ Node::Object { len, .. }) = nodes.get(at) else {
        return Err(ApiError::NotAnObject);
    };
    let mut i = at + 1;
    for _ in 0..*len {
        let key = match nodes.get(i) {
            Some(Node::String(k)) => *k,
            _ => return Err(ApiError::InvalidJson),
        };
        let value = nodes.get(i + 1).ok_or(ApiError::InvalidJson)?;
        each(key, i + 1, value);
        i += 1 + node_span(value);
    }
    Ok(node_span(object))
}

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

/// The spans of the elements of the JSON array at `array` in `text` (valid JSON).
pub(crate) fn array_elements(
    text: &[u8],
    array: Range<usize>,
) -> impl Iterator<Item = Range<usize>> + '_ {
    let end = array.end;
    let mut p = array.start + 1; // after '['
    std::iter::from_fn(move || {
        p = skip_ws(text, p);
        if text.get(p) == Some(&b',') {
            p = skip_ws(text, p + 1);
        }
        if p >= end || text.get(p) == Some(&b']') {
            return None;
        }
        let start = p;
        p = skip_value(text, p)?;
        Some(start..p)
    })
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

/// `p` is at the first byte of a value. Containers are walked byte by byte (strings
/// jumped over) and every number in them is checked, because simd-json is not trusted
/// with all of them: its path for numbers of 19 or more digits accepts whatever follows
/// the digits (`[2522222222222222222x]`, `[2.5222222222222222222222-;2]`; found by the
/// libFuzzer target fuzz/publish_body), and `data` must reach subscribers as valid JSON.
fn skip_value(text: &[u8], mut p: usize) -> Option<usize> {
    match text.get(p)? {
        b'"' => skip_string(text, p),
        b'-' | b'0'..=b'9' => skip_number(text, p),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match text.get(p)? {
                    b'"' => {
                        p = skip_string(text, p)?;
                        continue;
                    }
                    b'-' | b'0'..=b'9' => {
                        p = skip_number(text, p)?;
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

/// `p` is at the first byte of a number: returns the index after it if it follows
/// JSON's grammar (`-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`) and is
/// followed by a delimiter or the end; `None` otherwise.
fn skip_number(text: &[u8], mut p: usize) -> Option<usize> {
    let digits = |p: usize| p + text[p..].iter().take_while(|b| b.is_ascii_digit()).count();
    if text.get(p) == Some(&b'-') {
        p += 1;
    }
    match text.get(p)? {
        b'0' => p += 1,
        b'1'..=b'9' => p = digits(p),
        _ => return None,
    }
    if text.get(p) == Some(&b'.') {
        let end = digits(p + 1);
        if end == p + 1 {
            return None;
        }
        p = end;
    }
    if matches!(text.get(p), Some(b'e' | b'E')) {
        p += 1;
        if matches!(text.get(p), Some(b'+' | b'-')) {
            p += 1;
        }
        let end = digits(p);
        if end == p {
            return None;
        }
        p = end;
    }
    match text.get(p) {
        None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') => Some(p),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod nul_tests {
    use super::*;

    /// Found by the libFuzzer target `publish_body` (fuzz/): simd-json ended a number at
    /// a NUL byte and accepted the rest, so `{"data":{"a":[0\0\0\0\0,"x"]}}` was a 202 and
    /// the NULs reached every subscriber inside `data` (which a browser's JSON.parse
    /// refuses). No byte that JSON does not allow there may pass.
    #[test]
    fn control_bytes_outside_strings_are_invalid_json() {
        for b in 0u8..0x20 {
            if matches!(b, b'\t' | b'\n' | b'\r') {
                continue;
            }
            for at in [
                &b"{\"channel\":\"news\",\"event\":\"e\",\"data\":{\"a\":[0_,\"x\"]}}"[..],
                &b"{\"channel\":\"news\",\"event\":\"e\",\"data\":{\"a\":1_}}"[..],
                &b"{\"channel\":\"news\",\"event\":\"e\",\"data\":{\"a\":true_}}"[..],
                &b"{\"channel\":\"news\",\"event\":\"e\",\"data\":\"s\"_}"[..],
                &b"{\"channel\":\"news\",\"event\":\"e\",\"data\":{}}_"[..],
            ] {
                let body: Vec<u8> = at.iter().map(|&c| if c == b'_' { b } else { c }).collect();
                let mut p = PublishParser::new();
                assert!(
                    p.parse(&body).is_err(),
                    "byte {b:#04x} accepted in {:?}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    }
}
