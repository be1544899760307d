//! A tiny WebSocket client codec: the upgrade request, client (masked) frames out,
//! server (unmasked) frame headers in.
//!
//! Invariants:
//! - Parsing never allocates and never panics on any input: `parse_frame` only reads
//!   the header and returns offsets into the caller's buffer; incomplete input is
//!   `Ok(None)` (nothing consumed), a protocol violation is `Err`.
//! - A server frame with the MASK bit is refused (RFC 6455 §5.1: servers never mask).
//! - Client frames are always masked, as servers must close on unmasked client frames.
//! - permessage-deflate (`--compression`, [`set_compression`]): the upgrade offers it
//!   (no context takeover either way), RSV1 is accepted on a server data frame and its
//!   payload inflated ([`inflate`]) by one per-thread inflater, reset per message. Off,
//!   nothing is offered and RSV1 stays a protocol error. Clients send uncompressed
//!   (allowed: compression is per message and optional).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

static COMPRESSION: AtomicBool = AtomicBool::new(false);

/// Offer permessage-deflate on every upgrade from now on (set once, at start).
pub fn set_compression(on: bool) {
    COMPRESSION.store(on, Ordering::Relaxed);
}

fn compression() -> bool {
    COMPRESSION.load(Ordering::Relaxed)
}

thread_local! {
    static INFLATER: RefCell<flate2::Decompress> = RefCell::new(flate2::Decompress::new(false));
}

/// Inflate one compressed message's payload into `out` (cleared first); `false` when it
/// is not valid deflate data or inflates past `MAX_FRAME_PAYLOAD`.
pub fn inflate(payload: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    INFLATER.with(|d| {
        let mut d = d.borrow_mut();
        d.reset(false);
        for part in [payload, &[0, 0, 0xff, 0xff][..]] {
            let mut input = part;
            loop {
                if out.len() as u64 > MAX_FRAME_PAYLOAD {
                    return false;
                }
                out.reserve(input.len().max(256) * 4);
                let before = d.total_in();
                match d.decompress_vec(input, out, flate2::FlushDecompress::Sync) {
                    Err(_) => return false,
                    // A final block (BFINAL, allowed by RFC 7692): the message is whole,
                    // and nothing after it would ever be consumed.
                    Ok(flate2::Status::StreamEnd) => return true,
                    Ok(_) => {}
                }
                input = &input[(d.total_in() - before) as usize..];
                if input.is_empty() && out.len() < out.capacity() {
                    break;
                }
            }
        }
        true
    })
}

/// Continuation frame.
pub const OP_CONT: u8 = 0x0;
/// UTF-8 text frame: every ringcast and Nchan message arrives as one.
pub const OP_TEXT: u8 = 0x1;
/// Binary frame.
pub const OP_BINARY: u8 = 0x2;
/// Close frame: payload starts with a 2-byte status code.
pub const OP_CLOSE: u8 = 0x8;
/// Ping: must be answered with a pong carrying the same payload.
pub const OP_PING: u8 = 0x9;
/// Pong.
pub const OP_PONG: u8 = 0xA;

/// The harness only publishes small messages; a frame larger than this means the
/// stream is corrupt (or the server misbehaves), not that we should buffer more.
pub const MAX_FRAME_PAYLOAD: u64 = 4 << 20;

/// The sample nonce of RFC 6455 §1.3. The key only has to be 16 bytes of base64; a
/// load tester gains nothing from a random one, and we do not verify the accept hash
/// (the server is ours or Nchan, and a 101 is what we measure).
pub const HANDSHAKE_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The header of one complete server frame in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub fin: bool,
    pub opcode: u8,
    /// Bytes of header (2, 4 or 10: server frames carry no mask key).
    pub header_len: usize,
    /// RSV1: a permessage-deflate compressed message (only with `--compression`).
    pub compressed: bool,
    pub payload_len: usize,
}

impl FrameHead {
    /// Header plus payload: how many bytes to consume for this frame.
    pub fn total_len(&self) -> usize {
        self.header_len + self.payload_len
    }
}

/// Why a server frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The server set the MASK bit.
    Masked,
    /// RSV1..3 set: we negotiated no extension.
    Reserved,
    /// Opcode 3..7 or 11..15.
    UnknownOpcode(u8),
    /// A control frame that is fragmented or longer than 125 bytes.
    BadControl,
    /// Declared payload larger than `MAX_FRAME_PAYLOAD`.
    TooLarge(u64),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Masked => write!(f, "server frame is masked"),
            FrameError::Reserved => write!(f, "reserved bits set"),
            FrameError::UnknownOpcode(op) => write!(f, "unknown opcode {op}"),
            FrameError::BadControl => write!(f, "fragmented or oversized control frame"),
            FrameError::TooLarge(n) => write!(f, "frame payload of {n} bytes is too large"),
        }
    }
}

/// Parse the header of the first frame in `buf`. `Ok(None)` until the whole frame
/// (header and payload) is in the buffer, so a caller can slice the payload at once.
pub fn parse_frame(buf: &[u8]) -> Result<Option<FrameHead>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    let compressed = b0 & 0x40 != 0;
    if b0 & 0x30 != 0 || (compressed && !compression()) {
        return Err(FrameError::Reserved);
    }
    if b1 & 0x80 != 0 {
        return Err(FrameError::Masked);
    }
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0F;
    match opcode {
        OP_CONT | OP_TEXT | OP_BINARY => {}
        OP_CLOSE | OP_PING | OP_PONG => {
            if !fin || (b1 & 0x7F) > 125 {
                return Err(FrameError::BadControl);
            }
        }
        other => return Err(FrameError::UnknownOpcode(other)),
    }
    let (header_len, len) = match b1 & 0x7F {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (4, u64::from(u16::from_be_bytes([buf[2], buf[3]])))
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (10, u64::from_be_bytes(b))
        }
        n => (2, u64::from(n)),
    };
    if len > MAX_FRAME_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    // Safe: bounded by MAX_FRAME_PAYLOAD above.
    let payload_len = len as usize;
    if buf.len() < header_len + payload_len {
        return Ok(None);
    }
    Ok(Some(FrameHead {
        fin,
        opcode,
        header_len,
        compressed,
        payload_len,
    }))
}

/// Append one masked client frame (FIN set) to `out`. The mask comes from the
/// caller's cheap PRNG state; it only has to vary, not be secret, for a load test.
pub fn encode_client_frame(opcode: u8, payload: &[u8], mask_seed: &mut u32, out: &mut Vec<u8>) {
    out.push(0x80 | (opcode & 0x0F));
    let len = payload.len();
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    // xorshift32: a new mask per frame without a dependency on a RNG crate.
    let mut x = *mask_seed | 1;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *mask_seed = x;
    let mask = x.to_be_bytes();
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
}

/// Append the HTTP/1.1 upgrade request for `path` to `out`.
pub fn write_upgrade_request(out: &mut Vec<u8>, host: &str, path: &str) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {HANDSHAKE_KEY}\r\nSec-WebSocket-Version: 13\r\n"
    );
    if compression() {
        out.extend_from_slice(
            b"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n",
        );
    }
    out.extend_from_slice(b"\r\n");
}

/// The status code of a close frame's payload (1005 "no status" when absent).
pub fn close_code(payload: &[u8]) -> u16 {
    if payload.len() >= 2 {
        u16::from_be_bytes([payload[0], payload[1]])
    } else {
        1005
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_small_text_frame() {
        let mut buf = vec![0x81, 5];
        buf.extend_from_slice(b"hello");
        buf.extend_from_slice(&[0x81]); // start of the next frame
        let h = parse_frame(&buf).unwrap().unwrap();
        assert_eq!(h.opcode, OP_TEXT);
        assert!(h.fin);
        assert_eq!(h.header_len, 2);
        assert_eq!(h.payload_len, 5);
        assert_eq!(&buf[h.header_len..h.total_len()], b"hello");
    }

    #[test]
    fn incomplete_is_none_at_every_split() {
        let payload = vec![b'x'; 300];
        let mut buf = vec![0x81, 126, 0x01, 0x2C];
        buf.extend_from_slice(&payload);
        for cut in 0..buf.len() {
            assert_eq!(parse_frame(&buf[..cut]), Ok(None), "cut at {cut}");
        }
        let h = parse_frame(&buf).unwrap().unwrap();
        assert_eq!((h.header_len, h.payload_len), (4, 300));
    }

    #[test]
    fn parses_64_bit_length() {
        let mut buf = vec![0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0];
        buf.resize(10 + 65536, 0);
        let h = parse_frame(&buf).unwrap().unwrap();
        assert_eq!(
            (h.opcode, h.header_len, h.payload_len),
            (OP_BINARY, 10, 65536)
        );
    }

    #[test]
    fn refuses_protocol_violations() {
        assert_eq!(
            parse_frame(&[0x81, 0x85, 0, 0, 0, 0, 1]),
            Err(FrameError::Masked)
        );
        assert_eq!(parse_frame(&[0xA1, 0]), Err(FrameError::Reserved));
        assert_eq!(parse_frame(&[0x83, 0]), Err(FrameError::UnknownOpcode(3)));
        assert_eq!(parse_frame(&[0x09, 0]), Err(FrameError::BadControl));
        assert_eq!(
            parse_frame(&[0x89, 126, 0, 200]),
            Err(FrameError::BadControl)
        );
        assert_eq!(
            parse_frame(&[0x81, 127, 0xFF, 0, 0, 0, 0, 0, 0, 0]),
            Err(FrameError::TooLarge(0xFF00_0000_0000_0000))
        );
    }

    #[test]
    fn client_frame_is_masked_and_round_trips() {
        let mut seed = 7;
        let mut out = Vec::new();
        encode_client_frame(OP_TEXT, b"{\"type\":\"ping\"}", &mut seed, &mut out);
        assert_eq!(out[0], 0x81);
        assert_eq!(out[1], 0x80 | 15);
        let mask = [out[2], out[3], out[4], out[5]];
        let unmasked: Vec<u8> = out[6..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i & 3])
            .collect();
        assert_eq!(unmasked, b"{\"type\":\"ping\"}");
        let mut long = Vec::new();
        encode_client_frame(OP_TEXT, &[b'a'; 200], &mut seed, &mut long);
        assert_eq!(&long[1..4], &[0x80 | 126, 0, 200]);
        assert_eq!(long.len(), 4 + 4 + 200);
    }

    #[test]
    fn compressed_frames_only_with_compression_and_inflate() {
        let frame = [0xC1, 0x01, 0x00];
        set_compression(false);
        assert_eq!(parse_frame(&frame), Err(FrameError::Reserved));
        let mut up = Vec::new();
        write_upgrade_request(&mut up, "h", "/p");
        assert!(!String::from_utf8_lossy(&up).contains("permessage-deflate"));
        set_compression(true);
        assert!(parse_frame(&frame).unwrap().unwrap().compressed);
        up.clear();
        write_upgrade_request(&mut up, "h", "/p");
        assert!(String::from_utf8_lossy(&up).contains("Extensions: permessage-deflate"));
        set_compression(false);
        let data =
            br#"{"type":"message","data":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        let mut c = flate2::Compress::new(flate2::Compression::default(), false);
        let mut z = Vec::with_capacity(256);
        c.compress_vec(data, &mut z, flate2::FlushCompress::Sync)
            .unwrap();
        assert!(z.ends_with(&[0, 0, 0xff, 0xff]));
        z.truncate(z.len() - 4);
        let mut out = Vec::new();
        assert!(inflate(&z, &mut out));
        assert_eq!(out, data);
        assert!(!inflate(&[0xff, 0xff, 0xff], &mut out));
    }

    #[test]
    fn close_code_reads_status() {
        assert_eq!(close_code(&[0x0F, 0xA8]), 4008);
        assert_eq!(close_code(&[]), 1005);
    }
}
