"""Sessions that arrive over the bus join user memory: their lessons become facts about their
agent type (the consolidator's pass, each session once), and they are recalled as episodes of
the user their spawn named."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.results_factory import migrated_engine, publish, terminated
from worker.consolidation.consolidator import Consolidator
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.turns import SessionEpisode


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


async def changes(redis: Redis, settings: Settings, project_id: str) -> list[dict[str, Any]]:
    stream = changes_stream(settings.stream_prefix, project_id, settings.shards)
    entries: Any = await redis.xrange(stream)
    return [orjson.loads(fields[b"data"]) for _id, fields in entries]


async def test_lessons_of_stored_sessions_become_facts_about_their_agent_type_once(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    results = [
        terminated("p", "s-1", 1, user_id="alice", lessons=["check the units first"]),
        terminated("p", "s-2", 2, user_id="alice", lessons=["check the units first", "cite"]),
        terminated("p", "s-3", 3, user_id="bob", lessons=["ask before deleting"]),
    ]
    await publish(redis, settings, results)
    consolidator = Consolidator(settings, redis, engine)
    await consolidator.run_once()

    assert await consolidator.lessons_once() == 3
    assert await consolidator.lessons_once() == 0  # each session once

    async with Memory("p", settings=settings, engine=engine, redis=redis) as memory:
        alice = await memory.facts.query(subject="agent_type:researcher", user_id="alice")
        bob = await memory.facts.query(subject="agent_type:researcher", user_id="bob")
        assert sorted(f.object for f in alice) == ["check the units first", "cite"]
        assert [f.object for f in bob] == ["ask before deleting"]
        twice = next(f for f in alice if f.object == "check the units first")
        assert len(twice.sources) == 2  # the same lesson twice is one fact, from both sessions
        assert all(f.confidence == pytest.approx(0.9) for f in alice)

        found = await memory.recall("quarterly sales report", user_id="alice")
        assert {e.session_id for e in found} == {"s-1", "s-2"}
        assert all(isinstance(e, SessionEpisode) for e in found)
        assert found[0].input == "Summarise the quarterly sales report"
        assert "check the units first" in found[0].output
        assert (await memory.profile(user_id="bob")).episode_count == 1

    events = await changes(redis, settings, "p")
    assert [e["type"] for e in events].count("fact.added") == 3
    assert all("units" not in orjson.dumps(e).decode() for e in events)  # ids, never content
    async with engine.connect() as conn:
        left = await conn.execute(
            text("SELECT count(*) FROM episodes WHERE consolidated_at IS NULL")
        )
        assert left.scalar_one() == 0


async def test_with_lesson_facts_off_the_consolidator_extracts_nothing(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    off = settings.model_copy(update={"lesson_facts": False})
    await publish(redis, off, [terminated("p", "s-1", 1, user_id="alice")])
    consolidator = Consolidator(off, redis, engine)
    await consolidator.run_once()
    await consolidator.tick()
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM facts"))).scalar_one() == 0


async def test_a_session_an_older_version_stored_under_a_dot_id_holds_up_no_lessons(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    """A session spawned for user ``..`` (or in project ``.``) before the stream door refused
    them: no facts from its lessons (no write names such an id), and it is marked all the same.
    Before, its facts were refused and the whole pass with them, every time: no session's
    lessons became facts again."""
    results = [
        terminated("p", "s-old", 1, user_id="..", lessons=["an old lesson"]),
        terminated(".", "s-old", 2, user_id="alice", lessons=["an old lesson"]),
        terminated("p", "s-new", 3, user_id="alice", lessons=["check the units first"]),
    ]
    await publish(redis, settings, results)
    consolidator = Consolidator(settings, redis, engine)
    await consolidator.run_once()

    assert await consolidator.lessons_once() == 3
    async with Memory("p", settings=settings, engine=engine, redis=redis) as memory:
        alice = await memory.facts.query(subject="agent_type:researcher", user_id="alice")
        assert [f.object for f in alice] == ["check the units first"]
    async with engine.connect() as conn:
        facts = await conn.execute(text("SELECT project_id, user_id FROM facts"))
        assert facts.all() == [("p", "alice")]
        left = await conn.execute(
            text("SELECT count(*) FROM episodes WHERE consolidated_at IS NULL")
        )
        assert left.scalar_one() == 0
