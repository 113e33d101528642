#!lua
-- WorkingMemory.restore_checkpoint. ARGV: session ttl ms, id, clear current (1/0).
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local id = ARGV[2]
if not checkpoint_exists(id) then return redis.error_reply('WM_NO_CHECKPOINT') end
local items = checkpoint_restore(id, ARGV[3] == '1', now_ms())
touch(ARGV[1])
return items
