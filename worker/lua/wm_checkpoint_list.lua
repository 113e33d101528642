-- WorkingMemory.list_checkpoints. ARGV: session ttl ms. Info JSON of each, newest first.
local ids = redis.call('ZREVRANGE', K_CPS, 0, -1)
local infos = {}
for _, id in ipairs(ids) do
  local info = redis.call('HGET', K_CPDATA, id .. '|info')
  if info then infos[#infos + 1] = info end
end
touch(ARGV[1])
return infos
