-- sluice jobs: takes a group out of turn after claim.lua said it has nothing to hand out now.
-- After now.lua and queue.lua.
-- ARGV: [1] now, [2] group, [3] mode, [4] the version claim.lua returned, [5] ms.
--   park:   onto the later list, due in ARGV[5] ms
--   drop:   off both lists (the group held no job)
--   forget: off both lists and the group list, whatever was enqueued (purge)
-- park and drop do nothing if a newer version was registered since the claim read it (an
-- enqueue, or a finished attempt freeing a slot of the group's concurrency). Returns 1 if
-- done, else 0.
local g, mode, seen, ms = ARGV[2], ARGV[3], tonumber(ARGV[4] or ''), tonumber(ARGV[5] or '0')
if not g or g == '' or not ms then return redis.error_reply('sluice jobs: park takes a group and ms') end
if mode == 'forget' then
  redis.call('ZREM', K_READY, g)
  redis.call('ZREM', K_LATER, g)
  redis.call('HDEL', K_MARKS, g)
  redis.call('SREM', K_GROUPS, g)
  return 1
end
if not seen then return redis.error_reply('sluice jobs: bad version ' .. tostring(ARGV[4])) end
if (tonumber(redis.call('HGET', K_MARKS, g) or '0') or 0) > seen then return 0 end
if mode == 'park' then
  redis.call('ZREM', K_READY, g)
  local at = NOW_MS + ms
  local was = redis.call('ZSCORE', K_LATER, g)
  if not was or tonumber(was) > at or tonumber(was) < NOW_MS then redis.call('ZADD', K_LATER, at, g) end
  return 1
end
if mode == 'drop' then
  redis.call('ZREM', K_READY, g)
  redis.call('ZREM', K_LATER, g)
  redis.call('HDEL', K_MARKS, g)
  return 1
end
return redis.error_reply('sluice jobs: park takes park, drop or forget, not ' .. tostring(mode))
