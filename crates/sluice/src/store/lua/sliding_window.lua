-- sluice: the sliding window counter (sluice_core::SlidingWindow), exactly.
-- State (after the stamp): "<window end, ns> <previous> <current>". Returns {allowed,
-- remaining, retry_after_ns, reset_after_ns}. Products that the core takes in u128 are split
-- here so that every intermediate stays an exact integer.
local p, c, left = 0, 0, nil
local v = state()
local e, ps, cs, d
if v then e, ps, cs = string.match(v, '^(%d+) (%d+) (%d+)$') end
if e then
  local es, en = split(e)
  p, c = tonumber(ps), tonumber(cs)
  d = (es - s) * E9 + (en - nn) -- window end - now
end
-- A refund (sluice_core::SlidingWindow::refund): the admission is taken off the stored window
-- that counted it, the current [end - W, end) or the previous [end - 2W, end - W), that is
-- -d < ago <= W - d or W - d < ago <= 2W - d. Returns {1, 0, 0, 0}.
-- A charge (ARGV[4] = 'c'): the cost is cut to the remaining of a query, then counted.
-- Returns the decision and, fifth, what was taken.
local charging = ARGV[4] == 'c'
if ARGV[4] and not charging then
  local ago = tonumber(ARGV[4])
  if d then
    if ago > -d and ago <= W - d then
      c = math.max(0, c - cost)
    elseif ago > W - d and ago <= 2 * W - d then
      p = math.max(0, p - cost)
    end
    redis.call('SET', KEYS[1], STAMP .. '|' .. e .. ' ' .. p .. ' ' .. c, 'KEEPTTL')
  end
  return {1, 0, 0, 0}
end
if d then
  if d > 0 then
    left = math.min(d, W)
  elseif d > -W then
    p, c, left = c, 0, d + W -- the next window: current becomes previous
  else
    p, c = 0, 0 -- two or more windows later
  end
elseif v then
  -- Unreadable: the worst case, everything spent now (written, so that it heals).
  p, c, left = cap, 0, W
  set(end_string(W) .. ' ' .. cap .. ' 0', W)
end
if not left then left = aligned_left() end
p, c = math.min(p, cap), math.min(c, cap)
-- Is p * left + (c + cost) * W <= cap * W? With left = q * interval + r and W = cap * interval:
-- c + cost <= cap and p * r <= (k * cap - p * q) * interval, k = cap - c - cost.
local q = idiv(left, interval)
local r = left - q * interval
-- ceil(p * left / W): the previous window's weight now, in whole tokens.
local a = p * q
local a1 = idiv(a, cap)
local x = (a - a1 * cap) * interval + p * r
local ceil_used = a1
if x > W then ceil_used = a1 + 2 elseif x > 0 then ceil_used = a1 + 1 end
if charging then
  local free = math.max(0, cap - c - ceil_used)
  if cost > free then cost = free end
end
local k = cap - c - cost
local allowed = false
if k >= 0 then
  local m = k * cap - p * q
  allowed = m >= 0 and (m >= cap or p * r <= m * interval)
end
if allowed then c = c + cost end
-- remaining = max(0, cap - c - ceil(p * left / W))
local remaining = math.max(0, cap - c - ceil_used)
local reset = 0
if c > 0 then reset = left + W elseif p > 0 then reset = left end
if allowed then
  if cost > 0 then
    set(end_string(left) .. ' ' .. p .. ' ' .. c, left + W)
  end
  if charging then return {1, remaining, 0, reset, cost} end
  return {1, remaining, 0, reset}
end
-- floor(kn * W / div) clamped to `bound` (<= W), with W = cap * interval, exactly.
local function fits(kn, div, bound)
  local u = idiv(kn, div)
  if u >= cap then return bound end
  return math.min(u * interval + idiv((kn - u * div) * interval, div), bound)
end
local wait
if k >= 0 then
  wait = left - fits(k * cap, math.max(p, 1), left)
else
  wait = left + (W - fits((cap - cost) * cap, math.max(c, 1), W))
end
return {0, remaining, wait, reset}
