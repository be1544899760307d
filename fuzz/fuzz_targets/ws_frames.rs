//! The WebSocket frame decoder (`decode_frame`) and message reassembly (`Assembler`) on
//! an arbitrary byte stream, as the connection's reader drives them.
//!
//! The first byte chooses the message limit. Checked: no panic; errors carry only the
//! close codes the reader may send (1002, 1007, 1009); a payload range stays inside its
//! frame; client frames are masked (payload starts at byte 6 or later); control frames
//! are final and at most 125 bytes; a completed message is within the limit, and text is
//! UTF-8; a close echoes a valid code. Reassembly may also close with 1008 (too many
//! fragments).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast::close_code::{INVALID_PAYLOAD, PROTOCOL_ERROR, TOO_BIG};
use ringcast::{decode_frame, Assembler, Incoming, Opcode};

/// 1008 (policy violation): too many fragments in one message.
const POLICY: u16 = 1008;

fuzz_target!(|input: &[u8]| {
    let Some((&limit, rest)) = input.split_first() else {
        return;
    };
    let max_message = 1 + usize::from(limit) * 4;
    let mut buf = rest.to_vec();
    let mut asm = Assembler::default();
    let mut off = 0;
    while off < buf.len() {
        let len = buf.len() - off;
        let view = match decode_frame(&mut buf[off..], max_message) {
            Ok(Some(v)) => v,
            Ok(None) => break,
            Err(reason) => {
                assert!(
                    [PROTOCOL_ERROR, TOO_BIG].contains(&reason.code),
                    "code {}",
                    reason.code
                );
                break;
            }
        };
        assert!(view.payload.start <= view.payload.end);
        assert!(view.payload.end == view.consumed && view.consumed <= len);
        assert!(view.payload.start >= 6);
        assert!(view.payload.len() <= max_message);
        if view.opcode.is_control() {
            assert!(view.fin && view.payload.len() <= 125);
        }
        let (start, end) = (off + view.payload.start, off + view.payload.end);
        off += view.consumed;
        match asm.push(view.opcode, view.fin, &mut buf[start..end], max_message) {
            Ok(Incoming::Message(op, data)) => {
                assert!(data.len() <= max_message);
                assert!(matches!(op, Opcode::Text | Opcode::Binary));
                if op == Opcode::Text {
                    assert!(std::str::from_utf8(data).is_ok());
                }
            }
            Ok(Incoming::Close(code)) => assert!(code >= 1000),
            Ok(_) => {}
            Err(reason) => {
                assert!(
                    [PROTOCOL_ERROR, TOO_BIG, INVALID_PAYLOAD, POLICY].contains(&reason.code),
                    "code {}",
                    reason.code
                );
                break;
            }
        }
    }
});
