"""Alembic migrations of the Postgres schema; run them with ``worker.migrate.migrate``."""
