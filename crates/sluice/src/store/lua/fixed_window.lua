-- sluice: the fixed window counter (sluice_core::FixedWindow), exactly.
-- State (after the stamp): "<window end, ns> <count>". Returns {allowed, remaining,
-- retry_after_ns, reset_after_ns}.
local count, left = 0, nil
local v = state()
local e, cs, d
if v then e, cs = string.match(v, '^(%d+) (%d+)$') end
if e then
  local es, en = split(e)
  d = (es - s) * E9 + (en - nn) -- window end - now
end
-- A refund (sluice_core::FixedWindow::refund): the count goes down only if the admission was
-- counted in the stored window [end - W, end), i.e. -d < ago <= W - d. Returns {1, 0, 0, 0}.
-- A charge (ARGV[4] = 'c'): the cost is cut to what the window has left, then counted.
-- Returns the decision and, fifth, what was taken.
local charging = ARGV[4] == 'c'
if ARGV[4] and not charging then
  local ago = tonumber(ARGV[4])
  if d and ago > -d and ago <= W - d then
    redis.call('SET', KEYS[1], STAMP .. '|' .. e .. ' ' .. math.max(0, tonumber(cs) - cost), 'KEEPTTL')
  end
  return {1, 0, 0, 0}
end
if d then
  count = tonumber(cs)
  if d > 0 then
    left = d
  elseif d > -W then
    count, left = 0, d + W
  else
    count = 0
  end
elseif v then
  -- Unreadable: the worst case, everything spent now (written, so that it heals).
  count, left = cap, W
  set(end_string(W) .. ' ' .. cap, W)
end
if not left then left = aligned_left() end
local used = math.min(count, cap)
if charging and used + cost > cap then cost = cap - used end
if used + cost <= cap then
  count = used + cost
  if cost > 0 then
    set(end_string(left) .. ' ' .. count, left)
  end
  local reset = 0
  if count > 0 then reset = left end
  if charging then return {1, cap - count, 0, reset, cost} end
  return {1, cap - count, 0, reset}
end
return {0, cap - used, left, left}
