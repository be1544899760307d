//! Signing as Pusher's SDKs do, for the tests that build Pusher REST requests and
//! private-channel auth strings by hand: lowercase hex of an MD5 body digest and of an
//! HMAC-SHA256. Pure functions, no server: `tests/fuzz_props.rs` includes this file alone.

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use sha2::Sha256;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `body_md5` of a Pusher REST request.
pub fn md5_hex(body: &[u8]) -> String {
    hex(&Md5::digest(body))
}

/// HMAC-SHA256 of `text` with `secret`, in hex: a REST `auth_signature`, the signature
/// part of a private channel's `auth`.
pub fn hmac_hex(secret: &str, text: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(text.as_bytes());
    hex(&mac.finalize().into_bytes())
}
