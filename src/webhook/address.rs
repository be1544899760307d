//! The webhook address policy (contract 1.3, `webhook_allow_private_addresses`, default
//! false): a webhook may only reach public addresses, so a project's URL cannot make the
//! node POST to itself, to its cloud's metadata service (169.254.169.254) or into the
//! private network it runs in.
//!
//! The check sits in the HTTP client's name resolver ([`CheckedResolver`]): the host is
//! resolved once per new connection, every resolved address is checked, the refused ones
//! are dropped, and the client connects only to the addresses that passed. There is no
//! second lookup between check and connect (a DNS answer that changes in between cannot
//! slip through), numeric spellings (`0x7f000001`, `2130706433`, `127.1`) are caught
//! because the check is on the address the resolver produced, and TLS (SNI, certificate
//! name) and `Host` still use the URL's host. Webhooks never go through a proxy from the
//! environment: the address checked is the address connected to.
//!
//! Refused, IPv4: 0.0.0.0/8, loopback 127/8, private 10/8, 172.16/12, 192.168/16,
//! link-local 169.254/16, shared (CGNAT) 100.64/10, IETF assignments 192.0.0/24,
//! documentation 192.0.2/24, 198.51.100/24, 203.0.113/24, the 6to4 relay 192.88.99/24,
//! benchmarking 198.18/15, multicast 224/4, reserved 240/4 (with broadcast).
//! IPv6: `::`, `::1`, IPv4-compatible `::/96`, discard `100::/64`, Teredo `2001::/32`,
//! documentation `2001:db8::/32`, unique-local `fc00::/7`, link-local `fe80::/10`,
//! site-local `fec0::/10`, multicast `ff00::/8`, local NAT64 `64:ff9b:1::/48`; and forms
//! that carry an IPv4 address (IPv4-mapped `::ffff:0:0/96`, NAT64 `64:ff9b::/96`, 6to4
//! `2002::/16`) are judged by that address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Why `ip` may not be a webhook's destination, or `None` when it may.
pub(crate) fn refused(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, ..) => "unspecified (0.0.0.0/8)",
        (127, ..) => "loopback",
        (10, ..) | (192, 168, _) => "private",
        (172, b, _) if (16..32).contains(&b) => "private",
        (169, 254, _) => "link-local (cloud metadata services live here)",
        (100, b, _) if (64..128).contains(&b) => "shared address space (CGNAT, 100.64.0.0/10)",
        (192, 0, 0) => "special-purpose (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (192, 88, 99) => "special-purpose (6to4 relay, 192.88.99.0/24)",
        (198, 18 | 19, _) => "benchmarking (198.18.0.0/15)",
        (224..=239, ..) => "multicast",
        (240..=255, ..) => "reserved (240.0.0.0/4, broadcast)",
        _ => return None,
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4).map(|_| "an IPv4-mapped form of a refused IPv4 address");
    }
    Some(match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => "unspecified",
        [0, 0, 0, 0, 0, 0, 0, 1] => "loopback",
        [0, 0, 0, 0, 0, 0, _, _] => "IPv4-compatible (deprecated, ::/96)",
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => {
            return refused_v4(embedded(hi, lo)).map(|_| "a NAT64 form of a refused IPv4 address")
        }
        [0x64, 0xff9b, 1, ..] => "local-use NAT64 (64:ff9b:1::/48)",
        [0x100, 0, 0, 0, ..] => "discard-only (100::/64)",
        [0x2001, 0xdb8, ..] => "documentation",
        [0x2001, 0, ..] => "Teredo (2001::/32)",
        [0x2002, hi, lo, ..] => {
            return refused_v4(embedded(hi, lo)).map(|_| "a 6to4 form of a refused IPv4 address")
        }
        [x, ..] if x & 0xfe00 == 0xfc00 => "unique-local (fc00::/7)",
        [x, ..] if x & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        [x, ..] if x & 0xffc0 == 0xfec0 => "site-local (deprecated, fec0::/10)",
        [x, ..] if x & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

/// A refused destination, as the error the client's connection attempt fails with.
#[derive(Debug, thiserror::Error)]
#[error("the webhook host resolves to {ip}, which is {why}; refused (webhook_allow_private_addresses is false)")]
pub(crate) struct AddressRefused {
    ip: IpAddr,
    why: &'static str,
}

/// The webhook client's resolver: the system resolver, then the policy on its answer.
#[derive(Debug, Default)]
pub(crate) struct CheckedResolver {
    system: DefaultResolver,
}

impl Resolver for CheckedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = self.system.resolve(uri, config, timeout)?;
        let mut allowed = self.empty();
        let mut first_refused = None;
        for addr in resolved.iter() {
            match refused(addr.ip()) {
                None => allowed.push(*addr),
                Some(why) => {
                    first_refused.get_or_insert(AddressRefused { ip: addr.ip(), why });
                }
            }
        }
        match first_refused {
            Some(refusal) if allowed.is_empty() => Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                refusal,
            ))),
            _ => Ok(allowed),
        }
    }
}

/// The refusal inside a failed attempt's error, if that is why it failed.
pub(crate) fn refusal_of(e: &ureq::Error) -> Option<&AddressRefused> {
    match e {
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<AddressRefused>(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ip: &str) -> Option<&'static str> {
        refused(ip.parse().unwrap())
    }

    #[test]
    fn local_private_and_special_addresses_are_refused() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "192.88.99.1",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001:db8::1",
            "2001::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(check(ip).is_some(), "{ip} should be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "192.0.1.1",
            "198.17.1.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(check(ip), None, "{ip} should pass");
        }
    }
}
