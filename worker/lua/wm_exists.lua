-- WorkingMemory.exists. ARGV: session ttl ms, name.
purge_expired(now_ms())
local found = redis.call('HEXISTS', K_VARS, ARGV[2])
touch(ARGV[1])
return found
