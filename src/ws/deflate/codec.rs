//! Raw deflate for permessage-deflate (RFC 7692 §7.2), one message at a time.
//!
//! [`compress_frame`] turns a complete server text frame into its compressed form (RSV1
//! set, the payload deflated and flushed with the trailing `00 00 ff ff` removed), or
//! `None` when that would not be smaller. [`inflate`] appends the `00 00 ff ff` a client
//! left off and inflates into a buffer, stopping as soon as the output passes the
//! limit: a small frame that would inflate to gigabytes costs at most `limit` bytes and
//! the work to produce them.
//!
//! Library: flate2 on its zlib-rs backend (pure Rust, already in the dependency tree),
//! level 1 at window 15: on channels of ten subscribers (1,000 channels, 2,000 msg/s, 4 KB
//! realistic JSON) level 6 cost 1.46x the CPU per delivery of no compression, level 2
//! 1.34x, level 1 1.10x, for 0.34 of the bytes instead of 0.24 (BENCHMARKS.md,
//! "Compression level"). Both states are per worker thread and reset for every message
//! (no context takeover), so no connection holds any of it.

use std::cell::RefCell;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::ws::frame::{data_payload, header_len, write_header_rsv1};

/// The empty stored block every sync flush ends with (RFC 7692 §7.2.1).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];
/// An empty final stored block, fed after [`TAIL`]: a complete message is then at a
/// block boundary and this ends the stream; a message cut off inside a block is not,
/// so the stream does not end and the message is refused (RFC 7692 §7.2.2).
const FINAL: [u8; 5] = [0x01, 0x00, 0x00, 0xff, 0xff];
/// Output grown this much at a time while inflating.
const CHUNK: usize = 16 * 1024;

thread_local! {
    static DEFLATE: RefCell<Option<Compress>> = const { RefCell::new(None) };
    static INFLATE: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// Why a compressed message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum InflateError {
    #[error("inflated message over the limit")]
    TooLarge,
    #[error("invalid compressed data")]
    Invalid,
}

/// The compressed form of `frame` (a complete, final, unmasked text or binary frame as
/// `ws::frame::frame` builds it), or `None` when it is not one or would not shrink.
pub(crate) fn compress_frame(frame: &[u8]) -> Option<Bytes> {
    let (opcode, payload) = data_payload(frame)?;
    crate::metrics::with(|m| m.deflate_run());
    // Deflated behind room for the longest header (10 bytes), which is written into
    // that room once the length is known: one buffer, no copy of the body.
    let mut out = vec![0; MAX_HEADER];
    deflate_into(payload, &mut out)?;
    let body = out.len() - MAX_HEADER;
    if body >= payload.len() {
        return None;
    }
    let start = MAX_HEADER - header_len(body);
    let mut head = Vec::with_capacity(MAX_HEADER);
    write_header_rsv1(&mut head, opcode, body);
    out[start..MAX_HEADER].copy_from_slice(&head);
    Some(Bytes::from(out).slice(start..))
}

/// The longest server frame header (a 64-bit length).
const MAX_HEADER: usize = 10;

/// [`compress_frame`] for a frame whose payload is at least the node's threshold
/// (`ws_compression_min_bytes`); `None` below it.
pub(crate) fn compress_large(frame: &[u8]) -> Option<Bytes> {
    let (_, payload) = data_payload(frame)?;
    if payload.len() < super::min_bytes() {
        return None;
    }
    compress_frame(frame)
}

/// Raw deflate of `data`, sync-flushed, without the trailing `00 00 ff ff` (the bench
/// and the tests; the server deflates straight into its frame, [`compress_frame`]).
#[cfg(any(test, feature = "bench"))]
pub(crate) fn deflate(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    deflate_into(data, &mut out)?;
    Some(out)
}

/// [`deflate`] appended to `out`.
fn deflate_into(data: &[u8], out: &mut Vec<u8>) -> Option<()> {
    DEFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let c = slot.get_or_insert_with(|| Compress::new(Compression::new(1), false));
        c.reset();
        // Deflate's worst case is the input plus 5 bytes per stored block, plus the flush.
        out.reserve(data.len() + data.len() / 1024 * 5 + 64);
        let mut input = data;
        loop {
            let before = c.total_in();
            c.compress_vec(input, out, FlushCompress::Sync).ok()?;
            input = &input[(c.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(CHUNK);
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        Some(())
    })
}

/// Inflate one message's compressed payload (the concatenated payloads of its frames)
/// into `out` (cleared first). More than `limit` bytes: [`InflateError::TooLarge`], with
/// at most `limit + 1` bytes produced. Data that is not deflate, or a stream cut off
/// inside a block (it would inflate to a prefix of the message):
/// [`InflateError::Invalid`].
pub(crate) fn inflate(data: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), InflateError> {
    out.clear();
    if data.is_empty() {
        // An empty payload is an empty message.
        return Ok(());
    }
    INFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = slot.get_or_insert_with(|| Decompress::new(false));
        d.reset(false);
        let mut ended = false;
        for part in [data, &TAIL[..], &FINAL[..]] {
            let mut input = part;
            while !ended {
                let room = (limit + 1 - out.len()).min(CHUNK);
                if room == 0 {
                    return Err(InflateError::TooLarge);
                }
                let len = out.len();
                out.resize(len + room, 0);
                let (in0, out0) = (d.total_in(), d.total_out());
                let status = d
                    .decompress(input, &mut out[len..], FlushDecompress::Sync)
                    .map_err(|_| InflateError::Invalid);
                let produced = (d.total_out() - out0) as usize;
                out.truncate(len + produced);
                let status = status?;
                input = &input[(d.total_in() - in0) as usize..];
                if out.len() > limit {
                    return Err(InflateError::TooLarge);
                }
                ended = status == Status::StreamEnd;
                // Done with this part once its input is used up and the output was not
                // what stopped the inflater.
                if input.is_empty() && produced < room {
                    break;
                }
                if produced == 0 && status == Status::BufError && !input.is_empty() {
                    return Err(InflateError::Invalid);
                }
            }
        }
        if !ended {
            return Err(InflateError::Invalid);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::frame::{frame, Opcode};

    fn json(n: usize) -> Vec<u8> {
        let mut s = String::from("{\"items\":[");
        let mut i = 0;
        while s.len() < n {
            s.push_str(&format!(
                "{{\"id\":{i},\"name\":\"item {i}\",\"price\":{}.99,\"tags\":[\"a\",\"b\"]}},",
                i % 97
            ));
            i += 1;
        }
        s.push_str("{}]}");
        s.into_bytes()
    }

    #[test]
    fn round_trips_and_shrinks() {
        for n in [600, 2048, 16 * 1024, 200 * 1024] {
            let data = json(n);
            let f = frame(Opcode::Text, &data);
            let c = compress_frame(&f).expect("JSON shrinks");
            assert_eq!(c[0], 0xC1, "FIN + RSV1 + text");
            assert!(c.len() < f.len() / 2, "{n}: {} vs {}", c.len(), f.len());
            let hl = c.len() - deflate(&data).unwrap().len();
            assert_eq!(hl, header_len(c.len() - hl));
            let mut out = Vec::new();
            inflate(&c[hl..], data.len(), &mut out).unwrap();
            assert_eq!(out, data);
        }
    }

    #[test]
    fn incompressible_frames_stay_plain() {
        // Bytes from a xorshift generator: all 256 values, no repeats to find, so
        // deflate cannot shrink them and the frame must stay plain.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert!(compress_frame(&frame(Opcode::Binary, &data)).is_none());
        assert!(compress_frame(&frame(Opcode::Binary, b"xx")).is_none());
        assert!(compress_frame(b"").is_none());
    }

    #[test]
    fn inflating_stops_at_the_limit() {
        // 10 MB of zeros deflates (at the best level, as an attacker would) to about
        // 10 KB: a bomb for a 64 KiB limit.
        let mut c = Compress::new(Compression::best(), false);
        let mut bomb = Vec::with_capacity(64 * 1024);
        c.compress_vec(&vec![0u8; 10_000_000], &mut bomb, FlushCompress::Sync)
            .unwrap();
        assert_eq!(c.total_in(), 10_000_000);
        bomb.truncate(bomb.len() - TAIL.len());
        assert!(bomb.len() < 20_000);
        let mut out = Vec::new();
        assert_eq!(
            inflate(&bomb, 65_536, &mut out),
            Err(InflateError::TooLarge)
        );
        assert!(out.len() <= 65_537);
        // Exactly at the limit is fine.
        let exact = deflate(&[7u8; 1000]).unwrap();
        inflate(&exact, 1000, &mut out).unwrap();
        assert_eq!(out.len(), 1000);
        assert_eq!(inflate(&exact, 999, &mut out), Err(InflateError::TooLarge));
    }

    #[test]
    fn garbage_is_invalid() {
        let mut out = Vec::new();
        assert_eq!(
            inflate(&[0xff, 0xff, 0xff, 0xff, 0x00], 1000, &mut out),
            Err(InflateError::Invalid)
        );
        inflate(&[], 1000, &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_stream_cut_off_inside_a_block_is_invalid() {
        let data = json(4000);
        let whole = deflate(&data).unwrap();
        let mut out = Vec::new();
        inflate(&whole, 1 << 20, &mut out).unwrap();
        assert_eq!(out, data);
        // A message ending with a final block (BFINAL) is complete too.
        let mut c = Compress::new(Compression::new(1), false);
        let mut fin = Vec::with_capacity(8192);
        c.compress_vec(&data, &mut fin, FlushCompress::Finish)
            .unwrap();
        inflate(&fin, 1 << 20, &mut out).unwrap();
        assert_eq!(out, data);
        // Cut anywhere inside: never a short message.
        for cut in [1, 10, whole.len() / 3, whole.len() / 2, whole.len() - 1] {
            assert_eq!(
                inflate(&whole[..cut], 1 << 20, &mut out),
                Err(InflateError::Invalid),
                "cut at {cut} of {}",
                whole.len()
            );
        }
    }
}
