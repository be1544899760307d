//! Channel history on one node: for projects that turn it on, the last `size` messages
//! of each channel (each kept at most `ttl`), their offsets and the channel's epoch.
//!
//! Where offsets are assigned: in exactly one place, [`History`]'s lock. A publish of a
//! history project takes it, gives each of its channels the next offset, encodes the
//! frame with that position, hands the frame to the mailboxes and records it, all before
//! releasing it. Every mailbox therefore receives a channel's frames in offset order,
//! and every subscriber on every core sees the same order. A subscribe to such a channel
//! takes the same lock to read the channel's position (and, for a recovery, the missed
//! frames), after the worker has delivered what its mailbox already held and registered
//! the subscriber: frames at or below that position were delivered (or not, to this
//! subscriber) before it joined, frames above it reach it live, so a replay and the live
//! stream meet with no gap and no duplicate.
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
//! channels, which also forgets channels with nothing kept and idle for twice the TTL). Across all channels the node
//! keeps at most `history_max_bytes`; above it, the oldest entries of the largest
//! channels go first. An entry counts its frame, its event name and a fixed overhead.
//!
//! Epochs: 8 hex characters drawn at random when this node first keeps a channel. A
//! channel forgotten (nothing kept for a TTL, or a restart) starts again at offset 1
//! under a new epoch, so a client holding an old position learns it cannot recover.

pub(crate) mod spec;

pub(crate) use spec::{HistoryCell, HistorySpec, HistorySpecError};

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Bytes counted per entry beyond its frame and event name (the entry, its deque slot).
const ENTRY_OVERHEAD: usize = 96;
/// Bytes counted per channel beyond its name (the log, its map slots).
const CHANNEL_OVERHEAD: usize = 160;

/// A channel's epoch: 8 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch([u8; 8]);

impl Epoch {
    fn random() -> Epoch {
        let mut out = [0u8; 8];
        let v: u32 = rand::random();
        for (i, b) in out.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((v >> (28 - 4 * i)) & 0xf) as usize];
        }
        Epoch(out)
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
    /// The message frame exactly as subscribers received it (offset and epoch included).
    pub frame: Bytes,
    pub event: Box<str>,
    /// `data` as published: a slice of `frame`.
    pub data: Bytes,
    pub id: Box<str>,
    at: Instant,
}

impl Entry {
    pub(crate) fn new(offset: u64, frame: Bytes, event: &str, data: Bytes, id: &str) -> Entry {
        Entry {
            offset,
            frame,
            event: event.into(),
            data,
            id: id.into(),
            at: Instant::now(),
        }
    }

    fn bytes(&self) -> usize {
        self.frame.len() + self.event.len() + self.id.len() + ENTRY_OVERHEAD
    }
}

/// One channel's log.
struct Log {
    /// Key in [`Inner::by_size`] and [`Inner::names`].
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
    /// The missed frames in order, or `None` when they are not all kept.
    pub frames: Option<Vec<Bytes>>,
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
    /// Cluster mode: positions are per node (not yet assigned through Redis), so a
    /// node's log misses what other nodes published; a recovery from it could hide a
    /// gap. Every `since` answers `recovered: false`.
    Refused,
}

/// Everything behind the lock.
pub(crate) struct Inner {
    channels: HashMap<u32, HashMap<Box<str>, Log>>,
    /// (bytes, id) of every channel, for "largest first" eviction.
    by_size: BTreeSet<(usize, u64)>,
    names: HashMap<u64, (u32, Box<str>)>,
    next_id: u64,
    bytes: usize,
    max_bytes: usize,
    recoveries: Recoveries,
}

impl History {
    pub(crate) fn new(max_bytes: usize, recoveries: Recoveries) -> History {
        History {
            inner: Mutex::new(Inner {
                channels: HashMap::new(),
                by_size: BTreeSet::new(),
                names: HashMap::new(),
                next_id: 0,
                bytes: 0,
                max_bytes,
                recoveries,
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

    fn resize(&mut self, id: u64, old: usize, new: usize) {
        self.by_size.remove(&(old, id));
        self.by_size.insert((new, id));
    }

    /// The channel's log, made (with a new epoch) when the node keeps nothing of it;
    /// its settings follow the project's current `spec`.
    fn log(&mut self, project: u32, channel: &str, spec: HistorySpec, now: Instant) -> &mut Log {
        let exists = self
            .channels
            .get(&project)
            .is_some_and(|m| m.contains_key(channel));
        if !exists {
            let id = self.next_id;
            self.next_id += 1;
            let bytes = channel.len() + CHANNEL_OVERHEAD;
            self.bytes += bytes;
            self.by_size.insert((bytes, id));
            self.names.insert(id, (project, channel.into()));
            self.channels.entry(project).or_default().insert(
                channel.into(),
                Log {
                    id,
                    epoch: Epoch::random(),
                    last: 0,
                    entries: VecDeque::new(),
                    bytes,
                    size: spec.size as usize,
                    ttl: Duration::from_secs(u64::from(spec.ttl_s)),
                    used: now,
                },
            );
        }
        let (freed, id, before, after) = {
            let log = self
                .channels
                .get_mut(&project)
                .and_then(|m| m.get_mut(channel))
                .expect("made above");
            log.size = spec.size as usize;
            log.ttl = Duration::from_secs(u64::from(spec.ttl_s));
            log.used = now;
            let before = log.bytes;
            let mut freed = log.expire(now);
            while log.entries.len() > log.size {
                if let Some(e) = log.entries.pop_front() {
                    freed += e.bytes();
                    log.bytes -= e.bytes();
                }
            }
            (freed, log.id, before, log.bytes)
        };
        if freed > 0 {
            self.bytes -= freed;
            self.resize(id, before, after);
        }
        self.channels
            .get_mut(&project)
            .and_then(|m| m.get_mut(channel))
            .expect("made above")
    }

    /// The channel's position now (made, at offset 0, when unknown).
    pub(crate) fn position(&mut self, project: u32, channel: &str, spec: HistorySpec) -> Position {
        self.log(project, channel, spec, Instant::now()).position()
    }

    /// The offset the next message of the channel gets, and the channel's epoch.
    pub(crate) fn next(&mut self, project: u32, channel: &str, spec: HistorySpec) -> Position {
        let p = self.log(project, channel, spec, Instant::now()).position();
        Position {
            offset: p.offset + 1,
            epoch: p.epoch,
        }
    }

    /// Record `entry`, whose offset [`Inner::next`] gave, and enforce the size bound
    /// and the node's byte budget.
    pub(crate) fn push(&mut self, project: u32, channel: &str, spec: HistorySpec, entry: Entry) {
        let now = Instant::now();
        let (id, before, after, grown) = {
            let log = self.log(project, channel, spec, now);
            debug_assert_eq!(entry.offset, log.last + 1);
            log.last = entry.offset;
            let before = log.bytes;
            let mut grown = entry.bytes() as isize;
            log.bytes += entry.bytes();
            log.entries.push_back(entry);
            while log.entries.len() > log.size {
                if let Some(e) = log.entries.pop_front() {
                    log.bytes -= e.bytes();
                    grown -= e.bytes() as isize;
                }
            }
            (log.id, before, log.bytes, grown)
        };
        self.bytes = (self.bytes as isize + grown) as usize;
        self.resize(id, before, after);
        self.enforce_budget();
    }

    /// Undo the newest [`Inner::push`] of a channel (its broadcast was refused).
    pub(crate) fn unpush(&mut self, project: u32, channel: &str, offset: u64) {
        let Some(log) = self
            .channels
            .get_mut(&project)
            .and_then(|m| m.get_mut(channel))
        else {
            return;
        };
        if log.last != offset {
            return;
        }
        log.last -= 1;
        let before = log.bytes;
        if log.entries.back().is_some_and(|e| e.offset == offset) {
            if let Some(e) = log.entries.pop_back() {
                log.bytes -= e.bytes();
            }
        }
        let (id, after) = (log.id, log.bytes);
        self.bytes -= before - after;
        self.resize(id, before, after);
    }

    /// Above the budget: drop the oldest entries of the largest channels.
    fn enforce_budget(&mut self) {
        while self.bytes > self.max_bytes {
            let Some(&(size, id)) = self.by_size.iter().next_back() else {
                return;
            };
            let Some((project, name)) = self.names.get(&id).cloned() else {
                self.by_size.remove(&(size, id));
                continue;
            };
            let Some(log) = self
                .channels
                .get_mut(&project)
                .and_then(|m| m.get_mut(&*name))
            else {
                return;
            };
            let Some(e) = log.entries.pop_front() else {
                // The largest channel keeps nothing: only names and overheads are
                // left, which the sweep reclaims.
                return;
            };
            let before = log.bytes;
            log.bytes -= e.bytes();
            let after = log.bytes;
            self.bytes -= e.bytes();
            self.resize(id, before, after);
        }
    }

    /// Recovery: the channel's position, and the frames after `since` when every one of
    /// them is still kept under `epoch`.
    pub(crate) fn recover(
        &mut self,
        project: u32,
        channel: &str,
        spec: HistorySpec,
        since: u64,
        epoch: &str,
    ) -> Recovery {
        let allowed = self.recoveries == Recoveries::Allowed;
        let log = self.log(project, channel, spec, Instant::now());
        let position = log.position();
        let complete = allowed
            && epoch == log.epoch.as_str()
            && since <= log.last
            && (since == log.last || log.first_kept().is_some_and(|first| first <= since + 1));
        let frames = complete.then(|| {
            log.entries
                .iter()
                .filter(|e| e.offset > since)
                .map(|e| e.frame.clone())
                .collect()
        });
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
        let log = self.log(project, channel, spec, Instant::now());
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
        for (&project, logs) in self.channels.iter_mut() {
            for (name, log) in logs.iter_mut() {
                let before = log.bytes;
                let freed = log.expire(now);
                if freed > 0 {
                    changes.push((log.id, before, log.bytes, freed));
                }
                if log.entries.is_empty() && now.saturating_duration_since(log.used) >= 2 * log.ttl
                {
                    forget.push((project, name.clone(), log.id, log.bytes));
                }
            }
        }
        for (id, before, after, freed) in changes {
            self.bytes -= freed;
            self.resize(id, before, after);
        }
        for (project, name, id, bytes) in forget {
            if let Some(logs) = self.channels.get_mut(&project) {
                logs.remove(&name);
                if logs.is_empty() {
                    self.channels.remove(&project);
                }
            }
            self.by_size.remove(&(bytes, id));
            self.names.remove(&id);
            self.bytes -= bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> HistorySpec {
        HistorySpec::parse(s).unwrap()
    }

    fn add(h: &mut Inner, ch: &str, spec: HistorySpec, body: &str) -> u64 {
        let p = h.next(1, ch, spec);
        let frame = Bytes::from(body.to_string());
        h.push(
            1,
            ch,
            spec,
            Entry::new(p.offset, frame.clone(), "e", frame, "id"),
        );
        p.offset
    }

    #[test]
    fn offsets_count_from_one_and_the_ring_keeps_size() {
        let h = History::new(1 << 20, Recoveries::Allowed);
        let mut h = h.lock();
        let s = spec("3/60s");
        assert_eq!(h.position(1, "c", s).offset, 0);
        for i in 1..=5 {
            assert_eq!(add(&mut h, "c", s, "x"), i);
        }
        let (pos, entries) = h.read(1, "c", s, None, 100);
        assert_eq!(pos.offset, 5);
        let kept: Vec<u64> = entries.iter().map(|e| e.offset).collect();
        assert_eq!(kept, [3, 4, 5]);
        let (_, entries) = h.read(1, "c", s, Some(3), 1);
        assert_eq!(entries[0].offset, 4);
        let (_, entries) = h.read(1, "c", s, None, 2);
        assert_eq!(entries.iter().map(|e| e.offset).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn recovery_needs_the_epoch_and_every_missed_message() {
        let h = History::new(1 << 20, Recoveries::Allowed);
        let mut h = h.lock();
        let s = spec("3/60s");
        for _ in 0..5 {
            add(&mut h, "c", s, "x");
        }
        let epoch = h.position(1, "c", s).epoch;
        let e = epoch.as_str().to_string();
        assert_eq!(h.recover(1, "c", s, 2, &e).frames.map(|f| f.len()), Some(3));
        assert_eq!(h.recover(1, "c", s, 5, &e).frames.map(|f| f.len()), Some(0));
        assert!(
            h.recover(1, "c", s, 1, &e).frames.is_none(),
            "offset 2 was evicted"
        );
        assert!(
            h.recover(1, "c", s, 6, &e).frames.is_none(),
            "beyond the latest"
        );
        assert!(
            h.recover(1, "c", s, 4, "00000000x").frames.is_none(),
            "other epoch"
        );
        // Another channel has its own offsets and epoch.
        assert_eq!(add(&mut h, "d", s, "y"), 1);
    }

    #[test]
    fn cluster_mode_never_recovers_from_one_node() {
        let h = History::new(1 << 20, Recoveries::Refused);
        let mut h = h.lock();
        let s = spec("10/60s");
        add(&mut h, "c", s, "x");
        let e = h.position(1, "c", s).epoch.as_str().to_string();
        assert!(h.recover(1, "c", s, 0, &e).frames.is_none());
    }

    #[test]
    fn entries_expire_after_the_ttl() {
        let h = History::new(1 << 20, Recoveries::Allowed);
        let mut h = h.lock();
        let s = spec("10/1s");
        add(&mut h, "c", s, "x");
        let later = Instant::now() + Duration::from_millis(1500);
        h.sweep(later);
        let (pos, entries) = h.read(1, "c", s, None, 10);
        assert_eq!(
            (pos.offset, entries.len()),
            (1, 0),
            "offset stays, entry gone"
        );
        // Idle and empty for a TTL: the channel is forgotten, a new epoch follows.
        let before = pos.epoch;
        h.sweep(Instant::now() + Duration::from_secs(5));
        assert_eq!(h.bytes(), 0);
        let after = h.position(1, "c", s);
        assert_eq!(after.offset, 0);
        assert_ne!(before, after.epoch);
    }

    #[test]
    fn the_budget_evicts_the_oldest_of_the_largest_channel_first() {
        let s = spec("1000/600s");
        let h = History::new(8 * 1024, Recoveries::Allowed);
        let mut h = h.lock();
        let big = "b".repeat(500);
        for _ in 0..5 {
            add(&mut h, "small", s, "s");
        }
        for _ in 0..40 {
            add(&mut h, "large", s, &big);
        }
        assert!(h.bytes() <= 8 * 1024, "{}", h.bytes());
        let (_, small) = h.read(1, "small", s, None, 100);
        assert_eq!(small.len(), 5, "the small channel kept everything");
        let (pos, large) = h.read(1, "large", s, None, 100);
        assert_eq!(pos.offset, 40);
        assert!(large.len() < 40 && !large.is_empty());
        assert_eq!(large.last().map(|e| e.offset), Some(40), "newest kept");
    }

    #[test]
    fn unpush_rolls_back_the_newest_entry() {
        let h = History::new(1 << 20, Recoveries::Allowed);
        let mut h = h.lock();
        let s = spec("10/60s");
        add(&mut h, "c", s, "x");
        let bytes = h.bytes();
        let o = add(&mut h, "c", s, "y");
        h.unpush(1, "c", o);
        assert_eq!(h.bytes(), bytes);
        assert_eq!(h.position(1, "c", s).offset, 1);
        assert_eq!(add(&mut h, "c", s, "z"), 2);
    }
}
