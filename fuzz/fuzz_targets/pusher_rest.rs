//! The Pusher REST query parser (`parse_query`) and signature check (`check_rest`) on
//! arbitrary bytes, with an independent signer (hmac/sha2/md-5, Pusher's canonical
//! string) as the oracle.
//!
//! Input: a flags byte, a skew byte, then the raw query string and the body, split at the
//! first `\n`. Checked: no panic; a parsed query has at most 32 pairs, each key once and
//! lowercase; encoding the parsed pairs again parses to the same query. Then the query
//! is checked as received, and once more re-signed by the oracle (the four `auth_*`
//! parameters set or kept as the flags say, `body_md5` right, wrong or absent): the
//! check accepts exactly when the oracle's rules hold (version `1.0`, a timestamp of 1 to
//! 12 digits within 600 s, `body_md5` the body's lowercase hex MD5 or absent with an
//! empty body, the signature of exactly this method, path and query under the secret),
//! and refuses another secret, another path and another method.
#![no_main]

use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use md5::{Digest, Md5};
use ringcast::{pusher_check_rest, pusher_parse_query, PusherQuery};

const SECRET: &str = "ts_0123456789abcdef0123456789abcdef0123456789ab";
const NOW: u64 = 1_800_000_000;
const PATH: &str = "/apps/1000000/events";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac_hex(secret: &str, text: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(text.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// Every byte but the unreserved ones as `%XX`.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn encode(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Pusher's string to sign, written here from the protocol's description.
fn canonical(method: &str, path: &str, pairs: &[(String, String)]) -> String {
    let mut signed: Vec<&(String, String)> = pairs
        .iter()
        .filter(|(k, _)| k != "auth_signature")
        .collect();
    signed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let joined: Vec<String> = signed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{method}\n{path}\n{}", joined.join("&"))
}

/// Whether the oracle accepts the request (`pairs` as parsed, `body` as sent).
fn oracle_accepts(method: &str, path: &str, pairs: &[(String, String)], body: &[u8]) -> bool {
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let (Some(_), Some(ts), Some("1.0"), Some(sig)) = (
        get("auth_key"),
        get("auth_timestamp"),
        get("auth_version"),
        get("auth_signature"),
    ) else {
        return false;
    };
    let ts_ok = (1..=12).contains(&ts.len())
        && ts.bytes().all(|b| b.is_ascii_digit())
        && ts.parse::<u64>().is_ok_and(|t| t.abs_diff(NOW) <= 600);
    let md5_ok = match get("body_md5") {
        Some(given) => given == hex(&Md5::digest(body)),
        None => body.is_empty(),
    };
    ts_ok
        && md5_ok
        && sig.to_ascii_lowercase() == hmac_hex(SECRET, &canonical(method, path, pairs))
        && sig.len() == 64
}

fn pairs_of(q: &PusherQuery) -> Vec<(String, String)> {
    q.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn set(pairs: &mut Vec<(String, String)>, key: &str, value: String) {
    pairs.retain(|(k, _)| k != key);
    pairs.push((key.to_string(), value));
}

fuzz_target!(|input: &[u8]| {
    let Some((&[flags, skew], rest)) = input.split_first_chunk::<2>() else {
        return;
    };
    let (raw, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(q) = pusher_parse_query(raw) else {
        return;
    };
    assert!(q.len() <= 32);
    let mut pairs = pairs_of(&q);
    let mut keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), pairs.len(), "a key twice");
    for (k, _) in &pairs {
        assert_eq!(*k, k.to_lowercase(), "a key not lowercased");
    }
    let again = pusher_parse_query(encode(&pairs).as_bytes()).expect("re-encoded query parses");
    assert_eq!(again, q, "percent-encoding does not round-trip");

    // As received.
    let verdict = pusher_check_rest("POST", PATH, &q, body, NOW, &[SECRET]);
    assert_eq!(
        verdict.is_ok(),
        oracle_accepts("POST", PATH, &pairs, body),
        "{verdict:?}"
    );

    // Re-signed by the oracle, the flags choosing what is set and what is kept.
    if flags & 1 != 0 {
        set(&mut pairs, "auth_key", "pk_test".into());
    }
    if flags & 2 != 0 {
        let t = (NOW as i64 + (i64::from(skew as i8) * 10)) as u64;
        set(&mut pairs, "auth_timestamp", t.to_string());
    }
    if flags & 4 != 0 {
        set(&mut pairs, "auth_version", "1.0".into());
    }
    match (flags >> 3) & 3 {
        0 => set(&mut pairs, "body_md5", hex(&Md5::digest(body))),
        1 => pairs.retain(|(k, _)| k != "body_md5"),
        2 => set(
            &mut pairs,
            "body_md5",
            hex(&Md5::digest(body)).to_uppercase(),
        ),
        _ => {}
    }
    pairs.retain(|(k, _)| k != "auth_signature");
    let method = if flags & 0x20 != 0 { "GET" } else { "POST" };
    let mut signature = hmac_hex(SECRET, &canonical(method, PATH, &pairs));
    if flags & 0x40 != 0 {
        signature = signature.to_uppercase();
    }
    pairs.push(("auth_signature".into(), signature));
    let Ok(q) = pusher_parse_query(encode(&pairs).as_bytes()) else {
        // Over 32 pairs once the auth parameters were added.
        assert!(pairs.len() > 32);
        return;
    };
    let expected = oracle_accepts(method, PATH, &pairs, body);
    let verdict = pusher_check_rest(method, PATH, &q, body, NOW, &[SECRET]);
    assert_eq!(verdict.is_ok(), expected, "{verdict:?}");
    // During a rotation the older secret still verifies.
    let both = pusher_check_rest(method, PATH, &q, body, NOW, &["ts_newer", SECRET]);
    assert_eq!(both.is_ok(), expected, "{both:?}");
    if expected {
        let other = if method == "GET" { "POST" } else { "GET" };
        assert!(pusher_check_rest(method, PATH, &q, body, NOW, &["ts_other"]).is_err());
        assert!(
            pusher_check_rest(method, "/apps/1000001/events", &q, body, NOW, &[SECRET]).is_err()
        );
        assert!(pusher_check_rest(other, PATH, &q, body, NOW, &[SECRET]).is_err());
        assert!(pusher_check_rest(method, PATH, &q, body, NOW + 601 + 1270, &[SECRET]).is_err());
    }
});
