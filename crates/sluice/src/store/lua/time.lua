-- sluice: what every script shares, prepended to each: now, and times as stored.
-- ARGV[3]: now in ns since the Unix epoch (tests only; '' for Redis's time).
-- Times are (seconds, nanoseconds) pairs since the Unix epoch: a Lua number holds integers
-- exactly only below 2^53 (104 days of nanoseconds), so an absolute time in nanoseconds does
-- not fit in one; every duration the scripts compute is below that.
local E9 = 1000000000
-- Decimal nanoseconds as (seconds, nanoseconds); nil for text that is not a number.
local function split(t)
  if #t > 9 then
    return tonumber(string.sub(t, 1, -10)), tonumber(string.sub(t, -9))
  end
  return 0, tonumber(t)
end
local s, nn
if ARGV[3] and ARGV[3] ~= '' then
  s, nn = split(ARGV[3])
else
  local t = redis.call('TIME')
  s, nn = tonumber(t[1]), tonumber(t[2]) * 1000
end
-- The moment `ahead` ns from now, as the decimal nanoseconds stored.
local function end_string(ahead)
  local total = nn + ahead
  local carry = math.floor(total / E9)
  return string.format('%d%09d', s + carry, total - carry * E9)
end
-- The TTL for a key that is idle `ns` from now: that, in milliseconds rounded up, plus a
-- second, because Redis sets expiries from a cached clock that can lag by milliseconds and a
-- key must not vanish while it still holds anything.
local function ttl_ms(ns)
  local ms = math.floor(ns / 1000000)
  if ms * 1000000 < ns then ms = ms + 1 end
  return ms + 1000
end
