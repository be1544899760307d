//! Reassembly of fragmented messages and the control-frame rules of RFC 6455 §5.4–5.5.
//!
//! [`Assembler::push`] takes each decoded frame in order and says what it completed: a
//! whole data message, a ping to answer, a pong, a close, or nothing yet. Unfragmented
//! messages are handed over in place (no copy); only fragmented ones are collected, and
//! never beyond the message limit (1009) nor beyond the fragment limit (1009 too: empty
//! continuation frames count, so a message cannot be stretched over endless frames).
//! Text is checked to be UTF-8 (1007); a close frame's code and reason are checked
//! (1002/1007) and turned into the code to echo.
//!
//! Invariant: every received byte of a fragmented text message is validated once. The
//! assembler keeps the length of the prefix known to be valid; a fragment is checked
//! from there, so the only bytes looked at twice are an incomplete UTF-8 sequence (at
//! most 3 bytes) that one fragment ends with and the next one completes. An invalid
//! sequence fails at the fragment that contains it.

use super::frame::{valid_close_code, Opcode};
use crate::close::{code::NORMAL, Disconnect};

/// Fragments per message when the assembler is made with [`Assembler::default`]: the
/// server's default `max_fragments_per_message`.
const DEFAULT_MAX_FRAGMENTS: usize = 64;

/// What one frame completed.
#[derive(Debug)]
pub enum Incoming<'a> {
    None,
    Message(Opcode, &'a mut [u8]),
    /// A whole permessage-deflate message, still compressed (the caller inflates it and
    /// checks text for UTF-8 then).
    Compressed(Opcode, &'a mut [u8]),
    Ping(&'a [u8]),
    Pong,
    /// The peer closed; the code to answer with.
    Close(u16),
}

/// The reassembly state of a connection: nothing but the fragment limit until a
/// fragmented message starts (it lives in every parked connection's record, and most
/// connections never fragment), then the message being collected, boxed.
#[derive(Debug)]
pub struct Assembler {
    partial: Option<Box<Partial>>,
    /// Most frames one message may come in.
    max_fragments: u32,
}

/// A fragmented message being collected.
#[derive(Debug)]
struct Partial {
    /// `None` once the message is complete (until [`Assembler::release`]).
    opcode: Option<Opcode>,
    parts: Vec<u8>,
    /// Frames of the message being collected, the first one included.
    fragments: u32,
    /// Text only: `parts[..valid_to]` is known to be valid UTF-8; what follows it is an
    /// incomplete sequence of at most 3 bytes, to be finished by the next fragment.
    valid_to: u32,
    /// The message is compressed (RSV1 on its first frame): no UTF-8 check until it is
    /// inflated.
    compressed: bool,
}

impl Default for Assembler {
    fn default() -> Self {
        Assembler::new(DEFAULT_MAX_FRAGMENTS)
    }
}

impl Assembler {
    /// An assembler refusing messages of more than `max_fragments` frames (at least 1).
    pub fn new(max_fragments: usize) -> Assembler {
        Assembler {
            partial: None,
            max_fragments: u32::try_from(max_fragments).unwrap_or(u32::MAX).max(1),
        }
    }

    /// Feed one uncompressed frame. `payload` is already unmasked.
    pub fn push<'a>(
        &'a mut self,
        opcode: Opcode,
        fin: bool,
        payload: &'a mut [u8],
        max_message: usize,
    ) -> Result<Incoming<'a>, Disconnect> {
        self.push_frame(opcode, fin, false, payload, max_message)
    }

    /// Feed one frame; `compressed`: RSV1 was set on it (the decoder allows that only on
    /// the first frame of a data message of a connection that agreed to deflate).
    /// `max_message` bounds the compressed bytes collected here; the inflated size is
    /// bounded by the caller.
    pub fn push_frame<'a>(
        &'a mut self,
        opcode: Opcode,
        fin: bool,
        compressed: bool,
        payload: &'a mut [u8],
        max_message: usize,
    ) -> Result<Incoming<'a>, Disconnect> {
        let max_fragments = self.max_fragments;
        match opcode {
            Opcode::Ping => Ok(Incoming::Ping(payload)),
            Opcode::Pong => Ok(Incoming::Pong),
            Opcode::Close => close_code(payload).map(Incoming::Close),
            Opcode::Text | Opcode::Binary => {
                if self.collecting() {
                    return Err(Disconnect::INTERLEAVED_MESSAGE);
                }
                if fin && compressed {
                    return Ok(Incoming::Compressed(opcode, payload));
                }
                if fin {
                    if opcode == Opcode::Text && std::str::from_utf8(payload).is_err() {
                        return Err(Disconnect::INVALID_UTF8);
                    }
                    return Ok(Incoming::Message(opcode, payload));
                }
                let p = self.partial.get_or_insert_with(|| {
                    Box::new(Partial {
                        opcode: None,
                        parts: Vec::new(),
                        fragments: 0,
                        valid_to: 0,
                        compressed: false,
                    })
                });
                p.compressed = compressed;
                p.fragments = 0;
                p.count_fragment(false, max_fragments)?;
                p.opcode = Some(opcode);
                p.valid_to = 0;
                p.parts.clear();
                p.parts.extend_from_slice(payload);
                p.check_text(false)?;
                Ok(Incoming::None)
            }
            Opcode::Continuation => {
                let Some(p) = self.partial.as_mut() else {
                    return Err(Disconnect::ORPHAN_CONTINUATION);
                };
                let Some(op) = p.opcode else {
                    return Err(Disconnect::ORPHAN_CONTINUATION);
                };
                if p.parts.len() + payload.len() > max_message {
                    return Err(Disconnect::MESSAGE_TOO_LARGE);
                }
                p.count_fragment(fin, max_fragments)?;
                p.parts.extend_from_slice(payload);
                p.check_text(fin)?;
                if !fin {
                    return Ok(Incoming::None);
                }
                p.opcode = None;
                if p.compressed {
                    return Ok(Incoming::Compressed(op, &mut p.parts));
                }
                Ok(Incoming::Message(op, &mut p.parts))
            }
        }
    }

    /// Whether a fragmented message is being collected.
    fn collecting(&self) -> bool {
        self.partial.as_ref().is_some_and(|p| p.opcode.is_some())
    }

    /// Give back the memory of a reassembled message once it has been handled, so a
    /// connection that once sent a fragmented message keeps nothing of it.
    pub fn release(&mut self) {
        if !self.collecting() {
            self.partial = None;
        }
    }

    /// Text only: how much of the message being collected is known valid UTF-8.
    #[cfg(test)]
    fn valid_to(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.valid_to as usize)
    }
}

impl Partial {
    /// Count one more frame of the message being collected (empty ones too). A message
    /// may take `max_fragments` frames: a non-final frame that leaves no room for the
    /// final one already decides that the message cannot fit, so it fails right there.
    fn count_fragment(&mut self, fin: bool, max_fragments: u32) -> Result<(), Disconnect> {
        self.fragments += 1;
        if self.fragments + u32::from(!fin) > max_fragments {
            return Err(Disconnect::TOO_MANY_FRAGMENTS);
        }
        Ok(())
    }

    /// Validate the text collected since the last check. Fails fast on a sequence that
    /// can never become valid UTF-8; an incomplete sequence at the very end is fine
    /// unless this is the final fragment (the next fragment may finish it).
    fn check_text(&mut self, fin: bool) -> Result<(), Disconnect> {
        if self.opcode != Some(Opcode::Text) || self.compressed {
            return Ok(());
        }
        match std::str::from_utf8(&self.parts[self.valid_to as usize..]) {
            Ok(_) => {
                self.valid_to = self.parts.len() as u32;
                Ok(())
            }
            Err(e) if e.error_len().is_none() && !fin => {
                self.valid_to += e.valid_up_to() as u32;
                Ok(())
            }
            Err(_) => Err(Disconnect::INVALID_UTF8),
        }
    }
}

/// The code to answer a peer's close frame with.
fn close_code(payload: &[u8]) -> Result<u16, Disconnect> {
    match payload.len() {
        0 => Ok(NORMAL),
        1 => Err(Disconnect::ONE_BYTE_CLOSE),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !valid_close_code(code) {
                return Err(Disconnect::INVALID_CLOSE_CODE);
            }
            if std::str::from_utf8(&payload[2..]).is_err() {
                return Err(Disconnect::CLOSE_REASON_NOT_UTF8);
            }
            Ok(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::close::code::*;

    #[test]
    fn fragments_reassemble() {
        let mut a = Assembler::default();
        let mut p1 = b"hel".to_vec();
        assert!(matches!(
            a.push(Opcode::Text, false, &mut p1, 100).unwrap(),
            Incoming::None
        ));
        let mut ping = b"p".to_vec();
        assert!(matches!(
            a.push(Opcode::Ping, true, &mut ping, 100).unwrap(),
            Incoming::Ping(b"p")
        ));
        let mut p2 = b"lo".to_vec();
        match a.push(Opcode::Continuation, true, &mut p2, 100).unwrap() {
            Incoming::Message(Opcode::Text, data) => assert_eq!(data, b"hello"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compressed_messages_are_handed_over_whole_and_unchecked() {
        let mut a = Assembler::default();
        // Not UTF-8 while compressed: checked only once inflated.
        let mut p1 = vec![0xff, 0x01];
        assert!(matches!(
            a.push_frame(Opcode::Text, false, true, &mut p1, 100)
                .unwrap(),
            Incoming::None
        ));
        let mut p2 = vec![0xfe];
        match a
            .push_frame(Opcode::Continuation, true, false, &mut p2, 100)
            .unwrap()
        {
            Incoming::Compressed(Opcode::Text, data) => assert_eq!(data, &[0xff, 0x01, 0xfe]),
            other => panic!("{other:?}"),
        }
        a.release();
        let mut one = vec![0xff];
        assert!(matches!(
            a.push_frame(Opcode::Binary, true, true, &mut one, 100)
                .unwrap(),
            Incoming::Compressed(Opcode::Binary, _)
        ));
        // The next uncompressed fragmented message is checked again.
        let mut bad = vec![0xff];
        assert!(a.push(Opcode::Text, false, &mut bad, 100).is_err());
    }

    #[test]
    fn rule_violations() {
        let mut a = Assembler::default();
        let mut c = b"x".to_vec();
        assert_eq!(
            a.push(Opcode::Continuation, true, &mut c, 100)
                .unwrap_err()
                .code,
            PROTOCOL_ERROR
        );
        let mut bad = vec![0xff, 0xfe];
        assert_eq!(
            a.push(Opcode::Text, true, &mut bad, 100).unwrap_err().code,
            INVALID_PAYLOAD
        );
        let mut big = vec![b'a'; 60];
        a.push(Opcode::Binary, false, &mut big, 100).unwrap();
        let mut more = vec![b'a'; 60];
        assert_eq!(
            a.push(Opcode::Continuation, true, &mut more, 100)
                .unwrap_err()
                .code,
            TOO_BIG
        );
    }

    /// Push `frags` as one text message (first frame Text, then continuations, the
    /// last one final); the first error, or the reassembled bytes.
    fn push_text(a: &mut Assembler, frags: &[&[u8]]) -> Result<Vec<u8>, Disconnect> {
        let n = frags.len();
        for (i, f) in frags.iter().enumerate() {
            let op = if i == 0 {
                Opcode::Text
            } else {
                Opcode::Continuation
            };
            let mut p = f.to_vec();
            match a.push(op, i + 1 == n, &mut p, 1 << 20)? {
                Incoming::Message(Opcode::Text, data) => {
                    assert_eq!(i + 1, n, "message before the final fragment");
                    return Ok(data.to_vec());
                }
                Incoming::None => assert!(i + 1 < n, "final fragment completed nothing"),
                other => panic!("{other:?}"),
            }
        }
        unreachable!("no fragments")
    }

    #[test]
    fn utf8_split_anywhere_across_fragments_is_accepted() {
        // A 4-byte character (U+1F600) between ASCII, cut at every pair of positions:
        // every split of the character into 2 or 3 pieces, with empty fragments too.
        let msg = "a\u{1F600}b".as_bytes();
        assert_eq!(msg.len(), 6);
        for i in 0..=msg.len() {
            for j in i..=msg.len() {
                let frags = [&msg[..i], &msg[i..j], &msg[j..]];
                let mut a = Assembler::default();
                assert_eq!(push_text(&mut a, &frags).unwrap(), msg, "cuts {i} {j}");
            }
        }
        // One byte per fragment.
        let frags: Vec<&[u8]> = msg.chunks(1).collect();
        assert_eq!(push_text(&mut Assembler::default(), &frags).unwrap(), msg);
    }

    #[test]
    fn only_new_bytes_are_validated() {
        let mut a = Assembler::default();
        let mut first = vec![b'x'; 16_000];
        first.extend_from_slice(&[0xF0, 0x9F]); // half of U+1F600
        a.push(Opcode::Text, false, &mut first, 1 << 20).unwrap();
        // The valid prefix is remembered; only the incomplete tail is left to check.
        assert_eq!(a.valid_to(), 16_000);
        for _ in 0..10 {
            a.push(Opcode::Continuation, false, &mut [], 1 << 20)
                .unwrap();
            assert_eq!(a.valid_to(), 16_000);
        }
        a.push(Opcode::Continuation, false, &mut [0x98], 1 << 20)
            .unwrap();
        assert_eq!(a.valid_to(), 16_000);
        a.push(Opcode::Continuation, false, &mut [0x80, b'!'], 1 << 20)
            .unwrap();
        assert_eq!(a.valid_to(), 16_005);
    }

    #[test]
    fn invalid_utf8_in_a_later_fragment_is_refused_at_once() {
        // An invalid byte in the third fragment fails at that (non-final) fragment.
        let mut a = Assembler::default();
        a.push(Opcode::Text, false, &mut b"ok ".to_vec(), 100)
            .unwrap();
        a.push(Opcode::Continuation, false, &mut b"fine ".to_vec(), 100)
            .unwrap();
        let err = a
            .push(Opcode::Continuation, false, &mut b"no \xff".to_vec(), 100)
            .unwrap_err();
        assert_eq!(err, Disconnect::INVALID_UTF8);
        // A sequence started in one fragment and broken by the next.
        let mut a = Assembler::default();
        a.push(Opcode::Text, false, &mut [b'a', 0xF0, 0x9F], 100)
            .unwrap();
        let err = a
            .push(Opcode::Continuation, false, &mut b"(".to_vec(), 100)
            .unwrap_err();
        assert_eq!(err.code, INVALID_PAYLOAD);
        // A sequence still incomplete when the message ends.
        let mut a = Assembler::default();
        assert_eq!(
            push_text(&mut a, &[b"a", &[0xE2, 0x82]]).unwrap_err().code,
            INVALID_PAYLOAD
        );
        // Binary is not text: anything goes.
        let mut a = Assembler::default();
        a.push(Opcode::Binary, false, &mut [0xff], 100).unwrap();
        assert!(matches!(
            a.push(Opcode::Continuation, true, &mut [0xfe], 100),
            Ok(Incoming::Message(Opcode::Binary, _))
        ));
    }

    #[test]
    fn fragment_cap_counts_empty_fragments() {
        let mut a = Assembler::new(4);
        // Four frames, three of them empty: exactly the cap.
        assert_eq!(push_text(&mut a, &[b"hi", b"", b"", b""]).unwrap(), b"hi");
        // The count starts again with each message. A non-final 4th frame means a 5th
        // is needed: refused there, not one frame later.
        a.push(Opcode::Text, false, &mut b"hi".to_vec(), 100)
            .unwrap();
        for _ in 0..2 {
            a.push(Opcode::Continuation, false, &mut [], 100).unwrap();
        }
        let err = a
            .push(Opcode::Continuation, false, &mut [], 100)
            .unwrap_err();
        assert_eq!(err, Disconnect::TOO_MANY_FRAGMENTS);
        assert_eq!(err.code, TOO_BIG);
        // Binary messages are counted the same way.
        let mut a = Assembler::new(2);
        a.push(Opcode::Binary, false, &mut [], 100).unwrap();
        assert_eq!(
            a.push(Opcode::Continuation, false, &mut [], 100)
                .unwrap_err(),
            Disconnect::TOO_MANY_FRAGMENTS
        );
        // A cap of 1 allows unfragmented messages only.
        let mut a = Assembler::new(1);
        assert!(matches!(
            a.push(Opcode::Text, true, &mut b"x".to_vec(), 100),
            Ok(Incoming::Message(..))
        ));
        assert_eq!(
            a.push(Opcode::Text, false, &mut b"x".to_vec(), 100)
                .unwrap_err(),
            Disconnect::TOO_MANY_FRAGMENTS
        );
        // Control frames between fragments are not counted.
        let mut a = Assembler::new(2);
        a.push(Opcode::Text, false, &mut b"a".to_vec(), 100)
            .unwrap();
        for _ in 0..10 {
            a.push(Opcode::Ping, true, &mut [], 100).unwrap();
        }
        match a.push(Opcode::Continuation, true, &mut b"b".to_vec(), 100) {
            Ok(Incoming::Message(Opcode::Text, data)) => assert_eq!(data, b"ab"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn close_codes() {
        assert_eq!(close_code(&[]).unwrap(), 1000);
        assert_eq!(close_code(&[0x03, 0xe8]).unwrap(), 1000);
        assert_eq!(close_code(&[0x03]).unwrap_err().code, PROTOCOL_ERROR);
        assert_eq!(
            close_code(&1005u16.to_be_bytes()).unwrap_err().code,
            PROTOCOL_ERROR
        );
        assert_eq!(
            close_code(&[0x0f, 0xa0, 0xff]).unwrap_err().code,
            INVALID_PAYLOAD
        );
    }
}
