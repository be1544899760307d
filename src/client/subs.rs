//! The channels one connection holds, stored for the common case: most connections
//! hold one channel, so one name is kept inline (no list allocated) and a list is made
//! only for the second (issue 21: an idle connection's bytes).
//!
//! Invariant: no name is held twice (callers check [`Subs::contains`] before a push).

/// A connection's channel names, in no particular order.
#[derive(Default)]
pub(crate) enum Subs {
    #[default]
    None,
    One(Box<str>),
    Many(Vec<Box<str>>),
}

impl Subs {
    pub(crate) fn len(&self) -> usize {
        match self {
            Subs::None => 0,
            Subs::One(_) => 1,
            Subs::Many(v) => v.len(),
        }
    }

    pub(crate) fn contains(&self, channel: &str) -> bool {
        self.iter().any(|c| c == channel)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many): (Option<&Box<str>>, &[Box<str>]) = match self {
            Subs::None => (None, &[]),
            Subs::One(c) => (Some(c), &[]),
            Subs::Many(v) => (None, v),
        };
        one.into_iter().chain(many).map(|c| &**c)
    }

    /// Add a name the caller checked is not held.
    pub(crate) fn push(&mut self, channel: &str) {
        debug_assert!(!self.contains(channel), "a channel is held once");
        match std::mem::take(self) {
            Subs::None => *self = Subs::One(channel.into()),
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
        assert!(matches!(s, Subs::One(_)));
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
}
