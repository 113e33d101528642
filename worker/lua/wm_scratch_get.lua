-- WorkingMemory.get_scratchpad. ARGV: session ttl ms, limit (0: all).
-- The newest `limit` entries, oldest first.
local limit = tonumber(ARGV[2])
local entries
if limit > 0 then
  entries = redis.call('LRANGE', K_SCRATCH, -limit, -1)
else
  entries = redis.call('LRANGE', K_SCRATCH, 0, -1)
end
touch(ARGV[1])
return entries
