"""Results into Postgres: the audit log of every result and an episode per finished session.

Owns the ``lifecycle_events`` rows, the ``consolidation`` group and replay of result streams.
"""
