//! The only cross-core path: each worker's bounded mailbox and its doorbell.
//!
//! A publish pushes one `Arc<Broadcast>` into the mailbox of every worker that has a
//! subscriber of its channel (see `interest`). Capacity is reserved on all of those
//! mailboxes before anything is pushed, so a broadcast is either queued for every one of
//! them or for none (the publish then answers 503): never half-delivered.
//! The doorbell is rung only when the worker is asleep (Dekker-style: each side writes
//! its flag, fences, then reads the other's), so a busy worker takes no wake-up cost.
//! Control envelopes (key changes, shutdown) bypass the capacity: they are rare and must
//! never be refused. Cost: a broadcast is at most N channel sends and N wake-ups, N =
//! workers with subscribers of the channel; the mailboxes are made once at start and kept.
//!
//! A batch (a batch publish, or one message to several channels) is one envelope per
//! worker carrying all its frames in request order ([`Envelope::Batch`]): one push and
//! one wake-up for the whole batch. A worker skips the frames of channels it has no
//! subscriber of (a registry miss). Capacity counts frames: a batch reserves one unit
//! per frame, capped at the whole capacity (so any batch fits an empty mailbox), and
//! gives them back when taken; the bound on queued work is therefore about
//! `capacity` frames whatever the batch sizes.

use std::future::poll_fn;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};

use super::interest::{channel_hash, InterestFilter};
use super::users::{UserCounts, UserEnd};
use crate::dialect::Dialect;
use crate::ids::SocketId;

/// One accepted publish, encoded once per client protocol that needs it.
#[derive(Debug)]
pub struct Broadcast {
    /// Dense project index: channels are namespaced by project.
    pub project: u32,
    pub channel: Box<str>,
    /// The complete native WebSocket frame: canonical (history keeps it, the cluster
    /// relays it, the Pusher frame is derived from it).
    pub frame: Bytes,
    /// The one connection that must not receive it: a client event's sender, or the
    /// `socket_id` a publish named. Only the worker of this node that owns it skips
    /// anyone.
    pub(crate) except: Option<SocketId>,
    /// The Pusher-protocol frame, made by the first worker that has a Pusher subscriber
    /// of the channel (`None` inside: the native frame has no Pusher form). Never
    /// touched on channels without Pusher subscribers, so they pay nothing for it.
    pusher: OnceLock<Option<Bytes>>,
    /// The permessage-deflate forms of the native and the Pusher frame (`ws::deflate`),
    /// made by the first worker that has a compressing subscriber of the channel (`None`
    /// inside: below `ws_compression_min_bytes`, or it would not shrink). Untouched
    /// while no subscriber compresses.
    deflated: [OnceLock<Option<Bytes>>; 2],
}

impl Broadcast {
    /// A broadcast every subscriber of the channel receives.
    pub fn plain(project: u32, channel: Box<str>, frame: Bytes) -> Broadcast {
        Broadcast::new(project, channel, frame, None)
    }

    pub(crate) fn new(
        project: u32,
        channel: Box<str>,
        frame: Bytes,
        except: Option<SocketId>,
    ) -> Broadcast {
        Broadcast {
            project,
            channel,
            frame,
            except,
            pusher: OnceLock::new(),
            deflated: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The connection id worker `worker` must skip, or 0 (no connection has id 0).
    #[inline]
    pub fn skip_on(&self, worker: usize) -> u64 {
        match self.except {
            Some(id) if id.worker == worker && id.is_here() => id.conn,
            _ => 0,
        }
    }

    /// The frame a connection speaking `dialect` receives. The Pusher frame is encoded
    /// here at most once per message, whichever worker asks first (a second worker
    /// asking meanwhile waits for that one encode).
    #[inline]
    pub fn frame_for(&self, dialect: Dialect) -> Option<&Bytes> {
        match dialect {
            Dialect::Native => Some(&self.frame),
            Dialect::Pusher => self
                .pusher
                .get_or_init(|| super::dialect::pusher_frame(&self.frame, &self.channel))
                .as_ref(),
        }
    }
}

impl Broadcast {
    /// The compressed frame a connection speaking `dialect` that agreed to
    /// permessage-deflate receives, or `None` (it gets [`Broadcast::frame_for`]'s):
    /// compressed at most once per message for the whole node, like the Pusher frame.
    #[inline]
    pub fn deflated_for(&self, dialect: Dialect) -> Option<&Bytes> {
        let slot = match dialect {
            Dialect::Native => &self.deflated[0],
            Dialect::Pusher => &self.deflated[1],
        };
        slot.get_or_init(|| {
            let plain = self.frame_for(dialect)?;
            crate::ws::deflate::codec::compress_large(plain)
        })
        .as_ref()
    }
}

/// Frames of one batch, in request order (per channel, the order subscribers see).
pub type BroadcastBatch = Arc<[Arc<Broadcast>]>;

#[derive(Debug)]
pub enum Envelope {
    Broadcast(Arc<Broadcast>),
    /// Several broadcasts handed over in one push.
    Batch(BroadcastBatch),
    /// The key snapshot changed: close connections whose key was revoked.
    KeysChanged,
    /// Stop accepting, deliver what is queued, close WebSockets with 1001.
    Shutdown,
    /// The cluster's subscription for this worker's first local subscriber of a channel
    /// is in place (Redis confirmed the SUBSCRIBE, or Redis is away): the `subscribed`
    /// replies held for it may go out. `ticket` is the one the worker gave with that
    /// interest change, so a late answer to an older change releases nothing newer.
    InterestReady {
        project: u32,
        channel: Box<str>,
        ticket: u64,
    },
    /// Cluster mode, history channel: the subscribe given `ticket` may go live here,
    /// between the messages its position covers and those after it.
    HistoryReady {
        ticket: u64,
        ready: HistoryReady,
    },
    /// A presence frame (a member joined or left) from the presence hub, fanned out like
    /// a broadcast. A control envelope: the hub must never lose one (members would see
    /// a wrong list), and it makes at most two per connection's subscribe.
    Presence(Arc<Broadcast>),
    /// The presence hub's answer to the join given `ticket`.
    PresenceReady {
        ticket: u64,
        answer: PresenceAnswer,
    },
    /// Work another worker hands to this one because this one owns the state it
    /// touches (an idempotency key's entry: `publish::idempotency`). A control
    /// envelope: one per keyed publish that lands on another worker than its key's.
    Run(Task),
    /// End a user's access on this worker (`Mailboxes::end_user`, `shard::users`). A
    /// control envelope: every worker gets one per REST call.
    EndUser {
        project: u32,
        user: Arc<str>,
        end: UserEnd,
    },
}

/// A job for [`Envelope::Run`], run on the receiving worker's thread.
pub struct Task(pub Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Task")
    }
}

/// What the presence hub answered a join.
#[derive(Debug)]
pub enum PresenceAnswer {
    /// Joined: the channel's presence object (`{"count":N,"members":[...]}`, the joiner
    /// included) as JSON text, for its `subscribed` frame.
    Joined(Box<str>),
    /// The channel has `max_presence_members` users and this one is not among them.
    Full,
    /// The connection is a member of the channel already, under another user id: a
    /// connection's user never changes (nothing changed).
    OtherUser,
}

/// What a cluster-mode subscribe to a history channel learnt from Redis.
#[derive(Debug)]
pub enum HistoryReady {
    /// The channel's position, and the missed frames (in order) when the subscribe
    /// asked to recover and every one of them is kept (each shared with the node's
    /// other recoveries of it, so it is compressed at most once: `cluster::inbound`).
    Position {
        offset: u64,
        epoch: Box<str>,
        replay: Option<Vec<crate::ws::deflate::SharedFrame>>,
    },
    /// Redis could not be asked: no position (and nothing recovered).
    Unknown,
}

/// One worker's mailbox.
pub struct Mailbox {
    tx: Sender<Envelope>,
    rx: Receiver<Envelope>,
    capacity: usize,
    reserved: AtomicUsize,
    waker: AtomicWaker,
    asleep: AtomicBool,
    /// The channels this mailbox's worker has subscribers for.
    pub interest: Arc<InterestFilter>,
    /// This worker's connections per (project, user), for `Mailboxes::user_connections`.
    pub(crate) users: UserCounts,
}

impl Mailbox {
    pub fn new(capacity: usize) -> Mailbox {
        // Unbounded underneath: the bound is the `reserved` counter, which lets a
        // broadcast reserve room on every mailbox before pushing to any.
        let (tx, rx) = crossbeam_channel::unbounded();
        Mailbox {
            tx,
            rx,
            capacity,
            reserved: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            asleep: AtomicBool::new(false),
            interest: Arc::default(),
            users: UserCounts::default(),
        }
    }

    /// Units queued and not yet taken (one per frame; see the module docs).
    pub fn len(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    #[cfg(any(test, feature = "bench"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Units an envelope holds: one per frame, at most the whole capacity.
    fn units(&self, envelope: &Envelope) -> usize {
        match envelope {
            Envelope::Broadcast(_) => 1,
            Envelope::Batch(batch) => self.batch_units(batch.len()),
            // Control envelopes hold no frames: never refused, never counted.
            Envelope::KeysChanged
            | Envelope::Shutdown
            | Envelope::InterestReady { .. }
            | Envelope::HistoryReady { .. }
            | Envelope::Presence(_)
            | Envelope::PresenceReady { .. }
            | Envelope::Run(_)
            | Envelope::EndUser { .. } => 0,
        }
    }

    /// Units a batch of `frames` frames reserves.
    fn batch_units(&self, frames: usize) -> usize {
        frames.clamp(1, self.capacity.max(1))
    }

    fn try_reserve(&self, units: usize) -> bool {
        let prev = self.reserved.fetch_add(units, Ordering::AcqRel);
        if prev + units > self.capacity {
            self.reserved.fetch_sub(units, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn push(&self, envelope: Envelope) {
        // The receiver lives as long as the mailbox, so send cannot fail.
        let _ = self.tx.send(envelope);
        fence(Ordering::SeqCst);
        if self.asleep.swap(false, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    /// Whether anything (broadcast or control) is waiting. Cheap: two atomic loads.
    pub fn has_mail(&self) -> bool {
        !self.rx.is_empty()
    }

    /// Take one envelope without waiting.
    pub fn try_recv(&self) -> Option<Envelope> {
        let envelope = self.rx.try_recv().ok()?;
        let units = self.units(&envelope);
        if units > 0 {
            self.reserved.fetch_sub(units, Ordering::AcqRel);
        }
        Some(envelope)
    }

    /// Wait until the mailbox has something. Only the owning worker calls this.
    pub async fn ready(&self) {
        poll_fn(|cx| {
            if !self.rx.is_empty() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            self.asleep.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !self.rx.is_empty() {
                self.asleep.store(false, Ordering::SeqCst);
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await
    }
}

/// Every worker's mailbox, indexed by worker.
#[derive(Clone)]
pub struct Mailboxes {
    boxes: Arc<Vec<Arc<Mailbox>>>,
}

/// Where a node's accepted messages go beyond its own workers (cluster mode: the Redis
/// relay to the other nodes). The publisher asks for room first, so a message is either
/// queued here and relayed, or refused whole.
pub(crate) trait Relay {
    /// Whether `frames` more relays fit now.
    fn room(&self, frames: usize) -> bool;
    /// Queue one accepted message for the other nodes; never blocks.
    fn relay(&self, msg: Arc<Broadcast>);
}

impl Mailboxes {
    pub fn new(workers: usize, capacity: usize) -> Mailboxes {
        Mailboxes {
            boxes: Arc::new(
                (0..workers)
                    .map(|_| Arc::new(Mailbox::new(capacity)))
                    .collect(),
            ),
        }
    }

    pub fn get(&self, worker: usize) -> Option<Arc<Mailbox>> {
        self.boxes.get(worker).cloned()
    }

    /// Queue a broadcast on every worker that has subscribers for its channel, or on
    /// none. `false` when any of those mailboxes is full. Workers without a subscriber
    /// of the channel are skipped (see `interest`): no queue traffic, no wake-up.
    pub fn broadcast(&self, msg: Arc<Broadcast>) -> bool {
        let hash = channel_hash(msg.project, &msg.channel);
        let mut wanted = [false; 64];
        let many = self.boxes.len() > wanted.len();
        for (i, mb) in self.boxes.iter().enumerate() {
            // Beyond 64 workers every mailbox takes the message (rare; still correct).
            let want = many || mb.interest.may_want(hash);
            if !many {
                wanted[i] = want;
            }
            if want && !mb.try_reserve(1) {
                for (j, undo) in self.boxes[..i].iter().enumerate() {
                    if many || wanted[j] {
                        undo.reserved.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                return false;
            }
        }
        for (i, mb) in self.boxes.iter().enumerate() {
            if many || wanted[i] {
                mb.push(Envelope::Broadcast(msg.clone()));
            }
        }
        true
    }

    /// Queue a batch on every worker that has subscribers of any of its channels, as one
    /// envelope each, or on none (`false` when any of those mailboxes is full).
    pub fn broadcast_batch(&self, batch: BroadcastBatch) -> bool {
        let hashes: Vec<u64> = batch
            .iter()
            .map(|m| channel_hash(m.project, &m.channel))
            .collect();
        let many = self.boxes.len() > 64;
        let mut wanted = [false; 64];
        for (i, mb) in self.boxes.iter().enumerate() {
            let want = many || hashes.iter().any(|&h| mb.interest.may_want(h));
            if !many {
                wanted[i] = want;
            }
            if want && !mb.try_reserve(mb.batch_units(batch.len())) {
                for (j, undo) in self.boxes[..i].iter().enumerate() {
                    if many || wanted[j] {
                        let units = undo.batch_units(batch.len());
                        undo.reserved.fetch_sub(units, Ordering::AcqRel);
                    }
                }
                return false;
            }
        }
        for (i, mb) in self.boxes.iter().enumerate() {
            if many || wanted[i] {
                mb.push(Envelope::Batch(Arc::clone(&batch)));
            }
        }
        true
    }

    /// Send a control envelope to every worker (never refused).
    pub fn control(&self, make: impl Fn() -> Envelope) {
        for mb in self.boxes.iter() {
            mb.push(make());
        }
    }

    /// Queue a presence frame on every worker that may have subscribers of its channel
    /// (never refused; see [`Envelope::Presence`]).
    pub fn presence(&self, msg: Arc<Broadcast>) {
        let hash = channel_hash(msg.project, &msg.channel);
        for mb in self.boxes.iter() {
            if mb.interest.may_want(hash) {
                mb.push(Envelope::Presence(msg.clone()));
            }
        }
    }

    /// Send a control envelope to one worker (never refused). `false` if there is no
    /// such worker.
    pub fn control_to(&self, worker: usize, envelope: Envelope) -> bool {
        match self.boxes.get(worker) {
            Some(mb) => {
                mb.push(envelope);
                true
            }
            None => false,
        }
    }

    /// End `user`'s access on every worker of this node (`shard::users`): one control
    /// envelope each, never refused; each worker acts when it drains its mailbox.
    pub(crate) fn end_user(&self, project_index: u32, user: Arc<str>, end: UserEnd) {
        self.control(|| Envelope::EndUser {
            project: project_index,
            user: user.clone(),
            end: end.clone(),
        });
    }

    /// Connections of `user` in the project of index `project_index` on this node now
    /// (only connections with a user are counted; one short lock per worker).
    pub(crate) fn user_connections(&self, project_index: u32, user: &str) -> u32 {
        self.boxes
            .iter()
            .map(|mb| mb.users.get(project_index, user))
            .fold(0, u32::saturating_add)
    }

    /// How many workers (mailboxes) there are.
    pub fn workers(&self) -> usize {
        self.boxes.len()
    }

    /// The fullest mailbox's length.
    pub fn max_len(&self) -> usize {
        self.boxes.iter().map(|m| m.len()).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every worker listens to channel "c" of project 0.
    fn interested(boxes: &Mailboxes) {
        for mb in boxes.boxes.iter() {
            mb.interest.add(channel_hash(0, "c"));
        }
    }

    fn msg() -> Arc<Broadcast> {
        Arc::new(Broadcast::new(
            0,
            "c".into(),
            Bytes::from_static(b"x"),
            None,
        ))
    }

    #[test]
    fn all_or_nothing_when_full() {
        let boxes = Mailboxes::new(2, 2);
        interested(&boxes);
        assert!(boxes.broadcast(msg()));
        // Fill worker 1 only.
        assert!(boxes.boxes[1].try_reserve(1));
        assert!(!boxes.broadcast(msg()), "worker 1 is full");
        assert_eq!(
            boxes.boxes[0].len(),
            1,
            "worker 0 must not keep a half broadcast"
        );
        assert!(boxes.boxes[0].try_recv().is_some());
        assert!(boxes.boxes[0].try_recv().is_none());
    }

    #[test]
    fn workers_without_subscribers_are_skipped() {
        let boxes = Mailboxes::new(2, 1);
        boxes.boxes[1].interest.add(channel_hash(0, "c"));
        // Capacity 1: worker 0 would be full on the second message if it took them.
        assert!(boxes.broadcast(msg()));
        assert!(!boxes.broadcast(msg()), "worker 1 is full now");
        assert_eq!(boxes.boxes[0].len(), 0);
        assert_eq!(boxes.boxes[1].len(), 1);
    }

    #[test]
    fn a_batch_is_one_envelope_per_interested_worker() {
        let boxes = Mailboxes::new(2, 1);
        boxes.boxes[1].interest.add(channel_hash(0, "c"));
        let other = Arc::new(Broadcast::new(
            0,
            "other".into(),
            Bytes::from_static(b"y"),
            None,
        ));
        let batch: BroadcastBatch = vec![msg(), other, msg()].into();
        assert!(boxes.broadcast_batch(batch.clone()));
        assert_eq!(boxes.boxes[0].len(), 0, "no subscriber of any channel");
        assert_eq!(
            boxes.boxes[1].len(),
            1,
            "three frames, capped at the capacity"
        );
        assert!(!boxes.broadcast_batch(batch), "worker 1 is full");
        match boxes.boxes[1].try_recv() {
            Some(Envelope::Batch(b)) => assert_eq!(b.len(), 3),
            other => panic!("expected a batch, got {other:?}"),
        }
        assert!(boxes.boxes[1].is_empty());
    }

    #[test]
    fn a_batch_reserves_a_unit_per_frame_capped_at_the_capacity() {
        let boxes = Mailboxes::new(1, 4);
        interested(&boxes);
        let three: BroadcastBatch = vec![msg(), msg(), msg()].into();
        assert!(boxes.broadcast_batch(three.clone()));
        assert_eq!(boxes.boxes[0].len(), 3);
        assert!(!boxes.broadcast_batch(three), "3 + 3 frames > 4");
        assert!(boxes.broadcast(msg()), "one frame still fits");
        assert!(!boxes.broadcast(msg()));
        let mb = boxes.get(0).unwrap();
        while mb.try_recv().is_some() {}
        assert_eq!(mb.len(), 0, "every unit came back");
        let ten: BroadcastBatch = (0..10).map(|_| msg()).collect::<Vec<_>>().into();
        assert!(
            boxes.broadcast_batch(ten.clone()),
            "any batch fits an empty mailbox"
        );
        assert_eq!(mb.len(), 4);
        assert!(!boxes.broadcast(msg()));
        assert!(mb.try_recv().is_some());
        assert_eq!(mb.len(), 0);
    }

    /// One worker of capacity 1, full with one broadcast.
    fn full_box() -> Mailboxes {
        let boxes = Mailboxes::new(1, 1);
        interested(&boxes);
        assert!(boxes.broadcast(msg()));
        boxes
    }

    #[test]
    fn control_ignores_capacity() {
        let boxes = full_box();
        boxes.control(|| Envelope::Shutdown);
        let mb = boxes.get(0).unwrap();
        assert!(matches!(mb.try_recv(), Some(Envelope::Broadcast(_))));
        assert!(matches!(mb.try_recv(), Some(Envelope::Shutdown)));
        assert_eq!(mb.len(), 0);
    }

    /// A cluster confirmation is a control envelope: it holds no frame, so it neither
    /// takes room from broadcasts nor shows in the depth (and taking it frees none).
    #[test]
    fn interest_ready_counts_no_frames() {
        let boxes = full_box();
        assert!(boxes.control_to(
            0,
            Envelope::InterestReady {
                project: 0,
                channel: "c".into(),
                ticket: 1,
            },
        ));
        let mb = boxes.get(0).unwrap();
        assert_eq!(mb.len(), 1, "only the broadcast counts");
        assert!(matches!(mb.try_recv(), Some(Envelope::Broadcast(_))));
        assert_eq!(mb.len(), 0);
        assert!(matches!(
            mb.try_recv(),
            Some(Envelope::InterestReady { ticket: 1, .. })
        ));
        assert_eq!(mb.len(), 0, "no underflow");
        assert!(boxes.broadcast(msg()), "room for a broadcast again");
    }

    #[test]
    fn cross_thread_push_and_drain() {
        let boxes = Mailboxes::new(1, 1 << 16);
        interested(&boxes);
        let mb = boxes.get(0).unwrap();
        let producer = {
            let boxes = boxes.clone();
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    while !boxes.broadcast(msg()) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut got = 0;
        while got < 10_000 {
            if mb.try_recv().is_some() {
                got += 1;
            }
        }
        producer.join().unwrap();
        assert!(mb.is_empty());
    }
}
