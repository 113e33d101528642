-- Apply one lifecycle command atomically: dedupe, seq rule, state machine, mutation,
-- XADD of the result, dedupe record, XACK of the command.
-- KEYS: 1-7 session keys (prelude), 8 dedupe record, 9 results stream, 10 source stream.
-- ARGV: 1 op (spawn|pause|resume|terminate|reject), 2 source entry id, 3 group,
--       4 result JSON without its closing brace (fields every result shares),
--       5 seq ('' if none), 6 now ms, 7 now RFC 3339, 8 default session TTL ms,
--       9 dedupe TTL ms, 10 tombstone TTL ms, 11 traceparent ('' if none), 12 max checkpoints,
--       13.. per op.
-- Returns {status, result id or next expected seq, reason}: status is applied | rejected |
-- duplicate | wait.
local K_DEDUPE, K_RESULTS, K_SOURCE = KEYS[8], KEYS[9], KEYS[10]
local op, entry_id, group, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local seq = tonumber(ARGV[5])
local now, now_iso = tonumber(ARGV[6]), ARGV[7]
local default_ttl, dedupe_ttl, tombstone_ttl = ARGV[8], ARGV[9], ARGV[10]
local max_checkpoints = tonumber(ARGV[12])

local previous = redis.call('GET', K_DEDUPE)
if previous then
  redis.call('XACK', K_SOURCE, group, entry_id)
  return {'duplicate', previous}
end

local meta = redis.call('HMGET', K_META, 'state', 'last_seq', 'started_ms', 'started_at')
local state, last_seq = meta[1], tonumber(meta[2]) or 0

local traceparent = ARGV[11]

local function finish(status, body)
  local id
  if traceparent ~= '' then
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}', 'traceparent', traceparent)
  else
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}')
  end
  redis.call('SET', K_DEDUPE, id, 'PX', dedupe_ttl)
  redis.call('XACK', K_SOURCE, group, entry_id)
  return {status, id}
end

local function advance_seq()
  if seq and state then redis.call('HSET', K_META, 'last_seq', seq) end
end

local function reject(reason, detail)
  local out = finish('rejected', ',"type":"command.rejected","reason":' .. cjson.encode(reason)
    .. ',"detail":' .. cjson.encode(detail))
  out[3] = reason
  return out
end

-- Ordering: with seq, apply only the next expected one; wait for a gap to fill.
if seq then
  if seq <= last_seq then
    return reject('stale_seq', 'seq ' .. seq .. ' was already applied to this session (last applied seq is '
      .. last_seq .. '); publish the command with seq ' .. (last_seq + 1) .. ' or omit seq')
  end
  if seq > last_seq + 1 then
    return {'wait', tostring(last_seq + 1)}
  end
end

if op == 'reject' then
  advance_seq()
  return reject(ARGV[13], ARGV[14])
end

if op == 'spawn' then
  if state == 'terminated' then
    advance_seq()
    return reject('already_terminated', 'session was terminated; spawn a new session_id')
  elseif state then
    advance_seq()
    return reject('already_exists', 'session already exists and is ' .. state
      .. '; spawn a new session_id, or resume/terminate this one')
  end
  local agent_instance_id, agent_type_id, ttl_ms = ARGV[13], ARGV[14], ARGV[15]
  local n = tonumber(ARGV[16])
  purge_expired(now)
  if n > 0 then
    local pairs_ = {}
    for i = 17, 16 + 2 * n do pairs_[#pairs_ + 1] = ARGV[i] end
    chunked('HSET', K_VARS, pairs_)
    local names = {}
    for i = 17, 16 + 2 * n, 2 do names[#names + 1] = ARGV[i] end
    chunked('ZREM', K_VEXP, names)
  end
  local fields = {'state', 'active', 'agent_instance_id', agent_instance_id,
    'started_ms', now, 'started_at', now_iso, 'updated_at', now_iso, 'ttl_ms', ttl_ms}
  if agent_type_id ~= '' then
    fields[#fields + 1] = 'agent_type_id'
    fields[#fields + 1] = agent_type_id
  end
  if seq then
    fields[#fields + 1] = 'last_seq'
    fields[#fields + 1] = seq
  end
  redis.call('HSET', K_META, unpack(fields))
  touch(default_ttl)
  return finish('applied', ',"type":"agent.spawned","initial_items":' .. n)
end

if not state then
  return reject('unknown_session', 'no session with this project_id and session_id exists '
    .. '(never spawned, or expired after its idle TTL); spawn it first')
end
if state == 'terminated' then
  advance_seq()
  return reject('already_terminated', 'session was terminated; ' .. op .. ' cannot apply to it')
end

if op == 'pause' then
  if state ~= 'active' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; pause applies only to an active session')
  end
  local checkpoint_id, description = ARGV[13], ARGV[14]
  if checkpoint_exists(checkpoint_id) then
    advance_seq()
    return reject('already_exists', 'checkpoint ' .. checkpoint_id
      .. ' already exists in this session; use another checkpoint_id or omit it')
  end
  if redis.call('ZCARD', K_CPS) >= max_checkpoints then
    advance_seq()
    return reject('limit_exceeded', 'session already has ' .. max_checkpoints
      .. ' checkpoints (MEMWORKER_MAX_CHECKPOINTS_PER_SESSION); delete one first')
  end
  local items = checkpoint_create(checkpoint_id, description, now, now_iso)
  redis.call('HSET', K_META, 'state', 'paused', 'updated_at', now_iso, 'paused_checkpoint', checkpoint_id)
  advance_seq()
  touch(default_ttl)
  return finish('applied', ',"type":"agent.paused","checkpoint_id":' .. cjson.encode(checkpoint_id)
    .. ',"items_saved":' .. items)
end

if op == 'resume' then
  if state ~= 'paused' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; resume applies only to a paused session')
  end
  local checkpoint_id, clear = ARGV[13], ARGV[14] == '1'
  if checkpoint_id == '' then
    local newest = redis.call('ZREVRANGE', K_CPS, 0, 0)
    if #newest == 0 then
      advance_seq()
      return reject('checkpoint_not_found', 'session has no checkpoint to resume from; pause it first')
    end
    checkpoint_id = newest[1]
  elseif not checkpoint_exists(checkpoint_id) then
    advance_seq()
    return reject('checkpoint_not_found', 'checkpoint ' .. checkpoint_id
      .. ' does not exist in this session; omit checkpoint_id to resume from the newest')
  end
  local items = checkpoint_restore(checkpoint_id, clear, now)
  redis.call('HSET', K_META, 'state', 'active', 'updated_at', now_iso)
  redis.call('HDEL', K_META, 'paused_checkpoint')
  advance_seq()
  touch(default_ttl)
  return finish('applied', ',"type":"agent.resumed","checkpoint_id":' .. cjson.encode(checkpoint_id)
    .. ',"items_restored":' .. items)
end

if op == 'terminate' then
  local outcome, consolidate, cleanup, extra = ARGV[13], ARGV[14] == '1', ARGV[15] == '1', ARGV[16]
  purge_expired(now)
  local body = ',"type":"agent.terminated","outcome":' .. cjson.encode(outcome)
  local started_ms = tonumber(meta[3])
  if meta[4] then
    body = body .. ',"started_at":' .. cjson.encode(meta[4])
  else
    body = body .. ',"started_at":null'
  end
  if started_ms then
    body = body .. ',"duration_seconds":' .. string.format('%.3f', (now - started_ms) / 1000)
  else
    body = body .. ',"duration_seconds":null'
  end
  if consolidate then
    body = body .. ',"consolidate":true,"snapshot":' .. snapshot_json()
  else
    body = body .. ',"consolidate":false'
  end
  local cleared = 0
  if cleanup then
    cleared = clear_data()
  else
    for _, k in ipairs(DATA_KEYS) do redis.call('PEXPIRE', k, tombstone_ttl) end
  end
  body = body .. ',"items_cleared":' .. cleared .. extra
  redis.call('HSET', K_META, 'state', 'terminated', 'updated_at', now_iso, 'terminated_at', now_iso)
  advance_seq()
  redis.call('PEXPIRE', K_META, tombstone_ttl)
  return finish('applied', body)
end

return redis.error_reply('memworker: unknown op ' .. tostring(op))
