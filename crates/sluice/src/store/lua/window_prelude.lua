-- sluice: what the window scripts share. Prepended (after time.lua) to sliding_window.lua and
-- fixed_window.lua.
-- KEYS[1] the key; ARGV: interval_ns, capacity, cost, [now_ns: tests only, '' for Redis's time],
-- [ago_ns: a refund of cost admitted ago_ns before now]
-- Windows are aligned to multiples of W = capacity x interval since the epoch, as the Rust core aligns them
-- to multiples of W since its clock's origin. The caller keeps W <= 2^52 and capacity^2 < 2^53.
local interval = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local W = cap * interval
-- floor(a / b) for integers below 2^53, exact.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
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
