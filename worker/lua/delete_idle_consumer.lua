-- Delete a consumer of a group only if it owns no pending entry and has been idle at least
-- the given time, in one step: a consumer that came back meanwhile keeps its name, and no
-- pending entry is ever dropped with its consumer (XGROUP DELCONSUMER would drop them).
-- KEYS: 1 stream. ARGV: 1 group, 2 consumer, 3 minimum idle ms.
-- Returns 1 when deleted, 0 when kept (pending entries, not idle enough, or no such consumer).
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local min_idle = tonumber(ARGV[3])
for _, consumer in ipairs(consumers) do
  local info = {}
  for i = 1, #consumer, 2 do info[consumer[i]] = consumer[i + 1] end
  if info['name'] == ARGV[2] then
    if tonumber(info['pending']) == 0 and tonumber(info['idle']) >= min_idle then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
