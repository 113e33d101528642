"""Fixtures of the recall tests: a PostgreSQL with pgvector (``tests.pgvector_server``, one per
session), a fresh migrated database on it per test, and the local embedder (loaded once)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from worker.db.engine import create_database_engine
from worker.db.migrate import migrate_reporting
from worker.episodes.embedding import LocalEmbedder
from worker.settings import Settings


@pytest.fixture
async def vector_database_url(pgvector_admin_url: str) -> AsyncIterator[str]:
    """A fresh database with pgvector, migrated; dropped when the test ends."""
    name = "memworker_v" + uuid.uuid4().hex[:12]
    admin = create_async_engine(pgvector_admin_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pgvector_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        _revision, missing = await migrate_reporting(url)
        assert missing is None, missing  # this server ships pgvector: it must be enabled
        yield url
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


@pytest.fixture
async def vector_engine(vector_database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_database_engine(vector_database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def embedder() -> LocalEmbedder:
    local = LocalEmbedder()
    local.load()
    return local


@pytest.fixture
def vector_settings(settings: Settings, vector_database_url: str) -> Settings:
    return settings.model_copy(update={"database_url": vector_database_url})


async def random_vectors(conn: AsyncConnection, project: str, model: str) -> None:
    """A random 384-float vector of ``model`` for every episode of ``project``, as if the
    indexer had embedded them (a test of how recall reads vectors, not of what they mean)."""
    await conn.execute(
        text(
            "INSERT INTO episode_embeddings (episode_id, project_id, model, dimension,"
            " embedding) SELECT e.id, e.project_id, :m, 384, (SELECT CAST(array_agg("
            "random() - 0.5) AS vector) FROM generate_series(1, 384) g"
            " WHERE g > 0 * length(e.input)) FROM episodes e WHERE e.project_id = :p"
        ),
        {"m": model, "p": project},
    )
