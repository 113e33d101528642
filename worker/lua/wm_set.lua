#!lua
-- WorkingMemory.set. ARGV: session ttl ms, name, value JSON, key ttl ms (0: none), max keys.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local now = now_ms()
purge_expired(now)
local name = ARGV[2]
local max_keys = tonumber(ARGV[5])
if redis.call('HEXISTS', K_VARS, name) == 0 and redis.call('HLEN', K_VARS) >= max_keys then
  return redis.error_reply('WM_LIMIT_KEYS ' .. max_keys)
end
redis.call('HSET', K_VARS, name, ARGV[3])
local key_ttl = tonumber(ARGV[4])
if key_ttl > 0 then
  redis.call('ZADD', K_VEXP, now + key_ttl, name)
else
  redis.call('ZREM', K_VEXP, name)
end
touch(ARGV[1])
return 1
