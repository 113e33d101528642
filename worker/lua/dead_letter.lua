-- Move one entry to the dead-letter stream and acknowledge it at its source, atomically.
-- An entry no longer pending (another consumer already dead-lettered or applied it) is left
-- alone, so one entry never gets two dead letters.
-- KEYS: 1 DLQ stream, 2 source stream. ARGV: 1 group, 2 source entry id, 3.. field/value pairs.
if redis.call('XACK', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return false
end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
return redis.call('XADD', KEYS[1], '*', unpack(fields))
