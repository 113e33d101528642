-- Move one entry to the dead-letter stream and acknowledge it at its source, atomically.
-- KEYS: 1 DLQ stream, 2 source stream. ARGV: 1 group, 2 source entry id, 3.. field/value pairs.
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
return id
