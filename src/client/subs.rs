//! The channels one connection holds, stored for the common case: most connections
//! hold one channel, so one name is kept without a list (and a short one, up to
//! [`INLINE`] bytes, in place: no allocation at all); a list is made only for the second
//! (issue 21: an idle connection's bytes).
//!
//! Invariant: no name is held twice (callers check [`Subs::contains`] before a push).

/// Longest channel name kept in place.
const INLINE: usize = 22;

/// A connection's channel names, in no particular order.
#[derive(Default)]
pub(crate) enum Subs {
    #[default]
    None,
    /// One name of at most [`INLINE`] bytes, in place: `bytes[..len]`.
    Short {
        len: u8,
        bytes: [u8; INLINE],
    },
    One(Box<str>),
    Many(Vec<Box<str>>),
}

/// `Subs::Short` of `channel` if it fits, else `Subs::One`.
fn one(channel: &str) -> Subs {
    if channel.len() <= INLINE {
        let mut bytes = [0u8; INLINE];
        bytes[..channel.len()].copy_from_slice(channel.as_bytes());
        Subs::Short {
            len: channel.len() as u8,
            bytes,
        }
    } else {
        Subs::One(channel.into())
    }
}

/// The name a `Subs::Short` holds (its bytes came from a `&str`, whole).
fn short(len: u8, bytes: &[u8; INLINE]) -> &str {
    std::str::from_utf8(&bytes[..usize::from(len)]).unwrap_or_default()
}

impl Subs {
    pub(crate) fn len(&self) -> usize {
        match self {
            Subs::None => 0,
            Subs::Short { .. } | Subs::One(_) => 1,
            Subs::Many(v) => v.len(),
        }
    }

    pub(crate) fn contains(&self, channel: &str) -> bool {
        self.iter().any(|c| c == channel)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many): (Option<&str>, &[Box<str>]) = match self {
            Subs::None => (None, &[]),
            Subs::Short { len, bytes } => (Some(short(*len, bytes)), &[]),
            Subs::One(c) => (Some(c), &[]),
            Subs::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter().map(|c| &**c))
    }

    /// Add a name the caller checked is not held.
    pub(crate) fn push(&mut self, channel: &str) {
        debug_assert!(!self.contains(channel), "a channel is held once");
        match std::mem::take(self) {
            Subs::None => *self = one(channel),
            Subs::Short { len, bytes } => {
                *self = Subs::Many(vec![short(len, &bytes).into(), channel.into()]);
            }
            Subs::One(first) => *self = Subs::Many(vec![first, channel.into()]),
            Subs::Many(mut v) => {
                v.push(channel.into());
                *self = Subs::Many(v);
            }
        }
    }

    /// Forget `channel`; whether it was held.
    pub(crate) fn remove(&mut self, channel: &str) -> bool {
        match self {
            Subs::None => false,
            Subs::Short { len, bytes } if short(*len, bytes) == channel => {
                *self = Subs::None;
                true
            }
            Subs::Short { .. } => false,
            Subs::One(c) if **c == *channel => {
                *self = Subs::None;
                true
            }
            Subs::One(_) => false,
            Subs::Many(v) => match v.iter().position(|c| **c == *channel) {
                Some(pos) => {
                    v.swap_remove(pos);
                    true
                }
                None => false,
            },
        }
    }

    /// Take every name out (the connection ends).
    pub(crate) fn take_all(&mut self) -> Vec<Box<str>> {
        match std::mem::take(self) {
            Subs::None => Vec::new(),
            Subs::Short { len, bytes } => vec![short(len, &bytes).into()],
            Subs::One(c) => vec![c],
            Subs::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Subs;

    #[test]
    fn one_inline_then_a_list_and_back() {
        let mut s = Subs::default();
        assert_eq!(s.len(), 0);
        assert!(!s.remove("a"));
        s.push("a");
        assert!(matches!(s, Subs::Short { len: 1, .. }));
        assert!(s.contains("a") && !s.contains("b"));
        s.push("b");
        s.push("c");
        assert_eq!(s.len(), 3);
        assert!(s.remove("a"));
        assert!(!s.remove("a"));
        let mut left: Vec<_> = s.iter().map(str::to_owned).collect();
        left.sort();
        assert_eq!(left, ["b", "c"]);
        let all = s.take_all();
        assert_eq!(all.len(), 2);
        assert_eq!(s.len(), 0);
        s.push("x");
        assert!(s.remove("x"));
        assert!(matches!(s, Subs::None));
    }

    #[test]
    fn a_long_name_is_boxed_and_names_keep_their_bytes() {
        let long = "private-a-channel-name-longer-than-inline";
        let mut s = Subs::default();
        s.push(long);
        assert!(matches!(s, Subs::One(_)));
        assert!(s.contains(long));
        assert!(s.remove(long));
        let exact = "é".repeat(11); // 22 bytes: the longest kept in place
        s.push(&exact);
        assert!(matches!(s, Subs::Short { len: 22, .. }));
        assert_eq!(s.iter().collect::<Vec<_>>(), [exact.as_str()]);
        s.push("b");
        let mut all: Vec<_> = s.take_all().into_iter().map(String::from).collect();
        all.sort();
        assert_eq!(all, ["b".to_owned(), exact]);
    }
}
