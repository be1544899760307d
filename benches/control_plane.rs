//! What the control plane costs the hot path, per publish: one key lookup in the
//! snapshot (length check + SHA-256 + hash-map probe) and one quota check (a CAS on one
//! atomic); and what one private subscribe's token check costs a worker, in thread CPU
//! time: the ES256 and EdDSA signature checks of jsonwebtoken's pure-Rust backend (before
//! issue 20), of ring, and of `ringcast::JWT_VERIFIERS` (now: ring for ES256, the
//! pure-Rust Ed25519 for EdDSA), a whole token decode, and the hash a replay costs.
//! Run: `cargo bench --bench control_plane`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};

use ringcast::{
    generate_key, hash_key, key_prefix, HistorySpec, KeyCache, KeyKind, KeyRecord, ProjectRecord,
    Quota, RateLimit, StoreContents,
};

const KEYS: usize = 10_000;
const PROJECTS: usize = 100;

#[path = "support/cpu.rs"]
mod cpu;
use cpu::cpu_iters;

/// A cache holding `KEYS` active keys spread over `PROJECTS` projects; returns the keys.
fn populated_cache() -> (Arc<KeyCache>, Vec<String>) {
    let projects: Vec<ProjectRecord> = (0..PROJECTS)
        .map(|i| ProjectRecord {
            id: format!("prj_{i:016x}"),
            name: format!("p{i}"),
            rate_limit: RateLimit::parse("1000/s").expect("valid limit"),
            history: HistorySpec::OFF,
            max_connections: None,
            client_events: false,
            webhook: None,
            pusher_app_id: 1_000_000 + i as u64,
            pusher: true,
        })
        .collect();
    let mut keys = Vec::with_capacity(KEYS);
    let records = (0..KEYS)
        .map(|i| {
            let kind = if i % 2 == 0 {
                KeyKind::Secret
            } else {
                KeyKind::Public
            };
            let key = generate_key(kind);
            let record = KeyRecord {
                id: format!("key_{i:016x}"),
                project_id: projects[i % PROJECTS].id.clone(),
                kind,
                revoked: false,
                prefix: key_prefix(&key),
                hash: hash_key(&key),
                public_key: None,
            };
            keys.push(key);
            record
        })
        .collect();
    let cache = KeyCache::new();
    cache.rebuild(StoreContents {
        projects,
        keys: records,
        ..StoreContents::default()
    });
    (cache, keys)
}

fn key_lookup(c: &mut Criterion) {
    let (cache, keys) = populated_cache();
    let mut group = c.benchmark_group("key_lookup_10k");

    let mut i = 0;
    group.bench_function("hit", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let snapshot = cache.load();
            black_box(snapshot.lookup(black_box(&keys[i])).is_some())
        })
    });

    // Well-formed but unknown: pays the full SHA-256 and probe.
    let unknown = generate_key(KeyKind::Secret);
    group.bench_function("miss", |b| {
        b.iter(|| {
            let snapshot = cache.load();
            black_box(snapshot.lookup(black_box(&unknown)).is_some())
        })
    });

    // Garbage is refused by the length/shape check before hashing.
    let garbage = "x".repeat(4096);
    group.bench_function("miss_malformed", |b| {
        b.iter(|| {
            let snapshot = cache.load();
            black_box(snapshot.lookup(black_box(&garbage)).is_some())
        })
    });
    group.finish();
}

fn quota_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("quota_check");

    // Always allowed: the synthetic clock advances one emission interval per check.
    let limit = RateLimit::parse("10000000/s").expect("valid limit");
    let step = limit.emission_interval_ns();
    let quota = Quota::new(limit);
    let mut now = 1_000_000_000u64;
    group.bench_function("allowed", |b| {
        b.iter(|| {
            now += step;
            let decision = quota.check(black_box(now));
            debug_assert!(decision.allowed);
            black_box(decision)
        })
    });

    // Always denied: an exhausted quota at a fixed instant (no CAS, just the load).
    let quota = Quota::new(RateLimit::parse("1/min").expect("valid limit"));
    let now = 1_000_000_000u64;
    assert!(quota.check(now).allowed);
    group.bench_function("denied", |b| {
        b.iter(|| {
            let decision = quota.check(black_box(now));
            debug_assert!(!decision.allowed);
            black_box(decision)
        })
    });
    group.finish();
}

/// One signature check per iteration, as `jsonwebtoken::decode` makes it: the verifier
/// from the provider's factory (key parsing included), then `verify`. Timed in thread
/// CPU time.
fn token_verify(c: &mut Criterion) {
    use jsonwebtoken::crypto::{rust_crypto, CryptoProvider};
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

    ringcast::install_jwt_verifiers();
    let mut group = c.benchmark_group("token_verify");
    let claims = serde_json::json!({"channel": "private-a", "exp": 4_000_000_000u64});
    for (name, alg, pair) in [
        (
            "es256",
            Algorithm::ES256,
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key"),
        ),
        (
            "eddsa",
            Algorithm::EdDSA,
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519 key"),
        ),
    ] {
        let (enc, dec) = match alg {
            Algorithm::ES256 => (
                EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()),
                DecodingKey::from_ec_pem(pair.public_key_pem().as_bytes()),
            ),
            _ => (
                EncodingKey::from_ed_pem(pair.serialize_pem().as_bytes()),
                DecodingKey::from_ed_pem(pair.public_key_pem().as_bytes()),
            ),
        };
        let (enc, dec) = (enc.expect("private key"), dec.expect("public key"));
        let token = jsonwebtoken::encode(&Header::new(alg), &claims, &enc).expect("token");
        let (message, signature) = token.rsplit_once('.').expect("a JWT");
        let signature =
            base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, signature)
                .expect("base64url");
        // jsonwebtoken's pure-Rust backend (all the server had before issue 20), and
        // ringcast's provider (what the server runs now: ring for ES256 only).
        let providers: [(&str, &CryptoProvider); 2] = [
            ("rust_crypto", &rust_crypto::DEFAULT_PROVIDER),
            ("ringcast", &ringcast::JWT_VERIFIERS),
        ];
        // ring on its own, for both algorithms: the measurement behind that choice.
        let ring_alg: &'static dyn ring::signature::VerificationAlgorithm = match alg {
            Algorithm::ES256 => &ring::signature::ECDSA_P256_SHA256_FIXED,
            _ => &ring::signature::ED25519,
        };
        let raw_key = dec.try_get_as_bytes().expect("raw public key").to_vec();
        group.bench_function(format!("{name}/ring"), |b| {
            b.iter_custom(|iters| {
                cpu_iters(iters, || {
                    let key = ring::signature::UnparsedPublicKey::new(ring_alg, &raw_key);
                    black_box(key.verify(message.as_bytes(), &signature).is_ok());
                })
            })
        });
        for (backend, provider) in providers {
            group.bench_function(format!("{name}/{backend}"), |b| {
                b.iter_custom(|iters| {
                    cpu_iters(iters, || {
                        let verifier = (provider.verifier_factory)(&alg, &dec).expect("verifier");
                        black_box(verifier.verify(message.as_bytes(), &signature).is_ok());
                    })
                })
            });
        }
        let mut validation = Validation::new(alg);
        validation.validate_aud = false;
        // What a replayed token costs instead (the worker's cache of verified tokens
        // keys its entries by this digest; a hit adds a slot compare and a clone).
        group.bench_function(format!("{name}/replay_sha256"), |b| {
            use sha2::Digest as _;
            b.iter_custom(|iters| {
                cpu_iters(iters, || {
                    black_box(sha2::Sha256::digest(black_box(token.as_bytes())));
                })
            })
        });
        group.bench_function(format!("{name}/decode_ringcast"), |b| {
            b.iter_custom(|iters| {
                cpu_iters(iters, || {
                    black_box(
                        jsonwebtoken::decode::<serde_json::Value>(
                            black_box(&token),
                            &dec,
                            &validation,
                        )
                        .is_ok(),
                    );
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, key_lookup, quota_check, token_verify);
criterion_main!(benches);
