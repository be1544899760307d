//! API keys: their two kinds, how they are generated, hashed and shown.
//!
//! A key is `sk_` (secret: publishes from a backend) or `pk_` (public: WebSocket
//! connections from browsers) followed by [`KEY_RANDOM_CHARS`] base62 characters from
//! the operating system's CSPRNG (~190 bits). Invariants:
//! - A full key exists only in the output of the command that created it; everything
//!   kept (database, memory snapshot) is its SHA-256 [`KeyHash`] and a short display
//!   prefix. A fast unsalted hash is enough because the key itself is uniformly random:
//!   there is no dictionary to attack, and lookups must stay cheap on the hot path.
//! - Nothing here panics on user input: any string may be handed to [`KeyKind::of_key`],
//!   [`hash_key`] or [`key_prefix`].

use rand::distr::{Alphanumeric, Distribution};
use rand::rngs::OsRng;
use rand::{RngCore, TryRngCore};
use sha2::{Digest, Sha256};

/// Random characters after the `sk_`/`pk_` prefix.
pub(crate) const KEY_RANDOM_CHARS: usize = 32;
/// Length of every generated key, in bytes (all ASCII).
pub(crate) const KEY_LEN: usize = 3 + KEY_RANDOM_CHARS;
/// Characters of a key shown in listings, before the ellipsis: `sk_` + 4.
const SHOWN_PREFIX_CHARS: usize = 7;

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// `sk_…`: publish over REST. Must never reach a browser.
    Secret,
    /// `pk_…`: open WebSocket subscriptions.
    Public,
}

impl KeyKind {
    /// The kind a key claims by its prefix, or `None` if it has neither prefix.
    pub fn of_key(key: &str) -> Option<KeyKind> {
        if key.starts_with("sk_") {
            Some(KeyKind::Secret)
        } else if key.starts_with("pk_") {
            Some(KeyKind::Public)
        } else {
            None
        }
    }

    /// The name used in the database and in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Secret => "secret",
            KeyKind::Public => "public",
        }
    }

    /// Inverse of [`KeyKind::as_str`].
    pub fn parse(s: &str) -> Option<KeyKind> {
        match s {
            "secret" => Some(KeyKind::Secret),
            "public" => Some(KeyKind::Public),
            _ => None,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            KeyKind::Secret => "sk_",
            KeyKind::Public => "pk_",
        }
    }
}

/// SHA-256 of the full key string: what the store and the key snapshot index by.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

pub fn hash_key(key: &str) -> KeyHash {
    KeyHash(Sha256::digest(key.as_bytes()).into())
}

/// True if `key` has the shape of a key we generate. A cheap filter before hashing, so
/// an 8 KiB garbage header costs a length check, not a SHA-256.
pub(crate) fn is_well_formed(key: &str) -> bool {
    key.len() == KEY_LEN
        && KeyKind::of_key(key).is_some()
        && key.as_bytes()[3..].iter().all(u8::is_ascii_alphanumeric)
}

/// A new key of `kind` from OS randomness.
///
/// Panics only if the operating system cannot produce random bytes (getrandom failing),
/// in which case no safe key can be made at all.
pub fn generate_key(kind: KeyKind) -> String {
    let mut rng = OsRng.unwrap_err();
    let mut key = String::with_capacity(KEY_LEN);
    key.push_str(kind.prefix());
    // `Alphanumeric` samples [A-Za-z0-9] uniformly (rejection sampling, no modulo bias).
    key.extend(
        Alphanumeric
            .sample_iter(&mut rng)
            .take(KEY_RANDOM_CHARS)
            .map(char::from),
    );
    key
}

/// Random base62 characters of a token secret after `ts_`: 44 × log2(62) ≈ 262 bits, at
/// least the 256 bits the contract asks of an HS256 key.
pub(crate) const TOKEN_SECRET_RANDOM_CHARS: usize = 44;

/// A new project token secret `ts_...` from OS randomness. The HS256 key is the UTF-8
/// bytes of the whole string, prefix included (what a backend's JWT library is given).
pub(crate) fn generate_token_secret() -> String {
    let mut rng = OsRng.unwrap_err();
    let mut secret = String::with_capacity(3 + TOKEN_SECRET_RANDOM_CHARS);
    secret.push_str("ts_");
    secret.extend(
        Alphanumeric
            .sample_iter(&mut rng)
            .take(TOKEN_SECRET_RANDOM_CHARS)
            .map(char::from),
    );
    secret
}

/// A new identifier: `prefix` + 16 lowercase hex characters (64 random bits), e.g.
/// `prj_…` or `key_…`. Identifiers are not secret; randomness only avoids collisions
/// between processes without coordination.
pub(crate) fn generate_id(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    OsRng.unwrap_err().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// The displayable start of a key: its first 7 characters and `…` (`sk_ab12…`).
pub fn key_prefix(key: &str) -> String {
    let end = key
        .char_indices()
        .nth(SHOWN_PREFIX_CHARS)
        .map_or(key.len(), |(i, _)| i);
    format!("{}…", &key[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_secrets_carry_at_least_256_bits() {
        let a = generate_token_secret();
        assert!(a.starts_with("ts_"));
        assert_eq!(a.len(), 3 + TOKEN_SECRET_RANDOM_CHARS);
        assert!(a.as_bytes()[3..].iter().all(u8::is_ascii_alphanumeric));
        assert!(TOKEN_SECRET_RANDOM_CHARS as f64 * 62f64.log2() >= 256.0);
        assert_ne!(a, generate_token_secret());
    }

    #[test]
    fn generated_keys_have_the_documented_shape() {
        for kind in [KeyKind::Secret, KeyKind::Public] {
            let a = generate_key(kind);
            let b = generate_key(kind);
            assert_ne!(a, b);
            assert_eq!(a.len(), KEY_LEN);
            assert_eq!(KeyKind::of_key(&a), Some(kind));
            assert!(is_well_formed(&a), "{a}");
            assert!(a[3..].bytes().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn kinds_by_prefix_and_name() {
        assert_eq!(KeyKind::of_key("sk_x"), Some(KeyKind::Secret));
        assert_eq!(KeyKind::of_key("pk_x"), Some(KeyKind::Public));
        assert_eq!(KeyKind::of_key("xk_x"), None);
        assert_eq!(KeyKind::of_key(""), None);
        for kind in [KeyKind::Secret, KeyKind::Public] {
            assert_eq!(KeyKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(KeyKind::parse("Secret"), None);
    }

    #[test]
    fn hash_is_sha256_of_the_key() {
        // sha256("abc")
        assert_eq!(
            hash_key("abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(hash_key("sk_a"), hash_key("sk_b"));
    }

    #[test]
    fn well_formed_rejects_lookalikes() {
        let key = generate_key(KeyKind::Secret);
        assert!(!is_well_formed(&key[..KEY_LEN - 1]));
        assert!(!is_well_formed(&format!("{key}a")));
        assert!(!is_well_formed(&format!("xk_{}", &key[3..])));
        let mut bad = key.clone();
        bad.replace_range(10..11, "-");
        assert!(!is_well_formed(&bad));
        assert!(!is_well_formed("sk_ééééééééééééééééé"));
    }

    #[test]
    fn prefix_is_seven_chars_and_an_ellipsis() {
        assert_eq!(key_prefix("sk_ab12cdefgh"), "sk_ab12…");
        assert_eq!(key_prefix("sk_a"), "sk_a…");
        assert_eq!(key_prefix("ééééééééé"), "ééééééé…");
    }

    #[test]
    fn ids_are_prefixed_hex() {
        let id = generate_id("prj_");
        assert_eq!(id.len(), 4 + 16);
        assert!(id.starts_with("prj_"));
        assert!(id[4..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(generate_id("key_"), generate_id("key_"));
    }
}
