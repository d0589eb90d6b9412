-- sluice jobs: hands consumer ARGV[3] the group's next job, if the group's pause, concurrency
-- and bucket allow it. After the bucket functions, now.lua, group.lua and decide.lua.
-- ARGV: [1] now, [2] the bucket's stamp ('' for no limit), [3] consumer, [4] the group's
-- concurrency (0 for none), [5] the visibility timeout (ms): an entry of the active stream
-- idle that long (its worker stopped heartbeating) is claimed back first.
-- Returns {reply, ...}, every element a string; `v` is the group's version (group.lua), which
-- park.lua takes:
--   {'job', id, entry, payload, cost, attempts, max, priority, idem, reclaimed (0|1), v}
--   {'wait', ms, v}     the bucket admits the head job's cost in ms
--   {'paused', ms, v}   the group is paused (slowed by a server's hint) for ms
--   {'busy', '', v}     the group's concurrency is taken
--   {'delayed', ms, v}  nothing waits; the next delayed job is due in ms
--   {'idle', '', v}     nothing waits or is delayed; jobs are active
--   {'empty', '', v}    the group holds no job at all
--   {'skip', id, v}     job id was dead-lettered here (its cost is above the bucket's
--                         capacity, or it was abandoned after its last attempt): claim again
local stamp, consumer = ARGV[2], ARGV[3]
local conc, vis = tonumber(ARGV[4]), tonumber(ARGV[5])
if not conc or not vis or consumer == nil or consumer == '' then
  return redis.error_reply('sluice jobs: claim takes now, stamp, consumer, concurrency, visibility')
end
local v = int(meta_int('v'))
local paused = meta_int('paused')
if paused > NOW_MS then return {'paused', int(paused - NOW_MS), v} end
promote_due()
ensure_group()
local j, entry, reclaimed = nil, nil, false
-- An entry idle beyond the visibility timeout: its worker stopped, and the job runs again.
local stale = redis.call('XPENDING', K_ACTIVE, CG, 'IDLE', vis, '-', '+', 1)
if stale[1] then
  entry = stale[1][1]
  local e = redis.call('XRANGE', K_ACTIVE, entry, entry)
  local id
  if e[1] then
    local f = e[1][2]
    for i = 1, #f, 2 do if f[i] == 'job' then id = f[i + 1] end end
  end
  j = id and load_job(id)
  if not j or j.e ~= entry then
    drop_entry(entry)
    return {'skip', id or '', v}
  end
  if tonumber(j.a) >= tonumber(j.m) then
    drop_entry(entry)
    dead_letter(j, 'abandoned: its worker stopped during its last attempt')
    return {'skip', j.id, v}
  end
  reclaimed = true
else
  local active = redis.call('XLEN', K_ACTIVE)
  if conc > 0 and active >= conc then return {'busy', '', v} end
  local head = redis.call('ZRANGE', K_WAIT, 0, 0)
  if not head[1] then
    local next_due = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
    if next_due[1] then
      return {'delayed', int(math.max(tonumber(next_due[2]) - NOW_MS, 1)), v}
    end
    if active > 0 then return {'idle', '', v} end
    return {'empty', '', v}
  end
  j = load_job(head[1])
  if not j then
    redis.call('ZREM', K_WAIT, head[1])
    return {'skip', head[1], v}
  end
end
local cost = tonumber(j.c)
local charged = 0
if stamp ~= '' then
  local cap = stamp_quota(stamp)
  if not cap then return redis.error_reply('sluice jobs: bad stamp ' .. stamp) end
  if cost > cap then
    if reclaimed then drop_entry(entry) else redis.call('ZREM', K_WAIT, j.id) end
    redis.call('HINCRBY', K_META, 'failed', 1)
    dead_letter(j, 'its cost ' .. j.c .. ' is above the limit\'s capacity ' .. int(cap))
    return {'skip', j.id, v}
  end
  local r = decide(stamp, cost)
  if r.err then return r end
  if r[1] ~= 1 then
    local ms = math.floor(r[3] / 1000000)
    if ms * 1000000 < r[3] then ms = ms + 1 end
    return {'wait', int(math.max(ms, 1)), v}
  end
  charged = cost
end
if reclaimed then
  redis.call('XCLAIM', K_ACTIVE, CG, consumer, vis, entry, 'JUSTID')
  redis.call('HINCRBY', K_META, 'reclaimed', 1)
else
  redis.call('ZREM', K_WAIT, j.id)
  entry = redis.call('XADD', K_ACTIVE, '*', 'job', j.id)
  local read = redis.call('XREADGROUP', 'GROUP', CG, consumer, 'COUNT', 1, 'STREAMS', K_ACTIVE, '>')
  local got = read and read[1] and read[1][2][1] and read[1][2][1][1]
  if got ~= entry then
    return redis.error_reply('sluice jobs: the active stream of ' .. K_ACTIVE .. ' holds an entry no claim read')
  end
end
j.a = int(tonumber(j.a) + 1)
j.s, j.e, j.cn, j.ch, j.st = 'active', entry, consumer, int(charged), NOW_NS
save_job(j)
local r = '0'
if reclaimed then r = '1' end
return {'job', j.id, entry, j.p, j.c, j.a, j.m, j.pr, j.k, r, v}
