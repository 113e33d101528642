-- Apply a batch of lifecycle commands, each atomically: dedupe, seq rule, state machine,
-- mutation, XADD of the result, dedupe record; then one XACK of every command it answered.
--
-- A Redis function (FUNCTION LOAD once, FCALL per batch of up to COMMANDS_PER_CALL commands,
-- worker/lifecycle/apply.py; worker/scripts.py builds the library: a `#!lua name=…` line, the
-- _session.lua prelude, then this file, whose last line gets the function's name). Everything
-- below is defined once when the library loads; a call only binds its keys and arguments to
-- the upvalues below and runs. An EVAL script instead re-creates every function (closure) and
-- table it defines on every call. One call at a time runs in Redis, so these upvalues never
-- hold two calls' values at once; each command sets every one of them before reading it.
-- A batch in one call, not a call per command: calling a function at all, its context and its
-- two streams as arguments, and an XACK per command cost ~15k instructions a command
-- (BENCHMARKS.md); commands are still applied one by one, in order, each as it would be alone.
--
-- KEYS: 1 results stream, 2 source stream, then per command in order: its session's meta key
--       (the session's other keys are derived from it: bind_session_of), and for op 'reject'
--       the record key of a command naming no session.
-- ARGV: 1 the batch's context (the worker's settings, now ms, now RFC 3339: see the apply
--       function), then per command: how many arguments follow for it, then op
--       (spawn|pause|resume|terminate|reject), source entry id, result JSON without its
--       closing brace (fields every result shares), seq ('' if none), traceparent ('' if
--       none), the command's dedupe field ('@' .. 8 bytes of SHA-1 of project/event_id), and
--       the op's own (args[o + 7] on: see each op).
-- Returns three strings per command, in order, in one flat array: status, result stream id (a
-- duplicate: its record, often empty) or next expected seq, reason ('' if none): status is
-- applied | rejected | duplicate | wait; or 'error', message, '' when the command raised an
-- error (it is not acknowledged).
--
-- Dedupe records live with their session, in its meta hash: a record is the 8-byte digest of
-- the command's dedupe field, packed end to end with the session's others into one field
-- (PACKED, up to 8 of them: a listpack keeps a value of up to 64 bytes); past 8, a record is
-- a field of its own (the dedupe field, empty value), as every record was in earlier versions
-- (a session they wrote to still has such fields; every version reads both forms). No key
-- and no TTL of its own. At terminate the meta hash is folded into a compact tombstone: the
-- state, last_seq, every record's digest packed into PACKED and the spawn's user_id (when it
-- named one), nothing else.
-- A command for a session that does not exist (yet) leaves its record in a meta hash without
-- 'state' (records only: no session), kept for the dedupe window. A command the worker refused
-- before running this function (its dedupe field is ''; op 'reject') has its record at a key of
-- its own with the dedupe TTL: such commands are rare, and need not name a usable session.
-- Fewer calls is less Redis CPU: each redis.call costs ~0.5 µs beyond the command itself.

-- The field of a meta hash that packs its records: their 8-byte digests end to end (a hash
-- keeps a field of up to 64 bytes in its listpack, so a tombstone of up to 8 commands
-- is one small allocation: state, last_seq and this field). Terminate reads it with the
-- session's other fields in one HMGET, not the whole hash: a field per record made terminate
-- read the hash with HGETALL (~40k instructions of its ~250k).
local PACKED = '@'
local PACKED_MAX = 64

-- The field of a meta hash listing the seqs of commands answered while the session did not
-- exist (rejected unknown_session, or refused before this function), or answered ahead of
-- their turn (rejected stale_session), ',2,5,': a spawn that comes later starts the session
-- below them, and its commands after them skip them rather than wait for seqs that were used
-- up (a rejection never strands a session's later commands). Written and read only on those rare paths (never by a command in order); kept to
-- the last ANSWERED_MAX bytes.
local ANSWERED = 'answered_seqs'
local ANSWERED_MAX = 256

-- This command's keys and arguments (bound by apply).
local K_DEDUPE, K_RESULTS, K_SOURCE
local args, o  -- the call's ARGV; o: this command's offset (args[o] is its argument count)
local op, entry_id, group, prefix
local settings  -- the worker's settings and the batch's clock (ARGV[1], split)
-- Numbers go back to Redis as the strings they came in as: a Lua number passed to redis.call
-- or concatenated is formatted with printf (~0.3 µs each); arithmetic on a string converts it.
local seq_text, seq, now, now_iso, default_ttl, dedupe_ttl, tombstone_ttl, spawn_wait
local record, traceparent
-- The life (16 hex digits of the SHA-1 of the spawn's event_id) this command is for ('' when
-- it does not say), its argument last; and where the session's own is in meta.
local life, life_at
-- The session as the call found it (and its state as the call changes it): meta holds state,
-- last_seq, ttl_ms, the command's record as a field of its own, PACKED, (terminate only)
-- started_ms, started_at and the other fields spawn writes (see terminate), life and user_id.
local meta, state
-- Fields of the meta hash to write with the command's record, in one HSET at the end:
-- updates[1..n_updates] (the table is reused across calls; entries past n_updates are stale).
local updates, n_updates = {}, 0

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

local function update(field, value)
  updates[n_updates + 1] = field
  updates[n_updates + 2] = value
  n_updates = n_updates + 2
end

-- The entries of the commands answered so far in this call: acknowledged together at its end
-- (one XACK; under memory pressure one XDEL too: see apply). acks[1..n_acks] (reused).
local acks, n_acks = {}, 0

-- The entries of commands rejected `forgotten` in this call: deleted at its end (reused).
local forgotten, n_forgotten = {}, 0

local function acknowledge()
  n_acks = n_acks + 1
  acks[n_acks] = entry_id
end

-- Publish the result: prefix .. body .. '}' (or data, the whole result, when given: one string
-- less to build), write the meta hash's updates and the record, and acknowledge the command.
local function finish(status, body, data)
  local id
  data = data or (prefix .. body .. '}')
  if traceparent ~= '' then
    id = call('XADD', K_RESULTS, '*', 'data', data, 'traceparent', traceparent)
  else
    id = call('XADD', K_RESULTS, '*', 'data', data)
  end
  if record == '' then
    call('SET', K_DEDUPE, id, 'PX', dedupe_ttl)
  elseif op ~= 'terminate' or status ~= 'applied' then  -- terminate packs its own record
    local packed = meta[5]
    if not packed then
      update(PACKED, string.sub(record, 2))
    elseif #packed + 8 <= PACKED_MAX then
      update(PACKED, packed .. string.sub(record, 2))
    else
      update(record, '')  -- past 8 records: a field of its own
    end
  end
  if n_updates > 0 then
    call('HSET', K_META, unpack(updates, 1, n_updates))
    if not state then
      -- No session: the hash holds records only (no 'state'); keep it the dedupe window.
      if call('PTTL', K_META) < tonumber(dedupe_ttl) then
        call('PEXPIRE', K_META, dedupe_ttl)
      end
    end
  end
  acknowledge()
  return {status, id}
end

-- Keys only an agent's WorkingMemory makes (per-variable expiries, task state, scratchpad).
-- Many sessions have none of them: one EXISTS then spares a call per key (each redis.call
-- costs ~0.5 µs beyond the command itself).
local function bare_now()
  return call('EXISTS', K_VEXP, K_TASK, K_SCRATCH) == 0
end

-- PERSIST k (a paused session never expires), else PEXPIRE k ttl.
local function expire(k, ttl)
  if state == 'paused' then call('PERSIST', k) else call('PEXPIRE', k, ttl) end
end

-- Idle expiry of a live session (see touch in the prelude; state and ttl are known here), of
-- meta, vars and the checkpoint keys; of vexp, task and scratch unless bare (known not to
-- exist); of the checkpoint zset unless new_cps (the caller just made it: no expiry to drop).
local function touch_live(bare, new_cps)
  local ttl = meta[3] or default_ttl
  expire(K_META, ttl)
  expire(K_VARS, ttl)
  if not new_cps then expire(K_CPS, ttl) end
  expire(K_CPDATA, ttl)
  if not bare then
    expire(K_VEXP, ttl)
    expire(K_TASK, ttl)
    expire(K_SCRATCH, ttl)
  end
end

local function advance_seq()
  if seq and state then update('last_seq', seq_text) end
end

-- Note this command's seq as answered while its session does not exist (see ANSWERED).
local function note_answered()
  local seen = (call('HGET', K_META, ANSWERED) or ',') .. seq_text .. ','
  if #seen > ANSWERED_MAX then
    seen = ',' .. string.match(string.sub(seen, -ANSWERED_MAX), ',(.*)$')
  end
  update(ANSWERED, seen)
end

-- The session's last seq (last_seq, known to be below seq - 1) advanced over the seqs after
-- it that were answered before the session existed (see ANSWERED): the seq the session waits
-- for is the one after it.
local function answered_up_to(last_seq)
  local seen = call('HGET', K_META, ANSWERED)
  if not seen then return last_seq end
  while string.find(seen, ',' .. (last_seq + 1) .. ',', 1, true) do last_seq = last_seq + 1 end
  return last_seq
end

local function reject(reason, detail)
  if seq and not state then note_answered() end
  local out = finish('rejected', ',"type":"command.rejected","reason":' .. cjson.encode(reason)
    .. ',"detail":' .. cjson.encode(detail))
  out[3] = reason
  return out
end

-- What a rejection of a forgotten session's command keeps of the command: ids and times, so
-- no content of a session someone asked to forget is published again (no metadata, no
-- correlation_id, no state).
local FORGOTTEN_KEEPS = {'event_id', 'causation_id', 'command', 'project_id', 'session_id',
  'agent_instance_id', 'seq', 'occurred_at', 'duration_ms'}

local function reject_forgotten()
  local ok, body = pcall(cjson.decode, prefix .. '}')
  local result = {}
  if ok and type(body) == 'table' then
    for _, name in ipairs(FORGOTTEN_KEEPS) do
      if body[name] ~= nil and body[name] ~= cjson.null then result[name] = body[name] end
    end
  end
  result['type'] = 'command.rejected'
  result['reason'] = 'forgotten'
  result['detail'] = 'this session was forgotten (memworker forget); nothing was applied; '
    .. 'use another session_id'
  local out = finish('rejected', nil, cjson.encode(result))
  out[3] = 'forgotten'
  n_forgotten = n_forgotten + 1
  forgotten[n_forgotten] = entry_id
  return out
end

-- Whether this spawn names a user `memworker forget --user` forgot, and was published before
-- that forget's cutoff (in flight while it ran): the shard's hash of forgotten users, in the
-- meta key's slot (its name up to the shard's tag), field project@user (worker.erasure.erased).
local function spawn_user_forgotten()
  local user_id = args[o + tonumber(args[o]) - 1]
  if user_id == '' then return false end
  local head, project = string.match(K_META, '^(.*}):s:([^/]*)/')
  if not head then return false end
  local cutoff = call('HGET', head .. ':erased_users', project .. '@' .. user_id)
  return cutoff and tonumber(string.match(entry_id, '^%d+')) < tonumber(cutoff) or false
end

local function spawn()
  if state then
    advance_seq()
    return reject('already_exists', 'session already exists and is ' .. state
      .. '; spawn a new session_id, or resume/terminate this one')
  end
  local agent_instance_id, agent_type_id, ttl_ms = args[o + 7], args[o + 8], args[o + 9]
  local n = tonumber(args[o + 10])
  -- A new session: only an agent's WorkingMemory may have written keys before it (seldom).
  local others = call('EXISTS', K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA) > 0
  -- Keys an agent wrote before the spawn, or the initial state: counted afresh by a wm_set.
  if others or n > 0 then forget_vars_bytes() end
  if others then purge_expired(now) end
  if n > 0 then
    if 2 * n <= CHUNK then  -- straight from args: no table to build (and collect) per spawn
      call('HSET', K_VARS, unpack(args, o + 11, o + 10 + 2 * n))
    else
      local pairs_ = {}
      for i = o + 11, o + 10 + 2 * n do pairs_[#pairs_ + 1] = args[i] end
      chunked('HSET', K_VARS, pairs_)
    end
    if others then
      local names = {}
      for i = o + 11, o + 10 + 2 * n, 2 do names[#names + 1] = args[i] end
      chunked('ZREM', K_VEXP, names)
    end
  end
  update('state', 'active')
  update('agent_instance_id', agent_instance_id)
  update('started_ms', now)
  update('started_at', now_iso)
  update('updated_at', now_iso)
  update('ttl_ms', ttl_ms)
  update('life', life)
  if agent_type_id ~= '' then update('agent_type_id', agent_type_id) end
  -- The spawn's user_id (its next to last argument; '' when none): kept only when given, for
  -- the results of the session's later commands (see apply_one). The spawn's own result
  -- carries it already (its prefix).
  local user_id = args[o + tonumber(args[o]) - 1]
  if user_id ~= '' then update('user_id', user_id) end
  if seq then update('last_seq', seq_text) end
  state, meta[3] = 'active', ttl_ms
  local out = finish('applied', ',"type":"agent.spawned","initial_items":' .. args[o + 10])
  call('PEXPIRE', K_META, ttl_ms)
  if n > 0 then call('PEXPIRE', K_VARS, ttl_ms) end
  if others then
    for _, k in ipairs({K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA}) do call('PEXPIRE', k, ttl_ms) end
  end
  return out
end

local function pause()
  if state ~= 'active' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; pause applies only to an active session')
  end
  local checkpoint_id, description = args[o + 7], args[o + 8]
  -- A session without checkpoints (the usual first pause) has no id to collide with.
  local n_checkpoints = call('ZCARD', K_CPS)
  if n_checkpoints > 0 and checkpoint_exists(checkpoint_id) then
    advance_seq()
    return reject('already_exists', 'checkpoint ' .. checkpoint_id
      .. ' already exists in this session; use another checkpoint_id or omit it')
  end
  local max_checkpoints = tonumber(settings[5])
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

local function resume()
  if state ~= 'paused' then
    advance_seq()
    return reject('invalid_transition', 'session is ' .. state .. '; resume applies only to a paused session')
  end
  local checkpoint_id, clear = args[o + 7], args[o + 8] == '1'
  if checkpoint_id == '' then
    local newest = call('ZREVRANGE', K_CPS, 0, 0)
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

local function terminate()
  local outcome, consolidate, cleanup, extra = args[o + 7], args[o + 8] == '1', args[o + 9] == '1', args[o + 10]
  local started_at, duration = 'null', 'null'
  if meta[7] then started_at = cjson.encode(meta[7]) end
  local started_ms = tonumber(meta[6])
  if started_ms then duration = string.format('%.3f', (now - started_ms) / 1000) end
  local bare = bare_now()
  if not bare then purge_expired(now) end
  local items
  local snapshot = false
  if consolidate then snapshot, items = snapshot_json(bare) end
  -- Fold the meta hash into the compact tombstone: state, last_seq and the records, packed.
  -- The HMGET (apply_one) read every field this version writes; more fields in the hash are
  -- records of their own (past 8, or written by an earlier version): read the whole hash then.
  local digests = meta[5] or ''
  local known = 0
  for i = 1, 12 do
    if meta[i] then known = known + 1 end
  end
  if call('HLEN', K_META) > known then
    local flat = call('HGETALL', K_META)
    local parts = {digests}
    for i = 1, #flat, 2 do
      local name = flat[i]
      if name ~= PACKED and string.byte(name, 1) == 64 then  -- '@': one record
        parts[#parts + 1] = string.sub(name, 2)
      end
    end
    digests = table.concat(parts)
  end
  digests = digests .. string.sub(record, 2)
  local cleared = 0
  if cleanup then  -- the working memory, checkpoints and the meta hash in one DEL
    cleared = items or count_items()
    if bare then  -- vexp, task and scratch are known not to exist: no lookups for them
      call('DEL', K_META, K_VARS, K_CPS, K_CPDATA)
    else
      call('DEL', K_META, K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA)
    end
  else
    for _, k in ipairs({K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA}) do
      call('PEXPIRE', k, tombstone_ttl)
    end
    call('DEL', K_META)
  end
  -- The life that ends (meta[11]: 16 hex digits, no escaping; none for a session spawned
  -- before lives were named): the consolidator keys the session's episode by it.
  local ended = ''
  if meta[11] and meta[11] ~= '' then ended = ',"life":"' .. meta[11] .. '"' end
  -- The result in one concatenation (each intermediate string of ~1 KB is work for Lua's
  -- allocator and collector).
  local data
  if snapshot then
    data = prefix .. ',"type":"agent.terminated","outcome":' .. cjson.encode(outcome)
      .. ',"started_at":' .. started_at .. ',"duration_seconds":' .. duration .. ended
      .. ',"consolidate":true,"snapshot":' .. snapshot
      .. ',"items_cleared":' .. cleared .. extra .. '}'
  else
    data = prefix .. ',"type":"agent.terminated","outcome":' .. cjson.encode(outcome)
      .. ',"started_at":' .. started_at .. ',"duration_seconds":' .. duration .. ended
      .. ',"consolidate":false,"items_cleared":' .. cleared .. extra .. '}'
  end
  update('state', 'terminated')
  update(PACKED, digests)
  -- The spawn's user stays (only when it named one): a forget of the anonymous bucket tells
  -- another user's tombstone from one of no user's by it, and the session's later results
  -- still carry it.
  if meta[12] then update('user_id', meta[12]) end
  if seq then update('last_seq', seq_text) elseif meta[2] then update('last_seq', meta[2]) end
  state = 'terminated'
  local out = finish('applied', nil, data)
  call('PEXPIRE', K_META, tombstone_ttl)
  return out
end

-- Is a spawn of this session (K_META) in the stream and not yet applied: published before
-- this entry and still pending (in this or another consumer's hands), or published after it?
-- Only asked for a command with a seq ahead on a session that does not exist, once its spawn
-- wait is over (spawn_awaited): it waits for such a spawn, and is rejected unknown_session
-- when there is none. Looks at up to 100 earlier pending entries and the next 100 entries;
-- past either bound it waits (and asks again at its next retry), as every command ahead did
-- before this check.
local function spawn_of(fields, project_session, session)
  for i = 1, #fields - 1, 2 do
    local data = fields[i + 1]
    if fields[i] == 'data' and string.find(data, session, 1, true)
        and string.find(data, 'spawn', 1, true) then
      local ok, body = pcall(cjson.decode, data)
      if ok and type(body) == 'table' and body.type == 'spawn'
          and tostring(body.project_id) .. '/' .. tostring(body.session_id) == project_session
          and (life == '' or string.sub(redis.sha1hex(tostring(body.event_id)), 1, 16) == life) then
        return true
      end
    end
  end
  return false
end

local function spawn_in_flight()
  local at = string.find(K_META, '}:s:', 1, true)
  local project_session = string.sub(K_META, at + 4, -6)
  local session = string.match(project_session, '/(.*)$')
  local earlier = call('XPENDING', K_SOURCE, group, '-', '(' .. entry_id, 100)
  local later = call('XRANGE', K_SOURCE, '(' .. entry_id, '+', 'COUNT', 100)
  if #earlier == 100 or #later == 100 then return true end
  for _, row in ipairs(earlier) do
    local found = call('XRANGE', K_SOURCE, row[1], row[1])
    if found[1] and spawn_of(found[1][2], project_session, session) then return true end
  end
  for _, entry in ipairs(later) do
    if spawn_of(entry[2], project_session, session) then return true end
  end
  return false
end

-- Does this command (a pause, resume or terminate with a seq above 1, for a session that does
-- not exist) wait for a spawn? Within the spawn wait from its own publish (its entry id's
-- time), yes: the orchestrator may publish the spawn after it (out of order), and a pause
-- read before its spawn was published must not be rejected for it. After it, only while a
-- spawn is in the stream (spawn_in_flight). At once, not after the wait, when the command
-- just before it (seq - 1) was itself answered while the session did not exist (a rejected
-- spawn): its session is not coming from what was published.
local function spawn_awaited()
  local published = tonumber(string.match(entry_id, '^%d+'))
  if published and now - published < spawn_wait then
    local seen = call('HGET', K_META, ANSWERED)
    if not (seen and string.find(seen, ',' .. (seq - 1) .. ',', 1, true)) then return true end
  end
  return spawn_in_flight()
end

-- Apply the command at args[o..] to the session bound (bind_session_of); returns its reply.
local function apply_one()
  op, entry_id, prefix = args[o + 1], args[o + 2], args[o + 3]
  seq_text = args[o + 4]
  seq = tonumber(seq_text)
  traceparent = args[o + 5]
  record = args[o + 6]
  n_updates = 0

  life = args[o + tonumber(args[o])]
  if op == 'terminate' then
    -- Also every other field spawn writes (terminate counts them: see there).
    meta = call('HMGET', K_META, 'state', 'last_seq', 'ttl_ms', record, PACKED, 'started_ms',
      'started_at', 'agent_instance_id', 'agent_type_id', 'updated_at', 'life', 'user_id')
    life_at = 11
  else
    meta = call('HMGET', K_META, 'state', 'last_seq', 'ttl_ms', record, PACKED, 'life', 'user_id')
    life_at = 6
  end
  state = meta[1]

  -- A record in a meta hash is its digest in PACKED, or (past 8) a field of its own with an
  -- empty value (the result's event_id already follows from the command's); a record key
  -- holds the result's stream id.
  local previous
  if record == '' then
    previous = call('GET', K_DEDUPE)
  else
    previous = meta[4]
    if not previous and meta[5] and packed_in(meta[5], string.sub(record, 2)) then previous = '' end
  end
  if previous then
    -- A retried publish took a seq of its own (LifecycleClient's counter): the session's
    -- next seq is that one once its turn comes, or its later commands would wait for it.
    if seq and state and state ~= 'terminated' and state ~= 'forgotten' then
      local last_seq = tonumber(meta[2]) or 0
      if seq > last_seq + 1 then last_seq = answered_up_to(last_seq) end
      if seq > last_seq + 1 then return {'wait', tostring(last_seq + 1)} end
      if seq == last_seq + 1 then call('HSET', K_META, 'last_seq', seq_text) end
    end
    acknowledge()
    return {'duplicate', previous}
  end

  -- The session's user (its spawn named one; right after life in meta) is on every result
  -- of the session: the spawn's from its own prefix, the others' from here. An id: no escaping.
  -- A spawn refused before this function names its own (its next to last argument, as a
  -- spawn's; '' when it named no usable one), unless a forget took that user after it was
  -- published (as spawn_user_forgotten answers an applied spawn's).
  local user_id = meta[life_at + 1]
  if op == 'reject' and args[o + tonumber(args[o]) - 1] ~= '' then
    user_id = not spawn_user_forgotten() and args[o + tonumber(args[o]) - 1] or nil
  end
  if user_id and op ~= 'spawn' then prefix = prefix .. ',"user_id":"' .. user_id .. '"' end
  -- A terminate that names no agent type reports the one its spawn named (an id: no escaping;
  -- the prefix's first "agent_type_id" is the command's own, before any metadata).
  if op == 'terminate' and meta[9] and meta[9] ~= '' then
    prefix = string.gsub(prefix, '"agent_type_id":null', '"agent_type_id":"' .. meta[9] .. '"', 1)
  end

  -- A forgotten session (memworker forget marked it) answers every command, whatever its
  -- seq, with forgotten: ids only.
  if state == 'forgotten' and op ~= 'reject' then return reject_forgotten() end
  -- So does a spawn naming a forgotten user, published before the forget's cutoff.
  if op == 'spawn' and spawn_user_forgotten() then return reject_forgotten() end

  -- A terminated session answers every command, whatever its seq, with already_terminated.
  if state == 'terminated' and op ~= 'reject' then
    if op == 'spawn' then
      return reject('already_terminated', 'session was terminated; spawn a new session_id')
    end
    return reject('already_terminated', 'session was terminated; ' .. op .. ' cannot apply to it')
  end

  -- A command for an earlier life of a reused session id (retried, replayed, or published
  -- before the id was spawned again) never touches the new one.
  if life ~= '' and state and op ~= 'spawn' and meta[life_at] and meta[life_at] ~= life then
    -- Its seq is used up all the same (one counter across a session id's lives): at the next
    -- expected one it advances it, ahead of it it is skipped (see ANSWERED).
    if seq then
      local last_seq = tonumber(meta[2]) or 0
      if seq == last_seq + 1 then advance_seq() elseif seq > last_seq + 1 then note_answered() end
    end
    return reject('stale_session', 'this command is for an earlier life of the session id (its '
      .. 'spawn_event_id names another spawn than the one that started the session now); '
      .. 'nothing was applied')
  end

  -- Ordering: with seq, apply only the next expected one; wait for a gap to fill.
  if seq and state then
    local last_seq = tonumber(meta[2]) or 0
    if seq <= last_seq then
      return reject('stale_seq', 'seq ' .. seq .. ' was already applied to this session (last applied seq is '
        .. last_seq .. '); publish the command with seq ' .. (last_seq + 1) .. ' or omit seq')
    end
    if seq > last_seq + 1 then
      -- Seqs used up before the session existed (see ANSWERED) are not waited for.
      last_seq = answered_up_to(last_seq)
      if seq > last_seq + 1 then return {'wait', tostring(last_seq + 1)} end
    end
  elseif seq and seq > 1 and op ~= 'spawn' and op ~= 'reject' and spawn_awaited() then
    -- No session yet, but its spawn may still be published (within the spawn wait), or is in
    -- the stream, still to be applied: wait for it. With neither, the seq it waits for can
    -- never come from what was published: it is answered unknown_session below, within the
    -- spawn wait, not dead-lettered seq_gap after the gap timeout. A spawn (or a command
    -- refused before this function) of a session that does not exist is answered whatever
    -- its seq: a spawn starts the session at it (LifecycleClient's counter goes on across a
    -- session id's lives while it is kept: a spawn may be its 5th).
    return {'wait', '1'}
  end

  if op == 'reject' then  -- its own: reason, detail, a refused spawn's user_id, life
    advance_seq()
    return reject(args[o + 7], args[o + 8])
  end
  if op == 'spawn' then return spawn() end
  if not state then
    return reject('unknown_session', 'no session with this project_id and session_id exists '
      .. '(never spawned, its spawn was rejected, or it expired after its idle TTL) and no '
      .. 'spawn of it was published within MEMWORKER_SPAWN_WAIT_SECONDS of this command or '
      .. 'waits to be applied; spawn it first')
  end
  if op == 'pause' then return pause() end
  if op == 'resume' then return resume() end
  if op == 'terminate' then return terminate() end
  error('memworker: unknown op ' .. tostring(op))
end

local function apply(keys, argv)
  bind_globals()
  K_RESULTS, K_SOURCE = keys[1], keys[2]
  -- The batch's context: group, default session TTL ms, dedupe TTL ms, tombstone TTL ms, max
  -- checkpoints, memory pressure 1|0 (see below), spawn wait ms (see spawn_awaited), now ms,
  -- now RFC 3339, one per line.
  settings = {}
  for part in string.gmatch(argv[1], '[^\n]+') do settings[#settings + 1] = part end
  group, default_ttl, dedupe_ttl, tombstone_ttl = settings[1], settings[2], settings[3], settings[4]
  spawn_wait = tonumber(settings[7])
  now, now_iso = settings[8], settings[9]
  args = argv
  n_acks, n_forgotten = 0, 0
  local replies, n = {}, 0
  local key, at, last = 3, 2, #argv
  while at <= last do
    o = at
    bind_session_of(keys[key])
    key = key + 1
    if argv[at + 1] == 'reject' then
      K_DEDUPE, key = keys[key], key + 1
    else
      K_DEDUPE = nil
    end
    -- A command that raises (a key of the wrong type: a bad session, not a bad server) fails
    -- alone; the others still apply. What it did before the error stays (as for any script).
    local ok, reply = pcall(apply_one)
    if not ok then
      if type(reply) == 'table' then reply = reply.err end
      reply = tostring(reply)
      -- A key of the session not on this node (a Redis Cluster moving its slot: the session's
      -- other keys are not declared, see bind_session_of; a declared one would have had the
      -- call redirected before it ran), or the cluster down: the server's state, not the
      -- command's. Fail the whole call as TRYAGAIN before anything is acknowledged: the worker
      -- holds its commands and retries them (those applied before in it are then duplicates).
      -- Each op reads the keys it may miss before it writes, so the failed one did nothing.
      if string.find(reply, 'non local key', 1, true) or string.find(reply, 'cluster is down', 1, true) then
        return redis.error_reply('TRYAGAIN memworker: ' .. reply)
      end
      reply = {'error', reply}
    end
    -- Three strings per command, flat (a table per command would be one more reply array
    -- for Redis to check and write): status, id or detail, reason ('' if none).
    replies[n + 1], replies[n + 2], replies[n + 3] = reply[1], reply[2], reply[3] or ''
    n = n + 3
    at = at + 1 + tonumber(argv[at])
  end
  for i = 1, n_acks, CHUNK do
    local j = math.min(i + CHUNK - 1, n_acks)
    call('XACK', K_SOURCE, group, unpack(acks, i, j))
    -- Under memory pressure (set by the worker while Redis is nearly full) the entries go too:
    -- they are not kept for the replay window, their memory goes to the commands still
    -- waiting. pcall: a user whose ACL lacks XDEL (an upgrade) keeps them, and the call works.
    if settings[6] == '1' then redis.pcall('XDEL', K_SOURCE, unpack(acks, i, j)) end
  end
  -- A command for a forgotten session is not kept either (memworker forget: no copy of what
  -- was sent for it stays; its rejection carries ids only). pcall, as above.
  if n_forgotten > 0 and settings[6] ~= '1' then
    redis.pcall('XDEL', K_SOURCE, unpack(forgotten, 1, n_forgotten))
  end
  return replies
end

redis.register_function{function_name = FUNCTION_NAME, callback = apply}
