-- sluice jobs: says a group has jobs, after enqueue.lua (or a retry, or retry_dead.lua) in the
-- group's slot. After now.lua and queue.lua.
-- ARGV: [1] now, [2] group, [3] its version as that script returned it ('' to leave the
-- mark), [4] when its job is due (ms; '' or '0': now).
-- A group due now goes to the ready list (at the back, unless it is on it already); a group
-- due later goes to the later list at that time, unless it is ready or due sooner already.
-- Returns 1.
local g, version, due = ARGV[2], ARGV[3], tonumber(ARGV[4] or '0') or 0
if not g or g == '' then return redis.error_reply('sluice jobs: register takes a group') end
if version and version ~= '' then
  local n = tonumber(version)
  if not n then return redis.error_reply('sluice jobs: bad version ' .. version) end
  if n > (tonumber(redis.call('HGET', K_MARKS, g) or '0') or 0) then
    redis.call('HSET', K_MARKS, g, version)
  end
end
redis.call('SADD', K_GROUPS, g)
if redis.call('ZSCORE', K_READY, g) then return 1 end
if due <= NOW_MS then
  redis.call('ZREM', K_LATER, g)
  to_back(g)
  return 1
end
local at = redis.call('ZSCORE', K_LATER, g)
if not at or tonumber(at) > due then redis.call('ZADD', K_LATER, due, g) end
return 1
