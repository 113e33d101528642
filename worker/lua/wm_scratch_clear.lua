-- WorkingMemory.clear_scratchpad. ARGV: session ttl ms. Entries removed.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local length = redis.call('LLEN', K_SCRATCH)
redis.call('DEL', K_SCRATCH)
touch(ARGV[1])
return length
