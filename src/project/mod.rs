//! What a project is: its record, its keys, token secrets and token keys as every store
//! keeps them, the changes `project set-*` makes, and its webhook setting. Plain data:
//! the stores ([`crate::store`]) persist these, the key snapshot ([`crate::auth`])
//! indexes them, the admin commands print them. [`users`]: user blocks and end records.
//!
//! Invariants (kept by every store, see [`crate::store`]): of a secret key only its
//! [`KeyHash`] and display prefix exist here; a token secret only sealed; every project
//! has a Pusher app id from [`FIRST_PUSHER_APP_ID`] upwards, never reused.

pub(crate) mod users;
pub(crate) mod webhook;

pub use users::UserBlockRecord;
pub(crate) use users::UserEndRecord;
pub use webhook::{HookKind, HookKinds, WebhookSpec};

use crate::apikey::{KeyHash, KeyKind};
use crate::history::HistorySpec;
use crate::quota::RateLimit;

/// Longest project name, in characters (same bound as channel names).
pub(crate) const MAX_PROJECT_NAME_CHARS: usize = 100;

/// The first Pusher app id: seven digits, like Pusher's own.
pub(crate) const FIRST_PUSHER_APP_ID: u64 = 1_000_000;

/// A project as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectRecord {
    pub id: String,
    pub name: String,
    pub rate_limit: RateLimit,
    /// Channel history kept for the project (`off` by default).
    pub history: HistorySpec,
    /// WebSocket connections this project may hold per node; `None`: the node's
    /// `max_ws_connections_per_project`. `Some(0)`: unlimited.
    pub max_connections: Option<u64>,
    /// Whether subscribers of this project's private and presence channels may send
    /// client events to each other (`false` by default).
    pub client_events: bool,
    /// Where and what the project's webhook sends (`project set-webhook`); `None`: off.
    pub webhook: Option<WebhookSpec>,
    /// The project's id as a Pusher app (`/apps/{app_id}/...`); see the module's invariants.
    pub pusher_app_id: u64,
    /// Whether Pusher clients and the Pusher REST API may use the project (`true` by
    /// default: every project is also a Pusher app).
    pub pusher: bool,
}

/// What a new project is given (`project create`; `serve --dev`'s first project).
#[derive(Clone, Copy, Debug)]
pub struct NewProject<'a> {
    pub name: &'a str,
    pub rate_limit: RateLimit,
    pub history: HistorySpec,
}

/// A project just created, with its secrets in clear: returned once, by the call that
/// made them, and never stored in clear (no `Debug`, so no log line can print them).
pub(crate) struct CreatedProject {
    pub project: ProjectRecord,
    /// The full secret key (`sk_...`).
    pub secret_key: String,
    /// The full public key (`pk_...`).
    pub public_key: String,
    /// The clear token secret (`ts_...`).
    pub token_secret: String,
}

impl ProjectRecord {
    /// A project as every store creates it, under a new id: no connection limit of its
    /// own, client events off, no webhook, Pusher on. The store validates the name
    /// first and numbers the Pusher app.
    pub fn new(new: NewProject<'_>, pusher_app_id: u64) -> ProjectRecord {
        ProjectRecord {
            id: crate::apikey::generate_id("prj_"),
            name: new.name.to_string(),
            rate_limit: new.rate_limit,
            history: new.history,
            max_connections: None,
            client_events: false,
            webhook: None,
            pusher_app_id,
            pusher: true,
        }
    }
}

/// A key as stored: everything but the key itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub project_id: String,
    pub kind: KeyKind,
    pub revoked: bool,
    /// Display prefix, e.g. `sk_ab12…`.
    pub prefix: String,
    pub hash: KeyHash,
    /// The whole key, for public keys only (they are public: every web page carries
    /// one); the webhook's `X-Pusher-Key` needs it. `None` for secret keys, and for
    /// public keys made before schema 6 (only their hash was kept).
    pub public_key: Option<String>,
}

impl KeyRecord {
    /// A new random key for a project and the record that stores it (hash and prefix
    /// only). Every store mints keys here, so they all look and hash the same.
    pub fn mint(project_id: &str, kind: KeyKind) -> (KeyRecord, String) {
        use crate::apikey::{generate_id, generate_key, hash_key, key_prefix};
        let key = generate_key(kind);
        let record = KeyRecord {
            id: generate_id("key_"),
            project_id: project_id.to_string(),
            kind,
            revoked: false,
            prefix: key_prefix(&key),
            hash: hash_key(&key),
            public_key: (kind == KeyKind::Public).then(|| key.clone()),
        };
        (record, key)
    }
}

/// A project's token secret as stored: sealed, never in clear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSecretRecord {
    pub id: String,
    pub project_id: String,
    /// `nonce || ciphertext || tag` under the master key, project id as associated data.
    pub sealed: Vec<u8>,
    /// Unix seconds after which it no longer verifies (set by a rotation); `None` while
    /// it is current.
    pub expires_at: Option<i64>,
}

/// The signature algorithm of a registered token key, decided from the key itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKeyAlg {
    /// ECDSA over P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl TokenKeyAlg {
    /// The JWT `alg` name, also the stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKeyAlg::Es256 => "ES256",
            TokenKeyAlg::EdDsa => "EdDSA",
        }
    }

    pub fn parse(s: &str) -> Option<TokenKeyAlg> {
        match s {
            "ES256" => Some(TokenKeyAlg::Es256),
            "EdDSA" => Some(TokenKeyAlg::EdDsa),
            _ => None,
        }
    }
}

/// A registered public key that verifies a project's tokens naming it in `kid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenKeyRecord {
    pub id: String,
    pub project_id: String,
    pub alg: TokenKeyAlg,
    /// SubjectPublicKeyInfo in PEM (`-----BEGIN PUBLIC KEY-----`).
    pub public_pem: String,
}

impl TokenKeyRecord {
    /// A project's new token key under a new id (the key is checked by the caller).
    pub fn new(project_id: &str, alg: TokenKeyAlg, public_pem: &str) -> TokenKeyRecord {
        TokenKeyRecord {
            id: crate::apikey::generate_id("tk_"),
            project_id: project_id.to_string(),
            alg,
            public_pem: public_pem.to_string(),
        }
    }
}

/// One change to a project's settings: what each `project set-*` command stores. One
/// store call applies one change, so every store writes it in one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProjectChange {
    /// The publish quota.
    RateLimit(RateLimit),
    /// The history setting (a store in cluster mode also forgets the project's history:
    /// no position taken before the change may be recovered).
    History(HistorySpec),
    /// The project's own WebSocket connection limit; `None` clears it.
    MaxConnections(Option<u64>),
    /// Whether client events are allowed on its private and presence channels.
    ClientEvents(bool),
    /// Whether the Pusher protocol (WebSocket and REST) is allowed.
    Pusher(bool),
    /// The webhook; `None` turns it off.
    Webhook(Option<WebhookSpec>),
    /// Whether a WebSocket needs a valid connection token (`--require-user`). Kept
    /// apart from [`ProjectRecord`] (in [`crate::store::StoreContents::require_user`]).
    RequireUser(bool),
}

/// A Pusher app id for a test's hand-made [`ProjectRecord`]: the same for the same id
/// (rebuilds keep a project's state only while its app id stays), distinct in practice.
#[cfg(test)]
pub(crate) fn test_app_id(project_id: &str) -> u64 {
    let h = project_id
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    FIRST_PUSHER_APP_ID + h % 1_000_000_000
}

/// A project as tests hand-make it: rate 1/s, no history, no connection limit, client
/// events on, no webhook, Pusher on with [`test_app_id`]. A test changes what it needs
/// with `ProjectRecord { field, ..test_project(id) }`.
#[cfg(test)]
pub(crate) fn test_project(id: &str) -> ProjectRecord {
    ProjectRecord {
        id: id.into(),
        name: id.into(),
        rate_limit: crate::quota::RateLimit::parse("1/s").expect("a valid rate"),
        history: crate::history::HistorySpec::OFF,
        max_connections: None,
        client_events: true,
        webhook: None,
        pusher_app_id: test_app_id(id),
        pusher: true,
    }
}
