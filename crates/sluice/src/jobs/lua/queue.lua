-- sluice jobs: what the scripts of a queue's group list share, after now.lua.
-- KEYS, the same for every queue script, all in the slot of the hash tag {<queue>}:
--   [1] <prefix>:{<queue>}:ready   ZSET   groups that may have a job to hand out, by turn
--                                         (round robin: a group taken goes to the back)
--   [2] <prefix>:{<queue>}:later   ZSET   groups skipped until a time (ms): their bucket,
--                                         pause, concurrency or delayed jobs said so
--   [3] <prefix>:{<queue>}:marks   HASH   group -> the highest version registered
--   [4] <prefix>:{<queue>}:turn    STRING the round-robin counter
--   [5] <prefix>:{<queue>}:groups  SET    every group the queue has had (until forgotten)
local K_READY, K_LATER, K_MARKS, K_TURN, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local function to_back(g)
  redis.call('ZADD', K_READY, redis.call('INCR', K_TURN), g)
end
