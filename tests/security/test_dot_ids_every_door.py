"""``.`` and ``..`` are refused as ids by every door that writes, not only by HTTP and MCP
(``test_dot_ids``): the stream door (a raw spawn XADDed to the lifecycle stream is answered
``invalid_event`` naming the field, and no session is made), ``memworker publish``,
``memworker remember``, ``memworker memory blocks --set`` and ``facts --add``, ``Memory``'s
writes, ``WorkingMemory`` and ``LifecycleClient``. Before, each took them, and what they stored
could then be neither read nor forgotten over HTTP, nor reached by the inspector's links. What
an older version stored under them is still read and forgotten (``Memory.forget``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.inputs import InvalidInputError
from tests.helpers import command, publish, results, running_worker, stream_len_at_least, worker_env
from tests.integration.results_factory import migrated_engine
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.memory.api import WorkingMemory
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact

DOTS = (".", "..")


def memworker(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], field: str) -> None:
    """A one-line refusal naming ``field``: a usage error (2) or the input rule's error (1)."""
    assert done.returncode in (1, 2), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert field in done.stderr and "alone" in done.stderr, done.stderr


async def _rows(database_url: str) -> list[tuple[str, str]]:
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT project_id, coalesce(user_id, '') FROM episodes UNION ALL "
                    "SELECT project_id, user_key FROM memory_blocks UNION ALL "
                    "SELECT project_id, coalesce(user_id, '') FROM facts"
                )
            )
            return [(r[0], r[1]) for r in rows]
    finally:
        await engine.dispose()


async def test_the_stream_door_answers_a_dot_id_invalid_event_naming_the_field(
    redis: Redis, settings: Settings
) -> None:
    """A raw spawn (and pause) whose project, session or user id is ``.`` or ``..`` gets one
    ``command.rejected`` ``invalid_event`` naming the field, as other bad ids do; no session."""
    sent = []
    for dots in DOTS:
        for field in ("session_id", "project_id", "user_id"):
            event_id = f"spawn-{field}-{len(dots)}"
            body = command("spawn", event_id, session="s1", project="p1", user_id="ann")
            await publish(redis, settings, {**body, field: dots}, shard=0)
            sent.append((event_id, field))
        event_id = f"pause-{len(dots)}"
        await publish(redis, settings, command("pause", event_id, session=dots), shard=0)
        sent.append((event_id, "session_id"))
    async with running_worker(settings):
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).results, len(sent))
    answered = {r["causation_id"]: r for r in await results(redis, settings)}
    for event_id, field in sent:
        result = answered[event_id]
        assert result["type"] == "command.rejected", result
        assert result["reason"] == "invalid_event", result
        assert f"{field}:" in result["detail"] and "alone" in result["detail"], result
        assert result["session_id"] in ("s1", None), result  # never "." or ".."
        assert result["project_id"] in ("p1", None), result
    sessions = [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*:s:*")]
    assert sessions == [], sessions


async def test_lifecycle_client_and_working_memory_refuse_dot_ids(
    redis: Redis, settings: Settings
) -> None:
    client = LifecycleClient(redis, settings)
    for dots in DOTS:
        with pytest.raises(InvalidInputError, match="session_id"):
            await client.spawn("p1", dots, "a1")
        with pytest.raises(InvalidInputError, match="project_id"):
            await client.spawn(dots, "s1", "a1")
        with pytest.raises(InvalidInputError, match="user_id"):
            await client.spawn("p1", "s1", "a1", user_id=dots)
        with pytest.raises(InvalidInputError, match="session_id"):
            await WorkingMemory.for_session(dots, "p1", redis=redis, settings=settings)
        with pytest.raises(InvalidInputError, match="project_id"):
            await WorkingMemory.for_session("s1", dots, redis=redis, settings=settings)
    assert int(await redis.xlen(StreamKeys(settings.stream_prefix, 0).lifecycle)) == 0


async def test_memworker_publish_refuses_dot_ids(redis: Redis, settings: Settings) -> None:
    for dots in DOTS:
        for args, field in (
            (["-p", "p1", "-s", dots], "session_id"),
            (["-p", dots, "-s", "s1"], "project_id"),
            (["-p", "p1", "-s", "s1", "--user", dots], "user_id"),
        ):
            done = await asyncio.to_thread(memworker, settings, "publish", "spawn", *args)
            refused(done, field)
    lifecycle = [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:lifecycle:*")]
    assert lifecycle == []


async def test_memworker_remember_refuses_dot_ids(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    live = settings.model_copy(update={"database_url": database_url})
    for dots in DOTS:
        for args, field in (
            (["-p", dots, "--id", "m1"], "project_id"),
            (["-p", "p1", "--id", dots], "memory_id"),
        ):
            done = await asyncio.to_thread(memworker, live, "remember", *args, "--task", "t")
            refused(done, field)
    assert await _rows(database_url) == []


async def test_memworker_memory_blocks_set_and_facts_add_refuse_dot_ids(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    live = settings.model_copy(update={"database_url": database_url})
    writes = (
        ["blocks", "--set", "persona", "--content", "x"],
        ["blocks", "--append", "persona", "--content", "x"],
        ["facts", "--add", "ann", "likes", "tea"],
    )
    for dots in DOTS:
        for args, field in ((["-u", dots, "-p", "p1"], "user_id"), (["-p", dots], "project_id")):
            for write in writes:
                done = await asyncio.to_thread(memworker, live, "memory", *write, *args)
                refused(done, field)
    assert await _rows(database_url) == []


async def test_python_memory_writes_refuse_dot_ids_and_legacy_data_is_still_forgotten(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    live = settings.model_copy(update={"database_url": database_url})
    turn = Episode(user_id="ann", session_id="chat", input="hello", output="hi")
    for dots in DOTS:
        async with Memory(dots, settings=live, redis=redis) as memory:  # a reader, a forgetter
            with pytest.raises(InvalidInputError, match="project_id"):
                await memory.remember(turn)
            with pytest.raises(InvalidInputError, match="project_id"):
                await memory.remember_many([turn])
            with pytest.raises(InvalidInputError, match="project_id"):
                await memory.update_block("persona", "x", user_id="ann")
            with pytest.raises(InvalidInputError, match="project_id"):
                await memory.facts.append(
                    Fact(user_id="ann", subject="a", predicate="b", object="c")
                )
        async with Memory("p1", settings=live, redis=redis) as memory:
            with pytest.raises(InvalidInputError, match="user_id"):
                await memory.update_block("persona", "x", user_id=dots)
            with pytest.raises(InvalidInputError, match="user_id"):
                await memory.append_block("persona", "x", user_id=dots)
    assert await _rows(database_url) == []
    # A block an older version stored under user "..": still read, and forgotten.
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO memory_blocks (project_id, user_key, name, content, "
                    "pinned_order, updated_at) VALUES ('p1', '..', 'persona', 'old', 0, now())"
                )
            )
    finally:
        await engine.dispose()
    async with Memory("p1", settings=live, redis=redis) as memory:
        assert [b.content for b in await memory.working(user_id="..")] == ["old"]
        await memory.forget(user_id="..")
        assert await memory.working(user_id="..") == []
    assert await _rows(database_url) == []


async def test_a_refused_spawn_carries_its_own_user_id_when_it_is_one(
    redis: Redis, settings: Settings
) -> None:
    """A spawn rejected ``invalid_event`` or ``limit_exceeded`` before it is applied still says
    whose it was (its ``user_id``, when a valid one; never ``..`` or ``a b``), once, also when
    the session exists with another user."""
    tight = settings.model_copy(update={"max_keys_per_session": 2})
    await publish(redis, tight, command("spawn", "bob-spawn", session="s1", user_id="bob"), 0)
    for event_id, fields in (
        ("ttl", {"ttl_seconds": 10**9}),  # invalid_event: over its bound
        ("reserved", {"initial_state": {"_x": 1}}),  # invalid_event: a reserved key
        ("many", {"initial_state": {"a": 1, "b": 2, "c": 3}}),  # limit_exceeded
        ("again", {"session_id": "s1", "ttl_seconds": 0}),  # s1 is bob's: ann's all the same
    ):
        body = {**command("spawn", event_id, session="s2", user_id="ann"), **fields}
        await publish(redis, tight, body, shard=0)
    for event_id, user in (("dots", ".."), ("space", "a b")):
        body = command("spawn", event_id, session="s3", user_id=user, ttl_seconds=0)
        await publish(redis, tight, body, shard=0)
    results_stream = StreamKeys(tight.stream_prefix, 0).results
    async with running_worker(tight):
        await stream_len_at_least(redis, results_stream, 7)
    raw = {}
    for _id, fields in await redis.xrange(results_stream):
        data = fields[b"data"]
        assert data.count(b'"user_id"') <= 1, data
        result = orjson.loads(data)
        raw[result["causation_id"]] = result
    assert raw["bob-spawn"]["user_id"] == "bob"
    for event_id, reason in (
        ("ttl", "invalid_event"),
        ("reserved", "invalid_event"),
        ("many", "limit_exceeded"),
        ("again", "invalid_event"),
    ):
        assert raw[event_id]["reason"] == reason, raw[event_id]
        assert raw[event_id]["user_id"] == "ann", raw[event_id]
    for event_id in ("dots", "space"):
        assert raw[event_id]["reason"] == "invalid_event", raw[event_id]
        assert "user_id" not in raw[event_id], raw[event_id]
