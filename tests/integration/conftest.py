"""Fixtures shared by the write-path tests: a migrated database and user memory's settings."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.results_factory import migrated_engine
from worker.settings import Settings


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """The test's own database, migrated to head (a module may define its own ``engine``)."""
    async with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture
def write_settings(redis_url: str, prefix: str, database_url: str) -> Settings:
    """User memory's settings with the write path as with an indexer running (``remember``
    embeds nothing itself)."""
    return Settings(
        redis_url=redis_url,
        stream_prefix=prefix,
        database_url=database_url,
        remember_embedding="indexer",
    )
