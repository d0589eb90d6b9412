-- sluice: GCRA, the one script for token_bucket, gcra and leaky_bucket (they admit alike).
-- KEYS[1] the key; ARGV: interval_ns, tau_ns (capacity x interval), cost, [now_ns: tests only,
-- '' for Redis's time], [ago_ns: a refund of cost admitted ago_ns before now, see below]
-- State: the theoretical arrival time (when the bucket is full again), decimal ns since the
-- Unix epoch. Times are kept as (seconds, nanoseconds) pairs: a Lua number holds integers
-- exactly only below 2^53 (104 days of nanoseconds), and every duration here is below that.
-- Returns {allowed, remaining, retry_after_ns, reset_after_ns}, as sluice_core::Gcra::step.
-- The TTL is the time until the bucket is full again, plus a second: Redis sets expiries from
-- a cached clock that can lag by milliseconds, and a key that vanished while it still held
-- debt would give tokens away.
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
-- Decimal nanoseconds as (seconds, nanoseconds); nil for text that is not a number.
local function split(t)
  if #t > 9 then
    return tonumber(string.sub(t, 1, -10)), tonumber(string.sub(t, -9))
  end
  return 0, tonumber(t)
end
local s, n
if ARGV[4] and ARGV[4] ~= '' then
  s, n = split(ARGV[4])
else
  local t = redis.call('TIME')
  s, n = tonumber(t[1]), tonumber(t[2]) * 1000
end
-- Stores "full again `owed` ns from now", expiring a second after that (see above).
local function store(owed)
  local total = n + owed
  local carry = math.floor(total / 1000000000)
  local ttl = math.floor(owed / 1000000)
  if ttl * 1000000 < owed then ttl = ttl + 1 end
  redis.call('SET', KEYS[1], string.format('%d%09d', s + carry, total - carry * 1000000000),
    'PX', ttl + 1000)
end
local debt = 0
local v = redis.call('GET', KEYS[1])
if v then
  local ts, tn = split(v)
  if ts and tn then
    debt = (ts - s) * 1000000000 + (tn - n)
    if debt < 0 then debt = 0 end
  else
    -- Unreadable: the worst case, everything spent now (written, so that it heals).
    debt = tau
    store(tau)
  end
end
-- A refund (sluice_core::Gcra::refund): the debt shrinks by the cost, never below none; the
-- time of the admission does not matter to a debt. Returns {1, 0, 0, 0}.
if ARGV[5] then
  if debt > 0 then
    local left = debt - cost * interval
    if left <= 0 then
      redis.call('DEL', KEYS[1])
    else
      store(left)
    end
  end
  return {1, 0, 0, 0}
end
local ahead = debt + cost * interval
if ahead > tau then
  local left = tau - debt
  if left < 0 then left = 0 end
  local q = math.floor(left / interval)
  if q * interval > left then q = q - 1 end
  return {0, q, ahead - tau, debt}
end
local q = math.floor((tau - ahead) / interval)
if q * interval > tau - ahead then q = q - 1 end
if cost > 0 then
  store(ahead)
end
return {1, q, 0, ahead}
