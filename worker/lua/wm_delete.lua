-- WorkingMemory.delete. ARGV: session ttl ms, name. 1 if it was there.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
purge_expired(now_ms())
local removed = redis.call('HDEL', K_VARS, ARGV[2])
redis.call('ZREM', K_VEXP, ARGV[2])
touch(ARGV[1])
return removed
