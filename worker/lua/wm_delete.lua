-- WorkingMemory.delete. ARGV: session ttl ms, name. 1 if it was there.
if session_state() == 'terminated' then return redis.error_reply('WM_TERMINATED') end
purge_expired(now_ms())
local removed = redis.call('HDEL', K_VARS, ARGV[2])
redis.call('ZREM', K_VEXP, ARGV[2])
touch(ARGV[1])
return removed
