"""Postgres: the long-term memory (episodes) and the lifecycle event log."""
