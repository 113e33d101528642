-- Publish one command with the session's next seq, atomically: the seq is taken only if the
-- command is written, so a failed publish can never leave a gap that stalls the session.
-- KEYS: 1 the session's seq counter, 2 the lifecycle stream.
-- ARGV: 1 the command's JSON without seq (an object), 2 unused (was: '1' for a spawn, which
--       restarted the counter at 1; a spawn of a live session then left the counter behind
--       the session's seq), 3 counter TTL ms, 4 traceparent ('' if none).
-- Every command takes the next number, a spawn too: a spawn of a session that does not exist
-- starts it at its seq (whatever it is), and one of a live session is rejected already_exists
-- at the seq it took, so the counter and the session's seq never part.
-- Returns {stream entry id, seq}.
local seq = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local data = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
local id
if ARGV[4] ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'data', data, 'traceparent', ARGV[4])
else
  id = redis.call('XADD', KEYS[2], '*', 'data', data)
end
return {id, seq}
