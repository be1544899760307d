//! The `Sec-WebSocket-Extensions` offer, read (RFC 7692 §5, §7.1): does the client offer
//! `permessage-deflate` in a form the server can honour without per-connection state?
//!
//! An offer is honoured when it is `permessage-deflate` with, at most once each:
//! `server_no_context_takeover`, `client_no_context_takeover` (no value),
//! `client_max_window_bits` (with no value or 8..=15: it only says the client accepts a
//! limit, and the server sets none), `server_max_window_bits` (8..=15). The answer is
//! [`RESPONSE`], plus `server_max_window_bits=N` whenever the offer named it (N as
//! offered, 15 included: RFC 7692 §7.1.2.1 accepts the parameter by repeating it, and
//! Python's `websockets` refuses an answer that leaves it out).
//! That window is honoured without a compressor of its own: the one compressed frame of
//! a message is shared by every subscriber and made with the full window, but deflate
//! never refers further back than the message's own start (no context takeover), so
//! a message of at most 2^N bytes fits any window of N bits; such a connection gets
//! larger messages uncompressed (`WsConn::deflate_fits`). Any other
//! parameter, a repeated one or a bad value makes that offer invalid; the next offer is
//! tried; none left: no extension (the connection proceeds uncompressed, RFC 6455
//! §9.1). Nothing here allocates.
//!
//! Safari 15.0 to 15.3 mishandles `client_no_context_takeover` (WebKit bug 228163): its
//! user agent ([`mishandles_no_context_takeover`]) is not offered compression.

/// The answer's extension line (value of `Sec-WebSocket-Extensions`).
pub(crate) const RESPONSE: &[u8] =
    b"permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// Added to an agreement (see [`acceptable`]) when the offer named
/// `server_max_window_bits`: the answer must repeat it.
const ECHO: u8 = 16;

/// The server window in bits (8 to 15) of an agreement from [`acceptable`].
pub(crate) fn window(agreed: u8) -> u8 {
    agreed & 15
}

/// The first of the offers in `header` (a `Sec-WebSocket-Extensions` value, offers
/// comma-separated, parameters semicolon-separated) that can be agreed, or `None`. The
/// agreement is the server's window in bits (15 unless the offer asked for less, read it
/// with [`window`]), plus a flag when the answer must name that window.
pub fn acceptable(header: &[u8]) -> Option<u8> {
    split_outside_quotes(header, b',').find_map(offer_ok)
}

/// Append the answer's extension line for an agreement from [`acceptable`].
pub(crate) fn write_response(out: &mut Vec<u8>, agreed: u8) {
    out.extend_from_slice(RESPONSE);
    if agreed & ECHO != 0 {
        let window = window(agreed);
        out.extend_from_slice(b"; server_max_window_bits=");
        if window >= 10 {
            out.push(b'1');
        }
        out.push(b'0' + window % 10);
    }
}

/// Whether this user agent runs WebKit 15.0–15.3: Safari (macOS or iOS: `Version/15.N`
/// with N from 0 to 3 and `Safari/`, and none of the other browsers that put `Safari/`
/// in their user agent: Chrome, Chromium, Edge, Opera), or any browser or web view on
/// iOS/iPadOS 15.0–15.3 (`CPU iPhone OS 15_N` / `CPU OS 15_N` with `AppleWebKit`): every
/// iOS browser is the system WebKit, whatever its name (Chrome's `CriOS`, `FxiOS`).
pub(crate) fn mishandles_no_context_takeover(user_agent: &[u8]) -> bool {
    let ios_15_early = [&b"CPU iPhone OS 15_"[..], b"CPU OS 15_"].iter().any(|p| {
        find(user_agent, p).is_some_and(|at| {
            matches!(
                &user_agent[at + p.len()..],
                [b'0'..=b'3', rest @ ..] if !rest.first().is_some_and(u8::is_ascii_digit)
            )
        })
    });
    if ios_15_early && find(user_agent, b"AppleWebKit").is_some() {
        return true;
    }
    let Some(at) = find(user_agent, b"Version/15.") else {
        return false;
    };
    let minor = &user_agent[at + b"Version/15.".len()..];
    let minor_ok = match minor {
        [b'0'..=b'3', rest @ ..] => !rest.first().is_some_and(u8::is_ascii_digit),
        _ => false,
    };
    minor_ok
        && find(user_agent, b"Safari/").is_some()
        && [&b"Chrome/"[..], b"Chromium/", b"Edg/", b"OPR/"]
            .iter()
            .all(|other| find(user_agent, other).is_none())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One offer: `permessage-deflate` and its parameters; the server window it asks for.
fn offer_ok(offer: &[u8]) -> Option<u8> {
    let mut parts = split_outside_quotes(offer, b';').map(trim);
    if !parts
        .next()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"permessage-deflate"))
    {
        return None;
    }
    let mut window = 15;
    let mut seen = [false; 4];
    for param in parts {
        let (name, value) = match param.iter().position(|&b| b == b'=') {
            Some(i) => (trim(&param[..i]), Some(unquote(trim(&param[i + 1..])))),
            None => (param, None),
        };
        let (slot, ok) = if name.eq_ignore_ascii_case(b"server_no_context_takeover") {
            (0, value.is_none())
        } else if name.eq_ignore_ascii_case(b"client_no_context_takeover") {
            (1, value.is_none())
        } else if name.eq_ignore_ascii_case(b"client_max_window_bits") {
            (2, value.is_none_or(|v| window_bits(v).is_some()))
        } else if name.eq_ignore_ascii_case(b"server_max_window_bits") {
            window = value.and_then(window_bits).unwrap_or(0);
            (3, window != 0)
        } else {
            return None;
        };
        if !ok || seen[slot] {
            return None;
        }
        seen[slot] = true;
    }
    Some(if seen[3] { window | ECHO } else { window })
}

/// A window size parameter's value: 8 to 15, decimal digits only (RFC 7692 §7.1.2).
fn window_bits(v: &[u8]) -> Option<u8> {
    match v {
        [d @ b'8'..=b'9'] => Some(d - b'0'),
        [b'1', d @ b'0'..=b'5'] => Some(10 + d - b'0'),
        _ => None,
    }
}

fn unquote(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !first.is_ascii_whitespace() {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !last.is_ascii_whitespace() {
            break;
        }
        s = rest;
    }
    s
}

/// Split on `sep` outside double quotes (a quoted parameter value may hold one).
fn split_outside_quotes(s: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut quoted = false;
    s.split(move |&b| {
        if b == b'"' {
            quoted = !quoted;
        }
        b == sep && !quoted
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_of_real_clients_are_accepted() {
        for offer in [
            // Chromium, Firefox, Safari (all current versions).
            "permessage-deflate; client_max_window_bits",
            // Node's ws (default perMessageDeflate).
            "permessage-deflate; client_max_window_bits",
            // Python websockets (default).
            "permessage-deflate; client_max_window_bits",
            // Python websockets with no_context_takeover both ways, and other spellings.
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=12",
            "permessage-deflate",
            "PerMessage-Deflate ;  client_max_window_bits=\"10\"",
            // A first offer we cannot honour, then one we can.
            "permessage-deflate; server_max_window_bits=7, permessage-deflate",
            "x-webkit-deflate-frame, permessage-deflate; client_max_window_bits",
        ] {
            assert_eq!(acceptable(offer.as_bytes()), Some(15), "{offer}");
        }
        let small = b"permessage-deflate; server_no_context_takeover; server_max_window_bits=9";
        let agreed = acceptable(small).unwrap();
        assert_eq!(window(agreed), 9);
        let mut out = Vec::new();
        write_response(&mut out, agreed);
        assert!(out.ends_with(b"client_no_context_takeover; server_max_window_bits=9"));
        // Offered at 15: accepted by repeating it (RFC 7692 §7.1.2.1).
        let full = acceptable(b"permessage-deflate; server_max_window_bits=15").unwrap();
        assert_eq!(window(full), 15);
        out.clear();
        write_response(&mut out, full);
        assert!(out.ends_with(b"; server_max_window_bits=15"));
        out.clear();
        write_response(
            &mut out,
            acceptable(b"permessage-deflate; server_max_window_bits=12").unwrap(),
        );
        assert!(out.ends_with(b"; server_max_window_bits=12"));
        // Not offered: not named.
        out.clear();
        write_response(&mut out, acceptable(b"permessage-deflate").unwrap());
        assert_eq!(out, RESPONSE);
    }

    #[test]
    fn other_offers_are_declined() {
        for offer in [
            "",
            "x-webkit-deflate-frame",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; client_max_window_bits=abc",
            "permessage-deflate; client_max_window_bits=",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
            "permessage-deflate; unknown_param",
            "permessage-deflatex",
            "deflate; client_max_window_bits",
            ";;;",
            "permessage-deflate; client_max_window_bits=\"1,5\"",
        ] {
            assert_eq!(acceptable(offer.as_bytes()), None, "{offer}");
        }
    }

    #[test]
    fn safari_15_0_to_15_3_is_recognised() {
        let safari = |v: &str| {
            format!("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{v} Safari/605.1.15")
        };
        for v in ["15.0", "15.1", "15.2", "15.3"] {
            assert!(mishandles_no_context_takeover(safari(v).as_bytes()), "{v}");
        }
        for v in ["15.4", "15.10", "14.1", "16.0", "17.2"] {
            assert!(!mishandles_no_context_takeover(safari(v).as_bytes()), "{v}");
        }
        let ios = "Mozilla/5.0 (iPhone; CPU iPhone OS 15_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/15.2 Mobile/15E148 Safari/604.1";
        assert!(mishandles_no_context_takeover(ios.as_bytes()));
        let crios = "Mozilla/5.0 (iPhone; CPU iPhone OS 15_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/96.0.4664.53 Mobile/15E148 Safari/604.1";
        assert!(mishandles_no_context_takeover(crios.as_bytes()));
        let ipad = "Mozilla/5.0 (iPad; CPU OS 15_3 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/40.0 Mobile/15E148 Safari/605.1.15";
        assert!(mishandles_no_context_takeover(ipad.as_bytes()));
        let ios_15_4 = "Mozilla/5.0 (iPhone; CPU iPhone OS 15_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/100.0 Mobile/15E148 Safari/604.1";
        assert!(!mishandles_no_context_takeover(ios_15_4.as_bytes()));
        let chrome = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36";
        assert!(!mishandles_no_context_takeover(chrome.as_bytes()));
        assert!(!mishandles_no_context_takeover(
            b"Python/3.12 websockets/13.0"
        ));
        assert!(!mishandles_no_context_takeover(b""));
    }
}
