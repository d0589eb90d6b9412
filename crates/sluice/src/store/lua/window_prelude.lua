-- sluice: what the window scripts share. Prepended (after time.lua and stamp.lua) to
-- sliding_window.lua and fixed_window.lua; W = capacity x interval, from the stamp.
-- [ARGV[4]: ago_ns, a refund of cost admitted ago_ns before now]
-- Windows are aligned to multiples of W since the epoch, as the Rust core aligns them to
-- multiples of W since its clock's origin. The caller keeps W <= 2^52 and capacity^2 < 2^53.
-- Time left in the aligned window holding now: W - (now mod W), with now = s * 1e9 + nn.
local function aligned_left()
  local r
  if E9 % W == 0 then
    r = nn % W
  elseif W % E9 == 0 then
    r = (s % (W / E9)) * E9 + nn
  else
    -- (s mod W) * 1e9 mod W by doubling and adding over the 30 bits of 1e9; every value
    -- stays below 2W <= 2^53.
    local a, bits = s % W, '111011100110101100101000000000'
    r = 0
    for i = 1, 30 do
      r = r + r
      if r >= W then r = r - W end
      if string.byte(bits, i) == 49 then
        r = r + a
        if r >= W then r = r - W end
      end
    end
    r = (r + nn) % W
  end
  return W - r
end
