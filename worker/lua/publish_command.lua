-- Publish one command, atomically with its seq: the seq is taken only if the command is
-- written, so a failed publish can never leave a gap that stalls the session.
-- KEYS: 1 the session's seq counter, 2 the lifecycle stream, 3 the shard's admission key
--       (present while the worker keeps Redis's last memory for commands already accepted).
-- ARGV: 1 the command's JSON (an object; without seq unless ARGV[2] is '-'), 2 '1' for a spawn
--       (the counter restarts: a session id spawned again after its tombstone expired starts
--       at seq 1), '0' for the session's next seq, '-' to publish ARGV[1] as it is (no seq
--       assigned), 3 counter TTL ms, 4 traceparent ('' if none).
-- Returns {stream entry id, seq (0 with '-')}.
local refusal = redis.call('GET', KEYS[3])
if refusal then return redis.error_reply('NEARLYFULL ' .. refusal) end
local seq, data = 0, ARGV[1]
if ARGV[2] == '1' then
  seq = 1
  redis.call('SET', KEYS[1], 1, 'PX', ARGV[3])
elseif ARGV[2] == '0' then
  seq = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if ARGV[2] ~= '-' then data = string.sub(data, 1, -2) .. ',"seq":' .. seq .. '}' end
local id
if ARGV[4] ~= '' then
  id = redis.call('XADD', KEYS[2], '*', 'data', data, 'traceparent', ARGV[4])
else
  id = redis.call('XADD', KEYS[2], '*', 'data', data)
end
return {id, seq}
