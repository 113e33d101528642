-- Apply one lifecycle command atomically: dedupe, seq rule, state machine, mutation,
-- XADD of the result, dedupe record, XACK of the command.
-- KEYS: 1-7 session keys (prelude), 8 stray dedupe record, 9 results stream, 10 source stream.
-- ARGV: 1 op (spawn|pause|resume|terminate|reject), 2 source entry id, 3 group,
--       4 result JSON without its closing brace (fields every result shares),
--       5 seq ('' if none), 6 now ms, 7 now RFC 3339, 8 default session TTL ms,
--       9 dedupe TTL ms, 10 tombstone TTL ms, 11 traceparent ('' if none), 12 max checkpoints,
--       13 the command's dedupe field ('@' .. 8 bytes of SHA-1 of project/event_id), 14.. per op.
-- Returns {status, result id or next expected seq, reason}: status is applied | rejected |
-- duplicate | wait.
--
-- Dedupe records live with their session: field ARGV[13] of the session's meta hash holds the
-- result id (small, listpack-encoded; no key and no TTL of its own). At terminate the meta hash
-- is folded into a compact tombstone: the state and these records, nothing else.
-- A command whose session does not exist leaves a stray record at KEYS[8] (its own key, dedupe
-- TTL), which is checked whenever the session holds no record for the command.
local K_DEDUPE, K_RESULTS, K_SOURCE = KEYS[8], KEYS[9], KEYS[10]
local op, entry_id, group, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local seq = tonumber(ARGV[5])
local now, now_iso = tonumber(ARGV[6]), ARGV[7]
local default_ttl, dedupe_ttl, tombstone_ttl = ARGV[8], ARGV[9], ARGV[10]
local max_checkpoints = tonumber(ARGV[12])
local record = ARGV[13]
local traceparent = ARGV[11]
-- Fields only a live session needs; the tombstone drops them.
local LIVE_FIELDS = {'agent_instance_id', 'agent_type_id', 'started_ms', 'started_at', 'updated_at',
  'ttl_ms', 'last_seq', 'paused_checkpoint'}

local meta = redis.call('HMGET', K_META, 'state', 'last_seq', 'started_ms', 'started_at', 'ttl_ms', record)
local state, last_seq = meta[1], tonumber(meta[2]) or 0

-- A record holds its result's stream id 'ms-n' as the digits ms .. n (3 digits, n < 1000),
-- which a listpack keeps as one 64-bit integer; a larger n is kept as the id itself.
local previous = meta[6]
if not previous then previous = redis.call('GET', K_DEDUPE) end
if previous then
  redis.call('XACK', K_SOURCE, group, entry_id)
  if not string.find(previous, '-', 1, true) then
    previous = string.sub(previous, 1, -4) .. '-' .. tonumber(string.sub(previous, -3))
  end
  return {'duplicate', previous}
end

local function finish(status, body)
  local id
  if traceparent ~= '' then
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}', 'traceparent', traceparent)
  else
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}')
  end
  local stored = id
  local dash = string.find(id, '-', 1, true)
  local n = tonumber(string.sub(id, dash + 1))
  if n < 1000 then stored = string.sub(id, 1, dash - 1) .. string.format('%03d', n) end
  if state then
    redis.call('HSET', K_META, record, stored)
  else
    redis.call('SET', K_DEDUPE, stored, 'PX', dedupe_ttl)
  end
  redis.call('XACK', K_SOURCE, group, entry_id)
  return {status, id}
end

-- Idle expiry of a live session (see touch in the prelude; state and ttl are known here).
local function touch_live()
  if state == 'paused' then
    for _, k in ipairs(SESSION_KEYS) do redis.call('PERSIST', k) end
    return
  end
  local ttl = tonumber(meta[5]) or tonumber(default_ttl)
  for _, k in ipairs(SESSION_KEYS) do redis.call('PEXPIRE', k, ttl) end
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

-- A terminated session answers every command, whatever its seq, with already_terminated.
if state == 'terminated' and op ~= 'reject' then
  if op == 'spawn' then
    return reject('already_terminated', 'session was terminated; spawn a new session_id')
  end
  return reject('already_terminated', 'session was terminated; ' .. op .. ' cannot apply to it')
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
  return reject(ARGV[14], ARGV[15])
end

if op == 'spawn' then
  if state then
    advance_seq()
    return reject('already_exists', 'session already exists and is ' .. state
      .. '; spawn a new session_id, or resume/terminate this one')
  end
  local agent_instance_id, agent_type_id, ttl_ms = ARGV[14], ARGV[15], ARGV[16]
  local n = tonumber(ARGV[17])
  purge_expired(now)
  if n > 0 then
    local pairs_ = {}
    for i = 18, 17 + 2 * n do pairs_[#pairs_ + 1] = ARGV[i] end
    chunked('HSET', K_VARS, pairs_)
    local names = {}
    for i = 18, 17 + 2 * n, 2 do names[#names + 1] = ARGV[i] end
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
  state, meta[5] = 'active', ttl_ms
  touch_live()
  return finish('applied', ',"type":"agent.spawned","initial_items":' .. n)
end

if not state then
  return reject('unknown_session', 'no session with this project_id and session_id exists '
    .. '(never spawned, or expired after its idle TTL); spawn it first')
end

if op == 'pause' then
  if state ~= 'active' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; pause applies only to an active session')
  end
  local checkpoint_id, description = ARGV[14], ARGV[15]
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
  local fields = {'state', 'paused', 'updated_at', now_iso, 'paused_checkpoint', checkpoint_id}
  if seq then
    fields[#fields + 1] = 'last_seq'
    fields[#fields + 1] = seq
  end
  redis.call('HSET', K_META, unpack(fields))
  state = 'paused'
  touch_live()
  return finish('applied', ',"type":"agent.paused","checkpoint_id":' .. cjson.encode(checkpoint_id)
    .. ',"items_saved":' .. items)
end

if op == 'resume' then
  if state ~= 'paused' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; resume applies only to a paused session')
  end
  local checkpoint_id, clear = ARGV[14], ARGV[15] == '1'
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
  local fields = {'state', 'active', 'updated_at', now_iso}
  if seq then
    fields[#fields + 1] = 'last_seq'
    fields[#fields + 1] = seq
  end
  redis.call('HSET', K_META, unpack(fields))
  redis.call('HDEL', K_META, 'paused_checkpoint')
  state = 'active'
  touch_live()
  return finish('applied', ',"type":"agent.resumed","checkpoint_id":' .. cjson.encode(checkpoint_id)
    .. ',"items_restored":' .. items)
end

if op == 'terminate' then
  local outcome, consolidate, cleanup, extra = ARGV[14], ARGV[15] == '1', ARGV[16] == '1', ARGV[17]
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
  purge_expired(now)
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
  -- Fold the meta hash into the compact tombstone: the state and the records, nothing else
  -- (when it ended is the time of its last record).
  redis.call('HDEL', K_META, unpack(LIVE_FIELDS))
  redis.call('HSET', K_META, 'state', 'terminated')
  state = 'terminated'
  redis.call('PEXPIRE', K_META, tombstone_ttl)
  return finish('applied', body)
end

return redis.error_reply('memworker: unknown op ' .. tostring(op))
