#!lua
-- WorkingMemory.create_checkpoint. ARGV: session ttl ms, id, description, now (RFC 3339),
-- max checkpoints. Replacing an existing id does not count against the limit.
if session_state() == 'terminated' then return redis.error_reply('WM_TERMINATED') end
if session_state() == 'forgotten' then return redis.error_reply('WM_FORGOTTEN') end
local full = admission_refused()  -- Redis nearly full (a checkpoint copies the variables)
if full then return redis.error_reply(full) end
local id = ARGV[2]
local max_checkpoints = tonumber(ARGV[5])
if not checkpoint_exists(id) and redis.call('ZCARD', K_CPS) >= max_checkpoints then
  return redis.error_reply('WM_LIMIT_CHECKPOINTS ' .. max_checkpoints)
end
local items = checkpoint_create(id, ARGV[3], now_ms(), ARGV[4])
touch(ARGV[1])
return items
