-- sluice: a gateway's lease on a GCRA key, after time.lua, stamp.lua and gcra_state.lua.
-- ARGV[4] the id of the lease given back (a gateway names each slice apart: its id and the
-- slice's generation); ARGV[5] the tokens it spent of it ('': none to give back); ARGV[6] the
-- tokens it asks for now (0: only give back); ARGV[7] how long the new lease lasts, in ns;
-- ARGV[8] the fewest tokens worth a lease (a hot key waits for a slice worth its round trip
-- rather than taking each token as it refills); ARGV[9] the new lease's id (default ARGV[4]).
-- A lease given back is settled: what was spent is debited now, the rest is free again. Only
-- the lease named is: a give-back that arrives late, after its holder took the next slice,
-- finds its own lease or nothing. A lease still outstanding under ARGV[4] and not given back
-- is settled as all spent (its holder lost track of it). The new lease takes what is free, up
-- to what was asked, if that is at least ARGV[8] (else nothing).
-- Returns {granted, free after, retry_after_ns (until ARGV[8] tokens are free, if none was
-- granted), reset_after_ns (until full, were every lease spent)}. Taking a slice is an
-- admission: the caller waits for the replicas to have it before spending any of it.
local id, want, ttl = ARGV[4], tonumber(ARGV[6]), tonumber(ARGV[7])
local new_id = ARGV[9] or ''
if new_id == '' then new_id = id end
local at_least = tonumber(ARGV[8] or '1')
if at_least < 1 then at_least = 1 end
if at_least > want then at_least = want end
-- found: 1 when the lease given back was still held or settled within its grace, 0 when it
-- was not (settled long ago, or never granted): its unspent tokens were then lost.
local found = 0
for j = #leases, 1, -1 do
  local l = leases[j]
  if l[1] == id then
    local spent = l[2]
    if ARGV[5] ~= '' then spent = math.min(tonumber(ARGV[5]), l[2]) end
    table.remove(leases, j)
    held = held - l[2]
    debt = debt + spent * interval
    dirty = true
    found = 1
  end
end
-- A lease settled at its expiry, only if none is held under the name: the give-back is then
-- that lease's, late.
if found == 0 and ARGV[5] ~= '' then
  for j = #settled, 1, -1 do
    local l = settled[j]
    if l[1] == id then
      -- Settled at its expiry as all spent; its holder reports less: the rest comes back, as
      -- far as the settlement is still owed. The refill since the expiry may already have
      -- paid it, and counting that as paid first keeps the refund from giving back tokens the
      -- refill already gave.
      local unspent = l[2] - math.min(tonumber(ARGV[5]), l[2])
      local us, un = split(l[3])
      local since = GRACE - ((us - s) * E9 + (un - nn))
      local owed_still = l[2] * interval - since
      local back = unspent * interval
      if back > owed_still then back = owed_still end
      if back > 0 then debt = debt - back end
      if debt < 0 then debt = 0 end
      table.remove(settled, j)
      dirty = true
      found = 1
      break
    end
  end
end
local granted = 0
if want > 0 then
  granted = math.min(want, free_now())
  if granted < at_least then granted = 0 end
  if granted > 0 then
    leases[#leases + 1] = {new_id, granted, end_string(ttl)}
    held = held + granted
    dirty = true
  end
end
if dirty then store_state() end
local owed = debt + held * interval
local wait = 0
if granted == 0 and want > 0 then wait = owed + at_least * interval - tau end
if wait < 0 then wait = 0 end
return {granted, free_now(), wait, owed, found}
