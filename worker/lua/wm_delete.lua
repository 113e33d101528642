-- WorkingMemory.delete. ARGV: session ttl ms, name. 1 if it was there.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
purge_expired(now_ms())
local size = redis.call('HSTRLEN', K_VARS, ARGV[2])
local removed = redis.call('HDEL', K_VARS, ARGV[2])
if removed > 0 then
  local kept = redis.call('HGET', K_CPDATA, VBYTES)
  if kept then
    redis.call('HSET', K_CPDATA, VBYTES, math.max(tonumber(kept) - size - #ARGV[2], 0))
  end
end
redis.call('ZREM', K_VEXP, ARGV[2])
touch(ARGV[1])
return removed
