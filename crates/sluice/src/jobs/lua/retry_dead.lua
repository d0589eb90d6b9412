-- sluice jobs: puts dead-lettered jobs back to wait, their attempts counted afresh. After
-- now.lua and group.lua. ARGV: [1] now, [2] how many at most (0 for all).
-- Returns {moved, version}: the group's version after (register.lua takes it).
local most = tonumber(ARGV[2])
if not most or most < 0 then return redis.error_reply('sluice jobs: bad count ' .. tostring(ARGV[2])) end
local moved = 0
if redis.call('EXISTS', K_DEAD) == 1 then
  local count = most
  if count == 0 then count = redis.call('XLEN', K_DEAD) end
  local entries = redis.call('XRANGE', K_DEAD, '-', '+', 'COUNT', math.max(count, 1))
  for _, e in ipairs(entries) do
    if most > 0 and moved >= most then break end
    local id
    local f = e[2]
    for i = 1, #f, 2 do if f[i] == 'job' then id = f[i + 1] end end
    redis.call('XDEL', K_DEAD, e[1])
    local j = id and load_job(id)
    if j and j.s == 'dead' then
      j.s, j.a, j.d = 'waiting', '0', '0'
      save_job(j)
      redis.call('ZADD', K_WAIT, wait_score(j), id)
      moved = moved + 1
    end
  end
end
local version = meta_int('v')
if moved > 0 then version = tonumber(bump()) end
return {moved, version}
