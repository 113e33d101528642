"""Following the change feed (``follow_changes``): a subscriber reacts to every change to
memory without polling, each event once per group, and a handler that fails is retried then
dead-lettered, never skipped silently."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.streams import ChangeEvent
from tests.integration.results_factory import migrated_engine
from worker.episodes.changes import change_event, owe_many, publish_owed_many
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.feed import feed_dlq, follow_changes
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture
def feed_settings(redis_url: str, prefix: str, database_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        stream_prefix=prefix,
        database_url=database_url,
        hook_retry_seconds=0.3,
        max_deliveries=2,
        block_ms=50,
        remember_embedding="indexer",  # the feed's events as without pgvector
    )


async def test_a_follower_sees_every_change_in_order_once(
    engine: AsyncEngine, redis: Redis, feed_settings: Settings
) -> None:
    seen: list[ChangeEvent] = []
    got_four = asyncio.Event()

    async def on_change(event: ChangeEvent) -> None:
        seen.append(event)
        if len(seen) >= 4:
            got_four.set()

    stop, ready = asyncio.Event(), asyncio.Event()
    following = asyncio.create_task(
        follow_changes(on_change, "profile-cache", stop=stop, ready=ready, settings=feed_settings)
    )
    await asyncio.wait_for(ready.wait(), 10)
    async with Memory("p", settings=feed_settings, engine=engine, redis=redis) as memory:
        await memory.update_block("persona", "kind", user_id="ann")
        await memory.remember(Episode(session_id="s", user_id="ann", input="hi", output="hello"))
        await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate="likes", object="tea")
        )
        await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate="likes", object="coffee")
        )
    await asyncio.wait_for(got_four.wait(), 10)
    await asyncio.sleep(0.3)  # nothing more arrives
    stop.set()
    await asyncio.wait_for(following, 10)
    assert [e.type for e in seen] == [
        "block.updated",
        "episode.remembered",
        "fact.added",
        "fact.added",
        "fact.superseded",
    ]
    assert all(e.user_id == "ann" for e in seen)


async def test_a_handler_that_keeps_failing_is_dead_lettered_with_its_error(
    engine: AsyncEngine, redis: Redis, feed_settings: Settings
) -> None:
    calls: list[str] = []

    async def broken(event: ChangeEvent) -> None:
        calls.append(event.event_id)
        raise RuntimeError("cache is read-only")

    stop, ready = asyncio.Event(), asyncio.Event()
    following = asyncio.create_task(
        follow_changes(broken, "broken", stop=stop, ready=ready, settings=feed_settings)
    )
    await asyncio.wait_for(ready.wait(), 10)
    async with Memory("p", settings=feed_settings, engine=engine, redis=redis) as memory:
        await memory.update_block("persona", "kind", user_id="ann")
    dlq = feed_dlq(feed_settings.stream_prefix)
    async with asyncio.timeout(15):
        while not await redis.xlen(dlq):
            await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(following, 10)
    entries: Any = await redis.xrange(dlq)
    [(_id, letter)] = entries
    assert b"cache is read-only" in letter[b"error"]
    assert len(calls) >= 2  # retried before it was dead-lettered


async def test_memworkers_own_group_cannot_be_followed(feed_settings: Settings) -> None:
    async def nothing(event: ChangeEvent) -> None:
        return None

    with pytest.raises(ValueError, match="memworker's own"):
        await follow_changes(nothing, "indexer", settings=feed_settings)


async def test_a_handler_meeting_an_outage_holds_the_event_and_never_dead_letters_it(
    engine: AsyncEngine, redis: Redis, feed_settings: Settings
) -> None:
    calls: list[str] = []
    delivered = asyncio.Event()

    async def flaky(event: ChangeEvent) -> None:
        calls.append(event.event_id)
        if len(calls) <= 4:  # more tries than max_deliveries (2) and the retry window allow
            raise ConnectionError("the cache's server refused the connection")
        delivered.set()

    stop, ready = asyncio.Event(), asyncio.Event()
    following = asyncio.create_task(
        follow_changes(flaky, "flaky", stop=stop, ready=ready, settings=feed_settings)
    )
    await asyncio.wait_for(ready.wait(), 10)
    async with Memory("p", settings=feed_settings, engine=engine, redis=redis) as memory:
        await memory.update_block("persona", "kind", user_id="ann")
    await asyncio.wait_for(delivered.wait(), 30)
    stop.set()
    await asyncio.wait_for(following, 10)
    assert not await redis.xlen(feed_dlq(feed_settings.stream_prefix))
    assert len(set(calls)) == 1  # one event, held through the outage, then handled


async def test_owed_events_of_several_projects_go_out_at_once_each_on_its_stream_in_order(
    engine: AsyncEngine, redis: Redis, feed_settings: Settings
) -> None:
    """``publish_owed_many`` (the indexer's batch owes ``episode.recallable`` to many
    projects): every project's events on its own stream, in the order owed; the outbox empty."""
    projects = ["p-a", "p-b", "p-c"]
    owed = [
        (projects[i % 2], change_event("block.updated", projects[i % 2], "u", f"k{i}"))
        for i in range(7)
    ]
    async with engine.begin() as conn:
        await owe_many(conn, owed)
    prefix, shards = feed_settings.stream_prefix, feed_settings.shards
    assert await publish_owed_many(engine, redis, prefix, shards, projects) == 7
    assert await publish_owed_many(engine, redis, prefix, shards, projects) == 0
    published: dict[str, list[str]] = {}
    for stream in {changes_stream(prefix, project, shards) for project in projects}:
        entries: Any = await redis.xrange(stream)
        for _id, fields in entries:
            event = orjson.loads(fields[b"data"])
            published.setdefault(event["project_id"], []).append(event["event_id"])
    for project in projects:  # p-c owed nothing
        assert published.get(project, []) == [e["event_id"] for p, e in owed if p == project]
    async with engine.connect() as conn:
        left = (await conn.execute(text("SELECT count(*) FROM memory_changes"))).scalar_one()
    assert left == 0
