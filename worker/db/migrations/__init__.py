"""Alembic migrations of the Postgres schema; run them with ``worker.db.migrate.migrate``."""
