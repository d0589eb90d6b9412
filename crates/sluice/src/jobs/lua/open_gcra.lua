-- sluice jobs: opens the GCRA decision of the store (time.lua, stamp.lua, gcra_state.lua,
-- debt.lua follow, then close.lua) as a function of its own KEYS and ARGV.
local function bucket_gcra(KEYS, ARGV)
