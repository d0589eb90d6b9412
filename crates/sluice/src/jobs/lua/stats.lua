-- sluice jobs: a group's figures, read at once. After now.lua and group.lua. ARGV: [1] now.
-- Returns {waiting, delayed, active, dead (in the dead-letter stream), completed, failed,
-- retried, dead-lettered, reclaimed, paused (ms left), seq (the enqueue count)}, integers.
local paused = meta_int('paused') - NOW_MS
if paused < 0 then paused = 0 end
local active = 0
if redis.call('EXISTS', K_ACTIVE) == 1 then active = redis.call('XLEN', K_ACTIVE) end
local dead = 0
if redis.call('EXISTS', K_DEAD) == 1 then dead = redis.call('XLEN', K_DEAD) end
return {redis.call('ZCARD', K_WAIT), redis.call('ZCARD', K_DELAYED), active, dead,
  meta_int('completed'), meta_int('failed'), meta_int('retried'), meta_int('dead'),
  meta_int('reclaimed'), paused, meta_int('seq')}
