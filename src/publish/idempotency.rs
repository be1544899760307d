//! Idempotent publish on a single node: which requests with an `Idempotency-Key` were
//! seen, their body's hash and, once accepted, their answer, so that a retry is answered
//! again instead of being published again (contract 1.3, "Idempotent publish").
//!
//! Ownership, not locks: every key has one owner worker, picked by a hash of (project,
//! key); its entry lives in that worker's thread-local [`Store`] and only that thread
//! ever touches it. A keyed publish that arrives on its owner worker claims the key
//! with a function call; one that arrives elsewhere sends the claim to the owner as an
//! [`Envelope::Run`] (the mailbox, the one cross-core path) and waits for the
//! [`Reply`] without blocking its worker. Completing or releasing a claim is a
//! fire-and-forget envelope the same way. No lock is taken, and a publish without the
//! header never comes here.
//!
//! Lifecycle of an entry: `claim` makes it [`State::InFlight`] (a second claim of the
//! same key answers [`Claim::InProgress`], or [`Claim::Reused`] for another body);
//! `complete` stores the answer ([`State::Done`]; a claim with the same body answers
//! [`Claim::Replay`]); `release` (the request was refused: 4xx, 429, 503) forgets it,
//! so the retry is processed. Every claim carries a token unique on the node, and
//! `complete`/`release` act only on the entry with that token: a late message of an
//! older claim never touches a newer one.
//!
//! Bounds: an entry lives `idempotency_window_s` from its claim. Each project's entries
//! on a worker sit in a FIFO by claim time; since the window is the same for all, the
//! expired ones are at its front, so expiry pops fronts, never scans (on each claim, the
//! claimed project and one other project in turn). A worker keeps at most its share of
//! `idempotency_max_keys_per_project` per project (the bound split evenly over the
//! workers, at least 1): over it the oldest entry goes first, counted in
//! `ringcast_idempotency_keys_evicted_total`. An entry holds a 128-bit keyed hash of
//! (project, key) ([`KeyId`]: two SipHash-1-3 values under keys drawn once per process;
//! two different keys collide with probability about 2^-128), a SHA-256 of the body
//! (never the body, nor the key) and the answer's body (an id or a list of ids). The
//! same hash picks the owner worker, so the key is hashed once per request.

use std::cell::RefCell;
use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::auth::prehashed::PrehashedMap;
use crate::reply::{reply, Reply, Unreachable};
use crate::shard::mailbox::{Envelope, Mailboxes, Task};

/// Longest key, in characters (all ASCII, so bytes).
pub(crate) const MAX_KEY_LEN: usize = 255;

/// Whether `key` is a valid `Idempotency-Key`: 1 to 255 printable ASCII characters
/// (space included, as in `isprint`).
pub(crate) fn valid_key(key: &[u8]) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.iter().all(|&b| (0x20..=0x7e).contains(&b))
}

/// SHA-256 of a request body: what "the same body bytes" compares.
pub(crate) fn body_hash(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

/// Who a key is: a 128-bit keyed hash of (project, key).
pub(crate) type KeyId = u128;

/// The [`KeyId`] of `key` of project `project`: the same on every worker of the process.
pub(crate) fn key_id(project: u32, key: &[u8]) -> KeyId {
    static SEEDS: OnceLock<(RandomState, RandomState)> = OnceLock::new();
    let (a, b) = SEEDS.get_or_init(|| (RandomState::new(), RandomState::new()));
    let hash = |s: &RandomState| {
        let mut h = s.build_hasher();
        h.write_u32(project);
        h.write(key);
        h.finish()
    };
    (u128::from(hash(a)) << 64) | u128::from(hash(b))
}

/// The worker that owns key `id`.
pub(crate) fn owner(id: KeyId, workers: usize) -> usize {
    ((id >> 64) as u64 % workers.max(1) as u64) as usize
}

/// A [`KeyId`] is already a uniform hash: the map uses its low bits as they are.
type IdMap<V> = PrehashedMap<KeyId, V>;

/// A remembered answer: its status and body, exactly as first written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub status: u16,
    pub body: Bytes,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The key is this request's now: process it, then complete or release it.
    Fresh,
    /// Accepted before with the same body: answer this again, publish nothing.
    Replay(Stored),
    /// Known with another body (422).
    Reused,
    /// The first request with the key is still being processed (409).
    InProgress,
}

/// The limits of one node's stores.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub window: Duration,
    /// Most keys per project on one worker.
    pub share: usize,
}

impl Limits {
    /// The window and this worker's share of the per-project bound.
    pub(crate) fn new(window_s: u64, max_per_project: usize, workers: usize) -> Limits {
        Limits {
            window: Duration::from_secs(window_s),
            share: (max_per_project / workers.max(1)).max(1),
        }
    }
}

#[derive(Debug)]
enum State {
    InFlight,
    Done(Stored),
}

#[derive(Debug)]
struct Slot {
    token: u64,
    hash: [u8; 32],
    state: State,
}

/// One project's keys on one worker.
#[derive(Debug, Default)]
struct Keys {
    map: IdMap<Slot>,
    /// Claim time, key, token; oldest first. An entry whose token no longer matches
    /// the map's (released, or claimed again) is skipped when it reaches the front.
    order: VecDeque<(Instant, KeyId, u64)>,
}

impl Keys {
    /// Pop the front while it is expired (a stale front, released before, waits for its
    /// expiry or an eviction: no map lookup while the front is young).
    fn expire(&mut self, now: Instant, window: Duration) {
        while let Some(&(at, id, token)) = self.order.front() {
            if now.saturating_duration_since(at) < window {
                break;
            }
            self.remove_if(id, token);
            self.order.pop_front();
        }
    }

    /// Remove `id`'s entry if it is still claim `token`'s; whether it was.
    fn remove_if(&mut self, id: KeyId, token: u64) -> bool {
        match self.map.entry(id) {
            Entry::Occupied(e) if e.get().token == token => {
                e.remove();
                true
            }
            _ => false,
        }
    }

    /// Forget the oldest live entries until at most `share` remain; returns how many.
    fn evict(&mut self, share: usize) -> u64 {
        let mut evicted = 0;
        while self.map.len() > share {
            let Some((_, id, token)) = self.order.pop_front() else {
                break;
            };
            evicted += u64::from(self.remove_if(id, token));
        }
        // Stale FIFO entries (released claims) are dropped at the front; a flood of
        // refused keyed requests could leave many behind a live one: compact then.
        if self.order.len() > 2 * share + 16 {
            let map = &self.map;
            self.order
                .retain(|(_, id, t)| map.get(id).is_some_and(|s| s.token == *t));
        }
        evicted
    }
}

/// One worker's entries, all projects.
#[derive(Debug, Default)]
pub(crate) struct Store {
    projects: HashMap<u32, Keys>,
    /// The projects of `projects`, for the round-robin sweep (no map walk).
    ring: Vec<u32>,
    /// Round-robin position of the idle-project sweep in `ring`.
    sweep: usize,
}

impl Store {
    /// Claim key `id` of `project` for a request whose body hashes to `hash`.
    pub(crate) fn claim(
        &mut self,
        project: u32,
        id: KeyId,
        hash: [u8; 32],
        token: u64,
        now: Instant,
        limits: Limits,
    ) -> Claim {
        self.sweep_one(project, now, limits.window);
        let keys = match self.projects.entry(project) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.ring.push(project);
                e.insert(Keys::default())
            }
        };
        keys.expire(now, limits.window);
        match keys.map.entry(id) {
            Entry::Occupied(e) => {
                let slot = e.get();
                return if slot.hash != hash {
                    Claim::Reused
                } else {
                    match &slot.state {
                        State::InFlight => Claim::InProgress,
                        State::Done(stored) => Claim::Replay(stored.clone()),
                    }
                };
            }
            Entry::Vacant(e) => {
                e.insert(Slot {
                    token,
                    hash,
                    state: State::InFlight,
                });
            }
        }
        keys.order.push_back((now, id, token));
        let evicted = keys.evict(limits.share);
        if evicted > 0 {
            crate::metrics::with(|m| m.idempotency_keys_evicted(evicted));
        }
        Claim::Fresh
    }

    /// The claim `token` was accepted: remember its answer.
    pub(crate) fn complete(&mut self, project: u32, id: KeyId, token: u64, stored: Stored) {
        let slot = self
            .projects
            .get_mut(&project)
            .and_then(|k| k.map.get_mut(&id));
        if let Some(slot) = slot.filter(|s| s.token == token) {
            slot.state = State::Done(stored);
        }
    }

    /// The claim `token` was refused: forget it, the key is free.
    pub(crate) fn release(&mut self, project: u32, id: KeyId, token: u64) {
        if let Some(keys) = self.projects.get_mut(&project) {
            keys.remove_if(id, token);
        }
    }

    /// Expire one project other than `skip` in turn (projects with nothing left are
    /// dropped), so idle projects give their memory back without a scan.
    fn sweep_one(&mut self, skip: u32, now: Instant, window: Duration) {
        if self.ring.len() < 2 {
            return;
        }
        self.sweep = (self.sweep + 1) % self.ring.len();
        let project = self.ring[self.sweep];
        if project == skip {
            return;
        }
        let empty = self.projects.get_mut(&project).is_none_or(|keys| {
            keys.expire(now, window);
            keys.map.is_empty()
        });
        if empty {
            self.projects.remove(&project);
            self.ring.swap_remove(self.sweep);
        }
    }

    /// Live entries of `project` (tests).
    #[cfg(test)]
    fn len(&self, project: u32) -> usize {
        self.projects.get(&project).map_or(0, |k| k.map.len())
    }
}

thread_local! {
    /// This worker's entries (only the owner thread ever touches them).
    static STORE: RefCell<Store> = RefCell::new(Store::default());
}

fn with_store<R>(f: impl FnOnce(&mut Store) -> R) -> R {
    STORE.with(|s| f(&mut s.borrow_mut()))
}

/// Tokens unique on the node: the claiming worker in the top 16 bits.
fn next_token(worker: usize) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // One counter for the node is simplest and only keyed publishes touch it; the
    // worker bits keep tokens distinct even if it wrapped.
    ((worker as u64) << 48) | (NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << 48) - 1))
}

/// A claim made by one request: how to complete or release it on its owner. Dropped
/// without either (the connection went away while the claim was being answered), it
/// releases the key.
pub(crate) struct Ticket {
    mailboxes: Mailboxes,
    here: usize,
    owner: usize,
    project: u32,
    id: KeyId,
    token: u64,
    done: bool,
}

impl Ticket {
    /// Run `f` on the owner's store: here directly, elsewhere through its mailbox.
    fn on_owner(&self, f: impl FnOnce(&mut Store) + Send + 'static) {
        if self.owner == self.here {
            with_store(f);
        } else {
            let task = Task(Box::new(move || with_store(f)));
            self.mailboxes.control_to(self.owner, Envelope::Run(task));
        }
    }

    /// The request was accepted with this answer.
    pub(crate) fn complete(mut self, stored: Stored) {
        self.done = true;
        let (project, id, token) = (self.project, self.id, self.token);
        self.on_owner(move |s| s.complete(project, id, token, stored));
    }

    /// The claim did not take the key (a replay, 409 or 422): nothing to undo.
    pub(crate) fn forget(mut self) {
        self.done = true;
    }

    /// The request was refused: the key is free again.
    pub(crate) fn release(mut self) {
        self.done = true;
        self.release_now();
    }

    fn release_now(&mut self) {
        let (project, id, token) = (self.project, self.id, self.token);
        self.on_owner(move |s| s.release(project, id, token));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.release_now();
        }
    }
}

/// A claim being answered: now (the key is this worker's), or by its owner.
pub(crate) enum Pending {
    Now(Claim, Ticket),
    Owner(Reply<Result<Claim, Unreachable>>, Ticket),
}

impl Pending {
    /// The claim's answer (an owner that cannot answer counts as in progress: the
    /// client retries).
    pub(crate) async fn wait(self) -> (Claim, Ticket) {
        match self {
            Pending::Now(c, t) => (c, t),
            Pending::Owner(r, t) => (r.wait().await.unwrap_or(Claim::InProgress), t),
        }
    }
}

/// Claim `key` of `project` for a body hashing to `hash`, from worker `here`.
pub(crate) fn claim(
    mailboxes: &Mailboxes,
    here: usize,
    limits: Limits,
    project: u32,
    key: &[u8],
    hash: [u8; 32],
) -> Pending {
    let id = key_id(project, key);
    let owner = owner(id, mailboxes.workers());
    let token = next_token(here);
    let ticket = Ticket {
        mailboxes: mailboxes.clone(),
        here,
        owner,
        project,
        id,
        token,
        done: false,
    };
    let now = Instant::now();
    if owner == here {
        let c = with_store(|s| s.claim(project, id, hash, token, now, limits));
        return Pending::Now(c, ticket);
    }
    let (tx, rx) = reply();
    let task = Task(Box::new(move || {
        let c = with_store(|s| s.claim(project, id, hash, token, now, limits));
        tx.send(Ok(c));
    }));
    mailboxes.control_to(owner, Envelope::Run(task));
    Pending::Owner(rx, ticket)
}

/// Run the claim/complete cycle of one key on the current thread's store (benches).
#[cfg(feature = "bench")]
pub fn bench_cycle(project: u32, key: &[u8], body: &[u8], window_s: u64, max: usize) -> bool {
    let limits = Limits::new(window_s, max, 1);
    let token = next_token(0);
    let hash = body_hash(body);
    let id = key_id(project, key);
    with_store(|s| {
        let fresh = s.claim(project, id, hash, token, Instant::now(), limits) == Claim::Fresh;
        s.complete(
            project,
            id,
            token,
            Stored {
                status: 202,
                body: Bytes::from_static(b"{\"id\":\"0123456789abcdef0123\"}"),
            },
        );
        fresh
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(share: usize) -> Limits {
        Limits {
            window: Duration::from_secs(10),
            share,
        }
    }

    fn stored(body: &'static str) -> Stored {
        Stored {
            status: 202,
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    /// An empty store, the time it starts at, and a body's hash.
    fn start() -> (Store, Instant, [u8; 32]) {
        (Store::default(), Instant::now(), body_hash(b"b"))
    }

    /// `s.claim` of project `p`'s key `key` under a share of `share` keys.
    fn claim(
        s: &mut Store,
        p: u32,
        key: &[u8],
        hash: [u8; 32],
        token: u64,
        now: Instant,
        share: usize,
    ) -> Claim {
        s.claim(p, key_id(p, key), hash, token, now, limits(share))
    }

    #[test]
    fn keys_are_validated() {
        assert!(valid_key(b"a"));
        assert!(valid_key(b"order 42/retry-1"));
        assert!(valid_key(&[b'x'; 255]));
        assert!(!valid_key(b""));
        assert!(!valid_key(&[b'x'; 256]));
        assert!(!valid_key(b"tab\there"));
        assert!(!valid_key("é".as_bytes()));
        assert!(!valid_key(b"del\x7f"));
    }

    #[test]
    fn claim_complete_replay_reuse_release() {
        let mut s = Store::default();
        let t0 = Instant::now();
        let (h1, h2) = (body_hash(b"one"), body_hash(b"two"));
        assert_eq!(claim(&mut s, 1, b"k", h1, 1, t0, 10), Claim::Fresh);
        assert_eq!(claim(&mut s, 1, b"k", h1, 2, t0, 10), Claim::InProgress);
        assert_eq!(claim(&mut s, 1, b"k", h2, 3, t0, 10), Claim::Reused);
        // Another project's key of the same name is another key.
        assert_eq!(claim(&mut s, 2, b"k", h2, 4, t0, 10), Claim::Fresh);
        // A late message of another claim changes nothing.
        s.complete(1, key_id(1, b"k"), 2, stored("wrong"));
        s.complete(1, key_id(1, b"k"), 1, stored("{\"id\":\"a\"}"));
        assert_eq!(
            claim(&mut s, 1, b"k", h1, 5, t0, 10),
            Claim::Replay(stored("{\"id\":\"a\"}"))
        );
        s.release(2, key_id(2, b"k"), 99);
        assert_eq!(claim(&mut s, 2, b"k", h2, 6, t0, 10), Claim::InProgress);
        s.release(2, key_id(2, b"k"), 4);
        assert_eq!(claim(&mut s, 2, b"k", h1, 7, t0, 10), Claim::Fresh);
    }

    #[test]
    fn entries_expire_after_the_window_by_popping_the_front() {
        let (mut s, t0, h) = start();
        assert_eq!(claim(&mut s, 1, b"a", h, 1, t0, 10), Claim::Fresh);
        s.complete(1, key_id(1, b"a"), 1, stored("x"));
        let later = t0 + Duration::from_secs(5);
        assert_eq!(claim(&mut s, 1, b"b", h, 2, later, 10), Claim::Fresh);
        let after = t0 + Duration::from_secs(10);
        // `a` is past its window, `b` is not.
        assert_eq!(claim(&mut s, 1, b"a", h, 3, after, 10), Claim::Fresh);
        assert_eq!(claim(&mut s, 1, b"b", h, 4, after, 10), Claim::InProgress);
        assert_eq!(s.len(1), 2);
    }

    #[test]
    fn over_the_share_the_oldest_goes_first() {
        let (mut s, t0, h) = start();
        for i in 0..5u64 {
            let key = format!("k{i}");
            assert_eq!(claim(&mut s, 1, key.as_bytes(), h, i, t0, 3), Claim::Fresh);
            s.complete(1, key_id(1, key.as_bytes()), i, stored("x"));
        }
        assert_eq!(s.len(1), 3);
        assert_eq!(claim(&mut s, 1, b"k0", h, 10, t0, 3), Claim::Fresh);
        assert!(matches!(
            claim(&mut s, 1, b"k4", h, 11, t0, 3),
            Claim::Replay(_)
        ));
    }

    #[test]
    fn released_claims_do_not_grow_the_fifo_without_bound() {
        let (mut s, t0, h) = start();
        for i in 0..10_000u64 {
            assert_eq!(claim(&mut s, 1, b"same", h, i, t0, 4), Claim::Fresh);
            s.release(1, key_id(1, b"same"), i);
        }
        assert!(s.projects[&1].order.len() <= 2 * 4 + 16 + 1);
    }

    #[test]
    fn owners_spread_and_agree() {
        let a = owner(key_id(3, b"key-1"), 4);
        assert_eq!(a, owner(key_id(3, b"key-1"), 4));
        let seen: std::collections::HashSet<usize> = (0..64)
            .map(|i| owner(key_id(3, format!("k{i}").as_bytes()), 4))
            .collect();
        assert_eq!(seen.len(), 4);
        assert_eq!(owner(key_id(3, b"x"), 1), 0);
        assert_ne!(key_id(3, b"x"), key_id(4, b"x"), "keys are per project");
    }

    #[test]
    fn idle_projects_are_swept_without_being_claimed() {
        let (mut s, t0, h) = start();
        assert_eq!(claim(&mut s, 1, b"a", h, 1, t0, 10), Claim::Fresh);
        let after = t0 + Duration::from_secs(11);
        for i in 0..4 {
            claim(&mut s, 2, format!("k{i}").as_bytes(), h, 10 + i, after, 10);
        }
        assert!(!s.projects.contains_key(&1));
    }
}
