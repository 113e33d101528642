-- WorkingMemory.delete_checkpoint. ARGV: session ttl ms, id. 1 if it was there.
if session_state() == 'terminated' then return redis.error_reply('WM_TERMINATED') end
if session_state() == 'forgotten' then return redis.error_reply('WM_FORGOTTEN') end
local removed = checkpoint_delete(ARGV[2])
touch(ARGV[1])
return removed
