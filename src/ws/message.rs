//! Reassembly of fragmented messages and the control-frame rules of RFC 6455 §5.4–5.5.
//!
//! [`Assembler::push`] takes each decoded frame in order and says what it completed: a
//! whole data message, a ping to answer, a pong, a close, or nothing yet. Unfragmented
//! messages are handed over in place (no copy); only fragmented ones are collected, and
//! never beyond the message limit (1009). Text is checked to be UTF-8 (1007); a close
//! frame's code and reason are checked (1002/1007) and turned into the code to echo.

use super::frame::{valid_close_code, Opcode};
use crate::close::{code::NORMAL, Disconnect};

/// What one frame completed.
#[derive(Debug)]
pub enum Incoming<'a> {
    None,
    Message(Opcode, &'a mut [u8]),
    Ping(&'a [u8]),
    Pong,
    /// The peer closed; the code to answer with.
    Close(u16),
}

/// A fragmented message being collected.
#[derive(Debug, Default)]
pub struct Assembler {
    opcode: Option<Opcode>,
    parts: Vec<u8>,
}

impl Assembler {
    /// Feed one frame. `payload` is already unmasked.
    pub fn push<'a>(
        &'a mut self,
        opcode: Opcode,
        fin: bool,
        payload: &'a mut [u8],
        max_message: usize,
    ) -> Result<Incoming<'a>, Disconnect> {
        match opcode {
            Opcode::Ping => Ok(Incoming::Ping(payload)),
            Opcode::Pong => Ok(Incoming::Pong),
            Opcode::Close => close_code(payload).map(Incoming::Close),
            Opcode::Text | Opcode::Binary => {
                if self.opcode.is_some() {
                    return Err(Disconnect::INTERLEAVED_MESSAGE);
                }
                if fin {
                    if opcode == Opcode::Text && std::str::from_utf8(payload).is_err() {
                        return Err(Disconnect::INVALID_UTF8);
                    }
                    return Ok(Incoming::Message(opcode, payload));
                }
                self.opcode = Some(opcode);
                self.parts.clear();
                self.parts.extend_from_slice(payload);
                self.check_partial_text()?;
                Ok(Incoming::None)
            }
            Opcode::Continuation => {
                let Some(op) = self.opcode else {
                    return Err(Disconnect::ORPHAN_CONTINUATION);
                };
                if self.parts.len() + payload.len() > max_message {
                    return Err(Disconnect::MESSAGE_TOO_LARGE);
                }
                self.parts.extend_from_slice(payload);
                if !fin {
                    self.check_partial_text()?;
                    return Ok(Incoming::None);
                }
                self.opcode = None;
                if op == Opcode::Text && std::str::from_utf8(&self.parts).is_err() {
                    return Err(Disconnect::INVALID_UTF8);
                }
                Ok(Incoming::Message(op, &mut self.parts))
            }
        }
    }

    /// Give back the memory of a reassembled message once it has been handled, so a
    /// connection that once sent a large fragmented message does not keep its buffer.
    pub fn release(&mut self) {
        if self.opcode.is_none() && self.parts.capacity() > 1024 {
            self.parts = Vec::new();
        }
    }

    /// Fail fast on text fragments that can never become valid UTF-8 (an incomplete
    /// sequence at the very end is fine: the next fragment may finish it).
    fn check_partial_text(&self) -> Result<(), Disconnect> {
        if self.opcode != Some(Opcode::Text) {
            return Ok(());
        }
        match std::str::from_utf8(&self.parts) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_none() => Ok(()),
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
