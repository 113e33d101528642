#!lua
-- WorkingMemory.update_task_progress.
-- ARGV: session ttl ms, n, the task JSON to start from when the session has none, then n
-- pairs (field, JSON text) for the task's top level, then pairs (name, JSON text) merged
-- into its `data` object. Returns the new task JSON.
-- The task is patched as text: untouched members keep their exact JSON (cjson would turn
-- [] into {} and round big integers), so only the patched members are re-encoded.
local refused = write_refused()
if refused then return redis.error_reply(refused) end
local full = admission_refused()  -- Redis nearly full
if full then return redis.error_reply(full) end

local function skip_ws(s, i)
  return string.find(s, '[^ \t\r\n]', i) or (#s + 1)
end

-- Index just past the JSON string that opens at i.
local function skip_string(s, i)
  if string.sub(s, i, i) ~= '"' then error('task state is not valid JSON') end
  local j = i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then error('task state is not valid JSON') end
    if string.sub(s, k, k) == '"' then return k + 1 end
    j = k + 2
  end
end

-- Index just past the JSON value that starts at i.
local function skip_value(s, i)
  local c = string.sub(s, i, i)
  if c == '"' then return skip_string(s, i) end
  if c == '{' or c == '[' then
    local depth, j = 0, i
    while true do
      local k = string.find(s, '[%[%]{}"]', j)
      if not k then error('task state is not valid JSON') end
      local ch = string.sub(s, k, k)
      if ch == '"' then
        j = skip_string(s, k)
      else
        if ch == '{' or ch == '[' then depth = depth + 1 else depth = depth - 1 end
        j = k + 1
        if depth == 0 then return j end
      end
    end
  end
  return string.find(s, '[,}%] \t\r\n]', i) or (#s + 1)
end

-- The members of a JSON object, in order, as {name, value text}.
local function object_members(s)
  local members = {}
  local i = skip_ws(s, 1)
  if string.sub(s, i, i) ~= '{' then return nil end
  i = skip_ws(s, i + 1)
  if string.sub(s, i, i) == '}' then return members end
  while true do
    local name_end = skip_string(s, i)
    local name = cjson.decode(string.sub(s, i, name_end - 1))
    i = skip_ws(s, name_end)
    if string.sub(s, i, i) ~= ':' then error('task state is not valid JSON') end
    i = skip_ws(s, i + 1)
    local value_end = skip_value(s, i)
    members[#members + 1] = {name, string.sub(s, i, value_end - 1)}
    i = skip_ws(s, value_end)
    local c = string.sub(s, i, i)
    if c == '}' then return members end
    if c ~= ',' then error('task state is not valid JSON') end
    i = skip_ws(s, i + 1)
  end
end

-- `s` with each (name, text) of `patch` replacing its member, or appended when absent.
local function patch_object(s, patch)
  local members = (s and object_members(s)) or {}
  local index = {}
  for i, m in ipairs(members) do index[m[1]] = i end
  for _, p in ipairs(patch) do
    local at = index[p[1]]
    if at then
      members[at][2] = p[2]
    else
      members[#members + 1] = {p[1], p[2]}
      index[p[1]] = #members
    end
  end
  local parts = {}
  for i, m in ipairs(members) do parts[i] = cjson.encode(m[1]) .. ':' .. m[2] end
  return '{' .. table.concat(parts, ',') .. '}'
end

local task = redis.call('GET', K_TASK) or ARGV[3]
local n = tonumber(ARGV[2])
local top, data = {}, {}
local last = 3 + 2 * n
for i = 4, last, 2 do top[#top + 1] = {ARGV[i], ARGV[i + 1]} end
for i = last + 1, #ARGV, 2 do data[#data + 1] = {ARGV[i], ARGV[i + 1]} end
if #data > 0 then
  local current_data = nil
  for _, m in ipairs(object_members(task) or {}) do
    if m[1] == 'data' then current_data = m[2] end
  end
  top[#top + 1] = {'data', patch_object(current_data, data)}
end
task = patch_object(task, top)
redis.call('SET', K_TASK, task)
touch(ARGV[1])
return task
