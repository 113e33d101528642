"""A forget covers the facts written before it (security probe, after F4): a fact's
``recorded_at`` is the caller's, so finishing an owed forget keeps a fact appended after it
whatever ``recorded_at`` it gives, and removes one appended before it, even recorded in the
future; a direct forget of a user or a project removes those too. Real Redis and Postgres."""

from __future__ import annotations

from datetime import UTC, datetime

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
from worker.user_memory.models import Fact

__all__ = ["live"]  # fixture: a migrated database and two shards
OLD = datetime(2020, 1, 1, tzinfo=UTC)
FUTURE = datetime(2099, 1, 1, tzinfo=UTC)


def fact(user: str, city: str, recorded_at: datetime | None = None) -> Fact:
    when = {} if recorded_at is None else {"recorded_at": recorded_at}
    return Fact(user_id=user, subject=user, predicate="lives in", object=city, **when)


async def cities(engine: AsyncEngine, project: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT object FROM facts WHERE project_id = :p ORDER BY object"),
            {"p": project},
        )
        return [r[0] for r in rows]


async def test_finishing_an_owed_forget_keeps_the_facts_appended_after_it(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    impatient = create_async_engine(
        live.database_url, connect_args={"server_settings": {"lock_timeout": "1000"}}
    )
    memory = Memory("f5", settings=live, engine=engine, redis=redis)
    try:
        await memory.facts.append(fact("kim", "Oslo"))
        async with engine.connect() as holder:  # the forget's Postgres step gives up on facts
            await holder.execute(text("LOCK TABLE facts IN ACCESS EXCLUSIVE MODE"))
            receipt = await forget_everywhere(impatient, redis, prefix, "f5", shards=2)
            await holder.rollback()
        assert not receipt.ok and receipt.owed == "postgres"
        await memory.facts.append(fact("kim", "Bergen", recorded_at=OLD))
        await memory.facts.append(fact("kim", "Tromso"))
        [done] = await finish_owed(engine, redis, prefix, grace_seconds=0, project_id="f5")
        assert done.ok, done.errors
        assert done.postgres["facts"] == 1
        assert await cities(engine, "f5") == ["Bergen", "Tromso"]
    finally:
        await memory.close()
        await impatient.dispose()
        await engine.dispose()


async def test_finishing_an_owed_forget_removes_a_fact_recorded_in_the_future_before_it(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{free_port()}/x")
    memory = Memory("f6", settings=live, engine=engine, redis=redis)
    try:
        await memory.facts.append(fact("kim", "Oslo", recorded_at=FUTURE))
        receipt = await forget_everywhere(unreachable, redis, prefix, "f6", shards=2)
        assert receipt.owed == "redis"
        await memory.facts.append(fact("lea", "Bergen", recorded_at=OLD))
        [done] = await finish_owed(engine, redis, prefix, grace_seconds=0, project_id="f6")
        assert done.ok, done.errors
        assert done.postgres["facts"] == 1
        assert await cities(engine, "f6") == ["Bergen"]
    finally:
        await memory.close()
        await unreachable.dispose()
        await engine.dispose()


async def test_a_direct_forget_removes_a_fact_recorded_in_the_future(
    redis: Redis, live: Settings
) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory("f7", settings=live, engine=engine, redis=redis)
    try:
        await memory.facts.append(fact("kim", "Oslo", recorded_at=FUTURE))
        await memory.facts.append(fact("lea", "Bergen", recorded_at=FUTURE))
        await memory.facts.append(fact("max", "Tromso", recorded_at=FUTURE))
        by_user = await forget_everywhere(
            engine, redis, live.stream_prefix, "f7", user_id="kim", shards=2
        )
        assert by_user.ok and by_user.postgres["facts"] == 1
        assert await cities(engine, "f7") == ["Bergen", "Tromso"]
        whole = await forget_everywhere(engine, redis, live.stream_prefix, "f7", shards=2)
        assert whole.ok and whole.postgres["facts"] == 2
        assert await cities(engine, "f7") == []
    finally:
        await memory.close()
        await engine.dispose()


async def test_facts_stored_before_0012_are_covered_by_a_later_forget(
    database_url: str, redis: Redis, settings: Settings
) -> None:
    """Migration 0012 gives a fact already stored a write time no later forget misses, even
    recorded in the future; a fact appended after the forget is kept."""
    assert await migrate(database_url, "0011") == "0011"
    engine = create_database_engine(database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{free_port()}/x")
    settings = settings.model_copy(update={"database_url": database_url, "shards": 2})
    prefix = settings.stream_prefix
    try:
        async with engine.begin() as conn:
            for n, (city, at) in enumerate([("Oslo", FUTURE), ("Bergen", OLD)]):
                await conn.execute(
                    text(
                        "INSERT INTO facts (project_id, id, user_id, subject, predicate, object,"
                        " confidence, valid_from, recorded_at) VALUES ('f8', :id, 'kim', 'kim',"
                        " 'lives_in', :o, 1, :at, :at)"
                    ),
                    {"id": f"old-{n}", "o": city, "at": at},
                )
        await migrate(database_url)
        receipt = await forget_everywhere(unreachable, redis, prefix, "f8", shards=2)
        assert receipt.owed == "redis"
        async with Memory("f8", settings=settings, engine=engine, redis=redis) as memory:
            await memory.facts.append(fact("kim", "Tromso", recorded_at=OLD))
        [done] = await finish_owed(engine, redis, prefix, grace_seconds=0, project_id="f8")
        assert done.ok and done.postgres["facts"] == 2, done.errors
        assert await cities(engine, "f8") == ["Tromso"]
    finally:
        await unreachable.dispose()
        await engine.dispose()
