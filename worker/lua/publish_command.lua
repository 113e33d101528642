-- Publish one command with the session's next seq, atomically: the seq is taken only if the
-- command is written, so a failed publish can never leave a gap that stalls the session.
-- A second run for an event_id among the session's last 4 publishes (a call retried after its
-- reply was lost) writes nothing and returns that publish's seq: it must not take a second
-- seq, or the session's next command would wait for one that never comes.
-- Every command takes the next number, a spawn too: a spawn of a session that does not exist
-- starts it at its seq (whatever it is), and one of a live session is rejected already_exists
-- at the seq it took, so the counter and the session's seq never part.
-- KEYS: 1 the session's seq counter (an integer, as INCR keeps it), 2 the lifecycle stream,
--       3 the session's publish records: "\n<digest> <seq>" per publish, newest first (digest:
--       16 hex digits of SHA-1 of the event_id), kept as long as the counter.
-- ARGV: 1 the command's JSON without seq (an object), 2 counter TTL ms, 3 traceparent ('' if
--       none), 4 the event_id.
-- Returns {stream entry id ('' when the event_id was published already), seq}.
local KEEP = 4
local digest = string.sub(redis.sha1hex(ARGV[4]), 1, 16)
local records = redis.call('GET', KEYS[3]) or ''
local at = string.find(records, '\n' .. digest .. ' ', 1, true)
if at then
  local from = at + #digest + 2
  local to = string.find(records, '\n', from, true)
  return {'', tonumber(string.sub(records, from, to and to - 1 or -1))}
end
local seq = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local data = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
local id
if ARGV[3] ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'data', data, 'traceparent', ARGV[3])
else
  id = redis.call('XADD', KEYS[2], '*', 'data', data)
end
records = '\n' .. digest .. ' ' .. seq .. records
local cut = 0
for _ = 1, KEEP do
  cut = string.find(records, '\n', cut + 1, true)
  if not cut then break end
end
if cut then
  local beyond = string.find(records, '\n', cut + 1, true)
  if beyond then records = string.sub(records, 1, beyond - 1) end
end
redis.call('SET', KEYS[3], records, 'PX', ARGV[2])
return {id, seq}
