#!lua
-- WorkingMemory.set. ARGV: session ttl ms, name, value JSON, key ttl ms (0: none), max keys,
-- max session bytes.
-- Refused: past the key limit (a new name), past the session's byte limit (a write that
-- grows it), and when Redis is nearly full (the admission key is set) for a write that grows
-- the session. The byte count is kept in the checkpoint hash (vars_bytes): per call one HGET, one
-- HSTRLEN and one HSET of a small field more than before, and one GET of the admission key.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local now = now_ms()
purge_expired(now)
local name = ARGV[2]
local value = ARGV[3]
local max_keys = tonumber(ARGV[5])
local old = redis.call('HSTRLEN', K_VARS, name)  -- 0: no such variable (a JSON value is never '')
if old == 0 and redis.call('HLEN', K_VARS) >= max_keys then
  return redis.error_reply('WM_LIMIT_KEYS ' .. max_keys)
end
local used = vars_bytes()
local after = used + #value - old
if old == 0 then after = after + #name end
if after > used then
  local max_bytes = tonumber(ARGV[6])
  if after > max_bytes then
    return redis.error_reply('WM_LIMIT_BYTES ' .. max_bytes .. ' ' .. used .. ' ' .. after)
  end
  local full = admission_refused()
  if full then return redis.error_reply(full) end
end
redis.call('HSET', K_VARS, name, value)
redis.call('HSET', K_CPDATA, VBYTES, after)
local key_ttl = tonumber(ARGV[4])
if key_ttl > 0 then
  redis.call('ZADD', K_VEXP, now + key_ttl, name)
else
  redis.call('ZREM', K_VEXP, name)
end
touch(ARGV[1])
return 1
