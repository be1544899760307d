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
//! - Store jobs ([`StoreJob`], sent through [`KeyCache::store_job`] by the REST user
//!   endpoints, which run on workers and must never touch the store) run on this
//!   thread between polls, on its store connection; a job is followed by a poll at
//!   once, and then by its second half (its answer), so a block stored by this node is
//!   in its own snapshot before the answer.
//! - End records (a user disconnected or unsubscribed, see [`crate::project::users`])
//!   are read by their cursor at every poll, whether or not the change token moved,
//!   and handed to `on_end`, except this process's own (already applied where they
//!   were asked) and those older than [`END_MAX_AGE_S`] (a node that was cut off must
//!   not close connections made since). The first poll only takes the cursor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::cache::KeyCache;
use crate::project::users::{process_origin, END_MAX_AGE_S};
use crate::project::UserEndRecord;
use crate::store::{Store, StoreError, StoreJob};

/// Store jobs waiting for the watcher: the REST user endpoints answer 503 beyond this
/// (each job is one short store call; a backlog longer than this means a stuck store).
pub(crate) const STORE_JOBS: usize = 1024;

/// What the server does with another process's end record.
pub(crate) type OnEnd = Box<dyn Fn(&UserEndRecord) + Send>;

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
    on_end: Option<OnEnd>,
    /// Where the next read of end records starts (`None` until the first poll).
    end_cursor: Option<u64>,
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
            on_end: None,
            end_cursor: None,
        }
    }

    /// Apply other processes' end records with `on_end` (see the module docs).
    pub(crate) fn with_ends(mut self, on_end: OnEnd) -> Watcher {
        self.on_end = Some(on_end);
        self
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
        // End records are read before the snapshot and applied after it: a block is
        // written before its end record, so an end read here has its block in the
        // snapshot loaded next, and a connection closed by it cannot come back in
        // through the old snapshot. The cursor moves only once both worked.
        let ends = match self.on_end {
            Some(_) => Some(self.store.user_ends_after(self.end_cursor)?),
            None => None,
        };
        let token = self.store.change_token()?;
        let changed = self.last_token != Some(token);
        if changed {
            let contents = self.store.load_all()?;
            let _unopened = self.cache.rebuild(contents);
            self.last_token = Some(token);
            (self.on_change)();
        }
        if let Some((ends, next)) = ends {
            self.end_cursor = Some(next);
            self.apply_ends(&ends);
        }
        Ok(changed)
    }

    fn apply_ends(&self, ends: &[UserEndRecord]) {
        let Some(on_end) = &self.on_end else {
            return;
        };
        let oldest = crate::store::unix_now() - END_MAX_AGE_S;
        let origin = process_origin();
        for end in ends
            .iter()
            .filter(|e| e.origin != origin && e.created_at >= oldest)
        {
            on_end(end);
        }
    }

    /// Run [`Watcher::poll`] every `interval` on a new thread until `stop` is set, and
    /// the store jobs sent through `cache` in between.
    pub(crate) fn spawn(
        mut self,
        interval: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        let (tx, jobs) = crossbeam_channel::bounded(STORE_JOBS);
        self.cache.set_store_jobs(tx);
        std::thread::Builder::new()
            .name("ringcast-keys".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    // Errors are logged and reflected in `db_ok` by `poll`.
                    let _ = self.poll();
                    self.run_jobs_until(Instant::now() + interval, &jobs, &stop);
                }
            })
    }

    /// Run store jobs as they come until `deadline` (or `stop`); after a job, poll at
    /// once so its change is in this node's snapshot before its answer is read.
    fn run_jobs_until(&mut self, deadline: Instant, jobs: &Receiver<StoreJob>, stop: &AtomicBool) {
        while let Some(wait) = next_wait(deadline, stop) {
            match jobs.recv_timeout(wait) {
                Ok(job) => {
                    let after = job(&mut *self.store);
                    let _ = self.poll();
                    after();
                }
                Err(RecvTimeoutError::Timeout) => {}
                // The cache (and so every sender) is gone: only polls are left to do.
                Err(RecvTimeoutError::Disconnected) => {
                    sleep_until_stopped(deadline, stop);
                    return;
                }
            }
        }
    }
}

/// Start the watcher thread (see the module docs). Its first poll loads the cache.
pub(crate) fn spawn_watcher(
    store: Box<dyn Store>,
    cache: Arc<KeyCache>,
    interval: Duration,
    on_change: Box<dyn Fn() + Send>,
    on_end: OnEnd,
    db_ok: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    Watcher::new(store, cache, on_change, db_ok)
        .with_ends(on_end)
        .spawn(interval, stop)
}

/// How long to wait before looking at `stop` again: at most [`STOP_POLL`], and `None`
/// once `stop` is set or `deadline` has passed (the waiting is over).
fn next_wait(deadline: Instant, stop: &AtomicBool) -> Option<Duration> {
    if stop.load(Ordering::Acquire) {
        return None;
    }
    let now = Instant::now();
    (now < deadline).then(|| (deadline - now).min(STOP_POLL))
}

fn sleep_until_stopped(deadline: Instant, stop: &AtomicBool) {
    // park_timeout may wake early (spuriously or by unpark); the loop re-checks.
    while let Some(wait) = next_wait(deadline, stop) {
        std::thread::park_timeout(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::{KeyRecord, ProjectChange, ProjectRecord};
    use crate::quota::RateLimit;
    use crate::store::UserStore;
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
        let new = crate::project::NewProject {
            name: "p",
            rate_limit: RateLimit::parse("10/s").unwrap(),
            history: crate::history::HistorySpec::OFF,
        };
        let crate::project::CreatedProject {
            project,
            secret_key: secret,
            public_key: public,
            ..
        } = admin
            .create_project(new, &crate::sealed::MasterKey::random())
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
            Box::new(|_| {}),
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

    /// Each method: fail while switched off, else ask the SQLite store.
    macro_rules! switched {
        ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
            fn $name(&mut self, $($arg: $ty),*) -> Result<$ret, StoreError> {
                self.check()?;
                self.inner.$name($($arg),*)
            }
        )*};
    }

    impl Store for Switchable {
        switched! {
            insert_project(minted: &crate::store::MintedProject) -> u64;
            add_token_secret(record: &crate::project::TokenSecretRecord, grace_s: u64) -> ();
            add_token_key(record: &crate::project::TokenKeyRecord) -> ();
            remove_token_key(id: &str, key_id: &str) -> ();
            list_projects() -> Vec<ProjectRecord>;
            set_project(id: &str, change: &crate::project::ProjectChange) -> ProjectRecord;
            insert_key(record: &KeyRecord) -> ();
            revoke_key(key_or_id: &str) -> String;
            list_keys(id: &str) -> Vec<KeyRecord>;
            load_all() -> StoreContents;
            change_token() -> u64;
            is_empty() -> bool;
        }
    }

    impl crate::store::UserStore for Switchable {
        switched! {
            requires_user(id: &str) -> bool;
            block_user(block: &crate::project::UserBlockRecord, max: usize) -> ();
            unblock_user(id: &str, user: &str) -> bool;
            user_block(id: &str, user: &str) -> Option<crate::project::UserBlockRecord>;
            add_user_end(end: &UserEndRecord) -> ();
            user_ends_after(after: Option<u64>) -> (Vec<UserEndRecord>, u64);
        }
    }

    #[test]
    fn blocks_require_user_ends_and_jobs_reach_the_node() {
        use crate::project::UserBlockRecord;
        let (dir, mut admin, project) = crate::store::test_store_with_project();
        let cache = KeyCache::new();
        let ended = Arc::new(std::sync::Mutex::new(Vec::<UserEndRecord>::new()));
        let seen = Arc::clone(&ended);
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Watcher::new(
            Box::new(SqliteStore::open(dir.path()).unwrap()),
            Arc::clone(&cache),
            Box::new(|| {}),
            Arc::new(AtomicBool::new(true)),
        )
        .with_ends(Box::new(move |e| seen.lock().unwrap().push(e.clone())))
        .spawn(Duration::from_millis(20), Arc::clone(&stop))
        .unwrap();
        wait_for("first load", || cache.load().project(&project.id).is_some());
        let state = Arc::clone(cache.load().project(&project.id).unwrap());
        assert!(!state.user_blocked("u1", 0));
        assert!(!state.requires_user());

        // The CLI's way: straight into the store.
        admin
            .block_user(
                &UserBlockRecord {
                    project_id: project.id.clone(),
                    user_id: "u1".into(),
                    until: Some(crate::store::unix_now() + 60),
                },
                10,
            )
            .unwrap();
        admin
            .set_project(&project.id, &ProjectChange::RequireUser(true))
            .unwrap();
        wait_for("block", || state.user_blocked("u1", 0));
        wait_for("require_user", || state.requires_user());
        let until = crate::store::unix_now() as u64 + 60;
        assert!(!state.user_blocked("u1", until), "over at until");
        assert!(!state.user_blocked("u2", 0));

        // A REST endpoint's way: a job on the watcher's thread; the snapshot has the
        // lift before the job's answer is read back.
        let (tx, rx) = crossbeam_channel::bounded(1);
        let id = project.id.clone();
        assert!(cache
            .store_job(Box::new(move |store| {
                let lifted = store.unblock_user(&id, "u1");
                Box::new(move || {
                    let _ = tx.send(lifted);
                })
            }))
            .is_ok());
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap());
        assert!(
            !state.user_blocked("u1", 0),
            "in the snapshot before the answer"
        );

        // End records: another process's are applied, this one's and old ones are not.
        let end = |user: &str, origin: u64, age: i64| UserEndRecord {
            seq: 0,
            project_id: project.id.clone(),
            user_id: user.into(),
            channel: None,
            origin,
            created_at: crate::store::unix_now() - age,
        };
        admin
            .add_user_end(&end("mine", process_origin(), 0))
            .unwrap();
        admin.add_user_end(&end("old", 0, 60)).unwrap();
        admin.add_user_end(&end("cli", 0, 0)).unwrap();
        wait_for("the CLI's end", || !ended.lock().unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(100));
        let users: Vec<String> = ended
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.user_id.clone())
            .collect();
        assert_eq!(users, ["cli"]);

        stop.store(true, Ordering::Release);
        handle.thread().unpark();
        handle.join().unwrap();
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
    // Another process's block (the block, then its end record, as the REST block and
    // the CLI write them): when its end is applied here (the connections closed), the
    // block is already in this node's snapshot, so a client reconnecting at once is
    // refused.
    #[test]
    fn an_end_is_applied_after_its_block_is_in_the_snapshot() {
        use crate::project::UserBlockRecord;
        let (dir, mut admin, project) = crate::store::test_store_with_project();
        let cache = KeyCache::new();
        let seen = Arc::new(std::sync::Mutex::new(Vec::<bool>::new()));
        let (seen2, cache2, id2) = (Arc::clone(&seen), Arc::clone(&cache), project.id.clone());
        let mut watcher = Watcher::new(
            Box::new(SqliteStore::open(dir.path()).unwrap()),
            Arc::clone(&cache),
            Box::new(|| {}),
            Arc::new(AtomicBool::new(true)),
        )
        .with_ends(Box::new(move |e| {
            let snap = cache2.load();
            let blocked = snap.project(&id2).unwrap().user_blocked(&e.user_id, 0);
            seen2.lock().unwrap().push(blocked);
        }));
        watcher.poll().unwrap();
        admin
            .block_user(
                &UserBlockRecord {
                    project_id: project.id.clone(),
                    user_id: "u1".into(),
                    until: None,
                },
                10,
            )
            .unwrap();
        admin
            .add_user_end(&UserEndRecord {
                seq: 0,
                project_id: project.id.clone(),
                user_id: "u1".into(),
                channel: None,
                origin: 0,
                created_at: crate::store::unix_now(),
            })
            .unwrap();
        watcher.poll().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![true]);
    }
}
