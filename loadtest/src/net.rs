//! Sockets: the loopback-only target check (and the URL's scheme: plaintext or TLS),
//! the fd limit, and nonblocking connects from several loopback source addresses.
//!
//! Invariants:
//! - Nothing connects anywhere but loopback: `parse_url` refuses other hosts, so the
//!   harness cannot be pointed at someone else's server by mistake.
//! - Connects never block: the socket is nonblocking before `connect`, and completion
//!   is seen as writability in the caller's event loop.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// A parsed `http://HOST:PORT` (or `https://`, `ws://`, `wss://`) target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// The value of the Host header.
    pub host: String,
    /// `https://` or `wss://`: connections speak TLS (see `tls.rs`).
    pub tls: bool,
}

/// Parse `http://127.0.0.1:8080` (or `localhost`, or `[::1]`; `ws://` alike, `https://`
/// and `wss://` for TLS); refuse non-loopback.
pub fn parse_url(url: &str) -> Result<Endpoint, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://").or(url.strip_prefix("ws://")) {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://").or(url.strip_prefix("wss://")) {
        (true, r)
    } else {
        return Err(format!(
            "{url}: only http://, ws://, https:// and wss:// URLs are supported (loopback)"
        ));
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => {
            (h, p.parse::<u16>().map_err(|_| format!("{url}: bad port"))?)
        }
        _ => (hostport, if tls { 443 } else { 80 }),
    };
    let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{url}: host must be a loopback IP literal or localhost"))?
    };
    if !ip.is_loopback() {
        return Err(format!(
            "{url}: refusing a non-loopback target; this harness only loads this machine"
        ));
    }
    Ok(Endpoint {
        addr: SocketAddr::new(ip, port),
        host: hostport.to_string(),
        tls,
    })
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit; returns the limit now in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: get/setrlimit only read and write the struct we own.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            let _ = libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        }
        rl.rlim_cur
    }
}

/// The loopback source address for connection `i` of `n` source addresses:
/// 127.0.0.1, 127.0.0.2, ... Each source address has its own ~28k ephemeral ports
/// towards one destination.
pub fn source_ip(i: usize, n: usize) -> Option<Ipv4Addr> {
    if n <= 1 {
        return None;
    }
    let k = (i % n.min(250)) as u8;
    Some(Ipv4Addr::new(127, 0, 0, 1 + k))
}

/// Start a nonblocking TCP connect to `dst`, optionally from `src`.
pub fn connect_nonblocking(
    dst: SocketAddr,
    src: Option<Ipv4Addr>,
) -> io::Result<mio::net::TcpStream> {
    let domain = if dst.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    sock.set_tcp_nodelay(true)?;
    if let (Some(src), true) = (src, dst.is_ipv4()) {
        // Defer the port choice to connect(), where the kernel knows the 4-tuple;
        // otherwise bind() would allocate a port per source address exclusively and
        // cap us at one port range overall.
        let one: libc::c_int = 1;
        // SAFETY: plain setsockopt on a socket we own, with a correctly sized int.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        sock.bind(&SockAddr::from(SocketAddr::new(IpAddr::V4(src), 0)))?;
    }
    match sock.connect(&SockAddr::from(dst)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(mio::net::TcpStream::from_std(sock.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_loopback_only() {
        let e = parse_url("http://127.0.0.1:8080").unwrap();
        assert_eq!(e.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(e.host, "127.0.0.1:8080");
        assert_eq!(parse_url("http://localhost:81/x").unwrap().addr.port(), 81);
        assert!(parse_url("http://[::1]:9000").unwrap().addr.is_ipv6());
        assert!(parse_url("http://10.0.0.1:8080").is_err());
        assert!(parse_url("http://example.com:80").is_err());
        assert!(parse_url("ftp://127.0.0.1:21").is_err());
        assert!(!parse_url("ws://127.0.0.1:8080").unwrap().tls);
        assert!(!e.tls);
    }

    #[test]
    fn tls_schemes() {
        let e = parse_url("wss://127.0.0.1:8443/").unwrap();
        assert!(e.tls);
        assert_eq!(e.addr.port(), 8443);
        assert_eq!(e.host, "127.0.0.1:8443");
        assert!(parse_url("https://localhost").unwrap().tls);
        assert_eq!(parse_url("https://localhost").unwrap().addr.port(), 443);
        assert!(parse_url("wss://10.0.0.1:443").is_err());
    }

    #[test]
    fn source_ips_rotate() {
        assert_eq!(source_ip(5, 1), None);
        assert_eq!(source_ip(0, 4), Some(Ipv4Addr::new(127, 0, 0, 1)));
        assert_eq!(source_ip(5, 4), Some(Ipv4Addr::new(127, 0, 0, 2)));
    }
}
