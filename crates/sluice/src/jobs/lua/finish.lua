-- sluice jobs: ends consumer ARGV[3]'s attempt at a job: acknowledged, its cost settled, and
-- completed, retried later or dead-lettered. After the bucket functions, now.lua, group.lua
-- and decide.lua.
-- ARGV: [1] now, [2] the bucket's stamp ('' for no limit), [3] consumer, [4] job id,
-- [5] stream entry, [6] outcome 'done' | 'retry' | 'dead', [7] the job's actual cost ('' for
-- what was charged), [8] the most tokens the bucket may owe beyond empty when the actual cost
-- is above the charge ('' for none), [9] for a retry, the delay (ms), [10] the group's pause
-- (ms, '' for none: a server's hint that slows the whole group), [11] the error ('' for none),
-- [12] how long a completed job is kept (ms; 0: deleted now, its idempotency key with it).
-- Returns {result, settled, due, version}, strings: result 'done' | 'retry' | 'dead', or
-- 'lost' when the consumer no longer holds the entry (it was claimed back, or the job purged:
-- nothing changes); settled the tokens given back (negative) or charged beyond the
-- admission; due the retry's due time (ms), else ''; version the group's version after
-- (raised: a slot of its concurrency is free), '' when lost.
local stamp, consumer, id, entry, outcome = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local delay, keep = tonumber(ARGV[9] or '0'), tonumber(ARGV[12] or '')
if (outcome ~= 'done' and outcome ~= 'retry' and outcome ~= 'dead') or not delay or not keep then
  return redis.error_reply('sluice jobs: finish takes an outcome done, retry or dead, a delay and a retention')
end
local j = load_job(id)
if not j or j.s ~= 'active' or j.e ~= entry or owner(entry) ~= consumer then
  return {'lost', '0', '', ''}
end
drop_entry(entry)
local version = bump()
-- The actual cost, settled on the bucket as the store settles: a refund of the difference
-- (admitted at j.st) or a charge into debt, up to ARGV[8] tokens beyond empty.
local settled = 0
local charged = tonumber(j.ch or '0') or 0
if stamp ~= '' and ARGV[7] ~= nil and ARGV[7] ~= '' and j.ch ~= '0' then
  local actual = tonumber(ARGV[7])
  if not actual or actual < 0 then
    return redis.error_reply('sluice jobs: bad actual cost ' .. tostring(ARGV[7]))
  end
  local cap, interval = stamp_quota(stamp)
  if not cap then return redis.error_reply('sluice jobs: bad stamp ' .. stamp) end
  if actual < charged then
    local r = decide(stamp, charged - actual, int(ns_between(NOW_NS, j.st)))
    if r.err then return r end
    settled = actual - charged
  elseif actual > charged then
    local debt = tonumber(ARGV[8] or '') or 0
    local most = math.min(cap * interval + debt * interval, 9007199254740992)
    local r = decide(stamp, actual - charged, 'c', int(most))
    if r.err then return r end
    settled = r[5] or 0
  end
end
if ARGV[10] and ARGV[10] ~= '' then
  local until_ms = NOW_MS + tonumber(ARGV[10])
  if until_ms > meta_int('paused') then redis.call('HSET', K_META, 'paused', int(until_ms)) end
end
j.e, j.cn = '', ''
local err = ARGV[11] or ''
if outcome == 'done' then
  redis.call('HINCRBY', K_META, 'completed', 1)
  if keep > 0 then
    j.s, j.d = 'done', int(NOW_MS)
    save_job(j)
    redis.call('ZADD', K_DONE, NOW_MS, id)
  else
    redis.call('HDEL', K_JOBS, id)
    if j.k ~= '' then redis.call('HDEL', K_IDEM, j.k) end
  end
  -- Completed jobs kept beyond their retention go, with their idempotency keys.
  local old = redis.call('ZRANGEBYSCORE', K_DONE, '-inf', NOW_MS - keep, 'LIMIT', 0, 20)
  for _, o in ipairs(old) do
    local oj = load_job(o)
    redis.call('ZREM', K_DONE, o)
    redis.call('HDEL', K_JOBS, o)
    if oj and oj.k ~= '' then redis.call('HDEL', K_IDEM, oj.k) end
  end
  return {'done', int(settled), '', version}
end
redis.call('HINCRBY', K_META, 'failed', 1)
if outcome == 'retry' and tonumber(j.a) < tonumber(j.m) then
  local due = NOW_MS + delay
  j.s, j.d, j.er = 'delayed', int(due), err
  save_job(j)
  redis.call('ZADD', K_DELAYED, due, id)
  redis.call('HINCRBY', K_META, 'retried', 1)
  return {'retry', int(settled), int(due), version}
end
if outcome == 'retry' then err = 'after ' .. j.a .. ' attempts: ' .. err end
dead_letter(j, err)
return {'dead', int(settled), '', version}
