//! Secrets at rest: the master key and the AEAD that seals project token secrets
//! (`ts_...`) before they reach a store.
//!
//! Token secrets must be readable by the server (HS256 needs the secret itself, unlike
//! API keys, which are kept as hashes), so the store holds them sealed with
//! ChaCha20-Poly1305 (ring) under a 256-bit master key read from `master_key_file`.
//! Invariants:
//! - A sealed value is `nonce (12 random bytes) || ciphertext || tag`; the project id is
//!   the associated data, so a sealed secret copied to another project's row does not
//!   open there.
//! - The master key never leaves this module's [`MasterKey`] (no `Debug` of its bytes)
//!   and is never written anywhere but its own file, with mode 0600.
//! - The embedded store's master key is created on first use in the data directory; in
//!   cluster mode the file is required (every node and the admin CLI need the same key),
//!   so [`MasterKey::load`] never creates one there.

use std::io::Write;
use std::path::{Path, PathBuf};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Default file name of the master key inside the data directory (embedded store).
pub(crate) const MASTER_KEY_FILE: &str = "master.key";

/// Why the master key cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SealError {
    #[error("cannot read master key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create master key file {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("master key file {0} must hold 64 hexadecimal characters (32 bytes); make one with `openssl rand -hex 32`")]
    Format(PathBuf),
    #[error("cluster mode needs master_key_file (--master-key-file / RINGCAST_MASTER_KEY_FILE): the same file on every node and for the admin CLI")]
    Required,
    /// A sealed value that does not open with this key (another master key, or damaged).
    #[error("a sealed secret does not open with this master key (wrong master_key_file, or damaged data)")]
    Open,
    #[error("the system random generator failed")]
    Random,
}

/// The 256-bit key that seals token secrets.
pub(crate) struct MasterKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// The master key for a store: `file` when given; otherwise (embedded store only)
    /// `<data_dir>/master.key`, created with 32 random bytes and mode 0600 when missing.
    pub(crate) fn load(
        file: Option<&Path>,
        data_dir: &Path,
        cluster: bool,
    ) -> Result<MasterKey, SealError> {
        match file {
            Some(path) => Self::read(path),
            None if cluster => Err(SealError::Required),
            None => Self::load_or_create(&data_dir.join(MASTER_KEY_FILE)),
        }
    }

    fn from_bytes(bytes: &[u8; 32]) -> MasterKey {
        // CHACHA20_POLY1305 takes exactly 32 bytes: `new` cannot fail here.
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("a 32-byte key");
        MasterKey {
            key: LessSafeKey::new(unbound),
        }
    }

    fn read(path: &Path) -> Result<MasterKey, SealError> {
        let text = std::fs::read_to_string(path).map_err(|source| SealError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let bytes = hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| SealError::Format(path.to_path_buf()))?;
        warn_if_readable_by_others(path);
        Ok(Self::from_bytes(&bytes))
    }

    fn load_or_create(path: &Path) -> Result<MasterKey, SealError> {
        match Self::read(path) {
            Err(SealError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            other => return other,
        }
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SealError::Random)?;
        let create = |source| SealError::Create {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(create)?;
        }
        // `create_new`: two processes starting on a fresh directory at once must not
        // each write a different key; the loser reads the winner's.
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(path) {
            Ok(mut file) => {
                file.write_all(format!("{}\n", hex::encode(bytes)).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(create)?;
                Ok(Self::from_bytes(&bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // The other process may still be writing: give it a moment.
                for _ in 0..50 {
                    if let Ok(key) = Self::read(path) {
                        return Ok(key);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Self::read(path)
            }
            Err(e) => Err(create(e)),
        }
    }

    /// Seal `plaintext` for the project `project_id`.
    pub(crate) fn seal(&self, project_id: &str, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + 16);
        out.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(project_id.as_bytes()),
                &mut body,
            )
            .map_err(|_| SealError::Open)?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Open a value sealed by [`MasterKey::seal`] for the same project.
    pub(crate) fn open(&self, project_id: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(project_id.as_bytes()), &mut body)
            .map_err(|_| SealError::Open)?;
        Ok(plain.to_vec())
    }

    /// A throwaway key (tests).
    #[cfg(test)]
    pub(crate) fn random() -> MasterKey {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes).expect("random");
        Self::from_bytes(&bytes)
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "the master key file is readable by group or others; chmod 600 it");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_for_their_project_and_key() {
        let key = MasterKey::random();
        let sealed = key.seal("prj_a", b"ts_secret").unwrap();
        assert!(!sealed.windows(9).any(|w| w == b"ts_secret"));
        assert_eq!(key.open("prj_a", &sealed).unwrap(), b"ts_secret");
        assert!(key.open("prj_b", &sealed).is_err());
        assert!(MasterKey::random().open("prj_a", &sealed).is_err());
        let mut damaged = sealed.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert!(key.open("prj_a", &damaged).is_err());
        assert!(key.open("prj_a", &sealed[..5]).is_err());
        // A fresh nonce each time.
        assert_ne!(
            key.seal("prj_a", b"x").unwrap(),
            key.seal("prj_a", b"x").unwrap()
        );
    }

    #[test]
    fn the_embedded_key_is_created_once_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let a = MasterKey::load(None, dir.path(), false).unwrap();
        let path = dir.path().join(MASTER_KEY_FILE);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let sealed = a.seal("p", b"v").unwrap();
        let b = MasterKey::load(None, dir.path(), false).unwrap();
        assert_eq!(b.open("p", &sealed).unwrap(), b"v");
        let c = MasterKey::load(Some(&path), Path::new("/nonexistent"), true).unwrap();
        assert_eq!(c.open("p", &sealed).unwrap(), b"v");
    }

    #[test]
    fn cluster_mode_needs_a_file_and_a_well_formed_one() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            MasterKey::load(None, dir.path(), true),
            Err(SealError::Required)
        ));
        let bad = dir.path().join("bad.key");
        std::fs::write(&bad, "not hex").unwrap();
        assert!(matches!(
            MasterKey::load(Some(&bad), dir.path(), true),
            Err(SealError::Format(_))
        ));
        assert!(matches!(
            MasterKey::load(Some(&dir.path().join("missing")), dir.path(), true),
            Err(SealError::Read { .. })
        ));
    }
}
