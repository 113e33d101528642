"""A forget covers what was written before it (security probe F4): a turn remembered after a
forget but dated before it is kept and embedded, after a whole forget and after a range's; and
finishing an owed forget keeps what was written after it, whatever its date, and removes what
was written before it, even dated in the future. Real Redis and Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.integration.test_forget import live
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.db.erasures import NOT_ERASED, covered
from worker.erasure.forget import forget_everywhere
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode as Turn

__all__ = ["live"]  # fixture: a migrated database and two shards
PROJECT = "written"


async def indexable(memory: Memory, user: str) -> list[str]:
    """The user's turns the indexer would embed (its selection: ``NOT_ERASED``)."""
    async with memory.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT turn_id FROM episodes e WHERE project_id = :p AND user_id = :u"
                f" AND {NOT_ERASED} ORDER BY turn_id"
            ),
            {"p": PROJECT, "u": user},
        )
        return [r[0] for r in rows]


async def test_a_backdated_turn_remembered_after_a_forget_is_kept_and_embedded(
    redis: Redis, live: Settings
) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    feb, mar = datetime(2020, 2, 1, tzinfo=UTC), datetime(2020, 3, 1, tzinfo=UTC)
    try:
        await memory.remember(Turn(session_id="s", id="old", user_id="dave", input="q", output="a"))
        assert await memory.forget(user_id="dave") == 1
        yesterday = datetime.now(UTC) - timedelta(days=1)
        await memory.remember_many(
            [
                Turn(
                    session_id="s",
                    id="backdated",
                    user_id="dave",
                    occurred_at=yesterday,
                    input="q",
                    output="a",
                ),
                Turn(session_id="s", id="undated", user_id="dave", input="q", output="a"),
            ]
        )
        assert await indexable(memory, "dave") == ["backdated", "undated"]

        await memory.remember(
            Turn(
                session_id="s",
                id="feb-old",
                user_id="fay",
                occurred_at=feb + timedelta(days=5),
                input="q",
                output="a",
            )
        )
        assert await memory.forget(user_id="fay", since=feb, before=mar) == 1
        at = feb + timedelta(days=9)
        await memory.remember(
            Turn(session_id="s", id="feb-new", user_id="fay", occurred_at=at, input="q", output="a")
        )
        assert await indexable(memory, "fay") == ["feb-new"]

        # The consolidator's check: a result written (its stream id) after the forget is
        # stored; one written before it, or published again with its old date, is not.
        now = datetime.now(UTC)
        async with engine.connect() as conn:
            items = [
                (PROJECT, "s", yesterday, "dave", now),
                (PROJECT, "s", yesterday, "dave", yesterday),
                (PROJECT, "s", now, "dave", now - timedelta(hours=2)),
            ]
            assert await covered(conn, items) == [False, True, True]
    finally:
        await memory.close()
        await engine.dispose()


async def test_finishing_an_owed_forget_keeps_what_was_written_after_it_and_removes_the_rest(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    impatient = create_async_engine(
        live.database_url, connect_args={"server_settings": {"lock_timeout": "1000"}}
    )
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    future = datetime(2099, 1, 1, tzinfo=UTC)
    try:
        await memory.remember(
            Turn(session_id="s", id="before", user_id="erin", input="q", output="a")
        )
        await memory.remember(
            Turn(
                session_id="s",
                id="future",
                user_id="erin",
                occurred_at=future,
                input="q",
                output="a",
            )
        )
        async with engine.connect() as holder:  # the forget's Postgres step gives up on facts
            await holder.execute(text("LOCK TABLE facts IN ACCESS EXCLUSIVE MODE"))
            receipt = await forget_everywhere(
                impatient, redis, prefix, PROJECT, user_id="erin", shards=2
            )
            await holder.rollback()
        assert not receipt.ok and receipt.owed == "postgres"
        assert receipt.cutoff is not None
        backdated = receipt.cutoff - timedelta(days=7)
        await memory.remember_many(
            [
                Turn(
                    session_id="s",
                    id="backdated",
                    user_id="erin",
                    occurred_at=backdated,
                    input="q",
                    output="a",
                ),
                Turn(session_id="s", id="undated", user_id="erin", input="q", output="a"),
            ]
        )
        async with engine.begin() as conn:  # owed for an hour: the consolidator's pass takes it
            await conn.execute(text("UPDATE erasures SET forgotten_at = now() - interval '1h'"))
        consolidator = Consolidator.from_settings(live)
        try:
            assert await consolidator.finish_owed_forgets() == 1
        finally:
            await consolidator.close()
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT turn_id FROM episodes WHERE project_id = :p ORDER BY turn_id"),
                {"p": PROJECT},
            )
            assert [r[0] for r in rows] == ["backdated", "undated"]
        assert await indexable(memory, "erin") == ["backdated", "undated"]
    finally:
        await memory.close()
        await impatient.dispose()
        await engine.dispose()
