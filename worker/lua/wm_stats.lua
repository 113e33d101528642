-- WorkingMemory.get_stats. ARGV: session ttl ms.
-- Returns {state or '', keys, scratchpad entries, checkpoints, has task, bytes, ttl ms (-1: none)}.
purge_expired(now_ms())
touch(ARGV[1])
local bytes = 0
local ttl = -1
for _, key in ipairs(session_keys()) do
  local used = redis.call('MEMORY', 'USAGE', key)
  if used then bytes = bytes + used end
  local left = redis.call('PTTL', key)
  if left > ttl then ttl = left end
end
return {
  session_state() or '',
  redis.call('HLEN', K_VARS),
  redis.call('LLEN', K_SCRATCH),
  redis.call('ZCARD', K_CPS),
  redis.call('EXISTS', K_TASK),
  bytes,
  ttl,
}
