-- sluice jobs: one page of the queue's group list, for the groups that are on neither the
-- ready nor the later list (dropped as empty, or whose producer stopped between its enqueue
-- and its register). After now.lua and queue.lua; KEYS[6] <prefix>:{<queue>}:sweep (STRING,
-- the shared SSCAN cursor of KEYS[5]).
-- ARGV: [1] now, [2] how many groups to look at (the SSCAN COUNT).
-- Workers walk the group list together, a page each call; a caller checks each group returned
-- (stats.lua) and registers it if it holds jobs. Returns the groups, strings.
local count = tonumber(ARGV[2])
if not count or count < 1 then return redis.error_reply('sluice jobs: bad count ' .. tostring(ARGV[2])) end
local cursor = redis.call('GET', KEYS[6]) or '0'
local page = redis.call('SSCAN', K_GROUPS, cursor, 'COUNT', count)
redis.call('SET', KEYS[6], page[1])
local out = {}
for _, g in ipairs(page[2]) do
  if not redis.call('ZSCORE', K_READY, g) and not redis.call('ZSCORE', K_LATER, g) then
    out[#out + 1] = g
  end
end
return out
