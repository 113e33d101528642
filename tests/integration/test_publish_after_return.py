"""``remember`` returns once its turn and event are committed, not after the change feed's
publish: a publish held back (its project's outbox lock taken by someone else) holds no writer
back, the events wait owed in Postgres and go out by themselves, in order, once it can run;
a publish that falls two batches behind makes writers wait (what waits stays bounded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.episodes.changes import PUBLISH_BATCH
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT = "held"


@pytest.fixture
async def outbox_lock(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """The project's outbox lock, held by another session until ``release``d."""
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT pg_advisory_lock(hashtextextended('memory_changes/' || :p, 0))"),
            {"p": PROJECT},
        )
        await conn.commit()  # a session's lock: it outlives the transaction
        yield conn
        await release(conn)


async def release(conn: AsyncConnection) -> None:
    await conn.execute(text("SELECT pg_advisory_unlock_all()"))
    await conn.commit()


def turn(turn_id: str, user: str) -> Episode:
    return Episode(id=turn_id, session_id=f"s-{user}", user_id=user, input="hi", output="ok")


async def remembered(redis: Redis, settings: Settings) -> list[str]:
    """The turn ids of the project's ``episode.remembered`` events, in feed order."""
    entries: Any = await redis.xrange(
        changes_stream(settings.stream_prefix, PROJECT, settings.shards)
    )
    events = [orjson.loads(fields[b"data"]) for _id, fields in entries]
    return [e["episode_id"] for e in events if e["type"] == "episode.remembered"]


async def owed(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM memory_changes")) or 0)


async def test_remember_returns_at_commit_and_its_events_follow_in_order_by_themselves(
    engine: AsyncEngine,
    redis: Redis,
    write_settings: Settings,
    outbox_lock: AsyncConnection,
) -> None:
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        for k in range(5):  # the publish cannot run: remember does not wait for it
            await asyncio.wait_for(memory.remember(turn(f"t{k}", "ann")), 10)
        async with engine.connect() as conn:  # stored, each once
            stored = await conn.scalar(
                text("SELECT count(DISTINCT turn_id) FROM episodes WHERE project_id = :p"),
                {"p": PROJECT},
            )
        assert stored == 5
        assert await owed(engine) == 5
        assert await remembered(redis, write_settings) == []

        await release(outbox_lock)
        for _ in range(100):  # no call needed: the publish on its way sends them
            if len(await remembered(redis, write_settings)) == 5:
                break
            await asyncio.sleep(0.1)
        assert await remembered(redis, write_settings) == [f"t{k}" for k in range(5)]
        await memory.flush_changes()  # the publish that sent them done: its rows deleted
        assert await owed(engine) == 0


async def test_a_publish_two_batches_behind_holds_the_next_writer_until_it_catches_up(
    engine: AsyncEngine,
    redis: Redis,
    write_settings: Settings,
    outbox_lock: AsyncConnection,
) -> None:
    def batch(b: int) -> list[Episode]:
        return [turn(f"b{b}-{k}", f"u{k % 7}") for k in range(PUBLISH_BATCH)]

    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        await asyncio.wait_for(memory.remember_many(batch(0)), 30)  # being published (held)
        await asyncio.wait_for(memory.remember_many(batch(1)), 30)  # queued behind it
        third = asyncio.create_task(memory.remember_many(batch(2)))
        await asyncio.sleep(2)
        assert not third.done()  # two batches owed and unsent: the writer waits

        await release(outbox_lock)
        await asyncio.wait_for(third, 60)
        await memory.flush_changes()
        events = await remembered(redis, write_settings)
        assert events == [e.id for b in range(3) for e in batch(b)]
        assert await owed(engine) == 0
