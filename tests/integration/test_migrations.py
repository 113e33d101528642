"""The Alembic migrations build exactly the models' schema, and replicas may all run them."""

from __future__ import annotations

import asyncio
import warnings

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect

from worker.db.engine import create_database_engine
from worker.db.migrate import current_revision, head_revision, migrate
from worker.db.models import Base
from worker.db.vectors import include_name


def _diffs(connection: Connection) -> list[object]:
    options = {"compare_type": True, "include_name": include_name}  # pgvector's table: its own
    context = MigrationContext.configure(connection, opts=options)
    return list(compare_metadata(context, Base.metadata))


async def test_the_migrated_schema_equals_the_models(database_url: str) -> None:
    await migrate(database_url)
    engine = create_database_engine(database_url, pool=False)
    try:
        async with engine.connect() as conn:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. "computed default cannot be compared"
                diffs = await conn.run_sync(_diffs)
            tables = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    finally:
        await engine.dispose()
    assert diffs == []
    assert {"episodes", "lifecycle_events", "alembic_version"} <= tables


async def test_migrate_returns_the_head_revision(database_url: str) -> None:
    assert await current_revision(database_url) is None
    assert await migrate(database_url) == head_revision()
    assert await current_revision(database_url) == head_revision()


async def test_migrating_twice_changes_nothing(database_url: str) -> None:
    first = await migrate(database_url)
    second = await migrate(database_url)
    assert first == second == head_revision()


async def test_three_replicas_migrating_at_once_all_succeed(database_url: str) -> None:
    revisions = await asyncio.gather(*(migrate(database_url) for _ in range(3)))
    assert revisions == [head_revision()] * 3
    assert await current_revision(database_url) == head_revision()
