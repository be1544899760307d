//! The HTTP request-head parser (`parse_head`) on arbitrary bytes.
//!
//! The first two bytes choose the head limit and the header-count limit, so the fuzzer
//! reaches the "too large" and "too many headers" branches as well as the parse itself.
//! Checked: no panic; every range of a parsed head lies inside the head; an incomplete
//! head is never longer than the limit; a head that parses, cut anywhere before its end,
//! is "need more" (never an error, never a different head).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast::parse_head;

fuzz_target!(|input: &[u8]| {
    let Some((&[a, b], buf)) = input.split_first_chunk::<2>() else {
        return;
    };
    let max_head = 16 + usize::from(a) * 16;
    let max_headers = 1 + usize::from(b % 80);
    match parse_head(buf, max_head, max_headers) {
        Ok(Some(head)) => {
            assert!(head.head_len <= buf.len() && head.head_len <= max_head);
            let in_head = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= head.head_len;
            assert!(in_head(&head.path));
            for r in [
                &head.query,
                &head.content_type,
                &head.api_key,
                &head.ws_key,
                &head.ws_version,
            ]
            .into_iter()
            .flatten()
            {
                assert!(
                    in_head(r),
                    "range {r:?} outside a head of {}",
                    head.head_len
                );
            }
            let cut = head.head_len.saturating_sub(1 + usize::from(a) % 8);
            assert!(
                matches!(parse_head(&buf[..cut], max_head, max_headers), Ok(None)),
                "a prefix of a valid head was not 'need more'"
            );
        }
        Ok(None) => assert!(buf.len() <= max_head, "need more beyond the head limit"),
        Err(_) => {}
    }
});
