-- sluice: what every script shares, after time.lua: its stamp, and reading a key that another
-- quota or algorithm wrote, converted to this script's first.
-- KEYS[1] the key; ARGV[1] this script's stamp, '<family>:<capacity>:<interval_ns>' (family
-- gcra for token_bucket, gcra and leaky_bucket; fw, sw for the windows); ARGV[2] the cost.
-- Every value is '<stamp>|<state>': the stamp says under which quota the state was written,
-- the state is the family's: gcra '<full again at>' (and its leases, gcra_state.lua), fw '<window end> <count>', sw '<window
-- end> <previous> <current>' (times in decimal ns since the Unix epoch).
local STAMP = ARGV[1]
local cost = tonumber(ARGV[2])
local TWO52, TWO53 = 4503599627370496, 9007199254740992
-- A stamp's family, capacity and interval; nil for a stamp no script writes (a window above
-- 2^52 ns, a window capacity above 94906265: numbers that would not stay exact here).
local function parse_stamp(t)
  local f, n, i = string.match(t, '^(%l+):(%d+):(%d+)$')
  if not f then return nil end
  n, i = tonumber(n), tonumber(i)
  if n < 1 or i < 1 or n * i > TWO52 then return nil end
  if f ~= 'gcra' and ((f ~= 'fw' and f ~= 'sw') or n > 94906265) then return nil end
  return f, n, i
end
local FAMILY, cap, interval = parse_stamp(STAMP)
if not FAMILY then return redis.error_reply('sluice: bad stamp ' .. tostring(STAMP)) end
local W = cap * interval
-- Writes the state text `body` under this stamp, the key kept `idle` ns from now (plus
-- ttl_ms's margin) and never less long than it already was: the value of another quota may
-- hold less than this one reads as full, and so must live as long as that quota counted on.
local function set(body, idle)
  local ms = ttl_ms(idle)
  local kept = redis.call('PTTL', KEYS[1])
  if kept > ms then ms = kept end
  redis.call('SET', KEYS[1], STAMP .. '|' .. body, 'PX', ms)
end
-- floor(a / b) for integers below 2^53, exact.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
-- floor(a * b / c) and the remainder, exact for integers 0 <= a, b < 2^53 and 0 < c <= 2^52
-- while the quotient is below 2^53 (a larger quotient comes back as at least 2^53).
local function muldiv(a, b, c)
  local p = a * b
  if p < TWO53 then
    local q = idiv(p, c)
    return q, p - q * c
  end
  local qa = idiv(a, c)
  local ra = a - qa * c
  local big = qa * b
  if big >= TWO53 then return big, 0 end
  -- ra * b = q * c + r over the bits of b, highest first: r < c, so r + r and r + ra stay
  -- below 2^53.
  local bits = {}
  while b > 0 do
    local bit = b % 2
    bits[#bits + 1] = bit
    b = (b - bit) / 2
  end
  local q, r = 0, 0
  for j = #bits, 1, -1 do
    q, r = q + q, r + r
    if r >= c then q, r = q + 1, r - c end
    if bits[j] == 1 then
      r = r + ra
      if r >= c then q, r = q + 1, r - c end
    end
  end
  return big + q, r
end
-- ceil(a * b / c), as muldiv.
local function muldiv_up(a, b, c)
  local q, r = muldiv(a, b, c)
  if r > 0 then q = q + 1 end
  return q
end
-- A state written under family f, capacity n and interval i (window w = n * i), as it stands
-- now, rolled as the Rust core rolls it: {debt, leases, leased} for gcra (0 <= debt, beyond w
-- in debt; the text of its leases, gcra_state.lua, and their tokens in ns of i), {left, count}
-- for fw, {left, previous, current} for sw (0 < left <= w, counts at most n); nil if
-- unreadable.
local function saved(f, n, i, body)
  local w = n * i
  local e, a, b
  local leased, leases = 0, ''
  if f == 'gcra' then
    local rest
    e, rest = string.match(body, '^(%d+)(.*)$')
    if rest then
      for l, k in string.gmatch(rest, '( %w+:(%d+):%d+)') do
        leased = leased + tonumber(k)
        leases = leases .. l
      end
      -- Slices settled at their expiry stay settled as spent: a conversion forgets them.
      local unread = string.gsub(string.gsub(rest, ' %w+:%d+:%d+', ''), ' %w+=%d+=%d+', '')
      if unread ~= '' then e = nil end
    end
  elseif f == 'fw' then
    e, a = string.match(body, '^(%d+) (%d+)$')
  else
    e, a, b = string.match(body, '^(%d+) (%d+) (%d+)$')
  end
  if not e then return nil end
  local es, en = split(e)
  local d = (es - s) * E9 + (en - nn) -- end - now
  -- A gcra key may owe more than its window: the debt a charge left (see debt.lua).
  if f == 'gcra' then return {math.min(math.max(d, 0), TWO53), leases, leased * i} end
  a = math.min(tonumber(a), n)
  if d > 0 then
    if f == 'fw' then return {math.min(d, w), a} end
    return {math.min(d, w), a, math.min(tonumber(b), n)}
  end
  -- Over: the window holding now, in the phase of the stored one, empty; for sw the last
  -- current count is the previous one, if that window is the one just before.
  local past = math.min(-d, TWO52)
  local left = w - (past - idiv(past, w) * w)
  if f == 'fw' then return {left, 0} end
  if past < w then return {left, math.min(tonumber(b), n), 0} end
  return {left, 0, 0}
end
-- The whole tokens that state st (of f, n, i) has left now.
local function tokens_left(f, n, i, st)
  if f == 'gcra' then return idiv(n * i - st[1], i) end
  if f == 'fw' then return n - st[2] end
  return math.max(0, n - st[3] - muldiv_up(st[2], st[1], n * i))
end
-- State st (of f, n, i) as this script's family and quota keep it, so that it has no more
-- whole tokens than before, and at most the capacity. Within a family, exactly as
-- sluice_core::SavedState::convert (debt kept in the new rate's time); from another family,
-- what it has left now, the rest spent now: a gcra key owes it at this rate, a window key
-- counts it in a window of its own that starts now (a whole window: never sooner back than
-- the core's fresh window would give it, often later).
local function converted(f, n, i, st)
  if f == 'gcra' and FAMILY ~= 'gcra' then
    -- A window keeps no leases: the tokens they hold count as spent now.
    st = {math.min(st[1] + st[3], TWO53)}
  end
  if f == FAMILY then
    if n == cap and i == interval then return st end
    if f == 'gcra' then
      -- Leases outstanding (gcra_state.lua) stay held, token for token, under this quota:
      -- their tokens are withheld until their holders give them back or they expire, as
      -- under the old one. Counted as spent now instead, they would refill while their
      -- holders still spend them.
      if st[1] > n * i then
        -- In debt: what it owes beyond empty, in the new rate's time (rounded up), stays owed.
        return {math.min(W + muldiv_up(st[1] - n * i, interval, i), TWO53), st[2]}
      end
      local level = muldiv(n * i - st[1], interval, i)
      return {W - math.min(level, W), st[2]}
    end
    if f == 'fw' then return {math.min(st[1], W), math.max(0, st[2] + cap - n)} end
    -- Whole tokens before: n - current - ceil(previous * left / w). The previous window
    -- keeps its weight; the current count makes up the rest.
    local target = math.min(n - st[3] - muldiv_up(st[2], st[1], n * i), cap)
    local left = math.min(st[1], W)
    local p = math.min(st[2], cap)
    local c = cap - target - muldiv(p, left, W)
    return {left, p, math.min(math.max(c, 0), cap)}
  end
  local spent = cap - math.min(math.max(tokens_left(f, n, i, st), 0), cap)
  if FAMILY == 'gcra' then return {spent * interval} end
  if FAMILY == 'fw' then return {W, spent} end
  return {W, 0, spent}
end
-- Writes st (this family's, as `saved` gives it) under this stamp; returns the state text.
-- A full gcra key is written too ('full now'): deleted, every quota would read it as full.
local function put(st)
  local body, idle
  if FAMILY == 'gcra' then
    -- The key lives until its leases could have expired and their tokens been repaid.
    local leases, last = st[2] or '', 0
    idle = st[1]
    for k, e in string.gmatch(leases, ' %w+:(%d+):(%d+)') do
      local es, en = split(e)
      local left = (es - s) * E9 + (en - nn)
      if left > last then last = left end
      idle = idle + tonumber(k) * interval
    end
    body, idle = end_string(st[1]) .. leases, idle + last
  elseif FAMILY == 'fw' then
    body, idle = end_string(st[1]) .. ' ' .. st[2], st[1]
  else
    body, idle = end_string(st[1]) .. ' ' .. st[2] .. ' ' .. st[3], st[1] + W
  end
  set(body, idle)
  return body
end
-- The key's state as this script's family stores it: nil without a key, '' if unreadable (the
-- script then takes the worst case). A value stamped otherwise is converted to this stamp and
-- written back first, whatever the script then decides.
local function state()
  local v = redis.call('GET', KEYS[1])
  if not v then return nil end
  local stamp, body = string.match(v, '^([^|]*)|(.*)$')
  if stamp == STAMP then return body end
  if not stamp then return '' end
  local f, n, i = parse_stamp(stamp)
  if not f then return '' end
  local st = saved(f, n, i, body)
  if not st then return '' end
  return put(converted(f, n, i, st))
end
