//! The publish body parser (`PublishParser`, simd-json underneath) on arbitrary bytes,
//! with serde_json and the contract's name rule as the oracle.
//!
//! Checked: no panic (simd-json is SIMD and `unsafe` inside: run.sh builds with
//! AddressSanitizer); whatever is accepted is a JSON object with exactly one of
//! `channel` (a valid name) or `channels` (1 to 100 distinct valid names), the parsed
//! ones, a valid `event`, and a `data` span that is the same JSON value; a reused parser
//! gives the same answer as a fresh one. Every body serde_json reads as a valid publish
//! is accepted (numbers beyond f64 aside: simd-json refuses them, a documented limit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast::PublishParser;

fn valid_name(v: Option<&serde_json::Value>) -> Option<&str> {
    let s = v?.as_str()?;
    let n = s.chars().count();
    ((1..=100).contains(&n) && !s.chars().any(|c| (c as u32) < 0x20 || c == '\u{7f}')).then_some(s)
}

/// A valid event name: a name not in the Pusher protocol's reserved namespaces.
fn valid_event(v: Option<&serde_json::Value>) -> Option<&str> {
    valid_name(v).filter(|e| !e.starts_with("pusher:") && !e.starts_with("pusher_internal:"))
}

/// The channels of a valid publish: `channel`, or `channels` (1 to 100 distinct valid
/// names), exactly one of the two.
fn valid_channels(v: &serde_json::Value) -> Option<Vec<String>> {
    match (v.get("channel"), v.get("channels")) {
        (Some(c), None) => valid_name(Some(c)).map(|c| vec![c.to_string()]),
        (None, Some(serde_json::Value::Array(list))) => {
            let names: Option<Vec<String>> = list
                .iter()
                .map(|c| valid_name(Some(c)).map(str::to_string))
                .collect();
            let names = names?;
            let distinct: std::collections::HashSet<&String> = names.iter().collect();
            ((1..=100).contains(&names.len()) && distinct.len() == names.len()).then_some(names)
        }
        _ => None,
    }
}

/// A number serde_json reads but simd-json refuses (out of the f64 range).
fn has_huge_number(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Number(n) => n.as_f64().is_none_or(|f| !f.is_finite()),
        serde_json::Value::Array(a) => a.iter().any(has_huge_number),
        serde_json::Value::Object(o) => o.values().any(has_huge_number),
        _ => false,
    }
}

/// Whether the text holds a number with an exponent of 5 or more digits (`1e-50000000000`):
/// serde_json reads it (as 0 or infinity), simd-json refuses it: a documented limit
/// (docs/protocol.md), like numbers beyond the f64 range. Strings are not told apart;
/// the exemption is only ever wider than needed.
fn has_extreme_exponent(body: &[u8]) -> bool {
    body.windows(2).enumerate().any(|(i, w)| {
        w[0].is_ascii_digit() && matches!(w[1], b'e' | b'E') && {
            let rest = &body[i + 2..];
            let rest = rest
                .strip_prefix(b"-")
                .or_else(|| rest.strip_prefix(b"+"))
                .unwrap_or(rest);
            rest.iter().take_while(|b| b.is_ascii_digit()).count() >= 5
        }
    })
}

/// `text` with each `\uD800`–`\uDFFF` escape (a backslash that starts an escape, not
/// an escaped backslash) turned into `\u0041`, and whether any was.
fn without_surrogate_escapes(text: &[u8]) -> (Vec<u8>, bool) {
    let mut out = text.to_vec();
    let mut replaced = false;
    let mut i = 0;
    while i < out.len() {
        if out[i] != b'\\' {
            i += 1;
            continue;
        }
        let hex = out.get(i + 2..i + 6).map(<[u8]>::to_ascii_lowercase);
        if out.get(i + 1) == Some(&b'u')
            && hex.as_deref().is_some_and(|h| {
                h[0] == b'd'
                    && matches!(h[1], b'8'..=b'9' | b'a'..=b'f')
                    && h[2].is_ascii_hexdigit()
                    && h[3].is_ascii_hexdigit()
            })
        {
            out[i + 2..i + 6].copy_from_slice(b"0041");
            replaced = true;
            i += 6;
        } else {
            i += 2;
        }
    }
    (out, replaced)
}

fuzz_target!(|body: &[u8]| {
    let mut parser = PublishParser::new();
    let got = parser.parse(body).map(|p| {
        let channels: Vec<String> = p
            .channels
            .as_slice()
            .iter()
            .map(|c| c.to_string())
            .collect();
        (channels, p.event.to_string(), p.data.to_vec())
    });
    // An escaped surrogate (`"\ud800"`, paired or not) is valid JSON grammar (RFC 8259
    // §8.2) and `JSON.parse` reads a lone one; serde_json refuses lone ones. ringcast
    // forwards `data` as written (docs/protocol.md), so the oracle reads a copy with
    // every surrogate escape replaced by `\u0041` (same length, same grammar) and, for
    // such bodies, compares `data` after the same replacement and leaves names alone.
    let (judged, replaced) = without_surrogate_escapes(body);
    let oracle: Option<serde_json::Value> = serde_json::from_slice(&judged).ok();
    match &got {
        Ok((channels, event, data)) => {
            let v = oracle.expect("accepted a body serde_json refuses");
            assert!(v.is_object());
            if !replaced {
                assert_eq!(valid_channels(&v).as_ref(), Some(channels));
                assert_eq!(valid_event(v.get("event")), Some(event.as_str()));
            }
            let forwarded: serde_json::Value =
                serde_json::from_slice(&without_surrogate_escapes(data).0)
                    .expect("data span is not JSON");
            assert!(forwarded.is_object() || forwarded.is_string());
            assert_eq!(Some(&forwarded), v.get("data"));
        }
        Err(_) => {
            if let (Some(v), false) = (oracle, replaced) {
                let ok = valid_channels(&v).is_some()
                    && valid_event(v.get("event")).is_some()
                    && v.get("data")
                        .is_some_and(|d| d.is_object() || d.is_string());
                assert!(
                    !ok || has_huge_number(&v) || has_extreme_exponent(body),
                    "refused a valid publish"
                );
            }
        }
    }
    // The parser is kept per worker: a second parse agrees with the first.
    let again = parser.parse(body).map(|p| {
        let channels: Vec<String> = p
            .channels
            .as_slice()
            .iter()
            .map(|c| c.to_string())
            .collect();
        (channels, p.event.to_string(), p.data.to_vec())
    });
    assert_eq!(again.is_ok(), got.is_ok());
    if let (Ok(a), Ok(b)) = (again, got) {
        assert_eq!(a, b);
    }
});
