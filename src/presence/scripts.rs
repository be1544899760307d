//! The Lua scripts of cluster presence: each decides one transition atomically inside
//! Redis (a count change, a join, a leave, the reap of a dead node's shares), so exactly
//! one node sees each transition (see [`super::remote`] for the key layout and the
//! invariants they keep). Keys are spelt out under `ringcast:` here because a script
//! cannot take Rust constants; the layout lives in `remote`'s module doc.

pub(super) const COUNT_SCRIPT: &str = r#"
local P = 'ringcast:'
local f = ARGV[2] .. '\n' .. ARGV[3]
local d = tonumber(ARGV[4])
local nk = P .. 'occn:' .. ARGV[1]
local mine = redis.call('HINCRBY', nk, f, d)
if mine <= 0 then redis.call('HDEL', nk, f) end
if mine < 0 then d = d - mine end
if d == 0 then return 0 end
local ok = P .. 'occ:' .. ARGV[2]
local total = redis.call('HINCRBY', ok, ARGV[3], d)
if total <= 0 then
  redis.call('HDEL', ok, ARGV[3])
  redis.call('ZREM', P .. 'occl:' .. ARGV[2], ARGV[3])
elseif d > 0 then
  -- At every increase, not only at 0 -> d: heals a name a node of the previous
  -- version (no set) occupied.
  redis.call('ZADD', P .. 'occl:' .. ARGV[2], 0, ARGV[3])
end
if d > 0 and total == d then return 1 end
if d < 0 and total <= 0 and total - d > 0 then return -1 end
return 0
"#;

pub(super) const JOIN_SCRIPT: &str = r#"
local P = 'ringcast:'
local base = ARGV[2] .. ':' .. ARGV[3]
local pres, info, ord = P .. 'pres:' .. base, P .. 'presi:' .. base, P .. 'preso:' .. base
local status = 1
if redis.call('HEXISTS', pres, ARGV[4]) == 0 then
  if redis.call('HLEN', pres) >= tonumber(ARGV[6]) then return {0} end
  status = 2
  redis.call('HSET', info, ARGV[4], ARGV[5])
  redis.call('ZADD', ord, redis.call('INCR', P .. 'preseq'), ARGV[4])
end
redis.call('HINCRBY', pres, ARGV[4], 1)
redis.call('HINCRBY', P .. 'presn:' .. ARGV[1], ARGV[2] .. '\n' .. ARGV[3] .. '\n' .. ARGV[4], 1)
local out = {status}
for _, u in ipairs(redis.call('ZRANGE', ord, 0, -1)) do
  out[#out + 1] = u
  out[#out + 1] = redis.call('HGET', info, u) or ''
end
return out
"#;

pub(super) const LEAVE_SCRIPT: &str = r#"
local P = 'ringcast:'
local f = ARGV[2] .. '\n' .. ARGV[3] .. '\n' .. ARGV[4]
local nk = P .. 'presn:' .. ARGV[1]
local mine = redis.call('HINCRBY', nk, f, -1)
if mine <= 0 then redis.call('HDEL', nk, f) end
if mine < 0 then return 0 end
local base = ARGV[2] .. ':' .. ARGV[3]
local pres = P .. 'pres:' .. base
local left = redis.call('HINCRBY', pres, ARGV[4], -1)
if left > 0 then return 0 end
redis.call('HDEL', pres, ARGV[4])
redis.call('HDEL', P .. 'presi:' .. base, ARGV[4])
redis.call('ZREM', P .. 'preso:' .. base, ARGV[4])
return 1
"#;

/// Take back every share of node ARGV[1] (only if its lease is gone, unless ARGV[2] is
/// '1': a node taking back its own). Returns the transitions: 'v', pid, channel for a
/// vacated channel; 'r', pid, channel, user for a removed member.
pub(super) const REAP_SCRIPT: &str = r#"
local P = 'ringcast:'
local node = ARGV[1]
if ARGV[2] ~= '1' then
  if redis.call('EXISTS', P .. 'alive:' .. node) == 1 then return {} end
  if redis.call('SISMEMBER', P .. 'nodes', node) == 0 then return {} end
end
local out = {}
local occ = redis.call('HGETALL', P .. 'occn:' .. node)
for i = 1, #occ, 2 do
  local pid, ch = string.match(occ[i], '^([^\n]*)\n(.*)$')
  local n = tonumber(occ[i + 1])
  if pid and n > 0 then
    local total = redis.call('HINCRBY', P .. 'occ:' .. pid, ch, -n)
    if total <= 0 then
      redis.call('HDEL', P .. 'occ:' .. pid, ch)
      redis.call('ZREM', P .. 'occl:' .. pid, ch)
      out[#out + 1] = 'v'; out[#out + 1] = pid; out[#out + 1] = ch
    end
  end
end
local pres = redis.call('HGETALL', P .. 'presn:' .. node)
for i = 1, #pres, 2 do
  local pid, ch, user = string.match(pres[i], '^([^\n]*)\n([^\n]*)\n(.*)$')
  local n = tonumber(pres[i + 1])
  if pid and n > 0 then
    local base = pid .. ':' .. ch
    local left = redis.call('HINCRBY', P .. 'pres:' .. base, user, -n)
    if left <= 0 then
      redis.call('HDEL', P .. 'pres:' .. base, user)
      redis.call('HDEL', P .. 'presi:' .. base, user)
      redis.call('ZREM', P .. 'preso:' .. base, user)
      out[#out + 1] = 'r'; out[#out + 1] = pid; out[#out + 1] = ch; out[#out + 1] = user
    end
  end
end
redis.call('DEL', P .. 'occn:' .. node, P .. 'presn:' .. node)
-- A node taking back its own shares stays known (it is alive and adds them again).
if ARGV[2] ~= '1' then redis.call('SREM', P .. 'nodes', node) end
return out
"#;

/// The scripts, loaded once per hub (`EVALSHA` with a fallback to `EVAL`).
pub(super) struct Scripts {
    pub(super) count: redis::Script,
    pub(super) join: redis::Script,
    pub(super) leave: redis::Script,
    pub(super) reap: redis::Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            count: redis::Script::new(COUNT_SCRIPT),
            join: redis::Script::new(JOIN_SCRIPT),
            leave: redis::Script::new(LEAVE_SCRIPT),
            reap: redis::Script::new(REAP_SCRIPT),
        }
    }
}
