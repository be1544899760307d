//! The two client protocols as codecs over one session core: a [`Codec`] decodes a text
//! frame into a [`Command`] and writes the core's answers ([`Reply`], [`ClientError`])
//! as its protocol's frames. [`Native`] is ringcast's own protocol (docs/protocol.md),
//! [`Pusher`] the Pusher Channels protocol 7 (`/app/{key}`).
//!
//! Invariants: a codec holds no state (the session core is generic over it, so a
//! connection pays no byte for knowing its protocol); decoding bounds the JSON nesting
//! before parsing; every path of `decode` calls `apply` exactly once.

mod native;
mod pusher;

use bytes::Bytes;

use super::command::{Command, Reply};
use super::error::ClientError;

pub(crate) use native::Native;
pub(crate) use pusher::Pusher;

/// One client protocol.
pub(crate) trait Codec: 'static {
    /// Whether this protocol's subscribes use channel history (positions, `since`).
    const HISTORY: bool;

    /// Decode one text frame (parsed in place: the buffer is the reader's) and hand
    /// the command to `apply`.
    fn decode<R>(payload: &mut [u8], apply: impl FnOnce(Command<'_>) -> R) -> R;

    /// The frame answering with `reply`, if this protocol answers it.
    fn reply(reply: Reply<'_>) -> Option<Bytes>;

    /// The frame refusing with `error` (`channel`: the channel concerned, if any).
    fn refusal(error: &ClientError, channel: Option<&str>) -> Bytes;
}

/// Client frames are flat control messages; anything nested deeper is refused.
pub(crate) const MAX_CLIENT_JSON_DEPTH: usize = 32;

/// Deepest `{`/`[` nesting of a JSON text, ignoring brackets inside strings. Stops
/// counting once past the limit; malformed text is left to the parser.
pub(crate) fn nesting_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
                if max > MAX_CLIENT_JSON_DEPTH {
                    return max;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A refusal of the frame as it stands.
fn refused<'a>(error: ClientError, channel: Option<std::borrow::Cow<'a, str>>) -> Command<'a> {
    Command::Refused { error, channel }
}
