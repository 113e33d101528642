"""A forget is exact: a bad selector touches nothing, a forget that fails half-way never widens
its cutoff and is owed until a retry (or the consolidator) finishes exactly its scope, and the
publishers' keys it removes are the scope's sessions', all of them and no other.

Real Redis and Postgres throughout: the half-way failures are a table locked by another
connection (the forget's own transaction gives up on it) and a Postgres nobody listens on.
"""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.cli_process import Memworker
from tests.integration.test_access import AUTH, api
from tests.integration.test_access import PROJECT as API_PROJECT
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import live
from worker.codec import text as as_text
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.erasure.forget import forget_everywhere
from worker.keys import episodes_stream, erased_key, escape_glob
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

__all__ = ["api", "live"]  # fixtures: a served API; a migrated database and two shards
PROJECT = "owed"
YEAR_ONE_PLUS_14 = "0001-01-01T00:00:00+14:00"  # before year 1 in UTC


async def streams(redis: Redis, prefix: str) -> dict[str, list[str]]:
    """Every stream under the prefix and its entry ids."""
    out = {}
    async for raw in redis.scan_iter(match=f"{escape_glob(prefix)}:*", _type="stream"):
        name = as_text(raw)
        rows: Any = await redis.xrange(name)
        out[name] = [as_text(i) for i, _ in rows]
    return out


async def forgotten_events(redis: Redis, prefix: str) -> list[dict[str, Any]]:
    events = []
    rows: Any = await redis.xrange(episodes_stream(prefix))
    for _id, fields in rows:
        body = orjson.loads(fields[b"data"])
        if body.get("type") == "memory.forgotten":
            events.append(body)
    return events


async def test_a_forget_with_a_time_postgres_cannot_hold_is_refused_touching_nothing(
    api: tuple[str, Memworker], redis: Redis, settings: Settings, database_url: str
) -> None:
    base, _ = api
    served = settings.model_copy(update={"database_url": database_url})  # the API's
    prefix = settings.stream_prefix
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        turn = {"user_id": "zoe", "session_id": "c1", "input": "I love trains", "output": "Ok"}
        assert (await http.post("/v1/remember", json=turn, headers=AUTH)).status_code == 200
        for _ in range(100):  # remember answers before its event is published: wait for it
            before = await streams(redis, prefix)
            if any(":changes:" in name and ids for name, ids in before.items()):
                break
            await asyncio.sleep(0.05)
        assert any(":changes:" in name and ids for name, ids in before.items())

        bad = {"user_id": "zoe", "before": YEAR_ONE_PLUS_14}
        refused = await http.post("/v1/forget", json=bad, headers=AUTH)
        assert 400 <= refused.status_code < 500, refused.text
        assert "before" in refused.json()["error"]

        assert await streams(redis, prefix) == before  # the change feed's entries kept
        assert await redis.hgetall(erased_key(prefix)) == {}  # type: ignore[misc]
        assert await forgotten_events(redis, prefix) == []
        profile = await http.post("/v1/profile", json={"user_id": "zoe"}, headers=AUTH)
        assert profile.json()["episode_count"] == 1

    # The same time through Python and the CLI: a ValueError, exit 2; nothing touched.
    engine = create_database_engine(database_url)
    memory = Memory(API_PROJECT, settings=served, engine=engine, redis=redis)
    try:
        year_one = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))
        with pytest.raises(ValueError, match="before"):
            await memory.forget(user_id="zoe", before=year_one)
        assert len((await memory.export(user_id="zoe")).episodes) == 1
    finally:
        await memory.close()
        await engine.dispose()
    done = memworker(
        served, "forget", "--project", API_PROJECT, "--user", "zoe",
        "--before", YEAR_ONE_PLUS_14,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--before" in done.stderr
    assert await streams(redis, prefix) == before
    assert await redis.hgetall(erased_key(prefix)) == {}  # type: ignore[misc]


async def seed_zoe(memory: Memory, cutoff: datetime) -> None:
    """One turn of zoe's before ``cutoff``, one after it, and one of bob's before it."""
    old = cutoff - timedelta(minutes=30)
    for user, session, when in (("zoe", "z-old", old), ("zoe", "z-new", None), ("bob", "b", old)):
        fields: dict[str, Any] = {"session_id": session, "user_id": user}
        if when is not None:
            fields["occurred_at"] = when
        await memory.remember(Episode(input=f"q {session}", output=f"a {session}", **fields))
    await memory.flush_changes()


async def sessions_of(engine: AsyncEngine, user: str) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT session_id FROM episodes WHERE project_id = :p AND user_id = :u"),
            {"p": PROJECT, "u": user},
        )
        return {r[0] for r in rows}


async def owed_rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT id::text, user_id, before, cutoff, completed_at FROM erasures")
        )
        return list(rows)


def ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


async def test_a_forget_whose_postgres_step_fails_half_way_is_owed_and_finished_exactly(
    redis: Redis, live: Settings
) -> None:
    from worker.erasure.forget import finish_owed

    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    # The forget's own engine gives up on a lock after a second.
    impatient = create_async_engine(
        live.database_url, connect_args={"server_settings": {"lock_timeout": "1000"}}
    )
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    try:
        await seed_zoe(memory, cutoff)
        async with engine.connect() as holder:  # another session holds facts: the forget's
            # delete of zoe's facts, after her episodes' and results', gives up on it
            await holder.execute(text("LOCK TABLE facts IN ACCESS EXCLUSIVE MODE"))
            receipt = await forget_everywhere(
                impatient, redis, prefix, PROJECT, user_id="zoe", before=cutoff, shards=2
            )
            await holder.rollback()
        assert not receipt.ok and receipt.errors[0].startswith("postgres:")
        assert receipt.owed == "postgres"
        assert receipt.cutoff == cutoff  # exactly the time asked, never "now"
        [row] = await owed_rows(engine)
        assert (row.id, row.user_id, row.before, row.cutoff, row.completed_at) == (
            receipt.erasure_id,
            "zoe",
            cutoff,
            cutoff,
            None,
        )
        fields = await redis.hgetall(erased_key(prefix))  # type: ignore[misc]
        assert fields == {f"{PROJECT}@zoe".encode(): str(ms(cutoff)).encode()}
        [event] = await forgotten_events(redis, prefix)
        assert event["complete"] is False and event["cutoff"] == cutoff.isoformat()
        assert await sessions_of(engine, "zoe") == {"z-old", "z-new"}  # rolled back

        # zoe goes on after the failed forget: new data, outside what was asked.
        await memory.remember(Episode(session_id="z-later", user_id="zoe", input="q", output="a"))
        # The consolidator's pass (at its start, then every interval) finishes what has been
        # owed for over OWED_GRACE_S: here, a forget recorded an hour ago.
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE erasures SET forgotten_at = now() - interval '1h'"))
        consolidator = Consolidator.from_settings(live)
        try:
            assert await consolidator.finish_owed_forgets() == 1
        finally:
            await consolidator.close()
        events = await forgotten_events(redis, prefix)
        assert [(e["event_id"], e["complete"], e["cutoff"]) for e in events] == [
            (receipt.erasure_id, False, cutoff.isoformat()),
            (receipt.erasure_id, True, cutoff.isoformat()),
        ]
        assert await sessions_of(engine, "zoe") == {"z-new", "z-later"}
        assert await sessions_of(engine, "bob") == {"b"}
        [row] = await owed_rows(engine)
        assert row.completed_at is not None and row.cutoff == cutoff
        assert await finish_owed(engine, redis, prefix, shards=2, grace_seconds=0) == []
    finally:
        await memory.close()
        await impatient.dispose()
        await engine.dispose()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_forget_without_postgres_never_widens_and_a_retry_finishes_it(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{closed_port()}/x")
    # the feed as without pgvector: no episode.recallable of a turn embedded at remember
    words_only = live.model_copy(update={"remember_embedding": "indexer"})
    memory = Memory(PROJECT, settings=words_only, engine=engine, redis=redis)
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    try:
        await seed_zoe(memory, cutoff)
        feed = {n: ids for n, ids in (await streams(redis, prefix)).items() if ":changes:" in n}
        assert sum(len(ids) for ids in feed.values()) == 3  # all written after the cutoff
        receipt = await forget_everywhere(
            unreachable, redis, prefix, PROJECT, user_id="zoe", before=cutoff, shards=2
        )
        # Nothing newer than the time asked went: the change feed's entries are all kept.
        after = await streams(redis, prefix)
        assert {n: after[n] for n in feed} == feed
        fields = await redis.hgetall(erased_key(prefix))  # type: ignore[misc]
        assert fields == {f"{PROJECT}@zoe".encode(): str(ms(cutoff)).encode()}
        assert not receipt.ok and receipt.owed == "redis" and receipt.cutoff == cutoff
        owed = await redis.hgetall(f"{prefix}:erasure:owed")  # type: ignore[misc]
        assert list(owed) == [receipt.erasure_id.encode()]  # type: ignore[union-attr]
        assert orjson.loads(owed[receipt.erasure_id.encode()])["cutoff"] == cutoff.isoformat()  # type: ignore[union-attr]

        # The same forget again, Postgres back: it completes and settles the owed one.
        again = await forget_everywhere(
            engine, redis, prefix, PROJECT, user_id="zoe", before=cutoff, shards=2
        )
        assert again.ok and again.cutoff == cutoff
        assert await redis.hgetall(f"{prefix}:erasure:owed") == {}  # type: ignore[misc]
        assert await sessions_of(engine, "zoe") == {"z-new"}
        assert await sessions_of(engine, "bob") == {"b"}
    finally:
        await memory.close()
        await unreachable.dispose()
        await engine.dispose()


async def test_forgetting_a_user_or_a_session_removes_its_publishers_keys_all_and_only(
    redis: Redis, live: Settings
) -> None:
    """mallory's session is named ``pub``: her keys go, bob's ``…/s1/pub`` stays; forgetting
    the session ``s1`` then removes its counter and its ``/pub`` record both."""
    prefix = live.stream_prefix
    client = LifecycleClient(redis, live)
    engine = create_database_engine(live.database_url)
    sessions = {"pub": "mallory", "m1": "mallory", "s1": "bob"}
    for session, user in sessions.items():
        await client.spawn(PROJECT, session, "a", {}, user_id=user)

    async def seq_keys() -> set[str]:
        found = redis.scan_iter(match=f"{escape_glob(prefix)}:{{*}}:seq:{PROJECT}/*")
        return {as_text(k).partition(":seq:")[2] for k in [k async for k in found]}

    published = {f"{PROJECT}/{s}{end}" for s in sessions for end in ("", "/pub")}
    try:
        assert await seq_keys() == published
        mallory = await forget_everywhere(
            engine, redis, prefix, PROJECT, user_id="mallory", shards=2
        )
        assert mallory.ok, mallory.errors
        assert await seq_keys() == {f"{PROJECT}/s1", f"{PROJECT}/s1/pub"}
        assert mallory.redis["seq_keys"] == 4
        s1 = await forget_everywhere(engine, redis, prefix, PROJECT, session_id="s1", shards=2)
        assert s1.ok, s1.errors
        assert await seq_keys() == set()
        assert s1.redis["seq_keys"] == 2
    finally:
        await client.close()
        await engine.dispose()


async def test_an_operator_finishes_an_owed_forget_through_the_cli_to_its_cutoff(
    redis: Redis, live: Settings
) -> None:
    """A whole user's forget (no ``before``) without Postgres: its cutoff is when it ran, and
    ``memworker forget --finish-owed`` later removes what zoe had then, not what she wrote
    after."""
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    unreachable = create_async_engine(f"postgresql+asyncpg://x:y@127.0.0.1:{closed_port()}/x")
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        await seed_zoe(memory, datetime.now(UTC))
        receipt = await forget_everywhere(
            unreachable, redis, prefix, PROJECT, user_id="zoe", shards=2
        )
        assert receipt.owed == "redis" and receipt.cutoff is not None
        await memory.remember(Episode(session_id="z-later", user_id="zoe", input="q", output="a"))

        mixed = memworker(live, "forget", "-p", PROJECT, "--user", "zoe", "--finish-owed")
        assert mixed.returncode == 2 and "--finish-owed" in mixed.stderr
        done = memworker(live, "forget", "-p", PROJECT, "--finish-owed")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"forgot project {PROJECT}, user zoe")
        assert await sessions_of(engine, "zoe") == {"z-later"}
        assert await sessions_of(engine, "bob") == {"b"}
        assert await redis.hgetall(f"{prefix}:erasure:owed") == {}  # type: ignore[misc]
        again = memworker(live, "forget", "-p", PROJECT, "--finish-owed")
        assert again.stdout.strip() == f"no forget of project {PROJECT} is owed"
    finally:
        await memory.close()
        await unreachable.dispose()
        await engine.dispose()
