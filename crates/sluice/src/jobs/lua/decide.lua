-- sluice jobs: the group's bucket decided by the store's own scripts, after group.lua and the
-- bucket functions (open_*.lua, the store's lua files, close.lua), in claim.lua and finish.lua.
-- The store's own decision on the group's bucket, with the store's ARGV: stamp, cost, now,
-- [mode: ago_ns for a refund, 'c' for a charge], [most owed, ns, for a charge].
-- Returns the store script's reply (a table; an error reply for a bad stamp).
local function decide(stamp, cost, mode, most)
  local family = string.match(stamp, '^(%l+):')
  local argv = {stamp, int(cost), NOW_NS, mode, most}
  if family == 'gcra' then return bucket_gcra({K_BUCKET}, argv) end
  if family == 'sw' then return bucket_sw({K_BUCKET}, argv) end
  if family == 'fw' then return bucket_fw({K_BUCKET}, argv) end
  return redis.error_reply('sluice jobs: bad stamp ' .. tostring(stamp))
end
