//! The key watcher: one plain thread that keeps the [`KeyCache`] in step with the store.
//!
//! Every `interval` it asks the store for its change token; when the token moved it
//! reads everything, rebuilds the snapshot and calls `on_change` (the server uses that
//! to close WebSockets whose key was revoked). With the default 250 ms interval a
//! revocation or a new rate limit reaches every core well within the contract's 1 s.
//!
//! Invariants:
//! - The token is read *before* the contents, so a change committed in between is
//!   either in this read or moves the token again for the next poll: none is missed.
//! - A failed read keeps the previous snapshot (serving on slightly stale keys beats
//!   refusing everyone) and sets `db_ok` to false; it is retried at the next poll, and
//!   `db_ok` goes back to true as soon as the store answers.
//! - The thread exits within [`STOP_POLL`] of `stop` being set (at once if the caller
//!   also unparks it: `handle.thread().unpark()`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cache::KeyCache;
use crate::store::{Store, StoreError};

/// Longest the thread sleeps without looking at the stop flag.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(50);

/// The watcher's state; [`Watcher::poll`] is one check. Build one to load the cache
/// synchronously at start-up (so start-up fails on a broken database), then
/// [`Watcher::spawn`] it.
pub(crate) struct Watcher {
    store: Box<dyn Store>,
    cache: Arc<KeyCache>,
    on_change: Box<dyn Fn() + Send>,
    db_ok: Arc<AtomicBool>,
    last_token: Option<u64>,
}

impl Watcher {
    pub(crate) fn new(
        store: Box<dyn Store>,
        cache: Arc<KeyCache>,
        on_change: Box<dyn Fn() + Send>,
        db_ok: Arc<AtomicBool>,
    ) -> Watcher {
        Watcher {
            store,
            cache,
            on_change,
            db_ok,
            last_token: None,
        }
    }

    /// Check the store once. `Ok(true)` when a new snapshot was published (and
    /// `on_change` called), `Ok(false)` when nothing changed. The first poll always
    /// loads.
    pub(crate) fn poll(&mut self) -> Result<bool, StoreError> {
        let result = self.refresh();
        let was_ok = self.db_ok.swap(result.is_ok(), Ordering::Release);
        // Log transitions only: a database down for an hour is one warning, not 14,400.
        match (&result, was_ok) {
            (Err(err), true) => {
                tracing::warn!(error = %err, "key store unavailable; serving the last known keys")
            }
            (Ok(_), false) => tracing::info!("key store answers again"),
            _ => {}
        }
        result
    }

    fn refresh(&mut self) -> Result<bool, StoreError> {
        let token = self.store.change_token()?;
        if self.last_token == Some(token) {
            return Ok(false);
        }
        let contents = self.store.load_all()?;
        let _unopened = self.cache.rebuild(contents);
        self.last_token = Some(token);
        (self.on_change)();
        Ok(true)
    }

    /// Run [`Watcher::poll`] every `interval` on a new thread until `stop` is set.
    pub(crate) fn spawn(
        mut self,
        interval: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ringcast-keys".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    // Errors are logged and reflected in `db_ok` by `poll`.
                    let _ = self.poll();
                    sleep_unless_stopped(interval, &stop);
                }
            })
    }
}

/// Start the watcher thread (see the module docs). Its first poll loads the cache.
pub(crate) fn spawn_watcher(
    store: Box<dyn Store>,
    cache: Arc<KeyCache>,
    interval: Duration,
    on_change: Box<dyn Fn() + Send>,
    db_ok: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    Watcher::new(store, cache, on_change, db_ok).spawn(interval, stop)
}

fn sleep_unless_stopped(interval: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + interval;
    loop {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        // park_timeout may wake early (spuriously or by unpark); the loop re-checks.
        std::thread::park_timeout((deadline - now).min(STOP_POLL));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apikey::KeyKind;
    use crate::project::{KeyRecord, ProjectChange, ProjectRecord};
    use crate::quota::RateLimit;
    use crate::store::{SqliteStore, StoreContents};
    use std::sync::atomic::AtomicUsize;

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn picks_up_a_revocation_and_a_new_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut admin = SqliteStore::open(dir.path()).unwrap();
        let (project, secret, public, _) = admin
            .create_project(
                "p",
                RateLimit::parse("10/s").unwrap(),
                crate::history::HistorySpec::OFF,
                &crate::sealed::MasterKey::random(),
            )
            .unwrap();

        let cache = KeyCache::new();
        let changes = Arc::new(AtomicUsize::new(0));
        let db_ok = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let counted = Arc::clone(&changes);
        let handle = spawn_watcher(
            Box::new(SqliteStore::open(dir.path()).unwrap()),
            Arc::clone(&cache),
            Duration::from_millis(20),
            Box::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
            Arc::clone(&db_ok),
            Arc::clone(&stop),
        )
        .unwrap();

        wait_for("first load", || cache.load().lookup(&secret).is_some());
        assert!(db_ok.load(Ordering::Acquire));
        let key_id = cache.load().lookup(&public).unwrap().key_id.clone();
        let first = changes.load(Ordering::SeqCst);
        assert!(first >= 1);

        let started = Instant::now();
        admin.revoke_key(&public).unwrap();
        wait_for("revocation", || cache.load().lookup(&public).is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(!cache.load().is_active(&key_id));
        assert!(cache.load().lookup(&secret).is_some());
        wait_for("on_change", || changes.load(Ordering::SeqCst) > first);

        admin
            .set_project(
                &project.id,
                &ProjectChange::RateLimit(RateLimit::parse("7/min").unwrap()),
            )
            .unwrap();
        wait_for("new limit", || {
            cache.load().project(&project.id).unwrap().quota.limit()
                == RateLimit::parse("7/min").unwrap()
        });

        // The Pusher switch reaches the app id lookup the Pusher REST route will use.
        let by_app = |cache: &KeyCache| {
            cache
                .load()
                .project_by_app_id(project.pusher_app_id)
                .map(|p| p.pusher_enabled())
        };
        assert_eq!(by_app(&cache), Some(true));
        admin
            .set_project(&project.id, &ProjectChange::Pusher(false))
            .unwrap();
        wait_for("pusher off", || by_app(&cache) == Some(false));

        stop.store(true, Ordering::Release);
        handle.thread().unpark();
        let stopping = Instant::now();
        handle.join().unwrap();
        assert!(stopping.elapsed() < Duration::from_secs(1));
    }

    /// A real SQLite store behind a switch: while it is off, every call fails as a
    /// database that stopped answering would, so `db_ok` can be seen to follow it.
    struct Switchable {
        inner: SqliteStore,
        up: Arc<AtomicBool>,
    }

    impl Switchable {
        fn check(&self) -> Result<(), StoreError> {
            if self.up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(StoreError::Invalid("switched off".into()))
            }
        }
    }

    impl Store for Switchable {
        fn create_project(
            &mut self,
            name: &str,
            rate: RateLimit,
            history: crate::history::HistorySpec,
            master: &crate::sealed::MasterKey,
        ) -> Result<(ProjectRecord, String, String, String), StoreError> {
            self.check()?;
            self.inner.create_project(name, rate, history, master)
        }
        fn rotate_token_secret(
            &mut self,
            id: &str,
            master: &crate::sealed::MasterKey,
            grace_s: u64,
        ) -> Result<String, StoreError> {
            self.check()?;
            self.inner.rotate_token_secret(id, master, grace_s)
        }
        fn add_token_key(
            &mut self,
            id: &str,
            alg: crate::project::TokenKeyAlg,
            pem: &str,
        ) -> Result<crate::project::TokenKeyRecord, StoreError> {
            self.check()?;
            self.inner.add_token_key(id, alg, pem)
        }
        fn remove_token_key(&mut self, id: &str, key_id: &str) -> Result<(), StoreError> {
            self.check()?;
            self.inner.remove_token_key(id, key_id)
        }
        fn list_projects(&mut self) -> Result<Vec<ProjectRecord>, StoreError> {
            self.check()?;
            self.inner.list_projects()
        }
        fn set_project(
            &mut self,
            id: &str,
            change: &crate::project::ProjectChange,
        ) -> Result<ProjectRecord, StoreError> {
            self.check()?;
            self.inner.set_project(id, change)
        }
        fn create_key(
            &mut self,
            id: &str,
            kind: KeyKind,
        ) -> Result<(KeyRecord, String), StoreError> {
            self.check()?;
            self.inner.create_key(id, kind)
        }
        fn revoke_key(&mut self, key_or_id: &str) -> Result<String, StoreError> {
            self.check()?;
            self.inner.revoke_key(key_or_id)
        }
        fn list_keys(&mut self, id: &str) -> Result<Vec<KeyRecord>, StoreError> {
            self.check()?;
            self.inner.list_keys(id)
        }
        fn load_all(&mut self) -> Result<StoreContents, StoreError> {
            self.check()?;
            self.inner.load_all()
        }
        fn change_token(&mut self) -> Result<u64, StoreError> {
            self.check()?;
            self.inner.change_token()
        }
        fn is_empty(&mut self) -> Result<bool, StoreError> {
            self.check()?;
            self.inner.is_empty()
        }
    }

    #[test]
    fn db_ok_follows_the_store_and_the_snapshot_survives_outages() {
        let dir = tempfile::tempdir().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let cache = KeyCache::new();
        let db_ok = Arc::new(AtomicBool::new(true));
        let mut watcher = Watcher::new(
            Box::new(Switchable {
                inner: SqliteStore::open(dir.path()).unwrap(),
                up: Arc::clone(&up),
            }),
            Arc::clone(&cache),
            Box::new(|| {}),
            Arc::clone(&db_ok),
        );
        assert!(watcher.poll().unwrap(), "first poll loads");
        assert!(!watcher.poll().unwrap(), "same token: nothing to do");
        assert_eq!(cache.load().generation(), 1);

        up.store(false, Ordering::SeqCst);
        assert!(watcher.poll().is_err());
        assert!(!db_ok.load(Ordering::Acquire));
        assert_eq!(cache.load().generation(), 1, "old snapshot kept");

        up.store(true, Ordering::SeqCst);
        assert!(!watcher.poll().unwrap());
        assert!(db_ok.load(Ordering::Acquire));
    }
}
