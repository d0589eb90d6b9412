-- sluice jobs: a heartbeat. After now.lua and group.lua.
-- ARGV: [1] now, [2] consumer, [3] job id, [4] stream entry.
-- Resets the entry's idle time (XCLAIM ... JUSTID) if the consumer still holds it, so it is
-- not claimed back while its worker runs it. Returns 1, or 0 when the consumer holds it no
-- more (claimed back by another worker: this attempt's result will be 'lost').
local consumer, id, entry = ARGV[2], ARGV[3], ARGV[4]
local j = load_job(id)
if not j or j.e ~= entry or owner(entry) ~= consumer then return 0 end
redis.call('XCLAIM', K_ACTIVE, CG, consumer, 0, entry, 'JUSTID')
return 1
