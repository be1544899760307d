//! Cluster-mode channel history: positions, kept messages and epochs live in Redis, so
//! every node gives a channel the same offsets and epoch and a client may recover on
//! any node.
//!
//! Per (project, channel) two keys: a hash `ringcast:hm:<project id>:<channel>` with the
//! epoch (`e`) and the last offset given (`o`), and a stream
//! `ringcast:hs:<project id>:<channel>` of the kept messages (fields `o` offset, `b`
//! body, `d` where `data` starts in it), capped at `history_size` entries (`XADD
//! MAXLEN`) and expiring `history_ttl` after the last publish; entries older than the
//! TTL are never read (the stream ids are Redis' clock, reads start at now − TTL). The
//! hash lives twice the TTL after the channel's last publish, like a single node's
//! forgotten log. Only a publish makes it: reads (subscribes, recoveries, REST) of a
//! channel without one write nothing (see `first_epoch_lua!`), so reads of arbitrary
//! names cannot fill Redis.
//!
//! First epochs (`first_epoch_lua!`): a channel without a hash is at offset 0 under the
//! epoch `sha1(salt, window, window index, hash key)` (8 hex digits), where the window is
//! the hash's lifetime (twice the TTL, at least 60 s), its index Redis' time divided by
//! it, and the salt `ringcast:hsalt` one random value per Redis data set (a Redis that
//! lost its data draws another). A read tells that epoch without writing anything; the
//! first publish of the same window takes it. A history lasts at least one window, so a
//! later history of the channel falls in a later window and gets another epoch; one lost
//! early (eviction, `DEL`, `project set-history`) is caught by `ringcast:hn:<project id>`,
//! a sorted set of the channels whose history started in the current window (written by
//! publishes only, trimmed at each, expiring after a window): a channel listed there gets
//! a random epoch instead, from its publish and from reads alike. A reader told offset 0
//! whose channel sees its first publish in a later window is answered `recovered: false`
//! (nothing was missed), never a gap.
//!
//! - Publish ([`PUBLISH_SCRIPT`], one script call per request, whatever its number of
//!   messages and channels): for each frame, the hash gives the next offset (a missing
//!   hash, after expiry, eviction or a Redis restart without data, takes the epoch the
//!   node drew for this call and empties the stream), the stream keeps the message and
//!   the same script PUBLISHes `<offset>,<epoch>,<body>` ([`super::wire`]) on the
//!   channel's pub/sub channel. Offset order and pub/sub order are therefore the same
//!   on every node: Redis runs scripts one at a time.
//! - Read ([`READ_SCRIPT`]): the epoch and last offset (offset 0 under the channel's
//!   first epoch when there is no hash, writing nothing, so that a client told "offset 0"
//!   recovers the first messages) and up to `count` newest kept entries newer than
//!   `since`. A recovery's
//!   read also PUBLISHes a marker on the node's sync channel inside the same script:
//!   in that node's pub/sub stream the marker sits exactly between the messages the
//!   read saw and those it did not (see `inbound`).
//!
//! The thread here (`ringcast-history`, its own Redis connection) serves the workers'
//! publishes and REST reads: it takes everything queued (up to [`MAX_BATCH`] requests)
//! and sends it as one pipeline, and answers each worker through a [`Reply`], which
//! wakes the worker's task (workers never wait for Redis on their thread). While Redis
//! is unreachable every request is answered at once with [`Unreachable`].

use std::sync::atomic::Ordering;

use bytes::Bytes;
use crossbeam_channel::Receiver;
use redis::Value;

use super::{connect, next_batch, wire, Backoff, Cluster, MAX_BATCH};
use crate::history::backend;
use crate::history::{Epoch, Position, REDIS_META_PREFIX, REDIS_STREAM_PREFIX};

/// Requests waiting for the history thread; a full queue answers 503 at once.
pub(crate) const QUEUE: usize = 4096;

/// `first_epoch(meta, window, random, start)`: the epoch of a channel whose position hash
/// `meta` is missing (see the module's doc). `window`: the hash's lifetime in seconds
/// ([`meta_ttl_s`]); `random`: a random epoch, taken when this window's first epoch of
/// the channel was already used; `start`: a publish about to make the hash (records the
/// start in `ringcast:hn:<project id>`), not a read. Every script that reads or makes a
/// position hash starts with it (`concat!(first_epoch_lua!(), ...)`): they must all
/// agree on a channel's first epoch.
macro_rules! first_epoch_lua {
    () => {
        r#"
local function first_epoch(meta, window, random, start)
  local salt = redis.call('GET', 'ringcast:hsalt')
  if not salt then
    salt = random
    redis.call('SET', 'ringcast:hsalt', salt)
  end
  local pid, ch = string.match(meta, '^ringcast:hm:([^:]*):(.*)$')
  local w = tonumber(window)
  local t = redis.call('TIME')
  local k = math.floor(tonumber(t[1]) / w)
  local started = 'ringcast:hn:' .. pid
  if tonumber(redis.call('ZSCORE', started, ch)) == k then return random end
  if start then
    redis.call('ZREMRANGEBYSCORE', started, '-inf', k - 1)
    redis.call('ZADD', started, k, ch)
    redis.call('EXPIRE', started, w)
  end
  return string.sub(redis.sha1hex(salt .. '\n' .. w .. '\n' .. k .. '\n' .. meta), 1, 8)
end
"#
    };
}

/// One publish call: per frame, the next offset of its channel, the stream append and
/// the pub/sub publish of the positioned body. KEYS: hash and stream of each frame.
/// ARGV: payload header, a fresh epoch, MAXLEN, stream TTL (s), hash TTL (s), then per
/// frame its pub/sub channel, body and data start. Returns offset, epoch per frame.
pub(crate) const PUBLISH_SCRIPT: &str = concat!(
    first_epoch_lua!(),
    r#"
local header, fresh, maxlen, ttl, meta_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local out = {}
for i = 1, #KEYS / 2 do
  local meta, stream = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 5 + 4 * (i - 1)
  local epoch = redis.call('HGET', meta, 'e')
  if not epoch then
    epoch = first_epoch(meta, meta_ttl, fresh, true)
    redis.call('DEL', stream)
    redis.call('HSET', meta, 'e', epoch, 'o', 0)
  end
  local offset = redis.call('HINCRBY', meta, 'o', 1)
  local text = string.format('%d', offset)
  redis.call('XADD', stream, 'MAXLEN', maxlen, '*', 'o', text, 'b', ARGV[a + 2], 'd', ARGV[a + 3])
  redis.call('EXPIRE', stream, ttl)
  redis.call('EXPIRE', meta, meta_ttl)
  local h = header
  if ARGV[a + 4] ~= '' then
    -- A connection to leave out: version 5, the header's origin, then its 12 bytes.
    h = string.char(5) .. string.sub(header, 2) .. ARGV[a + 4]
  end
  redis.call('PUBLISH', ARGV[a + 1], h .. text .. ',' .. epoch .. ',' .. ARGV[a + 2])
  out[#out + 1] = offset
  out[#out + 1] = epoch
end
return out
"#
);

/// One read. KEYS: hash, stream. ARGV: a fresh epoch, the hash's lifetime (s, the
/// first epoch's window), TTL (ms), `since` (-1: none), most entries, sync channel
/// ('' : none), marker. Returns epoch, last offset, entries newest first (at most
/// `count`, and only those after `since`). Writes nothing for a channel without a hash
/// (but the one salt of the data set, once).
pub(crate) const READ_SCRIPT: &str = concat!(
    first_epoch_lua!(),
    r#"
local epoch = redis.call('HGET', KEYS[1], 'e')
local offset = 0
local n = tonumber(ARGV[5])
if not epoch then
  -- Nothing published (or forgotten): offset 0 under the epoch the first publish will
  -- take, and no entry (a stream left without its hash belongs to an older history).
  epoch = first_epoch(KEYS[1], ARGV[2], ARGV[1], false)
  n = 0
else
  offset = tonumber(redis.call('HGET', KEYS[1], 'o'))
end
local since = tonumber(ARGV[4])
if since >= 0 and offset - since < n then
  n = offset - since
end
local entries = {}
if n > 0 then
  local t = redis.call('TIME')
  local min = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[3])
  if min < 0 then min = 0 end
  entries = redis.call('XREVRANGE', KEYS[2], '+', string.format('%d', min), 'COUNT', n)
end
if ARGV[6] ~= '' then
  redis.call('PUBLISH', ARGV[6], ARGV[7])
end
return {epoch, offset, entries}
"#
);

/// The hash of a channel's position.
pub(crate) fn meta_key(project_id: &str, channel: &str) -> String {
    format!("{REDIS_META_PREFIX}{project_id}:{channel}")
}

/// The stream of a channel's kept messages.
pub(crate) fn stream_key(project_id: &str, channel: &str) -> String {
    format!("{REDIS_STREAM_PREFIX}{project_id}:{channel}")
}

/// Seconds the position hash outlives its last publish: twice the TTL (as a single node
/// forgets a log idle that long), at least a minute.
pub(crate) fn meta_ttl_s(ttl_s: u32) -> u64 {
    (2 * u64::from(ttl_s)).max(60)
}

pub(crate) use crate::reply::{reply, Reply, ReplyTx, Unreachable};

/// One message of one channel to publish.
pub(crate) struct Item {
    pub channel: Box<str>,
    /// [`wire::message_body`].
    pub body: Vec<u8>,
    pub data_start: usize,
    /// The connection the message must not reach (`socket_id`), relayed to every node.
    pub except: Option<crate::ids::SocketId>,
}

/// A publish of a history project: its frames in request order.
pub(crate) struct PublishRequest {
    pub project_id: Box<str>,
    pub size: u32,
    pub ttl_s: u32,
    pub items: Vec<Item>,
    /// The position of each item, in order.
    pub reply: ReplyTx<Vec<Position>>,
}

/// A REST read.
pub(crate) struct ReadRequest {
    pub project_id: Box<str>,
    pub channel: Box<str>,
    pub size: u32,
    pub ttl_s: u32,
    pub since: Option<u64>,
    pub limit: usize,
    pub reply: ReplyTx<backend::Read>,
}

pub(crate) enum Request {
    Publish(PublishRequest),
    Read(ReadRequest),
    /// A request with its own script call that answers itself (a publish with an
    /// `Idempotency-Key`: `cluster::idempotency`).
    Scripted(Box<dyn Scripted>),
}

/// A request that brings its own script call and decodes its own reply; it rides this
/// thread's queue and pipeline like a publish.
pub(crate) trait Scripted: Send {
    /// The script its call runs by SHA1 (`EVALSHA`), loaded here on a NOSCRIPT answer.
    fn script(&self) -> &'static str;
    /// The call, for node `node`.
    fn cmd(&self, node: u64) -> redis::Cmd;
    /// Answer the waiting worker from Redis' reply; `false` when the reply did not
    /// decode (counted as a history error).
    fn answer(self: Box<Self>, v: Value) -> bool;
}

/// One kept message as read back.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub offset: u64,
    pub body: Bytes,
    pub data_start: usize,
}

/// A channel's position and kept messages after `since`, oldest first.
#[derive(Debug)]
pub(crate) struct Read {
    pub position: Position,
    pub entries: Vec<Kept>,
}

/// The SHA1 of each script, computed once.
fn publish_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(PUBLISH_SCRIPT).get_hash().to_string())
}

fn read_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(READ_SCRIPT).get_hash().to_string())
}

/// The `EVALSHA` of a read (REST, or a recovery with its sync marker).
pub(crate) fn read_cmd(
    project_id: &str,
    channel: &str,
    ttl_s: u32,
    since: Option<u64>,
    count: usize,
    sync: Option<(&str, &str)>,
) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(read_sha())
        .arg(2)
        .arg(meta_key(project_id, channel))
        .arg(stream_key(project_id, channel))
        .arg(Epoch::random().as_str())
        .arg(meta_ttl_s(ttl_s))
        .arg(u64::from(ttl_s) * 1000)
        .arg(since.map_or(-1i64, |s| s.min(i64::MAX as u64) as i64))
        .arg(count.max(1))
        .arg(sync.map_or("", |s| s.0))
        .arg(sync.map_or("", |s| s.1));
    cmd
}

/// Load the scripts on `conn` (after a connect, or a NOSCRIPT answer).
pub(crate) fn load_scripts(conn: &mut redis::Connection) -> redis::RedisResult<()> {
    for code in [PUBLISH_SCRIPT, READ_SCRIPT] {
        load_script(conn, code)?;
    }
    Ok(())
}

fn load_script(conn: &mut redis::Connection, code: &str) -> redis::RedisResult<()> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(code)
        .query::<String>(conn)
        .map(drop)
}

/// Whether a reply is Redis' "no such script".
pub(crate) fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

/// Decode a read script's answer: `since` (if any) picks which entries are returned,
/// `limit` how many (the oldest ones after `since`, or the newest without it).
pub(crate) fn parse_read(v: Value, since: Option<u64>, limit: usize) -> Option<Read> {
    let Value::Array(parts) = v else {
        return None;
    };
    let mut parts = parts.into_iter();
    let epoch = match parts.next()? {
        Value::BulkString(b) => Epoch::parse(std::str::from_utf8(&b).ok()?)?,
        _ => return None,
    };
    let offset = match parts.next()? {
        Value::Int(i) => u64::try_from(i).ok()?,
        _ => return None,
    };
    let Value::Array(raw) = parts.next()? else {
        return None;
    };
    let mut entries = Vec::with_capacity(raw.len());
    for e in raw {
        entries.push(parse_entry(e)?);
    }
    entries.reverse();
    if let Some(s) = since {
        entries.retain(|e| e.offset > s);
        entries.truncate(limit);
    } else if entries.len() > limit {
        entries.drain(..entries.len() - limit);
    }
    Some(Read {
        position: Position { offset, epoch },
        entries,
    })
}

/// One `[id, [field, value, ...]]` stream entry.
fn parse_entry(v: Value) -> Option<Kept> {
    let Value::Array(pair) = v else {
        return None;
    };
    let Some(Value::Array(fields)) = pair.into_iter().nth(1) else {
        return None;
    };
    let (mut offset, mut body, mut data_start) = (None, None, None);
    let mut it = fields.into_iter();
    while let (Some(Value::BulkString(k)), Some(Value::BulkString(v))) = (it.next(), it.next()) {
        match &k[..] {
            b"o" => offset = wire::parse_offset(&v),
            b"b" => body = Some(Bytes::from(v)),
            b"d" => data_start = std::str::from_utf8(&v).ok()?.parse().ok(),
            _ => {}
        }
    }
    let body = body?;
    let data_start: usize = data_start?;
    (data_start <= body.len()).then_some(Kept {
        offset: offset?,
        body,
        data_start,
    })
}

/// Whether `read` holds every message after `since` (of `epoch`) up to its position:
/// the recovery rule.
pub(crate) fn complete(read: &Read, since: u64, epoch: &str) -> bool {
    let p = &read.position;
    if epoch != p.epoch.as_str() || since > p.offset {
        return false;
    }
    let missed = p.offset - since;
    read.entries.len() as u64 == missed
        && read
            .entries
            .iter()
            .zip(since + 1..)
            .all(|(e, want)| e.offset == want)
}

impl Read {
    /// A REST read's answer: each kept body split into its event, data and id (a body
    /// that does not split, which only a foreign writer could have made, is left out).
    fn into_messages(self) -> backend::Read {
        let messages = self
            .entries
            .into_iter()
            .filter_map(|k| {
                let (event, data, id) = crate::wire::native::split_body(&k.body, k.data_start)?;
                Some(backend::Kept {
                    offset: k.offset,
                    event: event.into(),
                    data: k.body.slice_ref(data),
                    id: id.into(),
                })
            })
            .collect();
        backend::Read {
            position: self.position,
            messages,
        }
    }
}

/// The publish script's call for one request.
fn publish_cmd(node: u64, req: &PublishRequest) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(publish_sha()).arg(2 * req.items.len());
    for item in &req.items {
        cmd.arg(meta_key(&req.project_id, &item.channel))
            .arg(stream_key(&req.project_id, &item.channel));
    }
    publish_args(
        &mut cmd,
        node,
        &req.project_id,
        req.size,
        req.ttl_s,
        &req.items,
    );
    cmd
}

/// The publish script's ARGV for `items` (the keyed script passes the same to it).
pub(crate) fn publish_args(
    cmd: &mut redis::Cmd,
    node: u64,
    project_id: &str,
    size: u32,
    ttl_s: u32,
    items: &[Item],
) {
    cmd.arg(&wire::history_header(node)[..])
        .arg(Epoch::random().as_str())
        .arg(size)
        .arg(ttl_s.max(1))
        .arg(meta_ttl_s(ttl_s));
    for item in items {
        let except = item
            .except
            .map_or_else(Vec::new, |e| wire::except_bytes(e).to_vec());
        cmd.arg(wire::redis_channel(project_id, &item.channel))
            .arg(&item.body[..])
            .arg(item.data_start)
            .arg(except);
    }
}

pub(crate) fn parse_positions(v: Value, n: usize) -> Option<Vec<Position>> {
    let Value::Array(parts) = v else {
        return None;
    };
    if parts.len() != 2 * n {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    let mut it = parts.into_iter();
    while let (Some(Value::Int(o)), Some(Value::BulkString(e))) = (it.next(), it.next()) {
        out.push(Position {
            offset: u64::try_from(o).ok()?,
            epoch: Epoch::parse(std::str::from_utf8(&e).ok()?)?,
        });
    }
    (out.len() == n).then_some(out)
}

pub(crate) fn run(cluster: &Cluster, client: &redis::Client, rx: &Receiver<Request>) {
    let mut backoff = Backoff::new();
    let mut batch: Vec<Request> = Vec::with_capacity(MAX_BATCH);
    while !cluster.stopping() {
        let mut conn = match connect(client).and_then(|mut c| {
            load_scripts(&mut c)?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cluster history: Redis unavailable");
                // Answer what waits, and what arrives until the next attempt, at once:
                // a publish or read cannot wait for a reconnect.
                let deadline = std::time::Instant::now() + backoff.next_delay();
                while !cluster.stopping() && std::time::Instant::now() < deadline {
                    if let Ok(req) = rx.recv_timeout(std::time::Duration::from_millis(20)) {
                        drop(req);
                    }
                }
                continue;
            }
        };
        backoff.reset();
        if let Err(e) = serve(cluster, &mut conn, rx, &mut batch) {
            tracing::warn!(error = %e, "cluster history: Redis connection lost; reconnecting");
            // Dropping the replies answers them `Unreachable`.
            batch.clear();
        }
    }
}

fn serve(
    cluster: &Cluster,
    conn: &mut redis::Connection,
    rx: &Receiver<Request>,
    batch: &mut Vec<Request>,
) -> redis::RedisResult<()> {
    let node = cluster.node_id();
    while !cluster.stopping() {
        if !next_batch(conn, rx, batch)? {
            return Ok(());
        }
        let cmds: Vec<redis::Cmd> = batch
            .iter()
            .map(|r| match r {
                Request::Publish(p) => publish_cmd(node, p),
                Request::Scripted(k) => k.cmd(node),
                Request::Read(r) => read_cmd(
                    &r.project_id,
                    &r.channel,
                    r.ttl_s,
                    r.since,
                    match r.since {
                        Some(_) => r.size as usize,
                        None => r.limit,
                    },
                    None,
                ),
            })
            .collect();
        let mut replies = query_all(conn, &cmds)?;
        if replies.iter().any(is_noscript) {
            // Scripts flushed under us (SCRIPT FLUSH, a restart behind a proxy): load
            // them again and run exactly the calls that did not run.
            load_scripts(conn)?;
            let again: Vec<usize> = (0..replies.len())
                .filter(|&i| is_noscript(&replies[i]))
                .collect();
            // Scripted requests bring their own script: loaded on first use.
            let mut loaded: Vec<&'static str> = Vec::new();
            for &i in &again {
                if let Request::Scripted(k) = &batch[i] {
                    if !loaded.contains(&k.script()) {
                        load_script(conn, k.script())?;
                        loaded.push(k.script());
                    }
                }
            }
            let retry: Vec<redis::Cmd> = again.iter().map(|&i| cmds[i].clone()).collect();
            for (i, v) in again.into_iter().zip(query_all(conn, &retry)?) {
                replies[i] = v;
            }
        }
        for (req, v) in batch.drain(..).zip(replies) {
            match req {
                Request::Publish(p) => {
                    let n = p.items.len();
                    let got = parse_positions(v, n);
                    if got.is_none() {
                        cluster.stats.history_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    p.reply.send(got.ok_or(Unreachable));
                }
                Request::Read(r) => {
                    let got = parse_read(v, r.since, r.limit).map(Read::into_messages);
                    r.reply.send(got.ok_or(Unreachable));
                }
                Request::Scripted(k) => {
                    if !k.answer(v) {
                        cluster.stats.history_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Send `cmds` as one pipeline; per-command errors come back as values.
fn query_all(conn: &mut redis::Connection, cmds: &[redis::Cmd]) -> redis::RedisResult<Vec<Value>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for c in cmds {
        pipe.add_command(c.clone());
    }
    pipe.query(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64) -> Kept {
        Kept {
            offset,
            body: Bytes::new(),
            data_start: 0,
        }
    }

    #[test]
    fn recovery_needs_every_missed_offset_of_the_epoch() {
        let epoch = Epoch::parse("0a0b0c0d").unwrap();
        let read = Read {
            position: Position { offset: 5, epoch },
            entries: vec![entry(3), entry(4), entry(5)],
        };
        assert!(complete(&read, 2, "0a0b0c0d"));
        assert!(!complete(&read, 1, "0a0b0c0d"), "offset 2 is gone");
        assert!(!complete(&read, 2, "ffffffff"), "other epoch");
        assert!(!complete(&read, 6, "0a0b0c0d"), "beyond the latest");
        let none = Read {
            position: Position { offset: 5, epoch },
            entries: vec![],
        };
        assert!(complete(&none, 5, "0a0b0c0d"), "nothing missed");
    }

    #[test]
    fn replies_wake_and_a_dropped_sender_answers_unreachable() {
        let (tx, rx) = reply::<u32>();
        tx.send(Ok(3));
        let got = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap()
            .block_on(rx.wait());
        assert_eq!(got, Ok(3));
        let (tx, rx) = reply::<u32>();
        let t = std::thread::spawn(move || drop(tx));
        let got = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(rx.wait());
        t.join().unwrap();
        assert_eq!(got, Err(Unreachable));
    }
}
