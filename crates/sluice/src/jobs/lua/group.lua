-- sluice jobs: what the scripts of one group share, after now.lua (and, for claim.lua and
-- finish.lua, the three bucket functions of the store's own scripts, open_*.lua ... close.lua).
-- KEYS, the same for every group script, all in the slot of the hash tag {<group>}:
--   [1] the group's bucket, <bucket prefix>:{<group>} (the key RedisStore and the gateway use)
--   [2] <prefix>:<queue>:{<group>}:jobs     HASH   job id -> the job (JSON, below)
--   [3] <prefix>:<queue>:{<group>}:wait     ZSET   job id by (1000 - priority) * 2^43 + seq
--   [4] <prefix>:<queue>:{<group>}:delayed  ZSET   job id by due time (ms)
--   [5] <prefix>:<queue>:{<group>}:active   STREAM one entry {job = id} per job admitted and
--                                           not yet finished; consumer group 'w'
--   [6] <prefix>:<queue>:{<group>}:dead     STREAM dead letters {job, error, attempts}
--   [7] <prefix>:<queue>:{<group>}:meta     HASH   seq, v, paused (ms), and the counters
--   [8] <prefix>:<queue>:{<group>}:done     ZSET   completed job ids by completion (ms)
--   [9] <prefix>:<queue>:{<group>}:idem     HASH   idempotency key -> job id
-- A job is a JSON object of strings: id, g (group), p (payload), c (cost), pr (priority),
-- a (attempts begun), m (max attempts), k (idempotency key, '' none), s (state: waiting,
-- delayed, active, done, dead), q (seq), cr (created, ms), d (due, ms), e (stream entry while
-- active), cn (its consumer), ch (cost charged to the bucket at admission), st (admitted at,
-- ns), er (last error).
local K_BUCKET, K_JOBS, K_WAIT, K_DELAYED, K_ACTIVE, K_DEAD, K_META, K_DONE, K_IDEM =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local CG = 'w'
local SEQ_SPAN = 8796093022208 -- 2^43: seq < 2^43, priority 0..1000, score < 2^53
local function load_job(id)
  local v = redis.call('HGET', K_JOBS, id)
  if not v then return nil end
  local ok, j = pcall(cjson.decode, v)
  if not ok or type(j) ~= 'table' then return nil end
  return j
end
local function save_job(j)
  redis.call('HSET', K_JOBS, j.id, cjson.encode(j))
end
local function wait_score(j)
  return (1000 - tonumber(j.pr)) * SEQ_SPAN + tonumber(j.q)
end
local function meta_int(field)
  return tonumber(redis.call('HGET', K_META, field) or '0') or 0
end
-- The group's version: raised by every change that may give it a job to hand out (an
-- enqueue, a finished attempt, dead letters put back); register.lua and park.lua compare it.
local function bump()
  return int(redis.call('HINCRBY', K_META, 'v', 1))
end
-- The consumer group exists from the first enqueue (MKSTREAM makes the stream).
local function ensure_group()
  if redis.call('EXISTS', K_ACTIVE) == 0 then
    redis.call('XGROUP', 'CREATE', K_ACTIVE, CG, '0', 'MKSTREAM')
  end
end
-- The consumer that holds stream entry `entry`, or nil if it is not pending.
local function owner(entry)
  local p = redis.call('XPENDING', K_ACTIVE, CG, entry, entry, 1)
  if p[1] and p[1][1] == entry then return p[1][2] end
  return nil
end
-- Ends an entry of the active stream.
local function drop_entry(entry)
  redis.call('XACK', K_ACTIVE, CG, entry)
  redis.call('XDEL', K_ACTIVE, entry)
end
-- Moves job j to the dead-letter stream with `err`.
local function dead_letter(j, err)
  redis.call('XADD', K_DEAD, '*', 'job', j.id, 'error', err, 'attempts', j.a)
  j.s, j.er, j.e, j.cn = 'dead', err, '', ''
  save_job(j)
  redis.call('HINCRBY', K_META, 'dead', 1)
end
-- Moves the delayed jobs that are due (at most 100 a call) to the waiting set.
local function promote_due()
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW_MS, 'LIMIT', 0, 100)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    local j = load_job(id)
    if j then
      j.s = 'waiting'
      save_job(j)
      redis.call('ZADD', K_WAIT, wait_score(j), id)
    end
  end
end
-- The ns from decimal ns text b to decimal ns text a (a later), exact below 2^53.
local function ns_between(a, b)
  local function sp(t)
    if #t > 9 then return tonumber(string.sub(t, 1, -10)), tonumber(string.sub(t, -9)) end
    return 0, tonumber(t)
  end
  local as, an = sp(a)
  local bs, bn = sp(b)
  local d = (as - bs) * 1000000000 + (an - bn)
  if d < 0 then d = 0 end
  return d
end
-- The capacity and interval (ns) a stamp names; nil if it names none.
local function stamp_quota(stamp)
  local n, i = string.match(stamp, '^%l+:(%d+):(%d+)$')
  if not n then return nil end
  return tonumber(n), tonumber(i)
end
