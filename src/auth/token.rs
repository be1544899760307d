//! Subscription tokens of private channels: which keys verify a project's tokens
//! ([`TokenKeys`], part of the key snapshot) and the one check a `subscribe` or
//! `refresh` frame's JWT goes through ([`TokenKeys::verify`]).
//!
//! Every byte of JWT decoding is jsonwebtoken's, and every signature check goes through
//! it (ES256 and EdDSA with ring's code, see `auth::jwt_crypto`); this module only
//! decides which key and which algorithm a token may use:
//! - a token with a `kid` is verified with that registered key and its own algorithm
//!   only (ES256 or EdDSA); an unknown `kid` is refused;
//! - a token without a `kid` is verified with HS256 and the project's token secrets only
//!   (the current one, and during a rotation's grace the previous ones);
//! - any other `alg` (`none` included) is refused, so a public key's bytes used as an
//!   HMAC secret, or an HS256 token naming an ES256 key, never verify.
//!
//! Claims: `exp` is required; `exp` and `nbf` get exactly [`LEEWAY_S`] seconds of leeway;
//! the token must name the channel in `channel` or `channels`. Runs on a worker, once per
//! subscribe or refresh, never per message.

use std::collections::HashMap;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::project::TokenKeyAlg;

/// The "channel" a connection token is verified for (`?token=` on the upgrade, a
/// `refresh` without `channel`): no channel name is empty, so a channel token never
/// passes as a connection token, nor the reverse (and the worker's cache of verified
/// tokens keys them apart).
pub(crate) const CONNECTION: &str = "";

/// Clock leeway on `exp` and `nbf`, in seconds: at subscribe, at refresh, and for the
/// expiry of a subscription (`exp + LEEWAY_S`).
pub(crate) const LEEWAY_S: u64 = 5;

/// A token secret that verifies until `valid_until` (unix seconds; `None`: current).
struct Secret {
    key: DecodingKey,
    /// The secret's text, for the HMACs that are not JWTs (Pusher's channel and REST
    /// signatures). Never logged: `TokenKeys`' `Debug` prints only a count.
    text: Box<str>,
    valid_until: Option<u64>,
}

/// Everything that verifies one project's tokens. Built by the control plane, shared
/// immutably by every worker.
#[derive(Default)]
pub struct TokenKeys {
    /// Newest first.
    secrets: Vec<Secret>,
    /// `kid` → (its algorithm, its public key).
    keys: HashMap<String, (Algorithm, DecodingKey)>,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKeys")
            .field("secrets", &self.secrets.len())
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What a verified token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Seconds since the epoch; the subscription ends at `exp + LEEWAY_S`.
    pub exp: u64,
    /// The user the token was made for, if it says.
    pub sub: Option<String>,
    /// The `info` claim (the user's public details on presence channels) as compact
    /// JSON text: always an object of at most [`MAX_INFO_BYTES`].
    pub info: Option<String>,
}

// Largest `info` claim, as compact JSON text: the presence frames' limit.
pub(crate) use crate::wire::native::MAX_INFO_BYTES;

/// Why a token was refused: the `forbidden` error frame's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("this channel needs a token: send \"token\" with the subscribe frame")]
    Missing,
    #[error("the token is not a well-formed JWT with the claims this service needs")]
    Malformed,
    #[error("the token's algorithm is not accepted (HS256 with the project's token secret, or ES256/EdDSA with a registered key named by kid)")]
    Algorithm,
    #[error("the token names a kid that is not registered for this project")]
    UnknownKey,
    #[error(
        "the project has no token secret; create one with `ringcast project rotate-token-secret`"
    )]
    NoSecret,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token has no exp claim")]
    NoExpiry,
    #[error("the token does not name this channel")]
    WrongChannel,
    #[error("a new token cannot change the subscription's sub (user)")]
    SubjectChanged,
    #[error("this connection holds no subscription to the channel (or it has ended)")]
    NotSubscribed,
    #[error("the token's info claim must be a JSON object of at most 1 KiB")]
    BadInfo,
    #[error("a presence channel needs a token whose sub (1 to 128 characters) names the user")]
    NoSubject,
    #[error("a connection token needs a sub (1 to 200 characters, no control characters) naming the user")]
    NoUser,
    #[error("a connection token names no channel: this is a channel token")]
    ChannelToken,
    #[error("the token's sub is not this connection's user")]
    NotConnectionUser,
    #[error("this connection was opened without a connection token: there is none to refresh")]
    NoConnectionToken,
    #[error("this user is blocked")]
    Blocked,
    #[error("this project requires a connection token (?token=) naming the user")]
    UserRequired,
}

#[derive(Deserialize)]
struct Claims {
    exp: u64,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    info: Option<serde_json::Value>,
}

impl TokenKeys {
    /// Add a token secret (the bytes of the whole `ts_...` string).
    pub(crate) fn add_secret(&mut self, secret: &[u8], valid_until: Option<u64>) {
        self.secrets.push(Secret {
            key: DecodingKey::from_secret(secret),
            text: String::from_utf8_lossy(secret).into(),
            valid_until,
        });
    }

    /// The token secrets in force at `now` (seconds), newest first: the current one and,
    /// during a rotation's grace, the one before it.
    pub(crate) fn secrets_at(&self, now: u64) -> Vec<&str> {
        self.secrets
            .iter()
            .filter(|s| s.valid_until.is_none_or(|until| now < until))
            .map(|s| &*s.text)
            .collect()
    }

    /// Secrets were added oldest first; verification wants the newest first.
    pub(crate) fn finish(&mut self) {
        self.secrets.reverse();
    }

    /// Register a public key under its id. A PEM that no longer parses (it was checked
    /// when added) is skipped and logged.
    pub(crate) fn add_key(&mut self, id: &str, alg: TokenKeyAlg, pem: &str) {
        let parsed = match alg {
            TokenKeyAlg::Es256 => DecodingKey::from_ec_pem(pem.as_bytes()),
            TokenKeyAlg::EdDsa => DecodingKey::from_ed_pem(pem.as_bytes()),
        };
        match parsed {
            Ok(key) => {
                self.keys.insert(id.to_string(), (jwt_alg(alg), key));
            }
            Err(e) => {
                tracing::error!(token_key = id, error = %e, "stored token key does not parse")
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.keys.is_empty()
    }

    /// Verify `token` for `channel` at `now` (unix seconds); `channel` [`CONNECTION`]
    /// verifies a connection token (its `sub`, 1 to 200 characters, is required).
    pub fn verify(&self, token: &str, channel: &str, now: u64) -> Result<Grant, TokenRefusal> {
        self.verify_until(token, channel, now)
            .map(|(grant, _)| grant)
    }

    /// [`TokenKeys::verify`], and until when the key that verified it verifies (unix
    /// seconds, exclusive; `None`: a current secret or a registered public key), for
    /// the worker's cache of verified tokens (`auth::verified`).
    pub(crate) fn verify_until(
        &self,
        token: &str,
        channel: &str,
        now: u64,
    ) -> Result<(Grant, Option<u64>), TokenRefusal> {
        super::jwt_crypto::install();
        let header = jsonwebtoken::decode_header(token).map_err(|e| refusal(&e))?;
        let (claims, until) = match header.kid.as_deref() {
            Some(kid) => {
                let (alg, key) = self.keys.get(kid).ok_or(TokenRefusal::UnknownKey)?;
                (decode(token, key, *alg)?, None)
            }
            None => {
                if header.alg != Algorithm::HS256 {
                    return Err(TokenRefusal::Algorithm);
                }
                let mut result = Err(TokenRefusal::NoSecret);
                let mut until = None;
                for secret in &self.secrets {
                    if secret.valid_until.is_some_and(|until| now >= until) {
                        continue;
                    }
                    result = decode(token, &secret.key, Algorithm::HS256);
                    until = secret.valid_until;
                    // Only a signature mismatch means "try the next secret": any other
                    // refusal is about the token itself.
                    if !matches!(result, Err(TokenRefusal::Signature)) {
                        break;
                    }
                }
                (result?, until)
            }
        };
        // jsonwebtoken checked exp and nbf against its own clock; `now` is checked too,
        // so a caller's clock (tests, the refresh path) decides consistently.
        if claims.exp.saturating_add(LEEWAY_S) < now {
            return Err(TokenRefusal::Expired);
        }
        if channel == CONNECTION {
            // A connection token names its user and no channel: a channel token given
            // to one client is not a way to open connections as its user.
            if claims.channel.is_some() || claims.channels.is_some() {
                return Err(TokenRefusal::ChannelToken);
            }
            // The REST calls that end a user's access take the same ids: a user they
            // could not name (a control character) is never let in.
            if !claims
                .sub
                .as_deref()
                .is_some_and(crate::project::users::valid_user_id)
            {
                return Err(TokenRefusal::NoUser);
            }
        } else {
            let named = claims.channel.as_deref() == Some(channel)
                || claims
                    .channels
                    .as_ref()
                    .is_some_and(|list| list.iter().any(|c| c == channel));
            if !named {
                return Err(TokenRefusal::WrongChannel);
            }
        }
        let info = match claims.info {
            None | Some(serde_json::Value::Null) => None,
            Some(v @ serde_json::Value::Object(_)) => {
                let text = v.to_string();
                if text.len() > MAX_INFO_BYTES {
                    return Err(TokenRefusal::BadInfo);
                }
                Some(text)
            }
            Some(_) => return Err(TokenRefusal::BadInfo),
        };
        let grant = Grant {
            exp: claims.exp,
            sub: claims.sub,
            info,
        };
        Ok((grant, until))
    }
}

fn jwt_alg(alg: TokenKeyAlg) -> Algorithm {
    match alg {
        TokenKeyAlg::Es256 => Algorithm::ES256,
        TokenKeyAlg::EdDsa => Algorithm::EdDSA,
    }
}

fn decode(token: &str, key: &DecodingKey, alg: Algorithm) -> Result<Claims, TokenRefusal> {
    let mut validation = Validation::new(alg);
    validation.leeway = LEEWAY_S;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // Audiences are not part of this service's tokens: an `aud` claim is ignored.
    validation.validate_aud = false;
    validation.set_required_spec_claims(&["exp"]);
    jsonwebtoken::decode::<Claims>(token, key, &validation)
        .map(|data| data.claims)
        .map_err(|e| refusal(&e))
}

fn refusal(e: &jsonwebtoken::errors::Error) -> TokenRefusal {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => TokenRefusal::Signature,
        K::ExpiredSignature => TokenRefusal::Expired,
        K::ImmatureSignature => TokenRefusal::NotYetValid,
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => {
            TokenRefusal::Algorithm
        }
        K::MissingRequiredClaim(c) if c == "exp" => TokenRefusal::NoExpiry,
        // A key of the wrong family for the header's algorithm.
        K::InvalidKeyFormat | K::InvalidEcdsaKey | K::InvalidRsaKey(_) => TokenRefusal::Algorithm,
        _ => TokenRefusal::Malformed,
    }
}

/// Why a file given to `add-token-key` is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PublicKeyError {
    #[error("the file is not PEM")]
    NotPem,
    #[error("the file holds a private key: give the public half only (-----BEGIN PUBLIC KEY-----); ringcast never stores a private key")]
    Private,
    #[error("expected a -----BEGIN PUBLIC KEY----- block, found {0:?}")]
    OtherBlock(String),
    #[error("the public key is neither P-256 (ES256) nor Ed25519 (EdDSA)")]
    Unsupported,
}

/// DER of the `prime256v1` (P-256) curve OID, as it appears in an EC SubjectPublicKeyInfo.
const P256_OID_DER: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// Check a PEM public key for `add-token-key`: exactly one SubjectPublicKeyInfo block
/// that jsonwebtoken reads as a P-256 or Ed25519 public key. Returns its algorithm and
/// the PEM re-encoded (only that block: nothing else in the file is kept).
pub(crate) fn parse_public_key(text: &[u8]) -> Result<(TokenKeyAlg, String), PublicKeyError> {
    let blocks = pem::parse_many(text).map_err(|_| PublicKeyError::NotPem)?;
    if blocks.iter().any(|b| b.tag().contains("PRIVATE")) {
        return Err(PublicKeyError::Private);
    }
    let block = match blocks.as_slice() {
        [one] => one,
        [] => return Err(PublicKeyError::NotPem),
        [first, ..] => return Err(PublicKeyError::OtherBlock(first.tag().to_string())),
    };
    if block.tag() != "PUBLIC KEY" {
        return Err(PublicKeyError::OtherBlock(block.tag().to_string()));
    }
    let normal = pem::encode(&pem::Pem::new("PUBLIC KEY", block.contents().to_vec()));
    let der = block.contents();
    if DecodingKey::from_ed_pem(normal.as_bytes()).is_ok() {
        return Ok((TokenKeyAlg::EdDsa, normal));
    }
    let p256 = der.windows(P256_OID_DER.len()).any(|w| w == P256_OID_DER);
    if p256 && DecodingKey::from_ec_pem(normal.as_bytes()).is_ok() {
        return Ok((TokenKeyAlg::Es256, normal));
    }
    Err(PublicKeyError::Unsupported)
}

/// What the unit tests of token checks share: the clock and an HS256 signer.
#[cfg(test)]
pub(crate) mod test_tokens {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

    /// Unix seconds now.
    pub(crate) fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    /// `claims` signed with HS256 and `secret`.
    pub(crate) fn hs(secret: &str, claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .expect("HS256 signs any claims")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "ts_testsecrettestsecrettestsecrettestsecret12";

    use super::test_tokens::{hs, now};

    fn keys() -> TokenKeys {
        let mut k = TokenKeys::default();
        k.add_secret(SECRET.as_bytes(), None);
        k.finish();
        k
    }

    #[test]
    fn hs256_with_the_secret_names_the_channel() {
        let k = keys();
        let t = hs(
            SECRET,
            json!({"channel": "private-a", "exp": now() + 60, "sub": "u1"}),
        );
        let g = k.verify(&t, "private-a", now()).unwrap();
        assert_eq!(g.sub.as_deref(), Some("u1"));
        assert_eq!(
            k.verify(&t, "private-b", now()),
            Err(TokenRefusal::WrongChannel)
        );
        let t = hs(
            SECRET,
            json!({"channels": ["private-x", "private-a"], "exp": now() + 60}),
        );
        assert!(k.verify(&t, "private-a", now()).is_ok());
        let wrong = hs(
            "ts_other",
            json!({"channel": "private-a", "exp": now() + 60}),
        );
        assert_eq!(
            k.verify(&wrong, "private-a", now()),
            Err(TokenRefusal::Signature)
        );
    }

    #[test]
    fn connection_tokens_name_a_user_and_never_pass_for_channel_tokens() {
        let k = keys();
        let t = hs(
            SECRET,
            json!({"sub": "ann", "exp": now() + 60, "info": {"name": "Ann"}}),
        );
        let g = k.verify(&t, CONNECTION, now()).unwrap();
        assert_eq!(g.sub.as_deref(), Some("ann"));
        assert_eq!(g.info.as_deref(), Some(r#"{"name":"Ann"}"#));
        assert_eq!(
            k.verify(&t, "private-a", now()),
            Err(TokenRefusal::WrongChannel)
        );
        for sub in [json!(null), json!(""), json!("u".repeat(201))] {
            let t = hs(SECRET, json!({"sub": sub, "exp": now() + 60}));
            assert_eq!(k.verify(&t, CONNECTION, now()), Err(TokenRefusal::NoUser));
        }
        let t = hs(SECRET, json!({"sub": "u".repeat(200), "exp": now() + 60}));
        assert!(k.verify(&t, CONNECTION, now()).is_ok());
        // A channel token with a sub is not a connection token either way round.
        let ch = hs(
            SECRET,
            json!({"channel": "private-a", "sub": "ann", "exp": now() + 60}),
        );
        assert_eq!(
            k.verify(&ch, CONNECTION, now()),
            Err(TokenRefusal::ChannelToken)
        );
    }

    #[test]
    fn exp_is_required_and_leeway_is_five_seconds() {
        let k = keys();
        let n = now();
        let no_exp = hs(SECRET, json!({"channel": "private-a"}));
        assert!(k.verify(&no_exp, "private-a", n).is_err());
        let just = hs(SECRET, json!({"channel": "private-a", "exp": n - 4}));
        assert!(k.verify(&just, "private-a", n).is_ok());
        let old = hs(SECRET, json!({"channel": "private-a", "exp": n - 7}));
        assert_eq!(k.verify(&old, "private-a", n), Err(TokenRefusal::Expired));
        let soon = hs(
            SECRET,
            json!({"channel": "private-a", "exp": n + 60, "nbf": n + 3}),
        );
        assert!(k.verify(&soon, "private-a", n).is_ok());
        let later = hs(
            SECRET,
            json!({"channel": "private-a", "exp": n + 60, "nbf": n + 30}),
        );
        assert_eq!(
            k.verify(&later, "private-a", n),
            Err(TokenRefusal::NotYetValid)
        );
    }

    #[test]
    fn rotated_secrets_verify_until_their_deadline() {
        let mut k = TokenKeys::default();
        let n = now();
        k.add_secret(b"ts_old", Some(n + 10));
        k.add_secret(SECRET.as_bytes(), None);
        k.finish();
        let t = hs("ts_old", json!({"channel": "private-a", "exp": n + 60}));
        assert!(k.verify(&t, "private-a", n).is_ok());
        assert_eq!(
            k.verify(&t, "private-a", n + 10),
            Err(TokenRefusal::Signature)
        );
        assert_eq!(
            TokenKeys::default().verify(&t, "private-a", n),
            Err(TokenRefusal::NoSecret)
        );
    }

    #[test]
    fn other_algorithms_and_garbage_are_refused() {
        let k = keys();
        let n = now();
        let claims = json!({"channel": "private-a", "exp": n + 60});
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        assert_eq!(
            k.verify(&hs384, "private-a", n),
            Err(TokenRefusal::Algorithm)
        );
        use base64::Engine as _;
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let none = format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&claims));
        assert!(k.verify(&none, "private-a", n).is_err());
        for junk in ["", "a.b", "a.b.c", "....", "x.y.z.w"] {
            assert!(k.verify(junk, "private-a", n).is_err(), "{junk}");
        }
        let mut kid = Header::new(Algorithm::HS256);
        kid.kid = Some("tk_nope".into());
        let t = encode(&kid, &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap();
        assert_eq!(k.verify(&t, "private-a", n), Err(TokenRefusal::UnknownKey));
    }

    #[test]
    fn public_keys_are_checked_and_private_ones_refused() {
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let (alg, pem) = parse_public_key(ed.public_key_pem().as_bytes()).unwrap();
        assert_eq!(alg, TokenKeyAlg::EdDsa);
        assert!(pem.contains("BEGIN PUBLIC KEY"));
        let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert_eq!(
            parse_public_key(ec.public_key_pem().as_bytes()).unwrap().0,
            TokenKeyAlg::Es256
        );
        let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        assert!(matches!(
            parse_public_key(p384.public_key_pem().as_bytes()),
            Err(PublicKeyError::Unsupported)
        ));
        assert!(matches!(
            parse_public_key(ec.serialize_pem().as_bytes()),
            Err(PublicKeyError::Private)
        ));
        assert!(parse_public_key(b"hello").is_err());

        // A registered ES256 key verifies its own tokens, named by kid, and nothing else.
        let mut k = keys();
        k.add_key("tk_1", TokenKeyAlg::Es256, &ec.public_key_pem());
        let n = now();
        let claims = json!({"channel": "private-a", "exp": n + 60});
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some("tk_1".into());
        let enc = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
        let t = encode(&h, &claims, &enc).unwrap();
        assert!(k.verify(&t, "private-a", n).is_ok());
        // HS256 under the same kid, keyed with the public key's bytes: refused.
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("tk_1".into());
        let forged = encode(
            &h,
            &claims,
            &EncodingKey::from_secret(ec.public_key_pem().as_bytes()),
        )
        .unwrap();
        assert_eq!(
            k.verify(&forged, "private-a", n),
            Err(TokenRefusal::Algorithm)
        );
    }
}
