-- sluice jobs: what every job script starts with: now, read once.
-- ARGV[1]: now in decimal ns since the Unix epoch ('' for Redis's TIME; tests send a time).
-- NOW_NS is that text, NOW_MS the whole milliseconds (the scores of every sorted set).
local NOW_NS = ARGV[1]
if NOW_NS == nil or NOW_NS == '' then
  local t = redis.call('TIME')
  NOW_NS = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
end
if not string.match(NOW_NS, '^%d+$') or #NOW_NS < 7 or #NOW_NS > 20 then
  return redis.error_reply('sluice jobs: bad time ' .. tostring(NOW_NS))
end
local NOW_MS = tonumber(string.sub(NOW_NS, 1, -7))
-- An integer as decimal text (tostring would write 1e+15).
local function int(x)
  return string.format('%d', x)
end
