//! Channel history on one node: for projects that turn it on, the last `size` messages
//! of each channel (each kept at most `ttl`), their offsets and the channel's epoch.
//!
//! Where offsets are assigned: in exactly one place, [`History`]'s lock. A publish of a
//! history project takes it, gives each of its channels the next offset, encodes the
//! frame with that position, hands the frame to the mailboxes and, once they accepted
//! it, records it, all before releasing it (a publish the mailboxes refuse leaves no
//! trace). Every mailbox therefore receives a channel's frames in offset order, and
//! every subscriber on every core sees the same order. A subscribe to such a channel
//! takes the same lock only to move its worker's queued envelopes out of the mailbox,
//! mark the channel as wanted by the worker and read the channel's position (and, for a
//! recovery, the missed frames); after releasing it the worker fans the moved envelopes
//! out and then registers the subscriber: frames at or below that position were
//! delivered (or not, to this subscriber) before it joined, frames above it wait in the
//! mailbox and reach it live, so a replay and the live stream meet with no gap and no
//! duplicate.
//!
//! Reads never make a log: a channel this node keeps nothing of answers offset 0 under
//! the epoch its first message will adopt ([`Epoch::fresh`]), so subscribes and REST
//! reads of arbitrary names cost no memory.
//!
//! Why one node-wide lock and not an owner core per channel: the owner-core design adds
//! a cross-core hop (and a wake-up) to every history publish and a second one to every
//! recovery; the lock costs one uncontended acquire per history publish (about 20 ns),
//! is held for an encode and a mailbox push, and keeps the per-node memory budget exact
//! (one accounting, one eviction order). Projects without history never touch it: their
//! publish path reads one relaxed atomic ([`HistoryCell`]) and goes on as before.
//!
//! Memory: each channel keeps at most `size` entries, none older than `ttl` (dropped
//! lazily on every append and read, and by [`History::sweep`] once a second for idle
//! channels, which also forgets channels with nothing kept and idle for twice the TTL).
//! Across all channels of all projects the node keeps at most `history_max_bytes`. Each
//! project's share of it is `history_max_bytes / P`, P the number of projects holding at
//! least one channel log on this node (with kept entries or not); a project may hold more
//! while the node is under the budget (alone, it may use all of it). Above the budget,
//! eviction takes from the project holding the most bytes, which is the one furthest
//! over its share (the share is the same for all, and when the total is over the budget
//! the largest project is over its share, so a project within its share loses nothing
//! while another is over); within that project, logs that keep no entry go first, then
//! the oldest entries of its largest channels. Bookkeeping per append: two ordered-set
//! updates (the channel in its project's order, the project in the node's order), O(log
//! n); no scan. An entry counts its frame, its event name and a fixed overhead, plus
//! its frame's compressed form once one was made.
//!
//! Compression: each entry's frame is a [`SharedFrame`], whose permessage-deflate form
//! is made at most once for the node, outside the lock, by the first compressing
//! connection that recovers it (`WsConn::send`), and shared by every later recovery.
//! Making it never takes the lock (it would serialise deflates behind publishes), so its
//! bytes are counted at the entry's next recovery, under the lock ([`Inner::recover`]):
//! until then a compressed form is uncounted, and it is smaller than the frame it
//! came from (a form that would not shrink is not kept).
//!
//! Epochs: 8 hex characters, a keyed hash of the channel under a seed drawn at random at
//! start and again whenever any log is dropped. A channel forgotten (nothing kept for
//! twice its TTL, dropped by the budget, history turned off and on again, or a restart)
//! starts again at offset 1 under a new epoch, so a client holding an old position
//! learns it cannot recover.

pub(crate) mod backend;
pub(crate) mod spec;

pub(crate) use spec::{HistoryCell, HistorySpec, HistorySpecError};

use std::cmp::Reverse;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::ws::deflate::{OnceFrame, SharedFrame};

/// Cluster mode: prefix of a channel's position hash in Redis (`<prefix><project id>:<channel>`,
/// see `cluster::history`).
pub(crate) const REDIS_META_PREFIX: &str = "ringcast:hm:";
/// Cluster mode: prefix of a channel's stream of kept messages in Redis.
pub(crate) const REDIS_STREAM_PREFIX: &str = "ringcast:hs:";

/// Bytes counted per entry beyond its frame and event name (the entry, its deque slot).
const ENTRY_OVERHEAD: usize = 96;
/// Bytes counted per channel beyond its name (the log, its map slots).
const CHANNEL_OVERHEAD: usize = 160;
/// Added to the rank of a log that keeps no entry (see [`Log::rank`]).
const EMPTY_FIRST: usize = usize::MAX / 2;

/// A channel's epoch: 8 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch([u8; 8]);

impl Epoch {
    /// The epoch of a channel this node keeps no log of: a hash of the channel under
    /// the node's current `seed`, so each channel has its own and a new seed changes
    /// them all.
    fn fresh(seed: &RandomState, project: u32, channel: &str) -> Epoch {
        Epoch::from_u32(seed.hash_one((project, channel)) as u32)
    }

    fn from_u32(v: u32) -> Epoch {
        let mut out = [0u8; 8];
        for (i, b) in out.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((v >> (28 - 4 * i)) & 0xf) as usize];
        }
        Epoch(out)
    }

    /// A random epoch (cluster mode: the one a channel's new history takes in Redis).
    pub(crate) fn random() -> Epoch {
        Epoch::from_u32(rand::random())
    }

    /// An epoch read back (from Redis): exactly 8 lowercase hex digits.
    pub(crate) fn parse(s: &str) -> Option<Epoch> {
        let b: [u8; 8] = s.as_bytes().try_into().ok()?;
        b.iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(Epoch(b))
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A channel's latest position: `offset` is the last one assigned (0 when none yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub offset: u64,
    pub epoch: Epoch,
}

/// One kept message.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub offset: u64,
    /// The message frame exactly as subscribers received it (offset and epoch
    /// included), with its compressed form once a recovery made it.
    pub frame: SharedFrame,
    pub event: Box<str>,
    /// `data` as published: a slice of `frame`.
    pub data: Bytes,
    pub id: Box<str>,
    at: Instant,
    /// The compressed form's bytes counted so far (see the module docs).
    deflated: usize,
}

impl Entry {
    pub(crate) fn new(offset: u64, frame: Bytes, event: &str, data: Bytes, id: &str) -> Entry {
        Entry {
            offset,
            frame: OnceFrame::shared(frame),
            event: event.into(),
            data,
            id: id.into(),
            at: Instant::now(),
            deflated: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.frame.plain().len() + self.event.len() + self.id.len() + ENTRY_OVERHEAD + self.deflated
    }
}

/// One channel's log.
struct Log {
    /// Key in [`Tenant::by_size`] and [`Inner::names`].
    id: u64,
    epoch: Epoch,
    last: u64,
    entries: VecDeque<Entry>,
    /// Counted bytes of this channel, name and overhead included.
    bytes: usize,
    size: usize,
    ttl: Duration,
    /// When the channel was last written or read (idle channels are forgotten).
    used: Instant,
    /// The project's [`HistorySpec::generation`] when the log was made: a log from an
    /// earlier period of history being on is dropped when next touched.
    generation: u32,
}

impl Log {
    /// Drop entries older than the TTL; returns the bytes freed.
    fn expire(&mut self, now: Instant) -> usize {
        let mut freed = 0;
        while let Some(front) = self.entries.front() {
            if now.saturating_duration_since(front.at) < self.ttl {
                break;
            }
            freed += front.bytes();
            self.entries.pop_front();
        }
        self.bytes -= freed;
        freed
    }

    /// Its key in [`Tenant::by_size`]: its bytes, above every log with entries when it
    /// keeps none, so the budget drops logs that hold no message before any message.
    fn rank(&self) -> usize {
        if self.entries.is_empty() {
            EMPTY_FIRST + self.bytes
        } else {
            self.bytes
        }
    }

    fn position(&self) -> Position {
        Position {
            offset: self.last,
            epoch: self.epoch,
        }
    }

    /// The oldest offset still kept, if any.
    fn first_kept(&self) -> Option<u64> {
        self.entries.front().map(|e| e.offset)
    }
}

/// What a subscribe with `since` gets.
#[derive(Debug)]
pub(crate) struct Recovery {
    pub position: Position,
    /// The missed frames in order, or `None` when they are not all kept. Each is the
    /// entry's own, so a compressed form made for one recovery serves the next.
    pub frames: Option<Vec<SharedFrame>>,
}

/// The node's history. See the module docs for the locking rule.
pub(crate) struct History {
    inner: Mutex<Inner>,
}

/// Whether a subscribe with `since` may be answered from this node's logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recoveries {
    /// A single node: its logs hold every message of its channels.
    Allowed,
    /// Cluster mode: history projects keep their history in Redis
    /// (`cluster::history`), never here; should a node's log ever be asked, it
    /// misses what other nodes published, so every `since` answers
    /// `recovered: false` rather than risk a gap.
    Refused,
}

/// One project's logs on this node and what they cost.
#[derive(Default)]
struct Tenant {
    logs: HashMap<Box<str>, Log>,
    /// (rank, id) of each of its channels, for "empty logs, then the largest" eviction
    /// within the project; of two logs of the same rank, the older one (lower id) goes
    /// first, so a flood of equal channels loses its oldest messages, not its newest.
    by_size: BTreeSet<(usize, Reverse<u64>)>,
    /// Counted bytes of all its logs; its key in [`Inner::by_bytes`].
    bytes: usize,
}

/// Everything behind the lock.
pub(crate) struct Inner {
    /// Every project holding at least one log (never an empty [`Tenant`]).
    projects: HashMap<u32, Tenant>,
    /// (bytes, project) of every project in `projects`: the budget evicts from the last.
    by_bytes: BTreeSet<(usize, u32)>,
    /// A log's id → its channel name (project, for [`Tenant::by_size`]'s ids).
    names: HashMap<u64, (u32, Box<str>)>,
    next_id: u64,
    /// Counted bytes of all logs (the sum of the projects').
    bytes: usize,
    max_bytes: usize,
    recoveries: Recoveries,
    /// Seeds the epoch a channel this node keeps no log of reports (with offset 0;
    /// [`Epoch::fresh`]), which its log adopts when its first message is recorded: a
    /// client that saw offset 0 under it before that message recovers it. Drawn anew
    /// whenever a log is dropped, so a channel's new log never reuses the epoch of its
    /// old one.
    fresh: RandomState,
}

impl History {
    pub(crate) fn new(max_bytes: usize, recoveries: Recoveries) -> History {
        History {
            inner: Mutex::new(Inner {
                projects: HashMap::new(),
                by_bytes: BTreeSet::new(),
                names: HashMap::new(),
                next_id: 0,
                bytes: 0,
                max_bytes,
                recoveries,
                fresh: RandomState::new(),
            }),
        }
    }

    /// Take the lock for one operation. Hold it only for work that never blocks.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it cannot leave a log half-written in a way that
        // matters more than losing the node's history: carry on with what is there.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Expire old entries everywhere and forget channels with nothing kept that have
    /// been idle (no publish, subscribe or read) for twice their TTL. Called once a
    /// second.
    pub(crate) fn sweep(&self) {
        self.lock().sweep(Instant::now());
    }
}

impl Inner {
    /// Bytes counted now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes one project counts now (0 when it holds no log).
    #[cfg(test)]
    fn project_bytes(&self, project: u32) -> usize {
        self.projects.get(&project).map_or(0, |t| t.bytes)
    }

    /// Log `id` of `project` went from rank `before` to `after` and its bytes by `grown`:
    /// move it in its project's order, and the project in the node's order.
    fn adjust(&mut self, project: u32, id: u64, before: usize, after: usize, grown: isize) {
        let Some(t) = self.projects.get_mut(&project) else {
            return;
        };
        if before != after {
            t.by_size.remove(&(before, Reverse(id)));
            t.by_size.insert((after, Reverse(id)));
        }
        if grown != 0 {
            self.by_bytes.remove(&(t.bytes, project));
            t.bytes = t.bytes.wrapping_add_signed(grown);
            self.by_bytes.insert((t.bytes, project));
            self.bytes = self.bytes.wrapping_add_signed(grown);
        }
    }

    /// The channel's log when this node keeps one, with its settings following the
    /// project's current `spec` and old entries dropped. Never makes one: reads
    /// (subscribes, REST history) must not grow the node's memory.
    fn existing(
        &mut self,
        project: u32,
        channel: &str,
        spec: HistorySpec,
        now: Instant,
    ) -> Option<&mut Log> {
        let stale = self.projects.get(&project)?.logs.get(channel)?.generation != spec.generation;
        if stale {
            // History was turned off (and on again) since this log was made: messages
            // published meanwhile are not in it, so its epoch must not be recovered.
            self.drop_log(project, channel);
            return None;
        }
        let (freed, id, before, after) = {
            let log = self.projects.get_mut(&project)?.logs.get_mut(channel)?;
            log.size = spec.size as usize;
            log.ttl = Duration::from_secs(u64::from(spec.ttl_s));
            log.used = now;
            let before = log.rank();
            let mut freed = log.expire(now);
            while log.entries.len() > log.size {
                if let Some(e) = log.entries.pop_front() {
                    freed += e.bytes();
                    log.bytes -= e.bytes();
                }
            }
            (freed, log.id, before, log.rank())
        };
        if freed > 0 {
            self.adjust(project, id, before, after, -(freed as isize));
        }
        self.projects.get_mut(&project)?.logs.get_mut(channel)
    }

    /// The channel's position now: offset 0 under the node's fresh epoch when no log
    /// is kept (nothing is made).
    pub(crate) fn position(&mut self, project: u32, channel: &str, spec: HistorySpec) -> Position {
        match self.existing(project, channel, spec, Instant::now()) {
            Some(log) => log.position(),
            None => Position {
                offset: 0,
                epoch: Epoch::fresh(&self.fresh, project, channel),
            },
        }
    }

    /// Record `entry` at `at` (the offset and epoch the publish gave it from
    /// [`Inner::position`] plus its earlier messages of the channel), making the log
    /// under that epoch when none is kept, and enforce the size bound. The caller
    /// enforces the byte budget once after all of a request's entries
    /// ([`Inner::enforce_budget`]), so no log is dropped between two of them.
    pub(crate) fn push(
        &mut self,
        project: u32,
        channel: &str,
        spec: HistorySpec,
        at: Position,
        entry: Entry,
    ) {
        let now = Instant::now();
        if self.existing(project, channel, spec, now).is_none() {
            let id = self.next_id;
            self.next_id += 1;
            let bytes = channel.len() + CHANNEL_OVERHEAD;
            self.names.insert(id, (project, channel.into()));
            let t = self.projects.entry(project).or_default();
            self.by_bytes.remove(&(t.bytes, project));
            t.bytes += bytes;
            self.by_bytes.insert((t.bytes, project));
            self.bytes += bytes;
            t.by_size.insert((EMPTY_FIRST + bytes, Reverse(id)));
            t.logs.insert(
                channel.into(),
                Log {
                    id,
                    epoch: at.epoch,
                    last: at.offset - 1,
                    entries: VecDeque::new(),
                    bytes,
                    size: spec.size as usize,
                    ttl: Duration::from_secs(u64::from(spec.ttl_s)),
                    used: now,
                    generation: spec.generation,
                },
            );
        }
        let Some(log) = self.existing(project, channel, spec, now) else {
            return;
        };
        debug_assert_eq!(entry.offset, log.last + 1);
        debug_assert_eq!(at.epoch, log.epoch);
        log.last = entry.offset;
        let before = log.rank();
        let mut grown = entry.bytes() as isize;
        log.bytes += entry.bytes();
        log.entries.push_back(entry);
        while log.entries.len() > log.size {
            if let Some(e) = log.entries.pop_front() {
                log.bytes -= e.bytes();
                grown -= e.bytes() as isize;
            }
        }
        let (id, after) = (log.id, log.rank());
        self.adjust(project, id, before, after, grown);
    }

    /// Forget a channel's log (its name, epoch and last offset) and draw a new fresh
    /// epoch, so the channel's next log cannot be mistaken for this one.
    fn drop_log(&mut self, project: u32, name: &str) {
        let Some(t) = self.projects.get_mut(&project) else {
            return;
        };
        let Some(log) = t.logs.remove(name) else {
            return;
        };
        t.by_size.remove(&(log.rank(), Reverse(log.id)));
        self.by_bytes.remove(&(t.bytes, project));
        t.bytes -= log.bytes;
        if t.logs.is_empty() {
            self.projects.remove(&project);
        } else {
            self.by_bytes.insert((t.bytes, project));
        }
        self.names.remove(&log.id);
        self.bytes -= log.bytes;
        self.fresh = RandomState::new();
    }

    /// Above the budget: take from the project holding the most bytes (the one furthest
    /// over its equal share, see the module docs) its logs that keep nothing (largest
    /// first), then the oldest entries of its largest channels: a budget full of empty
    /// logs never stops a publish from being recorded. Amortised O(log n) per entry
    /// dropped.
    pub(crate) fn enforce_budget(&mut self) {
        while self.bytes > self.max_bytes {
            let Some(&(bytes, project)) = self.by_bytes.iter().next_back() else {
                return;
            };
            // Over the budget, the largest project is over its share: bytes × P > budget.
            debug_assert!(bytes.saturating_mul(self.by_bytes.len()) > self.max_bytes);
            let Some(t) = self.projects.get_mut(&project) else {
                self.by_bytes.remove(&(bytes, project));
                continue;
            };
            let Some(&(rank, Reverse(id))) = t.by_size.iter().next_back() else {
                // Cannot happen (a project is kept only while it has logs): forget it.
                self.by_bytes.remove(&(bytes, project));
                self.bytes -= t.bytes;
                self.projects.remove(&project);
                continue;
            };
            let Some(log) = self
                .names
                .get(&id)
                .and_then(|(_, name)| t.logs.get_mut(name))
            else {
                t.by_size.remove(&(rank, Reverse(id)));
                self.names.remove(&id);
                continue;
            };
            let before = log.rank();
            let Some(e) = log.entries.pop_front() else {
                // A log that keeps nothing (ranked first): forget it and go on.
                if let Some((_, name)) = self.names.get(&id).cloned() {
                    self.drop_log(project, &name);
                }
                continue;
            };
            log.bytes -= e.bytes();
            let after = log.rank();
            self.adjust(project, id, before, after, -(e.bytes() as isize));
        }
    }

    /// Recovery: the channel's position, and the frames after `since` when every one of
    /// them is still kept under `epoch` and they cost at most `budget` bytes to queue
    /// (each frame's length plus [`WsConn::cost_of`]'s slot cost). The compressed forms
    /// earlier recoveries made of the entries it reads are counted now (module docs).
    ///
    /// [`WsConn::cost_of`]: crate::ws::conn::WsConn::cost_of
    pub(crate) fn recover(
        &mut self,
        project: u32,
        channel: &str,
        spec: HistorySpec,
        since: u64,
        epoch: &str,
        budget: usize,
    ) -> Recovery {
        let allowed = self.recoveries == Recoveries::Allowed;
        let Some(log) = self.existing(project, channel, spec, Instant::now()) else {
            let fresh = Epoch::fresh(&self.fresh, project, channel);
            // No log: nothing was published since the client's offset 0 only if it
            // saw the fresh epoch that the first message will adopt.
            let position = Position {
                offset: 0,
                epoch: fresh,
            };
            let complete = allowed && since == 0 && epoch == fresh.as_str();
            return Recovery {
                position,
                frames: complete.then(Vec::new),
            };
        };
        let position = log.position();
        let complete = allowed
            && epoch == log.epoch.as_str()
            && since <= log.last
            && (since == log.last || log.first_kept().is_some_and(|first| first <= since + 1));
        let missed = || log.entries.iter().filter(|e| e.offset > since);
        let fits = || {
            missed()
                .map(|e| crate::ws::conn::WsConn::cost_of(e.frame.plain()))
                .sum::<usize>()
                <= budget
        };
        let frames = (complete && fits()).then(|| missed().map(|e| e.frame.clone()).collect());
        let before = log.rank();
        let mut grown = 0;
        for e in log.entries.iter_mut().filter(|e| e.offset > since) {
            let made = e.frame.deflated_len();
            if made > e.deflated {
                grown += made - e.deflated;
                e.deflated = made;
            }
        }
        if grown > 0 {
            log.bytes += grown;
            let (id, after) = (log.id, log.rank());
            self.adjust(project, id, before, after, grown as isize);
            self.enforce_budget();
        }
        Recovery { position, frames }
    }

    /// REST history: the channel's position and up to `limit` entries, oldest first:
    /// the newest ones without `since`, the first ones after it with.
    pub(crate) fn read(
        &mut self,
        project: u32,
        channel: &str,
        spec: HistorySpec,
        since: Option<u64>,
        limit: usize,
    ) -> (Position, Vec<Entry>) {
        let Some(log) = self.existing(project, channel, spec, Instant::now()) else {
            let fresh = Epoch::fresh(&self.fresh, project, channel);
            let position = Position {
                offset: 0,
                epoch: fresh,
            };
            return (position, Vec::new());
        };
        let entries: Vec<Entry> = match since {
            Some(s) => log
                .entries
                .iter()
                .filter(|e| e.offset > s)
                .take(limit)
                .cloned()
                .collect(),
            None => {
                let skip = log.entries.len().saturating_sub(limit);
                log.entries.iter().skip(skip).cloned().collect()
            }
        };
        (log.position(), entries)
    }

    fn sweep(&mut self, now: Instant) {
        let mut forget = Vec::new();
        let mut changes = Vec::new();
        for (&project, t) in self.projects.iter_mut() {
            for (name, log) in t.logs.iter_mut() {
                let before = log.rank();
                let freed = log.expire(now);
                if freed > 0 {
                    changes.push((project, log.id, before, log.rank(), freed));
                }
                if log.entries.is_empty() && now.saturating_duration_since(log.used) >= 2 * log.ttl
                {
                    forget.push((project, name.clone()));
                }
            }
        }
        for (project, id, before, after, freed) in changes {
            self.adjust(project, id, before, after, -(freed as isize));
        }
        for (project, name) in forget {
            self.drop_log(project, &name);
        }
    }
}

#[cfg(test)]
mod tests;
