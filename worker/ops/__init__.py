"""Running memworker: capacity, stats, inspection, the AsyncAPI spec, dev mode and embedded servers.

Owns no data; it reads what the other rooms write and starts the services.
"""
