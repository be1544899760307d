//! A project's webhook setting as stored: where ringcast POSTs (`url`, http:// or
//! https://) and which event kinds it sends ([`HookKinds`]). Set with `ringcast project
//! set-webhook`; read by the key snapshot, which the webhook sender consults.
//!
//! The kinds live with the project because the store, the key snapshot and the sender
//! all name them; `crate::webhook` re-exports [`HookKind`].
//! Invariant: a [`WebhookSpec`] that exists has a URL [`validate_url`] accepted and at
//! least one event kind.

use std::fmt;

/// Longest webhook URL, in bytes: far above any real endpoint, small enough that a
/// pasted document is refused.
pub(crate) const MAX_URL_BYTES: usize = 2048;

/// The kinds of webhook event (Pusher's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookKind {
    ChannelOccupied,
    ChannelVacated,
    MemberAdded,
    MemberRemoved,
    ClientEvent,
}

impl HookKind {
    pub const ALL: [HookKind; 5] = [
        HookKind::ChannelOccupied,
        HookKind::ChannelVacated,
        HookKind::MemberAdded,
        HookKind::MemberRemoved,
        HookKind::ClientEvent,
    ];

    /// The event's `name` in a webhook body, and its spelling in `--events`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::ChannelOccupied => "channel_occupied",
            HookKind::ChannelVacated => "channel_vacated",
            HookKind::MemberAdded => "member_added",
            HookKind::MemberRemoved => "member_removed",
            HookKind::ClientEvent => "client_event",
        }
    }

    pub fn parse(s: &str) -> Option<HookKind> {
        HookKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of [`HookKind`]s, one bit each.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HookKinds(u8);

impl HookKinds {
    /// What `set-webhook` sends without `--events`: every kind but `client_event`
    /// (Pusher's default too; client events can be many).
    pub const DEFAULT: HookKinds = HookKinds(0b01111);
    pub const NONE: HookKinds = HookKinds(0);

    pub fn contains(self, kind: HookKind) -> bool {
        self.0 & kind.bit() != 0
    }

    pub fn with(self, kind: HookKind) -> HookKinds {
        HookKinds(self.0 | kind.bit())
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `channel_occupied,member_added`: names separated by commas, blanks ignored.
    /// Refuses an unknown name and an empty list.
    pub fn parse(list: &str) -> Result<HookKinds, String> {
        let mut kinds = HookKinds::NONE;
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kind = HookKind::parse(name).ok_or_else(|| {
                format!(
                    "unknown webhook event {name:?}; known: {}",
                    HookKind::ALL.map(HookKind::as_str).join(", ")
                )
            })?;
            kinds = kinds.with(kind);
        }
        if kinds.is_empty() {
            return Err("--events names no event".into());
        }
        Ok(kinds)
    }

    pub fn iter(self) -> impl Iterator<Item = HookKind> {
        HookKind::ALL.into_iter().filter(move |k| self.contains(*k))
    }
}

impl fmt::Display for HookKinds {
    /// The stored and printed form: names in [`HookKind::ALL`] order, comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, kind) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(kind.as_str())?;
        }
        Ok(())
    }
}

impl fmt::Debug for HookKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HookKinds({self})")
    }
}

/// A project's webhook: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSpec {
    pub url: String,
    pub events: HookKinds,
}

/// Accept an absolute `http://` or `https://` URL with a host, at most
/// [`MAX_URL_BYTES`], without blanks or control characters.
pub(crate) fn validate_url(url: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("invalid webhook URL {url:?}: {why}"));
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "invalid webhook URL: longer than {MAX_URL_BYTES} bytes"
        ));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return refuse("it contains blanks or control characters");
    }
    let Ok(uri) = url.parse::<ureq::http::Uri>() else {
        return refuse("not a URL");
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return refuse("it must start with http:// or https://"),
    }
    match uri.host() {
        Some(h) if !h.is_empty() => Ok(()),
        _ => refuse("it has no host"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_print() {
        assert_eq!(
            HookKinds::DEFAULT.to_string(),
            "channel_occupied,channel_vacated,member_added,member_removed"
        );
        assert!(!HookKinds::DEFAULT.contains(HookKind::ClientEvent));
        let k = HookKinds::parse(" client_event, channel_occupied ").unwrap();
        assert_eq!(k.to_string(), "channel_occupied,client_event");
        assert_eq!(HookKinds::parse(&k.to_string()).unwrap(), k);
        assert!(HookKinds::parse("").is_err());
        assert!(HookKinds::parse(",").is_err());
        assert!(HookKinds::parse("channel_occupied,nope").is_err());
        for kind in HookKind::ALL {
            assert_eq!(HookKind::parse(kind.as_str()), Some(kind));
        }
    }

    #[test]
    fn urls() {
        for good in [
            "http://127.0.0.1:9000/hook",
            "https://example.com/webhooks/ringcast?x=1",
            "http://localhost",
        ] {
            assert!(validate_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "example.com/hook",
            "ftp://example.com/",
            "http://",
            "https:///path",
            "http://exa mple.com/",
            "http://example.com/\n",
            "javascript:alert(1)",
            &format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES)),
        ] {
            assert!(validate_url(bad).is_err(), "{bad:?}");
        }
    }
}
