-- Publish one command with the session's next seq, atomically: the seq is taken only if the
-- command is written, so a failed publish can never leave a gap that stalls the session.
-- KEYS: 1 the session's seq counter, 2 the lifecycle stream.
-- ARGV: 1 the command's JSON without seq (an object), 2 '1' for a spawn (the counter restarts:
--       a session id spawned again after its tombstone expired starts at seq 1),
--       3 counter TTL ms, 4 traceparent ('' if none).
-- Returns {stream entry id, seq}.
local seq
if ARGV[2] == '1' then
  seq = 1
  redis.call('SET', KEYS[1], 1, 'PX', ARGV[3])
else
  seq = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local data = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
local id
if ARGV[4] ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'data', data, 'traceparent', ARGV[4])
else
  id = redis.call('XADD', KEYS[2], '*', 'data', data)
end
return {id, seq}
