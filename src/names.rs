//! The rule every channel and event name follows, on every API (REST publish, the
//! WebSocket subscribe frame): 1 to [`MAX_NAME_CHARS`] Unicode scalar values, no ASCII
//! control character. Matching is exact byte equality elsewhere; nothing here
//! normalises. Also the name of a channel's Redis pub/sub channel in cluster mode
//! ([`redis_channel`]). A leaf: it names no other module.

/// Longest `channel` or `event`, in Unicode scalar values (not bytes).
pub(crate) const MAX_NAME_CHARS: usize = 100;

/// Prefix of every message channel ringcast subscribes to or publishes on.
pub(crate) const CHANNEL_PREFIX: &str = "ringcast:m:";

/// The Redis channel of `channel` in project `project_id`.
pub(crate) fn redis_channel(project_id: &str, channel: &str) -> String {
    let mut s = String::with_capacity(CHANNEL_PREFIX.len() + project_id.len() + 1 + channel.len());
    s.push_str(CHANNEL_PREFIX);
    s.push_str(project_id);
    s.push(':');
    s.push_str(channel);
    s
}

/// Why a name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameError {
    Empty,
    TooLong,
    ControlCharacter,
}

/// Check one name.
pub(crate) fn check(s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    // Byte length bounds the char count from above: skip counting for short strings.
    if s.len() > MAX_NAME_CHARS && s.chars().count() > MAX_NAME_CHARS {
        return Err(NameError::TooLong);
    }
    if s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(NameError::ControlCharacter);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert_eq!(check(&"é".repeat(100)), Ok(()));
        assert_eq!(check(&"é".repeat(101)), Err(NameError::TooLong));
        assert_eq!(check(""), Err(NameError::Empty));
        assert_eq!(check("a\u{7f}"), Err(NameError::ControlCharacter));
        assert_eq!(check("a\tb"), Err(NameError::ControlCharacter));
    }
}
