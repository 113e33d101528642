"""Watching memworker run: capacity (memory per session, time until full), stats, inspection,
the AsyncAPI spec and the embedded servers. Owns no data: it reads what the other rooms write."""
