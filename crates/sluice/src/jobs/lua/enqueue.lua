-- sluice jobs: adds a job to a group. After now.lua and group.lua.
-- ARGV: [1] now, [2] group, [3] payload, [4] cost (0 .. 2^32), [5] priority (0 .. 1000,
-- higher first), [6] delay (ms, 0 for none), [7] max attempts (1 .. 1000), [8] idempotency
-- key ('' for none).
-- With an idempotency key the group already holds (a job waiting, running, dead, or completed
-- and still kept), nothing is added and that job's id is returned.
-- Returns {id, added (1|0), version, due}: strings; version the group's version after this
-- call (register.lua takes it), due the time (ms) the job is due ('0' if now).
local group, payload, idem = ARGV[2], ARGV[3], ARGV[8]
local cost, prio, delay, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if not group or group == '' or not payload or not idem then
  return redis.error_reply('sluice jobs: enqueue takes now, group, payload, cost, priority, delay, max attempts, idempotency key')
end
if not cost or cost < 0 or cost > 4294967296 or cost % 1 ~= 0 then
  return redis.error_reply('sluice jobs: bad cost ' .. tostring(ARGV[4]))
end
if not prio or prio < 0 or prio > 1000 or prio % 1 ~= 0 then
  return redis.error_reply('sluice jobs: bad priority ' .. tostring(ARGV[5]))
end
if not delay or delay < 0 or delay % 1 ~= 0 then
  return redis.error_reply('sluice jobs: bad delay ' .. tostring(ARGV[6]))
end
if not max or max < 1 or max > 1000 or max % 1 ~= 0 then
  return redis.error_reply('sluice jobs: bad max attempts ' .. tostring(ARGV[7]))
end
if idem ~= '' then
  local known = redis.call('HGET', K_IDEM, idem)
  if known and redis.call('HEXISTS', K_JOBS, known) == 1 then
    return {known, '0', int(meta_int('v')), '0'}
  end
end
ensure_group()
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
local id = int(seq)
local j = {id = id, g = group, p = payload, c = int(cost), pr = int(prio), a = '0', m = int(max),
  k = idem, s = 'waiting', q = id, cr = int(NOW_MS), d = '0', e = '', cn = '', ch = '0', st = '',
  er = ''}
local due = '0'
if delay > 0 then
  j.s, j.d = 'delayed', int(NOW_MS + delay)
  due = j.d
  redis.call('ZADD', K_DELAYED, NOW_MS + delay, id)
else
  redis.call('ZADD', K_WAIT, wait_score(j), id)
end
save_job(j)
if idem ~= '' then redis.call('HSET', K_IDEM, idem, id) end
return {id, '1', bump(), due}
