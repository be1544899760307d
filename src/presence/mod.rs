//! The node's presence and occupancy hub: who is in each presence channel (per user, not
//! per connection) and how many subscribers each channel has across all workers. It
//! runs on its own control-plane thread and owns that state alone, so nothing on the
//! fan-out path ever takes a lock for it. It answers joins through the mailboxes and REST
//! queries through [`crate::reply`].
//!
//! Inputs, in one FIFO queue (so what one worker says arrives in the order it said it):
//! subscriber-count changes, presence joins and presence leaves from every shard
//! (through [`ChannelWatch`]; `Shard::join` makes the joins), and REST queries.
//! Outputs: join/leave frames pushed to the workers' mailboxes as
//! [`Envelope::Presence`](crate::shard::mailbox::Envelope) control envelopes, join
//! answers as `PresenceReady` to the joining worker, and query answers through
//! [`crate::reply`].
//!
//! Invariants:
//! - A user joins once and leaves once: the join frame goes out when the user's first
//!   connection joins, the leave frame when its last one is gone, whatever ended it
//!   (every end of a subscription passes through `Shard::unsubscribe`, which tells the
//!   hub). Members are listed in join order; the first connection's `info` is the
//!   member's.
//! - At most `max_presence_members` distinct users per channel; another user is
//!   answered `Full` and nothing changes.
//! - A connection is at most one member of a channel: a join by a connection already
//!   held under another user id is answered `OtherUser` and nothing changes (else the
//!   first user would be orphaned: never left, never announced as removed).
//! - A joiner's answer is queued on its worker after the join frame went to every
//!   worker, and every later join or leave frame is queued after the answer, so the
//!   member list in its `subscribed` and the frames that follow never disagree.
//! - A channel's record exists only while it has subscribers or members.
//! - The queue is unbounded: only workers produce into it, a few entries per subscribe
//!   or unsubscribe, and the hub drains far faster than clients can subscribe.

mod listing;
pub(crate) mod remote;
mod scripts;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use indexmap::IndexMap;

use crate::ids::SocketId;
use crate::reply::{Reply, ReplyTx, Unreachable};
use crate::shard::mailbox::{Broadcast, Envelope, Mailboxes, PresenceAnswer};
use crate::shard::{ChannelWatch, PresenceJoin};
use crate::wire::native::{presence_frame, MAX_USER_ID_CHARS};

/// Most channels one occupancy listing returns. The hub answers one more when there are
/// more (at most `MAX_LISTED + 1`), so the listing can say it was cut.
pub(crate) const MAX_LISTED: usize = 10_000;

/// One channel's counts, for `GET /api/v1/channels/info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelInfo {
    pub subscribers: u64,
    /// Distinct users, for presence channels.
    pub user_count: Option<usize>,
}

/// One presence channel's members, oldest join first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Members {
    /// `(user_id, info JSON text)`.
    pub members: Vec<(Box<str>, Option<Box<str>>)>,
}

/// One occupied channel of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub name: Box<str>,
    pub subscribers: u64,
    /// Distinct users, when the listing asked for them and the channel is a presence
    /// channel.
    pub user_count: Option<usize>,
}

/// A REST question.
pub(crate) enum Query {
    /// Occupied channels whose name starts with `prefix`, sorted, at most
    /// [`MAX_LISTED`] `+ 1` (the one more says the listing is cut);
    /// with `users`, each presence channel's user count too (Pusher's `info=user_count`).
    Channels {
        project: u32,
        prefix: Box<str>,
        users: bool,
        reply: ReplyTx<Vec<Listed>>,
    },
    Info {
        project: u32,
        channel: Box<str>,
        reply: ReplyTx<ChannelInfo>,
    },
    Members {
        project: u32,
        channel: Box<str>,
        reply: ReplyTx<Members>,
    },
}

impl Query {
    fn project(&self) -> u32 {
        match self {
            Query::Channels { project, .. }
            | Query::Info { project, .. }
            | Query::Members { project, .. } => *project,
        }
    }

    /// Answer for a project the node does not know (cluster mode: its id is needed to
    /// ask Redis): nothing is occupied.
    fn answer_unknown(self) {
        match self {
            Query::Channels { reply, .. } => reply.send(Ok(Vec::new())),
            Query::Info { reply, .. } => reply.send(Ok(ChannelInfo {
                subscribers: 0,
                user_count: None,
            })),
            Query::Members { reply, .. } => reply.send(Ok(Members {
                members: Vec::new(),
            })),
        }
    }
}

/// A channel's subscriber count moved by `delta` (a subscribe or an unsubscribe on a
/// worker).
struct Count {
    project: u32,
    channel: Box<str>,
    delta: i32,
}

/// Connection `conn` of `worker` left presence channel `channel` (or closed).
struct Leave {
    project: u32,
    channel: Box<str>,
    worker: usize,
    conn: u64,
}

enum Op {
    Count(Count),
    Join(PresenceJoin),
    Leave(Leave),
    Query(Query),
    /// The node is stopping: give back what it holds (cluster mode), then answer.
    Stop(ReplyTx<()>),
}

/// The hub's handle: cheap to clone behind an `Arc`, used from any thread.
pub(crate) struct Hub {
    tx: Sender<Op>,
}

impl Hub {
    /// Start the hub's thread. It ends when every handle is gone. With `cluster`, the
    /// sets are cluster-wide through Redis (see [`remote`]).
    pub(crate) fn start(
        mailboxes: Mailboxes,
        max_members: usize,
        hooks: Option<Arc<dyn Transitions>>,
        cluster: Option<remote::Setup>,
    ) -> std::io::Result<Arc<Hub>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let effects = Effects { mailboxes, hooks };
        std::thread::Builder::new()
            .name("presence".into())
            .spawn(move || match cluster {
                None => run_local(rx, Local::new(max_members), effects),
                Some(setup) => remote::run(rx, Local::new(max_members), effects, setup),
            })?;
        Ok(Arc::new(Hub { tx }))
    }

    /// Ask a REST question (`query` makes it around its reply); the answer comes
    /// through the returned reply (or `Unreachable` when the hub is gone).
    pub(crate) fn ask<T>(
        &self,
        query: impl FnOnce(ReplyTx<T>) -> Query,
    ) -> Reply<Result<T, Unreachable>> {
        let (tx, rx) = crate::reply::reply();
        let _ = self.tx.send(Op::Query(query(tx)));
        rx
    }

    /// At shutdown, after the workers closed their connections: in cluster mode, take
    /// this node's members and subscribers out of Redis now and tell the other nodes
    /// (rather than when its lease lapses). Waits at most `limit`.
    pub(crate) fn stop(&self, limit: std::time::Duration) {
        let (tx, rx) = crate::reply::reply();
        if self.tx.send(Op::Stop(tx)).is_err() {
            return;
        }
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if rx.try_take().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl ChannelWatch for Hub {
    fn count(&self, _worker: usize, project: u32, channel: &str, delta: i32) {
        let _ = self.tx.send(Op::Count(Count {
            project,
            channel: channel.into(),
            delta,
        }));
    }

    /// Ask to join; the answer reaches the worker's mailbox.
    fn join(&self, join: PresenceJoin) {
        // The thread outlives every handle; a send fails only while the process ends.
        let _ = self.tx.send(Op::Join(join));
    }

    fn leave(&self, worker: usize, conn: u64, project: u32, channel: &str) {
        let _ = self.tx.send(Op::Leave(Leave {
            project,
            channel: channel.into(),
            worker,
            conn,
        }));
    }
}

/// Where the hub reports channel and member transitions (webhooks). Called on the
/// hub's thread; it must not block. In cluster mode each transition is reported by
/// exactly one node: the one whose change made it.
pub(crate) trait Transitions: Send + Sync {
    fn occupied(&self, project: u32, channel: &str);
    fn vacated(&self, project: u32, channel: &str);
    fn member_added(&self, project: u32, channel: &str, user_id: &str);
    fn member_removed(&self, project: u32, channel: &str, user_id: &str);
}

/// What the hub makes happen outside itself: frames to the workers, transitions to
/// the webhooks, answers to joiners.
pub(crate) struct Effects {
    mailboxes: Mailboxes,
    hooks: Option<Arc<dyn Transitions>>,
}

impl Effects {
    /// A join or leave frame to this node's subscribers of the channel.
    fn frame(&self, project: u32, channel: &str, frame: Bytes, except: Option<SocketId>) {
        self.mailboxes.presence(Arc::new(Broadcast::new(
            project,
            channel.into(),
            frame,
            except,
        )));
    }

    /// The leave frame of `user` to this node's subscribers of the channel.
    fn left(&self, project: u32, channel: &str, user: &str) {
        let frame = presence_frame(channel, "leave", user, None);
        self.frame(project, channel, frame, None);
    }

    fn answer(&self, worker: usize, ticket: u64, answer: PresenceAnswer) {
        self.mailboxes
            .control_to(worker, Envelope::PresenceReady { ticket, answer });
    }

    fn hooks(&self) -> Option<&dyn Transitions> {
        self.hooks.as_deref()
    }
}

fn run_local(rx: Receiver<Op>, mut local: Local, fx: Effects) {
    for op in rx.iter() {
        apply_local(&mut local, &fx, op);
    }
}

/// A join decided by this node's state alone (single node, or a cluster node while
/// Redis is away): an added member is announced to the channel, the joiner left out,
/// before the joiner's answer is queued (see the module's invariants), and, with
/// `hook`, reported to the webhooks.
fn join_here(local: &mut Local, fx: &Effects, j: &PresenceJoin, hook: bool) -> PresenceAnswer {
    match local.join(j, true) {
        Joined::Full => PresenceAnswer::Full,
        Joined::OtherUser => PresenceAnswer::OtherUser,
        Joined::Again => PresenceAnswer::Joined(local.object(j.project, &j.channel).into()),
        Joined::Added => {
            let frame = presence_frame(&j.channel, "join", &j.user_id, j.info.as_deref());
            fx.frame(
                j.project,
                &j.channel,
                frame,
                Some(SocketId::local(j.worker, j.conn)),
            );
            if let Some(h) = fx.hooks().filter(|_| hook) {
                h.member_added(j.project, &j.channel, &j.user_id);
            }
            PresenceAnswer::Joined(local.object(j.project, &j.channel).into())
        }
    }
}

/// One operation on a single node, where this node's state is the whole truth.
fn apply_local(local: &mut Local, fx: &Effects, op: Op) {
    match op {
        Op::Count(c) => {
            let (before, after) = local.count(&c);
            if let Some(h) = fx.hooks() {
                if before == 0 && after > 0 {
                    h.occupied(c.project, &c.channel);
                } else if before > 0 && after == 0 {
                    h.vacated(c.project, &c.channel);
                }
            }
        }
        Op::Join(j) => {
            let answer = join_here(local, fx, &j, true);
            fx.answer(j.worker, j.ticket, answer);
            local.tidy(j.project, &j.channel);
        }
        Op::Leave(l) => {
            if let Some((user, true)) = local.leave(&l) {
                fx.left(l.project, &l.channel, &user);
                if let Some(h) = fx.hooks() {
                    h.member_removed(l.project, &l.channel, &user);
                }
            }
        }
        Op::Query(q) => local.answer(q),
        // A single node's state ends with the process.
        Op::Stop(reply) => reply.send(Ok(())),
    }
}

struct Member {
    info: Option<Box<str>>,
    /// (worker, connection id) of each connection of this user in the channel.
    conns: Vec<(usize, u64)>,
}

#[derive(Default)]
struct Channel {
    subscribers: u64,
    /// user id → member, in join order.
    members: IndexMap<Box<str>, Member>,
    /// (worker, connection) → its user, for leaves.
    by_conn: HashMap<(usize, u64), Box<str>>,
}

impl Channel {
    fn is_empty(&self) -> bool {
        self.subscribers == 0 && self.members.is_empty()
    }
}

/// What a join changed on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Joined {
    /// A new member.
    Added,
    /// Another connection of a member (or the same one again).
    Again,
    /// Over the member limit; nothing changed.
    Full,
    /// The connection is a member under another user id; nothing changed.
    OtherUser,
}

/// This node's own subscribers and members (the whole truth on a single node; this
/// node's share of it in cluster mode).
struct Local {
    max_members: usize,
    /// Per project, its channels by name (sorted: prefix listings are range scans).
    projects: HashMap<u32, BTreeMap<Box<str>, Channel>>,
}

impl Local {
    fn new(max_members: usize) -> Local {
        Local {
            max_members,
            projects: HashMap::new(),
        }
    }

    fn channel(&self, project: u32, channel: &str) -> Option<&Channel> {
        self.projects.get(&project)?.get(channel)
    }

    fn channel_mut(&mut self, project: u32, channel: &str) -> &mut Channel {
        let channels = self.projects.entry(project).or_default();
        if !channels.contains_key(channel) {
            channels.insert(channel.into(), Channel::default());
        }
        channels.get_mut(channel).expect("inserted above")
    }

    /// Drop a channel's record once nothing is left in it.
    fn tidy(&mut self, project: u32, channel: &str) {
        let Some(channels) = self.projects.get_mut(&project) else {
            return;
        };
        if channels.get(channel).is_some_and(Channel::is_empty) {
            channels.remove(channel);
            if channels.is_empty() {
                self.projects.remove(&project);
            }
        }
    }

    /// Apply a subscriber-count change; returns the count before and after.
    fn count(&mut self, c: &Count) -> (u64, u64) {
        let (project, channel, delta) = (c.project, &*c.channel, c.delta);
        let ch = self.channel_mut(project, channel);
        let before = ch.subscribers;
        ch.subscribers = if delta >= 0 {
            before.saturating_add(delta as u64)
        } else {
            before.saturating_sub(u64::from(delta.unsigned_abs()))
        };
        let after = ch.subscribers;
        self.tidy(project, channel);
        (before, after)
    }

    /// Record a join (the limit is checked only when `limit`: in cluster mode Redis
    /// checks it for the whole cluster). The caller tidies after a `Full`.
    fn join(&mut self, j: &PresenceJoin, limit: bool) -> Joined {
        if self.held_as_other(j) {
            return Joined::OtherUser;
        }
        let max = self.max_members;
        let ch = self.channel_mut(j.project, &j.channel);
        let key = (j.worker, j.conn);
        if let Some(member) = ch.members.get_mut(&j.user_id) {
            if !member.conns.contains(&key) {
                member.conns.push(key);
                ch.by_conn.insert(key, j.user_id.clone());
            }
            return Joined::Again;
        }
        if limit && ch.members.len() >= max {
            return Joined::Full;
        }
        ch.members.insert(
            j.user_id.clone(),
            Member {
                info: j.info.clone(),
                conns: vec![key],
            },
        );
        ch.by_conn.insert(key, j.user_id.clone());
        Joined::Added
    }

    /// Whether the joining connection is a member of the channel under another user id.
    fn held_as_other(&self, j: &PresenceJoin) -> bool {
        self.channel(j.project, &j.channel)
            .and_then(|c| c.by_conn.get(&(j.worker, j.conn)))
            .is_some_and(|user| *user != j.user_id)
    }

    /// Forget a connection's membership: its user, and whether that was the user's
    /// last connection here. `None`: it was not a member (refused, or never joined).
    fn leave(&mut self, l: &Leave) -> Option<(Box<str>, bool)> {
        let (project, channel, worker, conn) = (l.project, &*l.channel, l.worker, l.conn);
        let ch = self.projects.get_mut(&project)?.get_mut(channel)?;
        let user = ch.by_conn.remove(&(worker, conn))?;
        let member = ch.members.get_mut(&user)?;
        member.conns.retain(|&c| c != (worker, conn));
        let last = member.conns.is_empty();
        if last {
            // Keeps the others' join order (a shift, over at most the member limit).
            ch.members.shift_remove(&user);
        }
        self.tidy(project, channel);
        Some((user, last))
    }

    /// The channel's presence object (see [`presence_object`]).
    fn object(&self, project: u32, channel: &str) -> String {
        let members: Vec<(&str, Option<&str>)> = self
            .channel(project, channel)
            .map(|c| {
                c.members
                    .iter()
                    .map(|(u, m)| (&**u, m.info.as_deref()))
                    .collect()
            })
            .unwrap_or_default();
        presence_object(members.into_iter())
    }

    fn answer(&self, q: Query) {
        match q {
            Query::Channels {
                project,
                prefix,
                users,
                reply,
            } => {
                let list = self.projects.get(&project).map_or_else(Vec::new, |chs| {
                    chs.range::<str, _>((Bound::Included(&*prefix), Bound::Unbounded))
                        .take_while(|(name, _)| name.starts_with(&*prefix))
                        .filter(|(_, ch)| ch.subscribers > 0)
                        .take(MAX_LISTED + 1)
                        .map(|(name, ch)| Listed {
                            name: name.clone(),
                            subscribers: ch.subscribers,
                            user_count: (users && crate::shard::is_presence(name))
                                .then(|| ch.members.len()),
                        })
                        .collect()
                });
                reply.send(Ok(list));
            }
            Query::Info {
                project,
                channel,
                reply,
            } => {
                let ch = self.channel(project, &channel);
                let subscribers = ch.map_or(0, |c| c.subscribers);
                let user_count =
                    crate::shard::is_presence(&channel).then(|| ch.map_or(0, |c| c.members.len()));
                reply.send(Ok(ChannelInfo {
                    subscribers,
                    user_count,
                }));
            }
            Query::Members {
                project,
                channel,
                reply,
            } => {
                let members = self.channel(project, &channel).map_or_else(Vec::new, |c| {
                    c.members
                        .iter()
                        .map(|(u, m)| (u.clone(), m.info.clone()))
                        .collect()
                });
                reply.send(Ok(Members { members }));
            }
        }
    }
}

/// A member read back from Redis (cluster mode), checked as a single node checks what a
/// token or a Pusher `channel_data` gives it, before it reaches any client: `None` drops
/// a member whose user id is empty or longer than 128 characters; an `info` that is not
/// one JSON object of at most [`MAX_INFO_BYTES`](crate::auth::token::MAX_INFO_BYTES) is
/// left out (the member stays). Redis is shared: what it holds may have been written by
/// anyone who can reach it, and `info` is spliced into frames as it is.
pub(crate) fn checked_member(
    user: String,
    info: Option<String>,
) -> Option<(String, Option<String>)> {
    if !(1..=MAX_USER_ID_CHARS).contains(&user.chars().count()) {
        warn_unchecked("user id");
        return None;
    }
    let info = info.filter(|i| !i.is_empty()).and_then(|i| {
        let ok = i.len() <= crate::auth::token::MAX_INFO_BYTES
            && matches!(serde_json::from_str(&i), Ok(serde_json::Value::Object(_)));
        if !ok {
            warn_unchecked("info");
        }
        ok.then_some(i)
    });
    Some((user, info))
}

/// One warning per minute at most: a Redis full of bad members must not flood the log.
fn warn_unchecked(what: &'static str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            field = what,
            "presence: a member read from Redis was not what this node accepts from clients; it was left out (more are not logged for a minute)"
        );
    }
}

// The presence object and its member list are written by `wire::native` (every frame
// format in one place); listings and replies here and in `http` use them.
pub(crate) use crate::wire::native::{presence_object, write_members};

#[cfg(test)]
mod tests;
