//! Private-channel token verification (`token::TokenKeys::verify`: JWT header decoding,
//! claims decoding, the key and algorithm rules, the claim checks) on arbitrary tokens,
//! and on arbitrary headers and claims that the target signs itself with the project's
//! token secret, so the fuzzer gets past the signature to the claims.
//!
//! The project has one token secret and two registered public keys (`ec`: ES256,
//! `ed`: EdDSA) whose private halves nobody here holds. Input: a flags byte, then either
//! the token text (mode 0) or a header and claims split at the first `\n` (modes 1 to 3:
//! both as given; the header as given and the claims re-serialized by serde_json; a
//! plain `{"alg":"HS256","typ":"JWT"}` header and re-serialized claims).
//!
//! Checked: no panic; a token that verifies was signed with the secret under HS256
//! without a `kid` (a registered public key, `alg: none`, another algorithm never
//! verify), its claims are a JSON object whose `exp` (an integer) is not past by more
//! than 5 s, whose `channel` or `channels` names the channel, whose `sub` and `info` are
//! the grant's, `info` an object of at most 1 KiB. In mode 3, every claims object that
//! meets those rules verifies (instants within 2 s of a leeway boundary aside: the
//! library reads its own clock).
#![no_main]

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use ringcast::token::{self, TokenKeys};
use serde_json::{json, Value};

const SECRET: &str = "ts_0123456789abcdef0123456789abcdef0123456789ab";
const CHANNEL: &str = "private-orders";
const EC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAES8SXwTx/ka8BMe7u1Ewam4LPOBZe
JvxGMN6fuXc1aM0yLuimM0dJtz5ZoHtaHTIS9Mng1qTsbYO05JIMc6LXbg==
-----END PUBLIC KEY-----
";
const ED_PEM: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAM+M1svaR5r/h+4PNsTOQzgnGpg00cIGO19k+gX42j9o=
-----END PUBLIC KEY-----
";

thread_local! {
    /// Built once (a thread-local, so nothing is asked of `TokenKeys` but `verify`).
    static KEYS: TokenKeys = {
        let keys = token::keys(SECRET.as_bytes(), &[("ec", EC_PEM), ("ed", ED_PEM)]);
        let shown = format!("{keys:?}");
        assert!(shown.contains("\"ec\"") && shown.contains("\"ed\""), "{shown}");
        keys
    };
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hs256(signing_input: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(signing_input.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

fn decode_json(segment: &str) -> Option<Value> {
    serde_json::from_slice(&B64.decode(segment).ok()?).ok()
}

/// Whether `t` is within 2 s of `boundary` (the library's clock may tick meanwhile).
fn near(t: u64, boundary: u64) -> bool {
    t.abs_diff(boundary) <= 2
}

/// The claims rules, for a claims object; `None` when a clock boundary is too close to tell.
fn claims_acceptable(claims: &Value, now: u64) -> Option<bool> {
    let Some(obj) = claims.as_object() else {
        return Some(false);
    };
    let Some(exp) = obj.get("exp").and_then(Value::as_u64) else {
        return Some(false);
    };
    if near(exp.saturating_add(5), now) {
        return None;
    }
    let opt_str = |k: &str| obj.get(k).is_none_or(|v| v.is_null() || v.is_string());
    let channel_ok = obj.get("channel").and_then(Value::as_str) == Some(CHANNEL);
    let channels_ok = match obj.get("channels") {
        None | Some(Value::Null) => true,
        Some(Value::Array(list)) => list.iter().all(Value::is_string),
        Some(_) => false,
    };
    let named = channel_ok
        || obj
            .get("channels")
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|c| c.as_str() == Some(CHANNEL)));
    let info_ok = match obj.get("info") {
        None | Some(Value::Null) => true,
        Some(v @ Value::Object(_)) => v.to_string().len() <= 1024,
        Some(_) => false,
    };
    let nbf_ok = match obj.get("nbf") {
        None => true,
        Some(v) => match v.as_u64() {
            Some(nbf) if near(nbf, now + 5) => return None,
            Some(nbf) => nbf <= now + 5,
            // A non-integer nbf: leave the verdict to the library.
            None => return None,
        },
    };
    // Claims the library itself reads when present (registered claims of other types).
    let registered_ok = ["iss", "aud", "iat"].iter().all(|k| !obj.contains_key(*k));
    if !registered_ok {
        return None;
    }
    Some(
        exp.saturating_add(5) >= now
            && opt_str("channel")
            && opt_str("sub")
            && channels_ok
            && named
            && info_ok
            && nbf_ok,
    )
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, rest)) = input.split_first() else {
        return;
    };
    let now = now();
    let mode = flags & 3;
    let (token, expect_ok) = if mode == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        (text.to_string(), None)
    } else {
        let (header, claims) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let header: Vec<u8> = if mode == 3 {
            br#"{"alg":"HS256","typ":"JWT"}"#.to_vec()
        } else {
            header.to_vec()
        };
        let (claims, expect) = if mode == 1 {
            (claims.to_vec(), None)
        } else {
            let Ok(v) = serde_json::from_slice::<Value>(claims) else {
                return;
            };
            let expect = if mode == 3 {
                claims_acceptable(&v, now)
            } else {
                None
            };
            (serde_json::to_vec(&v).expect("a value serializes"), expect)
        };
        let signing_input = format!("{}.{}", B64.encode(header), B64.encode(claims));
        (format!("{signing_input}.{}", hs256(&signing_input)), expect)
    };

    let verdict = KEYS.with(|k| k.verify(&token, CHANNEL, now));
    if let Some(expect) = expect_ok {
        assert_eq!(verdict.is_ok(), expect, "{verdict:?} for {token}");
    }
    let Ok(grant) = verdict else {
        return;
    };
    // Only HS256 with the secret, no kid, verifies.
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a verified token of {} parts", parts.len());
    let header = decode_json(parts[0]).expect("verified header is base64url JSON");
    assert_eq!(header.get("alg"), Some(&json!("HS256")));
    assert!(
        header.get("kid").is_none_or(Value::is_null),
        "a kid verified under HS256"
    );
    assert_eq!(
        hs256(&format!("{}.{}", parts[0], parts[1])),
        parts[2],
        "a signature that is not the secret's verified"
    );
    let claims = decode_json(parts[1]).expect("verified claims are base64url JSON");
    assert_ne!(
        claims_acceptable(&claims, now),
        Some(false),
        "claims that break the rules verified: {claims}"
    );
    assert_eq!(claims.get("exp").and_then(Value::as_u64), Some(grant.exp));
    assert_eq!(
        claims.get("sub").and_then(Value::as_str),
        grant.sub.as_deref()
    );
    match claims.get("info") {
        None | Some(Value::Null) => assert!(grant.info.is_none()),
        Some(v) => {
            let got: Value = serde_json::from_str(grant.info.as_deref().expect("info granted"))
                .expect("granted info is JSON");
            assert_eq!(&got, v);
        }
    }
});
