-- WorkingMemory.get. ARGV: session ttl ms, name. The value's JSON text, or nil.
purge_expired(now_ms())
local value = redis.call('HGET', K_VARS, ARGV[2])
touch(ARGV[1])
return value
