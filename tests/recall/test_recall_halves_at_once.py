"""``Memory.recall_scored`` runs its meaning half beside its words half, and reads a user's
sessions by an index, and returns what it returned before.

The meaning half (the query's vector, the vector search) now runs on a second connection at
the same time as the words search, rather than after it (the inspector's recall page waited
for both in turn: BENCHMARKS.md, the memory inspector). The turns, their order and every score
are those of the halves run one after the other on one connection (``recall_scored`` without
``beside``), for words and meaning together, meaning only and words only, a turn without a
vector among them. The best turns' sessions are read through the index of migration 0010
(``project_id, user_id, session_id``) rather than through all of the user's turns.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.db.vectors import vector_literal
from worker.episodes.embedding import LocalEmbedder
from worker.settings import Settings, asyncpg_url
from worker.user_memory.indexing import embed_query_or_none
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, ScoredMatches
from worker.user_memory.recall import recall_scored

WORDS = ("invoice", "refund", "shipping", "parcel", "address", "warehouse", "discount", "delay")
QUERIES = ("where is my refund for the parcel", "shipping delay", "a discount on the invoice")
TURNS = 400


def as_rows(found: ScoredMatches) -> list[tuple[Any, ...]]:
    return [(m.episode.id, m.score, m.bm25_score, m.vector_score, m.unindexed) for m in found] + [
        ("unindexed", found.unindexed)
    ]


async def seed(memory: Memory, engine: AsyncEngine, embedder: LocalEmbedder) -> None:
    """``TURNS`` turns of 20 a session; every turn but a few has a vector, some near the
    queries' (cosines above the floor), the rest anywhere."""
    rng = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns = [
        Episode(
            session_id=f"s{n // 20}",
            user_id="ann",
            input=" ".join(rng.choice(WORDS) for _ in range(6)) + f" turn {n}",
            output=" ".join(rng.choice(WORDS) for _ in range(4)),
            occurred_at=start + timedelta(minutes=n),
        )
        for n in range(TURNS)
    ]
    await memory.remember_many(turns)
    near = [list(v) for v in await embedder.embed(list(QUERIES))]
    async with engine.begin() as conn:
        ids = [row[0] for row in await conn.execute(text("SELECT id FROM episodes ORDER BY id"))]
        for n, key in enumerate(ids[:-5]):  # the last five: no vector yet
            base = near[n % len(near)]
            weight = rng.random()
            vector = [weight * x + (1 - weight) * rng.gauss(0, 0.05) for x in base]
            await conn.execute(
                text(
                    "INSERT INTO episode_embeddings (episode_id, project_id, model, dimension,"
                    " embedding) VALUES (:e, 'halves', :m, :d, CAST(:v AS vector))"
                ),
                {"e": key, "m": embedder.name, "d": len(vector), "v": vector_literal(vector)},
            )
        await conn.execute(text("ANALYZE episodes"))
        await conn.execute(text("ANALYZE episode_embeddings"))


async def test_the_halves_at_once_return_the_turns_and_scores_of_the_halves_in_turn(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    async with Memory(
        "halves", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        await seed(memory, vector_engine, embedder)
        checked = 0
        for query in QUERIES:
            for alpha in (0.5, 1.0, 0.0):
                at_once = await memory.recall_scored(query, user_id="ann", limit=15, alpha=alpha)
                async with (
                    vector_engine.begin() as conn
                ):  # one connection, one half after the other
                    in_turn = await recall_scored(
                        conn,
                        "halves",
                        query,
                        limit=15,
                        time_range=None,
                        user_id="ann",
                        alpha=alpha,
                        query_vector=None,
                        model=embedder.name,
                        exact=True,
                        min_similarity=settings.recall_min_similarity,
                        embedding=embed_query_or_none(embedder, query) if alpha > 0 else None,
                    )
                assert as_rows(at_once) == as_rows(in_turn), (query, alpha)
                assert len(at_once) == 15
                if alpha == 0.5:  # both halves found something, and a turn had no vector
                    assert any(m.vector_score is not None for m in at_once)
                    assert any(m.bm25_score is not None for m in at_once)
                checked += 1
    assert checked == 9


async def test_the_best_turns_sessions_are_read_by_the_sessions_index(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    async with Memory(
        "halves", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        await seed(memory, vector_engine, embedder)
        statements: list[tuple[str, Any]] = []

        def seen(_c: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            statements.append((statement, parameters))

        event.listen(vector_engine.sync_engine, "before_cursor_execute", seen)
        try:
            found = await memory.recall_scored(QUERIES[0], user_id="ann", limit=10)
        finally:
            event.remove(vector_engine.sync_engine, "before_cursor_execute", seen)
        assert len(found) == 10
    [(context, parameters)] = [s for s in statements if "session_id = ANY" in s[0]]
    async with vector_engine.begin() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))  # as the recall reads
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        plan = "\n".join(row[0] for row in await driver.fetch("EXPLAIN " + context, *parameters))
    assert "ix_episodes_project_id_user_id_session_id" in plan, plan


async def test_recalls_at_once_never_wait_for_a_second_connection_the_pool_cannot_give(
    vector_engine: AsyncEngine,
    vector_database_url: str,
    redis: Redis,
    vector_settings: Settings,
    embedder: LocalEmbedder,
) -> None:
    """Each recall holds one connection and may want a second beside it: on a pool of one
    connection, or with more recalls at once than the pool has connections, none may wait for
    one every other recall holds (the pool's timeout, then an error to every caller)."""
    settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    async with Memory(
        "halves", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        await seed(memory, vector_engine, embedder)
        expected = as_rows(await memory.recall_scored(QUERIES[0], user_id="ann", limit=10))
    for size, overflow in ((1, 0), (2, 0), (3, 1)):
        small = create_async_engine(
            asyncpg_url(vector_database_url), pool_size=size, max_overflow=overflow, pool_timeout=5
        )
        try:
            async with Memory(
                "halves", settings=settings, embedder=embedder, engine=small, redis=redis
            ) as memory:
                found = await asyncio.gather(
                    *(memory.recall_scored(QUERIES[0], user_id="ann", limit=10) for _ in range(12))
                )
            assert [as_rows(f) for f in found] == [expected] * 12, (size, overflow)
        finally:
            await small.dispose()
