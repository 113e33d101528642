"""A recall's context in a session that never ends: of a session longer than ``WHOLE_SESSION``
turns only the ``WINDOW`` either side of each best turn are ranked, of a shorter one every
turn, and a turn is linked to its neighbour only when both are (never across a gap), with the
cosines and without (real Postgres with pgvector)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall.conftest import random_vectors
from worker.db.vectors import vector_literal
from worker.episodes.embedding import LocalEmbedder
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode
from worker.user_memory.recall_sessions import WHOLE_SESSION, WINDOW, read_context_sessions
from worker.user_memory.turn_ranking import Turn

LONG = WHOLE_SESSION + 60
SHORT = 30


async def test_a_long_session_is_ranked_around_its_best_turns_and_a_short_one_whole(
    vector_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
    embedder: LocalEmbedder,
) -> None:
    settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns = [
        Episode(
            session_id=session,
            user_id="ann",
            input=f"Ann: turn {n} of {session}",
            output="",
            occurred_at=start + timedelta(minutes=n),
        )
        for session, size in (("long", LONG), ("short", SHORT))
        for n in range(size)
    ]
    async with Memory(
        "context", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        await memory.remember_many(turns)
    async with vector_engine.begin() as conn:  # a vector for every turn, as the indexer's
        await random_vectors(conn, "context", embedder.name)
        rows = await conn.execute(
            text(
                "SELECT session_id, array_agg(id::text ORDER BY occurred_at) FROM episodes"
                " WHERE project_id = 'context' GROUP BY session_id"
            )
        )
        ids = {session: list(keys) for session, keys in rows}
    long, short = ids["long"], ids["short"]
    assert (len(long), len(short)) == (LONG, SHORT)
    best = [long[30], long[LONG - 5], short[3]]
    near = {*range(30 - WINDOW, 30 + WINDOW + 1), *range(LONG - 5 - WINDOW, LONG)}
    where = ["e.project_id = :p", "e.user_id = :u"]
    params = {"p": "context", "u": "ann", "m": embedder.name}
    [query] = await embedder.embed(["turn of long"])
    vector = vector_literal(query)
    for dimension in (384, None):
        read: dict[str, Turn] = {}
        async with vector_engine.begin() as conn:
            await read_context_sessions(
                conn,
                where,
                {**params, "qv": vector} if dimension else params,
                read,
                ["long", "short"],
                dimension,
                -1.0,
                best=best,
            )
        assert {k for k in read if read[k].session == "long"} == {long[n] for n in near}
        assert {k for k in read if read[k].session == "short"} == set(short)
        assert (read[long[31]].before, read[long[29]].after) == (long[30], long[30])
        assert read[long[30 + WINDOW]].after is None  # the next turn was not read: no link
        assert read[long[LONG - 5 - WINDOW]].before is None
        assert read[long[LONG - 1]].after is None and read[short[0]].before is None
        assert all((read[k].cosine is not None) == bool(dimension) for k in read)
