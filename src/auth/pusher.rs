//! Pusher signatures: the signed query of the REST API (`/apps/{app_id}/...`) and the
//! `auth` string of a private or presence subscribe (design: docs/design/pusher.md,
//! sections 1.5 and 4.1).
//!
//! Pure functions over borrowed input, naming no module but the percent-decoder
//! (`crate::percent`); the caller supplies the clock and the project's
//! token secrets in force (the newest, plus the previous one during a rotation's grace).
//! Invariants:
//! - Every HMAC check is `ring::hmac::verify` (constant time) on the 32 decoded bytes of
//!   a 64-hex-digit signature; the `body_md5` compare is constant time too.
//! - The HMAC key is the UTF-8 bytes of the whole token secret string (`ts_...`), as the
//!   Pusher SDKs use the secret they are configured with.
//! - What is signed is exactly what was received: the raw path (not decoded), the
//!   percent-decoded query values (`+` is not a space: the SDKs sign unescaped values),
//!   `channel_data` byte for byte (Node's and Python's JSON spacing both verify).
//! - Error messages say what to fix and never carry an expected value (a signature, a
//!   digest, a secret).
//!
//! Which project an `auth_key` (or the key part of a channel `auth`) belongs to is the
//! caller's check, against the key snapshot: [`auth_key`] and [`check_channel_auth`]
//! hand the key back for it.

use ring::hmac;
use subtle::ConstantTimeEq;

/// Most query parameters a request may carry (Pusher's REST calls use at most 8).
pub(crate) const MAX_PARAMS: usize = 32;

/// Largest distance between `auth_timestamp` and the server's clock, in seconds.
pub(crate) const TIMESTAMP_WINDOW_S: u64 = 600;

/// The only `auth_version` there is.
const AUTH_VERSION: &str = "1.0";

/// A parsed query string: percent-decoded pairs, keys lowercased, each key once, in the
/// order received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    // A few pairs at most (bounded by MAX_PARAMS): a Vec scanned linearly beats a map.
    params: Vec<(String, String)>,
}

impl Query {
    /// The value of `key` (give it lowercase).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in the order received.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.params.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }
}

/// Why a query string does not parse (a 400 `invalid_query`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("query parameter {0:?} is given more than once")]
    Duplicate(String),
    #[error("the query string has more than {MAX_PARAMS} parameters")]
    TooMany,
    #[error("the query string has a '%' that is not followed by two hexadecimal digits")]
    Percent,
    #[error("a query parameter is not valid UTF-8 once percent-decoded")]
    Utf8,
}

/// Parse the raw query string (the bytes after `?`). Pairs are split on `&` and at their
/// first `=` (no `=`: the value is empty); keys and values are percent-decoded (`%XX`
/// only: `+` stays `+`); keys are lowercased. Empty pairs (`a=1&&b=2`, a trailing `&`)
/// are skipped: they carry nothing to sign.
pub fn parse_query(raw: &[u8]) -> Result<Query, QueryError> {
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in raw.split(|&b| b == b'&') {
        if pair.is_empty() {
            continue;
        }
        if params.len() == MAX_PARAMS {
            return Err(QueryError::TooMany);
        }
        let (key, value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        let key = percent_decode(key)?.to_lowercase();
        let value = percent_decode(value)?;
        if params.iter().any(|(k, _)| *k == key) {
            return Err(QueryError::Duplicate(key));
        }
        params.push((key, value));
    }
    Ok(Query { params })
}

/// Percent-decode `%XX` escapes (`+` stays `+`: the signature covers the raw text); also
/// the `{channel}` segment of a REST path.
pub(crate) fn percent_decode(raw: &[u8]) -> Result<String, QueryError> {
    crate::percent::decode(raw, crate::percent::Plus::Literal).map_err(|e| match e {
        crate::percent::PercentError::Escape => QueryError::Percent,
        crate::percent::PercentError::Utf8 => QueryError::Utf8,
    })
}

/// The `auth_key` parameter: which public key signed the request. The caller checks it
/// is an active public key of the project the path's app id names.
pub(crate) fn auth_key(q: &Query) -> Option<&str> {
    q.get("auth_key")
}

/// What a REST request signs: `METHOD\nPATH\n` then every parameter but
/// `auth_signature` as `key=value`, sorted by key (bytewise), joined by `&`.
pub(crate) fn string_to_sign(method: &str, raw_path: &str, q: &Query) -> String {
    let mut pairs: Vec<(&str, &str)> = q.iter().filter(|(k, _)| *k != "auth_signature").collect();
    // Keys are unique (parse_query refuses duplicates), so the order is total.
    pairs.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let len = method.len()
        + raw_path.len()
        + 2
        + pairs
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>();
    let mut out = String::with_capacity(len);
    out.push_str(method);
    out.push('\n');
    out.push_str(raw_path);
    out.push('\n');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// Why a signed REST request is refused (a 401 `unauthorized`, the message as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RestAuthError {
    #[error("query parameter {0} is missing: sign the request with auth_key, auth_timestamp, auth_version and auth_signature")]
    Missing(&'static str),
    #[error("auth_version must be 1.0")]
    Version,
    #[error("auth_timestamp must be the time in seconds since 1970 (1 to 12 digits)")]
    TimestampFormat,
    #[error(
        "auth_timestamp is more than {TIMESTAMP_WINDOW_S} s from server time: check the clock of the signing host"
    )]
    TimestampWindow,
    #[error(
        "body_md5 does not match the body (it must be the lowercase hex MD5 of the raw body bytes)"
    )]
    BodyMd5Mismatch,
    #[error("body_md5 is missing: a request with a body must sign its MD5")]
    BodyMd5Missing,
    #[error("auth_signature must be 64 hexadecimal digits (HMAC-SHA256)")]
    SignatureFormat,
    /// The app has no token secret to verify with.
    #[error("{NOT_SIGNED}")]
    NoSecret,
    /// No secret in force verifies `auth_signature`.
    #[error("{NOT_SIGNED}")]
    Signature,
    /// The caller's check (design 4.1, step 7): the path's app id is not a known app, or
    /// `auth_key` is not an active public key of that app.
    #[error("{NOT_SIGNED}")]
    UnknownApp,
}

/// The one message of every refusal that depends on the app ([`RestAuthError::UnknownApp`],
/// [`RestAuthError::NoSecret`], [`RestAuthError::Signature`]): a public key (every web page
/// carries one) must not tell which app id is its own, nor anything of that app.
const NOT_SIGNED: &str = "invalid signature: the app id, auth_key (an active public key of that app) and the HMAC-SHA256 under the app's secret must all match";

/// The checks of a signed REST request that need neither the body nor a secret (design
/// 4.1, steps 4 to 6): the four auth parameters are present, `auth_version` is 1.0 and
/// `auth_timestamp` is within [`TIMESTAMP_WINDOW_S`] of `now_s`. The caller runs them
/// from the head, before it looks the app up and waits for the body.
pub(crate) fn check_params(q: &Query, now_s: u64) -> Result<(), RestAuthError> {
    let need = |key: &'static str| q.get(key).ok_or(RestAuthError::Missing(key));
    need("auth_key")?;
    let timestamp = need("auth_timestamp")?;
    let version = need("auth_version")?;
    need("auth_signature")?;

    if version != AUTH_VERSION {
        return Err(RestAuthError::Version);
    }

    if timestamp.is_empty()
        || timestamp.len() > 12
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(RestAuthError::TimestampFormat);
    }
    // At most 12 digits: always fits a u64.
    let ts: u64 = timestamp
        .parse()
        .map_err(|_| RestAuthError::TimestampFormat)?;
    if ts.abs_diff(now_s) > TIMESTAMP_WINDOW_S {
        return Err(RestAuthError::TimestampWindow);
    }
    Ok(())
}

/// Check a signed REST request whose body is `body`: [`check_head`], [`check_signature`],
/// then [`check_body`]. The server runs the same steps apart, the first two from the
/// head (before it waits for the body).
pub fn check_rest(
    method: &str,
    raw_path: &str,
    q: &Query,
    body: &[u8],
    now_s: u64,
    secrets: &[&str],
) -> Result<(), RestAuthError> {
    let tag = check_head(q, body.len(), now_s)?;
    check_signature(method, raw_path, q, &tag, secrets)?;
    check_body(q, body)
}

/// The checks of a signed REST request that need neither the body nor the app, from the
/// head: [`check_params`], `body_md5` present when the body (of `body_len` bytes) is not
/// empty, `auth_signature` 64 hexadecimal digits. Returns the signature's 32 bytes.
pub(crate) fn check_head(
    q: &Query,
    body_len: usize,
    now_s: u64,
) -> Result<[u8; 32], RestAuthError> {
    check_params(q, now_s)?;
    if body_len > 0 && q.get("body_md5").is_none() {
        return Err(RestAuthError::BodyMd5Missing);
    }
    // check_params proved it is there.
    let signature = q.get("auth_signature").unwrap_or_default();
    decode_signature(signature).ok_or(RestAuthError::SignatureFormat)
}

/// `tag` (from [`check_head`]) verifies under one of `secrets`. The signed string
/// carries `body_md5`, so this needs no body: a request signed without a secret is
/// refused before its body is read.
pub(crate) fn check_signature(
    method: &str,
    raw_path: &str,
    q: &Query,
    tag: &[u8; 32],
    secrets: &[&str],
) -> Result<(), RestAuthError> {
    let message = string_to_sign(method, raw_path, q);
    match verify_any(secrets, message.as_bytes(), tag) {
        Verdict::Valid => Ok(()),
        Verdict::NoSecret => Err(RestAuthError::NoSecret),
        Verdict::Invalid => Err(RestAuthError::Signature),
    }
}

/// The body, once read, is the one signed: `body_md5` (when given, on any method, empty
/// body included) is its lowercase hex MD5.
pub(crate) fn check_body(q: &Query, body: &[u8]) -> Result<(), RestAuthError> {
    match q.get("body_md5") {
        Some(given) if !bool::from(given.as_bytes().ct_eq(&md5_hex(body))) => {
            Err(RestAuthError::BodyMd5Mismatch)
        }
        None if !body.is_empty() => Err(RestAuthError::BodyMd5Missing),
        _ => Ok(()),
    }
}

/// Why a channel `auth` is refused (a `pusher:subscription_error` `AuthError`, 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChannelAuthError {
    #[error("auth must be \"<key>:<signature>\" with a signature of 64 hexadecimal digits")]
    Malformed,
    #[error("the project has no token secret to verify channel authorisations with")]
    NoSecret,
    #[error("invalid signature")]
    Signature,
}

/// Check the `auth` of a private or presence subscribe: `<key>:<64 hex digits>`, split
/// at the last `:`, an HMAC-SHA256 of `<socket_id>:<channel>` (private) or
/// `<socket_id>:<channel>:<channel_data>` (presence, `channel_data` exactly as received)
/// under one of `secrets`. Returns the key part, for the caller to check it is an active
/// public key of the connection's project.
pub(crate) fn check_channel_auth<'a>(
    auth: &'a str,
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
    secrets: &[&str],
) -> Result<&'a str, ChannelAuthError> {
    let (key, signature) = auth.rsplit_once(':').ok_or(ChannelAuthError::Malformed)?;
    if key.is_empty() {
        return Err(ChannelAuthError::Malformed);
    }
    let tag = decode_signature(signature).ok_or(ChannelAuthError::Malformed)?;
    let data_len = channel_data.map_or(0, |d| d.len() + 1);
    let mut message = String::with_capacity(socket_id.len() + 1 + channel.len() + data_len);
    message.push_str(socket_id);
    message.push(':');
    message.push_str(channel);
    if let Some(data) = channel_data {
        message.push(':');
        message.push_str(data);
    }
    match verify_any(secrets, message.as_bytes(), &tag) {
        Verdict::Valid => Ok(key),
        Verdict::NoSecret => Err(ChannelAuthError::NoSecret),
        Verdict::Invalid => Err(ChannelAuthError::Signature),
    }
}

/// Check the `auth` of a `pusher:signin` (Pusher's user authentication): as
/// [`check_channel_auth`], over `<socket_id>::user::<user_data>` (`user_data` exactly as
/// received). Returns the key part.
pub(crate) fn check_user_auth<'a>(
    auth: &'a str,
    socket_id: &str,
    user_data: &str,
    secrets: &[&str],
) -> Result<&'a str, ChannelAuthError> {
    // `<socket_id>` `:` `:user:` `:` `<user_data>` is exactly Pusher's string to sign.
    check_channel_auth(auth, socket_id, ":user:", Some(user_data), secrets)
}

/// HMAC-SHA256 of `msg` under `secret`, as lowercase hex (webhook signatures, tests).
pub(crate) fn sign(secret: &[u8], msg: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hex::encode(hmac::sign(&key, msg).as_ref())
}

/// Lowercase hex MD5 of `body`.
fn md5_hex(body: &[u8]) -> [u8; 32] {
    use md5::{Digest, Md5};
    let digest = Md5::digest(body);
    let mut out = [0u8; 32];
    // 16 bytes into 32 hex digits: the lengths always match.
    hex::encode_to_slice(digest, &mut out).expect("32 hex digits for 16 bytes");
    out
}

/// The 32 bytes of a 64-hex-digit signature (either case); `None` for anything else.
fn decode_signature(hex_digits: &str) -> Option<[u8; 32]> {
    let mut tag = [0u8; 32];
    if hex_digits.len() != 64 {
        return None;
    }
    hex::decode_to_slice(hex_digits, &mut tag).ok()?;
    Some(tag)
}

enum Verdict {
    Valid,
    NoSecret,
    Invalid,
}

/// Verify `tag` over `msg` under each secret in turn (newest first, as given).
fn verify_any(secrets: &[&str], msg: &[u8], tag: &[u8; 32]) -> Verdict {
    if secrets.is_empty() {
        return Verdict::NoSecret;
    }
    let valid = secrets.iter().any(|secret| {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        hmac::verify(&key, msg, tag).is_ok()
    });
    if valid {
        Verdict::Valid
    } else {
        Verdict::Invalid
    }
}

#[cfg(test)]
mod tests;
