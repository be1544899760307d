//! Cluster-mode idempotent publish: a publish with an `Idempotency-Key` is claimed,
//! published and its answer stored in Redis by one script call ([`SCRIPT`]), so no
//! node, and no retry after a 503 whose script did run, ever publishes it twice.
//!
//! One key per (project, `Idempotency-Key`): a string `ringcast:idem:{<project id>}:<key>`
//! holding the SHA-256 of the request body (64 hex), the answer's status (3 digits) and
//! its body, living `idempotency_window_s` (`PX`). The `{<project id>}` hash tag keeps
//! every key of a project in one slot should Redis ever be sharded.
//!
//! Memory: a sorted set `ringcast:idemz:{<project id>}` holds the project's keys by
//! claim time (Redis' clock); each new key drops the expired ones from it and, over
//! `idempotency_max_keys_per_project`, forgets the oldest keys (counted in
//! `ringcast_idempotency_keys_evicted_total` by the node that stored the new one).
//!
//! The script, in one step (Redis runs scripts one at a time, so there is no "in
//! flight" state to see from another node):
//! - the key exists with the same body hash: return the stored answer (a replay;
//!   nothing is published);
//! - it exists with another hash: return "reused" (422);
//! - otherwise publish: for a history project, exactly the history publish script
//!   ([`super::history::PUBLISH_SCRIPT`], called as a Lua function on its own keys and
//!   arguments: offsets, stream, PUBLISH); for a project without history, PUBLISH of
//!   each frame's payload with origin 0, which every node, the origin included, delivers
//!   (the origin does not deliver it locally first: had Redis not run the script, it
//!   would have delivered a message no retry may repeat). Then store the answer, built
//!   from the node's template and, for a single-channel history publish, the position
//!   the script gave.
//!
//! Requests ride the history thread's queue and pipeline ([`super::history`]): one
//! round trip per batch of requests, by `EVALSHA` (the script is loaded on its first
//! NOSCRIPT answer). Redis away, or its answer lost: the request is
//! answered 503 (`Unreachable`); a retry is then answered from Redis if the script ran.

use bytes::Bytes;
use redis::Value;

use super::history::{meta_key, publish_args, stream_key, Item, ReplyTx, PUBLISH_SCRIPT};
pub(crate) use crate::history::backend::{Keyed, Template};

/// Prefix of an idempotency key in Redis.
pub(crate) const KEY_PREFIX: &str = "ringcast:idem:";
/// Prefix of a project's sorted set of its keys by claim time (the bound).
pub(crate) const ORDER_PREFIX: &str = "ringcast:idemz:";

/// The script (see the module docs). KEYS: the idempotency key, the project's order
/// set, then (history) the history publish script's keys. ARGV: body hash, window (ms),
/// status, answer head, answer tail, '1' when the first frame's position goes between
/// them, mode ('h' history, 'p' plain), the most keys per project, then the history
/// script's ARGV, or per frame its pub/sub channel and payload. Returns {0, offsets
/// and epochs, keys evicted} (published), {1, status .. body} (replay) or {2} (reused).
pub(crate) fn script() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "local function publish(KEYS, ARGV)\n{PUBLISH_SCRIPT}\nend\n{}",
            r#"
local idem, hash, window, status = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local got = redis.call('GET', idem)
if got then
  if string.sub(got, 1, 64) == hash then
    return {1, string.sub(got, 65)}
  end
  return {2}
end
local head, tail, positioned, mode = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local out = {}
if mode == 'h' then
  local k, a = {}, {}
  for i = 3, #KEYS do k[#k + 1] = KEYS[i] end
  for i = 9, #ARGV do a[#a + 1] = ARGV[i] end
  out = publish(k, a)
else
  for i = 9, #ARGV, 2 do
    redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
  end
end
local body = head
if positioned == '1' then
  body = body .. ',"offset":' .. string.format('%d', out[1]) .. ',"epoch":"' .. out[2] .. '"'
end
body = body .. tail
redis.call('SET', idem, hash .. status .. body, 'PX', window)
-- The project's keys by claim time: expired ones leave, and over the bound the
-- oldest are forgotten (and counted).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local zset = KEYS[2]
redis.call('ZREMRANGEBYSCORE', zset, '-inf', now - tonumber(window))
redis.call('ZADD', zset, now, idem)
local evicted = 0
local over = redis.call('ZCARD', zset) - tonumber(ARGV[8])
if over > 0 then
  local old = redis.call('ZPOPMIN', zset, over)
  for i = 1, #old, 2 do
    evicted = evicted + redis.call('DEL', old[i])
  end
end
redis.call('PEXPIRE', zset, window)
return {0, out, evicted}
"#
        )
    })
}

/// The sorted set of project `project_id`'s keys by claim time.
pub(crate) fn order_key(project_id: &str) -> String {
    format!("{ORDER_PREFIX}{{{project_id}}}")
}

/// The Redis key of `key` of project `project_id`.
pub(crate) fn redis_key(project_id: &str, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(KEY_PREFIX.len() + project_id.len() + 3 + key.len());
    out.extend_from_slice(KEY_PREFIX.as_bytes());
    out.push(b'{');
    out.extend_from_slice(project_id.as_bytes());
    out.extend_from_slice(b"}:");
    out.extend_from_slice(key);
    out
}

/// What a keyed request publishes.
pub(crate) enum Publish {
    /// A history project's frames (as `history::PublishRequest`'s).
    History {
        size: u32,
        ttl_s: u32,
        items: Vec<Item>,
    },
    /// A project without history: per frame, its pub/sub channel and payload
    /// (`wire::encode_payload` with origin 0).
    Plain(Vec<(String, Vec<u8>)>),
}

/// A keyed publish for the history thread.
pub(crate) struct KeyedRequest {
    pub project_id: Box<str>,
    pub key: Box<[u8]>,
    pub body_hash: [u8; 32],
    pub window_ms: u64,
    /// `idempotency_max_keys_per_project`.
    pub max_keys: usize,
    pub answer: Template,
    pub publish: Publish,
    pub reply: ReplyTx<Keyed>,
}

fn hex(bytes: &[u8; 32]) -> String {
    let mut out = String::with_capacity(64);
    for b in bytes {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    out
}

/// The SHA1 of [`script`], computed once.
fn script_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(script()).get_hash().to_string())
}

/// The script call of one request (`EVALSHA`; the history thread loads the script on
/// the NOSCRIPT answer of its first use on a connection, and runs the call again).
pub(crate) fn cmd(node: u64, req: &KeyedRequest) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script_sha());
    let history_keys = match &req.publish {
        Publish::History { items, .. } => 2 * items.len(),
        Publish::Plain(_) => 0,
    };
    cmd.arg(2 + history_keys)
        .arg(redis_key(&req.project_id, &req.key))
        .arg(order_key(&req.project_id));
    if let Publish::History { items, .. } = &req.publish {
        for item in items {
            cmd.arg(meta_key(&req.project_id, &item.channel))
                .arg(stream_key(&req.project_id, &item.channel));
        }
    }
    let t = &req.answer;
    cmd.arg(hex(&req.body_hash))
        .arg(req.window_ms.max(1))
        .arg(format!("{:03}", t.status))
        .arg(&t.head[..])
        .arg(t.tail)
        .arg(if t.positioned { "1" } else { "0" });
    let mode = match &req.publish {
        Publish::History { .. } => "h",
        Publish::Plain(_) => "p",
    };
    cmd.arg(mode).arg(req.max_keys.max(1));
    match &req.publish {
        Publish::History { size, ttl_s, items } => {
            // The history publish script's ARGV, exactly as a plain history publish.
            publish_args(&mut cmd, node, &req.project_id, *size, *ttl_s, items);
        }
        Publish::Plain(frames) => {
            for (channel, payload) in frames {
                cmd.arg(channel.as_str()).arg(&payload[..]);
            }
        }
    }
    cmd
}

/// Decode the script's answer for a request of `frames` history frames (0: plain).
pub(crate) fn parse(v: Value, frames: usize) -> Option<Keyed> {
    let Value::Array(parts) = v else {
        return None;
    };
    let mut parts = parts.into_iter();
    match parts.next()? {
        Value::Int(0) => {
            let out = parts.next()?;
            let evicted = match parts.next() {
                Some(Value::Int(n)) => u64::try_from(n).unwrap_or(0),
                _ => 0,
            };
            let positions = match frames {
                0 => Vec::new(),
                n => super::history::parse_positions(out, n)?,
            };
            Some(Keyed::Published(positions, evicted))
        }
        Value::Int(1) => {
            let Value::BulkString(stored) = parts.next()? else {
                return None;
            };
            let status = std::str::from_utf8(stored.get(..3)?).ok()?.parse().ok()?;
            Some(Keyed::Replay {
                status,
                body: Bytes::copy_from_slice(&stored[3..]),
            })
        }
        Value::Int(2) => Some(Keyed::Reused),
        _ => None,
    }
}

impl super::history::Scripted for KeyedRequest {
    fn script(&self) -> &'static str {
        script()
    }

    fn cmd(&self, node: u64) -> redis::Cmd {
        cmd(node, self)
    }

    /// A reply that does not decode is `Unreachable`: 503, and a retry is answered from
    /// Redis if the script ran.
    fn answer(self: Box<Self>, v: Value) -> bool {
        let frames = match &self.publish {
            Publish::History { items, .. } => items.len(),
            Publish::Plain(_) => 0,
        };
        let got = parse(v, frames);
        let ok = got.is_some();
        self.reply.send(got.ok_or(crate::reply::Unreachable));
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_project_as_hash_tag() {
        assert_eq!(
            redis_key("prj_ab", b"order-1"),
            b"ringcast:idem:{prj_ab}:order-1".to_vec()
        );
        assert_eq!(order_key("prj_ab"), "ringcast:idemz:{prj_ab}");
    }

    #[test]
    fn the_script_wraps_the_history_publish_script() {
        let s = script();
        assert!(s.starts_with("local function publish(KEYS, ARGV)\n"));
        assert!(s.contains(PUBLISH_SCRIPT));
        assert!(s.contains("'PX', window"));
    }

    #[test]
    fn answers_decode() {
        let replay = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"202{\"id\":\"x\"}".to_vec()),
        ]);
        match parse(replay, 1) {
            Some(Keyed::Replay { status, body }) => {
                assert_eq!(status, 202);
                assert_eq!(&body[..], b"{\"id\":\"x\"}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(Value::Array(vec![Value::Int(2)]), 0),
            Some(Keyed::Reused)
        ));
        let published = Value::Array(vec![
            Value::Int(0),
            Value::Array(vec![Value::Int(7), Value::BulkString(b"0a0b0c0d".to_vec())]),
            Value::Int(2),
        ]);
        match parse(published, 1) {
            Some(Keyed::Published(p, evicted)) => assert_eq!((p[0].offset, evicted), (7, 2)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(Value::Array(vec![Value::Int(0), Value::Array(vec![]), Value::Int(0)]), 0),
            Some(Keyed::Published(p, 0)) if p.is_empty()
        ));
        assert!(parse(Value::Nil, 0).is_none());
    }

    #[test]
    fn hex_is_lowercase() {
        let mut b = [0u8; 32];
        b[0] = 0xab;
        b[31] = 0x01;
        let h = hex(&b);
        assert_eq!(h.len(), 64);
        assert!(h.starts_with("ab00"));
        assert!(h.ends_with("01"));
    }
}
