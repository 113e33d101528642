#!lua
-- WorkingMemory.set_task_state. ARGV: session ttl ms, task JSON.
if session_state() == 'terminated' then return redis.error_reply('WM_TERMINATED') end
redis.call('SET', K_TASK, ARGV[2])
touch(ARGV[1])
return 1
