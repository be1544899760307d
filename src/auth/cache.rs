//! The in-memory key snapshot that workers consult on every publish and WebSocket
//! upgrade, and the [`KeyCache`] that swaps in a new one when the store changes.
//!
//! Invariants:
//! - Readers never lock and never wait: [`KeyCache::load`] is an `ArcSwap` load, and a
//!   [`KeySnapshot`] is immutable once published.
//! - Only active keys are in a snapshot; a revoked key is simply absent, so a lookup
//!   cannot mistake it for a valid one.
//! - A project keeps the same [`ProjectState`] (same `Arc`, same `index`, same
//!   [`Quota`] state) across rebuilds for the whole process lifetime: a key change never
//!   resets a project's quota, and channel namespaces (by `index`) never move. Indexes
//!   are dense, handed out in order of first appearance, and never reused.
//! - Rebuilding happens on the control-plane thread, never on a worker.
//! - Token secrets are opened (master key) and public token keys parsed here, at
//!   rebuild, so a worker verifying a token only looks its project's [`TokenKeys`] up.
//! - A project's webhook ([`WebhookTarget`]: URL, event kinds, the `X-Pusher-Key` and
//!   the signing secret) is resolved here too, so the webhook sender looks one index up;
//!   the signing secret is never printed (`Debug` leaves it out).
//! - A project's user blocks ([`ProjectState::user_blocked`]) and `require_user` come
//!   from the store at each rebuild (so every node and process sees a block within the
//!   watcher's interval); a project without blocks holds `None`, and the connect path's
//!   check is then one atomic load.
//! - Every project in a snapshot is found by its Pusher app id too
//!   ([`KeySnapshot::project_by_app_id`]), and it is the same [`ProjectState`] its keys
//!   lead to. An app id never moves to another project (the store never reuses one), so
//!   a project whose app id changed (only a restored or hand-edited store) gets a new
//!   state, like a renamed one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::{ArcSwap, ArcSwapOption, Guard};

use super::prehashed::PrehashedMap;
use super::token::TokenKeys;
use crate::apikey::{hash_key, is_well_formed, KeyHash, KeyKind};
use crate::history::HistoryCell;
use crate::project::{HookKinds, TokenKeyRecord, TokenSecretRecord};
use crate::quota::Quota;
use crate::sealed::MasterKey;
use crate::store::{StoreContents, StoreJob};

/// A project as the data plane sees it.
#[derive(Debug)]
pub struct ProjectState {
    pub id: String,
    pub name: String,
    /// Dense, stable for the process lifetime; namespaces the project's channels.
    pub index: u32,
    pub quota: Quota,
    /// The project's history setting, changed in place by rebuilds (shared by a renamed
    /// project's new state, like `ws_connections`).
    pub history: Arc<HistoryCell>,
    /// WebSocket connections of this project open on this node, across all workers
    /// (for `max_ws_connections_per_project`). Shared by a renamed project's new state.
    pub ws_connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The project's own WebSocket limit per node; [`NODE_DEFAULT`]: the node's
    /// `max_ws_connections_per_project`. Updated in place by a rebuild (`project
    /// set-limits` applies within the watcher's interval).
    pub max_connections: std::sync::atomic::AtomicU64,
    /// Whether clients may send client events on the project's private and presence
    /// channels (`project set-limits --client-events`). Updated in place by a rebuild;
    /// read once per client event, never on the fan-out path.
    pub client_events: std::sync::atomic::AtomicBool,
    /// The project's Pusher app id (`/apps/{app_id}/...`); fixed for this state.
    pub pusher_app_id: u64,
    /// Whether Pusher clients and the Pusher REST API may use the project (`project
    /// set-limits --pusher`). Updated in place by a rebuild, like `client_events`.
    pub pusher: std::sync::atomic::AtomicBool,
    /// Whether a WebSocket of this project needs a valid connection token (`project
    /// set-limits --require-user`). Updated in place by a rebuild, like `client_events`.
    pub require_user: std::sync::atomic::AtomicBool,
    /// The project's user blocks in force at the last rebuild; `None` (the usual case)
    /// when it has none, so [`ProjectState::user_blocked`] costs one atomic load then.
    /// Replaced whole by a rebuild (shared by a renamed project's new state).
    pub(crate) blocks: Arc<ArcSwapOption<UserBlocks>>,
}

/// A project's blocked users: user id → until (unix seconds; `None`: for ever).
pub(crate) type UserBlocks = HashMap<Box<str>, Option<u64>>;

/// `ProjectState::max_connections` when the project has no limit of its own.
pub(crate) const NODE_DEFAULT: u64 = u64::MAX;

impl ProjectState {
    /// The WebSocket limit in force for this project (0 = unlimited).
    pub fn connection_limit(&self, node_default: usize) -> usize {
        match self
            .max_connections
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            NODE_DEFAULT => node_default,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }

    /// Whether `user` is blocked at `now_s` (unix seconds): the connect path's check
    /// for connection tokens, channel tokens and Pusher sign-ins with that `sub`. A
    /// project without blocks answers after one atomic load, allocating nothing.
    pub(crate) fn user_blocked(&self, user: &str, now_s: u64) -> bool {
        let blocks = self.blocks.load();
        let Some(blocks) = blocks.as_ref() else {
            return false;
        };
        match blocks.get(user) {
            Some(None) => true,
            Some(Some(until)) => *until > now_s,
            None => false,
        }
    }

    /// Whether a WebSocket of this project needs a valid connection token now.
    pub fn requires_user(&self) -> bool {
        self.require_user.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the Pusher protocol (WebSocket `/app/{key}` and REST `/apps/{app_id}`)
    /// is on for this project now.
    pub fn pusher_enabled(&self) -> bool {
        self.pusher.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A project's webhook as the sender uses it.
pub struct WebhookTarget {
    pub url: String,
    pub events: HookKinds,
    /// `X-Pusher-Key`: the oldest active public key of the project known whole; `None`
    /// when every active public key predates schema 6 (only hashes were kept).
    pub public_key: Option<String>,
    /// The HMAC key of `X-Pusher-Signature`: the UTF-8 bytes of the project's newest
    /// token secret that opens; `None` when none does.
    pub secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookTarget")
            .field("events", &self.events)
            .field("has_public_key", &self.public_key.is_some())
            .field("has_secret", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

/// What an active key resolves to.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub key_id: String,
    pub kind: KeyKind,
    pub project: Arc<ProjectState>,
}

/// One immutable view of every active key and every project.
#[derive(Debug, Default)]
pub struct KeySnapshot {
    by_hash: PrehashedMap<KeyHash, KeyEntry>,
    active_ids: HashSet<String>,
    projects: HashMap<String, Arc<ProjectState>>,
    /// Project index → what verifies its private-channel tokens.
    tokens: HashMap<u32, Arc<TokenKeys>>,
    /// Project index → its webhook, for the projects that have one.
    webhooks: HashMap<u32, Arc<WebhookTarget>>,
    /// Pusher app id → project (every project of the snapshot).
    by_app_id: HashMap<u64, Arc<ProjectState>>,
    generation: u64,
}

/// Why a key was refused (401). One list for both paths that take a key: a publish
/// (`X-Api-Key`, secret keys only) and a WebSocket upgrade (`?key=`, public keys only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    /// No key, or an empty one, where a key of this kind was needed.
    Missing(KeyKind),
    /// Not UTF-8.
    Malformed,
    /// A key of the other kind, or of neither.
    WrongKind {
        wanted: KeyKind,
        got: Option<KeyKind>,
    },
    /// Well formed, but no active key has it: never issued, or revoked.
    UnknownOrRevoked,
}

impl KeyRefusal {
    /// The human sentence of the 401 answer.
    pub fn message(self) -> &'static str {
        match self {
            KeyRefusal::Missing(KeyKind::Secret) => "the X-Api-Key header is missing",
            KeyRefusal::Missing(KeyKind::Public) => "the key query parameter is missing",
            KeyRefusal::Malformed => "the API key is not valid",
            KeyRefusal::WrongKind {
                wanted: KeyKind::Secret,
                got: Some(KeyKind::Public),
            } => "a public key cannot publish; use the project's secret key",
            KeyRefusal::WrongKind {
                wanted: KeyKind::Secret,
                ..
            } => "the API key is not a secret key (sk_...)",
            KeyRefusal::WrongKind {
                wanted: KeyKind::Public,
                ..
            } => "WebSocket connections need a public key (pk_...)",
            KeyRefusal::UnknownOrRevoked => "the API key is unknown or revoked",
        }
    }
}

impl KeySnapshot {
    /// The one key check of the data plane: `raw` (as the client sent it) must be an
    /// active key of kind `wanted`. The kind is decided from the prefix before any
    /// hashing, so a key of the wrong kind costs no lookup.
    pub fn authenticate(
        &self,
        raw: Option<&[u8]>,
        wanted: KeyKind,
    ) -> Result<&KeyEntry, KeyRefusal> {
        let raw = raw
            .filter(|r| !r.is_empty())
            .ok_or(KeyRefusal::Missing(wanted))?;
        let key = std::str::from_utf8(raw).map_err(|_| KeyRefusal::Malformed)?;
        let got = KeyKind::of_key(key);
        if got != Some(wanted) {
            return Err(KeyRefusal::WrongKind { wanted, got });
        }
        match self.lookup(key) {
            Some(entry) if entry.kind == wanted => Ok(entry),
            _ => Err(KeyRefusal::UnknownOrRevoked),
        }
    }

    /// The active key `key`, if any. Malformed input is refused before hashing.
    pub fn lookup(&self, key: &str) -> Option<&KeyEntry> {
        if !is_well_formed(key) {
            return None;
        }
        self.by_hash.get(&hash_key(key))
    }

    /// Lookup by an already computed hash.
    pub fn lookup_hash(&self, hash: &KeyHash) -> Option<&KeyEntry> {
        self.by_hash.get(hash)
    }

    /// True while the key with this id exists and is not revoked. Workers use it after
    /// a change to find connections whose key was revoked.
    pub fn is_active(&self, key_id: &str) -> bool {
        self.active_ids.contains(key_id)
    }

    /// Increases by one on every rebuild; 0 is the empty snapshot before the first load.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn project(&self, project_id: &str) -> Option<&Arc<ProjectState>> {
        self.projects.get(project_id)
    }

    pub fn projects(&self) -> impl Iterator<Item = &Arc<ProjectState>> {
        self.projects.values()
    }

    /// The project whose Pusher app id is `app_id` (the `{app_id}` of a Pusher REST
    /// path), whether or not its Pusher switch is on: the same handle a key lookup gives
    /// ([`KeyEntry::project`]). `None` for an unknown id.
    pub fn project_by_app_id(&self, app_id: u64) -> Option<&Arc<ProjectState>> {
        self.by_app_id.get(&app_id)
    }

    /// What verifies the tokens of the project with this index (`None`: it has neither
    /// a token secret nor a token key).
    pub fn token_keys(&self, project_index: u32) -> Option<&TokenKeys> {
        self.tokens.get(&project_index).map(|t| &**t)
    }

    /// The webhook of the project with this index, if it has one.
    pub fn webhook(&self, project_index: u32) -> Option<&Arc<WebhookTarget>> {
        self.webhooks.get(&project_index)
    }

    /// Number of active keys.
    pub fn active_keys(&self) -> usize {
        self.by_hash.len()
    }
}

/// What [`KeyCache::token_keys`] makes: each project's verifiers (by index), each
/// project's newest opened secret in clear, and how many secrets did not open.
type OpenedTokens = (HashMap<u32, Arc<TokenKeys>>, HashMap<u32, Vec<u8>>, usize);

/// Where the next snapshot is built from. Behind a mutex because two concurrent
/// rebuilds must not hand out the same index; only the control plane takes it.
#[derive(Debug, Default)]
struct RebuildState {
    next_index: u32,
    generation: u64,
    /// Every project ever seen, so one that vanishes and returns keeps its state.
    known: HashMap<String, Arc<ProjectState>>,
}

/// The shared holder of the current [`KeySnapshot`].
#[derive(Debug)]
pub struct KeyCache {
    current: ArcSwap<KeySnapshot>,
    rebuild: Mutex<RebuildState>,
    /// Opens the stored token secrets; without it no token secret verifies.
    master: Option<MasterKey>,
    /// The door to the watcher's thread, which owns a store connection (set when the
    /// watcher starts; see [`KeyCache::store_job`]).
    store_jobs: OnceLock<crossbeam_channel::Sender<StoreJob>>,
}

impl KeyCache {
    /// An empty cache (no keys accepted until the first [`KeyCache::rebuild`]).
    pub fn new() -> Arc<KeyCache> {
        Arc::new(KeyCache {
            current: ArcSwap::from_pointee(KeySnapshot::default()),
            rebuild: Mutex::new(RebuildState::default()),
            master: None,
            store_jobs: OnceLock::new(),
        })
    }

    /// An empty cache that opens token secrets with `master`.
    pub(crate) fn with_master(master: MasterKey) -> Arc<KeyCache> {
        Arc::new(KeyCache {
            current: ArcSwap::from_pointee(KeySnapshot::default()),
            rebuild: Mutex::new(RebuildState::default()),
            master: Some(master),
            store_jobs: OnceLock::new(),
        })
    }

    /// Where the watcher takes store jobs (once; a second watcher's door is ignored).
    pub(crate) fn set_store_jobs(&self, tx: crossbeam_channel::Sender<StoreJob>) {
        let _ = self.store_jobs.set(tx);
    }

    /// Hand `job` to the watcher's thread, which runs it on its store connection (a
    /// worker never touches the store). `Err(job)` when no watcher runs or its queue
    /// is full: the caller answers 503. Never blocks.
    pub(crate) fn store_job(&self, job: StoreJob) -> Result<(), StoreJob> {
        match self.store_jobs.get() {
            Some(tx) => tx.try_send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        }
    }

    /// The current snapshot. Cheap and lock-free; hold the guard only briefly (for one
    /// request), so an old snapshot is freed soon after a swap.
    pub fn load(&self) -> Guard<Arc<KeySnapshot>> {
        self.current.load()
    }

    /// The current snapshot as an owned `Arc`, for holders that outlive a request.
    pub fn load_full(&self) -> Arc<KeySnapshot> {
        self.current.load_full()
    }

    /// Publish a snapshot of `contents`, reusing every known project's state and
    /// applying changed rate limits to it in place.
    /// Returns how many stored token secrets did not open with the master key (a wrong
    /// `master_key_file`); they verify nothing.
    pub fn rebuild(&self, contents: StoreContents) -> usize {
        // A poisoned lock only means a previous rebuild panicked midway; the state it
        // guards is still coherent (indexes only grow), so carry on.
        let mut state = self.rebuild.lock().unwrap_or_else(PoisonError::into_inner);
        let mut projects = HashMap::with_capacity(contents.projects.len());
        let mut hooks = Vec::new();
        let mut blocks = group_blocks(contents.user_blocks);
        for record in contents.projects {
            let require_user = contents.require_user.contains(&record.id);
            if let Some(spec) = &record.webhook {
                hooks.push((record.id.clone(), spec.clone()));
            }
            let project = match state.known.get(&record.id) {
                Some(existing)
                    if existing.name == record.name
                        && existing.pusher_app_id == record.pusher_app_id =>
                {
                    if existing.quota.limit() != record.rate_limit {
                        existing.quota.set_limit(record.rate_limit);
                    }
                    existing.history.set(record.history);
                    existing.max_connections.store(
                        record.max_connections.unwrap_or(NODE_DEFAULT),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    existing
                        .client_events
                        .store(record.client_events, std::sync::atomic::Ordering::Relaxed);
                    existing
                        .pusher
                        .store(record.pusher, std::sync::atomic::Ordering::Relaxed);
                    existing
                        .require_user
                        .store(require_user, std::sync::atomic::Ordering::Relaxed);
                    Arc::clone(existing)
                }
                Some(existing) => {
                    // Renamed (or renumbered): `name` and `pusher_app_id` are immutable
                    // in a shared struct, so make a new one that carries over the index
                    // and the quota's position.
                    let replacement = Arc::new(ProjectState {
                        id: record.id.clone(),
                        name: record.name,
                        index: existing.index,
                        quota: existing.quota.clone_state(),
                        history: Arc::clone(&existing.history),
                        ws_connections: Arc::clone(&existing.ws_connections),
                        max_connections: record.max_connections.unwrap_or(NODE_DEFAULT).into(),
                        client_events: record.client_events.into(),
                        pusher_app_id: record.pusher_app_id,
                        pusher: record.pusher.into(),
                        require_user: require_user.into(),
                        blocks: Arc::clone(&existing.blocks),
                    });
                    replacement.history.set(record.history);
                    replacement.quota.set_limit(record.rate_limit);
                    replacement
                }
                None => {
                    let index = state.next_index;
                    // 4 billion projects in one process is not a real concern.
                    state.next_index = state.next_index.saturating_add(1);
                    Arc::new(ProjectState {
                        id: record.id.clone(),
                        name: record.name,
                        index,
                        quota: Quota::new(record.rate_limit),
                        history: Arc::new(HistoryCell::new(record.history)),
                        ws_connections: Arc::default(),
                        max_connections: record.max_connections.unwrap_or(NODE_DEFAULT).into(),
                        client_events: record.client_events.into(),
                        pusher_app_id: record.pusher_app_id,
                        pusher: record.pusher.into(),
                        require_user: require_user.into(),
                        blocks: Arc::default(),
                    })
                }
            };
            // Swapped only when it changed from or to "none", or has blocks: a project
            // that never had any is never touched.
            let mine = blocks.remove(&record.id).map(Arc::new);
            if mine.is_some() || project.blocks.load().is_some() {
                project.blocks.store(mine);
            }
            state.known.insert(record.id.clone(), Arc::clone(&project));
            projects.insert(record.id, project);
        }

        let (tokens, mut newest_secret, unopened) =
            self.token_keys(&contents.token_secrets, &contents.token_keys, &projects);
        let mut oldest_public: HashMap<u32, String> = HashMap::new();
        let mut by_hash = PrehashedMap::default();
        by_hash.reserve(contents.keys.len());
        let mut active_ids = HashSet::with_capacity(contents.keys.len());
        for key in contents.keys {
            if key.revoked {
                continue;
            }
            // A key whose project is not in this read cannot authorise anything.
            let Some(project) = projects.get(&key.project_id) else {
                continue;
            };
            active_ids.insert(key.id.clone());
            if let Some(public) = &key.public_key {
                // Keys come oldest first: the first one seen stays.
                oldest_public
                    .entry(project.index)
                    .or_insert_with(|| public.clone());
            }
            by_hash.insert(
                key.hash,
                KeyEntry {
                    key_id: key.id,
                    kind: key.kind,
                    project: Arc::clone(project),
                },
            );
        }

        let webhooks = hooks
            .into_iter()
            .filter_map(|(id, spec)| {
                let index = projects.get(&id)?.index;
                let target = WebhookTarget {
                    url: spec.url,
                    events: spec.events,
                    public_key: oldest_public.remove(&index),
                    secret: newest_secret.remove(&index),
                };
                Some((index, Arc::new(target)))
            })
            .collect();

        let by_app_id = index_app_ids(&projects);

        state.generation += 1;
        self.current.store(Arc::new(KeySnapshot {
            by_hash,
            active_ids,
            projects,
            tokens,
            webhooks,
            by_app_id,
            generation: state.generation,
        }));
        unopened
    }

    /// Each project's token verifiers: secrets opened with the master key (those past
    /// their rotation deadline left out), public keys parsed; and each project's newest
    /// opened secret in clear (the webhook signing key).
    fn token_keys(
        &self,
        secrets: &[TokenSecretRecord],
        token_keys: &[TokenKeyRecord],
        projects: &HashMap<String, Arc<ProjectState>>,
    ) -> OpenedTokens {
        let now = crate::store::unix_now();
        let mut building: HashMap<u32, TokenKeys> = HashMap::new();
        let mut newest: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut unopened = 0;
        for secret in secrets {
            let Some(project) = projects.get(&secret.project_id) else {
                continue;
            };
            if secret.expires_at.is_some_and(|until| until <= now) {
                continue;
            }
            let opened = self
                .master
                .as_ref()
                .and_then(|m| m.open(&secret.project_id, &secret.sealed).ok());
            let Some(clear) = opened else {
                unopened += 1;
                continue;
            };
            let until = secret.expires_at.map(|t| t.max(0) as u64);
            building
                .entry(project.index)
                .or_default()
                .add_secret(&clear, until);
            // Secrets come oldest first, so the last one that opens is the newest.
            newest.insert(project.index, clear);
        }
        for key in token_keys {
            if let Some(project) = projects.get(&key.project_id) {
                building.entry(project.index).or_default().add_key(
                    &key.id,
                    key.alg,
                    &key.public_pem,
                );
            }
        }
        if unopened > 0 {
            tracing::error!(
                count = unopened,
                "token secrets do not open with this master key: private-channel tokens signed with them are refused"
            );
        }
        let tokens = building
            .into_iter()
            .map(|(index, mut keys)| {
                keys.finish();
                (index, Arc::new(keys))
            })
            .collect();
        (tokens, newest, unopened)
    }
}

/// The blocks of a store read, by project id.
fn group_blocks(records: Vec<crate::project::UserBlockRecord>) -> HashMap<String, UserBlocks> {
    let mut by_project: HashMap<String, UserBlocks> = HashMap::new();
    for b in records {
        let until = b.until.map(|t| t.max(0) as u64);
        by_project
            .entry(b.project_id)
            .or_default()
            .insert(b.user_id.into_boxed_str(), until);
    }
    by_project
}

/// Pusher app id → project. Stores never give one id to two projects; should a
/// hand-edited one do it anyway, the older project (lower index) keeps the id, so the
/// answer does not depend on hash order, and the clash is logged.
fn index_app_ids(projects: &HashMap<String, Arc<ProjectState>>) -> HashMap<u64, Arc<ProjectState>> {
    use std::collections::hash_map::Entry;
    let mut by_app_id: HashMap<u64, Arc<ProjectState>> = HashMap::with_capacity(projects.len());
    for project in projects.values() {
        match by_app_id.entry(project.pusher_app_id) {
            Entry::Vacant(slot) => {
                slot.insert(Arc::clone(project));
            }
            Entry::Occupied(mut slot) => {
                tracing::error!(
                    app_id = project.pusher_app_id,
                    first = %slot.get().id,
                    second = %project.id,
                    "two projects have the same Pusher app id; the older keeps it"
                );
                if project.index < slot.get().index {
                    slot.insert(Arc::clone(project));
                }
            }
        }
    }
    by_app_id
}

/// Project index → project, for the snapshot generation it was built from.
pub(crate) struct ProjectIndex {
    generation: u64,
    by_index: HashMap<u32, Arc<ProjectState>>,
}

impl ProjectIndex {
    pub(crate) fn new() -> ProjectIndex {
        ProjectIndex {
            generation: u64::MAX,
            by_index: HashMap::new(),
        }
    }

    pub(crate) fn get(&mut self, keys: &KeyCache, index: u32) -> Option<&Arc<ProjectState>> {
        let snapshot = keys.load();
        if snapshot.generation() != self.generation || !self.by_index.contains_key(&index) {
            self.generation = snapshot.generation();
            self.by_index = snapshot
                .projects()
                .map(|p| (p.index, Arc::clone(p)))
                .collect();
        }
        self.by_index.get(&index)
    }
}

#[cfg(test)]
mod tests;
