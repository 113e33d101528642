-- WorkingMemory.clear_scratchpad. ARGV: session ttl ms. Entries removed.
if session_state() == 'terminated' then return redis.error_reply('WM_TERMINATED') end
local length = redis.call('LLEN', K_SCRATCH)
redis.call('DEL', K_SCRATCH)
touch(ARGV[1])
return length
