//! The signature checks behind jsonwebtoken: ring's ECDSA P-256 for ES256 tokens,
//! jsonwebtoken's own `rust_crypto` backend for the rest (EdDSA, HS256, and signing,
//! which only tests and tools do).
//!
//! Why: an ES256 check in the pure-Rust backend costs about 0.3 ms of worker CPU, and
//! anyone holding a public key may send forged tokens naming a real `kid`; ring's
//! assembly-backed P-256 takes about 70 µs (`benches/control_plane.rs`, thread CPU time),
//! and ring is already linked for rustls (no aws-lc C build). Ed25519 stays with
//! ed25519-dalek: measured the same way it is a little faster than ring's (47 µs against 52).
//!
//! Invariants:
//! - jsonwebtoken still decodes every token and chooses the check by the header's
//!   algorithm; this module only answers "does this signature verify under this key".
//! - A key of the wrong family for the algorithm is refused (`InvalidKeyFormat`),
//!   exactly as the `rust_crypto` backend refuses it, so no algorithm confusion is
//!   possible through this provider.
//! - A P-256 key ring cannot read (a compressed point) falls back to `rust_crypto`, so
//!   every key that verified before still verifies.
//! - [`install`] is idempotent and cheap after the first call; if another provider was
//!   already in place (a library user's), it is left alone.

use std::sync::Once;

use jsonwebtoken::crypto::{rust_crypto, CryptoProvider, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::signature::{Error as SignatureError, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};

/// jsonwebtoken's provider with ring for ES256 verification.
pub static RING_VERIFIERS: CryptoProvider = CryptoProvider {
    signer_factory: rust_crypto::DEFAULT_PROVIDER.signer_factory,
    verifier_factory: new_verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: rust_crypto::DEFAULT_PROVIDER
            .key_utils
            .rsa_pub_components_from_private_key,
        rsa_pub_components_from_public_key: rust_crypto::DEFAULT_PROVIDER
            .key_utils
            .rsa_pub_components_from_public_key,
        ec_pub_components_from_private_key: rust_crypto::DEFAULT_PROVIDER
            .key_utils
            .ec_pub_components_from_private_key,
        ed_pub_components_from_private_key: rust_crypto::DEFAULT_PROVIDER
            .key_utils
            .ed_pub_components_from_private_key,
        compute_digest: rust_crypto::DEFAULT_PROVIDER.key_utils.compute_digest,
    },
};

/// Make [`RING_VERIFIERS`] jsonwebtoken's process-wide provider (before its first use;
/// later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if RING_VERIFIERS.install_default().is_err() {
            tracing::debug!("jsonwebtoken's crypto provider was already chosen");
        }
    });
}

/// One ring ES256 check: the key's uncompressed SEC1 point.
struct RingEs256 {
    key: Vec<u8>,
}

impl Verifier<Vec<u8>> for RingEs256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), SignatureError> {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.key)
            .verify(msg, signature)
            .map_err(|_| SignatureError::new())
    }
}

impl JwtVerifier for RingEs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn new_verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if *alg != Algorithm::ES256 {
        return (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(alg, key);
    }
    if key.family() != AlgorithmFamily::Ec {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    let bytes = key.try_get_as_bytes()?;
    // ring reads uncompressed SEC1 points only.
    if bytes.len() != 65 || bytes[0] != 4 {
        return (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(alg, key);
    }
    Ok(Box::new(RingEs256 {
        key: bytes.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::crypto::verify;

    /// This provider (ring for ES256) and the pure-Rust backend agree on good and bad
    /// signatures, and a key of the wrong family is refused.
    #[test]
    fn ring_agrees_with_rust_crypto() {
        install();
        for (alg, pair) in [
            (
                Algorithm::ES256,
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
            ),
            (
                Algorithm::EdDSA,
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
            ),
        ] {
            let pem = pair.serialize_pem();
            let enc = match alg {
                Algorithm::ES256 => jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()),
                _ => jsonwebtoken::EncodingKey::from_ed_pem(pem.as_bytes()),
            }
            .unwrap();
            let dec = match alg {
                Algorithm::ES256 => DecodingKey::from_ec_pem(pair.public_key_pem().as_bytes()),
                _ => DecodingKey::from_ed_pem(pair.public_key_pem().as_bytes()),
            }
            .unwrap();
            let msg = b"eyJhbGciOiJFUzI1NiJ9.eyJleHAiOjF9";
            let sig = jsonwebtoken::crypto::sign(msg, &enc, alg).unwrap();
            let raw =
                base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &sig)
                    .unwrap();
            let ring = new_verifier(&alg, &dec).unwrap();
            let pure = (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(&alg, &dec).unwrap();
            assert!(ring.verify(msg, &raw).is_ok() && pure.verify(msg, &raw).is_ok());
            let mut bad = raw.clone();
            bad[5] ^= 1;
            assert!(ring.verify(msg, &bad).is_err() && pure.verify(msg, &bad).is_err());
            assert!(ring.verify(b"other", &raw).is_err());
            assert!(verify(&sig, msg, &dec, alg).unwrap());
            let hmac = DecodingKey::from_secret(b"secret");
            assert!(new_verifier(&alg, &hmac).is_err());
        }
    }
}
