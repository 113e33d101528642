"""Create or upgrade the Postgres schema (``memworker migrate``), safely from many replicas.

Every replica may run this at start: a session-level advisory lock serialises them, and the
ones that come second find the schema at head and do nothing.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import make_url, text
from sqlalchemy.engine import Connection

from worker.db.engine import create_database_engine
from worker.db.vectors import create_vector_schema
from worker.errors import ActionableError
from worker.settings import LOCAL_EMBEDDING_DIMENSION

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = zlib.crc32(b"memworker.migrate")
"""The ``pg_advisory_lock`` key every migrating replica waits on."""
VECTORS_REVISION = "0002"


class PostgresUnreachableError(ActionableError):
    """No connection to Postgres could be opened (refused, unknown host, timeout)."""


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, built in code: no ``alembic.ini`` needed at run time."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def _upgrade(connection: Connection, revision: str, dimension: int) -> tuple[str, str | None]:
    command.upgrade(alembic_config(connection), revision)
    current = MigrationContext.configure(connection).get_current_revision()
    if current is None:  # pragma: no cover - upgrade to a revision always leaves one
        raise RuntimeError("the database has no alembic revision after the upgrade")
    vectors: str | None = "the schema is older than the episode vectors (revision 0002)"
    if current >= VECTORS_REVISION:  # pgvector may have been installed since 0002 ran
        vectors = create_vector_schema(connection, dimension)
    return current, vectors


async def migrate(
    database_url: str, revision: str = "head", dimension: int = LOCAL_EMBEDDING_DIMENSION
) -> str:
    """Upgrade the database at ``database_url`` to ``revision``; return the revision it is at."""
    current, _vectors = await migrate_reporting(database_url, revision, dimension)
    return current


async def migrate_reporting(
    database_url: str, revision: str = "head", dimension: int = LOCAL_EMBEDDING_DIMENSION
) -> tuple[str, str | None]:
    """``migrate``, also saying whether episode vectors (pgvector) are there: None when they
    are, else one line saying what to install. ``dimension`` is the configured embedder's
    (``Settings.vector_dimension``): its vector index is created here, by the schema owner,
    since the runtime role the indexer runs as may not create indexes."""
    engine = create_database_engine(database_url, pool=False)
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            await conn.commit()
            try:
                current, vectors = await conn.run_sync(_upgrade, revision, dimension)
                await conn.commit()
            finally:
                await conn.rollback()
                await conn.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
                await conn.commit()
            return current, vectors
    except OSError as exc:
        safe = make_url(engine.url).render_as_string(hide_password=True)
        raise PostgresUnreachableError(f"cannot reach Postgres at {safe}: {exc}") from exc
    finally:
        await engine.dispose()


async def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None before the first migration."""
    engine = create_database_engine(database_url, pool=False)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()
