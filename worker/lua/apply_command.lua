#!lua
-- Apply one lifecycle command atomically: dedupe, seq rule, state machine, mutation,
-- XADD of the result, dedupe record, XACK of the command.
-- KEYS: 1-7 session keys (prelude), 8 record of a command naming no session, 9 results stream,
--       10 source stream.
-- ARGV: 1 op (spawn|pause|resume|terminate|reject), 2 source entry id, 3 group,
--       4 result JSON without its closing brace (fields every result shares),
--       5 seq ('' if none), 6 now ms, 7 now RFC 3339, 8 default session TTL ms,
--       9 dedupe TTL ms, 10 tombstone TTL ms, 11 traceparent ('' if none), 12 max checkpoints,
--       13 the command's dedupe field ('@' .. 8 bytes of SHA-1 of project/event_id), 14.. per op.
-- Returns {status, result stream id (a duplicate: its record, often empty) or next expected seq,
-- reason}: status is applied | rejected | duplicate | wait.
--
-- Dedupe records live with their session: field ARGV[13] of the session's meta hash (an empty
-- value, 11 bytes of listpack; no key and no TTL of its own). At terminate the meta hash
-- is folded into a compact tombstone: the state, last_seq and these records' digests packed
-- into one field (PACKED), nothing else.
-- A command for a session that does not exist (yet) leaves its record in a meta hash without
-- 'state' (records only: no session), kept for the dedupe window. A command the worker refused
-- before running this script (ARGV[13] is ''; op 'reject') has its record at KEYS[8], a key of
-- its own with the dedupe TTL: such commands are rare, and need not name a usable session.
-- Fewer calls is less Redis CPU: each redis.call costs ~0.5 µs beyond the command itself.
local K_DEDUPE, K_RESULTS, K_SOURCE = KEYS[8], KEYS[9], KEYS[10]
local op, entry_id, group, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Numbers go back to Redis as the strings they came in as: a Lua number passed to redis.call
-- or concatenated is formatted with printf (~0.3 µs each); arithmetic on a string converts it.
local seq_text = ARGV[5]
local seq = tonumber(seq_text)
local now, now_iso = ARGV[6], ARGV[7]
local default_ttl, dedupe_ttl, tombstone_ttl = ARGV[8], ARGV[9], ARGV[10]
local max_checkpoints = tonumber(ARGV[12])
local record = ARGV[13]
local traceparent = ARGV[11]
-- The field of a tombstone that packs its records: their 8-byte digests end to end (a hash
-- keeps a field of up to 64 bytes in its listpack, so a tombstone of up to 8 commands
-- is one small allocation: state, last_seq and this field).
local PACKED = '@'

local meta = redis.call('HMGET', K_META, 'state', 'last_seq', 'started_ms', 'started_at', 'ttl_ms',
  record, PACKED)
local state, last_seq = meta[1], tonumber(meta[2]) or 0

-- Whether the 8-byte digest d is one of those packed in blob (at a multiple of 8).
local function packed_in(blob, d)
  local from = 1
  while true do
    local at = string.find(blob, d, from, true)
    if not at then return false end
    if at % 8 == 1 then return true end
    from = at + 1
  end
end

-- A record in a meta hash is an empty value: its field is the whole record (the result's
-- event_id already follows from the command's); a tombstone packs its records' digests into
-- one field; a record key holds the result's stream id.
local previous
if record == '' then
  previous = redis.call('GET', K_DEDUPE)
else
  previous = meta[6]
  if not previous and meta[7] and packed_in(meta[7], string.sub(record, 2)) then previous = '' end
end
if previous then
  redis.call('XACK', K_SOURCE, group, entry_id)
  return {'duplicate', previous}
end

-- Fields of the meta hash to write with the command's record, in one HSET at the end.
local updates = {}
local function update(field, value)
  updates[#updates + 1] = field
  updates[#updates + 1] = value
end

local function finish(status, body)
  local id
  if traceparent ~= '' then
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}', 'traceparent', traceparent)
  else
    id = redis.call('XADD', K_RESULTS, '*', 'data', prefix .. body .. '}')
  end
  if record == '' then
    redis.call('SET', K_DEDUPE, id, 'PX', dedupe_ttl)
  elseif op ~= 'terminate' or status ~= 'applied' then  -- terminate packs its own record
    update(record, '')
  end
  if #updates > 0 then
    redis.call('HSET', K_META, unpack(updates))
    if not state then
      -- No session: the hash holds records only (no 'state'); keep it the dedupe window.
      if redis.call('PTTL', K_META) < tonumber(dedupe_ttl) then
        redis.call('PEXPIRE', K_META, dedupe_ttl)
      end
    end
  end
  redis.call('XACK', K_SOURCE, group, entry_id)
  return {status, id}
end

-- Keys only an agent's WorkingMemory makes (per-variable expiries, task state, scratchpad).
-- Many sessions have none of them: one EXISTS then spares a call per key (each redis.call
-- costs ~0.5 µs beyond the command itself).
local OTHER_KEYS = {K_VEXP, K_TASK, K_SCRATCH}
local function bare_now()
  return redis.call('EXISTS', K_VEXP, K_TASK, K_SCRATCH) == 0
end

-- Idle expiry of a live session (see touch in the prelude; state and ttl are known here), of
-- meta, vars and the checkpoint keys; of OTHER_KEYS unless bare (known not to exist); of the
-- checkpoint zset unless new_cps (the caller just made it: it has no expiry to drop).
local function touch_live(bare, new_cps)
  local cmd, ttl = 'PEXPIRE', meta[5] or default_ttl
  if state == 'paused' then cmd = 'PERSIST' end
  local function apply(k)
    if cmd == 'PERSIST' then redis.call(cmd, k) else redis.call(cmd, k, ttl) end
  end
  apply(K_META)
  apply(K_VARS)
  if not new_cps then apply(K_CPS) end
  apply(K_CPDATA)
  if not bare then
    for _, k in ipairs(OTHER_KEYS) do apply(k) end
  end
end

local function advance_seq()
  if seq and state then update('last_seq', seq_text) end
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
  -- A new session: only an agent's WorkingMemory may have written keys before it (seldom).
  local others = redis.call('EXISTS', K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA) > 0
  if others then purge_expired(now) end
  if n > 0 then
    if 2 * n <= CHUNK then  -- straight from ARGV: no table to build (and collect) per spawn
      redis.call('HSET', K_VARS, unpack(ARGV, 18, 17 + 2 * n))
    else
      local pairs_ = {}
      for i = 18, 17 + 2 * n do pairs_[#pairs_ + 1] = ARGV[i] end
      chunked('HSET', K_VARS, pairs_)
    end
    if others then
      local names = {}
      for i = 18, 17 + 2 * n, 2 do names[#names + 1] = ARGV[i] end
      chunked('ZREM', K_VEXP, names)
    end
  end
  update('state', 'active')
  update('agent_instance_id', agent_instance_id)
  update('started_ms', now)
  update('started_at', now_iso)
  update('updated_at', now_iso)
  update('ttl_ms', ttl_ms)
  if agent_type_id ~= '' then update('agent_type_id', agent_type_id) end
  if seq then update('last_seq', seq_text) end
  state, meta[5] = 'active', ttl_ms
  local out = finish('applied', ',"type":"agent.spawned","initial_items":' .. ARGV[17])
  redis.call('PEXPIRE', K_META, ttl_ms)
  if n > 0 then redis.call('PEXPIRE', K_VARS, ttl_ms) end
  if others then
    for _, k in ipairs({K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA}) do redis.call('PEXPIRE', k, ttl_ms) end
  end
  return out
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
  -- A session without checkpoints (the usual first pause) has no id to collide with.
  local n_checkpoints = redis.call('ZCARD', K_CPS)
  if n_checkpoints > 0 and checkpoint_exists(checkpoint_id) then
    advance_seq()
    return reject('already_exists', 'checkpoint ' .. checkpoint_id
      .. ' already exists in this session; use another checkpoint_id or omit it')
  end
  if n_checkpoints >= max_checkpoints then
    advance_seq()
    return reject('limit_exceeded', 'session already has ' .. max_checkpoints
      .. ' checkpoints (MEMWORKER_MAX_CHECKPOINTS_PER_SESSION); delete one first')
  end
  local bare = bare_now()
  local items = checkpoint_create(checkpoint_id, description, now, now_iso, bare, true)
  update('state', 'paused')
  update('updated_at', now_iso)
  advance_seq()
  state = 'paused'
  touch_live(bare, n_checkpoints == 0)
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
  local items, bare = checkpoint_restore(checkpoint_id, clear, now, bare_now())
  update('state', 'active')
  update('updated_at', now_iso)
  advance_seq()
  state = 'active'
  touch_live(bare)
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
  local bare = bare_now()
  if not bare then purge_expired(now) end
  local items
  if consolidate then
    local snapshot
    snapshot, items = snapshot_json(bare)
    body = body .. ',"consolidate":true,"snapshot":' .. snapshot
  else
    body = body .. ',"consolidate":false'
  end
  -- Fold the meta hash into the compact tombstone: state, last_seq and the records, packed.
  local flat = redis.call('HGETALL', K_META)
  local digests = {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    if name == PACKED then
      digests[#digests + 1] = flat[i + 1]
    elseif string.byte(name, 1) == 64 then  -- '@': one record
      digests[#digests + 1] = string.sub(name, 2)
    end
  end
  digests[#digests + 1] = string.sub(record, 2)
  local cleared = 0
  if cleanup then  -- the working memory, checkpoints and the meta hash in one DEL
    cleared = items or count_items()
    redis.call('DEL', K_META, unpack(DATA_KEYS))
  else
    for _, k in ipairs(DATA_KEYS) do redis.call('PEXPIRE', k, tombstone_ttl) end
    redis.call('DEL', K_META)
  end
  body = body .. ',"items_cleared":' .. cleared .. extra
  update('state', 'terminated')
  update(PACKED, table.concat(digests))
  if seq then update('last_seq', seq_text) elseif meta[2] then update('last_seq', meta[2]) end
  state = 'terminated'
  local out = finish('applied', body)
  redis.call('PEXPIRE', K_META, tombstone_ttl)
  return out
end

return redis.error_reply('memworker: unknown op ' .. tostring(op))
