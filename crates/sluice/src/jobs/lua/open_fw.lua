-- sluice jobs: opens the fixed window decision of the store (time.lua, stamp.lua,
-- window_prelude.lua, fixed_window.lua follow, then close.lua) as a function.
local function bucket_fw(KEYS, ARGV)
