-- sluice jobs: deletes a group's jobs. After now.lua and group.lua.
-- ARGV: [1] now, [2] what: 'waiting' (waiting and delayed jobs), 'dead' (the dead letters),
-- 'done' (completed jobs kept), or 'all' (every key of the group but its bucket, its enqueue
-- count and its version, active jobs included: their workers' results come back 'lost').
-- Returns the number of jobs deleted.
local what = ARGV[2]
local n = 0
local function forget(id)
  local j = load_job(id)
  redis.call('HDEL', K_JOBS, id)
  if j and j.k ~= '' then redis.call('HDEL', K_IDEM, j.k) end
  n = n + 1
end
if what == 'waiting' then
  for _, k in ipairs({K_WAIT, K_DELAYED}) do
    for _, id in ipairs(redis.call('ZRANGE', k, 0, -1)) do forget(id) end
    redis.call('DEL', k)
  end
elseif what == 'dead' then
  if redis.call('EXISTS', K_DEAD) == 1 then
    for _, e in ipairs(redis.call('XRANGE', K_DEAD, '-', '+')) do
      local f = e[2]
      for i = 1, #f, 2 do
        if f[i] == 'job' then
          local j = load_job(f[i + 1])
          if j and j.s == 'dead' then forget(f[i + 1]) end
        end
      end
    end
    redis.call('DEL', K_DEAD)
  end
elseif what == 'done' then
  for _, id in ipairs(redis.call('ZRANGE', K_DONE, 0, -1)) do forget(id) end
  redis.call('DEL', K_DONE)
elseif what == 'all' then
  n = redis.call('HLEN', K_JOBS)
  -- The enqueue count and the version stay: job ids are never reused.
  local seq, v = meta_int('seq'), meta_int('v')
  redis.call('DEL', K_JOBS, K_WAIT, K_DELAYED, K_ACTIVE, K_DEAD, K_META, K_DONE, K_IDEM)
  if seq > 0 then redis.call('HSET', K_META, 'seq', int(seq), 'v', int(v)) end
else
  return redis.error_reply('sluice jobs: purge takes waiting, dead, done or all, not ' .. tostring(what))
end
return n
