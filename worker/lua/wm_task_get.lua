-- WorkingMemory.get_task_state. ARGV: session ttl ms. The task JSON, or nil.
local task = redis.call('GET', K_TASK)
touch(ARGV[1])
return task
