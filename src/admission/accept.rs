//! Reading a trusted peer's PROXY header off a new connection, before HTTP or TLS.
//!
//! Only exact reads, so that nothing past the header is taken from the socket (TLS
//! needs its ClientHello intact): the first [`SNIFF`] bytes tell a header from
//! anything else; a v2 header is then read as its fixed part and its declared
//! length (capped); a v1 line byte by byte up to its CRLF (at most 107 bytes, so at most
//! ~100 small reads, once per connection and only from a trusted proxy; v2 costs two
//! reads and is what `deploy/haproxy.cfg` sends). The whole header must arrive within
//! the header-read timeout.
//!
//! A trusted peer may also send no header (it forwards HTTP with `X-Forwarded-For`):
//! the sniffed bytes are then handed back, to be the first bytes of what follows.

use std::net::IpAddr;
use std::time::Duration;

use monoio::io::AsyncReadRentExt;
use monoio::net::TcpStream;

use super::proxy::{self, Kind, ProxyError, SNIFF, V1_MAX, V2_HEAD};

#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    #[error("connection closed before the PROXY header ended: {0}")]
    Io(#[from] std::io::Error),
    #[error("PROXY header not received within the header-read timeout")]
    TimedOut,
    #[error(transparent)]
    Proxy(#[from] ProxyError),
}

/// What a trusted peer's connection started with.
#[derive(Debug, Default)]
pub(crate) struct Start {
    /// The client address its PROXY header named (`None`: no header, or one that
    /// names none such as a health check's `LOCAL`).
    pub client: Option<IpAddr>,
    /// Bytes read that were not a PROXY header: the start of the next protocol.
    pub leftover: Vec<u8>,
}

/// Read the PROXY header a trusted peer may start with, within `limit`.
pub(crate) async fn read_start(
    stream: &mut TcpStream,
    limit: Duration,
) -> Result<Start, AcceptError> {
    monoio::time::timeout(limit, read_start_inner(stream))
        .await
        .map_err(|_| AcceptError::TimedOut)?
}

async fn exact(stream: &mut TcpStream, n: usize) -> Result<Vec<u8>, AcceptError> {
    let (res, buf) = stream.read_exact(Vec::with_capacity(n)).await;
    res?;
    Ok(buf)
}

async fn read_start_inner(stream: &mut TcpStream) -> Result<Start, AcceptError> {
    let first = exact(stream, SNIFF).await?;
    match proxy::kind(&first) {
        Kind::Other => Ok(Start {
            client: None,
            leftover: first,
        }),
        Kind::V2 => {
            let rest = exact(stream, V2_HEAD - SNIFF).await?;
            let mut head = [0u8; V2_HEAD];
            head[..SNIFF].copy_from_slice(&first);
            head[SNIFF..].copy_from_slice(&rest);
            let len = proxy::v2_body_len(&head)?;
            let body = if len > 0 {
                exact(stream, len).await?
            } else {
                Vec::new()
            };
            Ok(Start {
                client: proxy::parse_v2(&head, &body)?,
                leftover: Vec::new(),
            })
        }
        Kind::V1 => {
            let mut line = first;
            while !line.ends_with(b"\r\n") {
                if line.len() >= V1_MAX {
                    return Err(ProxyError::V1TooLong.into());
                }
                line.extend_from_slice(&exact(stream, 1).await?);
            }
            Ok(Start {
                client: proxy::parse_v1(&line)?,
                leftover: Vec::new(),
            })
        }
    }
}
