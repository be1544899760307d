//! What the store makes before a backend keeps it: a new project with its first keys
//! and token secret, a new key, a new token secret.
//!
//! Invariants:
//! - Everything is minted here, once, by [`super::Store`]'s provided methods; a backend
//!   only stores the records it is given. So every backend checks names by the same
//!   rule, and none can keep a key or a token secret in clear (a key record holds its
//!   hash, a token secret record its sealed bytes).
//! - The clear values leave only through [`CreatedProject`] or the provided method
//!   that made them; nothing here is `Debug`.

use super::{validate_project_name, StoreError};
use crate::apikey::KeyKind;
use crate::project::{
    CreatedProject, KeyRecord, NewProject, ProjectRecord, TokenSecretRecord, FIRST_PUSHER_APP_ID,
};
use crate::sealed::MasterKey;

/// A new project as minted, before a backend stores it and numbers its Pusher app.
pub(crate) struct MintedProject {
    /// The project's record and its secrets in clear, as the caller gets them.
    created: CreatedProject,
    /// Its first secret key and public key, as stored.
    pub(crate) keys: [KeyRecord; 2],
    /// Its first token secret, sealed under the master key.
    pub(crate) token_secret: TokenSecretRecord,
}

impl MintedProject {
    /// Check `new`'s name, then make the project under a new id with a secret key, a
    /// public key and a token secret sealed with `master`.
    pub(crate) fn new(new: NewProject<'_>, master: &MasterKey) -> Result<Self, StoreError> {
        validate_project_name(new.name)?;
        // Numbered for real by the backend that stores it.
        let project = ProjectRecord::new(new, FIRST_PUSHER_APP_ID);
        let (secret, secret_key) = KeyRecord::mint(&project.id, KeyKind::Secret);
        let (public, public_key) = KeyRecord::mint(&project.id, KeyKind::Public);
        let (token_secret, token_clear) = mint_token_secret(&project.id, master)?;
        Ok(MintedProject {
            created: CreatedProject {
                project,
                secret_key,
                public_key,
                token_secret: token_clear,
            },
            keys: [secret, public],
            token_secret,
        })
    }

    pub(crate) fn project(&self) -> &ProjectRecord {
        &self.created.project
    }

    /// The project as the caller gets it, with the Pusher app id the backend gave it.
    pub(crate) fn created(self, pusher_app_id: u64) -> CreatedProject {
        let mut created = self.created;
        created.project.pusher_app_id = pusher_app_id;
        created
    }
}

/// A new token secret for `project_id`: the clear `ts_...` (shown once) and its record.
pub(crate) fn mint_token_secret(
    project_id: &str,
    master: &MasterKey,
) -> Result<(TokenSecretRecord, String), StoreError> {
    let secret = crate::apikey::generate_token_secret();
    let record = TokenSecretRecord {
        id: crate::apikey::generate_id("tsk_"),
        project_id: project_id.to_string(),
        sealed: master.seal(project_id, secret.as_bytes())?,
        expires_at: None,
    };
    Ok((record, secret))
}
