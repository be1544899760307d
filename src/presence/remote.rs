//! Cluster mode of the presence hub: presence sets and subscriber counts are
//! cluster-wide, in Redis, changed only by atomic Lua scripts run from this thread.
//!
//! Layout (all under `ringcast:`; `<pid>` is the project id, which never holds `:`):
//! - `occ:<pid>`: hash channel → subscribers on every node; `occn:<node>`: hash
//!   `<pid>\n<channel>` → this node's share (so a dead node's share can be taken back);
//!   `occl:<pid>`: sorted set of the occupied names, for prefix listings (kept by the
//!   count and reap scripts of `super::scripts`, read by [`super::listing`]).
//! - `pres:<pid>:<channel>`: hash user → connections on every node; `presi:…`: user →
//!   info of its first connection; `preso:…`: sorted set user by join sequence
//!   (`preseq`), for join order; `presn:<node>`: hash `<pid>\n<channel>\n<user>` → this
//!   node's connections of that user.
//! - `alive:<node>`: this node's lease, set with a [`LEASE`] expiry every [`TICK`];
//!   `nodes`: the set of nodes that hold shares.
//!
//! Invariants:
//! - Every transition (channel occupied or vacated anywhere, user added or removed
//!   anywhere) is decided inside one script, so exactly one node sees it: that node
//!   sends the presence frame to every node (its own workers directly, the others
//!   through the channel's Redis pub/sub channel) and reports it to the webhooks.
//! - A node that stops refreshing its lease (killed, cut off) is reaped by any other
//!   node within [`LEASE`] + [`TICK`]: the reap script takes back its shares atomically
//!   (and only once), and the reaping node announces the leaves and vacated channels.
//! - After any reconnect, and whenever its lease was found gone, a node takes back its
//!   own shares and asserts again what its workers hold now, so Redis never keeps a
//!   share the node no longer has. Transitions while Redis is away are decided on the
//!   node alone (its own members only) and announced to its own workers only.
//! - Frames received from other nodes are delivered as they are by `cluster::inbound`,
//!   so a join may reach a subscriber whose member list already holds that user: join
//!   and leave are set operations for clients (documented in docs/protocol.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::listing::{Ask, Lister};
use super::scripts::{Scripts, COUNT_SCRIPT};
use super::{
    checked_member, join_here, presence_frame, presence_object, ChannelInfo, Count, Effects, Local,
    Members, Op, Query,
};
use crate::auth::cache::ProjectIndex;
use crate::auth::KeyCache;
use crate::ids::SocketId;
use crate::shard::mailbox::PresenceAnswer;
use crate::shard::PresenceJoin;

/// How long a node's lease lasts without a refresh.
pub(crate) const LEASE: Duration = Duration::from_secs(20);
/// How often a node refreshes its lease and looks for dead nodes.
pub(crate) const TICK: Duration = Duration::from_secs(2);
/// Most subscriber-count changes sent to Redis in one pipeline.
const MAX_PIPELINE: usize = 512;
pub(crate) use crate::wire::relay::VERSION_PRESENCE;

/// What cluster mode needs at start.
pub(crate) struct Setup {
    pub client: redis::Client,
    /// The cluster bridge's node id (its payloads carry it; its own are skipped).
    pub node_id: u64,
    pub keys: Arc<KeyCache>,
}

/// Subscriber-count changes waiting for one pipeline.
type Counts = Vec<Count>;

struct Remote {
    setup: Setup,
    node: String,
    scripts: Scripts,
    conn: Option<redis::Connection>,
    /// No reconnect attempt before this instant (backoff).
    retry_at: Instant,
    backoff: crate::redis_link::Backoff,
    /// This node's shares must be taken back and asserted again before they are used.
    stale: bool,
    projects: ProjectIndex,
    /// Cluster listings, on their own thread and connection (see [`super::listing`]).
    lister: Option<Lister>,
}

/// The hub's loop in cluster mode.
pub(super) fn run(rx: Receiver<Op>, mut local: Local, fx: Effects, setup: Setup) {
    let mut r = Remote {
        node: format!("{:016x}", setup.node_id),
        setup,
        scripts: Scripts::new(),
        conn: None,
        retry_at: Instant::now(),
        backoff: crate::redis_link::Backoff::new(),
        stale: true,
        projects: ProjectIndex::new(),
        lister: None,
    };
    match Lister::start(r.setup.client.clone()) {
        Ok(l) => r.lister = Some(l),
        // Listings then answer 503 (their reply is dropped); the rest works.
        Err(e) => tracing::error!(error = %e, "presence: cannot start the listing thread"),
    }
    let mut next_tick = Instant::now();
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(op) => {
                // Subscriber counts change at every subscribe and unsubscribe: those
                // queued together go to Redis in one pipelined round trip.
                // Anything else first sends the counts queued before it (in order).
                let mut counts = Vec::new();
                let mut next = Some(op);
                while let Some(op) = next.take() {
                    let count = matches!(op, Op::Count(_));
                    if !count {
                        r.counts(&fx, &mut counts);
                    }
                    r.apply(&mut local, &fx, op, &mut counts);
                    if count && counts.len() < MAX_PIPELINE {
                        next = rx.try_recv().ok();
                    }
                }
                r.counts(&fx, &mut counts);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() >= next_tick {
            r.tick(&local, &fx);
            next_tick = Instant::now() + TICK;
        }
    }
}

impl Remote {
    fn pid(&mut self, project: u32) -> Option<Box<str>> {
        self.projects
            .get(&self.setup.keys, project)
            .map(|p| p.id.as_str().into())
    }

    fn lost(&mut self, e: &redis::RedisError) {
        if self.conn.take().is_some() {
            tracing::warn!(error = %e, "presence: Redis unavailable; presence is node-local until it is back");
        }
        self.stale = true;
    }

    /// Apply one op; a count change is counted here and queued in `counts`, for the
    /// caller's next pipeline ([`Remote::counts`]).
    fn apply(&mut self, local: &mut Local, fx: &Effects, op: Op, counts: &mut Counts) {
        match op {
            Op::Count(c) => {
                local.count(&c);
                counts.push(c);
            }
            Op::Join(j) => self.join(local, fx, j),
            Op::Leave(l) => {
                let Some((user, last)) = local.leave(&l) else {
                    return;
                };
                let (project, channel) = (l.project, &*l.channel);
                match self.redis_leave(project, channel, &user) {
                    Some(true) => self.announce(fx, project, channel, &user, None, None),
                    Some(false) => {}
                    // Redis away: this node's own subscribers still hear it.
                    None if last => fx.left(project, channel, &user),
                    None => {}
                }
            }
            Op::Query(q) => self.query(local, q),
            Op::Stop(reply) => {
                self.give_back(fx);
                reply.send(Ok(()));
            }
        }
    }

    /// Shutdown: take back this node's shares, announce what that ended, drop the
    /// lease. Nothing is asserted again after this.
    fn give_back(&mut self, fx: &Effects) {
        let node = self.node.clone();
        let Some(conn) = live(&mut self.conn, self.stale) else {
            return;
        };
        let r: redis::RedisResult<Vec<String>> = self.scripts.reap.arg(&node).arg("1").invoke(conn);
        let out = match r {
            Ok(out) => out,
            Err(e) => return self.lost(&e),
        };
        self.announce_reaped(fx, out);
        if let Some(conn) = self.conn.as_mut() {
            let _: redis::RedisResult<()> = redis::pipe()
                .cmd("DEL")
                .arg(format!("ringcast:alive:{node}"))
                .ignore()
                .cmd("SREM")
                .arg("ringcast:nodes")
                .arg(&node)
                .ignore()
                .query(conn);
        }
        // Stay away from Redis from now on (no lease, no re-assertion).
        self.conn = None;
        self.retry_at = Instant::now() + Duration::from_secs(3600);
    }

    /// Apply subscriber-count changes (already counted locally) to Redis in one
    /// pipeline, reporting the transitions they make; empties `counts`.
    fn counts(&mut self, fx: &Effects, counts: &mut Counts) {
        if counts.is_empty() {
            return;
        }
        let node = self.node.clone();
        let items: Vec<(u32, Box<str>, Box<str>, i32)> = counts
            .drain(..)
            .filter_map(|c| Some((c.project, self.pid(c.project)?, c.channel, c.delta)))
            .collect();
        let Some(conn) = live(&mut self.conn, self.stale) else {
            return; // asserted again, whole, once Redis is back
        };
        let mut pipe = redis::pipe();
        for (_, pid, channel, delta) in &items {
            // EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT; Redis keeps
            // the compiled script by its hash either way.
            pipe.cmd("EVAL")
                .arg(COUNT_SCRIPT)
                .arg(0)
                .arg(&node)
                .arg(&**pid)
                .arg(&**channel)
                .arg(*delta);
        }
        let r: redis::RedisResult<Vec<i64>> = pipe.query(conn);
        match r {
            Ok(transitions) => {
                for ((project, _, channel, _), t) in items.iter().zip(transitions) {
                    transition_hook(fx, *project, channel, t);
                }
            }
            Err(e) => self.lost(&e),
        }
    }

    /// `Some(removed cluster-wide)`, or `None` when Redis could not be asked.
    fn redis_leave(&mut self, project: u32, channel: &str, user: &str) -> Option<bool> {
        let pid = self.pid(project)?;
        let node = self.node.clone();
        let conn = live(&mut self.conn, self.stale)?;
        let r: redis::RedisResult<i64> = self
            .scripts
            .leave
            .arg(&node)
            .arg(&*pid)
            .arg(channel)
            .arg(user)
            .invoke(conn);
        match r {
            Ok(n) => Some(n == 1),
            Err(e) => {
                self.lost(&e);
                None
            }
        }
    }

    fn join(&mut self, local: &mut Local, fx: &Effects, j: PresenceJoin) {
        // A connection is one member (see the hub's invariants): refused before Redis.
        if local.held_as_other(&j) {
            fx.answer(j.worker, j.ticket, PresenceAnswer::OtherUser);
            return;
        }
        let max = local.max_members;
        let asked = self.redis_join(&j, max);
        let answer = match asked {
            Some(Ok((added, members))) => {
                local.join(&j, false);
                if added {
                    self.announce(
                        fx,
                        j.project,
                        &j.channel,
                        &j.user_id,
                        j.info.as_deref(),
                        Some(SocketId::local(j.worker, j.conn)),
                    );
                }
                let object =
                    presence_object(members.iter().map(|(u, i)| (u.as_str(), i.as_deref())));
                PresenceAnswer::Joined(object.into())
            }
            Some(Err(())) => PresenceAnswer::Full,
            // Redis away: decided on this node alone, announced here only (the
            // webhook transition is Redis' to decide, cluster-wide).
            None => join_here(local, fx, &j, false),
        };
        fx.answer(j.worker, j.ticket, answer);
        local.tidy(j.project, &j.channel);
    }

    /// `Some(Ok((added cluster-wide, members in join order)))`, `Some(Err(()))` when the
    /// channel is full, `None` when Redis could not be asked.
    #[allow(clippy::type_complexity)]
    fn redis_join(
        &mut self,
        j: &PresenceJoin,
        max: usize,
    ) -> Option<Result<(bool, Vec<(String, Option<String>)>), ()>> {
        let pid = self.pid(j.project)?;
        let node = self.node.clone();
        let conn = live(&mut self.conn, self.stale)?;
        let r: redis::RedisResult<redis::Value> = self
            .scripts
            .join
            .arg(&node)
            .arg(&*pid)
            .arg(&*j.channel)
            .arg(&*j.user_id)
            .arg(j.info.as_deref().unwrap_or(""))
            .arg(max)
            .invoke(conn);
        let v = match r {
            Ok(v) => v,
            Err(e) => {
                self.lost(&e);
                return None;
            }
        };
        let redis::Value::Array(items) = v else {
            return None;
        };
        let status = match items.first() {
            Some(redis::Value::Int(s)) => *s,
            _ => return None,
        };
        if status == 0 {
            return Some(Err(()));
        }
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        };
        let members = items[1..]
            .chunks(2)
            .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
            .filter_map(|(u, i)| checked_member(u, Some(i)))
            .collect();
        Some(Ok((status == 2, members)))
    }

    /// A join (`info` given or not, `except` the joiner) or a leave (`except` None)
    /// decided here for the whole cluster: the frame to this node's workers and to the
    /// other nodes, and the transition to the webhooks.
    fn announce(
        &mut self,
        fx: &Effects,
        project: u32,
        channel: &str,
        user: &str,
        info: Option<&str>,
        except: Option<SocketId>,
    ) {
        let join = except.is_some();
        let frame = presence_frame(channel, if join { "join" } else { "leave" }, user, info);
        fx.frame(project, channel, frame.clone(), except);
        self.relay(project, channel, &frame);
        if let Some(h) = fx.hooks() {
            if join {
                h.member_added(project, channel, user);
            } else {
                h.member_removed(project, channel, user);
            }
        }
    }

    /// PUBLISH a presence frame on the channel's Redis channel for the other nodes.
    fn relay(&mut self, project: u32, channel: &str, frame: &Bytes) {
        let Some(pid) = self.pid(project) else { return };
        let payload = crate::wire::relay::encode_presence(self.setup.node_id, frame);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let r: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(crate::names::redis_channel(&pid, channel))
            .arg(payload)
            .query(conn);
        if let Err(e) = r {
            self.lost(&e);
        }
    }

    fn query(&mut self, local: &Local, q: Query) {
        if live(&mut self.conn, self.stale).is_none() {
            // Redis away: this node's own view.
            return local.answer(q);
        }
        let Some(pid) = self.pid(q.project()) else {
            return q.answer_unknown();
        };
        match q {
            Query::Channels {
                prefix,
                users,
                reply,
                ..
            } => {
                // Not answered here: a listing must not hold up joins, leaves and counts.
                if let Some(lister) = &self.lister {
                    lister.ask(Ask {
                        pid,
                        prefix,
                        users,
                        reply,
                    });
                }
            }
            Query::Info { channel, reply, .. } => {
                let Some(conn) = live(&mut self.conn, self.stale) else {
                    return;
                };
                let r: redis::RedisResult<(Option<i64>, i64)> = redis::pipe()
                    .cmd("HGET")
                    .arg(format!("ringcast:occ:{pid}"))
                    .arg(&*channel)
                    .cmd("HLEN")
                    .arg(format!("ringcast:pres:{pid}:{channel}"))
                    .query(conn);
                match r {
                    Ok((subs, users)) => reply.send(Ok(ChannelInfo {
                        subscribers: subs.unwrap_or(0).max(0) as u64,
                        user_count: crate::shard::is_presence(&channel)
                            .then_some(users.max(0) as usize),
                    })),
                    Err(e) => {
                        self.lost(&e);
                        drop(reply);
                    }
                }
            }
            Query::Members { channel, reply, .. } => {
                let Some(conn) = live(&mut self.conn, self.stale) else {
                    return;
                };
                let base = format!("ringcast:{{}}:{pid}:{channel}");
                let users: redis::RedisResult<Vec<String>> = redis::cmd("ZRANGE")
                    .arg(base.replace("{}", "preso"))
                    .arg(0)
                    .arg(-1)
                    .query(conn);
                let users = match users {
                    Ok(u) => u,
                    Err(e) => {
                        self.lost(&e);
                        return drop(reply);
                    }
                };
                let infos: redis::RedisResult<Vec<Option<String>>> = if users.is_empty() {
                    Ok(Vec::new())
                } else {
                    redis::cmd("HMGET")
                        .arg(base.replace("{}", "presi"))
                        .arg(&users)
                        .query(conn)
                };
                match infos {
                    Ok(infos) => {
                        let members = users
                            .into_iter()
                            .zip(infos)
                            .filter_map(|(u, i)| checked_member(u, i))
                            .map(|(u, i)| (u.into_boxed_str(), i.map(String::into_boxed_str)))
                            .collect();
                        reply.send(Ok(Members { members }));
                    }
                    Err(e) => {
                        self.lost(&e);
                        drop(reply);
                    }
                }
            }
        }
    }

    /// Every [`TICK`]: (re)connect, renew the lease (asserting this node's shares again
    /// when they may be missing), and reap nodes whose lease ran out.
    fn tick(&mut self, local: &Local, fx: &Effects) {
        if self.conn.is_none() {
            if Instant::now() < self.retry_at {
                return;
            }
            match crate::redis_link::connect(&self.setup.client) {
                Ok(c) => {
                    self.conn = Some(c);
                    self.backoff.reset();
                    self.stale = true;
                }
                Err(_) => {
                    self.retry_at = Instant::now() + self.backoff.next_delay();
                    return;
                }
            }
        }
        if let Err(e) = self.renew(local, fx) {
            self.lost(&e);
            return;
        }
        if let Err(e) = self.reap_dead(fx) {
            self.lost(&e);
        }
    }

    fn renew(&mut self, local: &Local, fx: &Effects) -> redis::RedisResult<()> {
        let node = self.node.clone();
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let (old, _): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(format!("ringcast:alive:{node}"))
            .arg(1)
            .arg("PX")
            .arg(LEASE.as_millis() as u64)
            .arg("GET")
            .cmd("SADD")
            .arg("ringcast:nodes")
            .arg(&node)
            .query(conn)?;
        if old.is_none() {
            // Our lease was gone: another node may have reaped our shares.
            self.stale = true;
        }
        if self.stale {
            self.assert_shares(local, fx)?;
            self.stale = false;
        }
        Ok(())
    }

    /// Take back this node's shares and add what its workers hold now.
    fn assert_shares(&mut self, local: &Local, fx: &Effects) -> redis::RedisResult<()> {
        let node = self.node.clone();
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let _: redis::Value = self.scripts.reap.arg(&node).arg("1").invoke(conn)?;
        let mut joins = Vec::new();
        let mut counts = Vec::new();
        for (&project, channels) in &local.projects {
            for (name, ch) in channels {
                if ch.subscribers > 0 {
                    counts.push((project, name.clone(), ch.subscribers));
                }
                for (user, m) in &ch.members {
                    for _ in &m.conns {
                        joins.push((project, name.clone(), user.clone(), m.info.clone()));
                    }
                }
            }
        }
        for (project, channel, n) in counts {
            let Some(pid) = self.pid(project) else {
                continue;
            };
            let Some(conn) = self.conn.as_mut() else {
                break;
            };
            let t: i64 = self
                .scripts
                .count
                .arg(&node)
                .arg(&*pid)
                .arg(&*channel)
                .arg(n)
                .invoke(conn)?;
            transition_hook(fx, project, &channel, t);
        }
        for (project, channel, user, info) in joins {
            let Some(pid) = self.pid(project) else {
                continue;
            };
            let Some(conn) = self.conn.as_mut() else {
                break;
            };
            let v: redis::Value = self
                .scripts
                .join
                .arg(&node)
                .arg(&*pid)
                .arg(&*channel)
                .arg(&*user)
                .arg(info.as_deref().unwrap_or(""))
                // Members this node already has are kept whatever the limit.
                .arg(usize::MAX)
                .invoke(conn)?;
            let added = matches!(&v, redis::Value::Array(items) if matches!(items.first(), Some(redis::Value::Int(2))));
            if added {
                // The others lost this member when this node was reaped: tell them.
                let frame = presence_frame(&channel, "join", &user, info.as_deref());
                self.relay(project, &channel, &frame);
                if let Some(h) = fx.hooks() {
                    h.member_added(project, &channel, &user);
                }
            }
        }
        Ok(())
    }

    fn reap_dead(&mut self, fx: &Effects) -> redis::RedisResult<()> {
        let node = self.node.clone();
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let nodes: Vec<String> = redis::cmd("SMEMBERS").arg("ringcast:nodes").query(conn)?;
        for other in nodes.into_iter().filter(|n| *n != node) {
            let Some(conn) = self.conn.as_mut() else {
                break;
            };
            let alive: bool = redis::cmd("EXISTS")
                .arg(format!("ringcast:alive:{other}"))
                .query(conn)?;
            if alive {
                continue;
            }
            let out: Vec<String> = self.scripts.reap.arg(&other).arg("0").invoke(conn)?;
            if out.is_empty() {
                continue;
            }
            self.announce_reaped(fx, out);
            tracing::warn!(node = %other, "presence: a node's lease ran out; its members and subscriptions were removed");
        }
        Ok(())
    }
}

/// The connection, when Redis is reachable and this node's shares are asserted.
fn live(conn: &mut Option<redis::Connection>, stale: bool) -> Option<&mut redis::Connection> {
    if stale {
        return None;
    }
    conn.as_mut()
}

impl Remote {
    /// Announce the transitions a reap returned (see [`super::scripts::REAP_SCRIPT`]).
    fn announce_reaped(&mut self, fx: &Effects, out: Vec<String>) {
        let mut it = out.into_iter();
        let snapshot = self.setup.keys.load();
        while let Some(kind) = it.next() {
            let (Some(pid), Some(channel)) = (it.next(), it.next()) else {
                break;
            };
            let user = if kind == "r" { it.next() } else { None };
            let Some(project) = snapshot.project(&pid).map(|p| p.index) else {
                continue;
            };
            match user {
                Some(user) => self.announce(fx, project, &channel, &user, None, None),
                None => {
                    if let Some(h) = fx.hooks() {
                        h.vacated(project, &channel);
                    }
                }
            }
        }
    }
}

fn transition_hook(fx: &Effects, project: u32, channel: &str, t: i64) {
    if let Some(h) = fx.hooks() {
        match t {
            1 => h.occupied(project, channel),
            -1 => h.vacated(project, channel),
            _ => {}
        }
    }
}
