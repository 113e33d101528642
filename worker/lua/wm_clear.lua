-- WorkingMemory.clear: variables, task state and scratchpad; checkpoints stay.
-- ARGV: session ttl ms. Returns the number of items removed.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
purge_expired(now_ms())
local items = count_items()
redis.call('DEL', K_VARS, K_VEXP, K_TASK, K_SCRATCH)
forget_vars_bytes()
touch(ARGV[1])
return items
