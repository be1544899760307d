//! WebSocket frame codec (RFC 6455 §5), on tungstenite's frame header types.
//!
//! Decoding: [`decode_frame`] reads one client frame from the start of a buffer. It uses
//! `tungstenite::protocol::frame::FrameHeader::parse` for the header, then enforces what
//! a server must: client frames are masked (else 1002), no RSV bits but RSV1 on the first
//! frame of a data message of a connection that negotiated permessage-deflate (1002), no reserved opcodes (1002), control frames are final and at most
//! 125 bytes (1002), and no frame payload beyond the configured maximum (1009, decided
//! from the header before any payload is buffered). The payload is unmasked in place.
//! Incomplete input is `Ok(None)` and consumes nothing.
//!
//! Encoding: server frames are unmasked; [`write_header`] writes the 2/4/10-byte header
//! and [`frame`] builds a whole small frame as `Bytes`.

use std::io::Cursor;
use std::ops::Range;

use bytes::Bytes;
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use crate::close::Disconnect;

/// Frame opcodes ringcast sends or accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    fn byte(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// One decoded client frame; `payload` indexes the (now unmasked) buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameView {
    pub fin: bool,
    pub opcode: Opcode,
    pub payload: Range<usize>,
    /// RSV1: the message this frame starts is compressed (permessage-deflate).
    pub compressed: bool,
    /// Bytes of the buffer this frame occupied.
    pub consumed: usize,
}

/// Decode the frame at the start of `buf`, unmasking its payload in place (a connection
/// without permessage-deflate: RSV1 is a protocol error).
pub fn decode_frame(buf: &mut [u8], max_payload: usize) -> Result<Option<FrameView>, Disconnect> {
    decode_frame_with(buf, max_payload, false)
}

/// [`decode_frame`]; `deflate`: the connection agreed to permessage-deflate (RSV1 may
/// start a data message).
pub(crate) fn decode_frame_with(
    buf: &mut [u8],
    max_payload: usize,
    deflate: bool,
) -> Result<Option<FrameView>, Disconnect> {
    let mut cursor = Cursor::new(&*buf);
    let (header, len) = match FrameHeader::parse(&mut cursor) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(None),
        Err(_) => return Err(Disconnect::MALFORMED_HEADER),
    };
    let header_len = cursor.position() as usize;
    if (header.rsv1 && !deflate) || header.rsv2 || header.rsv3 {
        return Err(Disconnect::RESERVED_BITS);
    }
    let opcode = match header.opcode {
        OpCode::Data(Data::Continue) => Opcode::Continuation,
        OpCode::Data(Data::Text) => Opcode::Text,
        OpCode::Data(Data::Binary) => Opcode::Binary,
        OpCode::Control(Control::Close) => Opcode::Close,
        OpCode::Control(Control::Ping) => Opcode::Ping,
        OpCode::Control(Control::Pong) => Opcode::Pong,
        _ => return Err(Disconnect::RESERVED_OPCODE),
    };
    let Some(mask) = header.mask else {
        return Err(Disconnect::UNMASKED);
    };
    // RSV1 marks the first frame of a compressed message only (RFC 7692 §6.1).
    if header.rsv1 && !matches!(opcode, Opcode::Text | Opcode::Binary) {
        return Err(Disconnect::RESERVED_BITS);
    }
    if opcode.is_control() && (len > 125 || !header.is_final) {
        return Err(Disconnect::INVALID_CONTROL);
    }
    if len > max_payload as u64 {
        return Err(Disconnect::FRAME_TOO_LARGE);
    }
    let len = len as usize;
    if buf.len() < header_len + len {
        return Ok(None);
    }
    let payload = header_len..header_len + len;
    unmask(&mut buf[payload.clone()], mask);
    Ok(Some(FrameView {
        fin: header.is_final,
        opcode,
        payload,
        compressed: header.rsv1,
        consumed: header_len + len,
    }))
}

/// XOR the payload with the 4-byte mask, a word at a time.
pub(crate) fn unmask(buf: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let wide = (u64::from(word) << 32) | u64::from(word);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut v = [0u8; 8];
        v.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(v) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// Size of a server frame header for `len` payload bytes.
pub(crate) fn header_len(len: usize) -> usize {
    if len < 126 {
        2
    } else if len <= 0xffff {
        4
    } else {
        10
    }
}

/// Append an unmasked, final frame header.
pub(crate) fn write_header(out: &mut Vec<u8>, opcode: Opcode, len: usize) {
    write_header_bits(out, 0x80 | opcode.byte(), len);
}

/// [`write_header`] with RSV1 set: a permessage-deflate compressed message.
pub(crate) fn write_header_rsv1(out: &mut Vec<u8>, opcode: Opcode, len: usize) {
    write_header_bits(out, 0xC0 | opcode.byte(), len);
}

fn write_header_bits(out: &mut Vec<u8>, first: u8, len: usize) {
    out.push(first);
    if len < 126 {
        out.push(len as u8);
    } else if len <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// A whole server frame.
pub fn frame(opcode: Opcode, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(header_len(payload.len()) + payload.len());
    write_header(&mut out, opcode, payload.len());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// The payload of one complete, final, unmasked text frame with a minimal length header
/// covering exactly the rest of `frame` (what [`frame`] builds); `None` for anything else.
pub(crate) fn text_payload(frame: &[u8]) -> Option<&[u8]> {
    match data_payload(frame)? {
        (Opcode::Text, payload) => Some(payload),
        _ => None,
    }
}

/// [`text_payload`] for a text or a binary frame, with its opcode.
pub(crate) fn data_payload(frame: &[u8]) -> Option<(Opcode, &[u8])> {
    let opcode = match frame.first()? {
        0x81 => Opcode::Text,
        0x82 => Opcode::Binary,
        _ => return None,
    };
    if frame.len() < 2 || frame[1] & 0x80 != 0 {
        return None;
    }
    let (len, header) = match frame[1] {
        126 => (
            u64::from(u16::from_be_bytes([*frame.get(2)?, *frame.get(3)?])),
            4,
        ),
        127 => (u64::from_be_bytes(frame.get(2..10)?.try_into().ok()?), 10),
        n => (u64::from(n), 2),
    };
    let payload = &frame[header..];
    let minimal = header_len(payload.len()) == header;
    (len == payload.len() as u64 && minimal).then_some((opcode, payload))
}

/// A close frame with a code and a reason (the reason is cut to fit 125 bytes).
pub(crate) fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut payload = Vec::with_capacity(2 + reason.len());
    payload.extend_from_slice(&code.to_be_bytes());
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    payload.extend_from_slice(&reason.as_bytes()[..cut]);
    frame(Opcode::Close, &payload)
}

/// Whether a close code received from a peer is allowed on the wire (RFC 6455 §7.4).
pub(crate) fn valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::close::code::*;

    fn client_frame(first: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut out = vec![first];
        if payload.len() < 126 {
            out.push(0x80 | payload.len() as u8);
        } else {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn decodes_and_unmasks() {
        let mut buf = client_frame(0x81, b"hello websocket world", [1, 2, 3, 4]);
        let f = decode_frame(&mut buf, 1024).unwrap().unwrap();
        assert!(f.fin);
        assert_eq!(f.opcode, Opcode::Text);
        assert_eq!(&buf[f.payload.clone()], b"hello websocket world");
        assert_eq!(f.consumed, buf.len());
    }

    #[test]
    fn partial_frames_need_more() {
        let full = client_frame(0x81, &[b'a'; 300], [9, 8, 7, 6]);
        for cut in [1, 2, 3, 5, 8, 100, full.len() - 1] {
            let mut part = full[..cut].to_vec();
            assert_eq!(decode_frame(&mut part, 1024).unwrap(), None, "cut {cut}");
        }
    }

    #[test]
    fn protocol_violations() {
        let cases = [
            (
                "unmasked",
                vec![0x81, 0x02, b'h', b'i'],
                1024,
                PROTOCOL_ERROR,
            ),
            (
                "rsv",
                client_frame(0xC1, b"x", [1, 1, 1, 1]),
                1024,
                PROTOCOL_ERROR,
            ),
            (
                "reserved",
                client_frame(0x83, b"x", [1, 1, 1, 1]),
                1024,
                PROTOCOL_ERROR,
            ),
            (
                "fragmented ping",
                client_frame(0x09, b"x", [1, 1, 1, 1]),
                1024,
                PROTOCOL_ERROR,
            ),
            (
                "big",
                client_frame(0x81, &[0u8; 200], [1, 1, 1, 1]),
                100,
                TOO_BIG,
            ),
        ];
        for (what, mut frame, max, code) in cases {
            assert_eq!(
                decode_frame(&mut frame, max).unwrap_err().code,
                code,
                "{what}"
            );
        }
    }

    #[test]
    fn rsv1_only_where_deflate_was_agreed() {
        let mut rsv1 = client_frame(0xC1, b"x", [1, 1, 1, 1]);
        assert!(
            decode_frame_with(&mut rsv1.clone(), 1024, true)
                .unwrap()
                .unwrap()
                .compressed
        );
        assert_eq!(
            decode_frame(&mut rsv1, 1024).unwrap_err().code,
            PROTOCOL_ERROR
        );
        // Never on a continuation or a control frame.
        for first in [0xC0, 0xC9, 0xC8] {
            let mut f = client_frame(first, b"", [1, 1, 1, 1]);
            assert_eq!(
                decode_frame_with(&mut f, 1024, true).unwrap_err().code,
                PROTOCOL_ERROR
            );
        }
        let mut rsv2 = client_frame(0xA1, b"x", [1, 1, 1, 1]);
        assert_eq!(
            decode_frame_with(&mut rsv2, 1024, true).unwrap_err().code,
            PROTOCOL_ERROR
        );
    }

    #[test]
    fn server_frames() {
        let f = frame(Opcode::Text, b"hi");
        assert_eq!(&f[..], &[0x81, 2, b'h', b'i']);
        let c = close_frame(4008, "slow consumer");
        assert_eq!(c[0], 0x88);
        assert_eq!(&c[2..4], &4008u16.to_be_bytes());
        for len in [0, 125, 126, 65535, 65536] {
            let mut out = Vec::new();
            write_header(&mut out, Opcode::Binary, len);
            assert_eq!(out.len(), header_len(len));
        }
    }

    #[test]
    fn unmask_matches_bytewise() {
        let mask = [0xde, 0xad, 0xbe, 0xef];
        let data: Vec<u8> = (0..37u8).collect();
        let mut fast = data.clone();
        unmask(&mut fast, mask);
        let slow: Vec<u8> = data
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(fast, slow);
    }
}
