#!lua
-- WorkingMemory.append_scratchpad. ARGV: session ttl ms, entry JSON, max entries.
-- Returns the number of entries after the append (the oldest beyond the bound are dropped).
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local full = admission_refused()  -- Redis nearly full
if full then return redis.error_reply(full) end
local max_entries = tonumber(ARGV[3])
redis.call('RPUSH', K_SCRATCH, ARGV[2])
redis.call('LTRIM', K_SCRATCH, -max_entries, -1)
local length = redis.call('LLEN', K_SCRATCH)
touch(ARGV[1])
return length
