-- sluice: the state of a GCRA key (token_bucket, gcra and leaky_bucket), after time.lua and
-- stamp.lua: the debt, and the leases that gateways hold on it.
-- The value's state is '<full again at>' followed by one ' <id>:<tokens>:<expires at>' per
-- lease outstanding and one ' <id>=<tokens>=<until>' per lease settled at its expiry (times in
-- decimal ns since the Unix epoch). A lease is a slice of the
-- bucket that one gateway spends on its own: its tokens are withheld from everyone else
-- ('held') but not yet debited; they are debited, as spent now, when the gateway gives the
-- lease back (what it spent) or when the lease expires (all of it). So at any time the free
-- tokens (the level minus what is held), plus what the holders have not spent, never exceed
-- the level: no gateway, crashed or not, ever admits beyond capacity plus the refill.
local tau = W
-- debt: ns until full again (beyond tau when a charge left the key owing); leases: {id, tokens, expiry text} not yet expired;
-- held: their tokens; dirty: the state changed in reading (an expired lease settled, an
-- unreadable value taken as the worst case) and must be written whatever is decided.
-- settled: leases that expired and were settled as all spent, {id, tokens, until}: until then
-- (GRACE after the expiry) their holder may still report what it spent, and the rest is given
-- back (lease.lua). A holder stops spending a slice before Redis's expiry of it, so what it
-- reports is final; a slice that ended with tokens left is not lost because its give-back
-- arrived just after the expiry.
local GRACE = 10 * E9
local debt, leases, held, dirty, settled = 0, {}, 0, false, {}
do
  local v = state()
  if v then
    local head, rest = string.match(v, '^(%d+)(.*)$')
    local ts, tn
    if head then ts, tn = split(head) end
    local unread = rest
    if ts and tn then
      debt = (ts - s) * E9 + (tn - nn)
      if debt < 0 then debt = 0 end
      for id, k, e in string.gmatch(rest, ' (%w+):(%d+):(%d+)') do
        k = tonumber(k)
        local es, en = split(e)
        local left = (es - s) * E9 + (en - nn)
        if left <= 0 then
          -- Expired: its holder may have spent all of it, so all of it is spent now.
          debt = debt + k * interval
          dirty = true
          if left + GRACE > 0 then settled[#settled + 1] = {id, k, end_string(left + GRACE)} end
        else
          leases[#leases + 1] = {id, k, e}
          held = held + k
        end
      end
      for id, k, u in string.gmatch(rest, ' (%w+)=(%d+)=(%d+)') do
        local us, un = split(u)
        if (us - s) * E9 + (un - nn) > 0 then
          settled[#settled + 1] = {id, tonumber(k), u}
        else
          dirty = true
        end
      end
      unread = string.gsub(string.gsub(rest, ' %w+:%d+:%d+', ''), ' %w+=%d+=%d+', '')
    end
    if not (ts and tn) or unread ~= '' then
      -- Unreadable: the worst case, everything spent now (written, so that it heals).
      debt, leases, held, dirty, settled = tau, {}, 0, true, {}
    end
  end
end
-- Writes the debt and the leases: the key lives until every lease could have expired and its
-- tokens been repaid.
local function store_state()
  local body = end_string(debt)
  local last = 0
  for _, l in ipairs(leases) do
    body = body .. ' ' .. l[1] .. ':' .. l[2] .. ':' .. l[3]
    local es, en = split(l[3])
    local left = (es - s) * E9 + (en - nn)
    if left > last then last = left end
  end
  for _, l in ipairs(settled) do
    body = body .. ' ' .. l[1] .. '=' .. l[2] .. '=' .. l[3]
    local us, un = split(l[3])
    local left = (us - s) * E9 + (un - nn)
    if left > last then last = left end
  end
  set(body, debt + held * interval + last)
end
-- The whole tokens free now: the level less what the leases hold.
local function free_now()
  local left = tau - debt - held * interval
  if left < 0 then return 0 end
  local q = math.floor(left / interval)
  if q * interval > left then q = q - 1 end
  return q
end
