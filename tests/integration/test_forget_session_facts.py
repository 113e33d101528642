"""Facts made from a session's lessons go with the session's forget, on real Redis and
Postgres with the lifecycle worker and the consolidator: a lesson only that session taught
(its PII and all) is deleted, counted on the receipt and the dry run, and listed by
``export -s``; the same lesson another session taught too is kept, with the forgotten
episode dropped from its sources. Before, a session's forget left every such fact in place."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import text as sql

from tests.helpers import running_worker
from tests.integration.test_forget import drained, live
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.episodes.changes import change_event, owe
from worker.erasure.export import export_project
from worker.erasure.forget import forget_everywhere
from worker.keys import changes_stream
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings
from worker.user_memory.memory import Memory

PROJECT = "demo"
ONLY = "carol phone is 555-0199 LESSONPII"
SHARED = "always check the calendar first"
__all__ = ["live"]


async def taught(redis: Redis, live: Settings) -> None:
    """Sessions les-1 (ONLY and SHARED) and les-2 (SHARED) of carol, finished, consolidated,
    their lessons made facts."""
    client = LifecycleClient(redis, live)
    async with running_worker(live):
        for session, lessons in (("les-1", [ONLY, SHARED]), ("les-2", [SHARED])):
            sent = await client.spawn(
                PROJECT, session, "a", {}, user_id="carol", agent_type_id="planner"
            )
            await client.wait(sent, timeout=10)
            sent = await client.terminate(PROJECT, session, "a", lessons_learned=lessons)
            await client.wait(sent, timeout=10)
        consolidator = Consolidator.from_settings(live)
        try:
            await consolidator.run_once()
            await drained(redis, live)
            await consolidator.run_once()
            assert await consolidator.lessons_once() == 2
        finally:
            await consolidator.close()


async def test_a_sessions_forget_takes_the_facts_made_only_from_it(
    redis: Redis, live: Settings
) -> None:
    engine = create_database_engine(live.database_url)
    try:
        await taught(redis, live)

        async def facts() -> dict[str, list[str]]:
            async with engine.connect() as conn:
                rows = await conn.execute(sql("SELECT object, sources FROM facts"))
                return {r[0]: r[1] for r in rows}

        before = await facts()
        assert set(before) == {ONLY, SHARED} and len(before[SHARED]) == 2, before

        document = (
            await export_project(
                engine, PROJECT, session_id="les-1", redis=redis, prefix=live.stream_prefix
            )
        ).to_dict()
        assert [f["object"] for f in document["facts"]] == [ONLY]

        dry = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, session_id="les-1", dry_run=True
        )
        assert dry.postgres["facts"] == 1 and dry.postgres["fact_sources"] == 1, dry.postgres
        assert await facts() == before

        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, session_id="les-1"
        )
        assert receipt.ok, receipt.errors
        assert receipt.postgres["facts"] == 1 and receipt.postgres["fact_sources"] == 1
        after = await facts()
        assert ONLY not in after, "the session's lesson outlived its forget"
        assert SHARED in after and len(after[SHARED]) == 1, after
        assert after[SHARED][0] not in before[ONLY], "the forgotten episode is still a source"

        memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
        try:
            await memory.forget(user_id="carol", session_id="les-2")
        finally:
            await memory.close()
        assert await facts() == {}, "les-2's forget through Memory left its lesson"
    finally:
        await engine.dispose()


async def test_a_sessions_forget_takes_the_change_feed_events_of_the_facts_it_deletes(
    redis: Redis, live: Settings
) -> None:
    """The ``fact.added`` of a fact a session's forget deleted leaves the change feed, published
    (``P:changes:{i}``) or still owed (``memory_changes``), counted on the receipt and the dry
    run; the event of the fact kept stays. Before, both outlived the forget."""
    engine = create_database_engine(live.database_url)
    feed = changes_stream(live.stream_prefix, PROJECT, live.shards)
    try:
        await taught(redis, live)
        async with engine.begin() as conn:
            rows = await conn.execute(sql("SELECT object, id FROM facts"))
            ids = {r[0]: r[1] for r in rows}
            late = change_event("fact.superseded", PROJECT, "carol", ids[ONLY], fact_id=ids[ONLY])
            await owe(conn, PROJECT, [late])  # owed: as a Redis outage leaves it

        async def facts_in_feed() -> list[str]:
            rows: Any = await redis.xrange(feed)
            return [orjson.loads(f[b"data"]).get("fact_id") for _id, f in rows]

        async def owed() -> list[str]:
            async with engine.connect() as conn:
                rows = await conn.execute(sql("SELECT payload->>'fact_id' FROM memory_changes"))
                return [r[0] for r in rows]

        assert sorted(await facts_in_feed()) == sorted(ids.values())
        assert await owed() == [ids[ONLY]]
        dry = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, session_id="les-1", dry_run=True
        )
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, session_id="les-1"
        )
        assert receipt.ok, receipt.errors
        assert await facts_in_feed() == [ids[SHARED]], "the deleted fact's event outlived it"
        assert await owed() == [], "the deleted fact's owed event outlived it"
        assert receipt.postgres.get("memory_changes") == 1 and receipt.streams.get(feed) == 1
        assert dry.postgres.get("memory_changes") == 1 and dry.streams.get(feed) == 1
    finally:
        await engine.dispose()
