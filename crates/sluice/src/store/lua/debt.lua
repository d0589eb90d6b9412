-- sluice: GCRA, the one script for token_bucket, gcra and leaky_bucket (they admit alike).
-- ARGV (after time.lua, stamp.lua and gcra_state.lua): stamp 'gcra:<capacity>:<interval_ns>',
-- cost, [now_ns: tests only, '' for Redis's time], [ago_ns: a refund of cost admitted ago_ns
-- before now, see below]. Tokens held by leases are not free (gcra_state.lua).
-- Returns {allowed, remaining, retry_after_ns, reset_after_ns}, as sluice_core::Gcra::step.
-- A refund (sluice_core::Gcra::refund): the debt shrinks by the cost, never below none; the
-- time of the admission does not matter to a debt. What it gives back counts as paying the
-- slices settled at their expiry first (gcra_state.lua), as the refill since does: their late
-- give-backs return only what the debt still holds of them, so a refund and a give-back never
-- return the same tokens twice. Returns {1, 0, 0, 0}.
-- A charge (ARGV[4] = 'c', sluice_core::Algorithm::charge): the cost is taken without asking,
-- into debt beyond an empty bucket, as long as the key then owes at most ARGV[5] ns of refill
-- (its window included; the whole tokens that fit are taken, the rest is forgiven). Returns
-- {1, remaining, 0, reset_after_ns, taken}.
local charging = ARGV[4] == 'c'
if ARGV[4] and not charging then
  if debt > 0 then
    local paid = math.min(cost * interval, debt)
    debt = debt - paid
    dirty = true
    -- Newest first: each settled slice's grace moves earlier by what the refund paid of it,
    -- as if the refill had (lease.lua reads what is still owed from the time left).
    for j = #settled, 1, -1 do
      if paid <= 0 then break end
      local l = settled[j]
      local us, un = split(l[3])
      local left = (us - s) * E9 + (un - nn)
      local owed_still = l[2] * interval - (GRACE - left)
      if owed_still > 0 then
        local take = math.min(paid, owed_still)
        l[3] = end_string(left - take)
        paid = paid - take
      end
    end
  end
  if dirty then store_state() end
  return {1, 0, 0, 0}
end
local owed = debt + held * interval
if charging then
  local room = (tonumber(ARGV[5] or '') or tau) - owed
  local fits = 0
  if room > 0 then fits = idiv(room, interval) end
  if cost > fits then cost = fits end
  if cost > 0 then
    debt = debt + cost * interval
    dirty = true
  end
  if dirty then store_state() end
  local ahead = owed + cost * interval
  local q = 0
  if ahead < tau then q = idiv(tau - ahead, interval) end
  return {1, q, 0, ahead, cost}
end
local ahead = owed + cost * interval
if ahead > tau then
  if dirty then store_state() end
  local left = tau - owed
  if left < 0 then left = 0 end
  local q = math.floor(left / interval)
  if q * interval > left then q = q - 1 end
  return {0, q, ahead - tau, owed}
end
local q = math.floor((tau - ahead) / interval)
if q * interval > tau - ahead then q = q - 1 end
if cost > 0 or dirty then
  debt = debt + cost * interval
  store_state()
end
return {1, q, 0, ahead}
