-- WorkingMemory.get_all. ARGV: session ttl ms. Every live variable as one JSON object.
purge_expired(now_ms())
local all = variables_json()
touch(ARGV[1])
return all
