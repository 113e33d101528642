-- WorkingMemory.list_keys. ARGV: session ttl ms, glob pattern.
-- HSCAN walks this session's vars hash only, so no pattern can name another session's keys.
purge_expired(now_ms())
local names = {}
local cursor = '0'
repeat
  local page = redis.call('HSCAN', K_VARS, cursor, 'MATCH', ARGV[2], 'COUNT', 1000)
  cursor = page[1]
  local flat = page[2]
  for i = 1, #flat, 2 do names[#names + 1] = flat[i] end
until cursor == '0'
touch(ARGV[1])
return names
