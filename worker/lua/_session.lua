-- Prelude shared by every session script and by the apply library (prepended by
-- worker/scripts.py). A call's first 7 keys are always the session's keys, in SessionKeys.all()
-- order; bind_session(keys) binds them to the names below before anything else runs (an EVAL
-- script gets `bind_session(KEYS)` after this prelude). The apply function is given the meta
-- key only and calls bind_session_of(meta_key), which derives the others (fewer arguments).
-- In a function library this prelude's definitions are made once, at FUNCTION LOAD, not on
-- every call.
local K_META, K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA
local CHUNK = 1000
-- redis.call, bound per call (a function library cannot read it at load): an upvalue, where
-- `redis.call` is two table lookups on every call.
local call
-- Globals as locals (upvalues of the functions below): a global is a lookup by name on every
-- use, an upvalue is not. Bound per call with `call` (a library's code sees neither at load).
local tonumber, tostring, type, unpack, ipairs, string, table, math, cjson

local function bind_globals()
  call = redis.call
  tonumber, tostring, type, unpack, ipairs = _G.tonumber, _G.tostring, _G.type, _G.unpack, _G.ipairs
  string, table, math, cjson = _G.string, _G.table, _G.math, _G.cjson
end

local function bind_session(keys)
  bind_globals()
  K_META, K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA =
    keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
end

-- The same from the meta key alone: the session's keys are its base name and a suffix each
-- (worker/keys.py SessionKeys; all of them carry the meta key's hash tag, so they are in its
-- hash slot on a Redis Cluster too). The caller binds `call` itself.
local function bind_session_of(meta_key)
  local base = string.sub(meta_key, 1, -6)  -- without ':meta'
  K_META, K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA = meta_key, base .. ':vars',
    base .. ':vexp', base .. ':task', base .. ':scratch', base .. ':cps', base .. ':cpdata'
end

local function session_keys()
  return {K_META, K_VARS, K_VEXP, K_TASK, K_SCRATCH, K_CPS, K_CPDATA}
end

local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Call a variadic command on key with items, in chunks (Lua's unpack has a stack limit).
local function chunked(cmd, key, items)
  for i = 1, #items, CHUNK do
    call(cmd, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
end

-- The bytes of the session's variables (each name plus its JSON value) are kept in the
-- checkpoint hash's VBYTES field (no checkpoint's field: those are '<id>|<part>', and no id
-- holds '|') by the writes that know the change (wm_set, wm_delete, purge_expired); every
-- other change of the variables (a spawn, a restore, a clear) drops the field, and the next
-- wm_set counts afresh (vars_bytes: HKEYS and one HSTRLEN a variable, once). Not in the meta
-- hash: an agent's working memory never writes meta (its owner, state, seq), so its ACL user
-- may be refused every write of it (deploy/redis/users.acl).
local VBYTES = 'vbytes'

local function vars_bytes()
  local kept = call('HGET', K_CPDATA, VBYTES)
  if kept then return tonumber(kept) end
  local total = 0
  local names = call('HKEYS', K_VARS)
  for i = 1, #names do
    total = total + #names[i] + call('HSTRLEN', K_VARS, names[i])
  end
  return total
end

local function forget_vars_bytes()
  call('HDEL', K_CPDATA, VBYTES)
end

-- Drop variables whose per-key TTL has passed; returns how many.
local function purge_expired(now)
  local dead = call('ZRANGEBYSCORE', K_VEXP, '-inf', now)
  if #dead > 0 then
    local kept = call('HGET', K_CPDATA, VBYTES)
    if kept then  -- take the dropped variables off the count (HSTRLEN is 0 for none)
      local total = tonumber(kept)
      for i = 1, #dead do
        local size = call('HSTRLEN', K_VARS, dead[i])
        if size > 0 then total = total - size - #dead[i] end
      end
      call('HSET', K_CPDATA, VBYTES, math.max(total, 0))
    end
    chunked('HDEL', K_VARS, dead)
    chunked('ZREM', K_VEXP, dead)
  end
  return #dead
end

-- Why a working-memory write that grows the session is refused because Redis is nearly full
-- (the lifecycle worker's admission key of the shard, P:admission:{i}, holds why), or nil.
-- The reserve under maxmemory is kept for applying accepted commands. The key is named from
-- the session's (same prefix, same hash tag: the same slot on a Redis Cluster) and not
-- declared, so a client may hold read access to it only (users.acl); one whose ACL may not
-- read it (an ACL from before) is not refused here: Redis refuses at maxmemory.
local function admission_refused()
  local prefix, shard_tag = string.match(K_META, '^(.*):({%d+}):s:')
  if not prefix then return nil end
  local why = redis.pcall('GET', prefix .. ':admission:' .. shard_tag)
  if type(why) == 'string' then return 'WM_NEARLY_FULL ' .. why end
  return nil
end

local function session_state()
  return call('HGET', K_META, 'state')
end

-- Why a write to the session's working memory is refused ('WM_TERMINATED', 'WM_FORGOTTEN',
-- 'WM_PAUSED'), or
-- nil. A paused session's memory is read-only: resume restores its checkpoint over whatever
-- was written meanwhile, so a write accepted now would be lost without a word.
local function write_refused()
  local state = session_state()
  if state == 'terminated' then return 'WM_TERMINATED' end
  if state == 'forgotten' then return 'WM_FORGOTTEN' end
  if state == 'paused' then return 'WM_PAUSED' end
  return nil
end

-- Idle expiry: every access pushes the whole session's expiry out by its TTL.
-- Paused sessions never expire; a tombstone keeps the expiry terminate gave it.
local function touch(default_ttl_ms)
  local fields = call('HMGET', K_META, 'state', 'ttl_ms')
  local state = fields[1]
  if state == 'terminated' or state == 'forgotten' then return end
  if state == 'paused' then
    for _, k in ipairs(session_keys()) do call('PERSIST', k) end
    return
  end
  local ttl = tonumber(fields[2]) or tonumber(default_ttl_ms)
  for _, k in ipairs(session_keys()) do call('PEXPIRE', k, ttl) end
end

local function count_items()
  local task = call('EXISTS', K_TASK)
  return call('HLEN', K_VARS) + call('LLEN', K_SCRATCH) + task
end

-- JSON array of strings.
local function json_string_array(items)
  if #items == 0 then return '[]' end
  local out = {}
  for i, s in ipairs(items) do out[i] = cjson.encode(s) end
  return '[' .. table.concat(out, ',') .. ']'
end

-- Variables as one JSON object; stored values are already JSON text.
-- Variables as one JSON object (stored values are already JSON text), and how many.
local function variables_json()
  local flat = call('HGETALL', K_VARS)
  if #flat == 0 then return '{}', 0 end
  local parts = {}
  for i = 1, #flat, 2 do
    parts[#parts + 1] = cjson.encode(flat[i]) .. ':' .. flat[i + 1]
  end
  return '{' .. table.concat(parts, ',') .. '}', #parts
end

local function scratchpad_json()
  local entries = call('LRANGE', K_SCRATCH, 0, -1)
  if #entries == 0 then return '[]', 0 end
  return '[' .. table.concat(entries, ',') .. ']', #entries
end

-- The session's memory as JSON, and its item count (as count_items would say).
-- bare: the caller knows task and scratch do not exist.
local function snapshot_json(bare)
  local task, items = false, 0
  if not bare then task = call('GET', K_TASK) end
  if task then items = 1 else task = 'null' end
  local variables, n_vars = variables_json()
  local scratchpad, n_entries = '[]', 0
  if not bare then scratchpad, n_entries = scratchpad_json() end
  return '{"variables":' .. variables
    .. ',"task_state":' .. task
    .. ',"scratchpad":' .. scratchpad
    .. ',"checkpoints":' .. json_string_array(call('ZRANGE', K_CPS, 0, -1)) .. '}',
    items + n_vars + n_entries
end

local function checkpoint_exists(id)
  return call('ZSCORE', K_CPS, id) ~= false
end

-- Save the current variables, their expiries, the task state and the scratchpad under id,
-- server-side (DUMP payloads), so a 1,000-key session checkpoints in one call.
-- bare: the caller knows vexp, task and scratch do not exist (their calls are skipped).
-- fresh: the caller knows id is no checkpoint (no parts of an earlier one to drop).
-- Returns the number of items saved.
-- Append key's DUMP payload to fields as id|suffix, if key exists.
local function checkpoint_save(fields, id, suffix, key)
  local blob = call('DUMP', key)
  if blob then
    fields[#fields + 1] = id .. '|' .. suffix
    fields[#fields + 1] = blob
  end
end

local function checkpoint_create(id, description, now, now_iso, bare, fresh)
  if not bare then purge_expired(now) end
  if not fresh then
    -- Re-using an id must not leave the previous checkpoint's parts behind.
    call('HDEL', K_CPDATA, id .. '|vars', id .. '|vexp', id .. '|scratch', id .. '|task')
  end
  local fields = {}
  checkpoint_save(fields, id, 'vars', K_VARS)
  local items
  if bare then
    items = call('HLEN', K_VARS)
  else
    checkpoint_save(fields, id, 'vexp', K_VEXP)
    checkpoint_save(fields, id, 'scratch', K_SCRATCH)
    local task = call('GET', K_TASK)
    if task then
      fields[#fields + 1] = id .. '|task'
      fields[#fields + 1] = task
    end
    items = count_items()
  end
  fields[#fields + 1] = id .. '|info'
  -- One concatenation, not a table to build, encode and collect per checkpoint.
  fields[#fields + 1] = '{"checkpoint_id":' .. cjson.encode(id) .. ',"description":'
    .. cjson.encode(description or '') .. ',"created_at":' .. cjson.encode(now_iso)
    .. ',"items":' .. items .. '}'
  call('HSET', K_CPDATA, unpack(fields))
  call('ZADD', K_CPS, now, id)
  return items
end

local function restore_key(key, blob, bare)
  if blob then
    call('RESTORE', key, 0, blob, 'REPLACE')
  elseif not bare then
    call('DEL', key)
  end
end

-- Restore checkpoint id. With clear, the current memory is replaced; without, the
-- checkpoint's variables are written over the current ones (others kept) and its task
-- state, when it has one, replaces the current one; the scratchpad is kept.
-- bare: the caller knows vexp, task and scratch do not exist now.
-- Returns the number of items after the restore, and whether vexp, task and scratch are
-- known not to exist after it.
local function checkpoint_restore(id, clear, now, bare)
  forget_vars_bytes()  -- the variables change wholesale: counted afresh by the next wm_set
  local blobs = call('HMGET', K_CPDATA, id .. '|vars', id .. '|vexp', id .. '|scratch', id .. '|task')
  if clear then
    restore_key(K_VARS, blobs[1])
    restore_key(K_VEXP, blobs[2], bare)
    restore_key(K_SCRATCH, blobs[3], bare)
    if blobs[4] then call('SET', K_TASK, blobs[4]) elseif not bare then call('DEL', K_TASK) end
  else
    local tmp = K_CPDATA .. ':restore'
    if blobs[1] then
      call('RESTORE', tmp, 0, blobs[1], 'REPLACE')
      local flat = call('HGETALL', tmp)
      chunked('HSET', K_VARS, flat)
      local names = {}
      for i = 1, #flat, 2 do names[#names + 1] = flat[i] end
      chunked('ZREM', K_VEXP, names)
      call('DEL', tmp)
    end
    if blobs[2] then
      call('RESTORE', tmp, 0, blobs[2], 'REPLACE')
      local flat = call('ZRANGE', tmp, 0, -1, 'WITHSCORES')
      local args = {}
      for i = 1, #flat, 2 do
        args[#args + 1] = flat[i + 1]
        args[#args + 1] = flat[i]
      end
      chunked('ZADD', K_VEXP, args)
      call('DEL', tmp)
    end
    if blobs[4] then call('SET', K_TASK, blobs[4]) end
  end
  if bare and clear and not (blobs[2] or blobs[3] or blobs[4]) then
    return call('HLEN', K_VARS), true  -- nothing but variables, none with an expiry
  end
  purge_expired(now)
  return count_items(), false
end

local function checkpoint_delete(id)
  call('HDEL', K_CPDATA, id .. '|vars', id .. '|vexp', id .. '|scratch', id .. '|task', id .. '|info')
  return call('ZREM', K_CPS, id)
end
