-- sluice jobs: opens the sliding window decision of the store (time.lua, stamp.lua,
-- window_prelude.lua, sliding_window.lua follow, then close.lua) as a function.
local function bucket_sw(KEYS, ARGV)
