-- sluice jobs: the group whose turn it is. After now.lua and queue.lua. ARGV: [1] now.
-- Groups due on the later list go to the back of the ready list (at most 100 a call); the
-- group at the front of the ready list is taken and put at the back (round robin).
-- Returns {group, ''}, or {'', ms} when no group is ready: ms until the first on the later
-- list is due ('' when that list is empty too).
local due = redis.call('ZRANGEBYSCORE', K_LATER, '-inf', NOW_MS, 'LIMIT', 0, 100)
for _, g in ipairs(due) do
  redis.call('ZREM', K_LATER, g)
  to_back(g)
end
local first = redis.call('ZRANGE', K_READY, 0, 0)
if first[1] then
  to_back(first[1])
  return {first[1], ''}
end
local next_due = redis.call('ZRANGE', K_LATER, 0, 0, 'WITHSCORES')
if next_due[1] then return {'', int(math.max(tonumber(next_due[2]) - NOW_MS, 1))} end
return {'', ''}
