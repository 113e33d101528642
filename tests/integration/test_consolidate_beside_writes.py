"""``Memory.consolidate()`` beside agents remembering: the fact extractor holds its batch of
episodes' rows locked while it appends facts (and the model behind it thinks); the change
feed's publish marks the turns it announces on those same rows. Neither may wait for the
other: every turn is stored, consolidated into its fact and announced once, each user's feed in
order, with the writers in this process (one engine) or in a ``memworker serve`` beside it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import free_port
from worker.keys import changes_stream, episodes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact
from worker.user_memory.turns import SessionEpisode

PROJECT = "consolidating"
USERS, EACH = 20, 12
DEADLINE_S = 90.0


class TurnFacts:
    """An extractor as a model-backed one behaves: a fact from every turn, appended after a
    pause (the model's answer) while its batch's rows stay locked."""

    async def consolidate(self, episodes: Iterable[Episode], *, store: Any) -> list[Fact]:
        await asyncio.sleep(0.05)
        facts = [
            Fact(
                user_id=e.user_id,
                subject=f"user:{e.user_id}",
                predicate=f"said_{e.id}",
                object=e.input,
                valid_from=e.occurred_at,
                sources=[e.id],
            )
            for e in episodes
            if not isinstance(e, SessionEpisode)
        ]
        if facts:
            await store.append_many(facts)
        return facts


def turn(u: int, n: int) -> dict[str, Any]:
    return {
        "id": f"u{u}-{n}",
        "session_id": f"s{u}",
        "user_id": f"u{u}",
        "input": f"turn {n} of user {u}",
        "output": "ok",
    }


async def consolidating_beside(writers: Any, extracting: Memory) -> None:
    """Run ``writers`` (a coroutine) with ``consolidate()`` called over and over beside it,
    then once more; a deadlock fails the test at ``DEADLINE_S`` instead of hanging it."""

    async def consolidate_meanwhile(done: asyncio.Event) -> int:
        runs = 0
        while not done.is_set():
            await extracting.consolidate()
            runs += 1
            await asyncio.sleep(0.01)
        await extracting.consolidate()
        return runs + 1

    async def both() -> int:
        done = asyncio.Event()
        consolidating = asyncio.create_task(consolidate_meanwhile(done))
        try:
            await writers
            done.set()
            return await consolidating
        finally:  # stuck: the extractor's transaction rolls back, its row locks go
            consolidating.cancel()
            with contextlib.suppress(BaseException):
                await consolidating

    try:
        runs = await asyncio.wait_for(both(), DEADLINE_S)
    except TimeoutError:
        pytest.fail(f"consolidate() and remember() deadlocked: not done in {DEADLINE_S:.0f} s")
    assert runs >= 2


async def announced(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(
            await conn.scalar(
                text("SELECT count(announced_at) FROM episodes WHERE project_id = :p"),
                {"p": PROJECT},
            )
            or 0
        )


async def assert_all_consolidated_announced_and_in_order(
    engine: AsyncEngine, redis: Redis, settings: Settings
) -> None:
    total = USERS * EACH
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT count(*) AS turns, count(consolidated_at) AS consolidated,"
                    " count(announced_at) AS announced FROM episodes WHERE project_id = :p"
                ),
                {"p": PROJECT},
            )
        ).one()
        facts = await conn.scalar(
            text("SELECT count(*) FROM facts WHERE project_id = :p"), {"p": PROJECT}
        )
        owed = await conn.scalar(text("SELECT count(*) FROM memory_changes"))
    assert (row.turns, row.consolidated, facts) == (total, total, total)
    assert row.announced == total, "a turn never announced to the indexer"
    assert owed == 0, "change events left owed"
    assert await redis.xlen(episodes_stream(settings.stream_prefix)) == total, (
        "a turn announced twice"
    )
    entries: Any = await redis.xrange(
        changes_stream(settings.stream_prefix, PROJECT, settings.shards)
    )
    events = [orjson.loads(f[b"data"]) for _id, f in entries]
    remembered: dict[str, list[str]] = defaultdict(list)
    for event in events:
        if event["type"] == "episode.remembered":
            remembered[event["user_id"]].append(event["episode_id"])
    for u in range(USERS):
        assert remembered[f"u{u}"] == [f"u{u}-{n}" for n in range(EACH)], f"u{u}'s feed"
    added = [e["fact_id"] for e in events if e["type"] == "fact.added"]
    assert len(added) == len(set(added)) == total, "a fact.added lost or doubled"


async def test_consolidate_beside_remembers_of_the_same_process_finishes(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """One engine: the writers and the extractor share the process's group commit."""
    async with (
        Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory,
        Memory(
            PROJECT,
            settings=write_settings,
            engine=engine,
            redis=redis,
            consolidator=TurnFacts(),
        ) as extracting,
    ):

        async def agent(u: int) -> None:
            for n in range(EACH):
                await memory.remember(Episode(**turn(u, n)))

        async def agents() -> None:
            await asyncio.gather(*(agent(u) for u in range(USERS)))

        await consolidating_beside(agents(), extracting)
    await assert_all_consolidated_announced_and_in_order(engine, redis, write_settings)


async def test_consolidate_beside_a_serve_taking_remembers_finishes(
    engine: AsyncEngine, redis: Redis, write_settings: Settings, database_url: str
) -> None:
    """The writers in a ``memworker serve`` (its own group commit and outbox lock), the
    extractor in this process."""
    port = free_port()
    env = worker_env(write_settings, MEMWORKER_REMEMBER_EMBEDDING="indexer")
    server = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        server.wait_for(f"on http://127.0.0.1:{port}")
        limits = httpx.Limits(max_connections=USERS)
        async with (
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE_S, limits=limits
            ) as http,
            Memory(
                PROJECT,
                settings=write_settings,
                engine=engine,
                redis=redis,
                consolidator=TurnFacts(),
            ) as extracting,
        ):

            async def agent(u: int) -> None:
                for n in range(EACH):
                    reply = await http.post("/v1/remember", json=turn(u, n))
                    assert reply.status_code == 200, reply.text

            async def agents() -> None:
                await asyncio.gather(*(agent(u) for u in range(USERS)))

            await consolidating_beside(agents(), extracting)
            # what the extractor's locks held back, serve's own publisher announces by itself
            for _ in range(100):
                if await announced(engine) == USERS * EACH:
                    break
                await asyncio.sleep(0.1)
    finally:
        server.close()
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        await memory.flush_changes()  # what the killed serve still owed
    await assert_all_consolidated_announced_and_in_order(engine, redis, write_settings)
