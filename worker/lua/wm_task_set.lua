#!lua
-- WorkingMemory.set_task_state. ARGV: session ttl ms, task JSON.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local full = admission_refused()  -- Redis nearly full
if full then return redis.error_reply(full) end
redis.call('SET', K_TASK, ARGV[2])
touch(ARGV[1])
return 1
