//! `trusted_proxies`: the peers (addresses or CIDR blocks) whose word about the client
//! address is taken, from the PROXY protocol or `X-Forwarded-For`.
//!
//! An IPv4 peer seen as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, a dual-stack
//! listener) is compared as IPv4. Empty (the default): no peer is trusted and nothing
//! is parsed.

use std::net::IpAddr;

/// A list entry that is neither an address nor a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP address or a CIDR block (e.g. 10.0.0.5, 10.0.0.0/8, fd00::/8)")]
pub(crate) struct BadEntry(pub(crate) String);

/// One block: the network address and its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    net: IpAddr,
    prefix: u8,
}

impl Block {
    fn parse(text: &str) -> Result<Block, BadEntry> {
        let bad = || BadEntry(text.to_string());
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let net: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
        };
        Ok(Block { net, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The parsed `trusted_proxies` list.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrustedProxies {
    blocks: Vec<Block>,
}

impl TrustedProxies {
    pub(crate) fn parse<S: AsRef<str>>(entries: &[S]) -> Result<TrustedProxies, BadEntry> {
        let blocks = entries
            .iter()
            .map(|e| Block::parse(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { blocks })
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.blocks.iter().any(|b| b.contains(ip))
    }

    /// The client address an `X-Forwarded-For` value names, for a request that came
    /// from a trusted peer: the rightmost address that is not itself a trusted proxy
    /// (everything left of it was written by parties we do not trust). `None` when the
    /// value holds no such address (all trusted, or a malformed entry first): the peer
    /// stays the client address.
    pub(crate) fn forwarded_client(&self, value: &[u8]) -> Option<IpAddr> {
        let text = std::str::from_utf8(value).ok()?;
        for entry in text.rsplit(',') {
            let ip = parse_forwarded(entry.trim())?;
            if !self.contains(ip) {
                return Some(canonical(ip));
            }
        }
        None
    }
}

/// One `X-Forwarded-For` entry: an address, possibly `[v6]` or `[v6]:port` / `v4:port`.
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse() {
        return Some(ip);
    }
    if let Some(rest) = entry.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    entry.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_blocks() {
        let t = TrustedProxies::parse(&["10.0.0.0/8", "192.168.1.7", "fd00::/8"]).unwrap();
        assert!(t.contains(ip("10.200.3.4")));
        assert!(!t.contains(ip("11.0.0.1")));
        assert!(t.contains(ip("192.168.1.7")));
        assert!(!t.contains(ip("192.168.1.8")));
        assert!(t.contains(ip("fd12::1")));
        assert!(!t.contains(ip("fe80::1")));
        // A dual-stack listener's view of an IPv4 peer.
        assert!(t.contains(ip("::ffff:10.1.2.3")));
        let all = TrustedProxies::parse(&["0.0.0.0/0"]).unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!(!TrustedProxies::parse::<&str>(&[])
            .unwrap()
            .contains(ip("127.0.0.1")));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "example.com",
            "10.0.0.1/",
            "/8",
            "",
        ] {
            assert!(TrustedProxies::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarded_for_takes_the_rightmost_untrusted_address() {
        let t = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
        let f = |v: &str| t.forwarded_client(v.as_bytes());
        assert_eq!(f("203.0.113.9"), Some(ip("203.0.113.9")));
        // A client-written entry left of the real one is ignored.
        assert_eq!(f("1.2.3.4, 203.0.113.9"), Some(ip("203.0.113.9")));
        // Proxies of our own (trusted) on the right are skipped.
        assert_eq!(f("1.2.3.4, 203.0.113.9, 10.0.0.2"), Some(ip("203.0.113.9")));
        assert_eq!(f("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(f("198.51.100.1:5000"), Some(ip("198.51.100.1")));
        assert_eq!(f("10.0.0.1, 10.0.0.2"), None);
        assert_eq!(f("1.2.3.4, garbage"), None);
        assert_eq!(f(""), None);
    }
}
