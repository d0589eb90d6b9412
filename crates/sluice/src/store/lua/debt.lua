-- sluice: GCRA, the one script for token_bucket, gcra and leaky_bucket (they admit alike).
-- ARGV (after time.lua and stamp.lua): stamp 'gcra:<capacity>:<interval_ns>', cost, [now_ns:
-- tests only, '' for Redis's time], [ago_ns: a refund of cost admitted ago_ns before now, see
-- below]. State: the theoretical arrival time (when the bucket is full again).
-- Returns {allowed, remaining, retry_after_ns, reset_after_ns}, as sluice_core::Gcra::step.
local tau = W
-- Stores "full again `owed` ns from now": a key that vanished while it still held debt would
-- give tokens away, hence ttl_ms's margin.
local function store(owed)
  set(end_string(owed), owed)
end
local debt = 0
local v = state()
if v then
  local ts, tn
  if string.match(v, '^%d+$') then ts, tn = split(v) end
  if ts and tn then
    debt = (ts - s) * E9 + (tn - nn)
    if debt < 0 then debt = 0 end
  else
    -- Unreadable: the worst case, everything spent now (written, so that it heals).
    debt = tau
    store(tau)
  end
end
-- A refund (sluice_core::Gcra::refund): the debt shrinks by the cost, never below none; the
-- time of the admission does not matter to a debt. Returns {1, 0, 0, 0}.
if ARGV[4] then
  if debt > 0 then
    local left = debt - cost * interval
    if left <= 0 then
      -- Full now, kept as long as it was (see set).
      redis.call('SET', KEYS[1], STAMP .. '|' .. end_string(0), 'KEEPTTL')
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
