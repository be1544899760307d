//! Cluster mode's occupancy listings (`GET /api/v1/channels`, Pusher's
//! `GET /apps/{id}/channels`), on their own thread and Redis connection so that a
//! listing never holds up the presence hub's joins, leaves and subscriber counts.
//!
//! Layout (beside the hub's, see [`super::remote`]): `occl:<pid>` is a sorted set of the
//! project's occupied channel names, every score 0, so that a prefix is one
//! `ZRANGEBYLEX` range; the counts stay in the hash `occ:<pid>`. The hub's count and
//! reap scripts add a name when its count goes up and remove it when the channel is
//! vacated. `occl-ready` says the sets were built for every project's hash.
//!
//! Invariants:
//! - A listing reads at most [`MAX_LISTED`] + 1 names and their counts (the one more
//!   tells the REST answer to say `"truncated": true`), whatever the
//!   number of occupied channels (it used to read the whole hash: ~250 ms of Redis at
//!   500,000 channels, during which every other tenant waited).
//! - A name is listed only while its count in `occ:<pid>` is above 0; a name left in the
//!   set without one (written by a node of the previous version, which knew no sets) is
//!   removed by the listing that meets it.
//! - Upgrade: when `occl-ready` is missing (data of the previous version, or Redis lost
//!   its data), the listing thread first builds the sets from the hashes in batches of
//!   [`REBUILD_BATCH`] (each batch one short script, `HSCAN` inside Redis: Redis is
//!   never held for long and no name crosses the network),
//!   then sets `occl-ready`. Building is idempotent, so nodes may race at it.
//! - At most [`QUEUE`] listings wait; more are answered 503 at once (the reply is
//!   dropped), as is every listing while Redis cannot be reached.

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::{Listed, MAX_LISTED};
use crate::reply::ReplyTx;

/// Listings waiting for the thread.
const QUEUE: usize = 64;
/// Hash fields indexed per rebuild step.
const REBUILD_BATCH: usize = 1000;
/// The key that says the sets are built.
const READY_KEY: &str = "ringcast:occl-ready";

/// One listing: ARGV pid, ZRANGEBYLEX min and max, most names. Returns 0 when the sets
/// are not built yet, else a flat array name, count, ... sorted by name.
const LIST_SCRIPT: &str = r#"
local P = 'ringcast:'
if redis.call('EXISTS', P .. 'occl-ready') == 0 then return 0 end
local z, h = P .. 'occl:' .. ARGV[1], P .. 'occ:' .. ARGV[1]
local min, max, want = ARGV[2], ARGV[3], tonumber(ARGV[4])
local out, found = {}, 0
while found < want do
  local names = redis.call('ZRANGEBYLEX', z, min, max, 'LIMIT', 0, want - found)
  if #names == 0 then break end
  for i = 1, #names, 500 do
    local chunk = {}
    for j = i, math.min(i + 499, #names) do chunk[#chunk + 1] = names[j] end
    local counts = redis.call('HMGET', h, unpack(chunk))
    for j = 1, #chunk do
      local n = tonumber(counts[j])
      if n and n > 0 then
        out[#out + 1] = chunk[j]; out[#out + 1] = n; found = found + 1
      else
        redis.call('ZREM', z, chunk[j])
      end
    end
  end
  min = '(' .. names[#names]
end
return out
"#;

/// One rebuild step: ARGV pid, `HSCAN` cursor, batch size. Each channel of that step with
/// a count above 0 in the project's hash joins its set. Returns the next cursor ("0":
/// done) and how many names the step saw.
const INDEX_SCRIPT: &str = r#"
local P = 'ringcast:'
local z, h = P .. 'occl:' .. ARGV[1], P .. 'occ:' .. ARGV[1]
local r = redis.call('HSCAN', h, ARGV[2], 'COUNT', ARGV[3])
local fields, add = r[2], {}
for i = 1, #fields, 2 do
  local n = tonumber(fields[i + 1])
  if n and n > 0 then add[#add + 1] = 0; add[#add + 1] = fields[i] end
end
if #add > 0 then redis.call('ZADD', z, unpack(add)) end
return {r[1], #fields / 2}
"#;

/// A listing asked of the thread.
pub(super) struct Ask {
    pub pid: Box<str>,
    pub prefix: Box<str>,
    pub users: bool,
    pub reply: ReplyTx<Vec<Listed>>,
}

/// The hub's handle on the listing thread.
pub(super) struct Lister {
    tx: Sender<Ask>,
}

impl Lister {
    pub(super) fn start(client: redis::Client) -> std::io::Result<Lister> {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        std::thread::Builder::new()
            .name("presence-list".into())
            .spawn(move || run(&client, &rx))?;
        Ok(Lister { tx })
    }

    /// Queue a listing; a full queue drops it (its reply answers 503).
    pub(super) fn ask(&self, ask: Ask) {
        match self.tx.try_send(ask) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::debug!("presence: listing queue full; answered 503");
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn run(client: &redis::Client, rx: &Receiver<Ask>) {
    let list = redis::Script::new(LIST_SCRIPT);
    let index = redis::Script::new(INDEX_SCRIPT);
    let mut conn: Option<redis::Connection> = None;
    let mut backoff = crate::redis_link::Backoff::new();
    let mut retry_at = std::time::Instant::now();
    for ask in rx.iter() {
        if conn.is_none() {
            if std::time::Instant::now() < retry_at {
                continue; // dropped: 503
            }
            match crate::redis_link::connect(client) {
                Ok(c) => {
                    conn = Some(c);
                    backoff.reset();
                }
                Err(_) => {
                    retry_at = std::time::Instant::now() + backoff.next_delay();
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match listing(c, &list, &index, &ask) {
            Ok(l) => ask.reply.send(Ok(l)),
            Err(e) => {
                tracing::warn!(error = %e, "presence: a channel listing could not be read from Redis");
                conn = None;
            }
        }
    }
}

/// `ZRANGEBYLEX` bounds of the names that start with `prefix`. Names are UTF-8, which
/// never holds the byte 0xff, so `prefix` + 0xff is above every one of them.
fn bounds(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (b"-".to_vec(), b"+".to_vec());
    }
    let mut min = Vec::with_capacity(prefix.len() + 1);
    min.push(b'[');
    min.extend_from_slice(prefix.as_bytes());
    let mut max = min.clone();
    max.push(0xff);
    (min, max)
}

fn listing(
    conn: &mut redis::Connection,
    list: &redis::Script,
    index: &redis::Script,
    ask: &Ask,
) -> redis::RedisResult<Vec<Listed>> {
    let (min, max) = bounds(&ask.prefix);
    let mut call = list.prepare_invoke();
    call.arg(&*ask.pid).arg(min).arg(max).arg(MAX_LISTED + 1);
    let mut v: redis::Value = call.invoke(conn)?;
    if matches!(v, redis::Value::Int(0)) {
        rebuild(conn, index)?;
        v = call.invoke(conn)?;
    }
    let found: Vec<(String, i64)> = match v {
        redis::Value::Int(_) => Vec::new(), // emptied under us: nothing to list
        v => redis::from_redis_value(v)?,
    };
    // MAX_LISTED + 1 at most: the one more says the listing is cut (see `MAX_LISTED`).
    let mut channels: Vec<Listed> = found
        .into_iter()
        .map(|(name, n)| Listed {
            name: name.into_boxed_str(),
            subscribers: n.max(0) as u64,
            user_count: None,
        })
        .collect();
    if ask.users {
        // One pipelined HLEN per presence channel listed (at most MAX_LISTED + 1).
        let presence: Vec<usize> = (0..channels.len())
            .filter(|&i| crate::shard::is_presence(&channels[i].name))
            .collect();
        if !presence.is_empty() {
            let mut pipe = redis::pipe();
            for &i in &presence {
                pipe.cmd("HLEN")
                    .arg(format!("ringcast:pres:{}:{}", ask.pid, channels[i].name));
            }
            let counts: Vec<i64> = pipe.query(conn)?;
            for (&i, n) in presence.iter().zip(counts) {
                channels[i].user_count = Some(n.max(0) as usize);
            }
        }
    }
    Ok(channels)
}

/// Build every project's set from its hash, a batch at a time, then mark them built.
fn rebuild(conn: &mut redis::Connection, index: &redis::Script) -> redis::RedisResult<()> {
    let started = std::time::Instant::now();
    let mut indexed = 0usize;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("ringcast:occ:*")
            .arg("COUNT")
            .arg(REBUILD_BATCH)
            .query(conn)?;
        for key in keys {
            let Some(pid) = key.strip_prefix("ringcast:occ:") else {
                continue;
            };
            // Scanned inside Redis, a step at a time: nothing crosses the network.
            let mut field_cursor = String::from("0");
            loop {
                let (next, seen): (String, usize) = index
                    .arg(pid)
                    .arg(&field_cursor)
                    .arg(REBUILD_BATCH)
                    .invoke(conn)?;
                indexed += seen;
                if next == "0" {
                    break;
                }
                field_cursor = next;
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    redis::cmd("SET").arg(READY_KEY).arg(1).query::<()>(conn)?;
    tracing::info!(
        channels = indexed,
        ms = started.elapsed().as_millis() as u64,
        "presence: occupancy listing index built from the hashes (first start after an upgrade, or Redis lost its data)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bounds;

    #[test]
    fn a_prefix_range_holds_exactly_the_names_that_start_with_it() {
        let (min, max) = bounds("news");
        assert_eq!(min, b"[news");
        assert_eq!(max, b"[news\xff");
        for name in ["news", "news-eu", "news\u{10ffff}", "newsé"] {
            let n = name.as_bytes();
            assert!(n >= &min[1..] && n < &max[1..], "{name}");
        }
        for name in ["new", "newt", "nevs", "o"] {
            let n = name.as_bytes();
            assert!(n < &min[1..] || n > &max[1..], "{name}");
        }
        assert_eq!(bounds(""), (b"-".to_vec(), b"+".to_vec()));
    }
}
