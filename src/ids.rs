//! Message and connection identifiers.
//!
//! Connection ids ([`SocketId`]) have Pusher's socket id form, `<node>.<local>` in
//! decimal, on both client protocols: `node` is this process's 32-bit random prefix and
//! `local` is `worker << 40 | connection`, the worker's own connection counter (below
//! 2^40). So a socket id names its node, worker and connection without any table, and a
//! publish carrying one (`socket_id`, Laravel's `toOthers()`) can leave exactly that
//! connection out. Two nodes drawing the same prefix (2^-32 per pair) could make such a
//! publish skip one connection of the same local id on the other node: one missed
//! delivery, never a wrong one.
//!
//! Message ids ([`Id`]):
//! An id is 20 lowercase hex characters: a 32-bit random node prefix drawn once per
//! process, a 12-bit worker index and a 36-bit per-worker counter (wrapping after 6.8e10 ids). Ids are unique per
//! process without any cross-core coordination (each worker counts on its own), and
//! unique across nodes with overwhelming probability thanks to the prefix. Generating
//! one never allocates: it formats into a fixed array.

use std::sync::OnceLock;

/// Length of every id in bytes.
pub(crate) const ID_LEN: usize = 20;

/// A formatted id, kept inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Id([u8; ID_LEN]);

impl Id {
    pub(crate) fn as_str(&self) -> &str {
        // Only hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl std::fmt::Debug for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// This process's random 32-bit node prefix (drawn once).
pub(crate) fn node_prefix() -> u32 {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    *PREFIX.get_or_init(rand::random::<u32>)
}

/// A per-worker id source. Not `Sync` on purpose: each worker owns one.
#[derive(Debug)]
pub(crate) struct IdGen {
    high: u64,
    counter: std::cell::Cell<u64>,
}

impl IdGen {
    pub(crate) fn new(worker: usize) -> IdGen {
        IdGen {
            high: ((node_prefix() as u64) << 12) | (worker as u64 & 0xfff),
            counter: std::cell::Cell::new(0),
        }
    }

    pub(crate) fn next_id(&self) -> Id {
        let n = self.counter.get().wrapping_add(1) & ((1u64 << 36) - 1);
        self.counter.set(n);
        let mut out = [0u8; ID_LEN];
        write_hex(&mut out[..11], self.high, 11);
        write_hex(&mut out[11..], n, 9);
        Id(out)
    }
}

/// Bits of a socket id's local part that hold the connection counter; the worker index
/// sits above them.
const CONN_BITS: u32 = 40;
/// Workers a socket id can name (12 bits: `local` stays below 2^52, exact in a JS number).
const MAX_WORKERS: usize = 1 << 12;
/// Longest formatted socket id: 10 digits, a dot, 16 digits.
const SOCKET_ID_MAX: usize = 27;

/// A connection id in Pusher's socket id form (see the module docs). Formatting never
/// allocates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct SocketId {
    pub(crate) node: u32,
    pub(crate) worker: usize,
    pub(crate) conn: u64,
}

/// A formatted socket id, kept inline.
#[derive(Clone, Copy)]
pub(crate) struct SocketIdText {
    buf: [u8; SOCKET_ID_MAX],
    len: u8,
}

impl SocketIdText {
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII digits and one dot are ever written.
        std::str::from_utf8(&self.buf[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for SocketIdText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SocketId {
    /// The id of connection `conn` (the shard's counter, from 1) of worker `worker` here.
    pub(crate) fn local(worker: usize, conn: u64) -> SocketId {
        SocketId {
            node: node_prefix(),
            worker: worker & (MAX_WORKERS - 1),
            conn: conn & ((1u64 << CONN_BITS) - 1),
        }
    }

    /// The decimal number after the dot.
    pub(crate) fn local_part(&self) -> u64 {
        ((self.worker as u64) << CONN_BITS) | self.conn
    }

    /// The id of node `node`'s connection `local` (as [`SocketId::local`] splits it);
    /// `None` when `local` is out of the range ringcast gives out.
    pub(crate) fn from_parts(node: u32, local: u64) -> Option<SocketId> {
        if local >> (CONN_BITS + 12) != 0 {
            return None;
        }
        Some(SocketId {
            node,
            worker: (local >> CONN_BITS) as usize,
            conn: local & ((1u64 << CONN_BITS) - 1),
        })
    }

    /// Whether this id names a connection of this process.
    pub(crate) fn is_here(&self) -> bool {
        self.node == node_prefix()
    }

    pub(crate) fn text(&self) -> SocketIdText {
        let mut buf = [0u8; SOCKET_ID_MAX];
        let mut len = write_dec(&mut buf, self.node as u64);
        buf[len] = b'.';
        len += 1;
        len += write_dec(&mut buf[len..], self.local_part());
        SocketIdText {
            buf,
            len: len as u8,
        }
    }

    /// Parse `^\d+\.\d+$` with a node that fits 32 bits and a local part below 2^52.
    /// Anything else (signs, spaces, leading `+`, overflow) is `None`.
    pub(crate) fn parse(text: &str) -> Option<SocketId> {
        let (node, local) = text.split_once('.')?;
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 16 && s.bytes().all(|c| c.is_ascii_digit());
        if !digits(node) || !digits(local) {
            return None;
        }
        SocketId::from_parts(node.parse().ok()?, local.parse().ok()?)
    }
}

/// Whether `text` has a socket id's form, `^\d+\.\d+$` (at most [`SOCKET_ID_FORM_MAX`]
/// characters), which is all Pusher's API asks of a `socket_id`.
pub(crate) fn is_socket_id_form(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    text.len() <= SOCKET_ID_FORM_MAX
        && text
            .split_once('.')
            .is_some_and(|(a, b)| digits(a) && digits(b))
}

/// Longest `socket_id` accepted on the publish APIs.
pub(crate) const SOCKET_ID_FORM_MAX: usize = 64;

/// Decimal digits of `value` at the start of `out`; returns how many.
fn write_dec(out: &mut [u8], mut value: u64) -> usize {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (value % 10) as u8;
        n += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = tmp[n - 1 - i];
    }
    n
}

fn write_hex(out: &mut [u8], mut value: u64, digits: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out[i] = HEX[(value & 0xf) as usize];
        value >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_ids_round_trip_in_pusher_form() {
        for (worker, conn) in [(0, 1), (4, 1), (4095, (1u64 << 40) - 1), (1, 12345)] {
            let id = SocketId::local(worker, conn);
            let text = id.text();
            let s = text.as_str();
            let (a, b) = s.split_once('.').unwrap();
            assert!(a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit()));
            assert_eq!(SocketId::parse(s), Some(id), "{s}");
            assert!(id.is_here());
        }
        assert_eq!(
            SocketId::local(4, 1)
                .text()
                .as_str()
                .split_once('.')
                .unwrap()
                .1,
            "4398046511105"
        );
    }

    #[test]
    fn socket_ids_refuse_what_is_not_the_form() {
        for bad in [
            "",
            ".",
            "1.",
            ".1",
            "1",
            "1.2.3",
            "-1.2",
            "1.-2",
            "+1.2",
            " 1.2",
            "1.2 ",
            "a.1",
            "4294967296.1",
            "1.4503599627370496",
            "1.99999999999999999",
        ] {
            assert_eq!(SocketId::parse(bad), None, "{bad:?}");
        }
        assert!(SocketId::parse("4294967295.4503599627370495").is_some());
    }

    #[test]
    fn ids_are_unique_and_hex() {
        let a = IdGen::new(0);
        let b = IdGen::new(1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            for id in [a.next_id(), b.next_id()] {
                assert_eq!(id.as_str().len(), ID_LEN);
                assert!(id.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
                assert!(seen.insert(id));
            }
        }
    }
}
