"""``Memory.recall_scored`` keeps its speed when Postgres plans its statements generically.

The driver prepares every statement, and after five runs of one Postgres may keep a *generic*
plan, made without the values. A query vector that reached the server as text and was cast to
``vector`` inside the statement was then parsed again for every row the exact search scored
(384 floats each time, twice a row): on one of LoCoMo's long conversations (419 turns) the
vector search went from ~2 ms to ~85 ms from the sixth recall on (BENCHMARKS.md). The test
makes Postgres plan every statement generically (what it may choose after five runs) and
compares recall's time with the same recalls planned for their values, in turns.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.recall.conftest import random_vectors
from worker.episodes.embedding import LocalEmbedder
from worker.settings import Settings, asyncpg_url
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

TURNS = 1_500
WORDS = ("garden", "violin", "recipe", "marathon", "painting", "camping", "novel", "puppy")


@pytest.fixture
async def generic_engine(vector_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine whose sessions plan every prepared statement generically."""
    engine = create_async_engine(
        asyncpg_url(vector_database_url),
        connect_args={"server_settings": {"plan_cache_mode": "force_generic_plan"}},
    )
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_recall_is_as_fast_with_generic_plans_as_with_plans_for_its_values(
    vector_engine: AsyncEngine,
    generic_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
    embedder: LocalEmbedder,
) -> None:
    settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns = [
        Episode(
            session_id=f"s{n // 20}",
            user_id="ann",
            input=f"Ann: turn {n} about my {WORDS[n % len(WORDS)]} and {WORDS[n // 7 % 8]}",
            output="",
            occurred_at=start + timedelta(minutes=n),
        )
        for n in range(TURNS)
    ]
    async with Memory(
        "plans", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        for at in range(0, TURNS, 500):
            await memory.remember_many(turns[at : at + 500])
    async with vector_engine.begin() as conn:  # a vector for every turn, as the indexer's
        await random_vectors(conn, "plans", embedder.name)
        await conn.execute(text("ANALYZE episodes"))
        await conn.execute(text("ANALYZE episode_embeddings"))

    timings: dict[str, list[float]] = {"values": [], "generic": []}
    async with AsyncExitStack() as stack:
        memories = {
            name: await stack.enter_async_context(
                Memory("plans", settings=settings, embedder=embedder, engine=engine, redis=redis)
            )
            for name, engine in (("values", vector_engine), ("generic", generic_engine))
        }
        for memory in memories.values():
            found = await memory.recall_scored("my violin lessons", user_id="ann", limit=10)
            assert len(found) == 10 and found.unindexed == 0  # every turn searched by meaning
        for n in range(6):
            for name, memory in memories.items():
                started = time.perf_counter()
                await memory.recall_scored(f"practising the violin {n}", user_id="ann", limit=10)
                timings[name].append(time.perf_counter() - started)
    values, generic = (statistics.median(timings[k]) for k in ("values", "generic"))
    # a vector parsed once per recall: the same work either way (it was ~6x with generic plans)
    assert generic < 2.5 * values + 0.02, timings
