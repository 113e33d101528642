"""A forget covers a block holding text written before it (security probe, after F8): a block
appended to while a forget is owed keeps ``content_since`` (when its oldest text was written),
so finishing the forget removes it with the old text; a block replaced whole after the forget
is kept. Real Redis and Postgres."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.integration.test_forget import live
from tests.redis_process import free_port
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.erasure.forget import finish_owed, forget_everywhere
from worker.settings import Settings
from worker.user_memory.memory import Memory

__all__ = ["live"]  # fixture: a migrated database and two shards


async def blocks(engine: AsyncEngine, project: str) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT name, content FROM memory_blocks WHERE project_id = :p"), {"p": project}
        )
        return {r.name: r.content for r in rows}


async def test_finishing_an_owed_forget_removes_a_block_appended_to_after_it(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{free_port()}/x")
    memory = Memory("b1", settings=live, engine=engine, redis=redis)
    try:
        await memory.update_block("notes", "old-secret-uma", user_id="uma")
        await memory.update_block("persona", "old-persona", user_id="uma")
        receipt = await forget_everywhere(unreachable, redis, prefix, "b1", user_id="uma", shards=2)
        assert receipt.owed == "redis"
        await memory.append_block("notes", " new-after-forget", user_id="uma")
        await memory.update_block("persona", "new-persona", user_id="uma")  # whole, after it
        await memory.append_block("persona", " and more", user_id="uma")
        await memory.append_block("todo", "new-todo", user_id="uma")  # created by an append
        [done] = await finish_owed(engine, redis, prefix, grace_seconds=0, project_id="b1")
        assert done.ok and done.owed is None, done.errors
        assert done.postgres["memory_blocks"] == 1
        assert await blocks(engine, "b1") == {
            "persona": "new-persona and more",
            "todo": "new-todo",
        }
    finally:
        await memory.close()
        await unreachable.dispose()
        await engine.dispose()


async def test_a_direct_forget_removes_every_block_of_the_user(
    redis: Redis, live: Settings
) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory("b2", settings=live, engine=engine, redis=redis)
    try:
        await memory.update_block("notes", "uma's", user_id="uma")
        await memory.append_block("notes", " more", user_id="uma")
        await memory.update_block("notes", "ivo's", user_id="ivo")
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, "b2", user_id="uma", shards=2
        )
        assert receipt.ok and receipt.postgres["memory_blocks"] == 1
        await memory.append_block("notes", " after", user_id="uma")
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT user_key, content FROM memory_blocks WHERE project_id = 'b2'")
            )
            assert sorted(tuple(r) for r in rows) == [("ivo", "ivo's"), ("uma", " after")]
    finally:
        await memory.close()
        await engine.dispose()


async def test_a_forget_before_a_time_removes_a_block_holding_text_from_before_it(
    redis: Redis, live: Settings
) -> None:
    """``--before T``: a block set before T and appended to after it holds text from before T
    and goes; one set whole after T is kept; with ``--since``, one last written before the
    range is kept."""
    engine = create_database_engine(live.database_url)
    memory = Memory("b4", settings=live, engine=engine, redis=redis)
    try:
        await memory.update_block("early", "untouched since", user_id="uma")
        await asyncio.sleep(0.05)
        async with engine.connect() as conn:
            since = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
        await memory.update_block("notes", "old-secret", user_id="uma")
        await memory.update_block("persona", "old-persona", user_id="uma")
        await asyncio.sleep(0.05)
        async with engine.connect() as conn:
            before = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
        await asyncio.sleep(0.05)
        await memory.append_block("notes", " appended after T", user_id="uma")
        await memory.update_block("persona", "new-persona", user_id="uma")
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, "b4", user_id="uma", since=since, before=before
        )
        assert receipt.ok and receipt.postgres["memory_blocks"] == 1, receipt.errors
        assert await blocks(engine, "b4") == {
            "early": "untouched since",
            "persona": "new-persona",
        }
    finally:
        await memory.close()
        await engine.dispose()


async def test_blocks_stored_before_0013_are_covered_by_a_later_forget(
    database_url: str, redis: Redis, settings: Settings
) -> None:
    """Migration 0013 gives a block already stored its ``updated_at`` as the start of its text:
    an owed forget still covers it after an append."""
    assert await migrate(database_url, "0012") == "0012"
    engine = create_database_engine(database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{free_port()}/x")
    settings = settings.model_copy(update={"database_url": database_url, "shards": 2})
    prefix = settings.stream_prefix
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO memory_blocks (project_id, user_key, name, content, pinned_order)"
                    " VALUES ('b3', 'uma', 'notes', 'old-secret', 0)"
                )
            )
        await migrate(database_url)
        receipt = await forget_everywhere(unreachable, redis, prefix, "b3", shards=2)
        assert receipt.owed == "redis"
        async with Memory("b3", settings=settings, engine=engine, redis=redis) as memory:
            await memory.append_block("notes", " new", user_id="uma")
        [done] = await finish_owed(engine, redis, prefix, grace_seconds=0, project_id="b3")
        assert done.ok and done.postgres["memory_blocks"] == 1, done.errors
        assert await blocks(engine, "b3") == {}
    finally:
        await unreachable.dispose()
        await engine.dispose()
