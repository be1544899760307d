//! The PROXY protocol header (HAProxy's spec, versions 1 and 2) as bytes: recognising
//! its start, and reading the client address out of a complete header. No I/O here
//! ([`super::accept`] reads the bytes); every function is total on any input.
//!
//! - v1: one text line `PROXY TCP4|TCP6 <src> <dst> <sport> <dport>\r\n` or
//!   `PROXY UNKNOWN ...\r\n`, at most [`V1_MAX`] bytes with the CRLF.
//! - v2: the 12-byte signature, version/command, family, a 16-bit length, then that many
//!   bytes (addresses, then TLVs, which are skipped). The length is refused above
//!   [`V2_MAX_BODY`].
//!
//! `LOCAL` (v2, what HAProxy's health checks send), `UNKNOWN` (v1) and families other
//! than TCP over IPv4/IPv6 name no client: the connection's own peer stays the client
//! address (`Ok(None)`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How a v1 header starts.
pub(crate) const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// The v2 signature.
pub(crate) const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v1 header's longest form (the spec's bound), CRLF included.
pub(crate) const V1_MAX: usize = 107;
/// v2: the fixed part before the addresses.
pub(crate) const V2_HEAD: usize = 16;
/// v2: the largest body accepted (addresses and TLVs). The spec allows 65,535; HAProxy
/// sends far less (216 bytes for the UNIX family, a few hundred with SSL TLVs).
pub(crate) const V2_MAX_BODY: usize = 2048;
/// Bytes enough to tell a header from anything else ([`kind`]).
pub(crate) const SNIFF: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("PROXY v1 line is malformed")]
    V1Malformed,
    #[error("PROXY v1 line longer than 107 bytes")]
    V1TooLong,
    #[error("PROXY v2 signature, version or command is invalid")]
    V2Invalid,
    #[error("PROXY v2 length {0} is over the 2048 accepted")]
    V2TooLong(usize),
    #[error("PROXY v2 address block is shorter than its family needs")]
    V2Short,
}

/// What the first [`SNIFF`] bytes of a connection are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    V1,
    V2,
    /// Not a PROXY header: the bytes belong to the protocol that follows.
    Other,
}

pub(crate) fn kind(first: &[u8]) -> Kind {
    if first.starts_with(V1_PREFIX) {
        Kind::V1
    } else if first.len() >= SNIFF && V2_SIGNATURE.starts_with(&first[..SNIFF]) {
        Kind::V2
    } else {
        Kind::Other
    }
}

/// A complete v1 line (with its CRLF): the source address, if it names one.
pub(crate) fn parse_v1(line: &[u8]) -> Result<Option<IpAddr>, ProxyError> {
    if line.len() > V1_MAX {
        return Err(ProxyError::V1TooLong);
    }
    let text = line
        .strip_prefix(V1_PREFIX)
        .and_then(|l| l.strip_suffix(b"\r\n"))
        .and_then(|l| std::str::from_utf8(l).ok())
        .ok_or(ProxyError::V1Malformed)?;
    let mut parts = text.split(' ');
    let family = parts.next().ok_or(ProxyError::V1Malformed)?;
    if family == "UNKNOWN" {
        return Ok(None);
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(ProxyError::V1Malformed);
    };
    let (src, dst): (IpAddr, IpAddr) = match family {
        "TCP4" => (
            IpAddr::V4(src.parse().map_err(|_| ProxyError::V1Malformed)?),
            IpAddr::V4(dst.parse().map_err(|_| ProxyError::V1Malformed)?),
        ),
        "TCP6" => (
            IpAddr::V6(src.parse().map_err(|_| ProxyError::V1Malformed)?),
            IpAddr::V6(dst.parse().map_err(|_| ProxyError::V1Malformed)?),
        ),
        _ => return Err(ProxyError::V1Malformed),
    };
    let _ = dst;
    for port in [sport, dport] {
        // Decimal without sign or leading zeros, as the spec writes them.
        let ok = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && (port == "0" || !port.starts_with('0'))
            && port.parse::<u16>().is_ok();
        if !ok {
            return Err(ProxyError::V1Malformed);
        }
    }
    Ok(Some(src))
}

/// The v2 fixed part: checks it and returns the length of the body that follows.
pub(crate) fn v2_body_len(head: &[u8; V2_HEAD]) -> Result<usize, ProxyError> {
    if &head[..12] != V2_SIGNATURE {
        return Err(ProxyError::V2Invalid);
    }
    // Version 2, command LOCAL (0) or PROXY (1).
    if head[12] >> 4 != 2 || head[12] & 0x0f > 1 {
        return Err(ProxyError::V2Invalid);
    }
    let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
    if len > V2_MAX_BODY {
        return Err(ProxyError::V2TooLong(len));
    }
    Ok(len)
}

/// The source address of a v2 address block of `block` bytes (source and destination
/// addresses, then both ports): its first `N` bytes, once the whole block is there.
fn v2_source<const N: usize>(body: &[u8], block: usize) -> Result<[u8; N], ProxyError> {
    if body.len() < block {
        return Err(ProxyError::V2Short);
    }
    body.get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or(ProxyError::V2Short)
}

/// A complete v2 header (fixed part checked by [`v2_body_len`], then its body): the
/// source address, if it names one.
pub(crate) fn parse_v2(head: &[u8; V2_HEAD], body: &[u8]) -> Result<Option<IpAddr>, ProxyError> {
    v2_body_len(head)?;
    if head[12] & 0x0f == 0 {
        // LOCAL: the proxy speaking for itself (health checks).
        return Ok(None);
    }
    match head[13] >> 4 {
        1 => Ok(Some(IpAddr::V4(Ipv4Addr::from(v2_source::<4>(body, 12)?)))),
        2 => Ok(Some(IpAddr::V6(Ipv6Addr::from(v2_source::<16>(body, 36)?)))),
        // UNSPEC, UNIX: no IP address to take.
        _ => Ok(None),
    }
}

/// A v2 header for `src` → `dst` over TCP (tests, and the load tools that speak it).
#[cfg(test)]
pub(crate) fn encode_v2(src: std::net::SocketAddr, dst: std::net::SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    let mut body = Vec::new();
    match (src, dst) {
        (std::net::SocketAddr::V4(s), std::net::SocketAddr::V4(d)) => {
            out.push(0x11);
            body.extend_from_slice(&s.ip().octets());
            body.extend_from_slice(&d.ip().octets());
            body.extend_from_slice(&s.port().to_be_bytes());
            body.extend_from_slice(&d.port().to_be_bytes());
        }
        (s, d) => {
            out.push(0x21);
            let v6 = |a: std::net::SocketAddr| match a.ip() {
                IpAddr::V6(ip) => ip.octets(),
                IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            };
            body.extend_from_slice(&v6(s));
            body.extend_from_slice(&v6(d));
            body.extend_from_slice(&s.port().to_be_bytes());
            body.extend_from_slice(&d.port().to_be_bytes());
        }
    }
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn v2(bytes: &[u8]) -> Result<Option<IpAddr>, ProxyError> {
        let head: [u8; V2_HEAD] = bytes[..V2_HEAD].try_into().unwrap();
        let len = v2_body_len(&head)?;
        parse_v2(&head, &bytes[V2_HEAD..V2_HEAD + len])
    }

    #[test]
    fn sniffing() {
        assert_eq!(kind(b"PROXY TCP4"), Kind::V1);
        assert_eq!(kind(&V2_SIGNATURE[..]), Kind::V2);
        assert_eq!(kind(b"GET / HTTP/1.1"), Kind::Other);
        assert_eq!(kind(b"POST /"), Kind::Other);
        assert_eq!(kind(b"PUT /a"), Kind::Other);
        assert_eq!(kind(&[0x16, 3, 1, 0, 0xc8, 1]), Kind::Other);
    }

    #[test]
    fn v1_lines() {
        assert_eq!(
            parse_v1(b"PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\n"),
            Ok(Some(ip("203.0.113.7")))
        );
        assert_eq!(
            parse_v1(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n"),
            Ok(Some(ip("2001:db8::1")))
        );
        assert_eq!(parse_v1(b"PROXY UNKNOWN\r\n"), Ok(None));
        assert_eq!(parse_v1(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"), Ok(None));
        let longest = format!(
            "PROXY TCP6 {0} {0} 65535 65535\r\n",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        assert!(longest.len() <= V1_MAX);
        assert!(parse_v1(longest.as_bytes()).is_ok());
    }

    #[test]
    fn bad_v1_lines() {
        for bad in [
            &b"PROXY TCP4 203.0.113.7 10.0.0.1 56324\r\n"[..],
            b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 1.2.3.5 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.5 1 65536\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.5 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.5 -1 2\r\n",
            b"PROXY TCP4  1.2.3.4 1.2.3.5 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.5 1 2\n",
            b"PROXY UDP4 1.2.3.4 1.2.3.5 1 2\r\n",
            b"PROXY \r\n",
        ] {
            assert!(parse_v1(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!("PROXY UNKNOWN {}\r\n", "x".repeat(100));
        assert_eq!(parse_v1(long.as_bytes()), Err(ProxyError::V1TooLong));
    }

    #[test]
    fn v2_headers() {
        let h = encode_v2(
            "203.0.113.7:5000".parse().unwrap(),
            "10.0.0.1:443".parse().unwrap(),
        );
        assert_eq!(kind(&h), Kind::V2);
        assert_eq!(v2(&h), Ok(Some(ip("203.0.113.7"))));
        let h = encode_v2(
            "[2001:db8::7]:5000".parse().unwrap(),
            "[2001:db8::1]:443".parse().unwrap(),
        );
        assert_eq!(v2(&h), Ok(Some(ip("2001:db8::7"))));
        // TLVs after the addresses are skipped.
        let mut with_tlv = encode_v2(
            "198.51.100.2:1".parse().unwrap(),
            "10.0.0.1:2".parse().unwrap(),
        );
        with_tlv.extend_from_slice(&[0x04, 0x00, 0x02, b'h', b'i']);
        with_tlv[15] += 5;
        assert_eq!(v2(&with_tlv), Ok(Some(ip("198.51.100.2"))));
        // LOCAL (health checks): no client address.
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(v2(&local), Ok(None));
        // UNIX family: no IP to take.
        let mut unix = V2_SIGNATURE.to_vec();
        unix.extend_from_slice(&[0x21, 0x31, 0, 216]);
        unix.extend_from_slice(&[0; 216]);
        assert_eq!(v2(&unix), Ok(None));
    }

    #[test]
    fn bad_v2_headers() {
        let good = encode_v2(
            "203.0.113.7:5000".parse().unwrap(),
            "10.0.0.1:443".parse().unwrap(),
        );
        let mut version = good.clone();
        version[12] = 0x11;
        assert_eq!(v2(&version), Err(ProxyError::V2Invalid));
        let mut command = good.clone();
        command[12] = 0x22;
        assert_eq!(v2(&command), Err(ProxyError::V2Invalid));
        let mut sig = good.clone();
        sig[11] = b'X';
        assert_eq!(v2(&sig), Err(ProxyError::V2Invalid));
        let mut short = good.clone();
        short[15] = 8;
        assert_eq!(v2(&short), Err(ProxyError::V2Short));
        let mut huge = good;
        huge[14] = 0xff;
        let head: [u8; V2_HEAD] = huge[..V2_HEAD].try_into().unwrap();
        assert_eq!(v2_body_len(&head), Err(ProxyError::V2TooLong(0xff0c)));
    }
}
